//! `start`, `stop`, `restart`, `pause`, `unpause`, `soft-reboot`, `reset`, `evict` and `migrate`: flags
//! into a [`kubevm::lifecycle::Action`], targets into VMs, then each VM's action run (bulk:
//! a few at a time) with its events rendered on stderr and one result line per VM on stdout.

use std::io::Write;
use std::sync::Mutex;

use clap::{Args, ValueEnum};
use clap_complete::engine::ArgValueCompleter;
use futures::StreamExt;
use kubevm::api::Kind;
use kubevm::lifecycle::{self, Action, Done, DryRun as LibDryRun, Options, Selection, VmRef};
use kubevm::target::Target;
use serde_json::{Value, json};

use super::lifecycle_render::Renderer;
use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::{DryRun, GlobalArgs, WaitArgs};
use crate::prompt;

/// How many VMs a bulk action works on at once.
const CONCURRENCY: usize = 4;

/// Flags every power action shares.
#[derive(Debug, Args)]
pub struct BulkArgs {
    /// VMs: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]; pool/NAME for every VM of a pool made by create --replicas
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub targets: Vec<String>,

    /// Act on the VMs matching this label selector (e.g. app=web,tier!=db)
    #[arg(short = 'l', long, value_name = "SELECTOR", conflicts_with_all = ["targets", "all"])]
    pub selector: Option<String>,

    /// Act on every VM in the namespace (with -A: in every namespace)
    #[arg(long, conflicts_with = "targets")]
    pub all: bool,

    /// With -l or --all: across all namespaces
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Do not ask for confirmation of a bulk action
    #[arg(short = 'y', long)]
    pub yes: bool,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would be done: client (send nothing that changes anything) or server
    /// (the server checks the request without acting on it)
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format of the result: name or json (default: a sentence per VM)
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ResultFormat>,
}

/// `-o` formats of an action's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ResultFormat {
    /// kind.group/name
    Name,
    /// The VM object after the action
    Json,
}

/// Arguments of `start`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: PUT …/virtualmachines/NAME/start. Deckhouse: a Start VirtualMachineOperation.\n\nExamples:\n  kubectl vm start web\n  kubectl vm start web --paused\n  kubectl vm start -l app=web -y --wait\n  kubectl vm start pool/web -y\n  kubectl vm start web.prod --no-wait -o name"
)]
pub struct StartArgs {
    #[command(flatten)]
    pub bulk: BulkArgs,

    /// Start with the guest paused (KubeVirt)
    #[arg(long)]
    pub paused: bool,
}

/// Arguments of `stop` and `restart`.
#[derive(Debug, Args)]
pub struct StopArgs {
    #[command(flatten)]
    pub bulk: BulkArgs,

    /// Seconds the guest gets to shut down (KubeVirt; restart accepts only 0)
    #[arg(long, value_name = "SECONDS")]
    pub grace_period: Option<i64>,

    /// At once: KubeVirt grace period 0, Deckhouse spec.force
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `pause`, `unpause`, `soft-reboot` and `reset`.
#[derive(Debug, Args)]
pub struct VmiArgs {
    #[command(flatten)]
    pub bulk: BulkArgs,
}

/// Arguments of `evict`.
#[derive(Debug, Args)]
#[command(
    after_help = "Deckhouse: an Evict VirtualMachineOperation. KubeVirt: a live migration to any other node.\n\nExamples:\n  kubectl vm evict web\n  kubectl vm evict -l app=web -y --wait"
)]
pub struct EvictArgs {
    #[command(flatten)]
    pub bulk: BulkArgs,

    /// Deckhouse: allow AutoConverge (CPU throttling) so the migration converges
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `migrate`.
#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    disable_help_subcommand = true,
    after_help = "KubeVirt: PUT …/virtualmachines/NAME/migrate, then the VirtualMachineInstanceMigration it created is\nwatched. Deckhouse: a Migrate VirtualMachineOperation. --cancel deletes the running migration;\n--cancel --all-on-node NODE every migration leaving NODE (KubeVirt: the node's evacuations are\ncancelled first, so a drain does not start them again). `migrate list` shows the migrations in flight\n(a VM named list: vm/list).\n\nExamples:\n  kubectl vm migrate web\n  kubectl vm migrate web --target-node node-2\n  kubectl vm migrate web --node-selector zone=b --no-wait\n  kubectl vm migrate web --cancel\n  kubectl vm migrate --cancel --all-on-node node-1\n  kubectl vm migrate list -A -w"
)]
pub struct MigrateArgs {
    #[command(subcommand)]
    pub command: Option<super::migrations::MigrateCommand>,

    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names), required_unless_present = "all_on_node", conflicts_with = "all_on_node")]
    pub target: Option<String>,

    /// Migrate to this node (node selector kubernetes.io/hostname=NODE)
    #[arg(long, value_name = "NODE", conflicts_with = "cancel")]
    pub target_node: Option<String>,

    /// Migrate to a node with these labels: k=v[,k=v...]
    #[arg(long, value_name = "LABELS", conflicts_with = "cancel")]
    pub node_selector: Option<String>,

    /// Deckhouse: allow AutoConverge (CPU throttling) so the migration converges
    #[arg(long, conflicts_with = "cancel")]
    pub force: bool,

    /// Cancel the VM's running migration
    #[arg(long)]
    pub cancel: bool,

    /// With --cancel: cancel every migration leaving this node, in all namespaces (what drains it)
    #[arg(
        long,
        value_name = "NODE",
        requires = "cancel",
        conflicts_with = "output"
    )]
    pub all_on_node: Option<String>,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would be done: client or server
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format of the result: name or json
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ResultFormat>,
}

/// Which command runs.
#[derive(Debug)]
pub enum Power {
    /// `start`
    Start(StartArgs),
    /// `stop`
    Stop(StopArgs),
    /// `restart`
    Restart(StopArgs),
    /// `pause`
    Pause(VmiArgs),
    /// `unpause`
    Unpause(VmiArgs),
    /// `soft-reboot`
    SoftReboot(VmiArgs),
    /// `reset`
    Reset(VmiArgs),
    /// `evict`
    Evict(EvictArgs),
}

pub async fn cmd_power(global: &GlobalArgs, command: Power) -> CommandResult {
    let (action, bulk) = power_action(command)?;
    let (names, pools) = parse_targets(&action, &bulk)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let dry_run = DryRun::lib(bulk.dry_run);
    action.check(platform.flavor, dry_run)?;
    let selection = selection(&cluster, &platform, &bulk, &names, &pools).await?;
    let is_bulk = !pools.is_empty() || !matches!(&selection, Selection::Names(n) if n.len() == 1);
    let vms = lifecycle::select(&cluster, platform.flavor, &selection).await?;
    if vms.is_empty() {
        return Err(CommandError::Failed(match &bulk.selector {
            Some(s) => format!("no virtual machines match {s:?}"),
            None => "there are no virtual machines".into(),
        }));
    }
    if is_bulk && dry_run == LibDryRun::None && !bulk.yes {
        confirm(&action, &vms).await?;
    }
    let wait = if is_bulk {
        bulk.wait.wait
    } else {
        !bulk.wait.no_wait
    };
    let options = Options {
        dry_run,
        wait,
        timeout: bulk.wait.timeout,
        want_object: bulk.output == Some(ResultFormat::Json),
    };
    execute(
        &cluster,
        &platform,
        &action,
        vms,
        &options,
        bulk.output,
        is_bulk,
    )
    .await
}

/// The lifecycle action a power command's flags ask for, checked locally.
fn power_action(command: Power) -> CommandResult<(Action, BulkArgs)> {
    let (action, bulk) = match command {
        Power::Start(a) => (Action::Start { paused: a.paused }, a.bulk),
        Power::Stop(a) => (
            Action::Stop {
                grace_period: a.grace_period,
                force: a.force,
            },
            a.bulk,
        ),
        Power::Restart(a) => {
            match a.grace_period {
                Some(g) if g < 0 => {
                    return Err(CommandError::usage("--grace-period must be 0 or more"));
                }
                Some(g) if g > 0 => {
                    return Err(CommandError::usage(
                        "restart only takes --grace-period 0 (a forced restart; KubeVirt supports no other); use --force",
                    ));
                }
                _ => {}
            }
            (
                Action::Restart {
                    force: a.force || a.grace_period == Some(0),
                },
                a.bulk,
            )
        }
        Power::Pause(a) => (Action::Pause, a.bulk),
        Power::Unpause(a) => (Action::Unpause, a.bulk),
        Power::SoftReboot(a) => (Action::SoftReboot, a.bulk),
        Power::Reset(a) => (Action::Reset, a.bulk),
        Power::Evict(a) => (Action::Evict { force: a.force }, a.bulk),
    };
    if let Action::Stop {
        grace_period: Some(g),
        ..
    } = action
        && g < 0
    {
        return Err(CommandError::usage("--grace-period must be 0 or more"));
    }
    Ok((action, bulk))
}

/// The named VMs and `pool/NAME`s to act on, with the local checks of the selection flags:
/// no request before the input is known to be good.
fn parse_targets(action: &Action, bulk: &BulkArgs) -> CommandResult<(Vec<Target>, Vec<Target>)> {
    // `pool/NAME` stands for the pool's replicas (made by `create --replicas`).
    let mut names: Vec<Target> = Vec::new();
    let mut pools: Vec<Target> = Vec::new();
    for t in &bulk.targets {
        match kubevm::target::parse_pool(t)? {
            Some(pool) => pools.push(pool),
            None => names.push(Target::parse(t, false)?),
        }
    }
    if names.is_empty() && pools.is_empty() && bulk.selector.is_none() && !bulk.all {
        return Err(CommandError::usage(format!(
            "name the VMs to {}, or select them with -l SELECTOR or --all",
            action.verb()
        )));
    }
    if bulk.all_namespaces && !(names.is_empty() && pools.is_empty()) {
        return Err(CommandError::usage(
            "-A selects across namespaces for -l or --all; name VMs in other namespaces as NAME.NAMESPACE",
        ));
    }
    if let Some(s) = &bulk.selector {
        kubevm::selector::check(s)?;
    }
    Ok((names, pools))
}

/// Which VMs the command selects: by label selector, all, or by name (a pool's replicas
/// looked up from the pool).
async fn selection(
    cluster: &kubevm::cluster::Cluster,
    platform: &kubevm::flavor::Platform,
    bulk: &BulkArgs,
    names: &[Target],
    pools: &[Target],
) -> CommandResult<Selection> {
    let namespace = (!bulk.all_namespaces).then(|| cluster.namespace.clone());
    Ok(if let Some(selector) = &bulk.selector {
        Selection::Selector {
            selector: selector.clone(),
            namespace,
        }
    } else if bulk.all {
        Selection::All { namespace }
    } else {
        let mut refs: Vec<VmRef> = names
            .iter()
            .map(|t| {
                Ok(VmRef {
                    namespace: t.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?,
                    name: t.name.clone(),
                })
            })
            .collect::<kubevm::Result<_>>()?;
        for pool in pools {
            let namespace = pool.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
            let members = kubevm::delete::pool::members(cluster, platform, &pool.name, &namespace)
                .await?
                .ok_or_else(|| crate::connect::pool_not_found(&pool.name, &namespace))?;
            refs.extend(members.1.into_iter().map(|name| VmRef {
                namespace: namespace.clone(),
                name,
            }));
        }
        Selection::Names(refs)
    })
}

pub async fn cmd_migrate(global: &GlobalArgs, args: MigrateArgs) -> CommandResult {
    match args.command {
        Some(super::migrations::MigrateCommand::List(list)) => {
            return super::migrations::cmd_migrate_list(global, list).await;
        }
        None => {}
    }
    if let Some(node) = &args.all_on_node {
        return super::migrations::cmd_cancel_on_node(global, node, &args.wait, args.dry_run).await;
    }
    let Some(target) = &args.target else {
        return Err(CommandError::usage("name the VM to migrate"));
    };
    let target = Target::parse(target, false)?;
    let mut node_selector = match &args.node_selector {
        Some(s) => lifecycle::parse_node_selector(s)?,
        None => Default::default(),
    };
    if let Some(node) = &args.target_node {
        kubevm::target::validate_name(node)
            .map_err(|why| CommandError::usage(format!("invalid --target-node {node:?}: {why}")))?;
        node_selector.insert("kubernetes.io/hostname".into(), node.clone());
    }
    let action = if args.cancel {
        Action::CancelMigration
    } else {
        Action::Migrate {
            node_selector,
            force: args.force,
        }
    };
    let (cluster, platform) = crate::connect::connect(global).await?;
    let dry_run = DryRun::lib(args.dry_run);
    action.check(platform.flavor, dry_run)?;
    let vm = VmRef {
        namespace: target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?,
        name: target.name.clone(),
    };
    let options = Options {
        dry_run,
        wait: !args.wait.no_wait,
        timeout: args.wait.timeout,
        want_object: args.output == Some(ResultFormat::Json),
    };
    execute(
        &cluster,
        &platform,
        &action,
        vec![vm],
        &options,
        args.output,
        false,
    )
    .await
}

/// Ask once for a bulk action on a terminal; off a terminal, refuse without `-y`.
async fn confirm(action: &Action, vms: &[VmRef]) -> CommandResult {
    let count = match vms.len() {
        1 => "1 virtual machine".to_owned(),
        n => format!("{n} virtual machines"),
    };
    if !prompt::interactive() {
        return Err(CommandError::usage(format!(
            "refusing to {} {count} without confirmation: there is no terminal to ask on; pass -y to confirm",
            action.verb()
        )));
    }
    let list: Vec<String> = vms.iter().map(ToString::to_string).collect();
    eprintln!("This will {} {count}:", action.verb());
    for vm in &list {
        eprintln!("  {vm}");
    }
    if !prompt::confirm("Continue?").await? {
        return Err(CommandError::Failed(format!(
            "aborted: nothing was done (answer y to {}, or pass -y)",
            action.verb()
        )));
    }
    Ok(())
}

async fn execute(
    cluster: &kubevm::cluster::Cluster,
    platform: &kubevm::flavor::Platform,
    action: &Action,
    vms: Vec<VmRef>,
    options: &Options,
    output: Option<ResultFormat>,
    is_bulk: bool,
) -> CommandResult {
    let renderer = Mutex::new(Renderer::new(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        action.is_migration(),
        is_bulk,
    ));
    for vm in &vms {
        renderer
            .lock()
            .expect("renderer")
            .begin(vm, action, options);
    }
    let on_event = |event: lifecycle::Event| renderer.lock().expect("renderer").event(event);
    let results: Vec<(VmRef, kubevm::Result<Done>)> = futures::stream::iter(vms.iter().cloned())
        .map(|vm| {
            let on_event = &on_event;
            async move {
                let result =
                    lifecycle::run(cluster, platform, action, &vm, options, on_event).await;
                (vm, result)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut results = results;
    results.sort_by(|a, b| a.0.cmp(&b.0));
    let kind = Kind::vm(platform.flavor);
    let mut ok = 0;
    let mut failed = vec![];
    let mut objects = vec![];
    let mut out = std::io::stdout().lock();
    for (vm, result) in results {
        match result {
            Ok(done) => {
                ok += 1;
                renderer.lock().expect("renderer").finish(&done, action);
                match output {
                    Some(ResultFormat::Name) => writeln!(out, "{}", kind.object_ref(&vm.name))?,
                    Some(ResultFormat::Json) => objects.push(done.object.unwrap_or(Value::Null)),
                    None => writeln!(out, "{}", result_line(&kind, action, &done, options))?,
                }
            }
            Err(e) => {
                renderer.lock().expect("renderer").fail(&vm);
                if matches!(e, kubevm::Error::InvalidTarget(_)) && !is_bulk {
                    return Err(e.into());
                }
                failed.push((vm, e));
            }
        }
    }
    if output == Some(ResultFormat::Json) && !objects.is_empty() {
        let doc = if objects.len() == 1 && !is_bulk {
            objects.remove(0)
        } else {
            json!({"apiVersion": "v1", "kind": "List", "items": objects, "metadata": {"resourceVersion": ""}})
        };
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        )?;
    }
    out.flush()?;
    drop(out);
    if !is_bulk {
        return match failed.pop() {
            Some((vm, e)) => Err(single_failure(cluster, platform, action, &vm, e).await),
            None => Ok(()),
        };
    }
    for (vm, e) in &failed {
        eprintln!("Error: {vm}: {e}");
    }
    let finished = options.wait || options.dry_run != LibDryRun::None;
    eprintln!("{}", summary(action, ok, failed.len(), finished));
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CommandError::Failed(format!(
            "{} of {} virtual machines failed",
            failed.len(),
            ok + failed.len()
        )))
    }
}

/// The error of a one-VM command; a name that is not a VM but a pool's points at its
/// replicas (looked up only on failure).
async fn single_failure(
    cluster: &kubevm::cluster::Cluster,
    platform: &kubevm::flavor::Platform,
    action: &Action,
    vm: &VmRef,
    e: kubevm::Error,
) -> CommandError {
    if matches!(&e, kubevm::Error::NotFound { kind, .. } if kind == "virtualmachine")
        && let Ok(Some((_, members))) =
            kubevm::delete::pool::members(cluster, platform, &vm.name, &vm.namespace).await
    {
        return CommandError::Failed(format!(
            "{e}; {:?} is a pool of {} virtual machines ({}): use pool/{} to {} them all",
            vm.name,
            members.len(),
            members.join(", "),
            vm.name,
            action.verb()
        ));
    }
    e.into()
}

/// `virtualmachine.kubevirt.io/web started`, `… start requested`, `… started (server dry run)`.
fn result_line(kind: &Kind, action: &Action, done: &Done, options: &Options) -> String {
    let what = if done.waited || options.dry_run != LibDryRun::None {
        action.past().to_owned()
    } else {
        format!("{} requested", action.verb())
    };
    let suffix = match options.dry_run {
        LibDryRun::None => "",
        LibDryRun::Client => " (dry run)",
        LibDryRun::Server => " (server dry run)",
    };
    format!("{} {what}{suffix}", kind.object_ref(&done.vm.name))
}

/// `3 started, 1 failed` (`2 stop requested` without waiting).
fn summary(action: &Action, ok: usize, failed: usize, finished: bool) -> String {
    let mut s = if finished {
        format!("{ok} {}", action.past())
    } else {
        format!("{ok} {} requested", action.verb())
    };
    if failed > 0 {
        s.push_str(&format!(", {failed} failed"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubevm::api::KUBEVIRT_VM;
    use std::time::Duration;

    #[test]
    fn summary_and_result_lines() {
        assert_eq!(
            summary(&Action::Start { paused: false }, 3, 1, true),
            "3 started, 1 failed"
        );
        assert_eq!(summary(&Action::Pause, 2, 0, true), "2 paused");
        assert_eq!(
            summary(
                &Action::Stop {
                    grace_period: None,
                    force: false
                },
                2,
                0,
                false
            ),
            "2 stop requested"
        );
        let done = Done {
            vm: VmRef {
                namespace: "default".into(),
                name: "web".into(),
            },
            waited: false,
            migrated: None,
            object: None,
        };
        let options = Options {
            dry_run: LibDryRun::None,
            wait: false,
            timeout: Duration::from_secs(1),
            want_object: false,
        };
        assert_eq!(
            result_line(
                &KUBEVIRT_VM,
                &Action::Stop {
                    grace_period: None,
                    force: false
                },
                &done,
                &options
            ),
            "virtualmachine.kubevirt.io/web stop requested"
        );
    }
}
