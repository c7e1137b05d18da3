//! `set` on KubeVirt: CPU as the template's topology (`--cpu` changes sockets, the dimension
//! KubeVirt hot-plugs under `vmRolloutStrategy: LiveUpdate`), memory as
//! `domain.memory.guest`, an instancetype-backed VM through its instancetype; the run strategy
//! on the VM, the eviction strategy and grace period in the template. What applies live is
//! the VM's `RestartRequired` condition (virt-controller, `pkg/virt-controller/watch/vm/vm.go`).

use serde_json::{Value, json};

use super::policy::{Policy, one_of};
use super::resources::Resources;
use super::{Applies, SetPlatform, true_condition};
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::placement::object_at;
use crate::quantity::Quantity;

/// KubeVirt's implementation.
pub(super) struct KubeVirt;

/// `spec.runStrategy` values (kubevirt `api/core/v1/types.go`, `VirtualMachineRunStrategy`;
/// `WaitAsReceiver` is the migration target's, not the user's).
const RUN_STRATEGIES: &[&str] = &["Always", "RerunOnFailure", "Manual", "Halted", "Once"];
/// `evictionStrategy` values (`EvictionStrategy` in the same file).
const EVICTION_STRATEGIES: &[&str] = &["None", "LiveMigrate", "LiveMigrateIfPossible", "External"];

const TEMPLATE_SPEC: &str = "/spec/template/spec";

fn count(v: Option<&Value>) -> u32 {
    v.and_then(Value::as_u64).unwrap_or(0) as u32
}

fn name_of(vm: &Value) -> &str {
    vm.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn usage(vm: &Value, what: String) -> Error {
    Error::Usage(format!("virtualmachine {:?}: {what}", name_of(vm)))
}

fn quantity_at(vm: &Value, pointer: &str) -> Option<Quantity> {
    vm.pointer(pointer)
        .and_then(Value::as_str)
        .and_then(|s| Quantity::parse(s).ok())
}

impl SetPlatform for KubeVirt {
    fn flavor(&self) -> Flavor {
        Flavor::KubeVirt
    }

    fn check_resources(&self, request: &Resources) -> Result<()> {
        if request.core_fraction.is_some() {
            return Err(Error::InvalidTarget(
                "--core-fraction is Deckhouse's: KubeVirt has no core fraction (set CPU requests in the template instead)".into(),
            ));
        }
        if request.instancetype.is_some() && request.sizes() {
            return Err(Error::InvalidTarget(
                "--instancetype replaces the VM's CPU and memory: give it alone".into(),
            ));
        }
        Ok(())
    }

    fn resources(&self, request: &Resources, vm: &mut Value) -> Result<()> {
        let instancetype = vm.pointer("/spec/instancetype").cloned();
        if let Some(name) = &request.instancetype {
            let Some(current) = instancetype else {
                return Err(usage(
                    vm,
                    "has no instancetype (its template sets CPU and memory): use --cpu/--memory"
                        .into(),
                ));
            };
            let spec = object_at(vm, "/spec/instancetype");
            if current["name"] != json!(name) {
                spec.insert("name".into(), json!(name));
                // The revision names the old instancetype's ControllerRevision: the
                // controller picks the new one's.
                spec.remove("revisionName");
            }
            return Ok(());
        }
        if let Some(it) = instancetype {
            return Err(usage(
                vm,
                format!(
                    "takes its CPU and memory from {} {:?}; change it with --instancetype NAME",
                    it["kind"]
                        .as_str()
                        .unwrap_or("VirtualMachineClusterInstancetype"),
                    it["name"].as_str().unwrap_or("")
                ),
            ));
        }
        let cpu = vm.pointer(&format!("{TEMPLATE_SPEC}/domain/cpu")).cloned();
        let cores = request
            .cores
            .unwrap_or_else(|| count(cpu.as_ref().and_then(|c| c.get("cores"))).max(1));
        let threads = request
            .threads
            .unwrap_or_else(|| count(cpu.as_ref().and_then(|c| c.get("threads"))).max(1));
        let mut sockets = request.sockets;
        if let Some(total) = request.cpu {
            if total % (cores * threads) != 0 {
                return Err(usage(
                    vm,
                    format!(
                        "--cpu {total} is not a whole number of sockets of {cores} core(s) × {threads} thread(s); give --sockets/--cores/--threads"
                    ),
                ));
            }
            sockets = Some(total / (cores * threads));
        }
        let max_sockets = count(cpu.as_ref().and_then(|c| c.get("maxSockets")));
        if let Some(s) = sockets
            && max_sockets != 0
            && s > max_sockets
        {
            // virt-api's VM admitter refuses sockets above a maxSockets set in the template.
            return Err(usage(
                vm,
                format!(
                    "{s} CPU sockets exceed its maxSockets ({max_sockets}); raise spec.template.spec.domain.cpu.maxSockets (needs a restart) or ask for fewer"
                ),
            ));
        }
        if sockets.is_some() || request.cores.is_some() || request.threads.is_some() {
            let c = object_at(vm, &format!("{TEMPLATE_SPEC}/domain/cpu"));
            if let Some(s) = sockets {
                c.insert("sockets".into(), json!(s));
            }
            if let Some(n) = request.cores {
                c.insert("cores".into(), json!(n));
            }
            if let Some(n) = request.threads {
                c.insert("threads".into(), json!(n));
            }
        }
        if let Some(memory) = request.memory {
            let guest = format!("{TEMPLATE_SPEC}/domain/memory/guest");
            let requests = format!("{TEMPLATE_SPEC}/domain/resources/requests/memory");
            let limits = format!("{TEMPLATE_SPEC}/domain/resources/limits/memory");
            if let Some(max) = quantity_at(vm, &format!("{TEMPLATE_SPEC}/domain/memory/maxGuest"))
                && memory > max
            {
                return Err(usage(
                    vm,
                    format!(
                        "{memory} exceeds its maxGuest ({max}); raise spec.template.spec.domain.memory.maxGuest (needs a restart) or ask for less"
                    ),
                ));
            }
            let text = json!(memory.to_string());
            if vm.pointer(&guest).is_some() || vm.pointer(&requests).is_none() {
                object_at(vm, &format!("{TEMPLATE_SPEC}/domain/memory"))
                    .insert("guest".into(), text);
            } else {
                object_at(vm, &format!("{TEMPLATE_SPEC}/domain/resources/requests"))
                    .insert("memory".into(), text.clone());
                if vm.pointer(&limits).is_some() {
                    object_at(vm, &format!("{TEMPLATE_SPEC}/domain/resources/limits"))
                        .insert("memory".into(), text);
                }
            }
        }
        Ok(())
    }

    fn check_policy(&self, request: &Policy) -> Result<()> {
        if let Some(s) = &request.run_strategy {
            one_of("--run-strategy", s, RUN_STRATEGIES, "KubeVirt")?;
        }
        if let Some(s) = &request.eviction {
            one_of("--eviction-strategy", s, EVICTION_STRATEGIES, "KubeVirt")?;
        }
        Ok(())
    }

    fn policy(&self, request: &Policy, vm: &mut Value) -> Result<()> {
        if let Some(s) = &request.run_strategy {
            let spec = object_at(vm, "/spec");
            spec.insert("runStrategy".into(), json!(s));
            // `running` and `runStrategy` are mutually exclusive (virt-api's VM admitter).
            spec.remove("running");
        }
        if let Some(s) = &request.eviction {
            object_at(vm, TEMPLATE_SPEC).insert("evictionStrategy".into(), json!(s));
        }
        if let Some(g) = request.grace_period {
            object_at(vm, TEMPLATE_SPEC).insert("terminationGracePeriodSeconds".into(), json!(g));
        }
        let meta = if request.template {
            "/spec/template/metadata"
        } else {
            "/metadata"
        };
        request.edit_metadata(object_at(vm, meta));
        Ok(())
    }

    fn check_networks(&self, request: &super::network::Networks) -> Result<()> {
        crate::network::spec::kubevirt_check(request)
    }

    fn networks(&self, request: &super::network::Networks, vm: &mut Value) -> Result<()> {
        crate::network::spec::kubevirt_edit(request, vm)
    }

    fn network_objects(
        &self,
        request: &super::network::Networks,
        vm: &Value,
    ) -> Result<Vec<crate::network::spec::NetworkObject>> {
        crate::network::spec::kubevirt_objects(request, vm)
    }

    fn verdict(&self, vm: &Value) -> Applies {
        if let Some(message) = true_condition(vm, "RestartRequired") {
            return Applies::AtRestart {
                message: message.to_owned(),
                pending: vec![],
            };
        }
        // The VMI's `NodePlacementNotMatched`, which virt-controller mirrors on the VM
        // (`pkg/virt-controller/watch/vm/vm.go`, `syncConditions`): the workload updater
        // live-migrates the VMI until its node matches the new placement
        // (`pkg/virt-controller/watch/workload-updater/workload-updater.go`).
        if let Some(c) = crate::lifecycle::condition(vm, "NodePlacementNotMatched")
            .filter(|c| c["status"] == "True")
        {
            let message = c["message"].as_str().filter(|m| !m.is_empty());
            return Applies::Migrating {
                message: message
                    .unwrap_or(
                        "the VMI's node no longer matches its placement (NodePlacementNotMatched)",
                    )
                    .to_owned(),
            };
        }
        if vm.pointer("/status/created").and_then(Value::as_bool) != Some(true) {
            return Applies::AtStart;
        }
        Applies::Live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn web() -> Value {
        json!({"metadata": {"name": "web"}, "spec": {"template": {"spec": {"domain": {
            "cpu": {"cores": 2}, "memory": {"guest": "2Gi"}}}}}})
    }

    #[test]
    fn cpu_changes_sockets_of_the_topology() {
        let mut vm = web();
        let r = Resources {
            cpu: Some(4),
            memory: Some(Quantity::parse("4Gi").unwrap()),
            ..Default::default()
        };
        KubeVirt.resources(&r, &mut vm).unwrap();
        assert_eq!(
            vm["spec"]["template"]["spec"]["domain"]["cpu"],
            json!({"cores": 2, "sockets": 2})
        );
        assert_eq!(
            vm["spec"]["template"]["spec"]["domain"]["memory"]["guest"],
            "4Gi"
        );
        let odd = Resources {
            cpu: Some(3),
            ..Default::default()
        };
        assert!(KubeVirt.resources(&odd, &mut web()).is_err());
    }

    #[test]
    fn max_sockets_and_instancetypes_are_respected() {
        let mut vm = web();
        vm["spec"]["template"]["spec"]["domain"]["cpu"]["maxSockets"] = json!(2);
        let r = Resources {
            sockets: Some(3),
            ..Default::default()
        };
        let e = KubeVirt.resources(&r, &mut vm).unwrap_err().to_string();
        assert!(e.contains("maxSockets (2)"), "{e}");
        let mut it = json!({"metadata": {"name": "db"}, "spec": {"instancetype": {"kind": "VirtualMachineClusterInstancetype", "name": "u1.small", "revisionName": "r1"}}});
        let e = KubeVirt
            .resources(
                &Resources {
                    cpu: Some(2),
                    ..Default::default()
                },
                &mut it,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("--instancetype"), "{e}");
        KubeVirt
            .resources(
                &Resources {
                    instancetype: Some("u1.large".into()),
                    ..Default::default()
                },
                &mut it,
            )
            .unwrap();
        assert_eq!(
            it["spec"]["instancetype"],
            json!({"kind": "VirtualMachineClusterInstancetype", "name": "u1.large"})
        );
    }

    #[test]
    fn verdict_reads_restart_required() {
        let vm = json!({"status": {"created": true, "conditions": [{"type": "RestartRequired", "status": "True", "message": "m"}]}});
        assert_eq!(
            KubeVirt.verdict(&vm),
            Applies::AtRestart {
                message: "m".into(),
                pending: vec![]
            }
        );
        assert_eq!(
            KubeVirt.verdict(&json!({"status": {"created": true}})),
            Applies::Live
        );
        assert_eq!(KubeVirt.verdict(&json!({"status": {}})), Applies::AtStart);
    }
}
