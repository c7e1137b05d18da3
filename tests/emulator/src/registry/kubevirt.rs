//! KubeVirt and CDI kinds (described here: their CRDs are generated in Go upstream, so only the
//! swagger exists) and the aggregated `subresources.kubevirt.io` group.

use super::{AggregatedGroup, Column, ResourceDef, SchemaRef, SwaggerDoc, def};

fn swagger(doc: SwaggerDoc, definition: &'static str) -> SchemaRef {
    SchemaRef::Swagger { doc, definition }
}

pub(super) fn kinds() -> Vec<ResourceDef> {
    use SwaggerDoc::{Cdi, KubeVirt as Kv};
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
            swagger(Kv, "v1.VirtualMachine"),
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
            swagger(Kv, "v1.VirtualMachineInstance"),
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
            swagger(Kv, "v1.VirtualMachineInstanceMigration"),
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
            swagger(Kv, "v1.KubeVirt"),
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
            swagger(Kv, "v1.VirtualMachineExport"),
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
            swagger(Kv, "v1beta1.VirtualMachineSnapshot"),
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
            swagger(Kv, "v1beta1.VirtualMachineSnapshotContent"),
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
            swagger(Kv, "v1beta1.VirtualMachineInstancetype"),
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
            swagger(Kv, "v1beta1.VirtualMachineClusterInstancetype"),
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
            swagger(Kv, "v1beta1.VirtualMachinePreference"),
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
            swagger(Kv, "v1beta1.VirtualMachineClusterPreference"),
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
            swagger(Cdi, "v1beta1.DataVolume"),
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
            swagger(Cdi, "v1beta1.DataSource"),
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
            swagger(Cdi, "v1beta1.CDI"),
        ),
        // Not in the CDI swagger, so served without validation.
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
            SchemaRef::None,
        ),
    ]
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
    for sub in ["portforward", "expand-spec"] {
        entries.push((format!("virtualmachines/{sub}"), true, vec!["get"]));
    }
    AggregatedGroup {
        group: "subresources.kubevirt.io".into(),
        version: "v1".into(),
        entries,
    }
}
