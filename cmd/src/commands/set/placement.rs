//! `kubectl vm set placement VM --node-selector k=v --toleration key[=value]:Effect
//! --node-affinity k=v --spread-by KEY --priority-class NAME`.

use clap::Args;

use super::CommonArgs;
use crate::error::CommandResult;
use crate::flags::GlobalArgs;

/// Arguments of `set placement`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: spec.template.spec.nodeSelector, tolerations, affinity and priorityClassName;\nDeckhouse: spec.nodeSelector, tolerations, affinity and priorityClassName. A running VM whose node\nselector, affinity or tolerations changed is moved by a live migration (KubeVirt under vmRolloutStrategy LiveUpdate,\nwhen its node no longer matches: the VMI's NodePlacementNotMatched condition; Deckhouse: phase\nMigrating); the priority class waits for a restart. A stopped VM takes it when it starts.\n\nExamples:\n  kubectl vm set placement web --node-selector disktype=ssd\n  kubectl vm set placement web --node-selector disktype- --toleration gpu=true:NoSchedule\n  kubectl vm set placement web --toleration dedicated:NoExecute --toleration old-\n  kubectl vm set placement web-0 --spread-by zone --node-affinity topology.kubernetes.io/zone=a\n  kubectl vm set placement linux-vm --priority-class high --dry-run=server -o yaml"
)]
pub struct PlacementArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// Set (KEY=VALUE) or remove (KEY-) a node selector label (repeatable)
    #[arg(long = "node-selector", value_name = "KEY=VALUE|KEY-", add = clap_complete::engine::ArgValueCompleter::new(crate::complete::node_labels))]
    pub node_selector: Vec<String>,

    /// Add a toleration KEY[=VALUE]:EFFECT (EFFECT: NoSchedule, PreferNoSchedule, NoExecute;
    /// no value: operator Exists) or remove every toleration of KEY (KEY-) (repeatable)
    #[arg(long = "toleration", value_name = "KEY[=VALUE]:EFFECT|KEY-")]
    pub tolerations: Vec<String>,

    /// Require nodes whose label KEY is VALUE (node affinity In; values of one KEY add up)
    /// or drop the requirement on KEY (KEY-) (repeatable)
    #[arg(long = "node-affinity", value_name = "KEY=VALUE|KEY-", add = clap_complete::engine::ArgValueCompleter::new(crate::complete::node_labels))]
    pub node_affinity: Vec<String>,

    /// Spread the VM's pool over a topology: hostname, zone, region or a node label key
    /// (preferred pod anti-affinity on the kubevm.io/pool label); none removes it
    #[arg(long = "spread-by", value_name = "KEY|none")]
    pub spread_by: Option<String>,

    /// The VM's priority class
    #[arg(long, value_name = "NAME")]
    pub priority_class: Option<String>,

    /// Restart the VM when the change waits for a restart
    #[arg(long)]
    pub restart: bool,
}

pub async fn cmd(global: &GlobalArgs, args: PlacementArgs) -> CommandResult {
    let target = super::target(global, &args.common)?;
    let request = kubevm::set::placement::parse(
        &args.node_selector,
        &args.tolerations,
        &args.node_affinity,
        args.spread_by.as_deref(),
        args.priority_class.clone(),
    )?;
    super::run(global, &args.common, target, &request, args.restart).await
}
