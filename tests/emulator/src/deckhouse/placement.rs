//! Deckhouse: where a VM runs, and the workload updater's migration of a running VM whose
//! placement changed.

use serde_json::{Value, json};

use crate::core::app::App;
use crate::core::scheduler::node_placement;
use crate::core::util::{meta_str, random_suffix};

/// Deckhouse: the workload updater's annotations on its operations (deckhouse/virtualization
/// `pkg/common/annotations`: `AnnVMOPWorkloadUpdate`, `AnnVMOPWorkloadUpdateNodePlacementSum`).
pub const DH_WORKLOAD_UPDATE: &str = "virtualization.deckhouse.io/workload-update";
/// See [`DH_WORKLOAD_UPDATE`].
pub const DH_PLACEMENT_SUM: &str = "virtualization.deckhouse.io/workload-update-node-placement-sum";
/// `maxMigrationAttempts` of the one-shot migration service.
const DH_MAX_ATTEMPTS: usize = 3;
const DH: &str = "virtualization.deckhouse.io";

/// Deckhouse VM `vm` whose disks are ready and whose power state makes it `phase`
/// (lifecycle's): where it runs. A VM starting for the first time is scheduled by its
/// placement (scheduler.rs): `Err` carries the scheduler's message when no node fits (the VM
/// stays `Starting`). A running VM keeps the node and the placement its pod was made with;
/// when its spec's node selector or affinity changed, Deckhouse's KubeVirt marks the internal
/// VMI `NodePlacementNotMatched` ("027-auto-migrate-if-nodeplacement-changed") and the
/// workload updater's node placement handler (`pkg/controller/workload-updater/internal/
/// handler/nodeplacement.go`) asks for one migration per placement through
/// `OnceMigrate` (`internal/service/one_shot_migration.go`): a VirtualMachineOperation of type
/// `Evict` named `nodeplacement-update-…`, annotated [`DH_WORKLOAD_UPDATE`] and
/// [`DH_PLACEMENT_SUM`] (the md5 of the placement's JSON, `genNodePlacementSum`), unless an
/// operation of the VM is unfinished, one for this placement completed, or
/// `maxMigrationAttempts` (3) for it failed. The operation's migration (lifecycle's) moves the
/// VM to a node the placement fits, then [`deckhouse_migrated`] records the new pod.
pub fn deckhouse_place(app: &App, vm: &Value, phase: &str, node: &str) -> Result<String, String> {
    let uid = meta_str(vm, "uid").to_string();
    let running = matches!(phase, "Running" | "Migrating" | "Stopping");
    let recorded = {
        let mut pods = app.started.pods.lock().unwrap_or_else(|e| e.into_inner());
        if !running {
            pods.remove(&uid);
            return Ok(node.to_string());
        }
        pods.get(&uid).cloned()
    };
    let Some(pod) = recorded else {
        let at = crate::core::scheduler::schedule(app, &vm["spec"])?;
        record(app, vm, &at);
        return Ok(at);
    };
    let at = pod["node"].as_str().unwrap_or(node).to_string();
    let want = node_placement(&vm["spec"]);
    if phase == "Running" && want != pod["placement"] {
        dh_once_migrate(app, vm, &want);
    }
    Ok(at)
}

/// The pod of Deckhouse VM `vm` now runs on `node`, made from its current spec.
fn record(app: &App, vm: &Value, node: &str) {
    app.started
        .pods
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(
            meta_str(vm, "uid").to_string(),
            json!({"placement": node_placement(&vm["spec"]), "node": node}),
        );
}

/// A fixture's Deckhouse VM that already runs: its pod was made from the spec as loaded.
pub fn seeded(app: &App, vm: &Value) {
    let running = matches!(
        vm.pointer("/status/phase").and_then(Value::as_str),
        Some("Running" | "Migrating")
    );
    if vm["apiVersion"].as_str().is_some_and(|v| v.starts_with(DH))
        && vm["kind"] == "VirtualMachine"
        && running
    {
        let node = vm
            .pointer("/status/nodeName")
            .and_then(Value::as_str)
            .unwrap_or(crate::core::controllers::NODE);
        record(app, vm, node);
    }
}

/// A migration of Deckhouse VM `vm` to `node` completed (any: the workload updater's, the
/// user's or an eviction): its new pod has the VM's placement.
pub fn deckhouse_migrated(app: &App, vm: &Value, node: &str) {
    record(app, vm, node);
}

fn md5_hex(text: &str) -> String {
    use md5::{Digest, Md5};
    Md5::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `OneShotMigrationService.OnceMigrate` for the node placement trigger.
fn dh_once_migrate(app: &App, vm: &Value, placement: &Value) {
    let sum = md5_hex(&placement.to_string());
    let name = meta_str(vm, "name").to_string();
    let ns = meta_str(vm, "namespace").to_string();
    let (ops, _) = app.store.list(DH, "virtualmachineoperations", Some(&ns));
    let mut failed = 0;
    for op in ops.iter().filter(|o| {
        o.pointer("/spec/virtualMachineName")
            .and_then(Value::as_str)
            == Some(&name)
            && matches!(
                o.pointer("/spec/type").and_then(Value::as_str),
                Some("Migrate" | "Evict")
            )
    }) {
        let phase = op
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !matches!(phase, "Completed" | "Failed" | "Superseded") {
            return;
        }
        let annotations = op.pointer("/metadata/annotations");
        let ours = annotations
            .and_then(|a| a.get(DH_WORKLOAD_UPDATE))
            .is_some()
            && annotations.and_then(|a| a.get(DH_PLACEMENT_SUM)) == Some(&json!(sum));
        match phase {
            "Completed" if ours => return,
            "Failed" if ours => failed += 1,
            _ => {}
        }
    }
    if failed >= DH_MAX_ATTEMPTS {
        return;
    }
    let vmop = json!({
        "apiVersion": format!("{DH}/v1alpha2"), "kind": "VirtualMachineOperation",
        "metadata": {"name": format!("nodeplacement-update-{}", random_suffix(5)), "namespace": ns,
                     "annotations": {DH_WORKLOAD_UPDATE: "true", DH_PLACEMENT_SUM: sum}},
        "spec": {"type": "Evict", "virtualMachineName": name},
    });
    let _ = app.store.create(DH, "virtualmachineoperations", vmop);
}

#[cfg(test)]
mod scheduling_tests;
