//! Deckhouse: VM power state from its operations, VirtualMachineOperations.

use super::*;

/// The phase of a Deckhouse VM whose disks are ready, from its operations' power annotation
/// and its runPolicy.
pub fn deckhouse_power(vm: &Value) -> (&'static str, String) {
    let node = annotation(vm, NODE_ANNOTATION).unwrap_or(NODE).to_string();
    let policy = vm
        .pointer("/spec/runPolicy")
        .and_then(Value::as_str)
        .unwrap_or("AlwaysOnUnlessStoppedManually");
    let phase = match annotation(vm, POWER) {
        Some("starting") => "Starting",
        Some("stopping") => "Stopping",
        Some("migrating") => "Migrating",
        Some("off") => "Stopped",
        Some(_) => "Running",
        None if matches!(policy, "AlwaysOn" | "AlwaysOnUnlessStoppedManually") => "Running",
        None => "Stopped",
    };
    (phase, node)
}

fn vmop_terminal(op: &Value) -> bool {
    matches!(phase(op), "Completed" | "Failed" | "Superseded")
}

/// Whether an operation of type `new` supersedes an active one of type `old` (user guide,
/// "Startup policy and VM state management"; FACTS §10).
fn supersedes(new: &Value, old: &Value) -> bool {
    let t = |o: &Value| {
        o.pointer("/spec/type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let forced = |o: &Value| o.pointer("/spec/force").and_then(Value::as_bool) == Some(true);
    match (t(new).as_str(), t(old).as_str()) {
        ("Stop", "Start") => true,
        ("Stop", "Stop") => forced(new),
        ("Restart", "Migrate" | "Evict") => true,
        _ => false,
    }
}

fn vmop_status(
    op: &mut Value,
    phase: &str,
    completed: bool,
    reason: &str,
    message: &str,
    progress: Option<&str>,
) {
    let mut st = op["status"].clone();
    if !st.is_object() {
        st = json!({});
    }
    st["phase"] = json!(phase);
    st["observedGeneration"] = op["metadata"]["generation"].clone();
    if let Some(p) = progress {
        st["progress"] = json!(p);
    }
    set_condition(&mut st, "Completed", completed, reason, message);
    op["status"] = st;
}

/// VirtualMachineOperation: Pending → InProgress → Completed (or Failed with a reason); a
/// newer compatible operation supersedes an active one, an incompatible one fails.
pub fn vmop(app: &App, op: &Value, tick: bool) {
    if vmop_terminal(op) {
        return;
    }
    let key = Key::of(DH, "virtualmachineoperations", op);
    let ns = meta_str(op, "namespace");
    let vm_name = op
        .pointer("/spec/virtualMachineName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let op_type = op
        .pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let vm_key = Key::new(DH, "virtualmachines", ns, vm_name);
    let fail = |reason: &str, message: &str| {
        app.store.modify(&key, |o| {
            vmop_status(o, "Failed", false, reason, message, None)
        });
    };
    if phase(op).is_empty() {
        let Some(vm) = app.store.get(&vm_key) else {
            fail(
                "VirtualMachineNotFound",
                &format!("VirtualMachine {vm_name:?} not found"),
            );
            return;
        };
        // One active operation per VM: supersede it or fail.
        let (ops, _) = app.store.list(DH, "virtualmachineoperations", Some(ns));
        for other in ops.iter().filter(|o| {
            meta_str(o, "uid") != meta_str(op, "uid")
                && o.pointer("/spec/virtualMachineName") == op.pointer("/spec/virtualMachineName")
                && !vmop_terminal(o)
                && !phase(o).is_empty()
        }) {
            if supersedes(op, other) {
                let msg = format!(
                    "The operation has been superseded by the {op_type} operation {:?}",
                    meta_str(op, "name")
                );
                app.store
                    .modify(&Key::of(DH, "virtualmachineoperations", other), |o| {
                        vmop_status(o, "Superseded", false, "Superseded", &msg, None)
                    });
            } else {
                fail(
                    "NotReadyToBeExecuted",
                    &format!(
                        "Waiting for the active operation {:?} to finish; create this operation again after it",
                        meta_str(other, "name")
                    ),
                );
                return;
            }
        }
        let (vm_phase, _) = deckhouse_power(&vm);
        let policy = vm
            .pointer("/spec/runPolicy")
            .and_then(Value::as_str)
            .unwrap_or("AlwaysOnUnlessStoppedManually");
        let bad = match op_type.as_str() {
            "Start" if policy == "AlwaysOff" => Some(("NotApplicableForVirtualMachineRunPolicy",
                "The Start operation cannot be performed for a virtual machine with runPolicy AlwaysOff".to_string())),
            "Start" if vm_phase == "Running" => Some(("NotApplicableForVirtualMachinePhase",
                format!("The Start operation cannot be performed for a virtual machine in phase {vm_phase}"))),
            "Stop" | "Restart" | "Migrate" | "Evict" if vm_phase == "Stopped" => Some(("NotApplicableForVirtualMachinePhase",
                format!("The {op_type} operation cannot be performed for a virtual machine in phase {vm_phase}"))),
            // clone.go IsApplicableForVMPhase; service.go IsApplicableOrSetFailedPhase.
            "Clone" if !matches!(vm_phase, "Running" | "Stopped") => Some(("NotApplicableForVirtualMachinePhase",
                format!("Operation type Clone is not applicable for VirtualMachine in phase {vm_phase}"))),
            // restore.go IsApplicableForVMPhase.
            "Restore" if !matches!(vm_phase, "Running" | "Stopped" | "Pending") => Some(("NotApplicableForVirtualMachinePhase",
                format!("Operation type Restore is not applicable for VirtualMachine in phase {vm_phase}"))),
            "Migrate" | "Evict" if vm.pointer("/spec/liveMigrationPolicy").and_then(Value::as_str) == Some("Manual") =>
                Some(("NotApplicableForLiveMigrationPolicy", "The live migration policy does not allow migration".to_string())),
            _ => None,
        };
        if let Some((reason, message)) = bad {
            fail(reason, &message);
            return;
        }
        let progress = matches!(op_type.as_str(), "Migrate" | "Evict").then_some("0%");
        app.store.modify(&key, |o| {
            vmop_status(
                o,
                "Pending",
                false,
                "NotReadyToBeExecuted",
                "The operation is waiting to be executed",
                progress,
            )
        });
        return;
    }
    if !tick {
        return;
    }
    let Some(vm) = app.store.get(&vm_key) else {
        fail(
            "VirtualMachineNotFound",
            &format!("VirtualMachine {vm_name:?} not found"),
        );
        return;
    };
    unsettle(app, &vm);
    let set_power = |power: Option<&str>, node: Option<&str>| {
        app.store.modify(&vm_key, |o| {
            set_annotation(o, POWER, power);
            if let Some(n) = node {
                set_annotation(o, NODE_ANNOTATION, Some(n));
            }
        });
    };
    let in_progress = |reason: &str, progress: Option<&str>| {
        app.store.modify(&key, |o| {
            vmop_status(o, "InProgress", false, reason, "", progress)
        });
    };
    let complete = |progress: Option<&str>| {
        app.store.modify(&key, |o| {
            vmop_status(o, "Completed", true, "OperationCompleted", "", progress)
        });
    };
    let (vm_phase, node) = deckhouse_power(&vm);
    let unschedulable = annotation(&vm, UNSCHEDULABLE) == Some("true");
    // A forced Stop/Restart powers the guest off at once (spec.force).
    let forced = op.pointer("/spec/force").and_then(Value::as_bool) == Some(true);
    match (op_type.as_str(), phase(op)) {
        ("Start", "Pending") => {
            set_power(Some("starting"), None);
            in_progress("StartInProgress", None);
        }
        ("Start", _) if unschedulable => {}
        ("Start", _) => {
            set_power(Some("on"), None);
            complete(None);
        }
        ("Stop", "Pending") => {
            set_power(Some("stopping"), None);
            in_progress("StopInProgress", None);
        }
        // A real guest powers off first: the VM is Stopped once its qemu has exited.
        ("Stop", _)
            if app
                .guests
                .power_off(ns, vm_name, forced, super::deckhouse_grace(&vm)) => {}
        ("Stop", _) => {
            set_power(Some("off"), None);
            complete(None);
        }
        ("Restart", "Pending") => {
            set_power(Some("stopping"), None);
            in_progress("RestartInProgress", None);
        }
        ("Restart", _)
            if vm_phase == "Stopping"
                && app
                    .guests
                    .power_off(ns, vm_name, forced, super::deckhouse_grace(&vm)) => {}
        ("Restart", _) if vm_phase == "Stopping" => set_power(Some("starting"), None),
        ("Restart", _) => {
            set_power(Some("on"), None);
            complete(None);
        }
        ("Migrate" | "Evict", _) => {
            let pct = op
                .pointer("/status/progress")
                .and_then(Value::as_str)
                .and_then(|p| p.trim_end_matches('%').parse::<u32>().ok())
                .unwrap_or(0);
            let fail_mode = annotation(&vm, MIGRATION_FAIL).unwrap_or("");
            let selector = op.pointer("/spec/migrate/nodeSelector");
            let target = pick_target(app, &node, selector);
            if target.is_none() || fail_mode == "no-target" {
                set_power(Some("on"), None);
                fail("TargetUnschedulable", NO_TARGET_MESSAGE);
                return;
            }
            if fail_mode == "timeout" && pct >= 50 {
                set_power(Some("on"), None);
                fail("NotConverging", TIMEOUT_MESSAGE);
                return;
            }
            if pct >= 100 {
                let target = target.unwrap_or_default();
                set_power(Some("on"), Some(&target));
                app.store.modify(&vm_key, |o| {
                    o["status"]["migrationState"] = json!({"startTimestamp": now_rfc3339(), "endTimestamp": now_rfc3339(),
                        "source": {"node": node}, "target": {"node": target}, "result": "Succeeded"});
                });
                complete(Some("100%"));
            } else {
                set_power(Some("migrating"), None);
                let next = (pct + 25).min(100);
                let reason = if pct == 0 {
                    "MigrationPrepareTarget"
                } else {
                    "MigrationRunning"
                };
                in_progress(reason, Some(&format!("{next}%")));
            }
        }
        ("Clone", "Pending") => in_progress("CloneInProgress", None),
        ("Clone", _) => match crate::kubevirt::clone::deckhouse_clone(app, op, &vm) {
            Ok(true) => complete(None),
            Ok(false) => {}
            Err((resources, message)) => {
                app.store.modify(&key, |o| {
                    vmop_status(o, "Failed", false, "OperationFailed", &message, None);
                    o["status"]["resources"] = resources;
                });
            }
        },
        // Restore (dh_snapshot.rs): the VM is stopped for it and started again if it ran.
        ("Restore", "Pending") => in_progress("RestoreInProgress", None),
        ("Restore", _) => match crate::deckhouse::snapshot::restore_step(app, op, &vm) {
            crate::deckhouse::snapshot::RestoreStep::Stop => {
                if !app
                    .guests
                    .power_off(ns, vm_name, false, super::deckhouse_grace(&vm))
                {
                    set_power(Some("off"), None);
                }
            }
            crate::deckhouse::snapshot::RestoreStep::Start => set_power(Some("on"), None),
            crate::deckhouse::snapshot::RestoreStep::Wait => {}
            crate::deckhouse::snapshot::RestoreStep::Done => complete(None),
            crate::deckhouse::snapshot::RestoreStep::Fail(message) => {
                fail("OperationFailed", &message)
            }
        },
        _ => fail(
            "OperationFailed",
            &format!("the emulator does not run {op_type} operations"),
        ),
    }
    let _ = owner_ref;
}
