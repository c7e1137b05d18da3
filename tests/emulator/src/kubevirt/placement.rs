//! A running KubeVirt VM whose placement changed: under `vmRolloutStrategy: LiveUpdate`
//! virt-controller copies the template's node selector, affinity and tolerations to the VMI
//! (`pkg/virt-controller/watch/vm/vm.go`, `handleAffinityChangeRequest` /
//! `handleTolerationsChangeRequest`; refused while the VMI migrates); a VMI whose node selector
//! or affinity no longer matches its launcher pod's gets the condition `NodePlacementNotMatched`
//! (`VirtualMachineInstanceNodePlacementNotMatched`), which virt-controller mirrors on the VM;
//! the workload updater live-migrates such a VMI
//! (`pkg/virt-controller/watch/workload-updater/workload-updater.go`, `doesRequireMigration` /
//! `isNodePlacementInProgress`, migrations named `kubevirt-workload-update-…`), the target pod
//! being scheduled with the VMI's node selector; when the migration completes the pod matches
//! again and the condition goes. Tolerations reach the VMI but never make the pod mismatch
//! (a toleration only widens where a pod may run): they apply live without a migration.
//! Deckhouse patches the same mechanism into its KubeVirt ("027-auto-migrate-if-nodeplacement-
//! changed" in its kubevirt patches' README).
//!
//! Emulator simplification: after a workload-update migration failed (no node matches), no
//! new one is started for that VMI (upstream retries with a backoff).

use serde_json::{Value, json};

use crate::core::app::App;
use crate::core::scheduler::node_placement;
use crate::core::store::Key;
use crate::core::util::{meta_str, random_suffix};

/// The VMI (and VM) condition type.
pub const NOT_MATCHED: &str = "NodePlacementNotMatched";
const KV: &str = "kubevirt.io";
/// The annotation the workload updater puts on its migrations.
const WORKLOAD_UPDATE: &str = "kubevirt.io/workloadUpdateMigration";

fn is_migrating(vmi: &Value) -> bool {
    vmi.pointer("/status/migrationState")
        .is_some_and(|s| s.get("completed").and_then(Value::as_bool) != Some(true))
}

/// The launcher pod's node placement of VMI `uid` (recorded at first sight from the VMI).
fn pod_placement(app: &App, vmi: &Value) -> Value {
    let uid = meta_str(vmi, "uid").to_string();
    app.started
        .pods
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(uid)
        .or_insert_with(|| node_placement(&vmi["spec"]))
        .clone()
}

/// A migration of `vmi` completed: its (target) pod was made from the VMI's spec.
pub fn migrated(app: &App, vmi: &Value) {
    let uid = meta_str(vmi, "uid").to_string();
    app.started
        .pods
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(uid, node_placement(&vmi["spec"]));
}

/// The node selector a migration target of `vmi` must match: the VMI's own and the
/// migration's `addedNodeSelector`.
pub fn target_selector(vmi: &Value, added: Option<&Value>) -> Value {
    let mut sel = vmi
        .pointer("/spec/nodeSelector")
        .filter(|v| v.is_object())
        .cloned()
        .unwrap_or(json!({}));
    if let Some(added) = added.and_then(Value::as_object) {
        for (k, v) in added {
            sel[k] = v.clone();
        }
    }
    sel
}

/// KubeVirt VM `vm` with VMI `vmi_key`, under rollout strategy `live`: copy the placement to
/// the VMI, keep its `NodePlacementNotMatched`, start the workload updater's migration.
/// Returns whether the VMI's placement no longer matches its pod (the VM mirrors it).
pub fn kubevirt_sync(app: &App, vm: &Value, vmi_key: &Key, live: bool) -> bool {
    let Some(mut vmi) = app.store.get(vmi_key) else {
        return false;
    };
    let template = vm
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or(json!({}));
    // The pod was made before any change copied now.
    let pod = pod_placement(app, &vmi);
    if live && !is_migrating(&vmi) {
        let mut changed = false;
        for field in ["nodeSelector", "affinity", "tolerations"] {
            if vmi["spec"].get(field) != template.get(field) {
                changed = true;
                match template.get(field) {
                    Some(v) => vmi["spec"][field] = v.clone(),
                    None => {
                        vmi["spec"].as_object_mut().map(|m| m.remove(field));
                    }
                }
            }
        }
        if changed {
            let spec = vmi["spec"].clone();
            app.store.modify(vmi_key, |o| o["spec"] = spec);
        }
    }
    let mismatch = node_placement(&vmi["spec"]) != pod;
    let had = crate::core::table::eval_first(
        &vmi,
        ".status.conditions[?(@.type=='NodePlacementNotMatched')].status",
    ) == Some(&json!("True"));
    if mismatch != had {
        app.store.modify(vmi_key, |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            if mismatch {
                crate::core::controllers::set_condition(&mut st, NOT_MATCHED, true, "", "");
            } else if let Some(c) = st["conditions"].as_array_mut() {
                c.retain(|c| c["type"] != NOT_MATCHED);
            }
            o["status"] = st;
        });
    }
    if mismatch && !is_migrating(&vmi) {
        start_workload_update(app, &vmi);
    }
    mismatch
}

/// The workload updater's migration of `vmi`, unless one is active (or one failed: see the
/// module's note).
pub(crate) fn start_workload_update(app: &App, vmi: &Value) {
    let name = meta_str(vmi, "name").to_string();
    let ns = meta_str(vmi, "namespace").to_string();
    let (all, _) = app
        .store
        .list(KV, "virtualmachineinstancemigrations", Some(&ns));
    let blocked = all
        .iter()
        .filter(|m| m.pointer("/spec/vmiName").and_then(Value::as_str) == Some(&name))
        .any(|m| {
            let phase = m
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("");
            let ours = m
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(WORKLOAD_UPDATE))
                .is_some();
            phase != "Succeeded" && (phase != "Failed" || ours)
        });
    if blocked {
        return;
    }
    let vmim = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": format!("kubevirt-workload-update-{}", random_suffix(5)), "namespace": ns,
                     "labels": {"kubevirt.io/vmi-name": name},
                     "annotations": {WORKLOAD_UPDATE: ""}},
        "spec": {"vmiName": name},
    });
    let _ = app
        .store
        .create(KV, "virtualmachineinstancemigrations", vmim);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServeFlavor;
    use crate::core::controllers::reconcile_all;
    use crate::core::registry::Registry;
    use std::time::Duration;

    fn get(app: &App, plural: &str) -> Value {
        app.store
            .get(&Key::new(KV, plural, "default", "web"))
            .unwrap()
    }

    fn condition(o: &Value) -> Option<Value> {
        crate::core::table::eval_first(
            o,
            ".status.conditions[?(@.type=='NodePlacementNotMatched')].status",
        )
        .cloned()
    }

    /// vm.go copies the placement to the VMI; NodePlacementNotMatched (on the VMI and the VM)
    /// makes the workload updater migrate it to a node the new selector matches; tolerations
    /// alone apply without a migration; a priority class waits for a restart.
    #[test]
    fn a_node_selector_change_migrates_tolerations_do_not() {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
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
        app.store
            .create(KV, "virtualmachines", json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {}}}}}}))
            .unwrap();
        for _ in 0..5 {
            reconcile_all(&app, true);
        }
        assert_eq!(
            get(&app, "virtualmachineinstances")["status"]["nodeName"],
            "node-1"
        );
        let key = Key::new(KV, "virtualmachines", "default", "web");
        let toleration = json!([{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]);
        app.store.modify(&key, |o| {
            o["spec"]["template"]["spec"]["tolerations"] = toleration.clone()
        });
        reconcile_all(&app, true);
        assert_eq!(
            get(&app, "virtualmachineinstances")["spec"]["tolerations"],
            toleration
        );
        assert_eq!(condition(&get(&app, "virtualmachines")), None);
        assert!(
            app.store
                .list(KV, "virtualmachineinstancemigrations", None)
                .0
                .is_empty()
        );

        app.store.modify(&key, |o| {
            o["spec"]["template"]["spec"]["nodeSelector"] =
                json!({"kubernetes.io/hostname": "node-2"})
        });
        reconcile_all(&app, true);
        assert_eq!(
            condition(&get(&app, "virtualmachineinstances")),
            Some(json!("True"))
        );
        assert_eq!(
            condition(&get(&app, "virtualmachines")),
            Some(json!("True"))
        );
        let migrations = app
            .store
            .list(KV, "virtualmachineinstancemigrations", None)
            .0;
        assert_eq!(migrations.len(), 1);
        assert!(meta_str(&migrations[0], "name").starts_with("kubevirt-workload-update-"));
        for _ in 0..15 {
            reconcile_all(&app, true);
        }
        let vmi = get(&app, "virtualmachineinstances");
        assert_eq!(vmi["status"]["nodeName"], "node-2");
        assert_eq!(condition(&vmi), None);
        assert_eq!(condition(&get(&app, "virtualmachines")), None);
        assert_eq!(
            app.store
                .list(KV, "virtualmachineinstancemigrations", None)
                .0
                .len(),
            1
        );

        // Not live-updatable: RestartRequired (vm.go, syncRestartRequired).
        app.store.modify(&key, |o| {
            o["spec"]["template"]["spec"]["priorityClassName"] = json!("high")
        });
        reconcile_all(&app, true);
        let vm = get(&app, "virtualmachines");
        assert_eq!(
            crate::core::table::eval_first(
                &vm,
                ".status.conditions[?(@.type=='RestartRequired')].status"
            ),
            Some(&json!("True"))
        );
    }
}
