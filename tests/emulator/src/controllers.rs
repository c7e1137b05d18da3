//! Minimal controllers: one background task that reacts to store changes (and ticks every
//! `import_step` for progress) and runs small, idempotent reconcilers. Objects a fixture or a
//! test wrote directly are "settled" (see `App::settle`) and left alone until their generation
//! changes, so hand-written states stay as written.
//!
//! Add a reconciler: write `fn reconcile_x(app, obj, tick)` and list it in [`RECONCILERS`].

use crate::app::App;
use crate::store::Key;
#[cfg(test)]
use crate::store::Propagation;
use crate::util::{meta_str, now_rfc3339};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::{broadcast, watch};

/// A reconciler for one kind: `(app, object, tick)`; `tick` is true on the progress timer.
type Reconciler = fn(&App, &Value, bool);

/// Which reconciler runs for which `(group, plural)`.
const RECONCILERS: &[(&str, &str, Reconciler)] = &[
    ("kubevirt.io", "virtualmachines", kubevirt_vm),
    // Lifecycle (lifecycle/): VMI phases, migrations, Deckhouse operations.
    (
        "kubevirt.io",
        "virtualmachineinstances",
        crate::lifecycle::kubevirt_vmi,
    ),
    (
        "kubevirt.io",
        "virtualmachineinstancemigrations",
        crate::lifecycle::migration,
    ),
    (
        "virtualization.deckhouse.io",
        "virtualmachineoperations",
        crate::lifecycle::vmop,
    ),
    ("cdi.kubevirt.io", "datavolumes", data_volume),
    ("virtualization.deckhouse.io", "virtualdisks", virtual_disk),
    (
        "virtualization.deckhouse.io",
        "virtualimages",
        virtual_image,
    ),
    (
        "virtualization.deckhouse.io",
        "clustervirtualimages",
        virtual_image,
    ),
    (
        "virtualization.deckhouse.io",
        "virtualmachineclasses",
        vm_class,
    ),
    (
        "virtualization.deckhouse.io",
        "virtualmachines",
        deckhouse_vm,
    ),
    (
        crate::export::KV_EXPORT_GROUP,
        "virtualmachineexports",
        crate::export::kubevirt_export,
    ),
    (
        crate::export::SF_GROUP,
        "dataexports",
        crate::export::data_export,
    ),
];

/// Progress made per tick, in percent.
const STEP_PERCENT: f64 = 10.0;
/// The node every emulated VM lands on.
pub(crate) const NODE: &str = "node-1";

/// Runs the controllers until `shutdown` flips.
pub async fn run(app: Arc<App>, mut shutdown: watch::Receiver<bool>) {
    let mut rx = app.store.subscribe();
    let mut tick = tokio::time::interval(app.import_step);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tick.tick() => reconcile_all(&app, true),
            ev = rx.recv() => {
                if matches!(ev, Err(broadcast::error::RecvError::Closed)) {
                    break;
                }
                // Coalesce a burst of events into one pass.
                while rx.try_recv().is_ok() {}
                reconcile_all(&app, false);
            }
        }
    }
}

/// One pass over every object that has a reconciler.
pub fn reconcile_all(app: &App, tick: bool) {
    for (group, plural, reconcile) in RECONCILERS {
        if app.registry.find_plural(group, plural).is_none() {
            continue;
        }
        let (objs, _) = app.store.list(group, plural, None);
        for obj in objs.iter().filter(|o| !app.is_settled(o)) {
            reconcile(app, obj, tick);
        }
    }
}

pub(crate) fn owner_ref(obj: &Value) -> Value {
    json!({
        "apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true
    })
}

/// Whether an object has a controller owner already.
fn has_controller(obj: &Value) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r["controller"] == true))
}

#[cfg(test)]
fn owned_by(obj: &Value, owner: &Value) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == owner["metadata"]["uid"]))
}

/// Sets a condition, keeping `lastTransitionTime` when the status does not change.
pub(crate) fn set_condition(
    status: &mut Value,
    type_: &str,
    state: bool,
    reason: &str,
    message: &str,
) {
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let conds = status["conditions"].as_array_mut().expect("array");
    let state = if state { "True" } else { "False" };
    let existing = conds.iter().position(|c| c["type"] == type_);
    let since = match existing.map(|i| &conds[i]) {
        Some(c) if c["status"] == state => c["lastTransitionTime"].clone(),
        _ => json!(now_rfc3339()),
    };
    // Deckhouse CRDs require every condition field, message included.
    let c = json!({"type": type_, "status": state, "lastTransitionTime": since, "reason": reason, "message": message});
    match existing {
        Some(i) => conds[i] = c,
        None => conds.push(c),
    }
}

/// A stable pseudo-random byte pair from an object's uid (for IPs and MACs).
fn uid_bytes(obj: &Value) -> [u8; 4] {
    let hex: String = meta_str(obj, "uid")
        .chars()
        .filter(char::is_ascii_hexdigit)
        .collect();
    let b =
        |i: usize| u8::from_str_radix(hex.get(i * 2..i * 2 + 2).unwrap_or("07"), 16).unwrap_or(7);
    [b(0), b(1), b(2), b(3)]
}

fn key_of(group: &str, plural: &str, obj: &Value) -> Key {
    Key::of(group, plural, obj)
}

fn percent(progress: &Value) -> f64 {
    progress
        .as_str()
        .and_then(|p| p.trim_end_matches('%').parse().ok())
        .unwrap_or(0.0)
}

// ---------------------------------------------------------------------------------------------
// KubeVirt

/// Whether a KubeVirt VM should run: runStrategy Always/RerunOnFailure/Once, legacy
/// `spec.running: true`, or Manual with a VMI already present.
pub(crate) fn kubevirt_should_run(vm: &Value, vmi_exists: bool) -> bool {
    let strategy = vm.pointer("/spec/runStrategy").and_then(Value::as_str);
    match strategy {
        Some("Always") | Some("RerunOnFailure") | Some("Once") => true,
        Some("Manual") => vmi_exists,
        Some(_) => false,
        None => vm.pointer("/spec/running").and_then(Value::as_bool) == Some(true),
    }
}

fn kubevirt_vm(app: &App, vm: &Value, _tick: bool) {
    let ns = meta_str(vm, "namespace").to_string();
    let cdi = app
        .registry
        .find_plural("cdi.kubevirt.io", "datavolumes")
        .is_some();
    let mut dv_names = vec![];
    for t in vm
        .pointer("/spec/dataVolumeTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let dv_name = t
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if dv_name.is_empty() || !cdi {
            continue;
        }
        let dv_key = Key::new("cdi.kubevirt.io", "datavolumes", &ns, &dv_name);
        if let Some(existing) = app.store.get(&dv_key) {
            // Like KubeVirt, adopt an orphaned DataVolume of the template's name (one kept by
            // `kubectl vm delete --keep-disks`) instead of failing.
            if !has_controller(&existing) {
                app.store.modify(&dv_key, |o| {
                    let mut refs = o
                        .pointer("/metadata/ownerReferences")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    refs.push(owner_ref(vm));
                    o["metadata"]["ownerReferences"] = json!(refs);
                });
            }
        } else {
            let mut meta = t.get("metadata").cloned().unwrap_or(json!({}));
            meta["namespace"] = json!(ns);
            meta["ownerReferences"] = json!([owner_ref(vm)]);
            let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": meta, "spec": t["spec"]});
            let _ = app.store.create("cdi.kubevirt.io", "datavolumes", dv);
        }
        dv_names.push(dv_name);
    }
    for v in vm
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(n) = v.pointer("/dataVolume/name").and_then(Value::as_str)
            && !dv_names.iter().any(|d| d == n)
        {
            dv_names.push(n.to_string());
        }
    }
    let provisioning = cdi
        && dv_names.iter().any(|n| {
            app.store
                .get(&Key::new("cdi.kubevirt.io", "datavolumes", &ns, n))
                .and_then(|dv| {
                    dv.pointer("/status/phase")
                        .and_then(Value::as_str)
                        .map(|p| p != "Succeeded")
                })
                .unwrap_or(true)
        });
    // Run strategies and state change requests: lifecycle/.
    let vmi = crate::lifecycle::kubevirt_run(app, vm, provisioning);
    let run = vmi.is_some();
    let vmi_ready = vmi.as_ref().and_then(|v| {
        crate::table::eval_first(v, ".status.conditions[?(@.type=='Ready')].status").cloned()
    }) == Some(json!("True"));
    let printable = if provisioning {
        "Provisioning"
    } else {
        crate::lifecycle::kubevirt_printable(vm, vmi.as_ref())
    };
    let generation = vm
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let _ = run;
    let run_strategy = json!(crate::lifecycle::run_strategy(vm));
    // The VM mirrors its VMI's scheduling failure (virt-controller copies the condition).
    let unschedulable = vmi.as_ref().and_then(|v| {
        v.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| {
                c.iter()
                    .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
            })
            .cloned()
    });
    app.store
        .modify(&key_of("kubevirt.io", "virtualmachines", vm), |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["printableStatus"] = json!(printable);
            st["runStrategy"] = run_strategy;
            st["observedGeneration"] = generation.clone();
            st["desiredGeneration"] = generation;
            let m = st.as_object_mut().expect("object");
            if vmi.is_some() {
                m.insert("created".into(), json!(true))
            } else {
                m.remove("created")
            };
            if vmi_ready {
                m.insert("ready".into(), json!(true))
            } else {
                m.remove("ready")
            };
            let (reason, message) = match (&vmi, vmi_ready) {
                (None, _) => ("VMINotExists", "VMI does not exist"),
                (Some(_), false) => ("GuestNotRunning", "Guest VM is not reported as running"),
                (Some(_), true) => ("", ""),
            };
            set_condition(&mut st, "Ready", vmi_ready, reason, message);
            match &unschedulable {
                Some(c) => set_condition(
                    &mut st,
                    "PodScheduled",
                    false,
                    c["reason"].as_str().unwrap_or(""),
                    c["message"].as_str().unwrap_or(""),
                ),
                None => {
                    if let Some(c) = st["conditions"].as_array_mut() {
                        c.retain(|c| c["type"] != "PodScheduled");
                    }
                }
            }
            o["status"] = st;
        });
}

pub(crate) fn new_vmi(vm: &Value) -> Value {
    let [a, b, c, d] = uid_bytes(vm);
    let ip = format!("10.244.{}.{}", a, b % 254 + 1);
    let mac = format!("02:{c:02x}:{d:02x}:{a:02x}:{b:02x}:01");
    let template = vm.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let mut labels = template
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or(json!({}));
    labels["kubevirt.io/nodeName"] = json!(NODE);
    let now = now_rfc3339();
    let mut status = json!({
        "phase": "Running",
        "nodeName": NODE,
        "interfaces": [{"name": "default", "ipAddress": ip, "ipAddresses": [ip], "mac": mac,
                        "interfaceName": "eth0", "infoSource": "domain, guest-agent", "queueCount": 1}],
        "guestOSInfo": {"id": "fedora", "name": "Fedora Linux", "prettyName": "Fedora Linux 42 (Cloud Edition)",
                        "version": "42 (Cloud Edition)", "versionId": "42", "kernelRelease": "6.14.0-63.fc42.x86_64"},
        "qosClass": "Burstable",
        "launcherContainerImageVersion": "quay.io/kubevirt/virt-launcher:v1.9.0",
        "migrationMethod": "BlockMigration",
        "migrationTransport": "Unix",
        "phaseTransitionTimestamps": [{"phase": "Running", "phaseTransitionTimestamp": now}],
    });
    for t in ["Ready", "LiveMigratable", "AgentConnected"] {
        set_condition(&mut status, t, true, "", "");
    }
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": vm["metadata"]["name"], "namespace": vm["metadata"]["namespace"],
            "labels": labels,
            "annotations": template.pointer("/metadata/annotations").cloned().unwrap_or(json!({})),
            "ownerReferences": [owner_ref(vm)],
        },
        "spec": template.get("spec").cloned().unwrap_or(json!({})),
        "status": status,
    })
}

pub(crate) fn launcher_pod(vmi: &Value) -> Value {
    let name = meta_str(vmi, "name");
    let uid = meta_str(vmi, "uid");
    let ip = vmi
        .pointer("/status/interfaces/0/ipAddress")
        .cloned()
        .unwrap_or(json!(""));
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("virt-launcher-{name}-{}", &uid.get(..5).unwrap_or("00000")),
            "namespace": vmi["metadata"]["namespace"],
            "labels": {"kubevirt.io": "virt-launcher", "vm.kubevirt.io/name": name, "kubevirt.io/created-by": uid},
            "annotations": {"emulator.kubevm.io/log": format!(
                "{{\"component\":\"virt-launcher\",\"level\":\"info\",\"msg\":\"Domain started\",\"name\":\"{name}\"}}\n{{\"component\":\"virt-launcher\",\"level\":\"info\",\"msg\":\"Synced vmi\",\"name\":\"{name}\"}}\n")},
            "ownerReferences": [owner_ref(vmi)],
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "compute", "image": "quay.io/kubevirt/virt-launcher:v1.9.0"}]},
        "status": {"phase": "Running", "podIP": ip, "hostIP": "192.168.0.11",
                   "containerStatuses": [{"name": "compute", "ready": true, "restartCount": 0, "image": "quay.io/kubevirt/virt-launcher:v1.9.0"}]},
    })
}

/// CDI DataVolume: ImportScheduled → ImportInProgress (progress in steps) → Succeeded, with a
/// bound PVC of the same name. A blank source is Succeeded at once.
fn data_volume(app: &App, dv: &Value, tick: bool) {
    let phase = dv
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    let blank = dv.pointer("/spec/source/blank").is_some();
    // Unbound WaitForFirstConsumer storage: CDI waits in PendingPopulation for a consumer.
    let waiting = matches!(phase, "" | "PendingPopulation")
        && crate::storage::waits_for_first_consumer(app, dv_storage_class(dv).as_deref())
        && !crate::storage::kubevirt_consumer(app, dv);
    if waiting {
        if phase.is_empty() {
            app.store
                .modify(&key_of("cdi.kubevirt.io", "datavolumes", dv), |o| {
                    let mut st = o.get("status").cloned().unwrap_or(json!({}));
                    st["phase"] = json!("PendingPopulation");
                    st["progress"] = json!("N/A");
                    set_condition(&mut st, "Bound", false, "Pending", "PVC is pending");
                    set_condition(&mut st, "Ready", false, "PendingPopulation", "");
                    o["status"] = st;
                });
        }
        return;
    }
    if phase == "ImportInProgress"
        && tick
        && let Some(message) = crate::storage::import_error(dv)
    {
        // The importer pod fails and is restarted, again and again.
        app.store
            .modify(&key_of("cdi.kubevirt.io", "datavolumes", dv), |o| {
                let mut st = o.get("status").cloned().unwrap_or(json!({}));
                let restarts = st["restartCount"].as_i64().unwrap_or(0) + 1;
                st["restartCount"] = json!(restarts);
                set_condition(&mut st, "Running", false, "Error", &message);
                o["status"] = st;
            });
        return;
    }
    let (next_phase, progress) = match phase {
        "" if blank => ("Succeeded", "100.0%".to_string()),
        "" | "PendingPopulation" => ("ImportScheduled", "N/A".to_string()),
        "ImportScheduled" if tick => ("ImportInProgress", "0.0%".to_string()),
        "ImportInProgress" if tick => {
            let p = (percent(&dv["status"]["progress"]) + STEP_PERCENT).min(100.0);
            if p >= 100.0 {
                ("Succeeded", "100.0%".to_string())
            } else {
                ("ImportInProgress", format!("{p:.1}%"))
            }
        }
        _ => return,
    };
    ensure_pvc(
        app,
        dv,
        meta_str(dv, "name"),
        &dv_size(dv),
        dv_storage_class(dv),
    );
    app.store
        .modify(&key_of("cdi.kubevirt.io", "datavolumes", dv), |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["phase"] = json!(next_phase);
            st["progress"] = json!(progress);
            st["claimName"] = o["metadata"]["name"].clone();
            let done = next_phase == "Succeeded";
            set_condition(&mut st, "Bound", true, "Bound", "PVC bound");
            set_condition(
                &mut st,
                "Running",
                next_phase == "ImportInProgress",
                if done { "Completed" } else { "Pending" },
                "",
            );
            set_condition(
                &mut st,
                "Ready",
                done,
                if done { "" } else { "TransferRunning" },
                "",
            );
            o["status"] = st;
        });
}

fn dv_size(dv: &Value) -> String {
    [
        "/spec/storage/resources/requests/storage",
        "/spec/pvc/resources/requests/storage",
    ]
    .iter()
    .find_map(|p| dv.pointer(p))
    .map(|v| {
        v.as_str()
            .map(String::from)
            .unwrap_or_else(|| v.to_string())
    })
    .unwrap_or_else(|| "1Gi".into())
}

fn dv_storage_class(dv: &Value) -> Option<String> {
    [
        "/spec/storage/storageClassName",
        "/spec/pvc/storageClassName",
    ]
    .iter()
    .find_map(|p| dv.pointer(p).and_then(Value::as_str))
    .map(String::from)
}

/// Creates a bound PVC owned by `owner` unless it exists.
fn ensure_pvc(app: &App, owner: &Value, name: &str, size: &str, class: Option<String>) {
    let ns = meta_str(owner, "namespace");
    if app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, name))
        .is_some()
    {
        return;
    }
    let class = class.unwrap_or_else(|| "local-path".into());
    let pvc = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [owner_ref(owner)]},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}},
                 "storageClassName": class, "volumeMode": "Filesystem", "volumeName": format!("pvc-{}", meta_str(owner, "uid"))},
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}},
    });
    let _ = app.store.create("", "persistentvolumeclaims", pvc);
}

// ---------------------------------------------------------------------------------------------
// Deckhouse

const DH: &str = "virtualization.deckhouse.io";

/// VirtualDisk: Pending → Provisioning (progress "NN%") → Ready with a PVC
/// `vd-<name>-<uid8>`; a disk without dataSource is Ready at the first tick.
fn virtual_disk(app: &App, vd: &Value, tick: bool) {
    let phase = vd
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    let has_source = vd.pointer("/spec/dataSource").is_some_and(|s| !s.is_null());
    let class_name = vd
        .pointer("/spec/persistentVolumeClaim/storageClassName")
        .and_then(Value::as_str);
    let waiting = matches!(phase, "" | "Pending" | "WaitForFirstConsumer")
        && crate::storage::waits_for_first_consumer(app, class_name)
        && !crate::storage::deckhouse_consumer(app, vd);
    if waiting || (phase == "Provisioning" && tick && crate::storage::import_error(vd).is_some()) {
        let failure = crate::storage::import_error(vd).filter(|_| !waiting);
        if phase == "WaitForFirstConsumer" && failure.is_none() {
            return;
        }
        app.store.modify(&key_of(DH, "virtualdisks", vd), |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            match &failure {
                Some(message) => {
                    st["phase"] = json!("Failed");
                    set_condition(&mut st, "Ready", false, "ProvisioningFailed", message);
                }
                None => {
                    st["phase"] = json!("WaitForFirstConsumer");
                    st["progress"] = json!("0%");
                    set_condition(&mut st, "Ready", false, "WaitingForFirstConsumer", "");
                }
            }
            st["observedGeneration"] = o["metadata"]["generation"].clone();
            o["status"] = st;
        });
        return;
    }
    let (next, progress) = match phase {
        "" | "WaitForFirstConsumer" => ("Pending", "0%".to_string()),
        "Pending" if tick && !has_source => ("Ready", "100%".to_string()),
        "Pending" if tick => ("Provisioning", "0%".to_string()),
        "Provisioning" if tick => {
            let p = (percent(&vd["status"]["progress"]) + STEP_PERCENT).min(100.0);
            if p >= 100.0 {
                ("Ready", "100%".to_string())
            } else {
                ("Provisioning", format!("{p:.0}%"))
            }
        }
        _ => return,
    };
    let name = meta_str(vd, "name");
    let pvc_name = format!(
        "vd-{name}-{}",
        meta_str(vd, "uid").get(..8).unwrap_or("00000000")
    );
    let size = vd
        .pointer("/spec/persistentVolumeClaim/size")
        .map(|v| {
            v.as_str()
                .map(String::from)
                .unwrap_or_else(|| v.to_string())
        })
        .unwrap_or_else(|| "10Gi".into());
    let class = vd
        .pointer("/spec/persistentVolumeClaim/storageClassName")
        .and_then(Value::as_str)
        .map(String::from);
    if next != "Pending" {
        ensure_pvc(app, vd, &pvc_name, &size, class.clone());
    }
    app.store.modify(&key_of(DH, "virtualdisks", vd), |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!(next);
        st["progress"] = json!(progress);
        st["target"] = json!({"persistentVolumeClaimName": pvc_name});
        st["storageClassName"] = json!(class.unwrap_or_else(|| "local-path".into()));
        let ready = next == "Ready";
        if ready {
            st["capacity"] = json!(size);
        }
        set_condition(&mut st, "DatasourceReady", true, "DatasourceReady", "");
        set_condition(
            &mut st,
            "Ready",
            ready,
            if ready { "Ready" } else { "Provisioning" },
            "",
        );
        st["observedGeneration"] = o["metadata"]["generation"].clone();
        o["status"] = st;
    });
}

/// VirtualImage / ClusterVirtualImage: Ready at once, stored in DVCR.
fn virtual_image(app: &App, img: &Value, _tick: bool) {
    if img.pointer("/status/phase").and_then(Value::as_str) == Some("Ready") {
        return;
    }
    let cluster = img["kind"] == "ClusterVirtualImage";
    let name = meta_str(img, "name");
    let url = if cluster {
        format!("dvcr.d8-virtualization.svc/cvi/{name}:latest")
    } else {
        format!(
            "dvcr.d8-virtualization.svc/vi/{}/{name}:latest",
            meta_str(img, "namespace")
        )
    };
    let plural = if cluster {
        "clustervirtualimages"
    } else {
        "virtualimages"
    };
    app.store.modify(&key_of(DH, plural, img), |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!("Ready");
        st["progress"] = json!("100%");
        st["format"] = json!("qcow2");
        st["cdrom"] = json!(false);
        st["size"] = json!({"stored": "256Mi", "storedBytes": "268435456", "unpacked": "2Gi", "unpackedBytes": "2147483648"});
        st["target"] = json!({"registryURL": url});
        set_condition(&mut st, "Ready", true, "Ready", "");
        o["status"] = st;
    });
}

/// VirtualMachineClass: Ready.
fn vm_class(app: &App, class: &Value, _tick: bool) {
    if class.pointer("/status/phase").is_none() {
        app.store
            .modify(&key_of(DH, "virtualmachineclasses", class), |o| {
                o["status"] = json!({"phase": "Ready"});
            });
    }
}

/// Deckhouse VM: Pending until every referenced disk/image exists and is Ready, then Running
/// (runPolicy AlwaysOn / AlwaysOnUnlessStoppedManually, the default) or Stopped (Manual /
/// AlwaysOff).
fn deckhouse_vm(app: &App, vm: &Value, _tick: bool) {
    let ns = meta_str(vm, "namespace").to_string();
    let refs: Vec<Value> = vm
        .pointer("/spec/blockDeviceRefs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut devices_ready = true;
    let mut ref_status = vec![];
    for (i, r) in refs.iter().enumerate() {
        let kind = r["kind"].as_str().unwrap_or("");
        let name = r["name"].as_str().unwrap_or("");
        let key = match kind {
            "VirtualDisk" => Key::new(DH, "virtualdisks", &ns, name),
            "VirtualImage" => Key::new(DH, "virtualimages", &ns, name),
            "ClusterVirtualImage" => Key::new(DH, "clustervirtualimages", "", name),
            _ => continue,
        };
        let dev = app.store.get(&key);
        let ready = dev
            .as_ref()
            .and_then(|d| d.pointer("/status/phase").and_then(Value::as_str))
            == Some("Ready");
        devices_ready &= ready;
        let size = dev
            .as_ref()
            .and_then(|d| {
                d.pointer("/status/capacity")
                    .or_else(|| d.pointer("/status/size/unpacked"))
                    .cloned()
            })
            .unwrap_or(json!(""));
        ref_status.push(json!({"kind": kind, "name": name, "size": size, "target": format!("vd{}", (b'a' + i as u8) as char), "attached": ready}));
    }
    // Power state from runPolicy and operations: lifecycle/.
    let (power_phase, node) = crate::lifecycle::deckhouse_power(vm);
    let phase = if !devices_ready {
        "Pending"
    } else {
        power_phase
    };
    let unschedulable = phase == "Starting"
        && vm
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(crate::lifecycle::UNSCHEDULABLE))
            == Some(&json!("true"));
    let [a, b, ..] = uid_bytes(vm);
    let ip = format!("10.66.{}.{}", a, b % 254 + 1);
    let name = meta_str(vm, "name").to_string();
    let uid5 = meta_str(vm, "uid").get(..5).unwrap_or("00000").to_string();
    let real_agent = app.guests.real_agent();
    app.store.modify(&key_of(DH, "virtualmachines", vm), |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!(phase);
        st["blockDeviceRefs"] = json!(ref_status);
        st["observedGeneration"] = o["metadata"]["generation"].clone();
        st["resources"] = json!({
            "cpu": {"cores": o.pointer("/spec/cpu/cores").cloned().unwrap_or(json!(1)),
                    "coreFraction": o.pointer("/spec/cpu/coreFraction").cloned().unwrap_or(json!("100%"))},
            "memory": {"size": o.pointer("/spec/memory/size").cloned().unwrap_or(json!("1Gi"))}
        });
        let running = matches!(phase, "Running" | "Migrating" | "Stopping");
        let m = st.as_object_mut().expect("object");
        if running {
            m.insert("nodeName".into(), json!(node));
            m.insert("ipAddress".into(), json!(ip));
            m.insert("virtualMachinePods".into(), json!([{"name": format!("virt-launcher-{name}-{uid5}"), "active": true}]));
            m.insert("versions".into(), json!({"qemu": "9.2.0", "libvirt": "10.9.0"}));
            if m.get("stats").and_then(|s| s.get("lastStartTime")).is_none() {
                m.insert("stats".into(), json!({"lastStartTime": now_rfc3339(), "phasesTransitions": [{"phase": "Running", "timestamp": now_rfc3339()}]}));
            }
        } else {
            for f in ["nodeName", "ipAddress", "virtualMachinePods", "stats"] {
                m.remove(f);
            }
        }
        set_condition(&mut st, "BlockDevicesReady", devices_ready, if devices_ready { "BlockDevicesReady" } else { "BlockDevicesNotReady" }, "");
        if unschedulable {
            set_condition(&mut st, "Running", false, "PodNotStarted", crate::lifecycle::UNSCHEDULABLE_MESSAGE);
        } else {
            set_condition(&mut st, "Running", running, if running { "Running" } else { "NotRunning" }, "");
        }
        // With real guests the agent reports itself (qemu_guest.rs); it is gone once the VM stops.
        let agent = running && (!real_agent || crate::table::eval_first(&st, ".conditions[?(@.type=='AgentReady')].status") == Some(&json!("True")));
        set_condition(&mut st, "AgentReady", agent, if agent { "AgentReady" } else { "AgentNotReady" }, "");
        set_condition(&mut st, "Migratable", running, if running { "VirtualMachineMigratable" } else { "NotRunning" }, "");
        o["status"] = st;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServeFlavor;
    use crate::registry::Registry;
    use std::time::Duration;

    fn vm() -> Value {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"runStrategy": "Always",
                "dataVolumeTemplates": [{"metadata": {"name": "web-root"},
                    "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}],
                "template": {"spec": {"domain": {"devices": {}},
                    "volumes": [{"name": "rootdisk", "dataVolume": {"name": "web-root"}}]}}}})
    }

    fn get(app: &App, group: &str, plural: &str, name: &str) -> Option<Value> {
        app.store.get(&Key::new(group, plural, "default", name))
    }

    fn settle_controllers(app: &App) {
        for _ in 0..6 {
            reconcile_all(app, true);
        }
    }

    #[test]
    fn vm_delete_collects_dependents_and_recreate_adopts_kept_disks() {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        let first = app
            .store
            .create("kubevirt.io", "virtualmachines", vm())
            .unwrap();
        settle_controllers(&app);
        let dv = get(&app, "cdi.kubevirt.io", "datavolumes", "web-root").expect("DV created");
        assert!(owned_by(&dv, &first));
        assert!(get(&app, "", "persistentvolumeclaims", "web-root").is_some());
        assert!(get(&app, "kubevirt.io", "virtualmachineinstances", "web").is_some());

        // Deleting the VM garbage-collects the VMI, its pod, the DataVolume and its PVC.
        app.store.delete(
            &Key::of("kubevirt.io", "virtualmachines", &first),
            Propagation::Cascade,
        );
        assert!(get(&app, "kubevirt.io", "virtualmachineinstances", "web").is_none());
        assert!(get(&app, "cdi.kubevirt.io", "datavolumes", "web-root").is_none());
        assert!(get(&app, "", "persistentvolumeclaims", "web-root").is_none());
        assert!(app.store.list("", "pods", Some("default")).0.is_empty());

        // A DataVolume released from its VM (ownerReference removed) survives the VM ...
        let second = app
            .store
            .create("kubevirt.io", "virtualmachines", vm())
            .unwrap();
        settle_controllers(&app);
        let dv_key = Key::new("cdi.kubevirt.io", "datavolumes", "default", "web-root");
        app.store.modify(&dv_key, |o| {
            o["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("ownerReferences");
        });
        app.store.delete(
            &Key::of("kubevirt.io", "virtualmachines", &second),
            Propagation::Cascade,
        );
        let kept = app.store.get(&dv_key).expect("released DV survives");
        assert!(get(&app, "", "persistentvolumeclaims", "web-root").is_some());
        assert!(get(&app, "kubevirt.io", "virtualmachineinstances", "web").is_none());

        // ... and a VM recreated from the same declaration adopts it, data and all.
        let third = app
            .store
            .create("kubevirt.io", "virtualmachines", vm())
            .unwrap();
        settle_controllers(&app);
        let adopted = app.store.get(&dv_key).unwrap();
        assert_eq!(adopted["metadata"]["uid"], kept["metadata"]["uid"]);
        assert!(owned_by(&adopted, &third));
        let vm = get(&app, "kubevirt.io", "virtualmachines", "web").unwrap();
        assert_eq!(vm["status"]["printableStatus"], "Running");
    }
}
