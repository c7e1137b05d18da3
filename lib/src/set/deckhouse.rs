//! `set` on Deckhouse: `spec.cpu.cores`, `spec.cpu.coreFraction` and `spec.memory.size`
//! within the VirtualMachineClass sizing policy; `spec.runPolicy`, `spec.liveMigrationPolicy`
//! and `spec.terminationGracePeriodSeconds`. Deckhouse VMs have no template: their own labels
//! and annotations reach the VM's pod. What waits for a restart is the VM's
//! `AwaitingRestartToApplyConfiguration` condition and `status.restartAwaitingChanges`
//! (virtualization-controller, `pkg/controller/vm/internal/sync_kvvm.go`).

use serde_json::{Value, json};

use super::policy::{Policy, one_of};
use super::resources::Resources;
use super::{Applies, FieldChange, SetPlatform, true_condition};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::lifecycle::VmRef;
use crate::placement::object_at;

/// Deckhouse's implementation.
pub(super) struct Deckhouse;

/// `spec.runPolicy` values (the VirtualMachine CRD's enum).
const RUN_POLICIES: &[&str] = &[
    "AlwaysOn",
    "AlwaysOff",
    "Manual",
    "AlwaysOnUnlessStoppedManually",
];
/// `spec.liveMigrationPolicy` values (the VirtualMachine CRD's enum).
const MIGRATION_POLICIES: &[&str] = &["AlwaysSafe", "PreferSafe", "AlwaysForced", "PreferForced"];

impl SetPlatform for Deckhouse {
    fn flavor(&self) -> Flavor {
        Flavor::Deckhouse
    }

    fn check_resources(&self, request: &Resources) -> Result<()> {
        let topology = [
            ("--sockets", request.sockets.is_some()),
            ("--cores", request.cores.is_some()),
            ("--threads", request.threads.is_some()),
        ];
        if let Some((flag, _)) = topology.iter().find(|(_, given)| *given) {
            return Err(Error::InvalidTarget(format!(
                "{flag} is KubeVirt's: a Deckhouse VM has a number of cores (--cpu), laid out in sockets by the platform"
            )));
        }
        if request.instancetype.is_some() {
            return Err(Error::InvalidTarget(
                "--instancetype is KubeVirt's: a Deckhouse VM is sized by --cpu/--memory within its VirtualMachineClass".into(),
            ));
        }
        Ok(())
    }

    fn resources(&self, request: &Resources, vm: &mut Value) -> Result<()> {
        if request.cpu.is_some() || request.core_fraction.is_some() {
            let cpu = object_at(vm, "/spec/cpu");
            if let Some(n) = request.cpu {
                cpu.insert("cores".into(), json!(n));
            }
            if let Some(f) = request.core_fraction {
                cpu.insert("coreFraction".into(), json!(f.to_string()));
            }
        }
        if let Some(m) = request.memory {
            object_at(vm, "/spec/memory").insert("size".into(), json!(m.to_string()));
        }
        Ok(())
    }

    fn check_networks(&self, request: &super::network::Networks) -> Result<()> {
        crate::network::spec::deckhouse_check(request)
    }

    fn networks(&self, request: &super::network::Networks, vm: &mut Value) -> Result<()> {
        crate::network::spec::deckhouse_edit(request, vm)
    }

    fn network_objects(
        &self,
        request: &super::network::Networks,
        vm: &Value,
    ) -> Result<Vec<crate::network::spec::NetworkObject>> {
        crate::network::spec::deckhouse_objects(request, vm)
    }

    fn sizing_class<'a>(&self, vm: &'a Value) -> Option<&'a str> {
        vm.pointer("/spec/virtualMachineClassName")
            .and_then(Value::as_str)
    }

    fn check_policy(&self, request: &Policy) -> Result<()> {
        if let Some(s) = &request.run_strategy {
            one_of(
                "--run-strategy",
                s,
                RUN_POLICIES,
                "Deckhouse (spec.runPolicy)",
            )?;
        }
        if let Some(s) = &request.eviction {
            one_of(
                "--eviction-strategy",
                s,
                MIGRATION_POLICIES,
                "Deckhouse (spec.liveMigrationPolicy)",
            )?;
        }
        if request.template {
            return Err(Error::InvalidTarget(
                "--template is KubeVirt's: a Deckhouse VM has no template, its own labels and annotations reach its pod".into(),
            ));
        }
        Ok(())
    }

    fn policy(&self, request: &Policy, vm: &mut Value) -> Result<()> {
        let spec = object_at(vm, "/spec");
        if let Some(s) = &request.run_strategy {
            spec.insert("runPolicy".into(), json!(s));
        }
        if let Some(s) = &request.eviction {
            spec.insert("liveMigrationPolicy".into(), json!(s));
        }
        if let Some(g) = request.grace_period {
            spec.insert("terminationGracePeriodSeconds".into(), json!(g));
        }
        request.edit_metadata(object_at(vm, "/metadata"));
        Ok(())
    }

    fn follow_move<'a>(
        &'a self,
        cluster: &'a Cluster,
        vm: &'a VmRef,
        changes: &'a [FieldChange],
        observed: &'a Value,
    ) -> futures::future::BoxFuture<'a, Result<Option<Applies>>> {
        Box::pin(follow_placement(cluster, vm, changes, observed))
    }

    fn verdict(&self, vm: &Value) -> Applies {
        if let Some(message) = true_condition(vm, "AwaitingRestartToApplyConfiguration") {
            let pending = vm
                .pointer("/status/restartAwaitingChanges")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|c| c["path"].as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            // `spec.disruptions.restartApprovalMode: Automatic`: the controller restarts the VM
            // itself (pkg/controller/vm/internal/sync_power_state.go).
            let automatic = vm
                .pointer("/spec/disruptions/restartApprovalMode")
                .and_then(Value::as_str)
                == Some("Automatic");
            let message = if automatic {
                format!(
                    "{message} (restartApprovalMode Automatic: Deckhouse restarts the VM by itself)"
                )
            } else {
                message.to_owned()
            };
            return Applies::AtRestart { message, pending };
        }
        let phase = vm.pointer("/status/phase").and_then(Value::as_str);
        // A placement change of a running VM is applied by a live migration (the workload
        // updater's Migrate operation: `pkg/controller/workload-updater/internal/handler/
        // nodeplacement.go`); the VM shows it as phase Migrating and its `Migrating` condition.
        if phase == Some("Migrating") || true_condition(vm, "Migrating").is_some() {
            let message = true_condition(vm, "Migrating")
                .filter(|m| !m.is_empty())
                .unwrap_or("the VM is in phase Migrating");
            return Applies::Migrating {
                message: message.to_owned(),
            };
        }
        if matches!(phase, Some("Running")) {
            Applies::Live
        } else {
            Applies::AtStart
        }
    }
}

/// The workload updater's annotation on the operations it creates (deckhouse/virtualization
/// `pkg/common/annotations`, `AnnVMOPWorkloadUpdate`).
const WORKLOAD_UPDATE: &str = "virtualization.deckhouse.io/workload-update";

/// Whether the change moves a running VM: its node selector or affinity (what the workload
/// updater's `genNodePlacementSum` hashes; tolerations only widen where it may run).
fn moves(changes: &[FieldChange]) -> bool {
    changes.iter().any(|c| {
        ["spec.nodeSelector", "spec.affinity"].iter().any(|f| {
            c.field == *f
                || c.field.starts_with(&format!("{f}."))
                || c.field.starts_with(&format!("{f}["))
        })
    })
}

/// When kubectl-vm last wrote `vm` (its managedFields entry), RFC 3339.
fn written_at(vm: &Value) -> Option<&str> {
    vm.pointer("/metadata/managedFields")
        .and_then(Value::as_array)?
        .iter()
        .filter(|f| f["manager"] == crate::names::FIELD_MANAGER)
        .filter_map(|f| f["time"].as_str())
        .max()
}

/// The workload updater's operation for `vm` after the write at `since`: one unfinished, or
/// one created since.
fn updater_operation<'a>(ops: &'a [Value], vm: &str, since: Option<&str>) -> Option<&'a Value> {
    ops.iter()
        .filter(|o| {
            o.pointer("/spec/virtualMachineName")
                .and_then(Value::as_str)
                == Some(vm)
        })
        .filter(|o| {
            o.pointer("/metadata/annotations")
                .and_then(|a| a.get(WORKLOAD_UPDATE))
                .is_some()
        })
        .find(|o| {
            !crate::lifecycle::deckhouse::is_terminal(o)
                || since.is_some_and(|t| {
                    o.pointer("/metadata/creationTimestamp")
                        .and_then(Value::as_str)
                        .is_some_and(|c| c >= t)
                })
        })
}

fn migrating(op: &Value) -> Applies {
    Applies::Migrating {
        message: format!(
            "the workload updater's VirtualMachineOperation {} ({}) moves it to a node its placement fits",
            op.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("?"),
            op.pointer("/spec/type")
                .and_then(Value::as_str)
                .unwrap_or("Evict"),
        ),
    }
}

/// A running VM whose node selector or affinity changed is moved by the workload updater
/// (`pkg/controller/workload-updater/internal/handler/nodeplacement.go`: once its internal
/// VMI reports `NodePlacementNotMatched`, `OnceMigrate` creates an `Evict` operation annotated
/// `workload-update`), when it can migrate (condition `Migratable`); the operation is watched
/// for until it appears.
async fn follow_placement(
    cluster: &Cluster,
    vm: &VmRef,
    changes: &[FieldChange],
    observed: &Value,
) -> Result<Option<Applies>> {
    use futures::StreamExt;
    use kube::api::{ListParams, WatchEvent, WatchParams};
    if !moves(changes)
        || observed.pointer("/status/phase").and_then(Value::as_str) != Some("Running")
    {
        return Ok(None);
    }
    if let Some(c) =
        crate::lifecycle::condition(observed, "Migratable").filter(|c| c["status"] != "True")
    {
        let why = c["message"]
            .as_str()
            .filter(|m| !m.is_empty())
            .or(c["reason"].as_str())
            .unwrap_or("not migratable");
        return Ok(Some(Applies::AtRestart {
            message: format!("the VM cannot migrate ({why}): it keeps its node until a restart"),
            pending: vec![],
        }));
    }
    let vmop = crate::lifecycle::deckhouse::VMOP;
    let api = vmop.api(&cluster.client, Some(&vm.namespace));
    let action = || vmop.action("list", Some(&vm.namespace));
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.error(e, &action()))?;
    let ops: Vec<Value> = list
        .items
        .iter()
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .collect();
    let since = written_at(observed);
    if let Some(op) = updater_operation(&ops, &vm.name, since) {
        return Ok(Some(migrating(op)));
    }
    let rv = list.metadata.resource_version.unwrap_or_default();
    let mut feed =
        crate::vm::restartable_watch(api, WatchParams::default().timeout(290), rv).boxed();
    while let Some(event) = feed.next().await {
        match event.map_err(|e| cluster.error(e, &vmop.action("watch", Some(&vm.namespace))))? {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                let o = serde_json::to_value(o).unwrap_or_default();
                if let Some(op) = updater_operation(std::slice::from_ref(&o), &vm.name, since) {
                    return Ok(Some(migrating(op)));
                }
            }
            WatchEvent::Error(status) => {
                return Err(Error::from_status(
                    status.code,
                    &status.reason,
                    &status.message,
                    &vmop.action("watch", Some(&vm.namespace)),
                    &cluster.server,
                ));
            }
            WatchEvent::Deleted(_) | WatchEvent::Bookmark(_) => {}
        }
    }
    Err(Error::Internal("the watch ended unexpectedly".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::create::options::CoreFraction;
    use crate::quantity::Quantity;

    #[test]
    fn resources_set_cores_fraction_and_size() {
        let mut vm = json!({"spec": {"cpu": {"cores": 1, "coreFraction": "10%"}, "memory": {"size": "1Gi"}}});
        let r = Resources {
            cpu: Some(2),
            memory: Some(Quantity::parse("2Gi").unwrap()),
            core_fraction: Some(CoreFraction::Percent(20)),
            ..Default::default()
        };
        Deckhouse.resources(&r, &mut vm).unwrap();
        assert_eq!(
            vm["spec"],
            json!({"cpu": {"cores": 2, "coreFraction": "20%"}, "memory": {"size": "2Gi"}})
        );
        assert!(
            Deckhouse
                .check_resources(&Resources {
                    sockets: Some(2),
                    ..Default::default()
                })
                .is_err()
        );
    }

    #[test]
    fn verdict_lists_the_pending_paths() {
        let vm = json!({"status": {"phase": "Running", "restartAwaitingChanges": [{"path": "cpu.cores"}],
            "conditions": [{"type": "AwaitingRestartToApplyConfiguration", "status": "True", "message": "wait"}]}});
        assert_eq!(
            Deckhouse.verdict(&vm),
            Applies::AtRestart {
                message: "wait".into(),
                pending: vec!["cpu.cores".into()]
            }
        );
        assert_eq!(
            Deckhouse.verdict(&json!({"status": {"phase": "Stopped"}})),
            Applies::AtStart
        );
        let mut auto = vm.clone();
        auto["spec"] = json!({"disruptions": {"restartApprovalMode": "Automatic"}});
        let Applies::AtRestart { message, .. } = Deckhouse.verdict(&auto) else {
            panic!("AtRestart expected")
        };
        assert!(
            message.ends_with("Deckhouse restarts the VM by itself)"),
            "{message}"
        );
    }

    #[test]
    fn a_placement_move_is_the_updaters_operation_after_the_write() {
        let change = |f: &str| FieldChange {
            field: f.into(),
            old: None,
            new: Some("x".into()),
        };
        assert!(moves(&[change(
            "spec.nodeSelector[kubernetes.io/hostname]"
        )]));
        assert!(moves(&[change("spec.affinity")]));
        assert!(!moves(&[change("spec.tolerations")]));
        assert!(!moves(&[change("spec.priorityClassName")]));
        let op = |name: &str, phase: &str, created: &str, ours: bool| {
            let mut o = json!({"metadata": {"name": name, "creationTimestamp": created},
                "spec": {"type": "Evict", "virtualMachineName": "web"}, "status": {"phase": phase}});
            if ours {
                o["metadata"]["annotations"] = json!({WORKLOAD_UPDATE: "true"});
            }
            o
        };
        let since = Some("2026-12-05T10:00:00Z");
        let ops = [
            op("old", "Completed", "2026-12-05T09:00:00Z", true),
            op("users", "InProgress", "2026-12-05T10:00:01Z", false),
        ];
        assert!(updater_operation(&ops, "web", since).is_none());
        let ops = [
            op("old", "Completed", "2026-12-05T09:00:00Z", true),
            op(
                "nodeplacement-update-abcde",
                "Completed",
                "2026-12-05T10:00:00Z",
                true,
            ),
        ];
        let found = updater_operation(&ops, "web", since).unwrap();
        assert_eq!(
            migrating(found),
            Applies::Migrating {
                message: "the workload updater's VirtualMachineOperation nodeplacement-update-abcde (Evict) moves it to a node its placement fits".into()
            }
        );
        assert!(updater_operation(&ops, "other", since).is_none());
        let written = json!({"metadata": {"managedFields": [
            {"manager": "kubectl-vm", "time": "2026-12-05T10:00:00Z"},
            {"manager": "kubectl-vm", "time": "2026-12-05T08:00:00Z"},
            {"manager": "virtualization-controller", "time": "2026-12-05T11:00:00Z"}]}});
        assert_eq!(written_at(&written), since);
    }
}
