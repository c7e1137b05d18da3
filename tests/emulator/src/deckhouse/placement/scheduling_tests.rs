//! A placement no node fits leaves the VM unschedulable with kube-scheduler's message (both
//! platforms); a running Deckhouse VM whose placement changed is moved by the workload
//! updater's `nodeplacement-update-…` Evict operation.

use super::*;
use crate::ServeFlavor;
use crate::core::controllers::reconcile_all;
use crate::core::registry::Registry;
use crate::core::store::Key;
use std::time::Duration;

const KV: &str = "kubevirt.io";

fn app(flavor: ServeFlavor) -> App {
    let app = App::new(Registry::new(flavor), Duration::from_secs(1));
    for n in ["node-1", "node-2"] {
        app.store
            .create(
                "",
                "nodes",
                json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}}),
            )
            .unwrap();
    }
    app
}

fn settle(app: &App, n: usize) {
    for _ in 0..n {
        reconcile_all(app, true);
    }
}

fn condition<'a>(o: &'a Value, type_: &str) -> Option<&'a Value> {
    o.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
}

const NO_FIT: &str = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.";

#[test]
fn kubevirt_vm_no_node_fits_stays_unschedulable_with_the_schedulers_message() {
    let app = app(ServeFlavor::KubeVirt);
    app.store
        .create(
            KV,
            "virtualmachines",
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {}},
                "nodeSelector": {"disktype": "nvme"}}}}}),
        )
        .unwrap();
    settle(&app, 6);
    let key = |plural: &str| Key::new(KV, plural, "default", "web");
    let vmi = app.store.get(&key("virtualmachineinstances")).unwrap();
    assert_eq!(vmi["status"]["phase"], "Scheduling");
    let c = condition(&vmi, "PodScheduled").unwrap();
    assert_eq!(
        (&c["status"], &c["reason"]),
        (&json!("False"), &json!("Unschedulable"))
    );
    assert_eq!(c["message"], NO_FIT);
    let vm = app.store.get(&key("virtualmachines")).unwrap();
    assert_eq!(condition(&vm, "PodScheduled").unwrap()["message"], NO_FIT);
    assert_eq!(vm["status"]["printableStatus"], "ErrorUnschedulable");
    let (pods, _) = app.store.list("", "pods", Some("default"));
    assert_eq!(
        condition(&pods[0], "PodScheduled").unwrap()["message"],
        NO_FIT
    );
    let (events, _) = app.store.list("", "events", Some("default"));
    let failed: Vec<&Value> = events
        .iter()
        .filter(|e| e["reason"] == "FailedScheduling")
        .collect();
    assert_eq!(failed.len(), 1, "one event, not one per tick");
    assert_eq!(failed[0]["message"], NO_FIT);
    assert_eq!(
        failed[0]["involvedObject"]["name"],
        pods[0]["metadata"]["name"]
    );

    // A selector some node fits: the next VMI runs there.
    app.store.modify(&key("virtualmachines"), |o| {
        o["spec"]["template"]["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": "node-2"})
    });
    app.store.delete(
        &key("virtualmachineinstances"),
        crate::core::store::Propagation::Cascade,
    );
    settle(&app, 8);
    let vmi = app.store.get(&key("virtualmachineinstances")).unwrap();
    assert_eq!(vmi["status"]["phase"], "Running");
    assert_eq!(vmi["status"]["nodeName"], "node-2");
    assert!(condition(&vmi, "PodScheduled").is_none_or(|c| c["status"] != "False"));
    let (pods, _) = app.store.list("", "pods", Some("default"));
    assert_eq!(pods[0]["spec"]["nodeName"], "node-2");
}

fn dh_vm(app: &App, spec_extra: Value) {
    let mut spec = json!({"runPolicy": "AlwaysOn", "virtualMachineClassName": "generic",
        "cpu": {"cores": 1}, "memory": {"size": "1Gi"}, "blockDeviceRefs": []});
    for (k, v) in spec_extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    app.store
        .create(DH, "virtualmachines", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualMachine", "metadata": {"name": "linux", "namespace": "default"}, "spec": spec}))
        .unwrap();
}

fn dh_get(app: &App) -> Value {
    app.store
        .get(&Key::new(DH, "virtualmachines", "default", "linux"))
        .unwrap()
}

#[test]
fn deckhouse_vm_no_node_fits_stays_starting_with_the_schedulers_message() {
    let app = app(ServeFlavor::Deckhouse);
    dh_vm(
        &app,
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}}}}),
    );
    settle(&app, 4);
    let vm = dh_get(&app);
    assert_eq!(vm["status"]["phase"], "Starting");
    let c = condition(&vm, "Running").unwrap();
    assert_eq!(
        (&c["status"], &c["reason"]),
        (&json!("False"), &json!("PodNotStarted"))
    );
    assert_eq!(c["message"], NO_FIT);
    assert!(vm.pointer("/status/nodeName").is_none());
}

#[test]
fn deckhouse_placement_change_of_a_running_vm_is_migrated_by_the_workload_updater() {
    let app = app(ServeFlavor::Deckhouse);
    dh_vm(&app, json!({}));
    settle(&app, 3);
    let vm = dh_get(&app);
    assert_eq!(vm["status"]["phase"], "Running");
    assert_eq!(vm["status"]["nodeName"], "node-1");
    let key = Key::new(DH, "virtualmachines", "default", "linux");
    // Tolerations do not move the VM (genNodePlacementSum hashes the selector and affinity).
    app.store.modify(&key, |o| {
        o["spec"]["tolerations"] =
            json!([{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}])
    });
    settle(&app, 3);
    assert!(
        app.store
            .list(DH, "virtualmachineoperations", None)
            .0
            .is_empty()
    );

    app.store.modify(&key, |o| {
        o["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": "node-2"})
    });
    reconcile_all(&app, true);
    let ops = app.store.list(DH, "virtualmachineoperations", None).0;
    assert_eq!(ops.len(), 1);
    let op = &ops[0];
    assert!(
        meta_str(op, "name").starts_with("nodeplacement-update-"),
        "{op}"
    );
    assert_eq!(
        op["spec"],
        json!({"type": "Evict", "virtualMachineName": "linux"})
    );
    assert_eq!(op["metadata"]["annotations"][DH_WORKLOAD_UPDATE], "true");
    let placement = json!({"affinity": null, "nodeSelector": {"kubernetes.io/hostname": "node-2"}});
    assert_eq!(
        op["metadata"]["annotations"][DH_PLACEMENT_SUM],
        md5_hex(&placement.to_string())
    );
    let mut phases = vec![];
    for _ in 0..12 {
        reconcile_all(&app, true);
        let p = dh_get(&app)["status"]["phase"].clone();
        if phases.last() != Some(&p) {
            phases.push(p);
        }
    }
    // The operation is Pending for one pass, then the VM migrates.
    assert_eq!(
        phases,
        [json!("Running"), json!("Migrating"), json!("Running")]
    );
    let vm = dh_get(&app);
    assert_eq!(vm["status"]["nodeName"], "node-2");
    let ops = app.store.list(DH, "virtualmachineoperations", None).0;
    assert_eq!(ops.len(), 1, "one migration per placement");
    assert_eq!(ops[0]["status"]["phase"], "Completed");
    let (pods, _) = app.store.list("", "pods", Some("default"));
    assert_eq!(pods[0]["spec"]["nodeName"], "node-2");
}

/// A placement no other node fits: the operation fails, and the updater tries
/// `maxMigrationAttempts` (3) times, then gives up.
#[test]
fn deckhouse_updater_gives_up_after_three_failed_migrations() {
    let app = app(ServeFlavor::Deckhouse);
    dh_vm(&app, json!({}));
    settle(&app, 3);
    app.store
        .modify(&Key::new(DH, "virtualmachines", "default", "linux"), |o| {
            o["spec"]["nodeSelector"] = json!({"disktype": "nvme"})
        });
    settle(&app, 20);
    let ops = app.store.list(DH, "virtualmachineoperations", None).0;
    assert_eq!(ops.len(), 3, "{ops:?}");
    assert!(ops.iter().all(|o| o["status"]["phase"] == "Failed"));
    let vm = dh_get(&app);
    assert_eq!(vm["status"]["phase"], "Running");
    assert_eq!(vm["status"]["nodeName"], "node-1");
}

/// Both nodes tainted: a VM without tolerations is unschedulable with TaintToleration's
/// reason for each node; one tolerating `dedicated=gpu:NoSchedule` runs on the node with that
/// taint (not on the one whose `NoExecute` taint it does not tolerate).
#[test]
fn kubevirt_vm_lands_only_on_a_node_whose_taints_it_tolerates() {
    let app = app(ServeFlavor::KubeVirt);
    for (node, taint) in [
        (
            "node-1",
            json!({"key": "maintenance", "value": "true", "effect": "NoExecute"}),
        ),
        (
            "node-2",
            json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}),
        ),
    ] {
        app.store
            .modify(&Key::new("", "nodes", "", node), |o| {
                o["spec"] = json!({"taints": [taint]})
            })
            .unwrap();
    }
    let vm = |name: &str, tolerations: Value| {
        app.store
            .create(
                KV,
                "virtualmachines",
                json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {}},
                    "tolerations": tolerations}}}}),
            )
            .unwrap();
    };
    vm("plain", json!([]));
    vm(
        "gpu",
        json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]),
    );
    settle(&app, 8);
    let vmi = |name: &str| {
        app.store
            .get(&Key::new(KV, "virtualmachineinstances", "default", name))
            .unwrap()
    };
    let plain = vmi("plain");
    assert_eq!(plain["status"]["phase"], "Scheduling");
    assert_eq!(
        condition(&plain, "PodScheduled").unwrap()["message"],
        "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 1 node(s) had untolerated taint {maintenance: true}. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    );
    let gpu = vmi("gpu");
    assert_eq!(gpu["status"]["phase"], "Running");
    assert_eq!(gpu["status"]["nodeName"], "node-2");
}
