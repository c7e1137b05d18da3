//! KubeVirt (`kubevirt.io/v1`, CDI) as data.

use super::{Capabilities, SessionArbitration, Support};
use crate::api::{DATA_VOLUME, KUBEVIRT_VM, KUBEVIRT_VMI};
use crate::flavor::Flavor;

/// What KubeVirt serves and supports.
pub const CAPABILITIES: Capabilities = Capabilities {
    flavor: Flavor::KubeVirt,
    vm: KUBEVIRT_VM,
    instance: Some(KUBEVIRT_VMI),
    disk: DATA_VOLUME,
    // `printableStatus` is what `kubectl get vm` shows (Running, Stopped, Provisioning…).
    vm_state_field: "printableStatus",
    // virt-api hands the console and VNC to the newest connection without telling the old one.
    sessions: SessionArbitration::Lease,
    vnc_screenshot: Support::Yes,
    access_credentials: Support::Yes,
    enroll: Support::Yes,
};
