//! Deckhouse: the VM's virt-launcher pod carries
//! `vm.kubevirt.internal.virtualization.deckhouse.io/name: <VM name>` (the label
//! `d8 v collect-debug-info` selects launcher pods by, FACTS §8); VM names are unique in a
//! namespace, so the selector matches this VM only.

use serde_json::{Value, json};

/// The pod label Deckhouse's renamed KubeVirt sets to the VM's name.
pub const VM_NAME_LABEL: &str = "vm.kubevirt.internal.virtualization.deckhouse.io/name";

/// The Service selector for `vm`.
pub fn selector(vm: &Value) -> Value {
    json!({ VM_NAME_LABEL: vm["metadata"]["name"] })
}
