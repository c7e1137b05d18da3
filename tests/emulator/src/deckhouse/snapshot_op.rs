//! Deckhouse VirtualMachineSnapshotOperation `CreateVirtualMachine` (deckhouse/virtualization
//! `pkg/controller/vmsop/internal/handler/lifecycle.go`, `internal/operation/
//! create_virtual_machine.go`): a new VM made from a VirtualMachineSnapshot. Pending (Completed
//! condition Unknown), then in one pass: the snapshot must exist ("The VirtualMachineSnapshot %q
//! was not found.", reason `VirtualMachineSnapshotNotFound`) and be Ready ("... is not ready
//! yet.", `NotReadyToBeExecuted`); the VM kept in the snapshot's Secret is renamed by
//! `createVirtualMachine.nameReplacement`, then `customization`, validated (a taken name fails
//! the operation with `<Type> is failed: ...`, nothing created, `status.resources` says why)
//! and created with its disks made from the snapshot's VirtualDiskSnapshots (the clone
//! restorer, [`crate::kubevirt::clone::deckhouse_from_snapshot`]). DryRun validates only. Completed:
//! reason `OperationCompleted`, "VirtualMachineSnapshotOperation completed". Upstream a failed
//! pre-check is evaluated again on the next reconcile; here a Failed operation stays failed.

use serde_json::{Value, json};

use crate::core::app::App;
use crate::core::controllers::set_condition;
use crate::core::store::Key;
use crate::core::util::meta_str;

const DH: &str = "virtualization.deckhouse.io";
/// Plural of VirtualMachineSnapshotOperation.
pub const VMSOPS: &str = "virtualmachinesnapshotoperations";

fn finish(app: &App, op: &Value, phase: &str, state: bool, reason: &str, message: &str) {
    app.store.modify(&Key::of(DH, VMSOPS, op), |o| {
        let mut st = o["status"].clone();
        if !st.is_object() {
            st = json!({});
        }
        st["phase"] = json!(phase);
        st["observedGeneration"] = o["metadata"]["generation"].clone();
        set_condition(&mut st, "Completed", state, reason, message);
        if phase == "Pending" {
            // conditions.ReasonUnknown with status Unknown.
            if let Some(c) = st["conditions"]
                .as_array_mut()
                .and_then(|c| c.iter_mut().find(|c| c["type"] == "Completed"))
            {
                c["status"] = json!("Unknown");
            }
        }
        o["status"] = st;
    });
}

/// The VirtualMachineSnapshotOperation controller (see the module documentation).
pub fn vmsop(app: &App, op: &Value, _tick: bool) {
    if op.pointer("/metadata/deletionTimestamp").is_some() {
        return;
    }
    let phase = op
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    match phase {
        "" => return finish(app, op, "Pending", false, "Unknown", ""),
        "Pending" => {}
        _ => return,
    }
    let fail = |reason: &str, message: String| finish(app, op, "Failed", false, reason, &message);
    let spec = &op["spec"]["createVirtualMachine"];
    if !spec.is_object() {
        return fail(
            "OperationFailed",
            "Cannot start the clone: no parameters for the new virtual machine are specified."
                .into(),
        );
    }
    let ns = meta_str(op, "namespace");
    let snap_name = op
        .pointer("/spec/virtualMachineSnapshotName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let Some(snap) = app.store.get(&Key::new(
        DH,
        crate::deckhouse::snapshot::VM_SNAPSHOTS,
        ns,
        snap_name,
    )) else {
        return fail(
            "VirtualMachineSnapshotNotFound",
            format!("The VirtualMachineSnapshot {snap_name:?} was not found."),
        );
    };
    if snap.pointer("/status/phase").and_then(Value::as_str) != Some("Ready") {
        return fail(
            "NotReadyToBeExecuted",
            format!("The VirtualMachineSnapshot {snap_name:?} is not ready yet."),
        );
    }
    let Some(mut kept) = crate::deckhouse::snapshot::kept_vm(app, ns, &snap) else {
        return fail(
            "NotReadyToBeExecuted",
            "The VirtualMachineSnapshot is not ready to be used yet.".into(),
        );
    };
    kept["apiVersion"] = json!("virtualization.deckhouse.io/v1alpha2");
    kept["metadata"]["namespace"] = json!(ns);
    let provisioner = crate::deckhouse::snapshot::kept_provisioner(app, ns, &snap);
    match crate::kubevirt::clone::deckhouse_from_snapshot(
        app,
        op,
        &kept,
        meta_str(&snap, "uid"),
        &provisioner,
    ) {
        Ok(_) => {
            let mut msg = "VirtualMachineSnapshotOperation completed".to_string();
            if spec["mode"] == "DryRun" {
                msg += ". The virtual machine can be cloned from the snapshot";
            }
            finish(app, op, "Completed", true, "OperationCompleted", &msg);
        }
        Err((resources, message)) => {
            app.store.modify(&Key::of(DH, VMSOPS, op), |o| {
                o["status"]["resources"] = resources;
            });
            let op = app
                .store
                .get(&Key::of(DH, VMSOPS, op))
                .unwrap_or(op.clone());
            finish(app, &op, "Failed", false, "OperationFailed", &message);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::controllers::reconcile_all;

    fn app() -> App {
        let app = App::new(
            crate::core::registry::Registry::new(crate::ServeFlavor::Deckhouse),
            std::time::Duration::from_secs(1),
        );
        crate::kubevirt::vm_snapshot::snapshot_storage(&app);
        app
    }

    fn ticks(app: &App, n: usize) {
        for _ in 0..n {
            reconcile_all(app, true);
        }
    }

    fn get(app: &App, plural: &str, name: &str) -> Option<Value> {
        let group = if plural == "persistentvolumeclaims" {
            ""
        } else {
            DH
        };
        app.store.get(&Key::new(group, plural, "default", name))
    }

    fn create(app: &App, plural: &str, obj: Value) {
        app.store.create(DH, plural, obj).unwrap();
    }

    fn claim(app: &App, disk: &str) -> String {
        get(app, "virtualdisks", disk).unwrap()["status"]["target"]["persistentVolumeClaimName"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    fn data(app: &App, pvc: &str) -> Vec<u8> {
        std::fs::read(crate::kubevirt::upload::uploaded_file(app, "default", pvc).unwrap()).unwrap()
    }

    /// A stopped VM `web` with disk `web-root` holding "before" in snapshot `s1`, then "after".
    fn setup(app: &App) {
        create(
            app,
            "virtualdisks",
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualDisk", "metadata": {"name": "web-root", "namespace": "default"},
            "spec": {"persistentVolumeClaim": {"size": "1Mi"}}}),
        );
        create(
            app,
            "virtualmachines",
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualMachine", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"runPolicy": "Manual", "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "web-root"}]}}),
        );
        ticks(app, 4);
        let pvc = claim(app, "web-root");
        crate::kubevirt::vm_snapshot::write_volume(app, "default", &pvc, b"before").unwrap();
        create(
            app,
            crate::deckhouse::snapshot::VM_SNAPSHOTS,
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualMachineSnapshot", "metadata": {"name": "s1", "namespace": "default"},
            "spec": {"virtualMachineName": "web", "requiredConsistency": true, "keepIPAddress": "Never"}}),
        );
        ticks(app, 3);
        crate::kubevirt::vm_snapshot::write_volume(app, "default", &pvc, b"after").unwrap();
    }

    fn op(app: &App, name: &str, snapshot: &str, mode: &str, vm: &str) -> Value {
        create(
            app,
            VMSOPS,
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualMachineSnapshotOperation", "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": "CreateVirtualMachine", "virtualMachineSnapshotName": snapshot,
                "createVirtualMachine": {"mode": mode, "nameReplacement": [
                    {"from": {"kind": "VirtualMachine", "name": "web"}, "to": vm},
                    {"from": {"kind": "VirtualDisk", "name": "web-root"}, "to": format!("{vm}-root")}]}}}),
        );
        ticks(app, 2);
        get(app, VMSOPS, name).unwrap()
    }

    fn completed(op: &Value) -> (String, String, String) {
        let c = &op["status"]["conditions"][0];
        (
            op["status"]["phase"].as_str().unwrap_or("").into(),
            c["reason"].as_str().unwrap_or("").into(),
            c["message"].as_str().unwrap_or("").into(),
        )
    }

    #[test]
    fn creates_the_vm_and_its_disks_with_the_snapshot_data() {
        let app = app();
        setup(&app);
        let dry = op(&app, "dry", "s1", "DryRun", "copy");
        assert_eq!(completed(&dry).0, "Completed", "{dry}");
        assert_eq!(dry["status"]["resources"].as_array().unwrap().len(), 2);
        assert!(get(&app, "virtualmachines", "copy").is_none());
        let done = op(&app, "op", "s1", "Strict", "copy");
        assert_eq!(
            completed(&done),
            (
                "Completed".into(),
                "OperationCompleted".into(),
                "VirtualMachineSnapshotOperation completed".into()
            )
        );
        ticks(&app, 6);
        let vm = get(&app, "virtualmachines", "copy").unwrap();
        assert_eq!(vm["spec"]["blockDeviceRefs"][0]["name"], "copy-root");
        let disk = get(&app, "virtualdisks", "copy-root").unwrap();
        assert_eq!(disk["metadata"]["ownerReferences"][0]["name"], "copy");
        assert_eq!(data(&app, &claim(&app, "copy-root")), b"before");
        // The source keeps its data and its disk.
        assert_eq!(data(&app, &claim(&app, "web-root")), b"after");
    }

    /// deckhouse/virtualization `service/restorer/secret_restorer.go` `setProvisioning` keeps
    /// the provisioning Secret in the snapshot (key `provisioner`), and `snapshot_resources.go`
    /// `Prepare` makes the new VM's from it: the source's Secret may be gone.
    #[test]
    fn the_provisioning_secret_comes_from_the_snapshot_when_the_source_is_gone() {
        let app = app();
        app.store
            .create(
                "",
                "secrets",
                json!({"apiVersion": "v1", "kind": "Secret", "type": "provisioning.virtualization.deckhouse.io/cloud-init",
                "metadata": {"name": "web-cloudinit", "namespace": "default"},
                "data": {"userData": "I2Nsb3VkLWNvbmZpZwo="}}),
            )
            .unwrap();
        create(
            &app,
            "virtualdisks",
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualDisk", "metadata": {"name": "web-root", "namespace": "default"},
            "spec": {"persistentVolumeClaim": {"size": "1Mi"}}}),
        );
        create(
            &app,
            "virtualmachines",
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualMachine", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"runPolicy": "Manual", "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "web-root"}],
                "provisioning": {"type": "UserDataRef", "userDataRef": {"kind": "Secret", "name": "web-cloudinit"}}}}),
        );
        ticks(&app, 4);
        create(
            &app,
            crate::deckhouse::snapshot::VM_SNAPSHOTS,
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualMachineSnapshot", "metadata": {"name": "s1", "namespace": "default"},
            "spec": {"virtualMachineName": "web", "requiredConsistency": true, "keepIPAddress": "Never"}}),
        );
        ticks(&app, 3);
        let snap = get(&app, crate::deckhouse::snapshot::VM_SNAPSHOTS, "s1").unwrap();
        assert_eq!(snap["status"]["phase"], "Ready", "{snap}");
        // As upstream stores it: base64 of the JSON in Data, base64 again on the wire.
        let kept = app
            .store
            .get(&Key::new(
                "",
                "secrets",
                "default",
                snap["status"]["virtualMachineSnapshotSecretName"]
                    .as_str()
                    .unwrap(),
            ))
            .unwrap();
        let b64 = &base64::engine::general_purpose::STANDARD;
        use base64::Engine;
        let inner = b64
            .decode(kept["data"]["provisioner"].as_str().unwrap())
            .unwrap();
        let secret: Value = serde_json::from_slice(&b64.decode(inner).unwrap()).unwrap();
        assert_eq!(secret["metadata"]["name"], "web-cloudinit");
        assert_eq!(secret["data"]["userData"], "I2Nsb3VkLWNvbmZpZwo=");
        app.store
            .delete(
                &Key::new("", "secrets", "default", "web-cloudinit"),
                crate::core::store::Propagation::Cascade,
            )
            .unwrap();
        create(
            &app,
            VMSOPS,
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualMachineSnapshotOperation", "metadata": {"name": "op", "namespace": "default"},
            "spec": {"type": "CreateVirtualMachine", "virtualMachineSnapshotName": "s1",
                "createVirtualMachine": {"mode": "Strict", "nameReplacement": [
                    {"from": {"kind": "VirtualMachine", "name": "web"}, "to": "copy"},
                    {"from": {"kind": "VirtualDisk", "name": "web-root"}, "to": "copy-root"},
                    {"from": {"kind": "Secret", "name": "web-cloudinit"}, "to": "copy-cloudinit"}]}}}),
        );
        ticks(&app, 2);
        let done = get(&app, VMSOPS, "op").unwrap();
        assert_eq!(completed(&done).0, "Completed", "{done}");
        let copy = app
            .store
            .get(&Key::new("", "secrets", "default", "copy-cloudinit"))
            .unwrap();
        assert_eq!(copy["data"]["userData"], "I2Nsb3VkLWNvbmZpZwo=");
        let vm = get(&app, "virtualmachines", "copy").unwrap();
        assert_eq!(
            vm["spec"]["provisioning"]["userDataRef"]["name"],
            "copy-cloudinit"
        );
    }

    #[test]
    fn a_taken_name_or_a_missing_snapshot_fails_and_creates_nothing() {
        let app = app();
        setup(&app);
        let taken = op(&app, "op", "s1", "Strict", "web");
        let (phase, reason, message) = completed(&taken);
        assert_eq!(
            (phase.as_str(), reason.as_str()),
            ("Failed", "OperationFailed")
        );
        assert_eq!(
            message,
            "CreateVirtualMachine is failed: fail to validate the resources: check the status"
        );
        assert!(
            taken["status"]["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["message"] == "VirtualMachine with name web already exists"),
            "{taken}"
        );
        let missing = op(&app, "op2", "nope", "Strict", "other");
        assert_eq!(
            completed(&missing),
            (
                "Failed".into(),
                "VirtualMachineSnapshotNotFound".into(),
                "The VirtualMachineSnapshot \"nope\" was not found.".into()
            )
        );
        assert!(get(&app, "virtualmachines", "other").is_none());
        assert!(get(&app, "virtualdisks", "other-root").is_none());
    }
}
