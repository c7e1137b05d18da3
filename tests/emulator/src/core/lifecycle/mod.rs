//! VM lifecycle as the platforms run it: KubeVirt's `start`/`stop`/`restart`/`migrate` and VMI
//! `pause`/`unpause`/`softreboot` subresources (virt-api `pkg/virt-api/rest/lifecycle.go`, the
//! 409s of its handlers), run strategies with `status.stateChangeRequests`, VMI phases with a
//! virt-launcher pod, VirtualMachineInstanceMigrations, and Deckhouse VirtualMachineOperations.
//!
//! Every step of a controller waits one controller tick (`EmulatorOptions::import_step`), so
//! a start goes Pending → Scheduling → Scheduled → Running over a few ticks and a migration
//! over about ten. Fixture switches (annotations on the VM):
//! - `emulator.kubevm.io/unschedulable: "true"`: the VMI (Deckhouse: the VM) never gets a node.
//! - `emulator.kubevm.io/migration-fail: no-target | timeout`: migrations fail, with no node to
//!   go to or when the migration policy's completion timeout ends them.

use crate::core::app::App;
use crate::core::controllers::{NODE, launcher_pod, new_vmi, owner_ref, set_condition};
use crate::core::handlers::{Query, ResourcePath};
use crate::core::status::ApiError;
use crate::core::store::{Key, Propagation};
use crate::core::util::{meta_str, now_rfc3339, random_suffix};
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

mod deckhouse;
mod guest_exit;
#[cfg(test)]
mod guest_exit_tests;
mod kubevirt;
#[cfg(test)]
mod tests;

pub use deckhouse::{deckhouse_power, vmop};
pub use guest_exit::{
    DeckhouseAfterExit, FinalVmi, after_final_vmi, deckhouse_after_exit, deckhouse_grace,
    grace_period, guest_exited, kubevirt_grace,
};
pub use kubevirt::{kubevirt_printable, kubevirt_run, kubevirt_vmi, migration};

const KV: &str = "kubevirt.io";
const DH: &str = "virtualization.deckhouse.io";
/// Annotation: the VM can not be scheduled (fixture switch).
pub const UNSCHEDULABLE: &str = "emulator.kubevm.io/unschedulable";
/// Annotation: how migrations of this VM fail (fixture switch).
pub const MIGRATION_FAIL: &str = "emulator.kubevm.io/migration-fail";
/// Annotation on a VMI being shut down.
const STOPPING: &str = "emulator.kubevm.io/stopping";
/// Annotation on a Deckhouse VM: its power state as its operations left it.
const POWER: &str = "emulator.kubevm.io/power";
/// Annotation on a Deckhouse VM: the node it runs on after a migration.
const NODE_ANNOTATION: &str = "emulator.kubevm.io/node";
/// The scheduler's message for a pod no node fits (kube-scheduler wording).
pub const UNSCHEDULABLE_MESSAGE: &str = "0/2 nodes are available: 2 Insufficient memory. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.";
/// Why a migration with no target node fails.
pub const NO_TARGET_MESSAGE: &str = "target pod is unschedulable: 0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) were the source node";
/// Why a migration stopped by its policy's completion timeout fails.
pub const TIMEOUT_MESSAGE: &str =
    "Live migration is not completed after 150 sec and has been aborted";

fn annotation<'a>(obj: &'a Value, name: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(name))
        .and_then(Value::as_str)
}

fn set_annotation(obj: &mut Value, name: &str, value: Option<&str>) {
    let meta = crate::core::util::meta_mut(obj);
    let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
    if !annotations.is_object() {
        *annotations = json!({});
    }
    let map = annotations.as_object_mut().expect("object");
    match value {
        Some(v) => map.insert(name.into(), json!(v)),
        None => map.remove(name),
    };
}

/// Hands an object a fixture wrote back to the controllers: a client acted on it.
fn unsettle(app: &App, obj: &Value) {
    app.settled
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(meta_str(obj, "uid"));
}

fn conflict(message: impl Into<String>) -> ApiError {
    ApiError::new(409, "Conflict", message)
}

fn accepted() -> Response {
    (StatusCode::ACCEPTED, "").into_response()
}

fn ok() -> Response {
    (StatusCode::OK, "").into_response()
}

/// `dryRun: ["All"]` in an options body (or `?dryRun=All`).
fn dry_run(opts: &Value, q: &Query) -> bool {
    opts["dryRun"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == "All"))
        || q.get("dryRun").is_some_and(|v| v == "All")
}

fn phase(obj: &Value) -> &str {
    obj.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn is_final(vmi: &Value) -> bool {
    matches!(phase(vmi), "Succeeded" | "Failed")
}

/// The VM's run strategy: `spec.runStrategy`, else from the legacy `spec.running`.
pub fn run_strategy(vm: &Value) -> String {
    match vm.pointer("/spec/runStrategy").and_then(Value::as_str) {
        Some(rs) => rs.to_string(),
        None if vm.pointer("/spec/running").and_then(Value::as_bool) == Some(true) => {
            "Always".into()
        }
        None => "Halted".into(),
    }
}

fn state_requests(vm: &Value) -> Vec<Value> {
    vm.pointer("/status/stateChangeRequests")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Dispatches a lifecycle subresource; `None` when `sub` is not one.
pub fn action(
    app: &App,
    rp: &ResourcePath,
    sub: &str,
    q: &Query,
    body: &Bytes,
) -> Option<Result<Response, ApiError>> {
    if rp.group != "subresources.kubevirt.io" {
        return None;
    }
    let ns = rp.namespace.as_deref().unwrap_or("");
    let name = rp.name.as_deref().unwrap_or("");
    if (rp.plural.as_str(), sub) == ("virtualmachineinstances", "reset") {
        // Takes no options: the body is not read.
        return Some(reset(
            app,
            &Key::new(KV, "virtualmachineinstances", ns, name),
        ));
    }
    let opts: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return Some(Err(ApiError::bad_request(format!(
                    "Can not unmarshal Request body to struct, error: {e}"
                ))));
            }
        }
    };
    let dry = dry_run(&opts, q);
    let vm_key = Key::new(KV, "virtualmachines", ns, name);
    let vmi_key = Key::new(KV, "virtualmachineinstances", ns, name);
    let result = match (rp.plural.as_str(), sub) {
        ("virtualmachines", "start") => start(app, &vm_key, &vmi_key, &opts, dry),
        ("virtualmachines", "stop") => stop(app, &vm_key, &vmi_key, &opts, dry),
        ("virtualmachines", "restart") => restart(app, &vm_key, &vmi_key, &opts, dry),
        ("virtualmachines", "migrate") => migrate(app, &vm_key, &vmi_key, &opts, dry),
        ("virtualmachineinstances", "pause" | "unpause" | "softreboot") => {
            vmi_action(app, &vmi_key, sub, dry)
        }
        _ => return None,
    };
    Some(result)
}

fn live_vmi(app: &App, vmi_key: &Key) -> Option<Value> {
    app.store.get(vmi_key).filter(|v| !is_final(v))
}

/// `PUT …/start` (lifecycle.go `StartVMRequestHandler`).
fn start(
    app: &App,
    vm_key: &Key,
    vmi_key: &Key,
    opts: &Value,
    dry: bool,
) -> Result<Response, ApiError> {
    let vm = app.store.get(vm_key).expect("checked by the caller");
    let vmi = app.store.get(vmi_key);
    if let Some(v) = &vmi
        && !is_final(v)
        && !matches!(phase(v), "" | "Unknown")
    {
        return Err(conflict("VM is already running"));
    }
    let rs = run_strategy(&vm);
    let paused = opts["paused"] == true;
    let mut start_req = json!({"action": "Start"});
    if paused {
        start_req["data"] = json!({"paused": "true"});
    }
    let pending = !state_requests(&vm).is_empty();
    match rs.as_str() {
        "Always" | "Once" => {
            return Err(conflict(format!(
                "{rs} does not support manual start requests"
            )));
        }
        "RerunOnFailure" if vmi.as_ref().is_some_and(|v| phase(v) == "Failed") => {
            return Err(conflict(
                "RerunOnFailure does not support starting VM from failed state",
            ));
        }
        _ if pending => {
            return Err(conflict(
                "unable to complete request: stop/start already underway",
            ));
        }
        _ => {}
    }
    if dry {
        return Ok(accepted());
    }
    unsettle(app, &vm);
    app.store.modify(vm_key, |o| match rs.as_str() {
        "Halted" => {
            o["spec"]["runStrategy"] = json!("Always");
            if paused {
                o["status"]["stateChangeRequests"] = json!([start_req]);
            }
        }
        _ => {
            let mut reqs = vec![];
            if let Some(v) = vmi.as_ref().filter(|v| is_final(v)) {
                reqs.push(json!({"action": "Stop", "uid": v["metadata"]["uid"]}));
            }
            reqs.push(start_req);
            o["status"]["stateChangeRequests"] = json!(reqs);
        }
    });
    Ok(accepted())
}

/// `PUT …/stop` (lifecycle.go `StopVMRequestHandler`).
fn stop(
    app: &App,
    vm_key: &Key,
    vmi_key: &Key,
    opts: &Value,
    dry: bool,
) -> Result<Response, ApiError> {
    let vm = app.store.get(vm_key).expect("checked by the caller");
    let vmi = live_vmi(app, vmi_key);
    let rs = run_strategy(&vm);
    let grace = opts["gracePeriod"].as_i64();
    if vmi.is_none() && matches!(rs.as_str(), "Halted" | "Manual" | "RerunOnFailure") {
        return Err(conflict("VM is not running"));
    }
    if rs == "Halted" {
        // Only a VMI that has a grace period of its own limits the new one: upstream compares
        // with it only when `vmi.Spec.TerminationGracePeriodSeconds != nil`.
        let current = vmi
            .as_ref()
            .and_then(|v| v.pointer("/spec/terminationGracePeriodSeconds"))
            .and_then(Value::as_i64);
        if grace.is_none_or(|g| current.is_some_and(|c| g >= c)) {
            return Err(conflict(
                "Halted only supports manual stop requests with a shorter graceperiod",
            ));
        }
    }
    if matches!(rs.as_str(), "Manual" | "RerunOnFailure") && !state_requests(&vm).is_empty() {
        return Err(conflict(
            "unable to complete request: stop/start already underway",
        ));
    }
    if dry {
        return Ok(accepted());
    }
    unsettle(app, &vm);
    if let (Some(g), Some(v)) = (grace, &vmi) {
        unsettle(app, v);
        app.store.modify(vmi_key, |o| {
            o["spec"]["terminationGracePeriodSeconds"] = json!(g);
        });
    }
    app.store.modify(vm_key, |o| match rs.as_str() {
        "Always" | "Once" => o["spec"]["runStrategy"] = json!("Halted"),
        "Halted" => {}
        _ => {
            o["status"]["stateChangeRequests"] = json!([{"action": "Stop",
                "uid": vmi.as_ref().map(|v| v["metadata"]["uid"].clone()).unwrap_or(Value::Null)}]);
        }
    });
    Ok(accepted())
}

/// `PUT …/restart` (lifecycle.go `RestartVMRequestHandler`).
fn restart(
    app: &App,
    vm_key: &Key,
    vmi_key: &Key,
    opts: &Value,
    dry: bool,
) -> Result<Response, ApiError> {
    let vm = app.store.get(vm_key).expect("checked by the caller");
    let grace = opts["gracePeriodSeconds"].as_i64();
    if grace.is_some_and(|g| g > 0) {
        return Err(ApiError::bad_request(
            "For force restart, only gracePeriod=0 is supported for now",
        ));
    }
    let rs = run_strategy(&vm);
    if matches!(rs.as_str(), "Halted" | "Once") {
        return Err(conflict(format!(
            "RunStategy {rs} does not support manual restart requests"
        )));
    }
    let Some(vmi) = live_vmi(app, vmi_key) else {
        let printable = vm
            .pointer("/status/printableStatus")
            .and_then(Value::as_str)
            .unwrap_or("Stopped");
        return Err(conflict(format!("VM is not running: {printable}")));
    };
    if !state_requests(&vm).is_empty() {
        return Err(conflict(
            "unable to complete request: stop/start already underway",
        ));
    }
    if dry {
        return Ok(accepted());
    }
    unsettle(app, &vm);
    unsettle(app, &vmi);
    if grace == Some(0) {
        // A forced restart shortens the shutdown to 1 s (lifecycle.go).
        app.store.modify(vmi_key, |o| {
            o["spec"]["terminationGracePeriodSeconds"] = json!(1);
        });
    }
    app.store.modify(vm_key, |o| {
        o["status"]["stateChangeRequests"] = json!([
            {"action": "Stop", "uid": vmi["metadata"]["uid"]},
            {"action": "Start"}
        ]);
    });
    Ok(accepted())
}

/// The non-final migrations of VMI `name` in `ns`.
fn active_migrations(app: &App, ns: &str, name: &str) -> Vec<Value> {
    let (all, _) = app
        .store
        .list(KV, "virtualmachineinstancemigrations", Some(ns));
    all.into_iter()
        .filter(|m| m.pointer("/spec/vmiName").and_then(Value::as_str) == Some(name))
        .filter(|m| !matches!(phase(m), "Succeeded" | "Failed"))
        .collect()
}

/// `PUT …/migrate` (lifecycle.go `MigrateVMRequestHandler`): creates a VMIM
/// `kubevirt-migrate-vm-…` the response does not name, labelled by the mutating webhook.
fn migrate(
    app: &App,
    vm_key: &Key,
    vmi_key: &Key,
    opts: &Value,
    dry: bool,
) -> Result<Response, ApiError> {
    let Some(vmi) = app.store.get(vmi_key).filter(|v| phase(v) == "Running") else {
        return Err(conflict("VM is not running"));
    };
    let name = meta_str(&vmi, "name").to_string();
    let ns = meta_str(&vmi, "namespace").to_string();
    // migration-create-admitter.go
    if let Some(active) = active_migrations(app, &ns, &name).first() {
        return Err(ApiError::new(
            400,
            "BadRequest",
            format!(
                "admission webhook \"migration-create-validator.kubevirt.io\" denied the request: in-flight migration detected. Active migration job ({}) is currently already in progress for VMI {name}.",
                meta_str(active, "uid")
            ),
        ));
    }
    let _ = vm_key;
    let mut spec = json!({"vmiName": name});
    if let Some(sel) = opts.get("addedNodeSelector").filter(|s| s.is_object()) {
        spec["addedNodeSelector"] = sel.clone();
    }
    if dry {
        return Ok(accepted());
    }
    let vmim = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": format!("kubevirt-migrate-vm-{}", random_suffix(5)), "namespace": ns,
                     "labels": {"kubevirt.io/vmi-name": name},
                     "finalizers": ["kubevirt.io/migrationJobFinalize"]},
        "spec": spec,
    });
    app.store
        .create(KV, "virtualmachineinstancemigrations", vmim)
        .map_err(|e| ApiError::internal(format!("{e:?}")))?;
    Ok(accepted())
}

fn is_paused(vmi: &Value) -> bool {
    crate::core::table::eval_first(vmi, ".status.conditions[?(@.type=='Paused')].status")
        == Some(&json!("True"))
}

/// `PUT virtualmachineinstances/…/{pause,unpause,softreboot}` (rest/subresource.go).
fn vmi_action(app: &App, vmi_key: &Key, sub: &str, dry: bool) -> Result<Response, ApiError> {
    let vmi = app.store.get(vmi_key).expect("checked by the caller");
    if phase(&vmi) != "Running" {
        return Err(conflict("VMI is not running"));
    }
    let paused = is_paused(&vmi);
    match sub {
        "pause" if paused => return Err(conflict("VMI is already paused")),
        "unpause" if !paused => return Err(conflict("VMI is not paused")),
        "softreboot" if paused => return Err(conflict("VMI is paused")),
        _ => {}
    }
    if dry {
        return Ok(ok());
    }
    unsettle(app, &vmi);
    match sub {
        "pause" => {
            app.store.modify(vmi_key, |o| {
                let mut st = o["status"].clone();
                set_condition(
                    &mut st,
                    "Paused",
                    true,
                    "PausedByUser",
                    "VMI was paused by user",
                );
                o["status"] = st;
            });
        }
        "unpause" => {
            app.store.modify(vmi_key, |o| {
                if let Some(c) = o["status"]["conditions"].as_array_mut() {
                    c.retain(|c| c["type"] != "Paused");
                }
            });
        }
        _ => {}
    }
    if let Some(vm) = app.store.get(&Key::new(
        KV,
        "virtualmachines",
        &vmi_key.namespace,
        &vmi_key.name,
    )) {
        unsettle(app, &vm);
    }
    Ok(ok())
}

/// `PUT virtualmachineinstances/…/reset` (rest/subresource.go `ResetVMI`): no validation of
/// its own; virt-api cannot reach virt-handler for an instance that is neither Running nor
/// Scheduled, and says so as a 400 with the phase. Then virt-handler resets the domain.
fn reset(app: &App, vmi_key: &Key) -> Result<Response, ApiError> {
    let vmi = app.store.get(vmi_key).expect("checked by the caller");
    let phase = phase(&vmi);
    if !matches!(phase, "Running" | "Scheduled") {
        return Err(ApiError::bad_request(format!(
            "Failed to reset non-running VMI with phase {phase}: Unable to connect to VirtualMachineInstance because phase is {phase} instead of Running or Scheduled"
        )));
    }
    match app.guests.reset_one(&vmi_key.namespace, &vmi_key.name) {
        Ok(_) => Ok(ok()),
        Err(e) => Err(ApiError::new(500, "InternalError", e.to_string())),
    }
}

/// A schedulable node other than `source` that has every label in `selector`.
fn pick_target(app: &App, source: &str, selector: Option<&Value>) -> Option<String> {
    let (nodes, _) = app.store.list("", "nodes", None);
    nodes
        .iter()
        .filter(|n| meta_str(n, "name") != source)
        .filter(|n| {
            selector.and_then(Value::as_object).is_none_or(|sel| {
                sel.iter()
                    .all(|(k, v)| n.pointer("/metadata/labels").and_then(|l| l.get(k)) == Some(v))
            })
        })
        .map(|n| meta_str(n, "name").to_string())
        .next()
}
