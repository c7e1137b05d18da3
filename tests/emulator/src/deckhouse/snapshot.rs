//! Deckhouse's VM snapshots: the VirtualMachineSnapshot controller and the
//! VirtualMachineOperation `Restore` (deckhouse/virtualization @ cf3a9e6c).
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
//!
//! Data: a VirtualDiskSnapshot keeps its disk's bytes through [`crate::kubevirt::vm_snapshot::capture`];
//! a disk made from it gets them through [`crate::kubevirt::vm_snapshot::materialize`] ([`disk_data`]).

use base64::Engine;
use serde_json::{Value, json};

use crate::core::app::App;
use crate::core::controllers::{owner_ref, set_condition};
use crate::core::store::{Key, Propagation};
use crate::core::util::meta_str;
use crate::kubevirt::clone::VMOP_RESTORE;
use crate::kubevirt::export_snapshot::CONTENT_OF;

const DH: &str = "virtualization.deckhouse.io";
/// Plural of VirtualMachineSnapshot.
pub const VM_SNAPSHOTS: &str = "virtualmachinesnapshots";
/// Plural of VirtualDiskSnapshot.
pub const VD_SNAPSHOTS: &str = "virtualdisksnapshots";
/// Which kept data a VirtualDiskSnapshot (made here) holds (see [`crate::kubevirt::vm_snapshot::capture`]).
const DATA_ID: &str = "emulator.kubevm.io/data-id";
/// The size of the disk a VirtualDiskSnapshot (made here) was taken of.
const SIZE: &str = "emulator.kubevm.io/size";
/// The StorageClass of the disk a VirtualDiskSnapshot (made here) was taken of (upstream keeps
/// it on the VolumeSnapshot, `annotations.AnnStorageClassName`).
const CLASS: &str = "emulator.kubevm.io/storage-class";
/// On a claim made from a snapshot: the data it was given, so it is given only once.
const RESTORED_FROM: &str = "emulator.kubevm.io/restored-from";
/// `annotations.AnnVMRestorePowerState`.
pub const RESTORE_POWER_STATE: &str = "virtualization.deckhouse.io/restore-power-state";
/// `annotations.AnnVMOPRestoreDeleted`.
const RESTORE_DELETED: &str = "virtualization.deckhouse.io/vmoprestoredeleted";
const READY: &str = "VirtualMachineSnapshotReady";

fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn condition_true(obj: &Value, type_: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == type_ && c["status"] == "True")
        })
}

/// The VirtualDisks among a VM's block devices (`fillStatusVirtualDiskSnapshotNames`).
fn disks(vm: &Value) -> Vec<String> {
    vm.pointer("/spec/blockDeviceRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == "VirtualDisk")
        .filter_map(|r| r["name"].as_str().map(String::from))
        .collect()
}

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

/// An object as the snapshot's Secret keeps it: `secret_restorer.go` puts
/// `base64.StdEncoding.EncodeToString(json.Marshal(obj))` into `Secret.Data`, so the API shows
/// it base64-encoded twice.
fn stored(obj: &Value) -> String {
    let b64 = &base64::engine::general_purpose::STANDARD;
    b64.encode(b64.encode(obj.to_string()))
}

/// The Secret `vm` takes its provisioning from (`setProvisioning`: `userDataRef` or
/// `sysprepRef` of kind Secret).
pub fn provisioning_secret(vm: &Value) -> Option<&str> {
    let p = vm.pointer("/spec/provisioning")?;
    p.get("userDataRef")
        .or_else(|| p.get("sysprepRef"))
        .filter(|r| r["kind"] == "Secret")
        .and_then(|r| r["name"].as_str())
}

/// Object `key` kept in the snapshot's Secret (`status.virtualMachineSnapshotSecretName`;
/// `secret_restorer.go` `get`: base64 of the JSON in `Data`).
fn kept(app: &App, ns: &str, snap: &Value, key: &str) -> Option<Value> {
    let secret = app.store.get(&Key::new(
        "",
        "secrets",
        ns,
        text(snap, "/status/virtualMachineSnapshotSecretName"),
    ))?;
    let b64 = &base64::engine::general_purpose::STANDARD;
    let data = b64
        .decode(secret.pointer(&format!("/data/{key}"))?.as_str()?)
        .ok()?;
    serde_json::from_slice(&b64.decode(data).ok()?).ok()
}

/// The snapshot's VM as kept in its Secret (key `vm`).
pub fn kept_vm(app: &App, ns: &str, snap: &Value) -> Option<Value> {
    kept(app, ns, snap, "vm")
}

/// The VM's provisioning Secret as the snapshot keeps it (key `provisioner`), if it had one.
pub fn kept_provisioner(app: &App, ns: &str, snap: &Value) -> Option<Value> {
    kept(app, ns, snap, "provisioner")
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
        let group = if plural == "secrets" || plural == "persistentvolumeclaims" {
            ""
        } else {
            DH
        };
        app.store.get(&Key::new(group, plural, "default", name))
    }

    /// VM `web` (runPolicy `policy`) with the disk `web-root`, settled.
    fn vm(app: &App, policy: &str) {
        app.store
            .create(
                DH,
                "virtualdisks",
                json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                "kind": "VirtualDisk", "metadata": {"name": "web-root", "namespace": "default"},
                "spec": {"persistentVolumeClaim": {"size": "1Mi"}}}),
            )
            .unwrap();
        app.store
            .create(DH, "virtualmachines", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                "kind": "VirtualMachine", "metadata": {"name": "web", "namespace": "default"},
                "spec": {"runPolicy": policy, "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "web-root"}]}}))
            .unwrap();
        ticks(app, 4);
    }

    fn snapshot(app: &App, name: &str, vm: &str) -> Value {
        app.store
            .create(DH, VM_SNAPSHOTS, json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                "kind": "VirtualMachineSnapshot", "metadata": {"name": name, "namespace": "default"},
                "spec": {"virtualMachineName": vm, "requiredConsistency": true, "keepIPAddress": "Never"}}))
            .unwrap()
    }

    fn claim(app: &App) -> String {
        text(
            &get(app, "virtualdisks", "web-root").unwrap(),
            "/status/target/persistentVolumeClaimName",
        )
        .to_string()
    }

    fn data(app: &App, pvc: &str) -> Vec<u8> {
        std::fs::read(crate::kubevirt::upload::uploaded_file(app, "default", pvc).unwrap()).unwrap()
    }

    fn ready(obj: &Value) -> (String, String, String) {
        let c = obj["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == READY).cloned())
            .unwrap_or_default();
        (
            text(obj, "/status/phase").into(),
            text(&c, "/reason").into(),
            text(&c, "/message").into(),
        )
    }

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
