//! `kubectl vm set placement VM --node-selector k=v --toleration key[=value]:Effect --priority-class NAME`.

use clap::Args;
use kubevm::set::placement::Placement;

use super::CommonArgs;
use crate::error::CommandResult;
use crate::flags::GlobalArgs;

/// Arguments of `set placement`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: spec.template.spec.nodeSelector, tolerations and priorityClassName; Deckhouse:\nspec.nodeSelector, tolerations and priorityClassName. A running VM whose node selector or\ntolerations changed is moved by a live migration (KubeVirt under vmRolloutStrategy LiveUpdate,\nwhen its node no longer matches: the VMI's NodePlacementNotMatched condition; Deckhouse: phase\nMigrating); the priority class waits for a restart. A stopped VM takes it when it starts.\n\nExamples:\n  kubectl vm set placement web --node-selector disktype=ssd\n  kubectl vm set placement web --node-selector disktype- --toleration gpu=true:NoSchedule\n  kubectl vm set placement web --toleration dedicated:NoExecute --toleration old-\n  kubectl vm set placement linux-vm --priority-class high --dry-run=server -o yaml"
)]
pub struct PlacementArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Set (KEY=VALUE) or remove (KEY-) a node selector label (repeatable)
    #[arg(long = "node-selector", value_name = "KEY=VALUE|KEY-")]
    pub node_selector: Vec<String>,

    /// Add a toleration KEY[=VALUE]:EFFECT (EFFECT: NoSchedule, PreferNoSchedule, NoExecute;
    /// no value: operator Exists) or remove every toleration of KEY (KEY-) (repeatable)
    #[arg(long = "toleration", value_name = "KEY[=VALUE]:EFFECT|KEY-")]
    pub tolerations: Vec<String>,

    /// The VM's priority class
    #[arg(long, value_name = "NAME")]
    pub priority_class: Option<String>,

    /// Restart the VM when the change waits for a restart
    #[arg(long)]
    pub restart: bool,
}

pub async fn cmd(global: &GlobalArgs, args: PlacementArgs) -> CommandResult {
    let target = super::target(global, &args.common)?;
    let request = Placement::parse(
        &args.node_selector,
        &args.tolerations,
        args.priority_class.clone(),
    )?;
    super::run(global, &args.common, target, &request, args.restart).await
}
