//! KubeVirt and CDI kinds (names, versions and columns described here; schemas from the CRDs
//! the operators install, embedded from the repository's `schemas/crds/`) and the aggregated
//! `subresources.kubevirt.io` group.

use super::{AggregatedGroup, Column, EmbeddedCrd, ResourceDef, SchemaRef, def};

macro_rules! embedded {
    ($name:ident, $dir:literal, $file:literal) => {
        static $name: EmbeddedCrd = EmbeddedCrd::new(
            $file,
            include_str!(concat!("../../../../../schemas/crds/", $dir, "/", $file)),
        );
    };
}

embedded!(VM, "kubevirt", "virtualmachines.kubevirt.io.yaml");
embedded!(VMI, "kubevirt", "virtualmachineinstances.kubevirt.io.yaml");
embedded!(
    VMIM,
    "kubevirt",
    "virtualmachineinstancemigrations.kubevirt.io.yaml"
);
embedded!(KUBEVIRT, "kubevirt", "kubevirts.kubevirt.io.yaml");
embedded!(
    VMEXPORT,
    "kubevirt",
    "virtualmachineexports.export.kubevirt.io.yaml"
);
embedded!(
    VMSNAPSHOT,
    "kubevirt",
    "virtualmachinesnapshots.snapshot.kubevirt.io.yaml"
);
embedded!(
    VMSNAPSHOTCONTENT,
    "kubevirt",
    "virtualmachinesnapshotcontents.snapshot.kubevirt.io.yaml"
);
embedded!(
    VMRESTORE,
    "kubevirt",
    "virtualmachinerestores.snapshot.kubevirt.io.yaml"
);
embedded!(
    VMCLONE,
    "kubevirt",
    "virtualmachineclones.clone.kubevirt.io.yaml"
);
embedded!(
    INSTANCETYPE,
    "kubevirt",
    "virtualmachineinstancetypes.instancetype.kubevirt.io.yaml"
);
embedded!(
    CLUSTERINSTANCETYPE,
    "kubevirt",
    "virtualmachineclusterinstancetypes.instancetype.kubevirt.io.yaml"
);
embedded!(
    PREFERENCE,
    "kubevirt",
    "virtualmachinepreferences.instancetype.kubevirt.io.yaml"
);
embedded!(
    CLUSTERPREFERENCE,
    "kubevirt",
    "virtualmachineclusterpreferences.instancetype.kubevirt.io.yaml"
);
embedded!(
    VMPOOL,
    "kubevirt",
    "virtualmachinepools.pool.kubevirt.io.yaml"
);
embedded!(DATAVOLUME, "cdi", "datavolumes.cdi.kubevirt.io.yaml");
embedded!(DATASOURCE, "cdi", "datasources.cdi.kubevirt.io.yaml");
embedded!(
    DATAIMPORTCRON,
    "cdi",
    "dataimportcrons.cdi.kubevirt.io.yaml"
);
embedded!(CDI, "cdi", "cdis.cdi.kubevirt.io.yaml");
embedded!(
    NAD,
    "multus",
    "network-attachment-definitions.k8s.cni.cncf.io.yaml"
);
embedded!(CDICONFIG, "cdi", "cdiconfigs.cdi.kubevirt.io.yaml");
embedded!(
    STORAGEPROFILE,
    "cdi",
    "storageprofiles.cdi.kubevirt.io.yaml"
);

pub(super) fn kinds() -> Vec<ResourceDef> {
    let c = Column::new;
    let age = Column::age;
    let ready = |t: &str| format!(".status.conditions[?(@.type=='{t}')].status");
    vec![
        def(
            "kubevirt.io",
            &["v1"],
            "virtualmachines",
            "VirtualMachine",
            &["vm", "vms"],
            &["all"],
            true,
            true,
            vec![
                age(),
                c("Status", "string", ".status.printableStatus"),
                c("Ready", "string", &ready("Ready")),
            ],
            SchemaRef::Embedded(&VM),
        ),
        def(
            "kubevirt.io",
            &["v1"],
            "virtualmachineinstances",
            "VirtualMachineInstance",
            &["vmi", "vmis"],
            &["all"],
            true,
            true,
            vec![
                age(),
                c("Phase", "string", ".status.phase"),
                c("IP", "string", ".status.interfaces[0].ipAddress"),
                c("NodeName", "string", ".status.nodeName"),
                c("Ready", "string", &ready("Ready")),
                c("Live-Migratable", "string", &ready("LiveMigratable")).wide(),
                c("Paused", "string", &ready("Paused")).wide(),
            ],
            SchemaRef::Embedded(&VMI),
        ),
        def(
            "kubevirt.io",
            &["v1"],
            "virtualmachineinstancemigrations",
            "VirtualMachineInstanceMigration",
            &["vmim", "vmims"],
            &["all"],
            true,
            true,
            vec![
                c("Phase", "string", ".status.phase"),
                c("VMI", "string", ".spec.vmiName"),
            ],
            SchemaRef::Embedded(&VMIM),
        ),
        // Multus, which KubeVirt's secondary networks need (network.rs).
        def(
            "k8s.cni.cncf.io",
            &["v1"],
            "network-attachment-definitions",
            "NetworkAttachmentDefinition",
            &["net-attach-def"],
            &[],
            true,
            false,
            vec![age()],
            SchemaRef::Embedded(&NAD),
        ),
        def(
            "kubevirt.io",
            &["v1"],
            "kubevirts",
            "KubeVirt",
            &["kv", "kvs"],
            &["all"],
            true,
            true,
            vec![age(), c("Phase", "string", ".status.phase")],
            SchemaRef::Embedded(&KUBEVIRT),
        ),
        def(
            "export.kubevirt.io",
            &["v1", "v1beta1"],
            "virtualmachineexports",
            "VirtualMachineExport",
            &["vmexport", "vmexports"],
            &["all"],
            true,
            true,
            vec![
                c("SourceKind", "string", ".spec.source.kind"),
                c("SourceName", "string", ".spec.source.name"),
                c("Phase", "string", ".status.phase"),
            ],
            SchemaRef::Embedded(&VMEXPORT),
        ),
        def(
            "snapshot.kubevirt.io",
            &["v1beta1"],
            "virtualmachinesnapshots",
            "VirtualMachineSnapshot",
            &["vmsnapshot", "vmsnapshots"],
            &["all"],
            true,
            true,
            vec![
                age(),
                c("SourceKind", "string", ".spec.source.kind"),
                c("SourceName", "string", ".spec.source.name"),
                c("Phase", "string", ".status.phase"),
                c("ReadyToUse", "boolean", ".status.readyToUse"),
            ],
            SchemaRef::Embedded(&VMSNAPSHOT),
        ),
        def(
            "snapshot.kubevirt.io",
            &["v1beta1"],
            "virtualmachinesnapshotcontents",
            "VirtualMachineSnapshotContent",
            &["vmsnapshotcontent", "vmsnapshotcontents"],
            &["all"],
            true,
            true,
            vec![age(), c("ReadyToUse", "boolean", ".status.readyToUse")],
            SchemaRef::Embedded(&VMSNAPSHOTCONTENT),
        ),
        def(
            "snapshot.kubevirt.io",
            &["v1beta1"],
            "virtualmachinerestores",
            "VirtualMachineRestore",
            &["vmrestore", "vmrestores"],
            &["all"],
            true,
            true,
            vec![
                c("TargetKind", "string", ".spec.target.kind"),
                c("TargetName", "string", ".spec.target.name"),
                c("Complete", "boolean", ".status.complete"),
                c("RestoreTime", "date", ".status.restoreTime"),
                age(),
            ],
            SchemaRef::Embedded(&VMRESTORE),
        ),
        def(
            "clone.kubevirt.io",
            &["v1beta1", "v1alpha1"],
            "virtualmachineclones",
            "VirtualMachineClone",
            &["vmclone", "vmclones"],
            &["all"],
            true,
            true,
            vec![
                c("Phase", "string", ".status.phase"),
                c("SourceVirtualMachine", "string", ".spec.source.name"),
                c("TargetVirtualMachine", "string", ".spec.target.name"),
            ],
            SchemaRef::Embedded(&VMCLONE),
        ),
        def(
            "instancetype.kubevirt.io",
            &["v1beta1"],
            "virtualmachineinstancetypes",
            "VirtualMachineInstancetype",
            &["vminstancetype", "vminstancetypes", "vmf", "vmfs"],
            &[],
            true,
            false,
            vec![age()],
            SchemaRef::Embedded(&INSTANCETYPE),
        ),
        def(
            "instancetype.kubevirt.io",
            &["v1beta1"],
            "virtualmachineclusterinstancetypes",
            "VirtualMachineClusterInstancetype",
            &[
                "vmclusterinstancetype",
                "vmclusterinstancetypes",
                "vmcf",
                "vmcfs",
            ],
            &[],
            false,
            false,
            vec![age()],
            SchemaRef::Embedded(&CLUSTERINSTANCETYPE),
        ),
        def(
            "instancetype.kubevirt.io",
            &["v1beta1"],
            "virtualmachinepreferences",
            "VirtualMachinePreference",
            &["vmpref", "vmprefs", "vmp", "vmps"],
            &[],
            true,
            false,
            vec![age()],
            SchemaRef::Embedded(&PREFERENCE),
        ),
        def(
            "instancetype.kubevirt.io",
            &["v1beta1"],
            "virtualmachineclusterpreferences",
            "VirtualMachineClusterPreference",
            &["vmcp", "vmcps"],
            &[],
            false,
            false,
            vec![age()],
            SchemaRef::Embedded(&CLUSTERPREFERENCE),
        ),
        def(
            "pool.kubevirt.io",
            &["v1beta1", "v1alpha1"],
            "virtualmachinepools",
            "VirtualMachinePool",
            &["vmpool", "vmpools"],
            &["all"],
            true,
            true,
            vec![
                c("Desired", "integer", ".spec.replicas"),
                c("Current", "integer", ".status.replicas"),
                c("Ready", "integer", ".status.readyReplicas"),
                age(),
            ],
            SchemaRef::Embedded(&VMPOOL),
        ),
        def(
            "cdi.kubevirt.io",
            &["v1beta1"],
            "datavolumes",
            "DataVolume",
            &["dv", "dvs"],
            &["all"],
            true,
            true,
            vec![
                c("Phase", "string", ".status.phase"),
                c("Progress", "string", ".status.progress"),
                c("Restarts", "integer", ".status.restartCount"),
                age(),
            ],
            SchemaRef::Embedded(&DATAVOLUME),
        ),
        def(
            "cdi.kubevirt.io",
            &["v1beta1"],
            "datasources",
            "DataSource",
            &["das"],
            &["all"],
            true,
            true,
            vec![age()],
            SchemaRef::Embedded(&DATASOURCE),
        ),
        def(
            "cdi.kubevirt.io",
            &["v1beta1"],
            "dataimportcrons",
            "DataImportCron",
            &["dic", "dics"],
            &["all"],
            true,
            true,
            vec![c("Format", "string", ".status.sourceFormat"), age()],
            SchemaRef::Embedded(&DATAIMPORTCRON),
        ),
        def(
            "cdi.kubevirt.io",
            &["v1beta1"],
            "cdis",
            "CDI",
            &["cdi", "cdis"],
            &[],
            false,
            true,
            vec![age(), c("Phase", "string", ".status.phase")],
            SchemaRef::Embedded(&CDI),
        ),
        def(
            "cdi.kubevirt.io",
            &["v1beta1"],
            "storageprofiles",
            "StorageProfile",
            &[],
            &[],
            false,
            true,
            vec![age()],
            SchemaRef::Embedded(&STORAGEPROFILE),
        ),
        def(
            "cdi.kubevirt.io",
            &["v1beta1"],
            "cdiconfigs",
            "CDIConfig",
            &[],
            &[],
            false,
            true,
            vec![age()],
            SchemaRef::Embedded(&CDICONFIG),
        ),
        upload_token_requests(),
    ]
}

/// CDI's `upload.cdi.kubevirt.io` UploadTokenRequest: create-only, answered, never stored
/// (CDI's apiserver, `pkg/apiserver/apiserver.go`).
fn upload_token_requests() -> ResourceDef {
    let mut d = def(
        crate::kubevirt::upload::UPLOAD_GROUP,
        &["v1beta1"],
        "uploadtokenrequests",
        "UploadTokenRequest",
        &[],
        &[],
        true,
        true,
        vec![],
        SchemaRef::None,
    );
    d.stored = false;
    d
}

pub(super) fn aggregated() -> AggregatedGroup {
    let mut entries = vec![];
    for sub in [
        "console",
        "vnc",
        "portforward",
        "usbredir",
        "vsock",
        "guestosinfo",
        "userlist",
        "filesystemlist",
    ] {
        entries.push((format!("virtualmachineinstances/{sub}"), true, vec!["get"]));
    }
    for sub in [
        "pause",
        "unpause",
        "freeze",
        "unfreeze",
        "softreboot",
        "reset",
        "addvolume",
        "removevolume",
    ] {
        entries.push((
            format!("virtualmachineinstances/{sub}"),
            true,
            vec!["update"],
        ));
    }
    for sub in [
        "start",
        "stop",
        "restart",
        "migrate",
        "addvolume",
        "removevolume",
        "memorydump",
    ] {
        entries.push((format!("virtualmachines/{sub}"), true, vec!["update"]));
    }
    // pkg/virt-api/api.go: discovery names the two-segment subresource as it is routed.
    for plural in ["virtualmachines", "virtualmachineinstances"] {
        entries.push((format!("{plural}/evacuate/cancel"), true, vec!["update"]));
    }
    for sub in ["portforward", "expand-spec"] {
        entries.push((format!("virtualmachines/{sub}"), true, vec!["get"]));
    }
    AggregatedGroup {
        group: "subresources.kubevirt.io".into(),
        version: "v1".into(),
        entries,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// Names, scope and versions described here agree with the operators' CRDs.
    #[test]
    fn kinds_agree_with_their_crds() {
        for def in kinds() {
            // CDI serves UploadTokenRequest from its own apiserver: no CRD, nothing stored.
            if !def.stored {
                assert!(matches!(def.schema, SchemaRef::None), "{}", def.kind);
                continue;
            }
            let SchemaRef::Embedded(e) = &def.schema else {
                panic!("{} has no CRD", def.kind)
            };
            let crd = e.crd();
            let spec = &crd["spec"];
            assert_eq!(spec["group"], def.group.as_str(), "{}", e.file);
            assert_eq!(spec["names"]["kind"], def.kind.as_str(), "{}", e.file);
            assert_eq!(spec["names"]["plural"], def.plural.as_str(), "{}", e.file);
            assert_eq!(spec["scope"] == "Namespaced", def.namespaced, "{}", e.file);
            let short: Vec<&str> = spec["names"]["shortNames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            assert_eq!(short, def.short_names, "{}", e.file);
            for v in &def.versions {
                assert!(
                    def.schema.for_version(v).is_some(),
                    "{} does not define {v}",
                    e.file
                );
            }
        }
    }
}
