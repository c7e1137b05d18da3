//! VirtualMachineBlockDeviceAttachment (hotplug): attaching a disk or image to a running VM,
//! one VM per VirtualDisk, and the hotplugged devices in the VM's status.

use super::DH;
use crate::core::app::App;
use crate::core::controllers::{key_of, set_condition};
use crate::core::store::Key;
use crate::core::util::meta_str;
use serde_json::{Value, json};

/// The store key of a Deckhouse block device reference `{kind, name}` in `ns`.
fn block_device_key(ns: &str, r: &Value) -> Option<Key> {
    let name = r["name"].as_str().unwrap_or("");
    match r["kind"].as_str()? {
        "VirtualDisk" => Some(Key::new(DH, "virtualdisks", ns, name)),
        "VirtualImage" => Some(Key::new(DH, "virtualimages", ns, name)),
        "ClusterVirtualImage" => Some(Key::new(DH, "clustervirtualimages", "", name)),
        _ => None,
    }
}

/// The VMBDAs of VM `vm` in `ns`, oldest first.
pub(crate) fn attachments_of(app: &App, ns: &str, vm: &str) -> Vec<Value> {
    let (mut all, _) = app
        .store
        .list(DH, "virtualmachineblockdeviceattachments", Some(ns));
    all.retain(|a| {
        a.pointer("/spec/virtualMachineName")
            .and_then(Value::as_str)
            == Some(vm)
    });
    all.sort_by(|a, b| {
        meta_str(a, "creationTimestamp")
            .cmp(meta_str(b, "creationTimestamp"))
            .then(meta_str(a, "name").cmp(meta_str(b, "name")))
    });
    all
}

/// Who else holds VirtualDisk `disk` in `ns`: a VM's spec.blockDeviceRefs, or another live
/// VMBDA. A VirtualDisk is attached to one VM at a time (images are read-only and shared).
fn disk_holder(app: &App, ns: &str, disk: &str, this: &Value) -> Option<String> {
    let (vms, _) = app.store.list(DH, "virtualmachines", Some(ns));
    for vm in &vms {
        let refs = vm
            .pointer("/spec/blockDeviceRefs")
            .and_then(Value::as_array);
        if refs
            .into_iter()
            .flatten()
            .any(|r| r["kind"] == "VirtualDisk" && r["name"] == disk)
        {
            return Some(format!("virtual machine {}", meta_str(vm, "name")));
        }
    }
    let (bdas, _) = app
        .store
        .list(DH, "virtualmachineblockdeviceattachments", Some(ns));
    bdas.iter()
        .filter(|b| meta_str(b, "uid") != meta_str(this, "uid"))
        .filter(|b| b.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|b| {
            b.pointer("/spec/blockDeviceRef/kind") == Some(&json!("VirtualDisk"))
                && b.pointer("/spec/blockDeviceRef/name") == Some(&json!(disk))
        })
        .find(|b| {
            // Only an attachment that came first holds the disk.
            (meta_str(b, "creationTimestamp"), meta_str(b, "name"))
                < (meta_str(this, "creationTimestamp"), meta_str(this, "name"))
        })
        .map(|b| format!("attachment {}", meta_str(b, "name")))
}

/// VirtualMachineBlockDeviceAttachment (hotplug): `Pending` while the VM is not running or
/// the block device is not Ready, `InProgress` for one tick, then `Attached`; `Failed` when the
/// VirtualDisk is held by another VM or attachment, or the device is already in the VM's
/// `spec.blockDeviceRefs`. Phases and condition types from the CRD
/// (`virtualmachineblockdeviceattachments.yaml`, `BlockDeviceReady`, `VirtualMachineReady`,
/// `Attached`); the reasons and messages are the emulator's wording. The VM's
/// `status.blockDeviceRefs` lists the device (`hotplugged: true`) from `InProgress` on.
pub(in crate::core::controllers) fn vmbda(app: &App, bda: &Value, tick: bool) {
    if bda.pointer("/metadata/deletionTimestamp").is_some() {
        return;
    }
    let ns = meta_str(bda, "namespace");
    let vm_name = bda
        .pointer("/spec/virtualMachineName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let r = bda["spec"]["blockDeviceRef"].clone();
    let dev_name = r["name"].as_str().unwrap_or("").to_owned();
    let kind = r["kind"].as_str().unwrap_or("").to_owned();
    let phase = bda
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let vm = app.store.get(&Key::new(DH, "virtualmachines", ns, vm_name));
    let dev = block_device_key(ns, &r).and_then(|k| app.store.get(&k));
    let dev_ready = dev.as_ref().and_then(|d| d.pointer("/status/phase")) == Some(&json!("Ready"));
    let vm_running =
        vm.as_ref().and_then(|v| v.pointer("/status/phase")) == Some(&json!("Running"));
    let in_spec = vm.as_ref().is_some_and(|v| {
        v.pointer("/spec/blockDeviceRefs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|x| x["kind"] == r["kind"] && x["name"] == r["name"])
    });
    let holder = (kind == "VirtualDisk")
        .then(|| disk_holder(app, ns, &dev_name, bda))
        .flatten()
        .filter(|h| h != &format!("virtual machine {vm_name}"));
    // (phase, [BlockDeviceReady, VirtualMachineReady, Attached] as (ok, reason, message))
    let (next, conds): (&str, [(bool, &str, String); 3]) = if phase == "Failed" {
        return;
    } else if in_spec {
        (
            "Failed",
            [
                (dev_ready, "BlockDeviceReady", String::new()),
                (true, "VirtualMachineReady", String::new()),
                (
                    false,
                    "Conflict",
                    format!(
                        "{kind} {dev_name} is already attached to the virtual machine by its spec.blockDeviceRefs"
                    ),
                ),
            ],
        )
    } else if let Some(h) = holder {
        (
            "Failed",
            [
                (dev_ready, "BlockDeviceReady", String::new()),
                (vm.is_some(), "VirtualMachineReady", String::new()),
                (
                    false,
                    "Conflict",
                    format!("VirtualDisk {dev_name} is already in use by {h}"),
                ),
            ],
        )
    } else if vm.is_none() {
        (
            "Pending",
            [
                (dev_ready, "BlockDeviceReady", String::new()),
                (
                    false,
                    "VirtualMachineNotFound",
                    format!("VirtualMachine {vm_name} not found"),
                ),
                (false, "NotAttached", String::new()),
            ],
        )
    } else if !vm_running {
        (
            "Pending",
            [
                (dev_ready, "BlockDeviceReady", String::new()),
                (
                    false,
                    "NotReady",
                    format!("VirtualMachine {vm_name} is not running"),
                ),
                (false, "NotAttached", String::new()),
            ],
        )
    } else if !dev_ready {
        (
            "Pending",
            [
                (
                    false,
                    if dev.is_none() {
                        "BlockDeviceNotFound"
                    } else {
                        "NotReady"
                    },
                    if dev.is_none() {
                        format!("{kind} {dev_name} not found")
                    } else {
                        format!("{kind} {dev_name} is not ready")
                    },
                ),
                (true, "VirtualMachineReady", String::new()),
                (false, "NotAttached", String::new()),
            ],
        )
    } else {
        let next = match phase.as_str() {
            "Attached" => "Attached",
            "InProgress" if tick => "Attached",
            _ => "InProgress",
        };
        let attached = next == "Attached";
        (
            next,
            [
                (true, "BlockDeviceReady", String::new()),
                (true, "VirtualMachineReady", String::new()),
                (
                    attached,
                    if attached {
                        "Attached"
                    } else {
                        "AttachmentRequestSent"
                    },
                    if attached {
                        String::new()
                    } else {
                        format!("attaching {kind} {dev_name} to the virtual machine")
                    },
                ),
            ],
        )
    };
    let key = key_of(DH, "virtualmachineblockdeviceattachments", bda);
    let before = bda.get("status").cloned();
    let changed = app.store.modify(&key, |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!(next);
        st["virtualMachineName"] = json!(vm_name);
        for (t, (ok, reason, message)) in ["BlockDeviceReady", "VirtualMachineReady", "Attached"]
            .iter()
            .zip(conds.iter())
        {
            set_condition(&mut st, t, *ok, reason, message);
        }
        st["observedGeneration"] = o["metadata"]["generation"].clone();
        o["status"] = st;
    });
    let now = changed.and_then(|o| o.get("status").cloned());
    if now != before
        && let Some(vm) = vm
    {
        app.settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(meta_str(&vm, "uid"));
    }
}

/// The VM's `status.blockDeviceRefs` entries of its hotplugged devices (VMBDAs in progress or
/// attached).
pub(super) fn hotplugged_refs(app: &App, vm: &Value) -> Vec<Value> {
    let ns = meta_str(vm, "namespace");
    let mut out = vec![];
    for (i, b) in attachments_of(app, ns, meta_str(vm, "name"))
        .iter()
        .filter(|b| {
            matches!(
                b.pointer("/status/phase").and_then(Value::as_str),
                Some("InProgress" | "Attached")
            )
        })
        .enumerate()
    {
        let r = &b["spec"]["blockDeviceRef"];
        let dev = block_device_key(ns, r).and_then(|k| app.store.get(&k));
        let size = dev
            .as_ref()
            .and_then(|d| {
                d.pointer("/status/capacity")
                    .or_else(|| d.pointer("/status/size/unpacked"))
                    .cloned()
            })
            .unwrap_or(json!(""));
        out.push(json!({
            "kind": r["kind"], "name": r["name"], "size": size,
            // Hotplugged devices are SCSI disks (the CRD's description).
            "target": format!("sd{}", (b'a' + i as u8) as char),
            "attached": b.pointer("/status/phase") == Some(&json!("Attached")),
            "hotplugged": true,
            "virtualMachineBlockDeviceAttachmentName": b["metadata"]["name"],
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServeFlavor;
    use crate::core::controllers::reconcile_all;
    use crate::core::registry::Registry;
    use std::time::Duration;

    fn get(app: &App, plural: &str, name: &str) -> Value {
        app.store
            .get(&Key::new(DH, plural, "default", name))
            .unwrap_or_else(|| panic!("{plural}/{name}"))
    }

    fn bda(name: &str, vm: &str, disk: &str) -> Value {
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachineBlockDeviceAttachment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"virtualMachineName": vm, "blockDeviceRef": {"kind": "VirtualDisk", "name": disk}}})
    }

    #[test]
    fn vmbda_goes_pending_in_progress_attached_and_one_disk_has_one_vm() {
        let app = App::new(
            Registry::new(ServeFlavor::Deckhouse),
            Duration::from_secs(1),
        );
        for vm in ["a", "b"] {
            app.store
                .create(
                    DH,
                    "virtualmachines",
                    json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                    "kind": "VirtualMachine", "metadata": {"name": vm, "namespace": "default"},
                    "spec": {"runPolicy": "AlwaysOn", "blockDeviceRefs": []}}),
                )
                .unwrap();
        }
        app.store
            .create(
                DH,
                "virtualdisks",
                json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                "kind": "VirtualDisk", "metadata": {"name": "data", "namespace": "default"},
                "spec": {"persistentVolumeClaim": {"size": "1Gi"}}}),
            )
            .unwrap();
        // The VM is not running yet on the first pass: Pending with VirtualMachineReady False.
        app.store
            .create(
                DH,
                "virtualmachineblockdeviceattachments",
                bda("a-data", "a", "data"),
            )
            .unwrap();
        reconcile_all(&app, false);
        let first = get(&app, "virtualmachineblockdeviceattachments", "a-data");
        assert_eq!(first["status"]["phase"], "Pending");
        let mut phases = vec![];
        for _ in 0..8 {
            reconcile_all(&app, true);
            let p = get(&app, "virtualmachineblockdeviceattachments", "a-data")["status"]["phase"]
                .clone();
            if phases.last() != Some(&p) {
                phases.push(p);
            }
        }
        assert_eq!(phases.last(), Some(&json!("Attached")), "{phases:?}");
        assert!(phases.contains(&json!("InProgress")), "{phases:?}");
        let vm = get(&app, "virtualmachines", "a");
        let r = &vm["status"]["blockDeviceRefs"][0];
        assert_eq!(
            (&r["name"], &r["hotplugged"], &r["attached"]),
            (&json!("data"), &json!(true), &json!(true))
        );
        assert_eq!(r["virtualMachineBlockDeviceAttachmentName"], "a-data");
        // A second VM asking for the same disk fails with Conflict.
        app.store
            .create(
                DH,
                "virtualmachineblockdeviceattachments",
                bda("b-data", "b", "data"),
            )
            .unwrap();
        for _ in 0..3 {
            reconcile_all(&app, true);
        }
        let second = get(&app, "virtualmachineblockdeviceattachments", "b-data");
        assert_eq!(second["status"]["phase"], "Failed");
        let attached =
            crate::core::table::eval_first(&second, ".status.conditions[?(@.type=='Attached')]")
                .cloned()
                .unwrap();
        assert_eq!(attached["reason"], "Conflict");
        assert_eq!(
            attached["message"],
            "VirtualDisk data is already in use by attachment a-data"
        );
        // Deleting the attachment drops the device from the VM's status.
        app.store.delete(
            &Key::new(
                DH,
                "virtualmachineblockdeviceattachments",
                "default",
                "a-data",
            ),
            crate::core::store::Propagation::Cascade,
        );
        reconcile_all(&app, true);
        let vm = get(&app, "virtualmachines", "a");
        assert_eq!(vm["status"]["blockDeviceRefs"], json!([]));
    }
}
