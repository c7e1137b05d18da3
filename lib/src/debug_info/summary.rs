//! `summary.txt`, the file a person reads first: phase, conditions with messages, the last
//! warning events, and what looks wrong.

use std::fmt::Write;

use serde_json::Value;

use crate::flavor::Flavor;

/// What the summary is made from (small objects only; logs are never kept).
#[derive(Debug, Default)]
pub struct Facts {
    /// The VM.
    pub vm: Value,
    /// The VMI (KubeVirt).
    pub instance: Option<Value>,
    /// Migrations (KubeVirt VMIMs) or operations (Deckhouse VMOPs).
    pub migrations: Vec<Value>,
    /// DataVolumes, VirtualDisks, VirtualImages.
    pub disks: Vec<Value>,
    /// PVCs.
    pub pvcs: Vec<Value>,
    /// Pods.
    pub pods: Vec<Value>,
    /// Events of every gathered object.
    pub events: Vec<Value>,
}

/// Condition types that are bad when True.
const BAD_WHEN_TRUE: &[&str] = &["Failure", "ReconcileError", "ManualRecoveryRequired"];
/// Condition types that are bad when False (others, like LiveMigratable, only inform).
const GOOD_WHEN_TRUE: &[&str] = &[
    "Ready",
    "Synchronized",
    "BlockDevicesReady",
    "AgentReady",
    "AgentConnected",
    "DataVolumesReady",
    "ClassReady",
    "IPAddressReady",
    "ProvisioningReady",
    "SizingPolicyMatched",
    "ConfigurationApplied",
    "Running",
    "Bound",
];

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn conditions(object: &Value) -> Vec<&Value> {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .collect()
}

/// Whether a condition says something is wrong, given the object's phase.
pub fn failing(condition: &Value, phase: &str) -> bool {
    let kind = s(&condition["type"]);
    let status = s(&condition["status"]);
    if BAD_WHEN_TRUE.contains(&kind) {
        return status == "True";
    }
    if !GOOD_WHEN_TRUE.contains(&kind) || status != "False" {
        return false;
    }
    // A stopped VM is neither running nor ready, as it should be.
    let stopped = matches!(phase, "Stopped" | "Stopping" | "Halted");
    !(stopped && matches!(kind, "Running" | "Ready" | "AgentReady" | "AgentConnected"))
}

/// The problems the facts show, one line each.
pub fn problems(facts: &Facts, flavor: Flavor) -> Vec<String> {
    let mut out = Vec::new();
    condition_problems(facts, &phase(&facts.vm, flavor), &mut out);
    pod_problems(facts, &mut out);
    disk_problems(facts, &mut out);
    pvc_problems(facts, &mut out);
    migration_problems(facts, &mut out);
    out
}

/// Failing conditions of the VM and its instance.
fn condition_problems(facts: &Facts, phase: &str, out: &mut Vec<String>) {
    let mut objects: Vec<(&str, &Value)> = vec![("virtualmachine", &facts.vm)];
    if let Some(vmi) = &facts.instance {
        objects.push(("virtualmachineinstance", vmi));
    }
    for (what, object) in objects {
        for c in conditions(object) {
            if failing(c, phase) {
                out.push(format!(
                    "{what} {}: condition {} is {} ({}): {}",
                    s(&object["metadata"]["name"]),
                    s(&c["type"]),
                    s(&c["status"]),
                    s(&c["reason"]),
                    s(&c["message"])
                ));
            }
        }
    }
}

/// Containers stuck waiting (crash loops, image pulls) and failed pods.
fn pod_problems(facts: &Facts, out: &mut Vec<String>) {
    for pod in &facts.pods {
        let name = s(&pod["metadata"]["name"]);
        for st in pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(
                pod["status"]["initContainerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten(),
            )
        {
            let waiting = &st["state"]["waiting"];
            let reason = s(&waiting["reason"]);
            if matches!(
                reason,
                "CrashLoopBackOff"
                    | "ImagePullBackOff"
                    | "ErrImagePull"
                    | "CreateContainerError"
                    | "CreateContainerConfigError"
            ) {
                out.push(format!(
                    "pod {name}: container {} is in {reason} (restarted {} times): {}",
                    s(&st["name"]),
                    st["restartCount"].as_u64().unwrap_or(0),
                    s(&waiting["message"])
                ));
            }
        }
        if s(&pod["status"]["phase"]) == "Failed" {
            out.push(format!(
                "pod {name} failed: {} {}",
                s(&pod["status"]["reason"]),
                s(&pod["status"]["message"])
            ));
        }
    }
}

/// Disks and images whose import retries, failed or reports an error condition.
fn disk_problems(facts: &Facts, out: &mut Vec<String>) {
    for disk in &facts.disks {
        let kind = s(&disk["kind"]).to_ascii_lowercase();
        let name = s(&disk["metadata"]["name"]);
        let restarts = disk["status"]["restartCount"].as_u64().unwrap_or(0);
        let phase = s(&disk["status"]["phase"]);
        if restarts > 0 && phase != "Succeeded" {
            out.push(format!(
                "{kind} {name}: import keeps retrying (restarted {restarts} times, phase {phase})"
            ));
        }
        if matches!(phase, "Failed" | "ImportFailed" | "Lost") {
            out.push(format!("{kind} {name} is {phase}"));
        }
        for c in conditions(disk) {
            let reason = s(&c["reason"]);
            if s(&c["status"]) == "False"
                && matches!(s(&c["type"]), "Running" | "Ready")
                && (reason.contains("Error") || reason.contains("Failed"))
            {
                out.push(format!(
                    "{kind} {name}: condition {} is False ({reason}): {}",
                    s(&c["type"]),
                    s(&c["message"])
                ));
            }
        }
    }
}

/// Claims still Pending.
fn pvc_problems(facts: &Facts, out: &mut Vec<String>) {
    for pvc in &facts.pvcs {
        if s(&pvc["status"]["phase"]) == "Pending" {
            out.push(format!(
                "persistentvolumeclaim {} is Pending",
                s(&pvc["metadata"]["name"])
            ));
        }
    }
}

/// Failed migrations and evictions.
fn migration_problems(facts: &Facts, out: &mut Vec<String>) {
    for m in &facts.migrations {
        let kind = s(&m["kind"]);
        let is_migration = kind == "VirtualMachineInstanceMigration"
            || matches!(s(&m["spec"]["type"]), "Migrate" | "Evict");
        if is_migration && s(&m["status"]["phase"]) == "Failed" {
            let why = conditions(m)
                .iter()
                .map(|c| s(&c["message"]))
                .find(|m| !m.is_empty())
                .unwrap_or_default()
                .to_owned();
            out.push(format!(
                "{} {} failed{}",
                kind.to_ascii_lowercase(),
                s(&m["metadata"]["name"]),
                if why.is_empty() {
                    String::new()
                } else {
                    format!(": {why}")
                }
            ));
        }
    }
}

fn phase(vm: &Value, flavor: Flavor) -> String {
    match flavor {
        Flavor::KubeVirt => s(&vm["status"]["printableStatus"]),
        Flavor::Deckhouse => s(&vm["status"]["phase"]),
    }
    .to_owned()
}

/// The text of `summary.txt`.
pub fn render(facts: &Facts, flavor: Flavor, errors: &[String], now: jiff::Timestamp) -> String {
    let mut out = String::new();
    header(&mut out, facts, flavor, now);
    problems_section(&mut out, facts, flavor);
    conditions_section(&mut out, facts);
    pods_section(&mut out, facts);
    warnings_section(&mut out, facts);
    if !errors.is_empty() {
        let _ = writeln!(
            out,
            "\nNot collected: {} item(s), see errors.txt",
            errors.len()
        );
    }
    out
}

/// The VM, its phase, its node and when this was collected.
fn header(out: &mut String, facts: &Facts, flavor: Flavor, now: jiff::Timestamp) {
    let vm = &facts.vm;
    let _ = writeln!(
        out,
        "Virtual machine: {}/{} ({})",
        s(&vm["metadata"]["namespace"]),
        s(&vm["metadata"]["name"]),
        flavor.display_name()
    );
    let _ = writeln!(out, "Phase:           {}", or_none(&phase(vm, flavor)));
    let node = facts
        .instance
        .as_ref()
        .map(|i| s(&i["status"]["nodeName"]))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| s(&vm["status"]["nodeName"]));
    let _ = writeln!(out, "Node:            {}", or_none(node));
    let _ = writeln!(out, "Collected at:    {now}");
}

/// What looks wrong ([`problems`]), or "nothing obvious".
fn problems_section(out: &mut String, facts: &Facts, flavor: Flavor) {
    let _ = writeln!(out, "\nWhat looks wrong:");
    let problems = problems(facts, flavor);
    if problems.is_empty() {
        let _ = writeln!(out, "  nothing obvious");
    }
    for p in &problems {
        let _ = writeln!(out, "  - {p}");
    }
}

/// The conditions of the VM and of its instance.
fn conditions_section(out: &mut String, facts: &Facts) {
    let vm = &facts.vm;
    let _ = writeln!(out, "\nConditions:");
    let mut objects = vec![("VirtualMachine", vm)];
    if let Some(vmi) = &facts.instance {
        objects.push(("VirtualMachineInstance", vmi));
    }
    for (kind, object) in objects {
        for c in conditions(object) {
            let _ = writeln!(
                out,
                "  {kind:<24} {:<22} {:<6} {:<28} {}",
                s(&c["type"]),
                s(&c["status"]),
                s(&c["reason"]),
                s(&c["message"])
            );
        }
    }
}

/// The VM's pods: phase, node and container restarts.
fn pods_section(out: &mut String, facts: &Facts) {
    let _ = writeln!(out, "\nPods:");
    if facts.pods.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for p in &facts.pods {
        let restarts: u64 = p["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["restartCount"].as_u64())
            .sum();
        let _ = writeln!(
            out,
            "  {:<40} {:<10} {:<12} restarts {restarts}",
            s(&p["metadata"]["name"]),
            s(&p["status"]["phase"]),
            or_none(s(&p["spec"]["nodeName"]))
        );
    }
}

/// The last ten warning events, oldest first.
fn warnings_section(out: &mut String, facts: &Facts) {
    let _ = writeln!(out, "\nLast warning events:");
    let mut warnings: Vec<&Value> = facts
        .events
        .iter()
        .filter(|e| s(&e["type"]) == "Warning")
        .collect();
    let when = |e: &Value| {
        let t = s(&e["lastTimestamp"]);
        if t.is_empty() {
            s(&e["eventTime"]).to_owned()
        } else {
            t.to_owned()
        }
    };
    warnings.sort_by_key(|e| when(e));
    if warnings.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for e in warnings.iter().rev().take(10).rev() {
        let _ = writeln!(
            out,
            "  {} {}/{} {} (x{}): {}",
            when(e),
            s(&e["involvedObject"]["kind"]).to_ascii_lowercase(),
            s(&e["involvedObject"]["name"]),
            s(&e["reason"]),
            e["count"].as_u64().unwrap_or(1),
            s(&e["message"])
        );
    }
}

fn or_none(text: &str) -> &str {
    if text.is_empty() { "<none>" } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn condition_polarity() {
        assert!(failing(
            &json!({"type": "Ready", "status": "False"}),
            "Running"
        ));
        assert!(!failing(
            &json!({"type": "Ready", "status": "False"}),
            "Stopped"
        ));
        assert!(failing(
            &json!({"type": "Failure", "status": "True"}),
            "Running"
        ));
        assert!(!failing(
            &json!({"type": "LiveMigratable", "status": "False"}),
            "Running"
        ));
    }

    #[test]
    fn problems_name_what_is_wrong() {
        let facts = Facts {
            vm: json!({"metadata": {"name": "b"}, "status": {"printableStatus": "CrashLoopBackOff",
                "conditions": [{"type": "Failure", "status": "True", "reason": "FailedCreate", "message": "boom"}]}}),
            pods: vec![
                json!({"metadata": {"name": "p"}, "status": {"phase": "Running", "containerStatuses": [
                {"name": "compute", "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}}]}}),
            ],
            disks: vec![
                json!({"kind": "DataVolume", "metadata": {"name": "d"}, "status": {"phase": "ImportInProgress", "restartCount": 3}}),
            ],
            pvcs: vec![json!({"metadata": {"name": "c"}, "status": {"phase": "Pending"}})],
            migrations: vec![
                json!({"kind": "VirtualMachineInstanceMigration", "metadata": {"name": "m"}, "status": {"phase": "Failed"}}),
            ],
            ..Facts::default()
        };
        let p = problems(&facts, Flavor::KubeVirt).join("\n");
        for want in [
            "virtualmachine b: condition Failure is True (FailedCreate): boom",
            "pod p: container compute is in CrashLoopBackOff (restarted 4 times): back-off",
            "datavolume d: import keeps retrying (restarted 3 times, phase ImportInProgress)",
            "persistentvolumeclaim c is Pending",
            "virtualmachineinstancemigration m failed",
        ] {
            assert!(p.contains(want), "{want:?} missing from:\n{p}");
        }
    }
}
