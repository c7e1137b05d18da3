//! `kubectl vm set resources VM --cpu N --memory Q …`.

use clap::Args;
use kubevm::create::options::CoreFraction;
use kubevm::quantity::Quantity;
use kubevm::set::resources::Resources;

use super::CommonArgs;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// Arguments of `set resources`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: --cpu N sets the template's sockets to N / (cores × threads), the dimension KubeVirt\nhot-plugs under vmRolloutStrategy LiveUpdate (up to the instance's maxSockets; memory up to its\nmaxGuest); --sockets/--cores/--threads set the topology itself (cores and threads need a restart).\nA VM backed by an instancetype takes CPU and memory from it: change it with --instancetype.\nDeckhouse: --cpu sets spec.cpu.cores, --core-fraction spec.cpu.coreFraction, --memory\nspec.memory.size; the VirtualMachineClass sizing policy is checked first.\n\nExamples:\n  kubectl vm set resources web --cpu 4 --memory 8Gi\n  kubectl vm set resources web --sockets 2 --cores 2 --restart\n  kubectl vm set resources db --instancetype u1.large\n  kubectl vm set resources linux-vm --cpu 2 --memory 2Gi --core-fraction 20% --dry-run"
)]
pub struct ResourcesArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Number of vCPUs (KubeVirt: sockets × cores × threads; Deckhouse: cores)
    #[arg(long, value_name = "N")]
    pub cpu: Option<u32>,

    /// Memory, e.g. 4Gi (KubeVirt: guest memory; Deckhouse: spec.memory.size)
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,

    /// Deckhouse: guaranteed share of each core, e.g. 50%, or Auto
    #[arg(long, value_name = "PERCENT")]
    pub core_fraction: Option<String>,

    /// KubeVirt: CPU sockets
    #[arg(long, value_name = "N", conflicts_with = "cpu")]
    pub sockets: Option<u32>,

    /// KubeVirt: cores per socket
    #[arg(long, value_name = "N")]
    pub cores: Option<u32>,

    /// KubeVirt: threads per core
    #[arg(long, value_name = "N")]
    pub threads: Option<u32>,

    /// KubeVirt: the instancetype of an instancetype-backed VM
    #[arg(long, value_name = "NAME")]
    pub instancetype: Option<String>,

    /// Restart the VM when the change waits for a restart
    #[arg(long)]
    pub restart: bool,
}

pub async fn cmd(global: &GlobalArgs, args: ResourcesArgs) -> CommandResult {
    let target = super::target(global, &args.common)?;
    // Checked here, not by clap, so that a bad value is one line (exit 2).
    let memory = match &args.memory {
        Some(m) => {
            Some(Quantity::parse(m).map_err(|e| CommandError::usage(format!("--memory: {e}")))?)
        }
        None => None,
    };
    let core_fraction = match &args.core_fraction {
        Some(f) => Some(
            f.parse::<CoreFraction>()
                .map_err(|e| CommandError::usage(format!("--core-fraction: {e}")))?,
        ),
        None => None,
    };
    let request = Resources {
        cpu: args.cpu,
        memory,
        core_fraction,
        sockets: args.sockets,
        cores: args.cores,
        threads: args.threads,
        instancetype: args.instancetype.clone(),
    };
    request.validate()?;
    super::run(global, &args.common, target, &request, args.restart).await
}
