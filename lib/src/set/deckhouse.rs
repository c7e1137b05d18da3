//! `set` on Deckhouse: `spec.cpu.cores`, `spec.cpu.coreFraction` and `spec.memory.size`
//! within the VirtualMachineClass sizing policy; `spec.runPolicy`, `spec.liveMigrationPolicy`
//! and `spec.terminationGracePeriodSeconds`. Deckhouse VMs have no template: their own labels
//! and annotations reach the VM's pod. What waits for a restart is the VM's
//! `AwaitingRestartToApplyConfiguration` condition and `status.restartAwaitingChanges`
//! (virtualization-controller, `pkg/controller/vm/internal/sync_kvvm.go`).

use serde_json::{Value, json};

use super::policy::{Policy, one_of};
use super::resources::Resources;
use super::{Applies, SetPlatform, object_at, true_condition};
use crate::error::{Error, Result};
use crate::flavor::Flavor;

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

    fn placement_pointer(&self) -> &'static str {
        "/spec"
    }

    fn check_networks(&self, request: &super::network::Networks) -> Result<()> {
        super::network::deckhouse_check(request)
    }

    fn networks(&self, request: &super::network::Networks, vm: &mut Value) -> Result<()> {
        super::network::deckhouse_edit(request, vm)
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
}
