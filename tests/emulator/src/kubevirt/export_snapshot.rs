//! Snapshot sources of exports.
//!
//! KubeVirt (`pkg/storage/export/export/vmsnapshot-source.go`): a VirtualMachineSnapshot source
//! needs `status.readyToUse` and `status.virtualMachineSnapshotContentName`; for every
//! `spec.volumeBackups[]` of that VirtualMachineSnapshotContent the controller creates a
//! restore PVC `<export>-<pvc>` from the backup's VolumeSnapshot, owned (controller) by the
//! export, and the link's volume name is that PVC name without the `<export>-` prefix
//! (`getSnapshotVolumeName`), i.e. the source PVC's name. A missing snapshot is
//! `VMSnapshotNotFound`; a snapshot that is not ready "does not contain any volume snapshots".
//!
//! Deckhouse (FACTS deckhouse §13): a DataExport may target a `VirtualDiskSnapshot`; it exports
//! the snapshot's data whoever uses the disk. The emulator's snapshot data is the disk's
//! generated content (a restore PVC carries the annotation [`CONTENT_OF`] naming its source).

use crate::core::app::App;
use crate::core::controllers::owner_ref;
use crate::core::store::Key;
use crate::core::util::meta_str;
use serde_json::{Value, json};

/// Group of KubeVirt's snapshot kinds.
pub const SNAPSHOT_GROUP: &str = "snapshot.kubevirt.io";
/// Annotation of the emulator on a restore PVC: the PVC whose content it holds.
pub const CONTENT_OF: &str = "emulator.kubevm.io/content-of";

/// The volume names of a VirtualMachineSnapshot export, creating its restore PVCs; or the
/// reason and message the export waits with.
pub fn restore_pvcs(
    app: &App,
    vme: &Value,
    source: &str,
) -> Result<Vec<String>, (&'static str, String)> {
    let ns = meta_str(vme, "namespace");
    let export = meta_str(vme, "name");
    let snapshot = app
        .store
        .get(&Key::new(
            SNAPSHOT_GROUP,
            "virtualmachinesnapshots",
            ns,
            source,
        ))
        .ok_or_else(|| {
            (
                "VMSnapshotNotFound",
                format!("VirtualMachineSnapshot {ns}/{source} not found"),
            )
        })?;
    let empty = || {
        (
            "NotAllPVCsCreated",
            format!("VirtualMachineSnapshot {ns}/{source} does not contain any volume snapshots"),
        )
    };
    if snapshot.pointer("/status/readyToUse") != Some(&json!(true)) {
        return Err(empty());
    }
    let content_name = snapshot
        .pointer("/status/virtualMachineSnapshotContentName")
        .and_then(Value::as_str)
        .ok_or_else(empty)?;
    let content = app
        .store
        .get(&Key::new(
            SNAPSHOT_GROUP,
            "virtualmachinesnapshotcontents",
            ns,
            content_name,
        ))
        .ok_or_else(empty)?;
    let backups = content
        .pointer("/spec/volumeBackups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if backups.is_empty() {
        return Err(("VMSnapshotNoVolumes", empty().1));
    }
    let mut names = vec![];
    for backup in &backups {
        let pvc = backup
            .pointer("/persistentVolumeClaim/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if backup
            .get("volumeSnapshotName")
            .and_then(Value::as_str)
            .is_none()
            || pvc.is_empty()
        {
            return Err(("NotAllPVCsCreated", "missing VolumeSnapshot name".into()));
        }
        let restore = format!("{export}-{pvc}");
        if app
            .store
            .get(&Key::new("", "persistentvolumeclaims", ns, &restore))
            .is_none()
        {
            let size = backup
                .pointer("/persistentVolumeClaim/spec/resources/requests/storage")
                .cloned()
                .unwrap_or(json!("0"));
            let owner_key = Key::of(
                crate::kubevirt::export::KV_EXPORT_GROUP,
                "virtualmachineexports",
                vme,
            );
            crate::core::gc::create_dependent(
                app,
                &owner_key,
                vme,
                "",
                "persistentvolumeclaims",
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": restore, "namespace": ns,
                        "annotations": {CONTENT_OF: pvc},
                        "ownerReferences": [owner_ref(vme)]},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}},
                        "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                            "name": backup["volumeSnapshotName"]}},
                    "status": {"phase": "Bound", "capacity": {"storage": size}}}),
            );
        }
        names.push(pvc.to_string());
    }
    Ok(names)
}

/// The VM a VirtualMachineSnapshot was taken of (`status.virtualMachineName` of its export).
pub fn snapshot_vm_name(app: &App, ns: &str, snapshot: &str) -> Option<String> {
    app.store
        .get(&Key::new(
            SNAPSHOT_GROUP,
            "virtualmachinesnapshots",
            ns,
            snapshot,
        ))?
        .pointer("/spec/source/name")
        .and_then(Value::as_str)
        .map(String::from)
}

/// The PVC holding a ready VirtualDiskSnapshot's data (its disk's).
pub fn vds_pvc(app: &App, ns: &str, name: &str) -> Result<String, String> {
    let vds = app
        .store
        .get(&Key::new(
            "virtualization.deckhouse.io",
            "virtualdisksnapshots",
            ns,
            name,
        ))
        .ok_or_else(|| format!("VirtualDiskSnapshot {name} not found"))?;
    if vds.pointer("/status/phase").and_then(Value::as_str) != Some("Ready") {
        return Err(format!("VirtualDiskSnapshot {name} is not ready"));
    }
    let disk = vds
        .pointer("/spec/virtualDiskName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    app.store
        .get(&Key::new(
            "virtualization.deckhouse.io",
            "virtualdisks",
            ns,
            disk,
        ))
        .and_then(|vd| {
            vd.pointer("/status/target/persistentVolumeClaimName")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .ok_or_else(|| format!("the disk {disk} of VirtualDiskSnapshot {name} has no PVC"))
}

/// The PVC whose content `ns/pvc` holds (itself unless it is a restore PVC).
pub fn content_pvc(app: &App, ns: &str, pvc: &str) -> String {
    app.store
        .get(&Key::new("", "persistentvolumeclaims", ns, pvc))
        .and_then(|p| {
            p.pointer("/metadata/annotations")
                .and_then(|a| a.get(CONTENT_OF))
                .and_then(Value::as_str)
                .map(String::from)
        })
        .unwrap_or_else(|| pvc.to_string())
}
