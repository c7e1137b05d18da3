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

use crate::app::App;
use crate::controllers::{NODE, launcher_pod, new_vmi, owner_ref, set_condition};
use crate::handlers::{Query, ResourcePath};
use crate::status::ApiError;
use crate::store::{Key, Propagation};
use crate::util::{meta_str, now_rfc3339, random_suffix};
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

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
    let meta = crate::util::meta_mut(obj);
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
        let current = vmi
            .as_ref()
            .and_then(|v| v.pointer("/spec/terminationGracePeriodSeconds"))
            .and_then(Value::as_i64)
            .unwrap_or(180);
        if grace.is_none_or(|g| g >= current) {
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
    crate::table::eval_first(vmi, ".status.conditions[?(@.type=='Paused')].status")
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

// ---------------------------------------------------------------------------------------------
// KubeVirt controllers

/// What the VM controller does with the VMI (virt-controller `vm.go` `syncRunStrategy`):
/// handles `status.stateChangeRequests` first, then the run strategy. Returns the VMI after.
pub fn kubevirt_run(app: &App, vm: &Value, provisioning: bool) -> Option<Value> {
    let ns = meta_str(vm, "namespace");
    let name = meta_str(vm, "name");
    let vm_key = Key::of(KV, "virtualmachines", vm);
    let vmi_key = Key::new(KV, "virtualmachineinstances", ns, name);
    let vmi = app.store.get(&vmi_key);
    let rs = run_strategy(vm);
    let requests = state_requests(vm);
    if let Some(first) = requests.first() {
        match first["action"].as_str() {
            Some("Stop") => {
                match &vmi {
                    Some(v) if first["uid"].is_null() || first["uid"] == v["metadata"]["uid"] => {
                        shut_down(app, &vmi_key, v);
                    }
                    _ => {
                        pop_request(app, &vm_key);
                    }
                }
                return app.store.get(&vmi_key);
            }
            Some("Start") => {
                if vmi.is_none() && !provisioning {
                    let paused =
                        first.pointer("/data/paused").and_then(Value::as_str) == Some("true");
                    let created = create_vmi(app, vm, paused);
                    pop_request(app, &vm_key);
                    return created;
                }
                if vmi.as_ref().is_some_and(|v| !is_final(v)) {
                    pop_request(app, &vm_key);
                }
                return vmi;
            }
            _ => pop_request(app, &vm_key),
        }
    }
    let once_done = annotation(vm, "emulator.kubevm.io/ran-once").is_some();
    let want = match rs.as_str() {
        "Always" => true,
        "RerunOnFailure" => vmi.as_ref().is_none_or(|v| phase(v) != "Succeeded"),
        "Once" => vmi.as_ref().map_or(!once_done, |v| !is_final(v)),
        "Manual" => vmi.is_some(),
        _ => false,
    };
    match &vmi {
        None if want && !provisioning => {
            if rs == "Once" {
                app.store.modify(&vm_key, |o| {
                    set_annotation(o, "emulator.kubevm.io/ran-once", Some("true"))
                });
            }
            create_vmi(app, vm, false)
        }
        Some(v) if !want && owned(v, vm) && !is_final(v) => {
            shut_down(app, &vmi_key, v);
            app.store.get(&vmi_key)
        }
        // A failed VMI is replaced under Always and RerunOnFailure.
        Some(v)
            if want
                && phase(v) == "Failed"
                && matches!(rs.as_str(), "Always" | "RerunOnFailure") =>
        {
            app.store.delete(&vmi_key, Propagation::Cascade);
            None
        }
        _ => vmi,
    }
}

fn owned(vmi: &Value, vm: &Value) -> bool {
    vmi.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|r| r.iter().any(|r| r["uid"] == vm["metadata"]["uid"]))
}

fn pop_request(app: &App, vm_key: &Key) {
    app.store.modify(vm_key, |o| {
        if let Some(reqs) = o["status"]["stateChangeRequests"].as_array_mut() {
            if !reqs.is_empty() {
                reqs.remove(0);
            }
            if reqs.is_empty() {
                o["status"]
                    .as_object_mut()
                    .expect("object")
                    .remove("stateChangeRequests");
            }
        }
    });
}

/// Begins a graceful shutdown: the VMI keeps running for one more tick, then goes.
fn shut_down(app: &App, vmi_key: &Key, vmi: &Value) {
    if annotation(vmi, STOPPING).is_none() {
        unsettle(app, vmi);
        app.store.modify(vmi_key, |o| {
            set_annotation(o, STOPPING, Some(&now_rfc3339()))
        });
    }
}

fn create_vmi(app: &App, vm: &Value, paused: bool) -> Option<Value> {
    let mut vmi = new_vmi(vm);
    vmi["status"] = json!({"phase": "Pending",
        "phaseTransitionTimestamps": [{"phase": "Pending", "phaseTransitionTimestamp": now_rfc3339()}]});
    if paused {
        vmi["spec"]["startStrategy"] = json!("Paused");
    }
    if annotation(vm, UNSCHEDULABLE) == Some("true") {
        set_annotation(&mut vmi, UNSCHEDULABLE, Some("true"));
    }
    app.store.create(KV, "virtualmachineinstances", vmi).ok()
}

/// VMI phases, one per tick: Pending → Scheduling (virt-launcher pod Pending) → Scheduled →
/// Running (pod Running). A VMI being stopped goes at the next tick, pod and all.
pub fn kubevirt_vmi(app: &App, vmi: &Value, tick: bool) {
    if !tick {
        return;
    }
    let key = Key::of(KV, "virtualmachineinstances", vmi);
    if annotation(vmi, STOPPING).is_some() {
        delete_launcher_pods(app, vmi);
        app.store.delete(&key, Propagation::Cascade);
        return;
    }
    let next = match phase(vmi) {
        "Pending" => "Scheduling",
        "Scheduling" if annotation(vmi, UNSCHEDULABLE) == Some("true") => {
            app.store.modify(&key, |o| {
                let mut st = o["status"].clone();
                set_condition(
                    &mut st,
                    "PodScheduled",
                    false,
                    "Unschedulable",
                    UNSCHEDULABLE_MESSAGE,
                );
                o["status"] = st;
            });
            return;
        }
        "Scheduling" => "Scheduled",
        "Scheduled" => "Running",
        _ => return,
    };
    if next == "Scheduling" {
        let mut pod = launcher_pod(vmi);
        pod["status"] = json!({"phase": "Pending"});
        let _ = app.store.create("", "pods", pod);
    }
    let template = new_vmi_status_running(vmi);
    app.store.modify(&key, |o| {
        let mut st = if next == "Running" {
            template
        } else {
            o["status"].clone()
        };
        st["phase"] = json!(next);
        let mut ts = o["status"]["phaseTransitionTimestamps"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ts.push(json!({"phase": next, "phaseTransitionTimestamp": now_rfc3339()}));
        st["phaseTransitionTimestamps"] = json!(ts);
        if next == "Running"
            && o.pointer("/spec/startStrategy").and_then(Value::as_str) == Some("Paused")
        {
            set_condition(
                &mut st,
                "Paused",
                true,
                "PausedStartStrategy",
                "VMI was paused by user",
            );
        }
        o["status"] = st;
    });
    if next == "Running" {
        let (pods, _) = app.store.list("", "pods", Some(meta_str(vmi, "namespace")));
        for p in pods.iter().filter(|p| owned(p, vmi)) {
            app.store.modify(&Key::of("", "pods", p), |o| {
                let ip = vmi
                    .pointer("/status/interfaces/0/ipAddress")
                    .cloned()
                    .unwrap_or(json!(""));
                o["status"] = json!({"phase": "Running", "podIP": ip, "hostIP": "192.168.0.11",
                    "containerStatuses": [{"name": "compute", "ready": true, "restartCount": 0,
                        "image": "quay.io/kubevirt/virt-launcher:v1.9.0"}]});
            });
        }
    }
}

/// The status of a running VMI as `new_vmi` builds it.
fn new_vmi_status_running(vmi: &Value) -> Value {
    let vm_like = json!({"metadata": {"name": vmi["metadata"]["name"], "namespace": vmi["metadata"]["namespace"],
        "uid": vmi["metadata"]["uid"]}, "spec": {"template": {"spec": vmi["spec"]}}});
    new_vmi(&vm_like)["status"].clone()
}

/// The printable status of a VM from its VMI (virt-controller `vm.go` `setPrintableStatus`).
pub fn kubevirt_printable(vm: &Value, vmi: Option<&Value>) -> &'static str {
    let rs = run_strategy(vm);
    match vmi {
        None => "Stopped",
        Some(v) if annotation(v, STOPPING).is_some() => "Stopping",
        Some(v) if is_paused(v) => "Paused",
        Some(v) => match phase(v) {
            "Running" => "Running",
            "Succeeded" | "Failed" if rs == "Halted" || rs == "Manual" => "Stopped",
            "Failed" => "CrashLoopBackOff",
            "Succeeded" => "Stopped",
            "Scheduling" | "Pending"
                if crate::table::eval_first(
                    v,
                    ".status.conditions[?(@.type=='PodScheduled')].reason",
                ) == Some(&json!("Unschedulable")) =>
            {
                "ErrorUnschedulable"
            }
            _ => "Starting",
        },
    }
}

/// VirtualMachineInstanceMigration, one phase per tick: Pending → Scheduling → Scheduled →
/// PreparingTarget → TargetReady → Running (a few ticks) → Succeeded, moving the VMI's
/// `status.nodeName` and launcher pod, with `status.migrationState` on the VMI and the VMIM.
pub fn migration(app: &App, vmim: &Value, tick: bool) {
    let key = Key::of(KV, "virtualmachineinstancemigrations", vmim);
    let ns = meta_str(vmim, "namespace");
    let vmi_name = vmim
        .pointer("/spec/vmiName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let vmi_key = Key::new(KV, "virtualmachineinstances", ns, vmi_name);
    let current = phase(vmim).to_string();
    if current.is_empty() {
        // The mutating webhook's label, if the client created the VMIM itself.
        app.store.modify(&key, |o| {
            o["metadata"]["labels"]["kubevirt.io/vmi-name"] = json!(vmi_name);
            o["status"] = json!({"phase": "Pending", "phaseTransitionTimestamps":
                [{"phase": "Pending", "phaseTransitionTimestamp": now_rfc3339()}]});
        });
        return;
    }
    if !tick || matches!(current.as_str(), "Succeeded" | "Failed") {
        return;
    }
    let Some(vmi) = app.store.get(&vmi_key) else {
        fail_migration(app, &key, &vmi_key, "VMI does not exist");
        return;
    };
    let vm = app
        .store
        .get(&Key::new(KV, "virtualmachines", ns, vmi_name));
    let fail_mode = vm
        .as_ref()
        .and_then(|v| annotation(v, MIGRATION_FAIL))
        .unwrap_or("")
        .to_string();
    let source = vmi
        .pointer("/status/nodeName")
        .and_then(Value::as_str)
        .unwrap_or(NODE)
        .to_string();
    let target = pick_target(app, &source, vmim.pointer("/spec/addedNodeSelector"));
    let step = vmim
        .pointer("/status/migrationState/emulatorStep")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let next = match current.as_str() {
        "Pending" => "Scheduling",
        "Scheduling" if target.is_none() || fail_mode == "no-target" => {
            fail_migration(app, &key, &vmi_key, NO_TARGET_MESSAGE);
            return;
        }
        "Scheduling" => "Scheduled",
        "Scheduled" => "PreparingTarget",
        "PreparingTarget" => "TargetReady",
        "TargetReady" => "Running",
        "Running" if fail_mode == "timeout" && step >= 2 => {
            fail_migration(app, &key, &vmi_key, TIMEOUT_MESSAGE);
            return;
        }
        "Running" if step < 3 => "Running",
        "Running" => "Succeeded",
        _ => return,
    };
    let target = target.unwrap_or_default();
    let uid = meta_str(vmim, "uid").to_string();
    let now = now_rfc3339();
    let mut state = vmi
        .pointer("/status/migrationState")
        .filter(|s| s["migrationUid"] == json!(uid))
        .cloned()
        .unwrap_or_else(|| {
            json!({"migrationUid": uid, "sourceNode": source, "startTimestamp": now,
            "mode": "PreCopy", "sourcePod": format!("virt-launcher-{vmi_name}")})
        });
    if matches!(
        next,
        "Scheduled" | "PreparingTarget" | "TargetReady" | "Running" | "Succeeded"
    ) {
        state["targetNode"] = json!(target);
        state["targetPod"] = json!(format!("virt-launcher-{vmi_name}-target"));
    }
    if next == "Succeeded" {
        state["completed"] = json!(true);
        state["endTimestamp"] = json!(now);
    }
    unsettle(app, &vmi);
    app.store.modify(&vmi_key, |o| {
        o["status"]["migrationState"] = state.clone();
        if next == "Succeeded" {
            o["status"]["nodeName"] = json!(target);
            o["metadata"]["labels"]["kubevirt.io/nodeName"] = json!(target);
        }
    });
    if next == "Succeeded" {
        move_launcher_pod(app, &vmi, &target);
    }
    app.store.modify(&key, |o| {
        let mut st = o["status"].clone();
        if st["phase"] != json!(next) {
            let mut ts = st["phaseTransitionTimestamps"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            ts.push(json!({"phase": next, "phaseTransitionTimestamp": now}));
            st["phaseTransitionTimestamps"] = json!(ts);
        }
        st["phase"] = json!(next);
        let mut s = state.clone();
        if next == "Running" {
            s["emulatorStep"] = json!(step + 1);
        }
        st["migrationState"] = s;
        o["status"] = st;
    });
}

fn fail_migration(app: &App, key: &Key, vmi_key: &Key, reason: &str) {
    let now = now_rfc3339();
    let uid = app
        .store
        .get(key)
        .map(|m| meta_str(&m, "uid").to_string())
        .unwrap_or_default();
    app.store.modify(vmi_key, |o| {
        let mut state = o["status"]["migrationState"].clone();
        if state["migrationUid"] != json!(uid) {
            state = json!({"migrationUid": uid, "startTimestamp": now,
                "sourceNode": o["status"]["nodeName"]});
        }
        state["failed"] = json!(true);
        state["completed"] = json!(true);
        state["failureReason"] = json!(reason);
        state["endTimestamp"] = json!(now);
        o["status"]["migrationState"] = state;
    });
    app.store.modify(key, |o| {
        let mut st = o["status"].clone();
        let mut ts = st["phaseTransitionTimestamps"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ts.push(json!({"phase": "Failed", "phaseTransitionTimestamp": now}));
        st["phaseTransitionTimestamps"] = json!(ts);
        st["phase"] = json!("Failed");
        let mut state = st["migrationState"].clone();
        if !state.is_object() {
            state = json!({"migrationUid": uid});
        }
        state["failed"] = json!(true);
        state["failureReason"] = json!(reason);
        st["migrationState"] = state;
        set_condition(&mut st, "Failed", true, "MigrationFailed", reason);
        o["status"] = st;
    });
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

/// Deletes the VMI's virt-launcher pods: those it owns, and (for fixtures written without
/// ownerReferences) those labelled `kubevirt.io: virt-launcher` with its name.
fn delete_launcher_pods(app: &App, vmi: &Value) {
    let ns = meta_str(vmi, "namespace");
    let name = meta_str(vmi, "name");
    let (pods, _) = app.store.list("", "pods", Some(ns));
    for p in pods.iter().filter(|p| {
        owned(p, vmi)
            || (p.pointer("/metadata/labels/kubevirt.io") == Some(&json!("virt-launcher"))
                && p.pointer("/metadata/labels/vm.kubevirt.io~1name") == Some(&json!(name)))
    }) {
        app.store
            .delete(&Key::of("", "pods", p), Propagation::Cascade);
    }
}

/// After a migration the VMI runs in a new virt-launcher pod on the target node.
fn move_launcher_pod(app: &App, vmi: &Value, target: &str) {
    let ns = meta_str(vmi, "namespace");
    let (pods, _) = app.store.list("", "pods", Some(ns));
    for p in pods.iter().filter(|p| owned(p, vmi)) {
        app.store
            .delete(&Key::of("", "pods", p), Propagation::Cascade);
    }
    let mut pod = launcher_pod(vmi);
    pod["metadata"]["name"] = json!(format!(
        "virt-launcher-{}-{}",
        meta_str(vmi, "name"),
        random_suffix(5)
    ));
    pod["spec"]["nodeName"] = json!(target);
    let _ = app.store.create("", "pods", pod);
}

// ---------------------------------------------------------------------------------------------
// Deckhouse

/// The phase of a Deckhouse VM whose disks are ready, from its operations' power annotation
/// and its runPolicy.
pub fn deckhouse_power(vm: &Value) -> (&'static str, String) {
    let node = annotation(vm, NODE_ANNOTATION).unwrap_or(NODE).to_string();
    let policy = vm
        .pointer("/spec/runPolicy")
        .and_then(Value::as_str)
        .unwrap_or("AlwaysOnUnlessStoppedManually");
    let phase = match annotation(vm, POWER) {
        Some("starting") => "Starting",
        Some("stopping") => "Stopping",
        Some("migrating") => "Migrating",
        Some("off") => "Stopped",
        Some(_) => "Running",
        None if matches!(policy, "AlwaysOn" | "AlwaysOnUnlessStoppedManually") => "Running",
        None => "Stopped",
    };
    (phase, node)
}

fn vmop_terminal(op: &Value) -> bool {
    matches!(phase(op), "Completed" | "Failed" | "Superseded")
}

/// Whether an operation of type `new` supersedes an active one of type `old` (user guide,
/// "Startup policy and VM state management"; FACTS §10).
fn supersedes(new: &Value, old: &Value) -> bool {
    let t = |o: &Value| {
        o.pointer("/spec/type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let forced = |o: &Value| o.pointer("/spec/force").and_then(Value::as_bool) == Some(true);
    match (t(new).as_str(), t(old).as_str()) {
        ("Stop", "Start") => true,
        ("Stop", "Stop") => forced(new),
        ("Restart", "Migrate" | "Evict") => true,
        _ => false,
    }
}

fn vmop_status(
    op: &mut Value,
    phase: &str,
    completed: bool,
    reason: &str,
    message: &str,
    progress: Option<&str>,
) {
    let mut st = op["status"].clone();
    if !st.is_object() {
        st = json!({});
    }
    st["phase"] = json!(phase);
    st["observedGeneration"] = op["metadata"]["generation"].clone();
    if let Some(p) = progress {
        st["progress"] = json!(p);
    }
    set_condition(&mut st, "Completed", completed, reason, message);
    op["status"] = st;
}

/// VirtualMachineOperation: Pending → InProgress → Completed (or Failed with a reason); a
/// newer compatible operation supersedes an active one, an incompatible one fails.
pub fn vmop(app: &App, op: &Value, tick: bool) {
    if vmop_terminal(op) {
        return;
    }
    let key = Key::of(DH, "virtualmachineoperations", op);
    let ns = meta_str(op, "namespace");
    let vm_name = op
        .pointer("/spec/virtualMachineName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let op_type = op
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let vm_key = Key::new(DH, "virtualmachines", ns, vm_name);
    let fail = |reason: &str, message: &str| {
        app.store.modify(&key, |o| {
            vmop_status(o, "Failed", false, reason, message, None)
        });
    };
    if phase(op).is_empty() {
        let Some(vm) = app.store.get(&vm_key) else {
            fail(
                "VirtualMachineNotFound",
                &format!("VirtualMachine {vm_name:?} not found"),
            );
            return;
        };
        // One active operation per VM: supersede it or fail.
        let (ops, _) = app.store.list(DH, "virtualmachineoperations", Some(ns));
        for other in ops.iter().filter(|o| {
            meta_str(o, "uid") != meta_str(op, "uid")
                && o.pointer("/spec/virtualMachineName") == op.pointer("/spec/virtualMachineName")
                && !vmop_terminal(o)
                && !phase(o).is_empty()
        }) {
            if supersedes(op, other) {
                let msg = format!(
                    "The operation has been superseded by the {op_type} operation {:?}",
                    meta_str(op, "name")
                );
                app.store
                    .modify(&Key::of(DH, "virtualmachineoperations", other), |o| {
                        vmop_status(o, "Superseded", false, "Superseded", &msg, None)
                    });
            } else {
                fail(
                    "NotReadyToBeExecuted",
                    &format!(
                        "Waiting for the active operation {:?} to finish; create this operation again after it",
                        meta_str(other, "name")
                    ),
                );
                return;
            }
        }
        let (vm_phase, _) = deckhouse_power(&vm);
        let policy = vm
            .pointer("/spec/runPolicy")
            .and_then(Value::as_str)
            .unwrap_or("AlwaysOnUnlessStoppedManually");
        let bad = match op_type.as_str() {
            "Start" if policy == "AlwaysOff" => Some(("NotApplicableForVirtualMachineRunPolicy",
                "The Start operation cannot be performed for a virtual machine with runPolicy AlwaysOff".to_string())),
            "Start" if vm_phase == "Running" => Some(("NotApplicableForVirtualMachinePhase",
                format!("The Start operation cannot be performed for a virtual machine in phase {vm_phase}"))),
            "Stop" | "Restart" | "Migrate" | "Evict" if vm_phase == "Stopped" => Some(("NotApplicableForVirtualMachinePhase",
                format!("The {op_type} operation cannot be performed for a virtual machine in phase {vm_phase}"))),
            "Migrate" | "Evict" if vm.pointer("/spec/liveMigrationPolicy").and_then(Value::as_str) == Some("Manual") =>
                Some(("NotApplicableForLiveMigrationPolicy", "The live migration policy does not allow migration".to_string())),
            _ => None,
        };
        if let Some((reason, message)) = bad {
            fail(reason, &message);
            return;
        }
        let progress = matches!(op_type.as_str(), "Migrate" | "Evict").then_some("0%");
        app.store.modify(&key, |o| {
            vmop_status(
                o,
                "Pending",
                false,
                "NotReadyToBeExecuted",
                "The operation is waiting to be executed",
                progress,
            )
        });
        return;
    }
    if !tick {
        return;
    }
    let Some(vm) = app.store.get(&vm_key) else {
        fail(
            "VirtualMachineNotFound",
            &format!("VirtualMachine {vm_name:?} not found"),
        );
        return;
    };
    unsettle(app, &vm);
    let set_power = |power: Option<&str>, node: Option<&str>| {
        app.store.modify(&vm_key, |o| {
            set_annotation(o, POWER, power);
            if let Some(n) = node {
                set_annotation(o, NODE_ANNOTATION, Some(n));
            }
        });
    };
    let in_progress = |reason: &str, progress: Option<&str>| {
        app.store.modify(&key, |o| {
            vmop_status(o, "InProgress", false, reason, "", progress)
        });
    };
    let complete = |progress: Option<&str>| {
        app.store.modify(&key, |o| {
            vmop_status(o, "Completed", true, "OperationCompleted", "", progress)
        });
    };
    let (vm_phase, node) = deckhouse_power(&vm);
    let unschedulable = annotation(&vm, UNSCHEDULABLE) == Some("true");
    match (op_type.as_str(), phase(op)) {
        ("Start", "Pending") => {
            set_power(Some("starting"), None);
            in_progress("StartInProgress", None);
        }
        ("Start", _) if unschedulable => {}
        ("Start", _) => {
            set_power(Some("on"), None);
            complete(None);
        }
        ("Stop", "Pending") => {
            set_power(Some("stopping"), None);
            in_progress("StopInProgress", None);
        }
        ("Stop", _) => {
            set_power(Some("off"), None);
            complete(None);
        }
        ("Restart", "Pending") => {
            set_power(Some("stopping"), None);
            in_progress("RestartInProgress", None);
        }
        ("Restart", _) if vm_phase == "Stopping" => set_power(Some("starting"), None),
        ("Restart", _) => {
            set_power(Some("on"), None);
            complete(None);
        }
        ("Migrate" | "Evict", _) => {
            let pct = op
                .pointer("/status/progress")
                .and_then(Value::as_str)
                .and_then(|p| p.trim_end_matches('%').parse::<u32>().ok())
                .unwrap_or(0);
            let fail_mode = annotation(&vm, MIGRATION_FAIL).unwrap_or("");
            let selector = op.pointer("/spec/migrate/nodeSelector");
            let target = pick_target(app, &node, selector);
            if target.is_none() || fail_mode == "no-target" {
                set_power(Some("on"), None);
                fail("TargetUnschedulable", NO_TARGET_MESSAGE);
                return;
            }
            if fail_mode == "timeout" && pct >= 50 {
                set_power(Some("on"), None);
                fail("NotConverging", TIMEOUT_MESSAGE);
                return;
            }
            if pct >= 100 {
                let target = target.unwrap_or_default();
                set_power(Some("on"), Some(&target));
                app.store.modify(&vm_key, |o| {
                    o["status"]["migrationState"] = json!({"startTimestamp": now_rfc3339(), "endTimestamp": now_rfc3339(),
                        "source": {"node": node}, "target": {"node": target}, "result": "Succeeded"});
                });
                complete(Some("100%"));
            } else {
                set_power(Some("migrating"), None);
                let next = (pct + 25).min(100);
                let reason = if pct == 0 {
                    "MigrationPrepareTarget"
                } else {
                    "MigrationRunning"
                };
                in_progress(reason, Some(&format!("{next}%")));
            }
        }
        _ => fail(
            "OperationFailed",
            &format!("the emulator does not run {op_type} operations"),
        ),
    }
    let _ = owner_ref;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServeFlavor;
    use crate::controllers::reconcile_all;
    use crate::handlers::parse_path;
    use crate::registry::Registry;
    use std::time::Duration;

    fn kubevirt() -> App {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        for (n, labels) in [
            ("node-1", json!({"kubernetes.io/hostname": "node-1"})),
            ("node-2", json!({"kubernetes.io/hostname": "node-2"})),
        ] {
            app.store
                .create("", "nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": labels}}))
                .unwrap();
        }
        app
    }

    fn vm(app: &App, name: &str, rs: &str, annotations: Value) -> Value {
        app.store
            .create(
                KV,
                "virtualmachines",
                json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": name, "namespace": "default", "annotations": annotations},
                "spec": {"runStrategy": rs, "template": {"spec": {"domain": {"devices": {}}}}}}),
            )
            .unwrap()
    }

    fn put(
        app: &App,
        plural: &str,
        name: &str,
        sub: &str,
        body: Value,
    ) -> Result<u16, (u16, String)> {
        let path =
            format!("/apis/subresources.kubevirt.io/v1/namespaces/default/{plural}/{name}/{sub}");
        let rp = parse_path(&path).unwrap();
        let body = Bytes::from(body.to_string());
        match action(app, &rp, sub, &Query::new(), &body).unwrap() {
            Ok(r) => Ok(r.status().as_u16()),
            Err(e) => Err((e.code, e.message)),
        }
    }

    fn ticks(app: &App, n: usize) {
        for _ in 0..n {
            reconcile_all(app, true);
        }
    }

    fn get(app: &App, plural: &str, name: &str) -> Option<Value> {
        app.store.get(&Key::new(KV, plural, "default", name))
    }

    fn printable(app: &App, name: &str) -> String {
        get(app, "virtualmachines", name).unwrap()["status"]["printableStatus"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    #[test]
    fn start_goes_through_vmi_phases_with_a_launcher_pod() {
        let app = kubevirt();
        vm(&app, "web", "Always", json!({}));
        reconcile_all(&app, false);
        assert_eq!(
            phase(&get(&app, "virtualmachineinstances", "web").unwrap()),
            "Pending"
        );
        assert_eq!(printable(&app, "web"), "Starting");
        ticks(&app, 1);
        assert_eq!(
            phase(&get(&app, "virtualmachineinstances", "web").unwrap()),
            "Scheduling"
        );
        let pods = app.store.list("", "pods", Some("default")).0;
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0]["status"]["phase"], "Pending");
        ticks(&app, 3);
        assert_eq!(printable(&app, "web"), "Running");
        let pods = app.store.list("", "pods", Some("default")).0;
        assert_eq!(pods[0]["status"]["phase"], "Running");
    }

    #[test]
    fn always_stop_sets_halted_and_start_is_refused_while_running() {
        let app = kubevirt();
        vm(&app, "web", "Always", json!({}));
        ticks(&app, 5);
        assert_eq!(
            put(&app, "virtualmachines", "web", "start", json!({})),
            Err((409, "VM is already running".into()))
        );
        assert_eq!(
            put(&app, "virtualmachines", "web", "stop", json!({})),
            Ok(202)
        );
        assert_eq!(
            get(&app, "virtualmachines", "web").unwrap()["spec"]["runStrategy"],
            "Halted"
        );
        ticks(&app, 1);
        assert_eq!(printable(&app, "web"), "Stopping");
        ticks(&app, 2);
        assert_eq!(printable(&app, "web"), "Stopped");
        assert!(get(&app, "virtualmachineinstances", "web").is_none());
        assert!(app.store.list("", "pods", Some("default")).0.is_empty());
        assert_eq!(
            put(&app, "virtualmachines", "web", "stop", json!({})),
            Err((409, "VM is not running".into()))
        );
        // Halted + start: runStrategy back to Always.
        assert_eq!(
            put(&app, "virtualmachines", "web", "start", json!({})),
            Ok(202)
        );
        assert_eq!(
            get(&app, "virtualmachines", "web").unwrap()["spec"]["runStrategy"],
            "Always"
        );
        ticks(&app, 5);
        assert_eq!(printable(&app, "web"), "Running");
        // Halted with a live VMI: only a shorter grace period is accepted.
        app.store
            .modify(&Key::new(KV, "virtualmachines", "default", "web"), |o| {
                o["spec"]["runStrategy"] = json!("Halted")
            });
        let _ = app.store.modify(
            &Key::new(KV, "virtualmachineinstances", "default", "web"),
            |o| set_annotation(o, STOPPING, None),
        );
    }

    #[test]
    fn manual_uses_state_change_requests() {
        let app = kubevirt();
        vm(&app, "m", "Manual", json!({}));
        ticks(&app, 2);
        assert!(get(&app, "virtualmachineinstances", "m").is_none());
        assert_eq!(
            put(
                &app,
                "virtualmachines",
                "m",
                "start",
                json!({"paused": true})
            ),
            Ok(202)
        );
        let reqs = state_requests(&get(&app, "virtualmachines", "m").unwrap());
        assert_eq!(
            reqs,
            vec![json!({"action": "Start", "data": {"paused": "true"}})]
        );
        assert_eq!(
            put(&app, "virtualmachines", "m", "start", json!({})),
            Err((
                409,
                "unable to complete request: stop/start already underway".into()
            ))
        );
        ticks(&app, 5);
        assert_eq!(printable(&app, "m"), "Paused");
        assert!(state_requests(&get(&app, "virtualmachines", "m").unwrap()).is_empty());
        let uid = get(&app, "virtualmachineinstances", "m").unwrap()["metadata"]["uid"].clone();
        assert_eq!(
            put(
                &app,
                "virtualmachines",
                "m",
                "stop",
                json!({"gracePeriod": 0})
            ),
            Ok(202)
        );
        assert_eq!(
            state_requests(&get(&app, "virtualmachines", "m").unwrap()),
            vec![json!({"action": "Stop", "uid": uid})]
        );
        assert_eq!(
            get(&app, "virtualmachineinstances", "m").unwrap()["spec"]["terminationGracePeriodSeconds"],
            0
        );
        ticks(&app, 3);
        assert_eq!(printable(&app, "m"), "Stopped");
        assert_eq!(
            put(&app, "virtualmachines", "m", "restart", json!({})),
            Err((409, "VM is not running: Stopped".into()))
        );
    }

    #[test]
    fn restart_makes_a_new_vmi_and_refuses_halted_once_and_grace() {
        let app = kubevirt();
        vm(&app, "web", "Always", json!({}));
        vm(&app, "h", "Halted", json!({}));
        vm(&app, "o", "Once", json!({}));
        ticks(&app, 5);
        let old = get(&app, "virtualmachineinstances", "web").unwrap()["metadata"]["uid"].clone();
        assert_eq!(
            put(
                &app,
                "virtualmachines",
                "web",
                "restart",
                json!({"gracePeriodSeconds": 5})
            ),
            Err((
                400,
                "For force restart, only gracePeriod=0 is supported for now".into()
            ))
        );
        assert_eq!(
            put(
                &app,
                "virtualmachines",
                "web",
                "restart",
                json!({"gracePeriodSeconds": 0})
            ),
            Ok(202)
        );
        assert_eq!(
            get(&app, "virtualmachineinstances", "web").unwrap()["spec"]["terminationGracePeriodSeconds"],
            1
        );
        ticks(&app, 8);
        let new = get(&app, "virtualmachineinstances", "web").unwrap();
        assert_ne!(new["metadata"]["uid"], old);
        assert_eq!(printable(&app, "web"), "Running");
        for (name, rs) in [("h", "Halted"), ("o", "Once")] {
            assert_eq!(
                put(&app, "virtualmachines", name, "restart", json!({})),
                Err((
                    409,
                    format!("RunStategy {rs} does not support manual restart requests")
                ))
            );
        }
        assert_eq!(
            put(&app, "virtualmachines", "o", "start", json!({})),
            Err((409, "VM is already running".into()))
        );
        assert_eq!(
            put(&app, "virtualmachines", "h", "stop", json!({})),
            Err((409, "VM is not running".into()))
        );
    }

    #[test]
    fn dry_run_changes_nothing() {
        let app = kubevirt();
        vm(&app, "web", "Always", json!({}));
        ticks(&app, 5);
        let before = get(&app, "virtualmachines", "web").unwrap();
        assert_eq!(
            put(
                &app,
                "virtualmachines",
                "web",
                "stop",
                json!({"dryRun": ["All"]})
            ),
            Ok(202)
        );
        assert_eq!(
            put(
                &app,
                "virtualmachines",
                "web",
                "migrate",
                json!({"dryRun": ["All"]})
            ),
            Ok(202)
        );
        assert_eq!(
            put(
                &app,
                "virtualmachineinstances",
                "web",
                "pause",
                json!({"dryRun": ["All"]})
            ),
            Ok(200)
        );
        assert_eq!(get(&app, "virtualmachines", "web").unwrap(), before);
        assert!(
            app.store
                .list(KV, "virtualmachineinstancemigrations", None)
                .0
                .is_empty()
        );
    }

    #[test]
    fn pause_unpause_and_soft_reboot() {
        let app = kubevirt();
        vm(&app, "web", "Always", json!({}));
        ticks(&app, 5);
        assert_eq!(
            put(&app, "virtualmachineinstances", "web", "unpause", json!({})),
            Err((409, "VMI is not paused".into()))
        );
        assert_eq!(
            put(&app, "virtualmachineinstances", "web", "pause", json!({})),
            Ok(200)
        );
        reconcile_all(&app, false);
        assert_eq!(printable(&app, "web"), "Paused");
        assert_eq!(
            put(&app, "virtualmachineinstances", "web", "pause", json!({})),
            Err((409, "VMI is already paused".into()))
        );
        assert_eq!(
            put(
                &app,
                "virtualmachineinstances",
                "web",
                "softreboot",
                json!({})
            ),
            Err((409, "VMI is paused".into()))
        );
        assert_eq!(
            put(&app, "virtualmachineinstances", "web", "unpause", json!({})),
            Ok(200)
        );
        reconcile_all(&app, false);
        assert_eq!(printable(&app, "web"), "Running");
        assert_eq!(
            put(
                &app,
                "virtualmachineinstances",
                "web",
                "softreboot",
                json!({})
            ),
            Ok(200)
        );
    }

    #[test]
    fn unschedulable_switch_gives_error_unschedulable() {
        let app = kubevirt();
        vm(&app, "big", "Always", json!({UNSCHEDULABLE: "true"}));
        ticks(&app, 6);
        assert_eq!(printable(&app, "big"), "ErrorUnschedulable");
        let vm = get(&app, "virtualmachines", "big").unwrap();
        let cond =
            crate::table::eval_first(&vm, ".status.conditions[?(@.type=='PodScheduled')].message");
        assert_eq!(cond, Some(&json!(UNSCHEDULABLE_MESSAGE)));
    }

    fn migrations(app: &App) -> Vec<Value> {
        app.store
            .list(KV, "virtualmachineinstancemigrations", None)
            .0
    }

    #[test]
    fn migration_moves_the_vmi_through_phases() {
        let app = kubevirt();
        vm(&app, "web", "Always", json!({}));
        ticks(&app, 5);
        assert_eq!(
            put(&app, "virtualmachines", "web", "migrate", json!({})),
            Ok(202)
        );
        let m = &migrations(&app)[0];
        assert!(meta_str(m, "name").starts_with("kubevirt-migrate-vm-"));
        assert_eq!(m["metadata"]["labels"]["kubevirt.io/vmi-name"], "web");
        // A second one while the first is active is refused by admission.
        let (code, msg) = put(&app, "virtualmachines", "web", "migrate", json!({})).unwrap_err();
        assert_eq!(code, 400);
        assert!(msg.contains("in-flight migration detected"), "{msg}");
        let mut seen = vec![];
        for _ in 0..15 {
            reconcile_all(&app, true);
            let p = phase(&migrations(&app)[0]).to_string();
            if seen.last() != Some(&p) {
                seen.push(p);
            }
        }
        assert_eq!(
            seen,
            [
                "Pending",
                "Scheduling",
                "Scheduled",
                "PreparingTarget",
                "TargetReady",
                "Running",
                "Succeeded"
            ]
        );
        let vmi = get(&app, "virtualmachineinstances", "web").unwrap();
        assert_eq!(vmi["status"]["nodeName"], "node-2");
        assert_eq!(vmi["status"]["migrationState"]["sourceNode"], "node-1");
        assert_eq!(vmi["status"]["migrationState"]["targetNode"], "node-2");
        assert_eq!(vmi["status"]["migrationState"]["completed"], true);
        let pods = app.store.list("", "pods", Some("default")).0;
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0]["spec"]["nodeName"], "node-2");
    }

    #[test]
    fn migrations_fail_without_a_target_or_on_timeout() {
        let app = kubevirt();
        vm(&app, "a", "Always", json!({}));
        vm(&app, "b", "Always", json!({MIGRATION_FAIL: "timeout"}));
        ticks(&app, 5);
        assert_eq!(
            put(
                &app,
                "virtualmachines",
                "a",
                "migrate",
                json!({"addedNodeSelector": {"kubernetes.io/hostname": "node-9"}})
            ),
            Ok(202)
        );
        assert_eq!(
            put(&app, "virtualmachines", "b", "migrate", json!({})),
            Ok(202)
        );
        ticks(&app, 15);
        for (vmi, why) in [("a", NO_TARGET_MESSAGE), ("b", TIMEOUT_MESSAGE)] {
            let m = migrations(&app)
                .into_iter()
                .find(|m| m["spec"]["vmiName"] == vmi)
                .unwrap();
            assert_eq!(phase(&m), "Failed");
            assert_eq!(m["status"]["migrationState"]["failureReason"], why);
            let v = get(&app, "virtualmachineinstances", vmi).unwrap();
            assert_eq!(v["status"]["nodeName"], "node-1", "{vmi} stays");
            assert_eq!(v["status"]["migrationState"]["failed"], true);
        }
    }

    fn deckhouse() -> App {
        let app = App::new(
            Registry::new(ServeFlavor::Deckhouse),
            Duration::from_secs(1),
        );
        for n in ["node-1", "node-2"] {
            app.store
                .create("", "nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}}))
                .unwrap();
        }
        app.store
            .create(DH, "virtualmachines", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
                "metadata": {"name": "linux", "namespace": "default"},
                "spec": {"runPolicy": "Manual", "virtualMachineClassName": "generic", "cpu": {"cores": 1},
                         "memory": {"size": "1Gi"}, "blockDeviceRefs": []}}))
            .unwrap();
        app
    }

    fn op(app: &App, ty: &str, extra: Value) -> String {
        let mut spec = json!({"type": ty, "virtualMachineName": "linux"});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let name = format!("linux-{}", random_suffix(5));
        app.store
            .create(DH, "virtualmachineoperations", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                "kind": "VirtualMachineOperation", "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
            .unwrap();
        name
    }

    fn dh(app: &App, plural: &str, name: &str) -> Value {
        app.store
            .get(&Key::new(DH, plural, "default", name))
            .unwrap()
    }

    #[test]
    fn operations_start_stop_and_migrate_with_progress() {
        let app = deckhouse();
        ticks(&app, 1);
        assert_eq!(phase(&dh(&app, "virtualmachines", "linux")), "Stopped");
        let start = op(&app, "Start", json!({}));
        reconcile_all(&app, false);
        assert_eq!(
            phase(&dh(&app, "virtualmachineoperations", &start)),
            "Pending"
        );
        ticks(&app, 1);
        assert_eq!(
            phase(&dh(&app, "virtualmachineoperations", &start)),
            "InProgress"
        );
        assert_eq!(phase(&dh(&app, "virtualmachines", "linux")), "Starting");
        ticks(&app, 1);
        assert_eq!(
            phase(&dh(&app, "virtualmachineoperations", &start)),
            "Completed"
        );
        assert_eq!(phase(&dh(&app, "virtualmachines", "linux")), "Running");
        let migrate = op(
            &app,
            "Migrate",
            json!({"migrate": {"nodeSelector": {"kubernetes.io/hostname": "node-2"}}}),
        );
        let mut progress = vec![];
        for _ in 0..8 {
            reconcile_all(&app, true);
            let o = dh(&app, "virtualmachineoperations", &migrate);
            if let Some(p) = o["status"]["progress"].as_str()
                && progress.last().map(String::as_str) != Some(p)
            {
                progress.push(p.to_string());
            }
        }
        assert_eq!(progress, ["0%", "25%", "50%", "75%", "100%"]);
        assert_eq!(
            phase(&dh(&app, "virtualmachineoperations", &migrate)),
            "Completed"
        );
        assert_eq!(
            dh(&app, "virtualmachines", "linux")["status"]["nodeName"],
            "node-2"
        );
        let stop = op(&app, "Stop", json!({}));
        ticks(&app, 3);
        assert_eq!(
            phase(&dh(&app, "virtualmachineoperations", &stop)),
            "Completed"
        );
        assert_eq!(phase(&dh(&app, "virtualmachines", "linux")), "Stopped");
        // Stopping a stopped VM fails with the platform's reason.
        let again = op(&app, "Stop", json!({}));
        reconcile_all(&app, false);
        let o = dh(&app, "virtualmachineoperations", &again);
        assert_eq!(phase(&o), "Failed");
        assert_eq!(
            o["status"]["conditions"][0]["reason"],
            "NotApplicableForVirtualMachinePhase"
        );
    }

    #[test]
    fn operations_supersede_or_fail_and_migrations_fail() {
        let app = deckhouse();
        ticks(&app, 1);
        // Stop supersedes an active Start.
        let start = op(&app, "Start", json!({}));
        reconcile_all(&app, false);
        let stop = op(&app, "Stop", json!({}));
        reconcile_all(&app, false);
        let s = dh(&app, "virtualmachineoperations", &start);
        assert_eq!(phase(&s), "Superseded");
        assert_eq!(s["status"]["conditions"][0]["reason"], "Superseded");
        assert_eq!(
            phase(&dh(&app, "virtualmachineoperations", &stop)),
            "Failed"
        );
        let start = op(&app, "Start", json!({}));
        ticks(&app, 3);
        assert_eq!(
            phase(&dh(&app, "virtualmachineoperations", &start)),
            "Completed"
        );
        // A forced Stop supersedes a Stop; a Start does not supersede it and fails.
        let stop = op(&app, "Stop", json!({}));
        reconcile_all(&app, false);
        let forced = op(&app, "Stop", json!({"force": true}));
        reconcile_all(&app, false);
        assert_eq!(
            phase(&dh(&app, "virtualmachineoperations", &stop)),
            "Superseded"
        );
        let start2 = op(&app, "Start", json!({}));
        reconcile_all(&app, false);
        let o = dh(&app, "virtualmachineoperations", &start2);
        assert_eq!(phase(&o), "Failed");
        assert_eq!(
            o["status"]["conditions"][0]["reason"],
            "NotReadyToBeExecuted"
        );
        ticks(&app, 3);
        assert_eq!(
            phase(&dh(&app, "virtualmachineoperations", &forced)),
            "Completed"
        );
        let start3 = op(&app, "Start", json!({}));
        ticks(&app, 3);
        assert_eq!(
            phase(&dh(&app, "virtualmachineoperations", &start3)),
            "Completed"
        );
        app.store
            .modify(&Key::new(DH, "virtualmachines", "default", "linux"), |o| {
                set_annotation(o, MIGRATION_FAIL, Some("timeout"))
            });
        let m = op(&app, "Evict", json!({}));
        ticks(&app, 6);
        let o = dh(&app, "virtualmachineoperations", &m);
        assert_eq!(phase(&o), "Failed");
        assert_eq!(o["status"]["conditions"][0]["reason"], "NotConverging");
        assert_eq!(o["status"]["conditions"][0]["message"], TIMEOUT_MESSAGE);
        let m = op(
            &app,
            "Migrate",
            json!({"migrate": {"nodeSelector": {"kubernetes.io/hostname": "node-1"}}}),
        );
        ticks(&app, 3);
        let o = dh(&app, "virtualmachineoperations", &m);
        assert_eq!(
            o["status"]["conditions"][0]["reason"],
            "TargetUnschedulable"
        );
    }
}
