//! Growing a PersistentVolumeClaim, and a Deckhouse VirtualDisk through it.
//!
//! - Validation (kubernetes `pkg/apis/core/validation/validation.go`,
//!   `ValidatePersistentVolumeClaimUpdate`, with RecoverVolumeExpansionFailure, GA in 1.34): a
//!   request below `status.capacity` is `422 Invalid`, `spec.resources.requests.storage:
//!   Forbidden: field can not be less than status.capacity`.
//! - Admission (`plugin/pkg/admission/storage/persistentvolume/resize/admission.go`,
//!   PersistentVolumeClaimResize, on by default): growing a claim that is not Bound is `403`
//!   `Only bound persistent volume claims can be expanded`; growing one whose StorageClass lacks
//!   `allowVolumeExpansion: true` is `403` `only dynamically provisioned pvc can be resized and
//!   the storageclass that provisions the pvc must support resize`.
//! - The controller side (external-resizer `pkg/controller/controller.go` and
//!   `resize_status.go`, `markControllerResizeInProgress`): condition `Resizing` True,
//!   `status.allocatedResources.storage` the new size and `status.allocatedResourceStatuses.
//!   storage: ControllerResizeInProgress`. When the volume is expanded (next tick): a volume
//!   whose driver needs node expansion (`markForPendingNodeExpansion`) loses `Resizing` and gets
//!   `FileSystemResizePending` True, "Waiting for user to (re-)start a pod to finish file system
//!   resize of volume on node.", and `NodeResizePending`; `status.capacity` stays the old size.
//!   Which volumes need it is the CSI driver's answer to ControllerExpandVolume
//!   (`node_expansion_required`); the emulator answers as ceph-csi's `ControllerExpandVolume`
//!   does: filesystem volumes yes, `volumeMode: Block` no (those finish at once, as
//!   `markOverallExpansionAsFinished`).
//! - The node side (kubelet, `pkg/volume/util/operationexecutor/operation_generator.go` and
//!   `node_expander.go`, then `pkg/volume/util/resize_util.go`
//!   `MarkNodeExpansionFinishedWithRecovery`): only the kubelet of a node where a running pod
//!   mounts the claim expands the filesystem; then `status.capacity` is the allocated size, the
//!   resize conditions go and `allocatedResourceStatuses.storage` is removed. While nothing
//!   mounts the claim (the VM using the disk is stopped) it stays `FileSystemResizePending`.
//!   A pod mounts the claim when it is Running and lists it in `spec.volumes`; for VMs, whose
//!   emulated virt-launcher pods do not list volumes, a Running VMI with the claim among its
//!   volumes (KubeVirt: the launcher or hotplug attachment pod mounts it), or a Running Deckhouse
//!   VM with an attached VirtualDisk on that claim.
//! - Deckhouse (virtualization `images/virtualization-artifact/pkg/controller/vd/internal/
//!   resizing.go`): a Ready VirtualDisk whose `spec.persistentVolumeClaim.size` is above its
//!   claim's request grows the claim, goes to phase `Resizing` with condition `Resizing` True,
//!   reason `InProgress`, "The virtual disk resizing has started."; a refusal of the claim's
//!   growth leaves condition `Resizing` False, reason `ResizingNotAvailable`, "Disk resizing is
//!   not allowed: <error>."; `status.capacity` is always the claim's `status.capacity`, the
//!   phase stays `Resizing` (condition message the claim's `Resizing` message) only while the
//!   claim's `Resizing` condition is True, and once the claim asks for the disk's size the
//!   condition goes (`ResizeNotNeeded`): a claim waiting for node expansion leaves the disk
//!   `Ready` at its old capacity until a running VM mounts it.

use serde_json::{Value, json};

use crate::core::app::App;
use crate::core::registry::ResourceDef;
use crate::core::status::{ApiError, Cause};
use crate::core::store::{Key, Store};
use crate::core::util::{meta_str, now_rfc3339};
use crate::kubevirt::export::parse_bytes;

fn bytes_at(obj: &Value, pointer: &str) -> Option<u64> {
    match obj.pointer(pointer)? {
        Value::String(s) => parse_bytes(s),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

const REQUEST: &str = "/spec/resources/requests/storage";
const CAPACITY: &str = "/status/capacity/storage";

/// Refuses growing a claim its StorageClass does not let grow (the admission plugin's checks).
fn admit_growth(store: &Store, claim: &Value) -> Result<(), String> {
    if claim.pointer("/status/phase").and_then(Value::as_str) != Some("Bound") {
        return Err("Only bound persistent volume claims can be expanded".into());
    }
    let class = claim
        .pointer("/spec/storageClassName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let expandable = !class.is_empty()
        && store
            .get(&Key::new("storage.k8s.io", "storageclasses", "", class))
            .is_some_and(|c| c.get("allowVolumeExpansion") == Some(&json!(true)));
    if expandable {
        Ok(())
    } else {
        Err("only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize".into())
    }
}

/// Checks an update of a PersistentVolumeClaim from `current` to `new` (validation, then the
/// resize admission plugin).
pub fn admit_update(
    store: &Store,
    def: &ResourceDef,
    current: &Value,
    new: &Value,
) -> Result<(), ApiError> {
    if !(def.group.is_empty() && def.plural == "persistentvolumeclaims") {
        return Ok(());
    }
    let (Some(old), Some(want)) = (bytes_at(current, REQUEST), bytes_at(new, REQUEST)) else {
        return Ok(());
    };
    if let Some(capacity) = bytes_at(current, CAPACITY)
        && want < capacity
        && want != old
    {
        return Err(ApiError::invalid(
            "",
            "PersistentVolumeClaim",
            meta_str(current, "name"),
            vec![Cause {
                reason: "FieldValueForbidden",
                field: "spec.resources.requests.storage".into(),
                message: "Forbidden: field can not be less than status.capacity".into(),
            }],
        ));
    }
    if want <= old {
        return Ok(());
    }
    admit_growth(store, current).map_err(|reason| {
        ApiError::forbidden(
            "",
            "persistentvolumeclaims",
            meta_str(current, "name"),
            &reason,
        )
    })
}

fn drop_condition(status: &mut Value, type_: &str) {
    if let Some(c) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        c.retain(|c| c["type"] != type_);
    }
}

/// The message of the claim's `FileSystemResizePending` condition (external-resizer
/// `markForPendingNodeExpansion`).
pub const FS_RESIZE_PENDING: &str =
    "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";

fn resize_status(pvc: &Value) -> &str {
    pvc.pointer("/status/allocatedResourceStatuses/storage")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Whether a running pod mounts claim `claim` in `ns` (see the module comment).
pub fn mounted_by_running_pod(app: &App, ns: &str, claim: &str) -> bool {
    let running = |o: &Value, phases: &[&str]| {
        o.pointer("/status/phase")
            .and_then(Value::as_str)
            .is_some_and(|p| phases.contains(&p))
    };
    let list = |group: &str, plural: &str| {
        if app.registry.find_plural(group, plural).is_none() {
            return vec![];
        }
        app.store.list(group, plural, Some(ns)).0
    };
    let pods = list("", "pods");
    if pods.iter().any(|p| {
        running(p, &["Running"])
            && p.pointer("/spec/volumes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|v| v.pointer("/persistentVolumeClaim/claimName") == Some(&json!(claim)))
    }) {
        return true;
    }
    let vmis = list("kubevirt.io", "virtualmachineinstances");
    if vmis.iter().any(|vmi| {
        running(vmi, &["Running"])
            && vmi
                .pointer("/spec/volumes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|v| {
                    v.pointer("/persistentVolumeClaim/claimName") == Some(&json!(claim))
                        || v.pointer("/dataVolume/name") == Some(&json!(claim))
                })
    }) {
        return true;
    }
    let disks: Vec<String> = list("virtualization.deckhouse.io", "virtualdisks")
        .iter()
        .filter(|d| d.pointer("/status/target/persistentVolumeClaimName") == Some(&json!(claim)))
        .map(|d| meta_str(d, "name").to_owned())
        .collect();
    !disks.is_empty()
        && list("virtualization.deckhouse.io", "virtualmachines")
            .iter()
            .any(|vm| {
                running(vm, &["Running", "Migrating"])
                    && vm
                        .pointer("/status/blockDeviceRefs")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .any(|r| {
                            r["kind"] == "VirtualDisk"
                                && r["attached"] != json!(false)
                                && r["name"]
                                    .as_str()
                                    .is_some_and(|n| disks.iter().any(|d| d == n))
                        })
            })
}

/// The resizer and the kubelet: a bound claim asking for more than it has gets `Resizing`
/// (now), then on a tick the controller expansion ends (`FileSystemResizePending` for a
/// filesystem volume, the new capacity for a block one), then on a tick where a running pod
/// mounts it the node expansion gives it its new capacity.
pub fn claim(app: &App, pvc: &Value, tick: bool) {
    let (Some(want), Some(have)) = (bytes_at(pvc, REQUEST), bytes_at(pvc, CAPACITY)) else {
        return;
    };
    if want <= have || pvc.pointer("/status/phase").and_then(Value::as_str) != Some("Bound") {
        return;
    }
    let request = pvc.pointer(REQUEST).cloned().unwrap_or_default();
    let key = Key::of("", "persistentvolumeclaims", pvc);
    let status = resize_status(pvc).to_owned();
    let block = pvc.pointer("/spec/volumeMode").and_then(Value::as_str) == Some("Block");
    let finish = |o: &mut Value| {
        let st = &mut o["status"];
        let size = st
            .pointer("/allocatedResources/storage")
            .cloned()
            .unwrap_or_else(|| request.clone());
        st["capacity"]["storage"] = size;
        drop_condition(st, "Resizing");
        drop_condition(st, "FileSystemResizePending");
        if let Some(m) = st.as_object_mut() {
            m.remove("allocatedResourceStatuses");
        }
    };
    match status.as_str() {
        "ControllerResizeInProgress" if tick => {
            app.store.modify(&key, |o| {
                if block {
                    return finish(o);
                }
                let st = &mut o["status"];
                drop_condition(st, "Resizing");
                st["allocatedResourceStatuses"]["storage"] = json!("NodeResizePending");
                if let Some(c) = st["conditions"].as_array_mut() {
                    c.push(json!({"type": "FileSystemResizePending", "status": "True",
                    "lastProbeTime": null, "lastTransitionTime": now_rfc3339(),
                    "message": FS_RESIZE_PENDING}));
                }
            });
        }
        "NodeResizePending" if tick => {
            if mounted_by_running_pod(app, meta_str(pvc, "namespace"), meta_str(pvc, "name")) {
                app.store.modify(&key, finish);
            }
        }
        "ControllerResizeInProgress" | "NodeResizePending" => {}
        _ => {
            app.store.modify(&key, |o| {
            let st = &mut o["status"];
            st["allocatedResources"] = json!({"storage": request});
            st["allocatedResourceStatuses"] = json!({"storage": "ControllerResizeInProgress"});
            if !st["conditions"].is_array() {
                st["conditions"] = json!([]);
            }
            let now = now_rfc3339();
            if let Some(c) = st["conditions"].as_array_mut() {
                c.retain(|c| c["type"] != "Resizing");
                c.push(json!({"type": "Resizing", "status": "True", "lastProbeTime": null, "lastTransitionTime": now}));
            }
            });
        }
    }
}

/// A Ready (or Resizing) VirtualDisk: grow its claim when its size asks for more, follow the
/// claim's progress, and come back to Ready with the claim's capacity.
pub fn virtual_disk(app: &App, vd: &Value) {
    let ns = meta_str(vd, "namespace");
    let Some(pvc_name) = vd
        .pointer("/status/target/persistentVolumeClaimName")
        .and_then(Value::as_str)
    else {
        return;
    };
    let Some(pvc) = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, pvc_name))
    else {
        return;
    };
    let want = bytes_at(vd, "/spec/persistentVolumeClaim/size");
    let requested = bytes_at(&pvc, REQUEST);
    let capacity = pvc.pointer(CAPACITY).cloned();
    let key = Key::of("virtualization.deckhouse.io", "virtualdisks", vd);
    let set = |phase: &str, state: Option<(bool, &str, String)>| {
        app.store.modify(&key, |o| {
            let generation = o["metadata"]["generation"].clone();
            let st = &mut o["status"];
            st["phase"] = json!(phase);
            if let Some(c) = &capacity {
                st["capacity"] = c.clone();
            }
            match &state {
                Some((on, reason, message)) => {
                    crate::core::controllers::set_condition(st, "Resizing", *on, reason, message)
                }
                None => drop_condition(st, "Resizing"),
            }
            st["observedGeneration"] = generation;
        });
    };
    let grow = matches!((want, requested), (Some(w), Some(r)) if w > r);
    let claim_resizing = pvc
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Resizing" && c["status"] == "True")
        .map(|c| c["message"].as_str().unwrap_or("").to_owned());
    if let Some(message) = claim_resizing {
        set("Resizing", Some((true, "InProgress", message)));
    } else if grow {
        let size = vd
            .pointer("/spec/persistentVolumeClaim/size")
            .cloned()
            .unwrap_or_default();
        if let Err(reason) = admit_growth(&app.store, &pvc) {
            let error = format!("persistentvolumeclaims \"{pvc_name}\" is forbidden: {reason}");
            set(
                "Ready",
                Some((
                    false,
                    "ResizingNotAvailable",
                    format!("Disk resizing is not allowed: {error}."),
                )),
            );
            return;
        }
        app.store
            .modify(&Key::of("", "persistentvolumeclaims", &pvc), |o| {
                o["spec"]["resources"]["requests"]["storage"] = size;
            });
        set(
            "Resizing",
            Some((
                true,
                "InProgress",
                "The virtual disk resizing has started.".into(),
            )),
        );
    } else {
        // ResizeNotNeeded: the claim asks for the disk's size; a claim still waiting for
        // node expansion leaves the disk Ready at the claim's (old) capacity.
        set("Ready", None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pvc(request: &str, capacity: &str, class: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "default"},
            "spec": {"storageClassName": class, "resources": {"requests": {"storage": request}}},
            "status": {"phase": "Bound", "capacity": {"storage": capacity}}})
    }

    #[test]
    fn bytes_are_read_from_quantities() {
        assert_eq!(bytes_at(&pvc("2Gi", "1Gi", "x"), REQUEST), Some(2 << 30));
        assert_eq!(bytes_at(&json!({}), REQUEST), None);
    }
}
