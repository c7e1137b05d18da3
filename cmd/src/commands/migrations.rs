//! `migrate list` (the migrations in flight, once or watched), `migrate --cancel
//! --all-on-node NODE` and `evacuate-cancel`: flags into [`kubevm::lifecycle::migrations`] and
//! [`kubevm::lifecycle::evacuate`] requests, rows and result lines out.

use std::cell::RefCell;
use std::io::Write;

use clap::{Args, Subcommand, ValueEnum};
use kubevm::lifecycle::evacuate::{self, EvacuateTarget};
use kubevm::lifecycle::migrations::{self, Migration, MigrationChange};
use kubevm::lifecycle::{Options, VmRef};
use kubevm::target::Target;

use crate::error::{CommandError, CommandResult};
use crate::flags::{DryRun, GlobalArgs};
use crate::render::{self, OutputFormat, Table, cell};

/// `migrate`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum MigrateCommand {
    /// List live migrations (KubeVirt VirtualMachineInstanceMigrations, Deckhouse Migrate/Evict
    /// operations), those a node drain started included
    #[command(
        after_help = "Columns: TYPE is Migrate or Evict (a drain's migrations are Evict), INITIATOR user, drain or\nworkload-update, PROGRESS Deckhouse's percentage or KubeVirt's copy mode (KubeVirt's API reports no\nbyte counts: memory processed/remaining are virt-handler metrics), DURATION from start to end or now.\n\nExamples:\n  kubectl vm migrate list\n  kubectl vm migrate list -A -o wide\n  kubectl vm migrate list -w\n  kubectl vm migrate list -l kubevirt.io/vmi-name=web -o yaml"
    )]
    List(MigrateListArgs),
}

/// Arguments of `migrate list`.
#[derive(Debug, Args)]
pub struct MigrateListArgs {
    /// Output format
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,

    /// Only migrations whose labels match this selector (KubeVirt's carry kubevirt.io/vmi-name)
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// List migrations in all namespaces
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// After listing, watch for changes and print them
    #[arg(short, long)]
    pub watch: bool,

    /// Do not print the header row
    #[arg(long)]
    pub no_headers: bool,
}

pub async fn cmd_migrate_list(global: &GlobalArgs, args: MigrateListArgs) -> CommandResult {
    if args.all_namespaces && global.namespace.is_some() {
        return Err(CommandError::usage(
            "-A/--all-namespaces and -n/--namespace cannot be used together",
        ));
    }
    if let Some(selector) = &args.selector {
        kubevm::selector::check(selector)?;
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = (!args.all_namespaces).then(|| cluster.namespace.clone());
    let selector = args.selector.as_deref();
    let list = migrations::list(&cluster, platform.flavor, namespace.as_deref(), selector).await?;
    let printer = Printer {
        format: args.output,
        all_namespaces: args.all_namespaces,
        kind: migrations::kind(platform.flavor),
        headers: !args.no_headers,
        widths: RefCell::new(Vec::new()),
        printed: RefCell::new(0),
    };
    let mut out = std::io::stdout().lock();
    if !args.watch {
        if list.items.is_empty() {
            match &namespace {
                Some(ns) => eprintln!("No migrations found in namespace {ns:?}."),
                None => eprintln!("No migrations found."),
            }
            return Ok(());
        }
        if let Some(f @ (OutputFormat::Yaml | OutputFormat::Json)) = args.output {
            let items = list.items.iter().map(|m| shown(&m.object)).collect();
            render::write_object(&mut out, &render::list_object(items), f)?;
            return Ok(());
        }
    }
    printer.write_rows(&mut out, &list.items, &[])?;
    out.flush()?;
    drop(out);
    if !args.watch {
        return Ok(());
    }
    migrations::watch(
        &cluster,
        platform.flavor,
        namespace.as_deref(),
        selector,
        list,
        |change| {
            let mut out = std::io::stdout().lock();
            let result = match change {
                MigrationChange::Updated(m) => printer.write_rows(&mut out, &[m], &[]),
                MigrationChange::Deleted(m) => printer.write_rows(&mut out, &[m], &["Deleted"]),
            };
            result
                .and_then(|()| out.flush())
                .map_err(CommandError::from)
        },
    )
    .await
}

fn shown(object: &serde_json::Value) -> serde_json::Value {
    let mut object = object.clone();
    render::without_managed_fields(&mut object);
    object
}

struct Printer {
    format: Option<OutputFormat>,
    all_namespaces: bool,
    kind: kubevm::api::Kind,
    headers: bool,
    widths: RefCell<Vec<usize>>,
    printed: RefCell<usize>,
}

/// Seconds between two RFC 3339 times (`end` empty: now), if `start` parses.
fn duration(start: &str, end: &str, now: jiff::Timestamp) -> Option<i64> {
    let start: jiff::Timestamp = start.parse().ok()?;
    let end = if end.is_empty() {
        now
    } else {
        end.parse().ok()?
    };
    Some((end.as_second() - start.as_second()).max(0))
}

impl Printer {
    fn header_row(&self) -> Vec<&'static str> {
        let mut h = vec![];
        if self.all_namespaces {
            h.push("NAMESPACE");
        }
        h.extend([
            "NAME",
            "VM",
            "TYPE",
            "INITIATOR",
            "PHASE",
            "SOURCE",
            "TARGET",
            "PROGRESS",
            "DURATION",
            "REASON",
        ]);
        if self.format == Some(OutputFormat::Wide) {
            h.extend(["STARTED", "ENDED"]);
        }
        h
    }

    fn row(&self, m: &Migration, phase: Option<&str>, now: jiff::Timestamp) -> Vec<String> {
        let mut r = vec![];
        if self.all_namespaces {
            r.push(m.namespace.clone());
        }
        r.extend([
            m.name.clone(),
            m.vm.clone(),
            m.operation.clone(),
            m.initiator.word().to_owned(),
            phase.unwrap_or(&m.phase).to_owned(),
            cell(Some(&m.source)),
            cell(Some(&m.target)),
            cell(Some(&m.progress)),
            cell(duration(&m.started, &m.ended, now).map(render::human_duration)),
            cell(Some(&m.reason)),
        ]);
        if self.format == Some(OutputFormat::Wide) {
            r.extend([cell(Some(&m.started)), cell(Some(&m.ended))]);
        }
        r
    }

    /// Rows (the header above the first); `phase` overrides the PHASE cell (`Deleted`).
    fn write_rows(
        &self,
        out: &mut dyn Write,
        items: &[Migration],
        phase: &[&str],
    ) -> std::io::Result<()> {
        match self.format {
            Some(f @ (OutputFormat::Yaml | OutputFormat::Json)) => {
                for m in items {
                    let mut printed = self.printed.borrow_mut();
                    if f == OutputFormat::Yaml && *printed > 0 {
                        writeln!(out, "---")?;
                    }
                    *printed += 1;
                    render::write_object(out, &shown(&m.object), f)?;
                }
                Ok(())
            }
            Some(OutputFormat::Name) => {
                for m in items {
                    writeln!(out, "{}", self.kind.object_ref(&m.name))?;
                }
                Ok(())
            }
            _ => {
                let now = jiff::Timestamp::now();
                let mut table = Table::new(&self.header_row());
                for m in items {
                    table.push(self.row(m, phase.first().copied(), now));
                }
                let first = *self.printed.borrow() == 0;
                *self.printed.borrow_mut() += 1;
                table.write_aligned(out, first && self.headers, &mut self.widths.borrow_mut())
            }
        }
    }
}

/// What `evacuate-cancel` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EvacuateKind {
    /// A virtual machine (its instance)
    #[value(alias = "vms", alias = "virtualmachine", alias = "virtualmachines")]
    Vm,
    /// A virtual machine instance
    #[value(
        alias = "vmis",
        alias = "virtualmachineinstance",
        alias = "virtualmachineinstances"
    )]
    Vmi,
    /// Every instance evacuated from a node
    #[value(alias = "nodes")]
    Node,
}

/// Arguments of `evacuate-cancel`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: PUT …/{virtualmachines|virtualmachineinstances}/NAME/evacuate/cancel with the node the\ninstance runs on (for a node: every instance marked for evacuation from it). This removes the mark a\ndrain set, so no new migration starts for it; a migration already running goes on: cancel it with\n`kubectl vm migrate VM --cancel`, or both at once with `kubectl vm migrate --cancel --all-on-node NODE`.\nDeckhouse: refused (delete the drain's Evict operation instead, as migrate --cancel does).\n\nExamples:\n  kubectl vm evacuate-cancel vm web\n  kubectl vm evacuate-cancel vmi web.prod\n  kubectl vm evacuate-cancel node node-1 --dry-run=server"
)]
pub struct EvacuateCancelArgs {
    /// vm, vmi or node
    #[arg(value_enum, value_name = "KIND")]
    pub kind: EvacuateKind,

    /// The VM or VMI (NAME or NAME.NAMESPACE), or the node
    #[arg(value_name = "NAME")]
    pub name: String,

    /// Only show what would be done: client or server
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,
}

fn node_name(node: &str, flag: &str) -> Result<String, CommandError> {
    kubevm::target::validate_name(node)
        .map_err(|why| CommandError::usage(format!("invalid {flag} {node:?}: {why}")))?;
    Ok(node.to_owned())
}

fn suffix(dry_run: kubevm::lifecycle::DryRun) -> &'static str {
    match dry_run {
        kubevm::lifecycle::DryRun::None => "",
        kubevm::lifecycle::DryRun::Client => " (dry run)",
        kubevm::lifecycle::DryRun::Server => " (server dry run)",
    }
}

pub async fn cmd_evacuate_cancel(global: &GlobalArgs, args: EvacuateCancelArgs) -> CommandResult {
    // Local checks first.
    enum Named {
        Vm(Target),
        Node(String),
    }
    let named = match args.kind {
        EvacuateKind::Node => Named::Node(node_name(&args.name, "node")?),
        EvacuateKind::Vm | EvacuateKind::Vmi => Named::Vm(Target::parse(&args.name, false)?),
    };
    let (cluster, platform) = crate::connect::connect(global).await?;
    evacuate::check(platform.flavor)?;
    let dry_run = DryRun::lib(args.dry_run);
    let target = match named {
        Named::Node(node) => EvacuateTarget::Node(node),
        Named::Vm(t) => {
            let vm = VmRef {
                namespace: t.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?,
                name: t.name.clone(),
            };
            if args.kind == EvacuateKind::Vm {
                EvacuateTarget::Vm(vm)
            } else {
                EvacuateTarget::Vmi(vm)
            }
        }
    };
    let done = evacuate::evacuate_cancel(&cluster, platform.flavor, &target, dry_run).await?;
    let kind = match args.kind {
        EvacuateKind::Vm => kubevm::api::KUBEVIRT_VM,
        EvacuateKind::Vmi | EvacuateKind::Node => kubevm::api::KUBEVIRT_VMI,
    };
    if done.is_empty()
        && let EvacuateTarget::Node(node) = &target
    {
        eprintln!("No virtual machine instances are being evacuated from node {node:?}.");
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    for c in done {
        let what = if c.was_marked {
            format!("evacuation from {} cancelled", c.node)
        } else {
            format!("was not being evacuated from {}", c.node)
        };
        let place = if c.vmi.namespace == cluster.namespace {
            String::new()
        } else {
            format!(" in {}", c.vmi.namespace)
        };
        writeln!(
            out,
            "{}{place} {what}{}",
            kind.object_ref(&c.vmi.name),
            suffix(dry_run)
        )?;
    }
    Ok(())
}

/// `migrate --cancel --all-on-node NODE`.
pub async fn cmd_cancel_on_node(
    global: &GlobalArgs,
    node: &str,
    wait: &crate::flags::WaitArgs,
    dry_run: Option<DryRun>,
) -> CommandResult {
    let node = node_name(node, "--all-on-node")?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let options = Options {
        dry_run: DryRun::lib(dry_run),
        wait: !wait.no_wait,
        timeout: wait.timeout,
        want_object: false,
    };
    let work = evacuate::cancel_on_node(&cluster, platform.flavor, &node, &options, &|_| {});
    let done = match tokio::time::timeout(options.timeout, work).await {
        Ok(done) => done?,
        Err(_) => {
            return Err(CommandError::Failed(format!(
                "timed out waiting for the migrations from node {node} to be cancelled (after {}s; raise --timeout, or pass --no-wait)",
                options.timeout.as_secs()
            )));
        }
    };
    let mut out = std::io::stdout().lock();
    let vmi = kubevm::api::KUBEVIRT_VMI;
    for c in &done.evacuations {
        writeln!(
            out,
            "{} in {} evacuation from {node} cancelled{}",
            vmi.object_ref(&c.vmi.name),
            c.vmi.namespace,
            suffix(options.dry_run)
        )?;
    }
    let kind = migrations::kind(platform.flavor);
    for m in &done.migrations {
        writeln!(
            out,
            "{} in {} ({} of {}, {} → {}) cancelled{}",
            kind.object_ref(&m.name),
            m.namespace,
            m.operation,
            m.vm,
            m.source,
            cell(Some(&m.target)),
            suffix(options.dry_run)
        )?;
    }
    out.flush()?;
    drop(out);
    if done.evacuations.is_empty() && done.migrations.is_empty() {
        eprintln!("Nothing migrates off node {node:?}: no migration to cancel.");
    } else {
        eprintln!(
            "{} migrations cancelled, {} evacuations cancelled",
            done.migrations.len(),
            done.evacuations.len()
        );
    }
    Ok(())
}
