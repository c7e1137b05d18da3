//! What the platforms do when a guest powers itself off (or dies), and how long a graceful
//! stop may take before the guest is killed.
//!
//! - KubeVirt: virt-handler moves the VMI to `Succeeded` when the domain shut down from inside
//!   (`Failed` when it crashed) and the virt-launcher pod completes; the VM controller then acts
//!   by run strategy (virt-controller `pkg/virt-controller/watch/vm/vm.go`, `syncRunStrategy`):
//!   `Always` deletes the final VMI and starts a new one; `RerunOnFailure` deletes it and starts
//!   a new one only after a failure (a `Succeeded` VMI is deleted and the VM stays stopped);
//!   `Halted` deletes it; `Manual` and `Once` leave the final VMI alone (printableStatus
//!   `Stopped`).
//! - Deckhouse (virtualization-controller `pkg/controller/vm/internal/sync_power_state.go`): a
//!   shutdown from inside restarts an `AlwaysOn` VM; `AlwaysOnUnlessStoppedManually` and
//!   `Manual` VMs stop ("Stop initiated from inside the guest VirtualMachine"): it counts as a
//!   manual stop. A failed guest restarts under `AlwaysOn` and `AlwaysOnUnlessStoppedManually`;
//!   the source does nothing for a failed `Manual` VM, which leaves it not running: stopped here.
//! - Grace period: KubeVirt kills the domain `spec.terminationGracePeriodSeconds` of the VMI
//!   after the shutdown signal, 30 s when unset (`v1.DefaultGracePeriodSeconds`, used by
//!   virt-launcher's `converter.GracePeriodSeconds`); Deckhouse VM
//!   `spec.terminationGracePeriodSeconds`, default 60 (CRD `virtualmachines.yaml`).

use std::time::Duration;

use super::*;
use crate::core::guest::{GuestExit, GuestSpec};

/// Annotation on a KubeVirt VM whose `RerunOnFailure` VMI succeeded (its guest powered off):
/// no new VMI until a start request (vm.go starts it only on a start request then).
const STOPPED_FROM_GUEST: &str = "emulator.kubevm.io/stopped-from-guest";

/// KubeVirt's default grace period of a VMI that sets none (`v1.DefaultGracePeriodSeconds`).
pub const KUBEVIRT_DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// Deckhouse's default `spec.terminationGracePeriodSeconds` of a VirtualMachine.
pub const DECKHOUSE_DEFAULT_GRACE: Duration = Duration::from_secs(60);

fn seconds(obj: &Value, default: Duration) -> Duration {
    obj.pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .map_or(default, |s| Duration::from_secs(s.max(0) as u64))
}

/// How long the guest of a KubeVirt VMI may take to power off.
pub fn kubevirt_grace(vmi: &Value) -> Duration {
    seconds(vmi, KUBEVIRT_DEFAULT_GRACE)
}

/// How long the guest of a Deckhouse VirtualMachine may take to power off.
pub fn deckhouse_grace(vm: &Value) -> Duration {
    seconds(vm, DECKHOUSE_DEFAULT_GRACE)
}

/// The grace period of VM `ns/name`'s guest (KubeVirt: of its VMI), if the VM is known.
pub fn grace_period(app: &App, ns: &str, name: &str) -> Option<Duration> {
    if app
        .registry
        .find_plural(KV, "virtualmachineinstances")
        .is_some()
    {
        return app
            .store
            .get(&Key::new(KV, "virtualmachineinstances", ns, name))
            .map(|v| kubevirt_grace(&v));
    }
    app.store
        .get(&Key::new(DH, "virtualmachines", ns, name))
        .map(|v| deckhouse_grace(&v))
}

/// What the KubeVirt VM controller does with a final (Succeeded/Failed) VMI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalVmi {
    /// Delete it and start a new one.
    Restart,
    /// Delete it; the VM stays stopped.
    Remove,
    /// Leave it (the VM shows `Stopped`).
    Keep,
}

/// vm.go `syncRunStrategy` for a final VMI, by run strategy and VMI phase.
pub fn after_final_vmi(run_strategy: &str, phase: &str) -> FinalVmi {
    match (run_strategy, phase) {
        ("Always", _) => FinalVmi::Restart,
        ("RerunOnFailure", "Failed") => FinalVmi::Restart,
        ("RerunOnFailure", _) | ("Halted", _) => FinalVmi::Remove,
        _ => FinalVmi::Keep,
    }
}

/// What Deckhouse does with a VM whose guest ended by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeckhouseAfterExit {
    /// Start it again.
    Restart,
    /// The VM is Stopped.
    Stop,
}

/// sync_power_state.go, by runPolicy.
pub fn deckhouse_after_exit(run_policy: &str, exit: GuestExit) -> DeckhouseAfterExit {
    match (run_policy, exit) {
        ("AlwaysOn", _) => DeckhouseAfterExit::Restart,
        ("AlwaysOnUnlessStoppedManually", GuestExit::Crashed) => DeckhouseAfterExit::Restart,
        _ => DeckhouseAfterExit::Stop,
    }
}

/// Whether a `RerunOnFailure` VM stays stopped because its guest powered itself off.
pub(super) fn stopped_from_guest(vm: &Value) -> bool {
    annotation(vm, STOPPED_FROM_GUEST).is_some()
}

/// Clears [`stopped_from_guest`] (a start request or a new VMI).
pub(super) fn clear_stopped_from_guest(app: &App, vm_key: &Key) {
    if app
        .store
        .get(vm_key)
        .is_some_and(|vm| stopped_from_guest(&vm))
    {
        app.store
            .modify(vm_key, |o| set_annotation(o, STOPPED_FROM_GUEST, None));
    }
}

/// The KubeVirt VM controller's handling of a final VMI (see [`after_final_vmi`]); returns the
/// VMI left afterwards.
pub(super) fn kubevirt_final_vmi(
    app: &App,
    vm_key: &Key,
    vmi_key: &Key,
    rs: &str,
    vmi: &Value,
) -> Option<Value> {
    match after_final_vmi(rs, phase(vmi)) {
        FinalVmi::Keep => Some(vmi.clone()),
        action => {
            if action == FinalVmi::Remove && rs == "RerunOnFailure" {
                app.store.modify(vm_key, |o| {
                    set_annotation(o, STOPPED_FROM_GUEST, Some(meta_str(vmi, "uid")))
                });
            }
            unsettle(app, vmi);
            app.store.delete(vmi_key, Propagation::Cascade);
            None
        }
    }
}

/// A guest ended by itself: KubeVirt's VMI of that boot goes `Succeeded` (powered off) or
/// `Failed`, with its virt-launcher pod; a Deckhouse VM restarts or stops by its runPolicy.
pub fn guest_exited(app: &App, spec: &GuestSpec, exit: GuestExit) {
    let final_phase = match exit {
        GuestExit::PoweredOff => "Succeeded",
        GuestExit::Crashed => "Failed",
    };
    if app
        .registry
        .find_plural(KV, "virtualmachineinstances")
        .is_some()
    {
        let key = Key::new(KV, "virtualmachineinstances", &spec.namespace, &spec.name);
        let Some(vmi) = app.store.get(&key) else {
            return;
        };
        if meta_str(&vmi, "uid") != spec.boot_id || phase(&vmi) != "Running" {
            return;
        }
        unsettle(app, &vmi);
        app.store.modify(&key, |o| {
            let mut st = o["status"].clone();
            st["phase"] = json!(final_phase);
            let mut ts = st["phaseTransitionTimestamps"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            ts.push(json!({"phase": final_phase, "phaseTransitionTimestamp": now_rfc3339()}));
            st["phaseTransitionTimestamps"] = json!(ts);
            if let Some(c) = st["conditions"].as_array_mut() {
                c.retain(|c| c["type"] != "AgentConnected");
            }
            set_condition(&mut st, "Ready", false, "PodTerminating", "");
            o["status"] = st;
        });
        let (pods, _) = app.store.list("", "pods", Some(&spec.namespace));
        for p in pods.iter().filter(|p| {
            p.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|r| r.iter().any(|r| r["uid"] == vmi["metadata"]["uid"]))
        }) {
            app.store.modify(&Key::of("", "pods", p), |o| {
                o["status"]["phase"] = json!(final_phase);
                if let Some(cs) = o["status"]["containerStatuses"].as_array_mut() {
                    for c in cs {
                        c["ready"] = json!(false);
                    }
                }
            });
        }
        return;
    }
    let key = Key::new(DH, "virtualmachines", &spec.namespace, &spec.name);
    let Some(vm) = app.store.get(&key) else {
        return;
    };
    if crate::core::guest::boot_id(app, &spec.namespace, &spec.name).as_deref()
        != Some(spec.boot_id.as_str())
    {
        return;
    }
    let policy = vm
        .pointer("/spec/runPolicy")
        .and_then(Value::as_str)
        .unwrap_or("AlwaysOnUnlessStoppedManually");
    unsettle(app, &vm);
    match deckhouse_after_exit(policy, exit) {
        DeckhouseAfterExit::Restart => app.store.modify(&key, |o| {
            // A new start: a new lastStartTime (so a new boot of the guest).
            set_annotation(o, POWER, Some("on"));
            if o["status"].is_object() {
                let now = now_rfc3339();
                o["status"]["stats"] = json!({"lastStartTime": now,
                    "phasesTransitions": [{"phase": "Running", "timestamp": now}]});
            }
        }),
        // Stopped at once (the status controller says so too on its next run): no new boot.
        DeckhouseAfterExit::Stop => app.store.modify(&key, |o| {
            set_annotation(o, POWER, Some("off"));
            if o["status"].is_object() {
                o["status"]["phase"] = json!("Stopped");
            }
        }),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_periods_default_per_platform() {
        assert_eq!(
            kubevirt_grace(&json!({"spec": {}})),
            Duration::from_secs(30)
        );
        assert_eq!(
            kubevirt_grace(&json!({"spec": {"terminationGracePeriodSeconds": 180}})),
            Duration::from_secs(180)
        );
        assert_eq!(
            kubevirt_grace(&json!({"spec": {"terminationGracePeriodSeconds": 0}})),
            Duration::ZERO
        );
        assert_eq!(
            deckhouse_grace(&json!({"spec": {}})),
            Duration::from_secs(60)
        );
        assert_eq!(
            deckhouse_grace(&json!({"spec": {"terminationGracePeriodSeconds": 5}})),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn final_vmi_by_run_strategy() {
        use FinalVmi::*;
        for (rs, phase, want) in [
            ("Always", "Succeeded", Restart),
            ("Always", "Failed", Restart),
            ("RerunOnFailure", "Succeeded", Remove),
            ("RerunOnFailure", "Failed", Restart),
            ("Manual", "Succeeded", Keep),
            ("Manual", "Failed", Keep),
            ("Halted", "Succeeded", Remove),
            ("Once", "Succeeded", Keep),
        ] {
            assert_eq!(after_final_vmi(rs, phase), want, "{rs} {phase}");
        }
    }

    #[test]
    fn deckhouse_guest_exit_by_run_policy() {
        use DeckhouseAfterExit::*;
        use GuestExit::*;
        for (policy, exit, want) in [
            ("AlwaysOn", PoweredOff, Restart),
            ("AlwaysOn", Crashed, Restart),
            ("AlwaysOnUnlessStoppedManually", PoweredOff, Stop),
            ("AlwaysOnUnlessStoppedManually", Crashed, Restart),
            ("Manual", PoweredOff, Stop),
            ("Manual", Crashed, Stop),
            ("AlwaysOff", PoweredOff, Stop),
        ] {
            assert_eq!(
                deckhouse_after_exit(policy, exit),
                want,
                "{policy} {exit:?}"
            );
        }
    }
}
