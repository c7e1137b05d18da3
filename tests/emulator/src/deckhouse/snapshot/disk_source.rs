//! A VirtualDisk made from a VirtualDiskSnapshot (`spec.dataSource.objectRef`), as deckhouse/
//! virtualization @ cf3a9e6c `pkg/controller/vd/internal/source/step/
//! create_pvc_from_vdsnapshot_step.go` makes its claim, and the bytes the emulator gives it
//! (kept by [`crate::kubevirt::vm_snapshot::capture`], given by
//! [`crate::kubevirt::vm_snapshot::materialize`]).

use serde_json::{Value, json};

use super::{CLASS, DATA_ID, DH, SIZE, VD_SNAPSHOTS, text};
use crate::core::app::App;
use crate::core::store::Key;
use crate::core::util::meta_str;
use crate::kubevirt::export_snapshot::CONTENT_OF;

/// On a claim made from a snapshot: the data it was given, so it is given only once.
const RESTORED_FROM: &str = "emulator.kubevm.io/restored-from";

/// For a VirtualDisk made from a VirtualDiskSnapshot (`dataSource.objectRef`), what its
/// claim is made with, as deckhouse/virtualization `pkg/controller/vd/internal/source/step/
/// create_pvc_from_vdsnapshot_step.go` decides: `Err(message)` while the snapshot is missing
/// ("VirtualDiskSnapshot %q not found.") or not Ready ("VirtualDiskSnapshot %q is not ready to
/// use."): the disk stays `Pending`, condition `Ready` False `ProvisioningNotStarted`;
/// otherwise `(size, class)`: the size asked for, at least the snapshot's (`getPVCSize`: the
/// original disk's size, the restore size a floor), else the snapshot's; the class asked for,
/// else the snapshot's disk's (`storageClassName`). `None` for any other disk, and for a
/// Deckhouse clone's disk made here (it names the snapshot upstream's clone would take, which
/// the emulator does not make: its claim gets the live disk's bytes, `CONTENT_OF`).
pub fn from_snapshot(app: &App, vd: &Value) -> Option<Result<(String, Option<String>), String>> {
    if text(vd, "/spec/dataSource/objectRef/kind") != "VirtualDiskSnapshot"
        || vd
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(CONTENT_OF))
            .is_some()
    {
        return None;
    }
    let name = text(vd, "/spec/dataSource/objectRef/name");
    let Some(vds) = app
        .store
        .get(&Key::new(DH, VD_SNAPSHOTS, meta_str(vd, "namespace"), name))
    else {
        return Some(Err(format!("VirtualDiskSnapshot {name:?} not found.")));
    };
    if text(&vds, "/status/phase") != "Ready" {
        return Some(Err(format!(
            "VirtualDiskSnapshot {name:?} is not ready to use."
        )));
    }
    let annotations = &vds["metadata"]["annotations"];
    let kept = annotations[SIZE].as_str().map(str::to_owned);
    let asked = vd
        .pointer("/spec/persistentVolumeClaim/size")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let size = match (asked, kept) {
        (Some(a), Some(k)) => {
            if crate::kubevirt::export::parse_bytes(&a) < crate::kubevirt::export::parse_bytes(&k) {
                k
            } else {
                a
            }
        }
        (Some(a), None) => a,
        (None, Some(k)) => k,
        (None, None) => "10Gi".into(),
    };
    let class = vd
        .pointer("/spec/persistentVolumeClaim/storageClassName")
        .and_then(Value::as_str)
        .or_else(|| annotations[CLASS].as_str())
        .map(str::to_owned);
    Some(Ok((size, class)))
}

/// Called by the VirtualDisk controller once the claim of a disk exists: a disk made from a
/// VirtualDiskSnapshot (made here) gets the snapshot's bytes, once.
pub fn disk_data(app: &App, vd: &Value, pvc: &str) {
    if text(vd, "/spec/dataSource/objectRef/kind") != "VirtualDiskSnapshot" {
        return;
    }
    let ns = meta_str(vd, "namespace");
    let Some(vds) = app.store.get(&Key::new(
        DH,
        VD_SNAPSHOTS,
        ns,
        text(vd, "/spec/dataSource/objectRef/name"),
    )) else {
        return;
    };
    let annotations = &vds["metadata"]["annotations"];
    let (Some(id), Some(source)) = (
        annotations[DATA_ID].as_str(),
        annotations[CONTENT_OF].as_str(),
    ) else {
        return;
    };
    let key = Key::new("", "persistentvolumeclaims", ns, pvc);
    let Some(claim) = app.store.get(&key) else {
        return;
    };
    if claim
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(RESTORED_FROM))
        .is_some()
    {
        return;
    }
    app.store.modify(&key, |o| {
        o["metadata"]["annotations"][CONTENT_OF] = json!(source);
        o["metadata"]["annotations"][RESTORED_FROM] = json!(id);
    });
    crate::kubevirt::vm_snapshot::materialize(app, ns, pvc, id);
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::{VM_SNAPSHOTS, kept_vm};
    use super::*;
    use crate::core::controllers::reconcile_all;

    /// A VirtualDisk `spec.dataSource.objectRef` VirtualDiskSnapshot, as `restore --new-vm`
    /// makes one (no size, no class): `Pending` ("… not found.", `ProvisioningNotStarted`)
    /// while the snapshot is missing, then a claim of the snapshot's disk's size and class
    /// holding the snapshot's bytes (`create_pvc_from_vdsnapshot_step.go`).
    #[test]
    fn a_disk_from_a_disk_snapshot_waits_for_it_and_gets_its_size_class_and_bytes() {
        let app = app();
        vm(&app, "AlwaysOff");
        let source = claim(&app);
        crate::kubevirt::vm_snapshot::write_volume(&app, "default", &source, b"kept").unwrap();
        // The emulator's own state on the VM (as `stop` leaves it) is not kept with its spec.
        app.store
            .modify(&Key::new(DH, "virtualmachines", "default", "web"), |o| {
                o["metadata"]["annotations"]["emulator.kubevm.io/power"] = json!("off")
            });
        let snap = snapshot(&app, "s1", "web");
        let vds = format!("web-root-{}", meta_str(&snap, "uid"));
        app.store
            .create(
                DH,
                "virtualdisks",
                json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                "kind": "VirtualDisk", "metadata": {"name": "copy-root", "namespace": "default"},
                "spec": {"dataSource": {"type": "ObjectRef",
                    "objectRef": {"kind": "VirtualDiskSnapshot", "name": vds}}}}),
            )
            .unwrap();
        // One pass: the snapshot is only Pending, its disk snapshot not made yet.
        reconcile_all(&app, true);
        assert!(get(&app, VD_SNAPSHOTS, &vds).is_none());
        let copy = get(&app, "virtualdisks", "copy-root").unwrap();
        let c = copy["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(copy["status"]["phase"], "Pending");
        assert_eq!(c["reason"], "ProvisioningNotStarted");
        assert_eq!(
            c["message"],
            format!("VirtualDiskSnapshot {vds:?} not found.")
        );
        assert!(copy["status"].get("target").is_none(), "{copy}");
        for _ in 0..20 {
            reconcile_all(&app, true);
        }
        let copy = get(&app, "virtualdisks", "copy-root").unwrap();
        assert_eq!(copy["status"]["phase"], "Ready", "{copy}");
        let pvc = text(&copy, "/status/target/persistentVolumeClaimName").to_owned();
        let claim = get(&app, "persistentvolumeclaims", &pvc).unwrap();
        let original = get(&app, "persistentvolumeclaims", &source).unwrap();
        assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1Mi");
        assert_eq!(
            claim["spec"]["storageClassName"],
            original["spec"]["storageClassName"]
        );
        assert_eq!(data(&app, &pvc), b"kept");
        let s = get(&app, VM_SNAPSHOTS, "s1").unwrap();
        let kept = kept_vm(&app, "default", &s).unwrap();
        assert_eq!(kept["metadata"]["name"], "web");
        assert!(
            kept["metadata"]["annotations"]
                .as_object()
                .into_iter()
                .flatten()
                .all(|(k, _)| !k.starts_with("emulator.kubevm.io/")),
            "{kept}"
        );
    }
}
