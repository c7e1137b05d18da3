//! `kubectl vm snapshot create|list|delete|restore`: VM snapshots and rolling a VM back to one
//! (KubeVirt VirtualMachineSnapshot / VirtualMachineRestore; Deckhouse VirtualMachineSnapshot /
//! VirtualMachineOperation Restore).

use std::io::Write;

use clap::{Args, Subcommand};
use clap_complete::engine::ArgValueCompleter;
use kubevm::snapshot::{self, DryRun as LibDryRun, Event, Options, Outcome, RestoreRequest};
use kubevm::target::{Target, TargetKind};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::ChangeFormat;
use crate::flags::GlobalArgs;
use crate::flags::{DryRun, WaitArgs};
use crate::render::{OutputFormat, Table, age, cell};

/// Arguments of `snapshot`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: a VirtualMachineSnapshot made here (labelled as made by kubectl vm); the guest agent\nfreezes the filesystems of a running VM, and without one the snapshot is only crash-consistent\n(said on stderr). restore makes a VirtualMachineRestore: the VM must be stopped, so a running VM\nis refused unless --stop, which stops it, restores and starts it again. --new-vm NAME restores into\na new VM of that name (its disks are new copies; the source VM is not touched). delete removes\nonly snapshots kubectl vm made unless --force, with the uid read as a precondition. Deleting a VM\nkeeps its snapshots (KubeVirt does too); delete them here.\n\nDeckhouse: a VirtualMachineSnapshot made here, with a VirtualDiskSnapshot per disk (deleted with it).\nA running VM is frozen by its agent; without a ready agent the snapshot is crash-consistent (said\non stderr). restore makes a VirtualMachineOperation Restore (mode Strict): Deckhouse stops a\nrunning VM for it and starts it again, so a running VM is refused unless --stop. --new-vm NAME makes a\nnew VM from what the snapshot keeps: its disks from the VirtualDiskSnapshots, then its cloud-init\nSecret (with its own SSH identity), then the VM, last, so it never boots with the source's\nidentity (the source VM is not touched); `delete NAME` removes it with its disks.\n\nExamples:\n  kubectl vm snapshot create web\n  kubectl vm snapshot create web before-upgrade --timeout 10m\n  kubectl vm snapshot list web\n  kubectl vm snapshot list -A -o wide\n  kubectl vm snapshot restore before-upgrade --stop\n  kubectl vm snapshot restore before-upgrade --new-vm web-copy\n  kubectl vm snapshot delete before-upgrade"
)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

/// The `snapshot` subcommands.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Take a snapshot of a VM (default name VM-YYYYMMDD-HHMMSS)
    Create(CreateArgs),
    /// List snapshots: name, VM, phase, ready, size, age
    List(ListArgs),
    /// Delete snapshots (only those kubectl vm made, unless --force)
    Delete(DeleteArgs),
    /// Roll a VM back to a snapshot (--stop for a running VM), or restore it as a new VM (--new-vm)
    Restore(RestoreArgs),
}

/// Arguments of `snapshot create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// The snapshot's name (default: VM-YYYYMMDD-HHMMSS, UTC)
    #[arg(value_name = "NAME")]
    pub name: Option<String>,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would be done: client (send nothing) or server (the server checks it)
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format of the result (default: a sentence)
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ChangeFormat>,
}

/// Arguments of `snapshot list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only snapshots of this VM
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub vm: Option<String>,

    /// List snapshots in all namespaces
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Output format: wide, yaml, json or name instead of the table
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<OutputFormat>,

    /// Do not print the header row
    #[arg(long)]
    pub no_headers: bool,
}

/// Arguments of `snapshot delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// Snapshot names
    #[arg(value_name = "NAME", required = true, add = ArgValueCompleter::new(complete::snapshot_names))]
    pub names: Vec<String>,

    /// Also delete snapshots kubectl vm did not make
    #[arg(long)]
    pub force: bool,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would be done: client or server
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format: name prints kind.group/name of each deleted snapshot
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ChangeFormat>,
}

/// Arguments of `snapshot restore`.
#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The snapshot
    #[arg(value_name = "NAME", add = ArgValueCompleter::new(complete::snapshot_names))]
    pub name: String,

    /// Stop the VM if it runs, restore, and start it again (else a running VM is refused)
    #[arg(long)]
    pub stop: bool,

    /// Restore into a new VM of this name instead (the snapshot's VM is not touched)
    #[arg(long = "new-vm", value_name = "NEWNAME", conflicts_with = "stop")]
    pub new_vm: Option<String>,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would be done: client or server
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format of the result (default: a sentence)
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ChangeFormat>,
}

fn options(wait: &WaitArgs, dry_run: Option<DryRun>) -> Options {
    Options {
        dry_run: match dry_run.unwrap_or(DryRun::None) {
            DryRun::None => LibDryRun::None,
            DryRun::Client => LibDryRun::Client,
            DryRun::Server => LibDryRun::Server,
        },
        wait: !wait.no_wait,
        timeout: wait.timeout,
    }
}

fn dry_note(options: &Options) -> &'static str {
    match options.dry_run {
        LibDryRun::Client => " (dry run)",
        LibDryRun::Server => " (server dry run)",
        LibDryRun::None => "",
    }
}

/// Progress on stderr.
fn render_event(event: Event) {
    match event {
        Event::Created(what) => eprintln!("{what} created"),
        Event::Phase { phase, message } if message.is_empty() => eprintln!("  {phase}"),
        Event::Phase { phase, message } => eprintln!("  {phase}: {message}"),
        Event::Notice(message) => eprintln!("Note: {message}"),
    }
}

/// The namespace of a plain name (`-n` or the context's).
async fn namespace_of(
    global: &GlobalArgs,
) -> CommandResult<(kubevm::cluster::Cluster, kubevm::flavor::Platform, String)> {
    let (cluster, platform) = crate::connect::connect(global).await?;
    let ns = cluster.namespace.clone();
    Ok((cluster, platform, ns))
}

pub async fn cmd_snapshot(global: &GlobalArgs, args: SnapshotArgs) -> CommandResult {
    match args.command {
        SnapshotCommand::Create(a) => create(global, a).await,
        SnapshotCommand::List(a) => list(global, a).await,
        SnapshotCommand::Delete(a) => delete(global, a).await,
        SnapshotCommand::Restore(a) => restore(global, a).await,
    }
}

fn print_outcome(
    outcome: &Outcome,
    output: Option<ChangeFormat>,
    sentence: String,
) -> CommandResult {
    let mut out = std::io::stdout().lock();
    match output {
        Some(ChangeFormat::Name) => writeln!(out, "{}", outcome.object_ref)?,
        Some(format) => {
            let f = if format == ChangeFormat::Json {
                OutputFormat::Json
            } else {
                OutputFormat::Yaml
            };
            crate::render::write_object(&mut out, &outcome.object.clone().unwrap_or_default(), f)?;
        }
        None => writeln!(out, "{sentence}")?,
    }
    Ok(())
}

async fn create(global: &GlobalArgs, args: CreateArgs) -> CommandResult {
    let target = Target::parse(&args.target, false)?;
    if target.kind == TargetKind::Vmi {
        return Err(CommandError::usage(format!(
            "target {target}: snapshots are of virtual machines; use vm/{}",
            target.name
        )));
    }
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    let name = args.name.clone().unwrap_or_else(|| {
        snapshot::default_name(&target.name, jiff::Timestamp::now().as_second())
    });
    snapshot::check_name("snapshot", &name)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let options = options(&args.wait, args.dry_run);
    let outcome = snapshot::create(
        &cluster,
        platform.flavor,
        &namespace,
        &target.name,
        &name,
        &options,
        &render_event,
    )
    .await?;
    let state = if options.dry_run != LibDryRun::None {
        String::new()
    } else if !outcome.waited {
        // The snapshot itself says when it is ready (a `vmrestore` or `vmop` tracks restores,
        // not snapshots), on either platform.
        "; not waited for: see `kubectl vm snapshot list`".into()
    } else if outcome.no_agent {
        "; ready (crash-consistent: no guest agent froze the filesystems)".into()
    } else {
        "; ready".into()
    };
    let sentence = format!(
        "snapshot {} of {} created{}{state}",
        outcome.snapshot,
        outcome.vm,
        dry_note(&options)
    );
    print_outcome(&outcome, args.output, sentence)
}

async fn list(global: &GlobalArgs, args: ListArgs) -> CommandResult {
    if args.all_namespaces && global.namespace.is_some() {
        return Err(CommandError::usage(
            "-A/--all-namespaces and -n/--namespace cannot be used together",
        ));
    }
    if let Some(vm) = &args.vm {
        kubevm::validate::dns_subdomain("VM", vm)
            .map_err(|e| CommandError::usage(e.to_string()))?;
    }
    let (cluster, platform, ns) = namespace_of(global).await?;
    let scope = (!args.all_namespaces).then_some(ns.as_str());
    let rows = snapshot::list(&cluster, platform.flavor, scope, args.vm.as_deref()).await?;
    let mut out = std::io::stdout().lock();
    match args.output {
        Some(f @ (OutputFormat::Yaml | OutputFormat::Json)) => {
            let items = rows
                .iter()
                .map(|r| {
                    let mut o = r.object.clone();
                    crate::render::without_managed_fields(&mut o);
                    o
                })
                .collect();
            crate::render::write_object(&mut out, &crate::render::list_object(items), f)?;
            return Ok(());
        }
        Some(OutputFormat::Name) => {
            for r in &rows {
                writeln!(
                    out,
                    "{}",
                    snapshot::snapshot_kind(platform.flavor).object_ref(&r.name)
                )?;
            }
            return Ok(());
        }
        _ => {}
    }
    let wide = args.output == Some(OutputFormat::Wide);
    let mut headers = vec![];
    if args.all_namespaces {
        headers.push("NAMESPACE");
    }
    headers.extend(["NAME", "VM", "PHASE", "READY", "SIZE", "AGE"]);
    if wide {
        headers.extend(["INDICATIONS", "MANAGED", "LEFT OUT"]);
    }
    let mut table = Table::new(&headers);
    let now = jiff::Timestamp::now();
    for r in &rows {
        let mut row = vec![];
        if args.all_namespaces {
            row.push(r.namespace.clone());
        }
        row.extend([
            r.name.clone(),
            cell(Some(&r.vm)),
            cell(Some(&r.phase).filter(|p| !p.is_empty())),
            r.ready.to_string(),
            cell(Some(&r.size).filter(|s| !s.is_empty())),
            age(r.created.parse().ok(), now),
        ]);
        if wide {
            row.push(cell(
                Some(r.indications.join(",")).filter(|s| !s.is_empty()),
            ));
            row.push(if r.ours {
                "kubectl-vm".into()
            } else {
                crate::render::NONE.into()
            });
            row.push(cell(Some(r.left_out.join(",")).filter(|s| !s.is_empty())));
        }
        table.push(row);
    }
    table.write(&mut out, !args.no_headers)?;
    out.flush()?;
    Ok(())
}

async fn delete(global: &GlobalArgs, args: DeleteArgs) -> CommandResult {
    if args.output.is_some_and(|o| o != ChangeFormat::Name) {
        return Err(CommandError::usage("-o takes only name here"));
    }
    for n in &args.names {
        snapshot::check_name("snapshot", n)?;
    }
    let (cluster, platform, ns) = namespace_of(global).await?;
    let options = options(&args.wait, args.dry_run);
    let deleted = snapshot::delete(
        &cluster,
        platform.flavor,
        &ns,
        &args.names,
        args.force,
        &options,
        &|_| {},
    )
    .await?;
    let mut out = std::io::stdout().lock();
    for d in &deleted {
        if args.output == Some(ChangeFormat::Name) {
            writeln!(out, "{}", d.object_ref)?;
        } else {
            writeln!(
                out,
                "virtualmachinesnapshot.{} {:?} deleted{}",
                snapshot::snapshot_kind(platform.flavor).group,
                d.name,
                dry_note(&options)
            )?;
        }
    }
    Ok(())
}

async fn restore(global: &GlobalArgs, args: RestoreArgs) -> CommandResult {
    snapshot::check_name("snapshot", &args.name)?;
    if let Some(n) = &args.new_vm {
        snapshot::check_name("new VM", n)?;
    }
    let (cluster, platform, ns) = namespace_of(global).await?;
    let options = options(&args.wait, args.dry_run);
    let request = RestoreRequest {
        snapshot: args.name.clone(),
        new_vm: args.new_vm.clone(),
        stop: args.stop,
    };
    let outcome =
        snapshot::restore(&cluster, &platform, &ns, &request, &options, &render_event).await?;
    let state = if options.dry_run != LibDryRun::None {
        String::new()
    } else if !outcome.waited {
        let (in_place, new_vm) = kubevm::platform::of(platform.flavor).restore_tracked_by;
        let kind = if args.new_vm.is_some() {
            new_vm
        } else {
            in_place
        };
        format!("; not waited for: see `kubectl get {kind}`")
    } else if outcome.restarted {
        "; it was stopped for the restore and started again".into()
    } else if args.new_vm.is_some() && kubevm::platform::of(platform.flavor).restored_new_vm_stopped
    {
        "; the new VM is stopped: start it with `kubectl vm start`".into()
    } else {
        String::new()
    };
    let sentence = format!(
        "{} restored from snapshot {}{}{state}",
        outcome.vm,
        outcome.snapshot,
        dry_note(&options)
    );
    print_outcome(&outcome, args.output, sentence)
}
