//! Taking a VirtualMachineSnapshot (deckhouse/virtualization @ cf3a9e6c).
//!
//! Snapshot (`images/virtualization-artifact/pkg/controller/vmsnapshot/internal/life_cycle.go`,
//! `virtual_machine_ready.go`): a new snapshot is `Pending`; a missing VM fails it ("Cannot take
//! a snapshot: the virtual machine %q does not exist.", reason `WaitingForTheVirtualMachine`);
//! a VM that is neither Running nor Stopped fails it ("… is not ready."). With
//! `spec.requiredConsistency` (the default) a running VM must be frozen by its agent: without a
//! ready agent the snapshot fails with `PotentiallyInconsistent` ("Cannot take a consistent
//! snapshot of virtual machine %q: virtual machine agent is not ready and the virtual machine
//! cannot be frozen."). Otherwise `InProgress` (`FileSystemFreezing`, "The snapshotting process
//! has started."), then the VM's spec is kept in a Secret `d8v-vms-<name>-<uid>` (type
//! `virtualmachine.virtualization.deckhouse.io/snapshot`, key `vm`; `secret_restorer.go`
//! `Store`, `supplements/generator.go` `CommonSupplement`), `status.virtualDiskSnapshotNames`
//! lists one VirtualDiskSnapshot `<disk>-<snapshot uid>` per VirtualDisk block device
//! (`getVDSnapshotName`), each owned by the snapshot, and once they are Ready the snapshot is
//! `Ready` with the `VirtualMachineSnapshotReady` condition True, `status.consistent: true`
//! when the VM was stopped or frozen (left out otherwise), and `status.resources` naming the VM.
//! The VirtualDiskSnapshots and the Secret go with the snapshot (owner references).
//!
//! Storage that cannot snapshot: Deckhouse makes each disk's VolumeSnapshot without a class
//! (`vdsnapshot/internal/life_cycle.go`), so the snapshot-controller picks the default
//! VolumeSnapshotClass of the claim's provisioner (external-snapshotter
//! `pkg/common-controller/snapshot_controller.go` `SetDefaultSnapshotClass`: a class whose
//! `driver` is the provisioner and annotated `snapshot.storage.kubernetes.io/is-default-class:
//! "true"`); without one the VolumeSnapshot's `status.error.message` is "Failed to set default
//! snapshot class with error cannot find default snapshot class". The VirtualDiskSnapshot then
//! fails (`Failed`, `VirtualDiskSnapshotReady` False `VirtualDiskSnapshotFailed`, "VolumeSnapshot
//! %q has an error: %s."), and so does the VM snapshot (`vmsnapshot/internal/life_cycle.go`
//! `ensureVirtualDiskSnapshots`, `ErrCannotTakeSnapshot`: `Failed`, reason
//! `VirtualMachineSnapshotFailed`, "The virtual disk snapshot %q is failed: cannot take
//! snapshot. <its message>"), with `status.virtualDiskSnapshotNames` already filled.

use serde_json::{Value, json};

use super::kept::{provisioning_secret, stored};
use super::{
    CLASS, DATA_ID, DH, READY, SIZE, VD_SNAPSHOTS, VM_SNAPSHOTS, condition_true, disks, text,
};
use crate::core::app::App;
use crate::core::controllers::{owner_ref, set_condition};
use crate::core::store::Key;
use crate::core::util::meta_str;
use crate::kubevirt::export_snapshot::CONTENT_OF;

/// The data ids the existing VirtualDiskSnapshots hold (see
/// [`crate::kubevirt::vm_snapshot::live_data_ids`]): data under another id belongs to a deleted one.
pub fn live_data_ids(app: &App) -> std::collections::HashSet<String> {
    if app.registry.find_plural(DH, VD_SNAPSHOTS).is_none() {
        return Default::default();
    }
    let (list, _) = app.store.list(DH, VD_SNAPSHOTS, None);
    list.iter()
        .filter_map(|v| {
            v.pointer("/metadata/annotations")
                .and_then(|a| a.get(DATA_ID))
        })
        .filter_map(Value::as_str)
        .map(String::from)
        .collect()
}

fn data_id(ns: &str, vds: &str) -> String {
    format!("vds-{ns}-{vds}")
}

/// VirtualMachineSnapshot reconciler: one step per pass.
pub fn vm_snapshot(app: &App, snap: &Value, _tick: bool) {
    let phase = text(snap, "/status/phase");
    if matches!(phase, "Ready" | "Failed") {
        return;
    }
    let ns = meta_str(snap, "namespace");
    let name = meta_str(snap, "name");
    let uid = meta_str(snap, "uid");
    let key = Key::of(DH, VM_SNAPSHOTS, snap);
    let vm_name = text(snap, "/spec/virtualMachineName");
    let update = |phase: &str, ready: bool, reason: &str, message: &str| {
        app.store.modify(&key, |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["phase"] = json!(phase);
            st["observedGeneration"] = o["metadata"]["generation"].clone();
            set_condition(&mut st, READY, ready, reason, message);
            o["status"] = st;
        });
    };
    if phase.is_empty() {
        update("Pending", false, "Unknown", "");
        return;
    }
    let Some(vm) = app.store.get(&Key::new(DH, "virtualmachines", ns, vm_name)) else {
        update(
            "Failed",
            false,
            "WaitingForTheVirtualMachine",
            &format!("Cannot take a snapshot: the virtual machine {vm_name:?} does not exist."),
        );
        return;
    };
    let vm_phase = text(&vm, "/status/phase");
    if !matches!(vm_phase, "Running" | "Stopped") {
        update(
            "Failed",
            false,
            "WaitingForTheVirtualMachine",
            &format!("Cannot take a snapshot: the virtual machine {vm_name:?} is not ready."),
        );
        return;
    }
    let required = snap.pointer("/spec/requiredConsistency") != Some(&json!(false));
    let stopped = vm_phase == "Stopped";
    let agent = condition_true(&vm, "AgentReady");
    // needToFreeze / CanFreeze: a running VM is frozen through its agent.
    if required && !stopped && !agent {
        update(
            "Failed",
            false,
            "PotentiallyInconsistent",
            &format!(
                "Cannot take a consistent snapshot of virtual machine {vm_name:?}: virtual machine agent is not ready and the virtual machine cannot be frozen."
            ),
        );
        return;
    }
    if phase == "Pending" {
        update(
            "InProgress",
            false,
            "FileSystemFreezing",
            "The snapshotting process has started.",
        );
        return;
    }
    // InProgress: the Secret with the VM, then a VirtualDiskSnapshot per disk.
    let secret_name = format!("d8v-vms-{name}-{uid}");
    let secret_key = Key::new("", "secrets", ns, &secret_name);
    if app.store.get(&secret_key).is_none() {
        // The emulator's own state (its power switch, …) is not the VM's: upstream keeps a
        // stopped VM's power state in KubeVirt's objects, not in these annotations.
        let kept = json!({"apiVersion": vm["apiVersion"], "kind": "VirtualMachine",
            "metadata": {"name": vm_name, "namespace": ns,
                "labels": vm["metadata"]["labels"].clone(),
                "annotations": crate::kubevirt::clone::without_emulator_state(&vm["metadata"]["annotations"])},
            "spec": vm["spec"].clone()});
        let mut data = json!({ "vm": stored(&kept) });
        // setProvisioning: the provisioning Secret the VM refers to is kept whole (key
        // `provisioner`), so a restore makes it again even when the source's is gone.
        if let Some(p) =
            provisioning_secret(&vm).and_then(|s| app.store.get(&Key::new("", "secrets", ns, s)))
        {
            data["provisioner"] = json!(stored(&p));
        }
        crate::core::gc::create_dependent(
            app,
            &key,
            snap,
            "",
            "secrets",
            json!({"apiVersion": "v1", "kind": "Secret", "type": "virtualmachine.virtualization.deckhouse.io/snapshot",
                "metadata": {"name": secret_name, "namespace": ns, "ownerReferences": [owner_ref(snap)]},
                "data": data}),
        );
    }
    let mut names = vec![];
    for disk in disks(&vm) {
        let vds = format!("{disk}-{uid}");
        names.push(vds.clone());
        if app
            .store
            .get(&Key::new(DH, VD_SNAPSHOTS, ns, &vds))
            .is_some()
        {
            continue;
        }
        let Some(pvc) = app
            .store
            .get(&Key::new(DH, "virtualdisks", ns, &disk))
            .map(|d| text(&d, "/status/target/persistentVolumeClaimName").to_string())
            .filter(|p| !p.is_empty())
        else {
            update(
                "Failed",
                false,
                "VirtualMachineSnapshotFailed",
                &format!("The virtual disk {disk:?} not found."),
            );
            return;
        };
        if let Err(error) = default_snapshot_class(app, ns, &pvc) {
            let vs = format!("vs-{vds}");
            let message = format!("VolumeSnapshot {vs:?} has an error: {error}.");
            let mut st = json!({"phase": "Failed", "observedGeneration": 1});
            set_condition(
                &mut st,
                "VirtualDiskSnapshotReady",
                false,
                "VirtualDiskSnapshotFailed",
                &message,
            );
            crate::core::gc::create_dependent(
                app,
                &key,
                snap,
                DH,
                VD_SNAPSHOTS,
                json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDiskSnapshot",
                    "metadata": {"name": vds, "namespace": ns, "ownerReferences": [owner_ref(snap)]},
                    "spec": {"virtualDiskName": disk, "requiredConsistency": required},
                    "status": st}),
            );
            let all: Vec<String> = disks(&vm).iter().map(|d| format!("{d}-{uid}")).collect();
            app.store.modify(&key, |o| {
                let mut st = o.get("status").cloned().unwrap_or(json!({}));
                st["phase"] = json!("Failed");
                st["virtualDiskSnapshotNames"] = json!(all);
                set_condition(
                    &mut st,
                    READY,
                    false,
                    "VirtualMachineSnapshotFailed",
                    &format!("The virtual disk snapshot {vds:?} is failed: cannot take snapshot. {message}"),
                );
                o["status"] = st;
            });
            return;
        }
        let id = data_id(ns, &vds);
        let claim = app
            .store
            .get(&Key::new("", "persistentvolumeclaims", ns, &pvc));
        let size = claim
            .as_ref()
            .and_then(|p| p.pointer("/spec/resources/requests/storage").cloned())
            .unwrap_or(json!("10Gi"));
        let class = claim
            .as_ref()
            .and_then(|p| p.pointer("/spec/storageClassName").cloned())
            .unwrap_or(Value::Null);
        let source = crate::kubevirt::vm_snapshot::capture(app, ns, &pvc, &id);
        let mut st = json!({"phase": "Ready", "consistent": stopped || agent,
            "volumeSnapshotName": format!("vs-{vds}"), "observedGeneration": 1});
        set_condition(
            &mut st,
            "VirtualDiskSnapshotReady",
            true,
            "VirtualDiskSnapshotReady",
            "",
        );
        crate::core::gc::create_dependent(
            app,
            &key,
            snap,
            DH,
            VD_SNAPSHOTS,
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDiskSnapshot",
                "metadata": {"name": vds, "namespace": ns, "ownerReferences": [owner_ref(snap)],
                    "annotations": {DATA_ID: id, CONTENT_OF: source, SIZE: size, CLASS: class}},
                "spec": {"virtualDiskName": disk, "requiredConsistency": required},
                "status": st}),
        );
    }
    let consistent = stopped || agent;
    app.store.modify(&key, |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!("Ready");
        st["virtualMachineSnapshotSecretName"] = json!(secret_name);
        st["virtualDiskSnapshotNames"] = json!(names);
        st["resources"] =
            json!([{"kind": "VirtualMachine", "apiVersion": vm["apiVersion"], "name": vm_name}]);
        if consistent {
            st["consistent"] = json!(true);
        } else if let Some(m) = st.as_object_mut() {
            m.remove("consistent");
        }
        set_condition(&mut st, READY, true, "VirtualMachineReady", "");
        o["status"] = st;
    });
}

/// The VolumeSnapshotClass the snapshot-controller gives a class-less VolumeSnapshot of claim
/// `pvc` (`SetDefaultSnapshotClass`), or its error. A claim without a class (or not found) has
/// the default StorageClass.
fn default_snapshot_class(app: &App, ns: &str, pvc: &str) -> Result<String, String> {
    let claim_class = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, pvc))
        .map(|p| text(&p, "/spec/storageClassName").to_owned())
        .unwrap_or_default();
    let (classes, _) = app.store.list("storage.k8s.io", "storageclasses", None);
    let Some(class) = classes.into_iter().find(|c| {
        if claim_class.is_empty() {
            c.pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class")
                .and_then(Value::as_str)
                == Some("true")
        } else {
            meta_str(c, "name") == claim_class
        }
    }) else {
        return Err(format!(
            "Failed to set default snapshot class with error storageclass.storage.k8s.io {claim_class:?} not found"
        ));
    };
    let driver = text(&class, "/provisioner");
    let (all, _) = app
        .store
        .list("snapshot.storage.k8s.io", "volumesnapshotclasses", None);
    let defaults: Vec<&Value> = all
        .iter()
        .filter(|c| {
            text(c, "/driver") == driver
                && c.pointer(
                    "/metadata/annotations/snapshot.storage.kubernetes.io~1is-default-class",
                )
                .and_then(Value::as_str)
                    == Some("true")
        })
        .collect();
    match defaults.as_slice() {
        [one] => Ok(meta_str(one, "name").to_owned()),
        [] => Err(
            "Failed to set default snapshot class with error cannot find default snapshot class"
                .into(),
        ),
        many => Err(format!(
            "Failed to set default snapshot class with error {} default snapshot classes were found",
            many.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::core::controllers::reconcile_all;
    use crate::core::store::Propagation;
    use crate::deckhouse::snapshot::kept_vm;

    #[test]
    fn snapshot_of_a_running_vm_has_a_disk_snapshot_and_the_vm_spec() {
        let app = app();
        vm(&app, "AlwaysOn");
        assert_eq!(
            get(&app, "virtualmachines", "web").unwrap()["status"]["phase"],
            "Running"
        );
        let snap = snapshot(&app, "s1", "web");
        let uid = meta_str(&snap, "uid").to_string();
        reconcile_all(&app, false);
        assert_eq!(ready(&get(&app, VM_SNAPSHOTS, "s1").unwrap()).0, "Pending");
        reconcile_all(&app, false);
        let s = get(&app, VM_SNAPSHOTS, "s1").unwrap();
        assert_eq!(
            ready(&s),
            (
                "InProgress".into(),
                "FileSystemFreezing".into(),
                "The snapshotting process has started.".into()
            )
        );
        reconcile_all(&app, false);
        let s = get(&app, VM_SNAPSHOTS, "s1").unwrap();
        assert_eq!(s["status"]["phase"], "Ready");
        assert_eq!(s["status"]["consistent"], true);
        assert_eq!(
            s["status"]["virtualDiskSnapshotNames"],
            json!([format!("web-root-{uid}")])
        );
        let secret = format!("d8v-vms-s1-{uid}");
        assert_eq!(s["status"]["virtualMachineSnapshotSecretName"], secret);
        let vds = get(&app, VD_SNAPSHOTS, &format!("web-root-{uid}")).unwrap();
        assert_eq!(vds["status"]["phase"], "Ready");
        assert_eq!(vds["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
        assert!(kept_vm(&app, "default", &s).is_some());
        // Its kept data is live (the qemu guests' housekeeping keeps the copy) until it goes.
        let id = data_id("default", &format!("web-root-{uid}"));
        assert_eq!(
            crate::kubevirt::vm_snapshot::live_data_ids(&app),
            [id].into_iter().collect()
        );
        // Deleting the snapshot takes its disk snapshots and Secret (owner references).
        app.store.delete(
            &Key::new(DH, VM_SNAPSHOTS, "default", "s1"),
            Propagation::Cascade,
        );
        assert!(get(&app, VD_SNAPSHOTS, &format!("web-root-{uid}")).is_none());
        assert!(get(&app, "secrets", &secret).is_none());
        assert!(crate::kubevirt::vm_snapshot::live_data_ids(&app).is_empty());
    }

    #[test]
    fn a_missing_vm_or_a_running_vm_without_agent_fails_the_snapshot() {
        let app = app();
        snapshot(&app, "s1", "gone");
        ticks(&app, 3);
        assert_eq!(
            ready(&get(&app, VM_SNAPSHOTS, "s1").unwrap()),
            (
                "Failed".into(),
                "WaitingForTheVirtualMachine".into(),
                "Cannot take a snapshot: the virtual machine \"gone\" does not exist.".into()
            )
        );
        vm(&app, "AlwaysOn");
        // No agent: the emulator's agent is ready whenever the VM runs, so say it is not.
        let key = Key::new(DH, "virtualmachines", "default", "web");
        app.store.modify(&key, |o| {
            set_condition(&mut o["status"], "AgentReady", false, "AgentNotReady", "")
        });
        let vm = app.store.get(&key).unwrap();
        app.settle(&vm);
        snapshot(&app, "s2", "web");
        ticks(&app, 3);
        let s = get(&app, VM_SNAPSHOTS, "s2").unwrap();
        assert_eq!(
            ready(&s),
            (
                "Failed".into(),
                "PotentiallyInconsistent".into(),
                "Cannot take a consistent snapshot of virtual machine \"web\": virtual machine agent is not ready and the virtual machine cannot be frozen.".into()
            )
        );
    }
}
