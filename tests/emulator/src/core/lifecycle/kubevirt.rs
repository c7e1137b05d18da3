//! KubeVirt controllers: run strategies and `status.stateChangeRequests` (virt-controller
//! `vm.go`), VMI phases with virt-launcher pods, VirtualMachineInstanceMigrations.

use super::*;

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
    // A final VMI (its guest powered off or failed): vm.go by run strategy (guest_exit.rs).
    if let Some(v) = vmi
        .as_ref()
        .filter(|v| is_final(v) && annotation(v, STOPPING).is_none())
    {
        return guest_exit::kubevirt_final_vmi(app, &vm_key, &vmi_key, &rs, v);
    }
    let once_done = annotation(vm, "emulator.kubevm.io/ran-once").is_some();
    let want = match rs.as_str() {
        "Always" => true,
        "RerunOnFailure" => match &vmi {
            Some(v) => phase(v) != "Succeeded",
            None => !guest_exit::stopped_from_guest(vm),
        },
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
    guest_exit::clear_stopped_from_guest(app, &Key::of(KV, "virtualmachines", vm));
    let mut vmi = new_vmi(vm);
    vmi["status"] = json!({"phase": "Pending",
        "phaseTransitionTimestamps": [{"phase": "Pending", "phaseTransitionTimestamp": now_rfc3339()}]});
    if paused {
        vmi["spec"]["startStrategy"] = json!("Paused");
    }
    if annotation(vm, UNSCHEDULABLE) == Some("true") {
        set_annotation(&mut vmi, UNSCHEDULABLE, Some("true"));
    }
    // The VM may have been deleted since it was read: a VMI made for it then is collected at
    // once, as the garbage collector removes a dependent whose owner is gone.
    let vm_key = Key::of(KV, "virtualmachines", vm);
    crate::core::gc::create_dependent_object(app, &vm_key, vm, KV, "virtualmachineinstances", vmi)
}

/// Whether a cloud-init Secret the VMI names (`secretRef`, `networkDataSecretRef`) is absent.
fn missing_cloud_init_secret(app: &App, vmi: &Value) -> bool {
    let ns = meta_str(vmi, "namespace");
    vmi.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            v.get("cloudInitNoCloud")
                .or_else(|| v.get("cloudInitConfigDrive"))
        })
        .flat_map(|ci| {
            ["secretRef", "networkDataSecretRef"].map(|r| ci.pointer(&format!("/{r}/name")))
        })
        .flatten()
        .filter_map(Value::as_str)
        .any(|name| app.store.get(&Key::new("", "secrets", ns, name)).is_none())
}

/// VMI phases, one per tick: Pending → Scheduling (virt-launcher pod Pending) → Scheduled →
/// Running (pod Running). A VMI being stopped goes at the next tick, pod and all.
pub fn kubevirt_vmi(app: &App, vmi: &Value, tick: bool) {
    if !tick {
        return;
    }
    let key = Key::of(KV, "virtualmachineinstances", vmi);
    if annotation(vmi, STOPPING).is_some() {
        // A real guest powers off first: the VMI goes once its qemu has exited, killed when
        // the VMI's grace period ends. A grace period of at most 1 s (a forced stop or
        // restart, lifecycle.go) ends it at once.
        let force = vmi
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .is_some_and(|g| g <= 1);
        if app.guests.power_off(
            meta_str(vmi, "namespace"),
            meta_str(vmi, "name"),
            force,
            guest_exit::kubevirt_grace(vmi),
        ) {
            return;
        }
        delete_launcher_pods(app, vmi);
        app.store.delete(&key, Propagation::Cascade);
        return;
    }
    if phase(vmi) == "Running"
        && let Some(volume_status) = crate::kubevirt::hotplug::volume_status(app, vmi)
    {
        app.store
            .modify(&key, |o| o["status"]["volumeStatus"] = volume_status);
    }
    // kube-scheduler binds the launcher pod to a node its placement fits (scheduler.rs).
    let scheduled = crate::core::scheduler::schedule(app, &vmi["spec"]);
    let next = match phase(vmi) {
        "Pending" => "Scheduling",
        "Scheduling" if annotation(vmi, UNSCHEDULABLE) == Some("true") => {
            unschedulable(app, vmi, UNSCHEDULABLE_MESSAGE);
            return;
        }
        "Scheduling" if scheduled.is_err() => {
            unschedulable(
                app,
                vmi,
                scheduled.as_ref().err().map_or("", String::as_str),
            );
            return;
        }
        "Scheduling" => "Scheduled",
        // The launcher pod mounts each cloud-init Secret as a (non-optional) secret volume
        // (pkg/virt-controller/services/rendervolumes.go `handleCloudInitNoCloud`,
        // `handleCloudInitConfigDrive`): the kubelet starts it only once they exist.
        "Scheduled" if missing_cloud_init_secret(app, vmi) => return,
        "Scheduled" => "Running",
        _ => return,
    };
    if next == "Scheduling" {
        let mut pod = launcher_pod(vmi);
        if crate::kubevirt::console_log::enabled(app, vmi) {
            let image = pod["spec"]["containers"][0]["image"].clone();
            pod["spec"]["initContainers"] = json!([crate::kubevirt::console_log::container(
                crate::core::util::meta_str(vmi, "uid"),
                image.as_str().unwrap_or_default()
            )]);
        }
        pod["status"] = json!({"phase": "Pending"});
        let vmi_key = Key::of(KV, "virtualmachineinstances", vmi);
        crate::core::gc::create_dependent(app, &vmi_key, vmi, "", "pods", pod);
    }
    let mut template = new_vmi_status_running(vmi);
    let node = scheduled.unwrap_or_else(|_| NODE.to_string());
    template["nodeName"] = json!(node);
    if app.guests.real_agent() {
        // The real guest agent reports these once it answers (qemu_guest.rs).
        if let Some(c) = template["conditions"].as_array_mut() {
            c.retain(|c| c["type"] != "AgentConnected");
        }
        if let Some(m) = template.as_object_mut() {
            m.remove("guestOSInfo");
        }
    }
    // The pod's IP is the one the running VMI reports (virt-handler reads it from the pod).
    let running_ip = template
        .pointer("/interfaces/0/ipAddress")
        .cloned()
        .unwrap_or(json!(""));
    app.store.modify(&key, |o| {
        let mut st = if next == "Running" {
            template
        } else {
            o["status"].clone()
        };
        st["phase"] = json!(next);
        if next == "Running" {
            o["metadata"]["labels"]["kubevirt.io/nodeName"] = json!(node);
            // The scheduling failure is over.
            if let Some(c) = st["conditions"].as_array_mut() {
                c.retain(|c| !(c["type"] == "PodScheduled" && c["status"] == "False"));
            }
        }
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
                o["spec"]["nodeName"] = json!(node);
                let ip = running_ip.clone();
                o["status"] = json!({"phase": "Running", "podIP": ip, "hostIP": "192.168.0.11",
                    "containerStatuses": [{"name": "compute", "ready": true, "restartCount": 0,
                        "image": "quay.io/kubevirt/virt-launcher:v1.9.0"}]});
                // The native sidecar runs beside it (an init container with restartPolicy
                // Always reports in initContainerStatuses, started and ready).
                let sidecars: Vec<Value> = o["spec"]["initContainers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        json!({"name": c["name"], "ready": true, "started": true,
                        "restartCount": 0, "image": c["image"],
                        "state": {"running": {"startedAt": crate::core::util::now_rfc3339()}}})
                    })
                    .collect();
                if !sidecars.is_empty() {
                    o["status"]["initContainerStatuses"] = json!(sidecars);
                }
            });
        }
    }
}

/// No node takes the VMI's launcher pod: kube-scheduler leaves it Pending with condition
/// `PodScheduled` `False`, reason `Unschedulable` and its message, and records a
/// `FailedScheduling` Warning event on it (`pkg/scheduler/schedule_one.go`, `handleSchedulingFailure`);
/// virt-controller copies the condition to the VMI (`pkg/virt-controller/watch/vmi/vmi.go`,
/// `syncPodScheduledCondition`) and the VM controller to the VM.
fn unschedulable(app: &App, vmi: &Value, message: &str) {
    let key = Key::of(KV, "virtualmachineinstances", vmi);
    let already = crate::core::table::eval_first(
        vmi,
        ".status.conditions[?(@.type=='PodScheduled')].message",
    ) == Some(&json!(message));
    if already {
        return;
    }
    app.store.modify(&key, |o| {
        let mut st = o["status"].clone();
        set_condition(&mut st, "PodScheduled", false, "Unschedulable", message);
        o["status"] = st;
    });
    let (pods, _) = app.store.list("", "pods", Some(meta_str(vmi, "namespace")));
    for p in pods.iter().filter(|p| owned(p, vmi)) {
        app.store.modify(&Key::of("", "pods", p), |o| {
            let mut st = o["status"].clone();
            set_condition(&mut st, "PodScheduled", false, "Unschedulable", message);
            o["status"] = st;
        });
        crate::core::scheduler::failed_scheduling_event(app, p, message);
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
                if crate::core::table::eval_first(
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

/// The emulator's count of a migration's Running ticks (an annotation on the VMIM).
const MIGRATION_STEP: &str = "emulator.kubevm.io/migration-step";

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
    // The target pod is scheduled with the VMI's node selector and the migration's own.
    let selector =
        crate::kubevirt::placement::target_selector(&vmi, vmim.pointer("/spec/addedNodeSelector"));
    let target = pick_target(app, &source, &selector, &vmi["spec"]);
    // How many ticks the migration has been Running: kept in an emulator annotation, not in
    // `status.migrationState` (whose fields are upstream's VirtualMachineInstanceMigrationState).
    let step = annotation(vmim, MIGRATION_STEP)
        .and_then(|s| s.parse::<i64>().ok())
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
        crate::kubevirt::placement::migrated(app, &vmi);
        crate::kubevirt::network::migrated(app, &vmi_key, crate::core::controllers::uid_seed(&vmi));
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
        st["migrationState"] = state.clone();
        if next == "Running" {
            o["metadata"]["annotations"][MIGRATION_STEP] = json!((step + 1).to_string());
        }
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
    let vmi_key = Key::of(KV, "virtualmachineinstances", vmi);
    crate::core::gc::create_dependent(app, &vmi_key, vmi, "", "pods", pod);
}
