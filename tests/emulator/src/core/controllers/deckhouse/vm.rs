//! VirtualMachineClass and the Deckhouse VirtualMachine: waiting for its block devices, its
//! power state from `runPolicy`, and its virt-launcher pod.

use super::DH;
use super::attachment::hotplugged_refs;
use crate::core::app::App;
use crate::core::controllers::{key_of, owner_ref, set_condition, uid_bytes};
use crate::core::store::Key;
use crate::core::util::{meta_str, now_rfc3339};
use serde_json::{Value, json};

/// VirtualMachineClass: Ready.
pub(in crate::core::controllers) fn vm_class(app: &App, class: &Value, _tick: bool) {
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
pub(in crate::core::controllers) fn deckhouse_vm(app: &App, vm: &Value, _tick: bool) {
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
    ref_status.extend(hotplugged_refs(app, vm));
    // Power state from runPolicy and operations: lifecycle/.
    let (power_phase, node) = crate::core::lifecycle::deckhouse_power(vm);
    // A VM naming a VirtualMachineIPAddress waits for its address (kubevirt/network.rs).
    let named_ip = crate::kubevirt::network::deckhouse_vm_address(app, vm);
    let mut phase = if !devices_ready || named_ip.is_err() {
        "Pending"
    } else {
        power_phase
    };
    let mut unschedulable = (phase == "Starting"
        && vm
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(crate::core::lifecycle::UNSCHEDULABLE))
            == Some(&json!("true")))
    .then(|| crate::core::lifecycle::UNSCHEDULABLE_MESSAGE.to_string());
    // Where it runs, and the workload updater's migration after a placement change
    // (deckhouse/placement.rs); a VM no node fits stays Starting with the scheduler's message.
    let node = match crate::deckhouse::placement::deckhouse_place(app, vm, phase, &node) {
        Ok(node) => node,
        Err(message) => {
            phase = "Starting";
            unschedulable = Some(message);
            node
        }
    };
    let [a, b, ..] = uid_bytes(vm);
    let ip = match &named_ip {
        Ok(Some((_, address))) => address.clone(),
        _ => format!("10.66.{}.{}", a, b % 254 + 1),
    };
    let name = meta_str(vm, "name").to_string();
    let uid5 = meta_str(vm, "uid").get(..5).unwrap_or("00000").to_string();
    let real_agent = app.guests.real_agent();
    // What runs and what waits for a restart: live_update.rs.
    let (applied, awaiting) = crate::kubevirt::live_update::deckhouse_sync(
        app,
        vm,
        matches!(phase, "Running" | "Migrating" | "Stopping"),
    );
    app.store.modify(&key_of(DH, "virtualmachines", vm), |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!(phase);
        st["blockDeviceRefs"] = json!(ref_status);
        st["observedGeneration"] = o["metadata"]["generation"].clone();
        st["resources"] = json!({
            "cpu": {"cores": applied.pointer("/cpu/cores").cloned().unwrap_or(json!(1)),
                    "coreFraction": applied.pointer("/cpu/coreFraction").cloned().unwrap_or(json!("100%"))},
            "memory": {"size": applied.pointer("/memory/size").cloned().unwrap_or(json!("1Gi"))}
        });
        match &named_ip {
            Ok(Some((name, _))) => st["virtualMachineIPAddressName"] = json!(name),
            _ => {
                st.as_object_mut().map(|m| m.remove("virtualMachineIPAddressName"));
            }
        }
        if o.pointer("/spec/virtualMachineIPAddressName").is_some() {
            let ready = named_ip.is_ok();
            set_condition(&mut st, "VirtualMachineIPAddressReady", ready,
                if ready { "VirtualMachineIPAddressReady" } else { "VirtualMachineIPAddressNotFound" },
                if ready { "" } else { "the VirtualMachineIPAddress has no address yet" });
        }
        // The networks the machine runs with (network.rs).
        st["networks"] = crate::kubevirt::network::deckhouse_status_networks(o, &applied, uid_bytes(o));
        match &awaiting {
            Some((changes, message)) => {
                st["restartAwaitingChanges"] = changes.clone();
                set_condition(&mut st, "AwaitingRestartToApplyConfiguration", true, "ChangesPendingRestart", message);
            }
            None => {
                st.as_object_mut().map(|m| m.remove("restartAwaitingChanges"));
                if let Some(c) = st["conditions"].as_array_mut() {
                    c.retain(|c| c["type"] != "AwaitingRestartToApplyConfiguration");
                }
            }
        }
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
        if let Some(message) = &unschedulable {
            set_condition(&mut st, "Running", false, "PodNotStarted", message);
        } else {
            set_condition(&mut st, "Running", running, if running { "Running" } else { "NotRunning" }, "");
        }
        // With real guests the agent reports itself (qemu_guest.rs); it is gone once the VM stops.
        let agent = running && (!real_agent || crate::core::table::eval_first(&st, ".conditions[?(@.type=='AgentReady')].status") == Some(&json!("True")));
        set_condition(&mut st, "AgentReady", agent, if agent { "AgentReady" } else { "AgentNotReady" }, "");
        set_condition(&mut st, "Migratable", running, if running { "VirtualMachineMigratable" } else { "NotRunning" }, "");
        o["status"] = st;
    });
    sync_launcher_pod(
        app,
        vm,
        matches!(phase, "Running" | "Migrating" | "Stopping"),
        &ip,
        &node,
    );
}

/// The running VM's virt-launcher pod, named as `status.virtualMachinePods` says. Deckhouse
/// runs a renamed KubeVirt: the pod carries `kubevirt.internal.virtualization.deckhouse.io:
/// virt-launcher` and `vm.kubevirt.internal.virtualization.deckhouse.io/name: <VM>` (what
/// `d8 v collect-debug-info` selects on, FACTS §8) and the VM's own labels, which the user
/// guide's Service examples select on. Upstream the pod's owner is the internal VMI; the
/// emulator has none, so the VM owns it (deleting the VM collects it all the same).
fn sync_launcher_pod(app: &App, vm: &Value, running: bool, ip: &str, node: &str) {
    let ns = meta_str(vm, "namespace");
    let name = meta_str(vm, "name");
    let uid5 = meta_str(vm, "uid").get(..5).unwrap_or("00000");
    let pod_name = format!("virt-launcher-{name}-{uid5}");
    let key = Key::new("", "pods", ns, &pod_name);
    let existing = app.store.get(&key);
    if !running {
        if existing.is_some() {
            app.store
                .delete(&key, crate::core::store::Propagation::Cascade);
        }
        return;
    }
    if let Some(pod) = existing {
        // A migration moved the VM: the new pod runs on the target node.
        if pod.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
            app.store
                .modify(&key, |o| o["spec"]["nodeName"] = json!(node));
        }
        return;
    }
    let mut labels = vm
        .pointer("/metadata/labels")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or(json!({}));
    labels["kubevirt.internal.virtualization.deckhouse.io"] = json!("virt-launcher");
    labels["vm.kubevirt.internal.virtualization.deckhouse.io/name"] = json!(name);
    let image = "dev-registry.deckhouse.io/virtualization/virt-launcher:v1.5.0";
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                     "ownerReferences": [owner_ref(vm)]},
        "spec": {"nodeName": node, "containers": [{"name": "compute", "image": image}]},
        "status": {"phase": "Running", "podIP": ip, "hostIP": "192.168.0.11",
                   "containerStatuses": [{"name": "compute", "ready": true, "restartCount": 0, "image": image}]},
    });
    let vm_key = Key::of("virtualization.deckhouse.io", "virtualmachines", vm);
    crate::core::gc::create_dependent(app, &vm_key, vm, "", "pods", pod);
}
