//! Changing a running VM: which template changes KubeVirt applies live and which set the VM's
//! `RestartRequired` condition, and how Deckhouse reports changes that wait for a restart.
//!
//! KubeVirt (virt-controller, `pkg/virt-controller/watch/vm/vm.go`, `syncRestartRequired`,
//! `handleCPUChangeRequest`, `handleMemoryHotplugRequest`; defaults in
//! `pkg/defaults/defaults.go`, `setupCPUHotplug` / `setupMemoryHotplug`; the rollout strategy
//! in `pkg/virt-config/virt-config.go`, `IsVMRolloutStrategyLiveUpdate`, default `LiveUpdate`):
//! - the template spec the VMI started from (upstream: the start ControllerRevision) is
//!   compared with the VM's template spec; under `vmRolloutStrategy: LiveUpdate` CPU sockets,
//!   guest memory, node selector, affinity and tolerations are left out of the comparison;
//!   any other difference sets `RestartRequired` ("a non-live-updatable field was changed in
//!   the template spec"). The emulator also leaves out volumes and disks (upstream: live only
//!   when hotpluggable; the emulator's hotplug is in `hotplug.rs`), and under LiveUpdate the
//!   interfaces and networks, which `network.rs` judges (`IsRestartRequired`).
//! - then, under LiveUpdate, a change of sockets is hot-plugged into the VMI unless it exceeds
//!   the VMI's `maxSockets` or lowers the count (each sets `RestartRequired` with upstream's
//!   message); a change of guest memory likewise within `maxGuest`, not below the memory the
//!   VMI booted with, and only for a migratable VMI.
//! - a VMI gets `maxSockets` (`liveUpdateConfiguration.maxCpuSockets`, else sockets ×
//!   `maxHotplugRatio`, 4 by default) and `maxGuest` (`liveUpdateConfiguration.maxGuest`, else
//!   guest × ratio), `status.currentCPUTopology` and `status.memory`, only under LiveUpdate.
//!
//! Deckhouse (virtualization-controller, `pkg/controller/vm/internal/sync_kvvm.go` and
//! `pkg/controller/vmchange/`): the VM spec last applied to the running machine is compared
//! with the VM's spec field by field; changes whose action is `Restart` are listed in
//! `status.restartAwaitingChanges` (`{operation, path, currentValue, desiredValue}`) and set
//! `AwaitingRestartToApplyConfiguration` (reason `ChangesPendingRestart`); otherwise they are
//! applied at once. With the hotplug feature gates off (their default, locked in CE:
//! `pkg/featuregates/featuregate.go`), CPU cores, core fraction and memory size need a restart,
//! as do the class and the termination grace period; `runPolicy` applies at once; a stopped VM
//! takes every change at once.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::core::app::App;
use crate::kubevirt::export::parse_bytes;

/// virt-controller's message for a template change that only a restart applies.
pub const NON_LIVE_MESSAGE: &str = "a non-live-updatable field was changed in the template spec";

/// The specs running machines started from.
#[derive(Debug, Default)]
pub struct Started {
    /// KubeVirt: VMI uid → the VM template spec it started from.
    kubevirt: Mutex<HashMap<String, Value>>,
    /// Deckhouse: VM uid → the VM spec last applied to its machine.
    deckhouse: Mutex<HashMap<String, Value>>,
    /// KubeVirt: VMI uid → its launcher pod's node selector and affinity (`placement.rs`).
    pub(crate) pods: Mutex<HashMap<String, Value>>,
}

/// The cluster's `KubeVirt` object's `spec.configuration`, if there is one.
pub fn kubevirt_configuration(app: &App) -> Value {
    let (items, _) = app.store.list("kubevirt.io", "kubevirts", None);
    items
        .first()
        .and_then(|k| k.pointer("/spec/configuration").cloned())
        .unwrap_or(json!({}))
}

/// Whether the cluster's rollout strategy is LiveUpdate.
pub fn kubevirt_live_update(app: &App) -> bool {
    live_update(&kubevirt_configuration(app))
}

/// `IsVMRolloutStrategyLiveUpdate`: unset or `LiveUpdate`.
pub fn live_update(config: &Value) -> bool {
    config
        .get("vmRolloutStrategy")
        .and_then(Value::as_str)
        .is_none_or(|s| s == "LiveUpdate")
}

fn uint(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_u64).unwrap_or(0)
}

/// A quantity (string) or a plain number as bytes.
pub fn bytes(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::String(s) => parse_bytes(s),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// A byte count as a binary quantity (`4Gi`, `1536Mi`, or plain bytes).
fn quantity(n: u64) -> String {
    for (suffix, unit) in [
        ("Ti", 1u64 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ] {
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{}{suffix}", n / unit);
        }
    }
    n.to_string()
}

/// The hotplug headroom `SetDefaultVirtualMachineInstance` gives a VMI with domain spec
/// `domain` (`setupCPUHotplug` / `setupMemoryHotplug`): `maxSockets` and `maxGuest` in bytes,
/// each `None` when the domain already sets it or the rollout strategy is not LiveUpdate.
/// Unset sockets, cores and threads count as 1.
pub fn hotplug_headroom(config: &Value, domain: &Value) -> (Option<u64>, Option<u64>) {
    if !live_update(config) {
        return (None, None);
    }
    let field = |f: &str| uint(domain.pointer(&format!("/cpu/{f}"))).max(1);
    let (sockets, cores, threads) = (field("sockets"), field("cores"), field("threads"));
    let ratio = match uint(config.pointer("/liveUpdateConfiguration/maxHotplugRatio")) {
        0 => 4,
        r => r,
    };
    let max_sockets = (uint(domain.pointer("/cpu/maxSockets")) == 0).then(|| {
        let mut max = uint(config.pointer("/liveUpdateConfiguration/maxCpuSockets"));
        if max != 0 && sockets > max {
            max = sockets;
        }
        if max == 0 {
            max = sockets * ratio;
            if max * cores * threads > 512 {
                max = (512 / (cores * threads)).max(sockets);
            }
        }
        max
    });
    let guest = bytes(domain.pointer("/memory/guest"));
    let max_guest = match domain.pointer("/memory/maxGuest") {
        Some(_) => None,
        None => {
            bytes(config.pointer("/liveUpdateConfiguration/maxGuest")).or(guest.map(|g| g * ratio))
        }
    };
    (max_sockets, max_guest)
}

/// The VMI defaults of `SetDefaultVirtualMachineInstance` that hotplug relies on, applied once
/// to a VMI that lacks them (upstream's mutating webhook sets them at creation).
fn default_vmi(config: &Value, vmi: &mut Value) {
    if vmi.pointer("/status/currentCPUTopology").is_some() {
        return;
    }
    let (max_sockets, max_guest) = hotplug_headroom(config, &vmi["spec"]["domain"]);
    let spec = &mut vmi["spec"]["domain"];
    if !spec["cpu"].is_object() {
        spec["cpu"] = json!({});
    }
    for f in ["sockets", "cores", "threads"] {
        if uint(spec["cpu"].get(f)) == 0 {
            spec["cpu"][f] = json!(1);
        }
    }
    let (sockets, cores, threads) = (
        uint(spec["cpu"].get("sockets")),
        uint(spec["cpu"].get("cores")),
        uint(spec["cpu"].get("threads")),
    );
    if let Some(max) = max_sockets {
        spec["cpu"]["maxSockets"] = json!(max);
    }
    let guest = bytes(spec.pointer("/memory/guest"));
    if let Some(max) = max_guest {
        spec["memory"]["maxGuest"] = json!(quantity(max));
    }
    let status = &mut vmi["status"];
    status["currentCPUTopology"] = json!({"sockets": sockets, "cores": cores, "threads": threads});
    if let Some(g) = guest {
        let g = quantity(g);
        status["memory"] = json!({"guestAtBoot": g, "guestCurrent": g, "guestRequested": g});
    }
}

/// What `RestartRequired` says for KubeVirt VM `vm` with running VMI `vmi_key`'s object, after
/// hot-plugging what can be (the VMI is updated in the store). `None`: nothing waits.
pub fn kubevirt_sync(app: &App, vm: &Value, vmi_key: &crate::core::store::Key) -> Option<String> {
    let config = kubevirt_configuration(app);
    let live = live_update(&config);
    let template = vm
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or(json!({}));
    let mut vmi = app.store.get(vmi_key)?;
    let uid = crate::core::util::meta_str(&vmi, "uid").to_string();
    // The spec a VMI was made from is its own spec before defaulting (a VMI of a fixture
    // included): recorded the first time it is seen.
    app.started
        .kubevirt
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(uid.clone())
        .or_insert_with(|| vmi.get("spec").cloned().unwrap_or(json!({})));
    if vmi.pointer("/status/currentCPUTopology").is_none() {
        default_vmi(&config, &mut vmi);
        let (spec, status) = (vmi["spec"].clone(), vmi["status"].clone());
        app.store.modify(vmi_key, |o| {
            o["spec"] = spec;
            o["status"] = status;
        });
    }
    let start = app
        .started
        .kubevirt
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&uid)
        .cloned()
        .unwrap_or_else(|| template.clone());
    // syncRestartRequired: neutralise what may change live, then compare.
    let mut last = start;
    let mut current = template.clone();
    for v in [&mut last, &mut current] {
        v.as_object_mut().map(|m| m.remove("volumes"));
        if let Some(d) = v
            .pointer_mut("/domain/devices")
            .and_then(Value::as_object_mut)
        {
            d.remove("disks");
            // Interfaces and networks under LiveUpdate: network.rs (`IsRestartRequired`).
            if live {
                d.remove("interfaces");
            }
        }
        if live {
            v.as_object_mut().map(|m| m.remove("networks"));
        }
        if live {
            if let Some(c) = v.pointer_mut("/domain/cpu").and_then(Value::as_object_mut) {
                c.remove("sockets");
            }
            if let Some(m) = v
                .pointer_mut("/domain/memory")
                .and_then(Value::as_object_mut)
            {
                m.remove("guest");
                if m.is_empty() {
                    v["domain"].as_object_mut().map(|d| d.remove("memory"));
                }
            }
            for p in ["nodeSelector", "affinity", "tolerations"] {
                v.as_object_mut().map(|m| m.remove(p));
            }
        }
    }
    if last != current {
        return Some(NON_LIVE_MESSAGE.into());
    }
    if !live {
        return None;
    }
    // handleCPUChangeRequest.
    if let Some(cpu) = template.pointer("/domain/cpu") {
        let wanted = uint(cpu.get("sockets")).max(1);
        let running = uint(vmi.pointer("/spec/domain/cpu/sockets")).max(1);
        let max = uint(vmi.pointer("/spec/domain/cpu/maxSockets"));
        if wanted != running {
            if wanted > max {
                return Some(
                    "CPU sockets updated in template spec to a value higher than what's available"
                        .into(),
                );
            }
            if wanted < running {
                return Some("Reduction of CPU socket count requires a restart".into());
            }
            app.store.modify(vmi_key, |o| {
                o["spec"]["domain"]["cpu"]["sockets"] = json!(wanted);
                o["status"]["currentCPUTopology"]["sockets"] = json!(wanted);
            });
        }
    }
    // handleMemoryHotplugRequest.
    let wanted = bytes(template.pointer("/domain/memory/guest"));
    let running = bytes(vmi.pointer("/spec/domain/memory/guest"));
    let (Some(wanted), Some(running)) = (wanted, running) else {
        return None;
    };
    vmi.pointer("/status/memory/guestCurrent")?;
    if wanted == running {
        return None;
    }
    let migratable = crate::core::table::eval_first(
        &vmi,
        ".status.conditions[?(@.type=='LiveMigratable')].status",
    ) == Some(&json!("True"));
    if !migratable {
        return Some(
            "memory updated in template spec. Memory-hotplug is only available for migratable VMs"
                .into(),
        );
    }
    let Some(max) = bytes(vmi.pointer("/spec/domain/memory/maxGuest")) else {
        return Some(
            "memory updated in template spec. Memory-hotplug is not available for this VM configuration"
                .into(),
        );
    };
    if bytes(vmi.pointer("/status/memory/guestAtBoot")).is_some_and(|b| wanted < b) {
        return Some(
            "memory updated in template spec to a value lower than what the VM started with".into(),
        );
    }
    if wanted > max {
        return Some(
            "memory updated in template spec to a value higher than what's available".into(),
        );
    }
    let q = quantity(wanted);
    app.store.modify(vmi_key, |o| {
        o["spec"]["domain"]["memory"]["guest"] = json!(q);
        o["status"]["memory"]["guestCurrent"] = json!(q);
        o["status"]["memory"]["guestRequested"] = json!(q);
    });
    None
}

/// One field change as Deckhouse reports it, with the action it takes.
struct Change {
    report: Value,
    restart: bool,
}

fn text_or<'a>(spec: &'a Value, pointer: &str, default: &'a str) -> &'a str {
    spec.pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(default)
}

fn replace(path: &str, current: Value, desired: Value) -> Value {
    json!({"operation": "replace", "path": path, "currentValue": current, "desiredValue": desired})
}

/// `VMSpecComparator.Compare` for the fields the emulator models (hotplug gates off).
fn deckhouse_changes(last: &Value, spec: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    let mut push = |path: &str, cur: Value, want: Value, restart: bool| {
        if cur != want {
            out.push(Change {
                report: replace(path, cur, want),
                restart,
            });
        }
    };
    for (path, default, restart) in [
        ("virtualMachineClassName", "", true),
        ("runPolicy", "", false),
    ] {
        let p = format!("/{path}");
        push(
            path,
            json!(text_or(last, &p, default)),
            json!(text_or(spec, &p, default)),
            restart,
        );
    }
    let grace = |s: &Value| {
        s.get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(60)
    };
    push(
        "terminationGracePeriodSeconds",
        json!(grace(last)),
        json!(grace(spec)),
        true,
    );
    // comparator_cpu.go: a replace of `cpu` when both fields change.
    let cores = |s: &Value| uint(s.pointer("/cpu/cores"));
    let fraction = |s: &Value| text_or(s, "/cpu/coreFraction", "100%").to_string();
    let (cores_changed, fraction_changed) =
        (cores(last) != cores(spec), fraction(last) != fraction(spec));
    if cores_changed && fraction_changed {
        push("cpu", last["cpu"].clone(), spec["cpu"].clone(), true);
    } else if cores_changed {
        push("cpu.cores", json!(cores(last)), json!(cores(spec)), true);
    } else if fraction_changed {
        push(
            "cpu.coreFraction",
            json!(fraction(last)),
            json!(fraction(spec)),
            true,
        );
    }
    let size = |s: &Value| bytes(s.pointer("/memory/size"));
    if size(last) != size(spec) {
        push(
            "memory.size",
            last.pointer("/memory/size").cloned().unwrap_or(Value::Null),
            spec.pointer("/memory/size").cloned().unwrap_or(Value::Null),
            true,
        );
    }
    // comparator_pod_placement.go, compareNetworks: additional networks apply at once, the
    // Main network waits for a restart (network.rs).
    if let Some(restart) = crate::kubevirt::network::deckhouse_network_change(last, spec) {
        out.push(Change {
            report: replace(
                "networks",
                last.get("networks").cloned().unwrap_or(Value::Null),
                spec.get("networks").cloned().unwrap_or(Value::Null),
            ),
            restart,
        });
    }
    out
}

/// Deckhouse VM `vm` in phase `phase`: the spec its machine runs with (for `status.resources`)
/// and, when changes wait for a restart, `status.restartAwaitingChanges` and the condition's
/// message.
pub fn deckhouse_sync(app: &App, vm: &Value, running: bool) -> (Value, Option<(Value, String)>) {
    let uid = crate::core::util::meta_str(vm, "uid").to_string();
    let spec = vm.get("spec").cloned().unwrap_or(json!({}));
    let mut map = app
        .started
        .deckhouse
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    // A stopped VM takes every change (isVMStopped → updateKVVM).
    let recorded = map.get(&uid).cloned().or_else(|| {
        // A running VM never seen before (a fixture's): its machine runs with the CPU and
        // memory its status reports (upstream: the KVVM's last-applied-spec annotation).
        let resources = vm.pointer("/status/resources")?;
        let mut last = spec.clone();
        last["cpu"] = resources.get("cpu").cloned().unwrap_or(json!({}));
        last["memory"] = resources.get("memory").cloned().unwrap_or(json!({}));
        Some(last)
    });
    let last = match recorded {
        Some(last) if running => last,
        _ => {
            map.insert(uid, spec.clone());
            return (spec, None);
        }
    };
    let changes = deckhouse_changes(&last, &spec);
    let pending: Vec<&Change> = changes.iter().filter(|c| c.restart).collect();
    if pending.is_empty() {
        // hasNoneDisruptiveChanges → applyVMChangesToKVVM: applied at once.
        map.insert(uid, spec.clone());
        return (spec, None);
    }
    let message =
        "Waiting for the user to restart in order to apply the configuration changes.".to_string();
    let report = Value::Array(pending.iter().map(|c| c.report.clone()).collect());
    (last, Some((report, message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollout_strategy_defaults_to_live_update() {
        assert!(live_update(&json!({})));
        assert!(live_update(&json!({"vmRolloutStrategy": "LiveUpdate"})));
        assert!(!live_update(&json!({"vmRolloutStrategy": "Stage"})));
    }

    #[test]
    fn vmi_defaults_give_hotplug_headroom() {
        let mut vmi =
            json!({"spec": {"domain": {"cpu": {"cores": 2}, "memory": {"guest": "2Gi"}}}});
        default_vmi(&json!({}), &mut vmi);
        assert_eq!(vmi["spec"]["domain"]["cpu"]["maxSockets"], 4);
        assert_eq!(vmi["spec"]["domain"]["memory"]["maxGuest"], "8Gi");
        assert_eq!(vmi["status"]["memory"]["guestAtBoot"], "2Gi");
        let mut staged = json!({"spec": {"domain": {"memory": {"guest": "1Gi"}}}});
        default_vmi(&json!({"vmRolloutStrategy": "Stage"}), &mut staged);
        assert!(staged.pointer("/spec/domain/cpu/maxSockets").is_none());
    }

    #[test]
    fn deckhouse_cpu_memory_and_grace_wait_for_a_restart_run_policy_does_not() {
        let last = json!({"runPolicy": "AlwaysOn", "cpu": {"cores": 1, "coreFraction": "10%"}, "memory": {"size": "1Gi"}});
        let mut spec = last.clone();
        spec["runPolicy"] = json!("Manual");
        let c = deckhouse_changes(&last, &spec);
        assert_eq!(c.len(), 1);
        assert!(!c[0].restart);
        spec["cpu"]["cores"] = json!(2);
        spec["memory"]["size"] = json!("2Gi");
        spec["terminationGracePeriodSeconds"] = json!(60);
        let c = deckhouse_changes(&last, &spec);
        let paths: Vec<&Value> = c
            .iter()
            .filter(|c| c.restart)
            .map(|c| &c.report["path"])
            .collect();
        assert_eq!(paths, [&json!("cpu.cores"), &json!("memory.size")]);
        spec["cpu"]["coreFraction"] = json!("20%");
        let c = deckhouse_changes(&last, &spec);
        assert!(c.iter().any(|c| c.report["path"] == "cpu" && c.restart));
    }
}
