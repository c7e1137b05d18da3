//! The VirtualMachineOperation `Restore` of a VM from its snapshot (deckhouse/virtualization
//! @ cf3a9e6c).
//!
//! Restore (`pkg/controller/vmop/snapshot/internal/service/restore.go`, `step/*.go`,
//! `service/restorer/restorers/vd_restorer.go`): applicable to a Running, Stopped or Pending
//! VM. The snapshot must be Ready ("virtual machine snapshot %q is not ready to use"; missing:
//! "… is not found"). `DryRun` validates only and lists `status.resources`. Otherwise the VM
//! enters maintenance mode (VM condition `Maintenance` True, reason `RestoreInProgress`; the
//! power state is kept in the annotation `virtualization.deckhouse.io/restore-power-state`), which
//! stops it; each disk is deleted (marked `vmoprestoredeleted`) and made again under the same
//! name from its VirtualDiskSnapshot (`dataSource.objectRef`), the VM's spec becomes the
//! snapshot's; once the disks are Ready maintenance ends, a VM that ran is started again, and
//! the operation is `Completed`. Failures: phase `Failed`, `Completed` False `OperationFailed`
//! "Restore is failed: <why>".

use serde_json::{Value, json};

use super::kept::kept_vm;
use super::{DH, READY, VD_SNAPSHOTS, VM_SNAPSHOTS, condition_true, disks, text};
use crate::core::app::App;
use crate::core::controllers::set_condition;
use crate::core::store::{Key, Propagation};
use crate::core::util::meta_str;
use crate::kubevirt::clone::VMOP_RESTORE;

/// `annotations.AnnVMRestorePowerState`.
pub const RESTORE_POWER_STATE: &str = "virtualization.deckhouse.io/restore-power-state";
/// `annotations.AnnVMOPRestoreDeleted`.
const RESTORE_DELETED: &str = "virtualization.deckhouse.io/vmoprestoredeleted";

/// What the VirtualMachineOperation controller should do next for a `Restore`.
#[derive(Debug, PartialEq)]
pub enum RestoreStep {
    /// Power the VM off (maintenance mode).
    Stop,
    /// Power the VM on again (it ran before the restore).
    Start,
    /// Nothing to do this pass.
    Wait,
    /// Completed.
    Done,
    /// Failed: the message of the `Completed` condition.
    Fail(String),
}

fn set_vmop_condition(app: &App, op: &Value, type_: &str, state: bool, reason: &str, msg: &str) {
    app.store
        .modify(&Key::of(DH, "virtualmachineoperations", op), |o| {
            set_condition(&mut o["status"], type_, state, reason, msg);
        });
}

fn set_resources(app: &App, op: &Value, resources: Value) {
    app.store
        .modify(&Key::of(DH, "virtualmachineoperations", op), |o| {
            o["status"]["resources"] = resources;
        });
}

fn resource(kind: &str, name: &str, status: &str, message: &str) -> Value {
    json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": kind, "name": name,
        "status": status, "message": message})
}

/// One pass of an InProgress `Restore` operation on `vm` (see the module documentation).
pub fn restore_step(app: &App, op: &Value, vm: &Value) -> RestoreStep {
    let ns = meta_str(op, "namespace");
    let op_uid = meta_str(op, "uid");
    let snap_name = text(op, "/spec/restore/virtualMachineSnapshotName");
    let mode = op
        .pointer("/spec/restore/mode")
        .and_then(Value::as_str)
        .unwrap_or("Strict");
    let fail = |why: String| RestoreStep::Fail(format!("Restore is failed: {why}"));
    // VMSnapshotReadyStep.
    let Some(snap) = app.store.get(&Key::new(DH, VM_SNAPSHOTS, ns, snap_name)) else {
        return fail(format!(
            "virtual machine snapshot {snap_name:?} is not found"
        ));
    };
    if !condition_true(&snap, READY) {
        return fail(format!(
            "virtual machine snapshot {snap_name:?} is not ready to use"
        ));
    }
    let Some(kept) = kept_vm(app, ns, &snap) else {
        return fail("restorer secret is not found".into());
    };
    let vm_name = meta_str(vm, "name");
    let vm_key = Key::of(DH, "virtualmachines", vm);
    let disk_names = disks(&kept);
    let statuses = |status: &str, message: &str| {
        let mut r: Vec<Value> = disk_names
            .iter()
            .map(|d| resource("VirtualDisk", d, status, message))
            .collect();
        r.push(resource("VirtualMachine", vm_name, status, message));
        json!(r)
    };
    if mode == "DryRun" {
        set_resources(app, op, statuses("Completed", "is valid for restore"));
        return RestoreStep::Done;
    }
    // The operation's MaintenanceMode condition: absent before, True during, False after.
    let maintenance = op
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "MaintenanceMode"))
        .map(|c| c["status"] == "True");
    let vm_phase = text(vm, "/status/phase");
    if maintenance.is_none() {
        // EnterMaintenanceStep: keep the power state, then stop.
        if !condition_true(vm, "Maintenance") {
            let power = if vm_phase == "Stopped" {
                "Stopped"
            } else {
                "Running"
            };
            app.store.modify(&vm_key, |o| {
                o["metadata"]["annotations"][RESTORE_POWER_STATE] = json!(power);
                set_condition(
                    &mut o["status"],
                    "Maintenance",
                    true,
                    "RestoreInProgress",
                    "VM is in maintenance mode for restore operation.",
                );
            });
        }
        if vm_phase != "Stopped" {
            return RestoreStep::Stop;
        }
        set_vmop_condition(
            app,
            op,
            "MaintenanceMode",
            true,
            "MaintenanceModeEnabled",
            "VMOP has enabled maintenance mode on VM for restore operation.",
        );
        return RestoreStep::Wait;
    }
    // ProcessRestoreStep: each disk deleted and made again from its snapshot; the VM's spec.
    let snap_uid = meta_str(&snap, "uid");
    let mut all_made = true;
    for disk in &disk_names {
        let key = Key::new(DH, "virtualdisks", ns, disk);
        match app.store.get(&key) {
            Some(d)
                if text(
                    &d,
                    "/metadata/annotations/virtualization.deckhouse.io~1vmoprestore",
                ) == op_uid => {}
            Some(_) => {
                app.store.modify(&key, |o| {
                    o["metadata"]["annotations"][RESTORE_DELETED] = json!(op_uid);
                });
                app.store.delete(&key, Propagation::Cascade);
                all_made = false;
            }
            None => {
                let old = app
                    .store
                    .list(DH, VD_SNAPSHOTS, Some(ns))
                    .0
                    .into_iter()
                    .find(|s| meta_str(s, "name") == format!("{disk}-{snap_uid}"));
                let Some(vds) = old else {
                    return fail(format!(
                        "the virtual disk snapshot \"{disk}-{snap_uid}\" is not found"
                    ));
                };
                let size = match text(&vds, "/metadata/annotations/emulator.kubevm.io~1size") {
                    "" => "10Gi",
                    s => s,
                };
                let _ = app.store.create(DH, "virtualdisks", json!({
                    "apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
                    "metadata": {"name": disk, "namespace": ns, "annotations": {VMOP_RESTORE: op_uid}},
                    "spec": {"persistentVolumeClaim": {"size": size},
                        "dataSource": {"type": "ObjectRef", "objectRef": {"kind": "VirtualDiskSnapshot", "name": meta_str(&vds, "name")}}}}));
                all_made = false;
            }
        }
    }
    if !all_made {
        set_resources(app, op, statuses("InProgress", ""));
        return RestoreStep::Wait;
    }
    if text(
        vm,
        "/metadata/annotations/virtualization.deckhouse.io~1vmoprestore",
    ) != op_uid
    {
        app.store.modify(&vm_key, |o| {
            o["spec"] = kept["spec"].clone();
            o["metadata"]["annotations"][VMOP_RESTORE] = json!(op_uid);
        });
        set_resources(app, op, statuses("Completed", "Successfully processed"));
        return RestoreStep::Wait;
    }
    // WaitingDisksStep.
    let ready = disk_names.iter().all(|d| {
        app.store
            .get(&Key::new(DH, "virtualdisks", ns, d))
            .is_some_and(|vd| {
                matches!(text(&vd, "/status/phase"), "Ready" | "WaitForFirstConsumer")
            })
    });
    if !ready {
        return RestoreStep::Wait;
    }
    let was_running = text(
        vm,
        "/metadata/annotations/virtualization.deckhouse.io~1restore-power-state",
    ) == "Running";
    // ExitMaintenanceStep, then a VM that ran is started again (checkNeedStartVM).
    if maintenance == Some(true) {
        app.store.modify(&vm_key, |o| {
            set_condition(
                &mut o["status"],
                "Maintenance",
                false,
                "RestoreInProgress",
                "VM exited maintenance mode after restore completion.",
            );
        });
        set_vmop_condition(
            app,
            op,
            "MaintenanceMode",
            false,
            "MaintenanceModeDisabled",
            "VMOP has disabled maintenance mode on VM.",
        );
        return if was_running {
            RestoreStep::Start
        } else {
            RestoreStep::Wait
        };
    }
    if was_running && vm_phase != "Running" {
        return RestoreStep::Wait;
    }
    app.store.modify(&vm_key, |o| {
        if let Some(a) = o["metadata"]["annotations"].as_object_mut() {
            a.remove(RESTORE_POWER_STATE);
        }
    });
    RestoreStep::Done
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::core::controllers::reconcile_all;

    fn restore(app: &App, name: &str, mode: &str) -> Value {
        app.store
            .create(DH, "virtualmachineoperations", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                "kind": "VirtualMachineOperation", "metadata": {"name": name, "namespace": "default"},
                "spec": {"type": "Restore", "virtualMachineName": "web",
                    "restore": {"mode": mode, "virtualMachineSnapshotName": "s1"}}}))
            .unwrap()
    }

    #[test]
    fn restore_stops_the_vm_brings_the_data_back_and_starts_it_again() {
        let app = app();
        vm(&app, "AlwaysOnUnlessStoppedManually");
        let before = claim(&app);
        crate::kubevirt::vm_snapshot::write_volume(&app, "default", &before, b"before").unwrap();
        snapshot(&app, "s1", "web");
        ticks(&app, 3);
        crate::kubevirt::vm_snapshot::write_volume(&app, "default", &before, b"after").unwrap();
        // DryRun reports and changes nothing.
        restore(&app, "dry", "DryRun");
        ticks(&app, 3);
        let op = get(&app, "virtualmachineoperations", "dry").unwrap();
        assert_eq!(op["status"]["phase"], "Completed", "{op}");
        assert_eq!(op["status"]["resources"][0]["name"], "web-root");
        assert_eq!(claim(&app), before);
        assert_eq!(data(&app, &before), b"after");
        // Strict: stopped, disk made again from its snapshot, started again.
        restore(&app, "op", "Strict");
        let mut phases = vec![];
        for _ in 0..30 {
            reconcile_all(&app, true);
            let p = get(&app, "virtualmachines", "web").unwrap()["status"]["phase"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if phases.last() != Some(&p) {
                phases.push(p);
            }
            if get(&app, "virtualmachineoperations", "op").unwrap()["status"]["phase"]
                == "Completed"
            {
                break;
            }
        }
        let op = get(&app, "virtualmachineoperations", "op").unwrap();
        assert_eq!(op["status"]["phase"], "Completed", "{op}");
        assert!(phases.contains(&"Stopped".to_string()), "{phases:?}");
        assert_eq!(phases.last().unwrap(), "Running", "{phases:?}");
        let after = claim(&app);
        assert_ne!(after, before, "the disk was made again");
        assert_eq!(data(&app, &after), b"before");
        let vm = get(&app, "virtualmachines", "web").unwrap();
        assert!(
            vm["metadata"]["annotations"]
                .get(RESTORE_POWER_STATE)
                .is_none()
        );
    }

    #[test]
    fn restore_from_a_missing_snapshot_fails() {
        let app = app();
        vm(&app, "Manual");
        restore(&app, "op", "Strict");
        ticks(&app, 3);
        let op = get(&app, "virtualmachineoperations", "op").unwrap();
        assert_eq!(op["status"]["phase"], "Failed");
        let c = &op["status"]["conditions"][0];
        assert_eq!(c["reason"], "OperationFailed");
        assert_eq!(
            c["message"],
            "Restore is failed: virtual machine snapshot \"s1\" is not found"
        );
    }
}
