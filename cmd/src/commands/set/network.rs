//! `kubectl vm set network VM --add NAME[=NETWORK] --remove NAME`.

use clap::Args;
use kubevm::set::network::Networks;

use super::CommonArgs;
use crate::error::CommandResult;
use crate::flags::GlobalArgs;

/// Arguments of `set network`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: --add NAME[=[NAMESPACE/]NAD] adds interface NAME with bridge binding on the Multus\nNetworkAttachmentDefinition NAD (default: NAME, in the VM's namespace), which must exist. Under\nvmRolloutStrategy LiveUpdate a running VM gets it by a live migration (MigrationRequired); --remove\nmarks a running VM's interface absent (unplugged the same way) and removes a stopped VM's.\nOtherwise the change waits for a restart (RestartRequired).\nDeckhouse: --add [network/|clusternetwork/]NAME appends a Network (the default) or ClusterNetwork to\nspec.networks after Main; adding or removing one applies without a restart. The sdn module's\nNetwork (in the VM's namespace) or ClusterNetwork must exist.\n\nExamples:\n  kubectl vm set network web --add storage\n  kubectl vm set network web --add backup=infra/backup-net --dry-run=server\n  kubectl vm set network web --remove storage\n  kubectl vm set network linux-vm --add clusternetwork/corp-net -o yaml"
)]
pub struct NetworkArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Attach a secondary network: NAME[=NETWORK] (repeatable)
    #[arg(long = "add", value_name = "NAME[=NETWORK]", add = clap_complete::engine::ArgValueCompleter::new(crate::complete::network_names))]
    pub add: Vec<String>,

    /// Detach a secondary network (KubeVirt: by interface name) (repeatable)
    #[arg(long = "remove", value_name = "NAME")]
    pub remove: Vec<String>,

    /// Restart the VM when the change waits for a restart
    #[arg(long)]
    pub restart: bool,
}

pub async fn cmd(global: &GlobalArgs, args: NetworkArgs) -> CommandResult {
    let target = super::target(global, &args.common)?;
    let request = Networks::parse(&args.add, &args.remove)?;
    super::run_with(
        global,
        &args.common,
        target,
        &request,
        Some(&request),
        args.restart,
    )
    .await
}
