//! Deckhouse's internal KubeVirt kinds, group `internal.virtualization.deckhouse.io/v1`: the
//! renamed KubeVirt VM, VMI and migration the virtualization controller drives (deckhouse
//! FACTS §7: `d8 v collect-debug-info` reads `internalvirtualizationvirtualmachines`,
//! `…instances` and `…instancemigrations`). Served without schema validation (their CRDs are
//! KubeVirt's, renamed, and not copied here).

use crate::core::registry::{ResourceDef, SchemaRef};

/// The internal kinds.
pub fn defs() -> Vec<ResourceDef> {
    [
        (
            "internalvirtualizationvirtualmachines",
            "InternalVirtualizationVirtualMachine",
        ),
        (
            "internalvirtualizationvirtualmachineinstances",
            "InternalVirtualizationVirtualMachineInstance",
        ),
        (
            "internalvirtualizationvirtualmachineinstancemigrations",
            "InternalVirtualizationVirtualMachineInstanceMigration",
        ),
    ]
    .into_iter()
    .map(|(plural, kind)| ResourceDef {
        group: "internal.virtualization.deckhouse.io".into(),
        versions: vec!["v1".into()],
        plural: plural.into(),
        singular: kind.to_ascii_lowercase(),
        kind: kind.into(),
        short_names: vec![],
        categories: vec![],
        namespaced: true,
        has_status: true,
        stored: true,
        extra_subresources: vec![],
        columns: vec![],
        schema: SchemaRef::None,
    })
    .collect()
}
