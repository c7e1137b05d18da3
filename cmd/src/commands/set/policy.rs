//! `kubectl vm set policy VM --run-strategy … --eviction-strategy … --label k=v …`.

use clap::Args;
use kubevm::set::policy::{MapEdit, Policy};

use super::CommonArgs;
use crate::error::CommandResult;
use crate::flags::GlobalArgs;

/// Arguments of `set policy`.
#[derive(Debug, Args)]
#[command(
    after_help = "--run-strategy: KubeVirt spec.runStrategy (Always, RerunOnFailure, Manual, Halted, Once; the\ncontroller acts on it at once: Halted stops a running VM); Deckhouse spec.runPolicy (AlwaysOn,\nAlwaysOff, Manual, AlwaysOnUnlessStoppedManually; applied at once).\n--eviction-strategy: KubeVirt spec.template.spec.evictionStrategy (None, LiveMigrate,\nLiveMigrateIfPossible, External; waits for a restart); Deckhouse spec.liveMigrationPolicy\n(AlwaysSafe, PreferSafe, AlwaysForced, PreferForced; used by the next migration).\n--grace-period: the termination grace period (both platforms: waits for a restart).\n--label/--annotation KEY=VALUE sets, KEY- removes (repeatable); on the VM itself, or with\n--template on the template the KubeVirt instance is made from (Deckhouse VMs have none).\n\nExamples:\n  kubectl vm set policy web --run-strategy Manual\n  kubectl vm set policy web --eviction-strategy LiveMigrate --restart\n  kubectl vm set policy linux-vm --run-strategy AlwaysOn --eviction-strategy AlwaysSafe\n  kubectl vm set policy web --label team=web --annotation owner- --template"
)]
pub struct PolicyArgs {
    #[command(flatten)]
    pub common: CommonArgs,

    /// KubeVirt spec.runStrategy / Deckhouse spec.runPolicy
    #[arg(long, value_name = "STRATEGY")]
    pub run_strategy: Option<String>,

    /// KubeVirt evictionStrategy / Deckhouse liveMigrationPolicy
    #[arg(long, value_name = "STRATEGY")]
    pub eviction_strategy: Option<String>,

    /// Termination grace period in seconds
    #[arg(long, value_name = "SECONDS")]
    pub grace_period: Option<i64>,

    /// Set (KEY=VALUE) or remove (KEY-) a label (repeatable)
    #[arg(long = "label", value_name = "KEY=VALUE|KEY-")]
    pub labels: Vec<String>,

    /// Set (KEY=VALUE) or remove (KEY-) an annotation (repeatable)
    #[arg(long = "annotation", value_name = "KEY=VALUE|KEY-")]
    pub annotations: Vec<String>,

    /// Edit the labels and annotations of the VM's template (KubeVirt) instead of the VM's
    #[arg(long)]
    pub template: bool,

    /// Restart the VM when the change waits for a restart
    #[arg(long)]
    pub restart: bool,
}

pub async fn cmd(global: &GlobalArgs, args: PolicyArgs) -> CommandResult {
    let target = super::target(global, &args.common)?;
    let parse = |texts: &[String], label: bool| {
        texts
            .iter()
            .map(|t| MapEdit::parse(t, label))
            .collect::<kubevm::Result<Vec<_>>>()
    };
    let request = Policy {
        run_strategy: args.run_strategy.clone(),
        eviction: args.eviction_strategy.clone(),
        grace_period: args.grace_period,
        labels: parse(&args.labels, true)?,
        annotations: parse(&args.annotations, false)?,
        template: args.template,
    };
    request.validate()?;
    super::run(global, &args.common, target, &request, args.restart).await
}
