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
//! - The resizer (external-resizer `pkg/controller/controller.go`): condition `Resizing` and
//!   `status.allocatedResources` while it expands, then `status.capacity` is the new size. The
//!   emulator finishes in one tick and skips the kubelet's `FileSystemResizePending` step.
//! - Deckhouse (virtualization `images/virtualization-artifact/pkg/controller/vd/internal/
//!   resizing.go`): a Ready VirtualDisk whose `spec.persistentVolumeClaim.size` is above its
//!   claim's request grows the claim, goes to phase `Resizing` with condition `Resizing` True,
//!   reason `InProgress`, "The virtual disk resizing has started."; a refusal of the claim's
//!   growth leaves condition `Resizing` False, reason `ResizingNotAvailable`, "Disk resizing is
//!   not allowed: <error>."; once the claim is grown the condition goes and `status.capacity`
//!   is the claim's capacity.

use serde_json::{Value, json};

use crate::app::App;
use crate::export::parse_bytes;
use crate::registry::ResourceDef;
use crate::status::{ApiError, Cause};
use crate::store::{Key, Store};
use crate::util::{meta_str, now_rfc3339};

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

fn has_condition(obj: &Value, type_: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == type_ && c["status"] == "True")
        })
}

fn drop_condition(status: &mut Value, type_: &str) {
    if let Some(c) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        c.retain(|c| c["type"] != type_);
    }
}

/// The resizer: a bound claim asking for more than it has gets `Resizing`, then (next tick) its
/// new capacity.
pub fn claim(app: &App, pvc: &Value, tick: bool) {
    let (Some(want), Some(have)) = (bytes_at(pvc, REQUEST), bytes_at(pvc, CAPACITY)) else {
        return;
    };
    if want <= have || pvc.pointer("/status/phase").and_then(Value::as_str) != Some("Bound") {
        return;
    }
    let request = pvc.pointer(REQUEST).cloned().unwrap_or_default();
    let key = Key::of("", "persistentvolumeclaims", pvc);
    let resizing = has_condition(pvc, "Resizing");
    if resizing && !tick {
        return;
    }
    app.store.modify(&key, |o| {
        let st = &mut o["status"];
        if resizing {
            st["capacity"]["storage"] = request.clone();
            drop_condition(st, "Resizing");
            if let Some(m) = st.as_object_mut() {
                m.remove("allocatedResourceStatuses");
            }
        } else {
            st["allocatedResources"] = json!({"storage": request});
            st["allocatedResourceStatuses"] = json!({"storage": "ControllerResizeInProgress"});
            if !st["conditions"].is_array() {
                st["conditions"] = json!([]);
            }
            let now = now_rfc3339();
            if let Some(c) = st["conditions"].as_array_mut() {
                c.push(json!({"type": "Resizing", "status": "True", "lastProbeTime": null, "lastTransitionTime": now}));
            }
        }
    });
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
                    crate::controllers::set_condition(st, "Resizing", *on, reason, message)
                }
                None => drop_condition(st, "Resizing"),
            }
            st["observedGeneration"] = generation;
        });
    };
    let grow = matches!((want, requested), (Some(w), Some(r)) if w > r);
    let claim_busy = has_condition(&pvc, "Resizing")
        || matches!((requested, bytes_at(&pvc, CAPACITY)), (Some(r), Some(c)) if r > c);
    if grow {
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
    } else if claim_busy {
        set(
            "Resizing",
            Some((
                true,
                "InProgress",
                "The virtual disk resizing has started.".into(),
            )),
        );
    } else {
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
