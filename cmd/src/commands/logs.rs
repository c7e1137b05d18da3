//! `kubectl vm logs VM`: the guest's serial console history (KubeVirt's `guest-console-log`
//! container), or `--launcher`: the virt-launcher's own log, streamed to stdout.

use std::time::Duration;

use clap::Args;
use clap_complete::engine::ArgValueCompleter;
use kubevm::logs::{self, LogsRequest, Source};
use kubevm::target::Target;

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// Arguments of `logs`.
#[derive(Debug, Args)]
#[command(
    after_help = "The console history is what the guest wrote to its serial console since the VM started, kept\nby the platform whether or not anyone was attached: KubeVirt's guest-console-log container of the\nvirt-launcher pod (on unless the VM sets logSerialConsole: false or the KubeVirt CR sets\nvirtualMachineOptions.disableSerialConsoleLog; `kubectl vm create --console-log` turns it on for\none VM). Deckhouse virtualization keeps none (only --launcher works there).\n\n--previous: the launcher pod of the VM's previous run while the cluster still has it (KubeVirt\ndeletes it with its VMI at a restart); with --launcher, the previous instance of the launcher\ncontainer, as kubectl logs --previous.\n\nExamples:\n  kubectl vm logs web\n  kubectl vm logs web.prod -f --since 10m\n  kubectl vm logs web --tail 100 --timestamps\n  kubectl vm logs web --launcher"
)]
pub struct LogsArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Keep streaming new lines as the guest writes them
    #[arg(short, long)]
    pub follow: bool,

    /// Only lines newer than this, e.g. 10s, 5m, 1h
    #[arg(long, value_name = "DURATION", value_parser = kubevm::cluster::parse_duration)]
    pub since: Option<Duration>,

    /// Only the last LINES lines (-1: all)
    #[arg(
        long,
        value_name = "LINES",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub tail: i64,

    /// Prefix each line with the time it was written (RFC 3339)
    #[arg(long)]
    pub timestamps: bool,

    /// The log from before the last restart (see below)
    #[arg(short, long)]
    pub previous: bool,

    /// The virt-launcher's own log (its compute container) instead of the guest's console
    #[arg(long)]
    pub launcher: bool,
}

pub async fn cmd_logs(global: &GlobalArgs, args: LogsArgs) -> CommandResult {
    if args.tail < -1 {
        return Err(CommandError::usage(format!(
            "--tail must be -1 (all lines) or more, not {}",
            args.tail
        )));
    }
    let target = Target::parse(&args.target, false)?;
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    let mut request = LogsRequest {
        namespace: String::new(),
        name: target.name.clone(),
        source: if args.launcher {
            Source::Launcher
        } else {
            Source::Console
        },
        follow: args.follow,
        since: args.since,
        tail: (args.tail >= 0).then_some(args.tail),
        timestamps: args.timestamps,
        previous: args.previous,
    };
    request.validate()?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    request.namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let at = logs::locate(&cluster, platform.flavor, &request).await?;
    let mut out = std::io::stdout().lock();
    match logs::copy(&cluster, &request, &at, &mut out).await? {
        Ok(()) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
