//! `create`'s placement flags (`--node-selector`, `--toleration`, `--node-affinity`,
//! `--spread-by`, `--priority-class`): the additions `set placement` can also make later.

use clap::Args;
use kubevm::placement::Placement;

use crate::error::CommandResult;

/// Where the new VM may run.
#[derive(Debug, Args, Default, Clone)]
pub struct PlacementFlags {
    /// Run only on nodes with label KEY=VALUE (node selector; repeatable)
    #[arg(
        long = "node-selector",
        value_name = "KEY=VALUE",
        add = clap_complete::engine::ArgValueCompleter::new(crate::complete::node_labels),
        help_heading = "Placement"
    )]
    pub node_selector: Vec<String>,
    /// Tolerate taint KEY[=VALUE]:EFFECT (NoSchedule, PreferNoSchedule, NoExecute; repeatable)
    #[arg(
        long = "toleration",
        value_name = "KEY[=VALUE]:EFFECT",
        help_heading = "Placement"
    )]
    pub tolerations: Vec<String>,
    /// Require nodes whose label KEY is VALUE (node affinity In; values of one KEY add up; repeatable)
    #[arg(
        long = "node-affinity",
        value_name = "KEY=VALUE",
        add = clap_complete::engine::ArgValueCompleter::new(crate::complete::node_labels),
        help_heading = "Placement"
    )]
    pub node_affinity: Vec<String>,
    /// Spread the replicas of --replicas over hostname, zone, region or a node label key (preferred anti-affinity)
    #[arg(long = "spread-by", value_name = "KEY", help_heading = "Placement")]
    pub spread_by: Option<String>,
    /// The VM's priority class
    #[arg(long, value_name = "NAME", help_heading = "Placement")]
    pub priority_class: Option<String>,
}

impl PlacementFlags {
    /// The placement the flags ask for, checked before any request.
    pub fn parse(&self) -> CommandResult<Placement> {
        let placement = Placement::parse_flags(
            &self.node_selector,
            &self.tolerations,
            &self.node_affinity,
            self.spread_by.as_deref(),
            self.priority_class.clone(),
        )?;
        placement.refuse_removals()?;
        Ok(placement)
    }
}
