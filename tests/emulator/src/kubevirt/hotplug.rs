//! KubeVirt volume hotplug as virt-api, virt-controller and virt-handler run it.
//!
//! - `PUT virtualmachines/NAME/addvolume|removevolume` (virt-api
//!   `pkg/virt-api/rest/subresource.go`, `addVolumeRequestHandler`,
//!   `removeVolumeRequestHandler`, `vmVolumePatchStatus`, `verifyVolumeOption`): the body is
//!   checked, the request is checked against the VM template's volumes and the pending
//!   `status.volumeRequests`, then appended to `status.volumeRequests` (202). Refusals are
//!   400 for a bad body and 409 (`errors.NewConflict` on `virtualmachine.kubevirt.io`) for the
//!   rest. Added volumes are marked `hotpluggable: true`; the disk takes the volume's name.
//! - virt-controller (`pkg/virt-controller/watch/vm.go`, volume requests applied with
//!   `ApplyVolumeRequestOnVMISpec`): each request changes the VM template and the running
//!   VMI's spec, then the requests are cleared ([`apply_volume_requests`]).
//! - The VMI's `status.volumeStatus` of a hotplugged volume goes one step per controller tick
//!   through the phases of `api/core/v1/types.go` (`VolumePhase`): `Pending` (the claim is not
//!   there or not ready yet), `Bound`, `AttachedToNode` (the attachment pod runs),
//!   `MountedToPod`, `Ready`; a removed one goes `Detaching` and then disappears
//!   ([`volume_status`]).

use crate::core::app::App;
use crate::core::handlers::{Query, ResourcePath};
use crate::core::status::ApiError;
use crate::core::store::Key;
use crate::core::util::meta_str;
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

const KV: &str = "kubevirt.io";

/// `errors.NewConflict(v1.Resource("virtualmachine"), name, err)`.
fn conflict(name: &str, why: &str) -> ApiError {
    ApiError::new(
        409,
        "Conflict",
        format!("Operation cannot be fulfilled on virtualmachine.kubevirt.io \"{name}\": {why}"),
    )
}

/// Whether the KubeVirt CR enables hotplug (`HotplugVolumes`, or the declarative successor).
pub(crate) fn hotplug_enabled(app: &App) -> bool {
    let (kvs, _) = app.store.list(KV, "kubevirts", None);
    kvs.iter().any(|kv| {
        kv.pointer("/spec/configuration/developerConfiguration/featureGates")
            .and_then(Value::as_array)
            .is_some_and(|g| {
                g.iter()
                    .any(|g| g == "HotplugVolumes" || g == "DeclarativeHotplugVolumes")
            })
    })
}

/// Dispatches `addvolume`/`removevolume` on VMs; `None` for other subresources.
pub fn action(
    app: &App,
    rp: &ResourcePath,
    sub: &str,
    q: &Query,
    body: &Bytes,
) -> Option<Result<Response, ApiError>> {
    if rp.group != "subresources.kubevirt.io" || rp.plural != "virtualmachines" {
        return None;
    }
    let add = match sub {
        "addvolume" => true,
        "removevolume" => false,
        _ => return None,
    };
    let ns = rp.namespace.as_deref().unwrap_or("");
    let name = rp.name.as_deref().unwrap_or("");
    Some(volume_request(app, ns, name, add, q, body))
}

fn volume_request(
    app: &App,
    ns: &str,
    name: &str,
    add: bool,
    q: &Query,
    body: &Bytes,
) -> Result<Response, ApiError> {
    if !hotplug_enabled(app) {
        return Err(ApiError::bad_request(format!(
            "Unable to {} Volume because HotplugVolumes feature gate is not enabled.",
            if add { "Add" } else { "Remove" }
        )));
    }
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "Request with no body, a new name is expected as the request body",
        ));
    }
    let mut opts: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "Can not unmarshal Request body to struct, error: {e}"
        ))
    })?;
    let vol_name = opts["name"].as_str().unwrap_or("").to_owned();
    let what = if add {
        "AddVolumeOptions"
    } else {
        "RemoveVolumeOptions"
    };
    if vol_name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{what} requires name to be set"
        )));
    }
    if add {
        if !opts["disk"].is_object() {
            return Err(ApiError::bad_request(
                "AddVolumeOptions requires disk to not be nil",
            ));
        }
        if !opts["volumeSource"].is_object() {
            return Err(ApiError::bad_request(
                "AddVolumeOptions requires VolumeSource to not be nil",
            ));
        }
        opts["disk"]["name"] = json!(vol_name);
        for source in ["dataVolume", "persistentVolumeClaim"] {
            if opts["volumeSource"][source].is_object() {
                opts["volumeSource"][source]["hotpluggable"] = json!(true);
                break;
            }
        }
    }
    let dry = opts["dryRun"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == "All"))
        || q.get("dryRun").is_some_and(|v| v == "All");
    let vm_key = Key::new(KV, "virtualmachines", ns, name);
    let vm = app.store.get(&vm_key).expect("checked by the caller");
    let volumes = vm
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    verify(&volumes, add, &vol_name, &opts).map_err(|why| conflict(name, &why))?;
    let pending = vm
        .pointer("/status/volumeRequests")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut next = vec![];
    for r in pending {
        let adds = r.pointer("/addVolumeOptions/name") == Some(&json!(vol_name));
        let removes = r.pointer("/removeVolumeOptions/name") == Some(&json!(vol_name));
        if add && adds {
            return Err(conflict(
                name,
                &format!("add volume request for volume [{vol_name}] already exists"),
            ));
        }
        if add && removes {
            return Err(conflict(
                name,
                &format!(
                    "unable to add volume since a remove volume request for volume [{vol_name}] already exists and is still being processed"
                ),
            ));
        }
        if !add && removes {
            return Err(conflict(
                name,
                &format!(
                    "a remove volume request for volume [{vol_name}] already exists and is still being processed"
                ),
            ));
        }
        // A removal drops a pending add of the same volume.
        if !add && adds {
            continue;
        }
        next.push(r);
    }
    if let Some(m) = opts.as_object_mut() {
        m.remove("dryRun");
    }
    next.push(if add {
        json!({"addVolumeOptions": opts})
    } else {
        json!({"removeVolumeOptions": opts})
    });
    if dry {
        return Ok((StatusCode::ACCEPTED, "").into_response());
    }
    app.settled
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(meta_str(&vm, "uid"));
    app.store.modify(&vm_key, |o| {
        if !o["status"].is_object() {
            o["status"] = json!({});
        }
        o["status"]["volumeRequests"] = json!(next);
    });
    Ok((StatusCode::ACCEPTED, "").into_response())
}

/// The claim or DataVolume a volume (or a hotplug volume source) names.
fn source_name(source: &Value) -> Option<&str> {
    source
        .pointer("/dataVolume/name")
        .or_else(|| source.pointer("/persistentVolumeClaim/claimName"))
        .and_then(Value::as_str)
}

fn hotpluggable(volume: &Value) -> bool {
    volume.pointer("/dataVolume/hotpluggable") == Some(&json!(true))
        || volume.pointer("/persistentVolumeClaim/hotpluggable") == Some(&json!(true))
}

/// `verifyVolumeOption` against the template's volumes.
fn verify(volumes: &[Value], add: bool, name: &str, opts: &Value) -> Result<(), String> {
    if add {
        let source = source_name(&opts["volumeSource"]).unwrap_or("");
        for v in volumes {
            if v["name"] == name {
                return Err(format!(
                    "Unable to add volume [{name}] because volume with that name already exists"
                ));
            }
            if !source.is_empty() && source_name(v) == Some(source) {
                return Err(format!(
                    "Unable to add volume source [{source}] because it already exists"
                ));
            }
        }
        return Ok(());
    }
    let found = volumes
        .iter()
        .find(|v| v["name"] == name || source_name(v) == Some(name));
    match found {
        Some(v) if !hotpluggable(v) => Err(format!(
            "Unable to remove volume [{}] because it is not hotpluggable",
            v["name"].as_str().unwrap_or(name)
        )),
        Some(_) => Ok(()),
        None => Err(format!(
            "Unable to remove volume [{name}] because it does not exist"
        )),
    }
}

/// Applies one volume request to a VM template or VMI spec (`ApplyVolumeRequestOnVMISpec`).
fn apply_on_spec(spec: &mut Value, request: &Value) {
    for list in ["volumes"] {
        if !spec[list].is_array() {
            spec[list] = json!([]);
        }
    }
    if !spec["domain"]["devices"]["disks"].is_array() {
        spec["domain"]["devices"]["disks"] = json!([]);
    }
    if let Some(add) = request.get("addVolumeOptions") {
        let name = add["name"].clone();
        let volumes = spec["volumes"].as_array_mut().expect("array");
        if !volumes.iter().any(|v| v["name"] == name) {
            let mut volume = add["volumeSource"].clone();
            volume["name"] = name.clone();
            volumes.push(volume);
        }
        let disks = spec["domain"]["devices"]["disks"]
            .as_array_mut()
            .expect("array");
        if !disks.iter().any(|d| d["name"] == name) {
            disks.push(add["disk"].clone());
        }
    } else if let Some(remove) = request.get("removeVolumeOptions") {
        let wanted = remove["name"].as_str().unwrap_or("");
        let volumes = spec["volumes"].as_array_mut().expect("array");
        let Some(i) = volumes
            .iter()
            .position(|v| v["name"] == wanted || source_name(v) == Some(wanted))
        else {
            return;
        };
        let removed = volumes.remove(i);
        spec["domain"]["devices"]["disks"]
            .as_array_mut()
            .expect("array")
            .retain(|d| d["name"] != removed["name"]);
    }
}

/// virt-controller's handling of `status.volumeRequests`: the template and the running VMI
/// get each request, then the list is cleared. Returns whether anything was applied.
pub fn apply_volume_requests(app: &App, vm: &Value) -> bool {
    let requests = vm
        .pointer("/status/volumeRequests")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if requests.is_empty() {
        return false;
    }
    let ns = meta_str(vm, "namespace");
    let name = meta_str(vm, "name");
    let vmi_key = Key::new(KV, "virtualmachineinstances", ns, name);
    if let Some(vmi) = app.store.get(&vmi_key).filter(|v| {
        !matches!(
            v.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        )
    }) {
        app.settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(meta_str(&vmi, "uid"));
        app.store.modify(&vmi_key, |o| {
            for r in &requests {
                apply_on_spec(&mut o["spec"], r);
            }
        });
    }
    app.store
        .modify(&Key::new(KV, "virtualmachines", ns, name), |o| {
            for r in &requests {
                apply_on_spec(&mut o["spec"]["template"]["spec"], r);
            }
            if let Some(st) = o["status"].as_object_mut() {
                st.remove("volumeRequests");
            }
        });
    true
}

/// Whether the claim behind a volume is there and usable: a bound PVC, or a DataVolume that
/// succeeded.
fn claim_ready(app: &App, ns: &str, volume: &Value) -> Result<(), String> {
    if let Some(dv) = volume.pointer("/dataVolume/name").and_then(Value::as_str) {
        let phase = app
            .store
            .get(&Key::new("cdi.kubevirt.io", "datavolumes", ns, dv))
            .and_then(|d| {
                d.pointer("/status/phase")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
        return match phase.as_deref() {
            Some("Succeeded") => Ok(()),
            Some(p) => Err(format!("DataVolume {dv} is in phase {p}")),
            None => Err(format!("DataVolume {dv} does not exist")),
        };
    }
    let claim = volume
        .pointer("/persistentVolumeClaim/claimName")
        .and_then(Value::as_str)
        .unwrap_or("");
    match app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, claim))
    {
        Some(p) if p.pointer("/status/phase") == Some(&json!("Bound")) => Ok(()),
        Some(_) => Err(format!("PVC {claim} is not bound")),
        None => Err(format!("PVC {claim} does not exist")),
    }
}

/// The size and access of a volume's claim, as `persistentVolumeClaimInfo`.
fn claim_info(app: &App, ns: &str, volume: &Value) -> Value {
    let claim = volume
        .pointer("/dataVolume/name")
        .or_else(|| volume.pointer("/persistentVolumeClaim/claimName"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let pvc = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, claim))
        .unwrap_or(json!({}));
    json!({
        "claimName": claim,
        "accessModes": pvc.pointer("/status/accessModes").cloned().unwrap_or(json!(["ReadWriteOnce"])),
        "volumeMode": pvc.pointer("/spec/volumeMode").cloned().unwrap_or(json!("Filesystem")),
        "capacity": pvc.pointer("/status/capacity").cloned().unwrap_or(json!({})),
        "requests": pvc.pointer("/spec/resources/requests").cloned().unwrap_or(json!({})),
        "filesystemOverhead": "0.055",
    })
}

/// The next free device name for `bus` among `used` targets (`sda`, `sdb`, … for SCSI and
/// SATA; `vda`, … for virtio).
fn next_target(bus: &str, used: &[String]) -> String {
    let prefix = if bus == "virtio" { "vd" } else { "sd" };
    (b'a'..=b'z')
        .map(|c| format!("{prefix}{}", c as char))
        .find(|t| !used.contains(t))
        .unwrap_or_else(|| format!("{prefix}z"))
}

/// One step of every hotplugged volume of a running VMI (a controller tick). Returns the new
/// `status.volumeStatus` when it changed.
pub fn volume_status(app: &App, vmi: &Value) -> Option<Value> {
    let ns = meta_str(vmi, "namespace");
    let statuses = vmi
        .pointer("/status/volumeStatus")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let volumes = vmi
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let disks = vmi
        .pointer("/spec/domain/devices/disks")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut used: Vec<String> = statuses
        .iter()
        .filter_map(|s| s["target"].as_str().map(str::to_owned))
        .collect();
    // Disks that are not hotplugged take the first names of their bus, in order.
    for d in &disks {
        let hot = volumes
            .iter()
            .any(|v| v["name"] == d["name"] && hotpluggable(v));
        if !hot {
            let bus = d
                .pointer("/disk/bus")
                .and_then(Value::as_str)
                .unwrap_or("virtio");
            let t = next_target(bus, &used);
            used.push(t);
        }
    }
    let mut out = vec![];
    let uid = meta_str(vmi, "uid");
    let attach_pod = format!("hp-volume-{}", uid.get(..5).unwrap_or("00000"));
    for s in &statuses {
        let still = volumes.iter().any(|v| v["name"] == s["name"]);
        if still || s.get("hotplugVolume").is_none() {
            continue;
        }
        // Removed: Detaching for one step, then gone.
        if s["phase"] != "Detaching" {
            let mut s = s.clone();
            s["phase"] = json!("Detaching");
            s["reason"] = json!("VolumeDetaching");
            s["message"] = json!(format!(
                "Volume {} is being detached from the virt-launcher pod",
                s["name"].as_str().unwrap_or("")
            ));
            out.push(s);
        }
    }
    for v in volumes.iter().filter(|v| hotpluggable(v)) {
        let name = v["name"].as_str().unwrap_or("");
        let current = statuses.iter().find(|s| s["name"] == name);
        let phase = current
            .and_then(|s| s["phase"].as_str())
            .unwrap_or("")
            .to_owned();
        let disk = disks.iter().find(|d| d["name"] == name);
        let bus = disk
            .and_then(|d| d.pointer("/disk/bus").or_else(|| d.pointer("/lun/bus")))
            .and_then(Value::as_str)
            .unwrap_or("scsi");
        let target = current
            .and_then(|s| s["target"].as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| {
                let t = next_target(bus, &used);
                used.push(t.clone());
                t
            });
        let (next, reason, message) = match claim_ready(app, ns, v) {
            Err(why) => ("Pending", "PVCNotReady", why),
            Ok(()) => match phase.as_str() {
                "" | "Pending" => (
                    "Bound",
                    "PVCBound",
                    format!("PVC is bound for volume {name}"),
                ),
                "Bound" => (
                    "AttachedToNode",
                    "SuccessfulCreate",
                    format!("Created hotplug attachment pod {attach_pod}, for volume {name}"),
                ),
                "AttachedToNode" => (
                    "MountedToPod",
                    "VolumeMountedToPod",
                    format!("Volume {name} has been mounted in virt-launcher pod"),
                ),
                _ => (
                    "Ready",
                    "VolumeReady",
                    format!("Successfully attach hotplugged volume {name} to VM"),
                ),
            },
        };
        let mut s = json!({
            "name": name,
            "target": target,
            "phase": next,
            "reason": reason,
            "message": message,
            "hotplugVolume": {"attachPodName": attach_pod, "attachPodUID": format!("{uid}-hp")},
        });
        if next != "Pending" {
            s["persistentVolumeClaimInfo"] = claim_info(app, ns, v);
        }
        out.push(s);
    }
    // Entries of disks that are not hotplugged stay as they were.
    let mut kept: Vec<Value> = statuses
        .iter()
        .filter(|s| s.get("hotplugVolume").is_none())
        .filter(|s| volumes.iter().any(|v| v["name"] == s["name"]))
        .cloned()
        .collect();
    kept.extend(out);
    let new = json!(kept);
    let old = json!(statuses);
    (new != old).then_some(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_follows_virt_api() {
        let volumes = vec![
            json!({"name": "rootdisk", "persistentVolumeClaim": {"claimName": "root"}}),
            json!({"name": "data", "persistentVolumeClaim": {"claimName": "data-pvc", "hotpluggable": true}}),
        ];
        let add = |name: &str, claim: &str| {
            json!({"name": name, "disk": {"disk": {"bus": "scsi"}},
                "volumeSource": {"persistentVolumeClaim": {"claimName": claim}}})
        };
        assert_eq!(
            verify(&volumes, true, "data", &add("data", "x")),
            Err("Unable to add volume [data] because volume with that name already exists".into())
        );
        assert_eq!(
            verify(&volumes, true, "other", &add("other", "root")),
            Err("Unable to add volume source [root] because it already exists".into())
        );
        assert!(verify(&volumes, true, "new", &add("new", "new-pvc")).is_ok());
        assert_eq!(
            verify(&volumes, false, "rootdisk", &json!({})),
            Err("Unable to remove volume [rootdisk] because it is not hotpluggable".into())
        );
        assert_eq!(
            verify(&volumes, false, "nope", &json!({})),
            Err("Unable to remove volume [nope] because it does not exist".into())
        );
        // By the claim's name too (volumeExists).
        assert!(verify(&volumes, false, "data-pvc", &json!({})).is_ok());
    }

    #[test]
    fn requests_change_the_spec() {
        let mut spec = json!({"domain": {"devices": {"disks": [{"name": "rootdisk"}]}},
            "volumes": [{"name": "rootdisk", "containerDisk": {"image": "x"}}]});
        apply_on_spec(
            &mut spec,
            &json!({"addVolumeOptions": {"name": "data", "disk": {"name": "data", "disk": {"bus": "scsi"}},
                "volumeSource": {"persistentVolumeClaim": {"claimName": "pvc", "hotpluggable": true}}}}),
        );
        assert_eq!(spec["volumes"][1]["name"], "data");
        assert_eq!(
            spec["volumes"][1]["persistentVolumeClaim"]["claimName"],
            "pvc"
        );
        assert_eq!(spec["domain"]["devices"]["disks"][1]["disk"]["bus"], "scsi");
        apply_on_spec(&mut spec, &json!({"removeVolumeOptions": {"name": "pvc"}}));
        assert_eq!(spec["volumes"].as_array().unwrap().len(), 1);
        assert_eq!(
            spec["domain"]["devices"]["disks"].as_array().unwrap().len(),
            1
        );
    }

    #[test]
    fn targets_follow_the_bus() {
        assert_eq!(next_target("scsi", &[]), "sda");
        assert_eq!(next_target("virtio", &["vda".into()]), "vdb");
    }
}
