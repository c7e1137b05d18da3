//! `kubectl vm list`: VMs with their status, node and IP, like `kubectl get`.

use std::io::Write;

use clap::Args;
use kubevm::api::Kind;
use kubevm::vm::{self, Scope, VmChange, VmSummary};

use crate::cli::GlobalArgs;
use crate::error::{CommandError, CommandResult};
use crate::render::{self, OutputFormat, Table, cell, flag};

/// Arguments of `list`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  kubectl vm list\n  kubectl vm list -A -o wide\n  kubectl vm list -l app=web -o name\n  kubectl vm list -w"
)]
pub struct ListArgs {
    /// Output format
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,

    /// Only VMs whose labels match this selector (e.g. app=web,tier!=db)
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// List VMs in all namespaces
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// After listing, watch for changes and print them
    #[arg(short, long)]
    pub watch: bool,

    /// Do not print the header row
    #[arg(long)]
    pub no_headers: bool,
}

pub async fn cmd_list(global: &GlobalArgs, args: ListArgs) -> CommandResult {
    if args.all_namespaces && global.namespace.is_some() {
        return Err(CommandError::usage(
            "-A/--all-namespaces and -n/--namespace cannot be used together",
        ));
    }
    if let Some(selector) = &args.selector {
        kubevm::selector::check_length(selector)?;
    }
    let (cluster, platform) = super::connect(global).await?;
    let scope = if args.all_namespaces {
        Scope::AllNamespaces
    } else {
        Scope::Namespace(cluster.namespace.clone())
    };
    let selector = args.selector.as_deref();
    let list = vm::list(&cluster, &platform, &scope, selector).await?;
    let kind = Kind::vm(platform.flavor);
    let printer = Printer {
        format: args.output,
        all_namespaces: args.all_namespaces,
        kind,
        now: jiff::Timestamp::now(),
    };
    let mut out = std::io::stdout().lock();
    if list.items.is_empty() && !args.watch {
        if matches!(args.output, Some(OutputFormat::Yaml | OutputFormat::Json)) {
            render::write_object(
                &mut out,
                &render::list_object(Vec::new()),
                args.output.unwrap(),
            )?;
        } else {
            match &scope {
                Scope::Namespace(ns) => eprintln!("No virtual machines found in namespace {ns:?}."),
                Scope::AllNamespaces => eprintln!("No virtual machines found."),
            }
        }
        return Ok(());
    }
    printer.write_all(&mut out, &list.items, !args.no_headers)?;
    out.flush()?;
    if !args.watch {
        return Ok(());
    }
    drop(out);
    vm::watch(&cluster, &platform, &scope, selector, list, |change| {
        let mut out = std::io::stdout().lock();
        let result = match change {
            VmChange::Updated(summary) => printer.write_change(&mut out, &summary, false),
            VmChange::Deleted(summary) => printer.write_change(&mut out, &summary, true),
        };
        result
            .and_then(|()| out.flush())
            .map_err(CommandError::from)
    })
    .await
}

struct Printer {
    format: Option<OutputFormat>,
    all_namespaces: bool,
    kind: Kind,
    now: jiff::Timestamp,
}

impl Printer {
    fn headers(&self) -> Vec<&'static str> {
        let mut headers = Vec::new();
        if self.all_namespaces {
            headers.push("NAMESPACE");
        }
        headers.extend(["NAME", "STATUS", "NODE", "IP", "AGE"]);
        if self.format == Some(OutputFormat::Wide) {
            headers.extend(["CPU", "MEMORY", "AGENT", "MIGRATABLE", "RUN-STRATEGY"]);
            if self.kind.group == kubevm::flavor::DECKHOUSE_GROUP {
                headers.push("CORE-FRACTION");
            }
        }
        headers
    }

    fn row(&self, vm: &VmSummary, status: Option<&str>) -> Vec<String> {
        let mut row = Vec::new();
        if self.all_namespaces {
            row.push(vm.namespace.clone());
        }
        row.extend([
            vm.name.clone(),
            status.unwrap_or(&vm.status).to_owned(),
            cell(vm.node.as_ref()),
            cell(vm.ip.as_ref()),
            render::age(vm.created, self.now),
        ]);
        if self.format == Some(OutputFormat::Wide) {
            row.extend([
                cell(vm.cpu.as_ref()),
                cell(vm.memory.as_ref()),
                flag(vm.agent),
                flag(vm.migratable),
                cell(vm.run_strategy.as_ref()),
            ]);
            if self.kind.group == kubevm::flavor::DECKHOUSE_GROUP {
                row.push(cell(vm.core_fraction.as_ref()));
            }
        }
        row
    }

    fn write_all(
        &self,
        out: &mut dyn Write,
        items: &[VmSummary],
        headers: bool,
    ) -> std::io::Result<()> {
        match self.format {
            Some(format @ (OutputFormat::Yaml | OutputFormat::Json)) => {
                let objects = items.iter().map(|vm| vm.object.clone()).collect();
                render::write_object(out, &render::list_object(objects), format)
            }
            Some(OutputFormat::Name) => {
                for vm in items {
                    writeln!(out, "{}", self.kind.object_ref(&vm.name))?;
                }
                Ok(())
            }
            _ => {
                let mut table = Table::new(&self.headers());
                for vm in items {
                    table.push(self.row(vm, None));
                }
                table.write(out, headers)
            }
        }
    }

    fn write_change(
        &self,
        out: &mut dyn Write,
        vm: &VmSummary,
        deleted: bool,
    ) -> std::io::Result<()> {
        match self.format {
            Some(format @ (OutputFormat::Yaml | OutputFormat::Json)) => {
                if format == OutputFormat::Yaml {
                    writeln!(out, "---")?;
                }
                render::write_object(out, &vm.object, format)
            }
            Some(OutputFormat::Name) => writeln!(out, "{}", self.kind.object_ref(&vm.name)),
            _ => {
                // Rows stream one at a time, so they are padded to the header's widths.
                let mut table = Table::new(&self.headers());
                table.push(self.row(vm, deleted.then_some("Deleted")));
                table.write(out, false)
            }
        }
    }
}
