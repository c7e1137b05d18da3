//! `kubectl vm set resources|policy`: change a VM after it exists, in the shape of
//! `kubectl set`. The flags of each verb become a `kubevm::set` change; the library reads,
//! changes and writes the VM with its resourceVersion and reports what the platform says.

pub mod network;
pub mod placement;
pub mod policy;
pub mod resources;

use std::io::Write;

use clap::{Args, Subcommand};
use kubevm::lifecycle::VmRef;
use kubevm::set::{self, Applies, Change, Event, Options, Outcome};
use kubevm::target::{Target, TargetKind};

use crate::error::{CommandError, CommandResult};
use crate::flags::{DryRun, GlobalArgs, WaitArgs};
use crate::render::OutputFormat;

/// Arguments of `set`.
#[derive(Debug, Args)]
#[command(
    after_help = "Each verb reads the VM, changes it and writes it back with its resourceVersion: when someone\nelse changed the VM in between, the change is made again on the fresh VM (never over theirs).\nThe summary lists each changed field (old → new) and then what the platform reports: applied\nlive, waiting for a restart (KubeVirt's RestartRequired condition; Deckhouse's\nAwaitingRestartToApplyConfiguration and status.restartAwaitingChanges), or taken at the next start\nof a stopped VM. --restart restarts the VM when the change waits for it.\n\nExamples:\n  kubectl vm set resources web --cpu 4 --memory 8Gi\n  kubectl vm set resources web --memory 4Gi --restart\n  kubectl vm set resources linux-vm --cpu 2 --core-fraction 50%\n  kubectl vm set policy web --run-strategy Manual --eviction-strategy LiveMigrate\n  kubectl vm set policy web --label team=web --label old-\n  kubectl vm set policy web --template --annotation note=canary --dry-run -o yaml\n  kubectl vm set placement web --node-selector disktype=ssd --toleration gpu=true:NoSchedule\n  kubectl vm set network web --add storage"
)]
pub struct SetArgs {
    #[command(subcommand)]
    pub command: SetCommand,
}

/// The `set` subcommands.
#[derive(Debug, Subcommand)]
pub enum SetCommand {
    /// Change a VM's CPU and memory (KubeVirt: topology or instancetype; Deckhouse: cores, core fraction)
    Resources(resources::ResourcesArgs),
    /// Change a VM's run and eviction policy, grace period, labels and annotations
    Policy(policy::PolicyArgs),
    /// Change where a VM may run: node selector, tolerations, priority class
    Placement(placement::PlacementArgs),
    /// Add or remove a VM's secondary networks (KubeVirt Multus; Deckhouse Network, ClusterNetwork)
    Network(network::NetworkArgs),
}

/// Flags every `set` verb has.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = clap_complete::engine::ArgValueCompleter::new(crate::complete::vm_names))]
    pub target: String,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would change: client (send nothing) or server (the server checks it)
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Print the VM after the change as yaml or json (the summary then goes to stderr)
    #[arg(short = 'o', long, value_parser = ["yaml", "json"], value_name = "FORMAT")]
    pub output: Option<String>,
}

pub async fn cmd_set(global: &GlobalArgs, args: SetArgs) -> CommandResult {
    match args.command {
        SetCommand::Resources(a) => resources::cmd(global, a).await,
        SetCommand::Policy(a) => policy::cmd(global, a).await,
        SetCommand::Placement(a) => placement::cmd(global, a).await,
        SetCommand::Network(a) => network::cmd(global, a).await,
    }
}

/// The VM named on the command line, before any request.
fn target(global: &GlobalArgs, common: &CommonArgs) -> CommandResult<Target> {
    let target = Target::parse(&common.target, false)?;
    if target.kind == TargetKind::Vmi {
        return Err(CommandError::usage(format!(
            "target {target}: set changes virtual machines; use vm/{}",
            target.name
        )));
    }
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    Ok(target)
}

/// Connect, run `change` on the target and print the outcome.
async fn run(
    global: &GlobalArgs,
    common: &CommonArgs,
    target: Target,
    change: &dyn Change,
    restart: bool,
) -> CommandResult {
    run_with(global, common, target, change, None, restart).await
}

/// [`run`], a network change through `set::network::run` (which also reads the instance).
async fn run_with(
    global: &GlobalArgs,
    common: &CommonArgs,
    target: Target,
    change: &dyn Change,
    networks: Option<&set::network::Networks>,
    restart: bool,
) -> CommandResult {
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let vm = VmRef {
        namespace,
        name: target.name.clone(),
    };
    let options = Options {
        dry_run: DryRun::lib(common.dry_run),
        wait: !common.wait.no_wait,
        restart,
        timeout: common.wait.timeout,
    };
    let on_event = |event: Event| match event {
        Event::Conflict { attempt } => eprintln!(
            "virtual machine {vm} changed since it was read (attempt {attempt}): applying the change again to the fresh VM"
        ),
        Event::Restarting => eprintln!("restarting virtual machine {vm} to apply the change"),
        Event::Lifecycle(kubevm::lifecycle::Event::Phase { phase, .. }) => eprintln!("  {phase}"),
        Event::Lifecycle(_) => {}
    };
    let outcome = match networks {
        Some(request) => {
            set::network::run(&cluster, &platform, request, &vm, &options, &on_event).await?
        }
        None => set::run(&cluster, &platform, change, &vm, &options, &on_event).await?,
    };
    print(&outcome, &options, common.output.as_deref())
}

fn print(outcome: &Outcome, options: &Options, output: Option<&str>) -> CommandResult {
    let dry = match options.dry_run {
        kubevm::api::DryRun::Client => " (dry run)",
        kubevm::api::DryRun::Server => " (server dry run)",
        kubevm::api::DryRun::None => "",
    };
    let mut summary = Vec::new();
    if outcome.changes.is_empty() {
        summary.push(format!("{} unchanged", outcome.object_ref));
        if outcome.restarted {
            summary.push(applies(outcome, options));
        }
    } else {
        summary.push(format!("{} changed{dry}:", outcome.object_ref));
        summary.extend(outcome.changes.iter().map(|c| format!("  {c}")));
        if outcome.attempts > 1 {
            summary.push(format!(
                "  (written on attempt {}: the VM changed under us before)",
                outcome.attempts
            ));
        }
        summary.push(applies(outcome, options));
    }
    match output {
        Some(format) => {
            let mut err = std::io::stderr().lock();
            for line in &summary {
                let _ = writeln!(err, "{line}");
            }
            let f = if format == "json" {
                OutputFormat::Json
            } else {
                OutputFormat::Yaml
            };
            let mut out = std::io::stdout().lock();
            crate::render::write_object(&mut out, &outcome.object, f)?;
        }
        None => {
            let mut out = std::io::stdout().lock();
            for line in &summary {
                writeln!(out, "{line}")?;
            }
        }
    }
    Ok(())
}

/// The platform's verdict as one line.
fn applies(outcome: &Outcome, options: &Options) -> String {
    let vm = &outcome.vm;
    if options.dry_run != kubevm::api::DryRun::None {
        return "nothing was changed".into();
    }
    let restarted = if outcome.restarted {
        "restarted to apply it; "
    } else {
        ""
    };
    match &outcome.applies {
        Applies::Live if outcome.restarted => {
            "restarted to apply it: the platform reports nothing left waiting".into()
        }
        Applies::Live => "applied live: the platform reports no restart needed".into(),
        Applies::Migrating { message } => {
            format!("{restarted}migrating to apply: {message} (`kubectl vm migrate list` follows it)")
        }
        Applies::AtStart => format!("{restarted}the VM is not running: it takes the change when it starts"),
        Applies::AtRestart { message, pending } => {
            let fields = if pending.is_empty() {
                String::new()
            } else {
                format!(" [{}]", pending.join(", "))
            };
            format!(
                "{restarted}applies at the next restart: {message}{fields} (`kubectl vm restart {}.{}`, or pass --restart)",
                vm.name, vm.namespace
            )
        }
        Applies::NotObserved if !options.wait && !options.restart => {
            "not waited for: `kubectl vm get` shows whether it waits for a restart".into()
        }
        Applies::NotObserved => {
            "the platform does not report whether it observed the change (no status.observedGeneration)".into()
        }
    }
}
