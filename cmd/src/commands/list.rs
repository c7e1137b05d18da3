//! `kubectl vm list`: VMs with their status, node and IP, like `kubectl get`.

use std::io::Write;

use clap::Args;
use kubevm::api::Kind;
use std::cell::RefCell;

use kubevm::vm::{self, Detail, Scope, VmChange, VmList, VmSummary};

use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
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

    /// With -o yaml|json, keep metadata.managedFields (hidden by default, as kubectl does)
    #[arg(long)]
    pub show_managed_fields: bool,
}

pub async fn cmd_list(global: &GlobalArgs, args: ListArgs) -> CommandResult {
    if args.all_namespaces && global.namespace.is_some() {
        return Err(CommandError::usage(
            "-A/--all-namespaces and -n/--namespace cannot be used together",
        ));
    }
    if let Some(selector) = &args.selector {
        kubevm::selector::check(selector)?;
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    let scope = if args.all_namespaces {
        Scope::AllNamespaces
    } else {
        Scope::Namespace(cluster.namespace.clone())
    };
    let selector = args.selector.as_deref();
    let whole_objects = matches!(args.output, Some(OutputFormat::Yaml | OutputFormat::Json));
    // Tables and names need only a row's fields; yaml/json the whole objects.
    let detail = if whole_objects {
        Detail::Object
    } else {
        Detail::Row
    };
    let printer = Printer {
        format: args.output,
        all_namespaces: args.all_namespaces,
        kind: Kind::vm(platform.flavor),
        headers: !args.no_headers,
        show_managed_fields: args.show_managed_fields,
        widths: RefCell::new(Vec::new()),
        printed: RefCell::new(0),
    };
    // Pages are printed as they arrive; only a List (yaml/json without -w) and the state a
    // watch diffs against are kept.
    let mut kept: Vec<VmSummary> = Vec::new();
    let mut count = 0usize;
    let versions = vm::list_pages(&cluster, &platform, &scope, selector, detail, |page| {
        count += page.len();
        if whole_objects && !args.watch {
            kept.extend(page);
            return Ok(());
        }
        let mut out = std::io::stdout().lock();
        printer.write_page(&mut out, &page)?;
        out.flush()?;
        if args.watch {
            kept.extend(page);
        }
        Ok::<(), CommandError>(())
    })
    .await?;
    if whole_objects && !args.watch {
        let objects = kept
            .into_iter()
            .map(|vm| printer.shown(vm.object))
            .collect();
        let mut out = std::io::stdout().lock();
        render::write_object(
            &mut out,
            &render::list_object(objects),
            args.output.unwrap(),
        )?;
        return Ok(());
    }
    if count == 0 && !args.watch {
        match &scope {
            Scope::Namespace(ns) => eprintln!("No virtual machines found in namespace {ns:?}."),
            Scope::AllNamespaces => eprintln!("No virtual machines found."),
        }
        return Ok(());
    }
    if !args.watch {
        return Ok(());
    }
    let initial = VmList {
        items: kept,
        resource_version: versions.vms,
        instance_resource_version: versions.instances,
    };
    vm::watch(
        &cluster,
        &platform,
        &scope,
        selector,
        initial,
        detail,
        |change| {
            let mut out = std::io::stdout().lock();
            let result = match change {
                VmChange::Updated(summary) => printer.write_change(&mut out, &summary, false),
                VmChange::Deleted(summary) => printer.write_change(&mut out, &summary, true),
            };
            result
                .and_then(|()| out.flush())
                .map_err(CommandError::from)
        },
    )
    .await
}

struct Printer {
    format: Option<OutputFormat>,
    all_namespaces: bool,
    kind: Kind,
    /// Whether the header row is printed (once, above the first page).
    headers: bool,
    /// Whether yaml/json keep `metadata.managedFields`.
    show_managed_fields: bool,
    /// Column widths printed so far: later pages and watch rows line up with them.
    widths: RefCell<Vec<usize>>,
    /// Objects printed so far (yaml documents are separated by `---`, as kubectl does).
    printed: RefCell<usize>,
}

impl Printer {
    fn header_row(&self) -> Vec<&'static str> {
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
            headers.extend(["POOL", "TRUST"]);
        }
        headers
    }

    /// A row; AGE is relative to `now` (the time the row is printed).
    fn row(&self, vm: &VmSummary, status: Option<&str>, now: jiff::Timestamp) -> Vec<String> {
        let mut row = Vec::new();
        if self.all_namespaces {
            row.push(vm.namespace.clone());
        }
        row.extend([
            vm.name.clone(),
            status.unwrap_or(&vm.status).to_owned(),
            cell(vm.node.as_ref()),
            cell(vm.ip.as_ref()),
            render::age(vm.created, now),
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
            row.push(cell(vm.pool.as_ref()));
            row.push(vm.trust.as_str().to_owned());
        }
        row
    }

    fn write_object(&self, out: &mut dyn Write, object: &serde_json::Value) -> std::io::Result<()> {
        let format = self.format.unwrap_or(OutputFormat::Json);
        let mut printed = self.printed.borrow_mut();
        if format == OutputFormat::Yaml && *printed > 0 {
            writeln!(out, "---")?;
        }
        *printed += 1;
        render::write_object(out, &self.shown(object.clone()), format)
    }

    /// The object as yaml/json print it.
    fn shown(&self, mut object: serde_json::Value) -> serde_json::Value {
        if !self.show_managed_fields {
            render::without_managed_fields(&mut object);
        }
        object
    }

    /// One page of the initial list (under `-w`, yaml/json objects one by one, no List).
    fn write_page(&self, out: &mut dyn Write, items: &[VmSummary]) -> std::io::Result<()> {
        match self.format {
            Some(OutputFormat::Yaml | OutputFormat::Json) => {
                for vm in items {
                    self.write_object(out, &vm.object)?;
                }
                Ok(())
            }
            Some(OutputFormat::Name) => {
                for vm in items {
                    writeln!(out, "{}", self.kind.object_ref(&vm.name))?;
                }
                Ok(())
            }
            _ => {
                if items.is_empty() {
                    return Ok(());
                }
                let now = jiff::Timestamp::now();
                let mut table = Table::new(&self.header_row());
                for vm in items {
                    table.push(self.row(vm, None, now));
                }
                let first = self.widths.borrow().is_empty();
                table.write_aligned(out, first && self.headers, &mut self.widths.borrow_mut())
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
            Some(OutputFormat::Yaml | OutputFormat::Json) => self.write_object(out, &vm.object),
            Some(OutputFormat::Name) => writeln!(out, "{}", self.kind.object_ref(&vm.name)),
            _ => {
                // AGE at the time of the event; columns as wide as what was printed before.
                let mut table = Table::new(&self.header_row());
                table.push(self.row(vm, deleted.then_some("Deleted"), jiff::Timestamp::now()));
                let first = self.widths.borrow().is_empty();
                table.write_aligned(out, first && self.headers, &mut self.widths.borrow_mut())
            }
        }
    }
}
