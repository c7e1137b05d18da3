//! Which emulated node a VM's pod may run on, as kube-scheduler's filters decide it for the
//! fields the emulator models, each node checked by the default profile's filters in their
//! order (`pkg/scheduler/apis/config/v1/default_plugins.go`: TaintToleration before
//! NodeAffinity), the first that rejects it giving the node's reason:
//! - taints (`pkg/scheduler/framework/plugins/tainttoleration/taint_toleration.go`, `Filter`:
//!   the first `NoSchedule` or `NoExecute` taint no toleration tolerates, by
//!   `v1helper.FindMatchingUntoleratedTaint`; reason "node(s) had untolerated taint {KEY:
//!   VALUE}"; a toleration tolerates a taint as `Toleration.ToleratesTaint` in
//!   `k8s.io/api/core/v1/toleration.go` says: same effect unless it names none, same key unless
//!   it names none, then `Exists` or an equal value for `Equal`/no operator);
//! - the node selector and the required node affinity
//!   (`pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go`, `Filter`: every
//!   `nodeSelector` label, and one of the `nodeSelectorTerms` whose `matchExpressions` all
//!   hold; operators from `k8s.io/component-helpers/scheduling/corev1/nodeaffinity`).
//!
//! Resources are not modelled (the `emulator.kubevm.io/unschedulable` fixture switch stands
//! for those).
//!
//! A pod no node fits gets the scheduler's message: `FitError.Error` (`pkg/scheduler/framework/
//! types.go`, `NoNodeAvailableMsg` "0/%v nodes are available" and the histogram of the nodes'
//! reasons, "COUNT REASON" entries sorted as strings and joined by ", "), followed by default
//! preemption's post-filter message (`pkg/scheduler/framework/plugins/defaultpreemption`: both
//! filters reject as `UnschedulableAndUnresolvable`, which preemption cannot fix: "Preemption
//! is not helpful for scheduling").

use serde_json::Value;

use crate::core::app::App;
use crate::core::controllers::NODE;
use crate::core::util::meta_str;

/// The fields of a pod-like spec that decide its node (what a launcher pod was made with).
pub fn node_placement(spec: &Value) -> Value {
    serde_json::json!({
        "nodeSelector": spec.get("nodeSelector").filter(|v| v.as_object().is_some_and(|m| !m.is_empty())).cloned().unwrap_or(Value::Null),
        "affinity": spec.get("affinity").cloned().unwrap_or(Value::Null),
    })
}

/// The node affinity plugin's reason (`ErrReasonPod`).
pub const NODE_AFFINITY_REASON: &str = "node(s) didn't match Pod's node affinity/selector";

/// The taint toleration plugin's reason for an untolerated taint (`Filter`'s `errReason`).
pub fn taint_reason(key: &str, value: &str) -> String {
    format!("node(s) had untolerated taint {{{key}: {value}}}")
}

/// `Toleration.ToleratesTaint`.
fn tolerates(toleration: &Value, taint: &Value) -> bool {
    let field = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let (effect, key) = (field(toleration, "effect"), field(toleration, "key"));
    if !effect.is_empty() && effect != field(taint, "effect") {
        return false;
    }
    if !key.is_empty() && key != field(taint, "key") {
        return false;
    }
    match field(toleration, "operator").as_str() {
        "" | "Equal" => field(toleration, "value") == field(taint, "value"),
        "Exists" => true,
        _ => false,
    }
}

/// The first `NoSchedule`/`NoExecute` taint of `node` none of `spec`'s tolerations tolerates
/// (`FindMatchingUntoleratedTaint` with `DoNotScheduleTaintsFilterFunc`), as its reason.
fn untolerated_taint(node: &Value, spec: &Value) -> Option<String> {
    let tolerations = spec
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    node.pointer("/spec/taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|t| matches!(t["effect"].as_str(), Some("NoSchedule" | "NoExecute")))
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
        .map(|t| {
            taint_reason(
                t["key"].as_str().unwrap_or(""),
                t["value"].as_str().unwrap_or(""),
            )
        })
}

/// Why `node` rejects a pod with `spec` (a pod-like spec): the first filter that fails, in the
/// default profile's order; `None` when it fits.
pub fn node_rejects(node: &Value, spec: &Value) -> Option<String> {
    if let Some(reason) = untolerated_taint(node, spec) {
        return Some(reason);
    }
    (!node_affinity_fits(node, spec)).then(|| NODE_AFFINITY_REASON.to_string())
}

/// Whether `node` takes a pod with `spec`.
pub fn node_fits(node: &Value, spec: &Value) -> bool {
    node_rejects(node, spec).is_none()
}

/// Whether `node` has the labels `spec` (a pod-like spec) selects and requires.
fn node_affinity_fits(node: &Value, spec: &Value) -> bool {
    let labels = node.pointer("/metadata/labels");
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let selector_ok = spec
        .get("nodeSelector")
        .and_then(Value::as_object)
        .is_none_or(|sel| sel.iter().all(|(k, v)| label(k) == v.as_str()));
    let terms = spec
        .pointer("/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array);
    // No terms: no requirement. With terms: any one whose expressions all hold (an empty term
    // matches nothing: `nodeaffinity.NewNodeSelector`).
    let affinity_ok = terms.is_none_or(|terms| {
        terms.iter().any(|t| {
            let exprs = t["matchExpressions"].as_array();
            exprs.is_some_and(|e| !e.is_empty())
                && exprs
                    .into_iter()
                    .flatten()
                    .all(|x| expression_holds(x, label(x["key"].as_str().unwrap_or(""))))
        })
    });
    selector_ok && affinity_ok
}

/// `NodeSelectorRequirement` against a node's label value (`None`: the node lacks it).
fn expression_holds(x: &Value, value: Option<&str>) -> bool {
    let values: Vec<&str> = x["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let number = |s: &str| s.parse::<i64>().ok();
    match x["operator"].as_str().unwrap_or("") {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => value.is_none_or(|v| !values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(number), values.first().and_then(|s| number(s))), (Some(v), Some(b)) if v > b)
        }
        "Lt" => {
            matches!((value.and_then(number), values.first().and_then(|s| number(s))), (Some(v), Some(b)) if v < b)
        }
        _ => false,
    }
}

/// The scheduler's message for a pod no node fits, from each node's reason.
pub fn no_fit_message(reasons: &[String]) -> String {
    let n = reasons.len();
    let mut histogram = std::collections::BTreeMap::<&str, usize>::new();
    for r in reasons {
        *histogram.entry(r.as_str()).or_default() += 1;
    }
    let mut entries: Vec<String> = histogram
        .iter()
        .map(|(reason, count)| format!("{count} {reason}"))
        .collect();
    entries.sort();
    format!(
        "0/{n} nodes are available: {}. preemption: 0/{n} nodes are available: {n} Preemption is not helpful for scheduling.",
        entries.join(", ")
    )
}

/// The node a pod with `spec` is bound to (the first that fits, by name), or the scheduler's
/// message when none does. Without any Node objects (unit tests) everything runs on
/// [`NODE`].
pub fn schedule(app: &App, spec: &Value) -> Result<String, String> {
    let (mut nodes, _) = app.store.list("", "nodes", None);
    if nodes.is_empty() {
        return Ok(NODE.to_string());
    }
    nodes.sort_by(|a, b| meta_str(a, "name").cmp(meta_str(b, "name")));
    let mut reasons = Vec::new();
    for node in &nodes {
        match node_rejects(node, spec) {
            None => return Ok(meta_str(node, "name").to_string()),
            Some(reason) => reasons.push(reason),
        }
    }
    Err(no_fit_message(&reasons))
}

/// A migration target for a pod with `spec` now on `source`: another node that fits.
pub fn migration_target(app: &App, source: &str, spec: &Value) -> Option<String> {
    let (mut nodes, _) = app.store.list("", "nodes", None);
    nodes.sort_by(|a, b| meta_str(a, "name").cmp(meta_str(b, "name")));
    nodes
        .iter()
        .filter(|n| meta_str(n, "name") != source)
        .find(|n| node_fits(n, spec))
        .map(|n| meta_str(n, "name").to_string())
}

/// kube-scheduler's Warning event on a pod it could not bind (`schedule_one.go`,
/// `handleSchedulingFailure`: reason `FailedScheduling`, the fit error as the message,
/// reported by `default-scheduler`).
pub fn failed_scheduling_event(app: &App, pod: &Value, message: &str) {
    let now = crate::core::util::now_rfc3339();
    let (ns, name) = (meta_str(pod, "namespace"), meta_str(pod, "name"));
    let event = serde_json::json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{}", crate::core::util::random_suffix(16)), "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": ns,
                           "uid": pod["metadata"]["uid"]},
        "type": "Warning", "reason": "FailedScheduling", "message": message,
        "source": {"component": "default-scheduler"},
        "reportingComponent": "default-scheduler",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    let _ = app.store.create("", "events", event);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(labels: Value) -> Value {
        json!({"metadata": {"name": "n", "labels": labels}})
    }

    #[test]
    fn selector_and_required_affinity_filter_nodes() {
        let ssd = node(json!({"disktype": "ssd", "zone": "a", "cores": "8"}));
        assert!(node_fits(&ssd, &json!({})));
        assert!(node_fits(
            &ssd,
            &json!({"nodeSelector": {"disktype": "ssd"}})
        ));
        assert!(!node_fits(
            &ssd,
            &json!({"nodeSelector": {"disktype": "hdd"}})
        ));
        let affinity = |exprs: Value| {
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": exprs}]}}}})
        };
        for (exprs, fits) in [
            (
                json!([{"key": "zone", "operator": "In", "values": ["a", "b"]}]),
                true,
            ),
            (
                json!([{"key": "zone", "operator": "NotIn", "values": ["a"]}]),
                false,
            ),
            (json!([{"key": "gpu", "operator": "DoesNotExist"}]), true),
            (json!([{"key": "gpu", "operator": "Exists"}]), false),
            (
                json!([{"key": "cores", "operator": "Gt", "values": ["4"]}]),
                true,
            ),
            (
                json!([{"key": "zone", "operator": "In", "values": ["a"]},
                    {"key": "disktype", "operator": "In", "values": ["hdd"]}]),
                false,
            ),
            (json!([]), false),
        ] {
            assert_eq!(node_fits(&ssd, &affinity(exprs.clone())), fits, "{exprs}");
        }
    }

    /// The wording kube-scheduler records on a pod no node fits (as `kubectl describe pod`
    /// shows it: "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.
    /// preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.").
    #[test]
    fn the_message_is_the_schedulers() {
        let affinity = || NODE_AFFINITY_REASON.to_string();
        assert_eq!(
            no_fit_message(&[affinity(), affinity(), affinity()]),
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        );
        // The histogram's entries sorted as strings, as FitError.Error sorts them.
        assert_eq!(
            no_fit_message(&[
                taint_reason("dedicated", "gpu"),
                affinity(),
                taint_reason("dedicated", "gpu")
            ]),
            "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 node(s) had untolerated taint {dedicated: gpu}. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
        );
    }

    /// TaintToleration's filter: NoSchedule and NoExecute taints must be tolerated,
    /// PreferNoSchedule ones need not be; it rejects before node affinity does.
    #[test]
    fn untolerated_taints_reject_a_node() {
        let gpu = json!({"metadata": {"name": "gpu-1", "labels": {"zone": "a"}}, "spec": {"taints": [
            {"key": "node.kubernetes.io/slow", "effect": "PreferNoSchedule"},
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}});
        let with = |tolerations: Value| json!({"tolerations": tolerations});
        assert_eq!(
            node_rejects(&gpu, &json!({})).as_deref(),
            Some("node(s) had untolerated taint {dedicated: gpu}")
        );
        for (tolerations, fits) in [
            (
                json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]),
                true,
            ),
            (json!([{"key": "dedicated", "value": "gpu"}]), true),
            (json!([{"key": "dedicated", "operator": "Exists"}]), true),
            (json!([{"operator": "Exists"}]), true),
            (
                json!([{"key": "dedicated", "value": "cpu", "effect": "NoSchedule"}]),
                false,
            ),
            (
                json!([{"key": "dedicated", "value": "gpu", "effect": "NoExecute"}]),
                false,
            ),
            (json!([{"key": "other", "operator": "Exists"}]), false),
        ] {
            assert_eq!(
                node_fits(&gpu, &with(tolerations.clone())),
                fits,
                "{tolerations}"
            );
        }
        let evicting = json!({"spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}});
        assert_eq!(
            node_rejects(&evicting, &json!({})).as_deref(),
            Some("node(s) had untolerated taint {maintenance: }")
        );
        // Tolerated, the node is still checked by node affinity.
        let tolerated_elsewhere =
            json!({"tolerations": [{"operator": "Exists"}], "nodeSelector": {"zone": "b"}});
        assert_eq!(
            node_rejects(&gpu, &tolerated_elsewhere).as_deref(),
            Some(NODE_AFFINITY_REASON)
        );
        // Untolerated and unselected: the taint's reason, its filter runs first.
        assert_eq!(
            node_rejects(&gpu, &json!({"nodeSelector": {"zone": "b"}})).as_deref(),
            Some("node(s) had untolerated taint {dedicated: gpu}")
        );
    }
}
