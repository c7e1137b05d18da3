//! `set placement`: where a VM may run: its node selector, tolerations and priority class
//! (KubeVirt: in `spec.template.spec`; Deckhouse: in `spec`). A running VM whose placement
//! changed is moved by a live migration on both platforms (KubeVirt under the LiveUpdate
//! rollout strategy: `pkg/virt-controller/watch/vm/vm.go`, `handleAffinityChangeRequest` and
//! `handleTolerationsChangeRequest` copy them to the VMI, whose `NodePlacementNotMatched`
//! condition the workload updater migrates; Deckhouse: "Live VM migration on a placement
//! parameter change" in its virtualization user guide). The priority class is not live on
//! either: KubeVirt sets `RestartRequired`.

use serde_json::Value;

use super::{Change, SetPlatform};
use crate::error::{Error, Result};
pub use crate::placement::{EFFECTS, MapEdit, Placement, Spread, TolerationEdit};

/// Parse `set placement`'s flags (before any request): something must change.
pub fn parse(
    node_selector: &[String],
    tolerations: &[String],
    node_affinity: &[String],
    spread_by: Option<&str>,
    priority_class: Option<String>,
) -> Result<Placement> {
    let placement = Placement::parse_flags(
        node_selector,
        tolerations,
        node_affinity,
        spread_by,
        priority_class,
    )?;
    validate(&placement)?;
    Ok(placement)
}

fn validate(placement: &Placement) -> Result<()> {
    if placement.is_empty() {
        return Err(Error::InvalidTarget(
            "nothing to change: give --node-selector, --toleration, --node-affinity, --spread-by or --priority-class".into(),
        ));
    }
    Ok(())
}

impl Change for Placement {
    fn check(&self, _platform: &dyn SetPlatform) -> Result<()> {
        validate(self)
    }

    fn apply(&self, platform: &dyn SetPlatform, vm: &mut Value) -> Result<()> {
        self.edit(&crate::platform::of(platform.flavor()).placement, vm)
    }
}
