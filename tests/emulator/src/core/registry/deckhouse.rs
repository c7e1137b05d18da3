//! Deckhouse virtualization (and storage-foundation) kinds, read from the embedded CRD files, and
//! the aggregated `subresources.virtualization.deckhouse.io` group.

use super::{AggregatedGroup, ResourceDef, crd::crd_to_def};
use serde::Deserialize;
use serde_json::Value;
use std::sync::LazyLock;

pub(super) fn aggregated() -> AggregatedGroup {
    let mut entries = vec![];
    for sub in ["console", "vnc", "portforward"] {
        entries.push((format!("virtualmachines/{sub}"), true, vec!["get"]));
    }
    for sub in ["addvolume", "removevolume", "freeze", "unfreeze"] {
        entries.push((format!("virtualmachines/{sub}"), true, vec!["update"]));
    }
    AggregatedGroup {
        group: "subresources.virtualization.deckhouse.io".into(),
        version: "v1alpha2".into(),
        entries,
    }
}

/// The embedded Deckhouse (and storage-foundation) CRD files.
pub const DECKHOUSE_CRDS: &[(&str, &str)] = &[
    (
        "virtualmachines.yaml",
        include_str!("../../../../../schemas/deckhouse/virtualmachines.yaml"),
    ),
    (
        "virtualdisks.yaml",
        include_str!("../../../../../schemas/deckhouse/virtualdisks.yaml"),
    ),
    (
        "virtualimages.yaml",
        include_str!("../../../../../schemas/deckhouse/virtualimages.yaml"),
    ),
    (
        "clustervirtualimages.yaml",
        include_str!("../../../../../schemas/deckhouse/clustervirtualimages.yaml"),
    ),
    (
        "virtualmachineclasses.yaml",
        include_str!("../../../../../schemas/deckhouse/virtualmachineclasses.yaml"),
    ),
    (
        "virtualmachineoperations.yaml",
        include_str!("../../../../../schemas/deckhouse/virtualmachineoperations.yaml"),
    ),
    (
        "virtualmachineblockdeviceattachments.yaml",
        include_str!("../../../../../schemas/deckhouse/virtualmachineblockdeviceattachments.yaml"),
    ),
    (
        "virtualdisksnapshots.yaml",
        include_str!("../../../../../schemas/deckhouse/virtualdisksnapshots.yaml"),
    ),
    (
        "virtualmachinesnapshots.yaml",
        include_str!("../../../../../schemas/deckhouse/virtualmachinesnapshots.yaml"),
    ),
    (
        "virtualmachinesnapshotoperations.yaml",
        include_str!("../../../../../schemas/deckhouse/virtualmachinesnapshotoperations.yaml"),
    ),
    (
        "virtualmachineipaddresses.yaml",
        include_str!("../../../../../schemas/deckhouse/virtualmachineipaddresses.yaml"),
    ),
    // The `sdn` module's Network and ClusterNetwork, which a VM's additional networks name
    // (the VirtualMachine CRD: "The `sdn` module is required only when additional networks
    // ... are specified"); written from its documentation (schemas/deckhouse/SOURCE.md).
    (
        "sdn-networks.yaml",
        include_str!("../../../../../schemas/deckhouse/sdn-networks.yaml"),
    ),
    (
        "dataexports.yaml",
        include_str!("../../../../../schemas/deckhouse/dataexports.yaml"),
    ),
];

/// Parsed Deckhouse CRDs as resource definitions (parsed once, on first use).
pub(super) static DECKHOUSE: LazyLock<Vec<ResourceDef>> = LazyLock::new(|| {
    DECKHOUSE_CRDS
        .iter()
        .flat_map(|(file, text)| {
            yaml_serde::Deserializer::from_str(text)
                .filter_map(|doc| {
                    let y = yaml_serde::Value::deserialize(doc).ok()?;
                    serde_json::to_value(y).ok()
                })
                .filter(|v| {
                    v.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition")
                })
                .map(|crd| {
                    crd_to_def(&crd).unwrap_or_else(|e| panic!("bad embedded CRD {file}: {e}"))
                })
                .collect::<Vec<_>>()
        })
        .collect()
});
