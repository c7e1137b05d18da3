//! `meta.k8s.io/v1` Table output (what `kubectl get` asks for with
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), and the small JSONPath subset that
//! printer columns use.

use crate::core::registry::{Column, ResourceDef};
use crate::core::util::{human_duration, now_unix, parse_rfc3339};
use serde_json::{Value, json};

/// How much of each object a row carries (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// `PartialObjectMetadata` (the default).
    Metadata,
    /// The full object.
    Object,
}

impl IncludeObject {
    /// From the `includeObject` query parameter.
    pub fn parse(v: Option<&str>) -> Self {
        match v {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

/// One step of a JSONPath.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
    All,
    /// `[?(@.a.b=='x')]` / `!=`.
    Filter(Vec<String>, bool, String),
}

fn parse_path(path: &str) -> Vec<Step> {
    let p = path.trim().trim_start_matches('{').trim_end_matches('}');
    let chars: Vec<char> = p.chars().collect();
    let mut steps = vec![];
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '.' => {
                i += 1;
                let mut name = String::new();
                while i < chars.len() && chars[i] != '.' && chars[i] != '[' {
                    if chars[i] == '\\' && i + 1 < chars.len() {
                        i += 1;
                    }
                    name.push(chars[i]);
                    i += 1;
                }
                if !name.is_empty() {
                    steps.push(Step::Field(name));
                }
            }
            '[' => {
                let end = chars[i..]
                    .iter()
                    .position(|c| *c == ']')
                    .map(|e| i + e)
                    .unwrap_or(chars.len());
                let inner: String = chars[i + 1..end].iter().collect();
                i = end + 1;
                let inner = inner.trim();
                if inner == "*" {
                    steps.push(Step::All);
                } else if let Some(f) = inner.strip_prefix("?(").and_then(|f| f.strip_suffix(')')) {
                    let (lhs, eq, rhs) = match f.split_once("!=") {
                        Some((l, r)) => (l, false, r),
                        None => match f.split_once("==") {
                            Some((l, r)) => (l, true, r),
                            None => (f, true, ""),
                        },
                    };
                    let field: Vec<String> = lhs
                        .trim()
                        .trim_start_matches('@')
                        .split('.')
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect();
                    let value = rhs
                        .trim()
                        .trim_matches(|c| c == '\'' || c == '"')
                        .to_string();
                    steps.push(Step::Filter(field, eq, value));
                } else if let Ok(n) = inner.parse() {
                    steps.push(Step::Index(n));
                } else {
                    steps.push(Step::Field(
                        inner.trim_matches(|c| c == '\'' || c == '"').to_string(),
                    ));
                }
            }
            _ => i += 1,
        }
    }
    steps
}

/// Evaluates a JSONPath and returns every match.
pub fn eval<'a>(obj: &'a Value, path: &str) -> Vec<&'a Value> {
    let mut cur = vec![obj];
    for step in parse_path(path) {
        let mut next = vec![];
        for v in cur {
            match &step {
                Step::Field(f) => next.extend(v.get(f.as_str())),
                Step::Index(n) => next.extend(v.get(*n)),
                Step::All => match v {
                    Value::Array(a) => next.extend(a.iter()),
                    Value::Object(m) => next.extend(m.values()),
                    _ => {}
                },
                Step::Filter(field, eq, want) => {
                    for item in v.as_array().into_iter().flatten() {
                        let got = field.iter().try_fold(item, |x, f| x.get(f.as_str()));
                        let got = match got {
                            Some(Value::String(s)) => s.clone(),
                            Some(other) => other.to_string(),
                            None => continue,
                        };
                        if (got == *want) == *eq {
                            next.push(item);
                        }
                    }
                }
            }
        }
        cur = next;
    }
    cur
}

/// The first JSONPath match (what a printer column shows).
pub fn eval_first<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    eval(obj, path).into_iter().next()
}

fn builtin(obj: &Value, name: &str) -> Value {
    let arr = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    match name {
        "@pod-ready" => {
            let statuses = arr("/status/containerStatuses");
            let ready = statuses
                .iter()
                .filter(|s| s.get("ready").and_then(Value::as_bool) == Some(true))
                .count();
            json!(format!("{ready}/{}", arr("/spec/containers").len()))
        }
        "@pod-restarts" => {
            let n: i64 = arr("/status/containerStatuses")
                .iter()
                .filter_map(|s| s.get("restartCount").and_then(Value::as_i64))
                .sum();
            json!(n.to_string())
        }
        "@node-status" => {
            let ready = eval_first(obj, ".status.conditions[?(@.type=='Ready')].status")
                .and_then(Value::as_str)
                == Some("True");
            let mut s = if ready {
                "Ready".to_string()
            } else {
                "NotReady".to_string()
            };
            if obj.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
                s.push_str(",SchedulingDisabled");
            }
            json!(s)
        }
        "@node-roles" => {
            let roles: Vec<&str> = obj
                .pointer("/metadata/labels")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
                .collect();
            json!(if roles.is_empty() {
                "<none>".to_string()
            } else {
                roles.join(",")
            })
        }
        "@event-object" => {
            let kind = obj
                .pointer("/involvedObject/kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_lowercase();
            let name = obj
                .pointer("/involvedObject/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            json!(format!("{kind}/{name}"))
        }
        "@access-modes" => {
            let modes = if obj.pointer("/status/accessModes").is_some() {
                arr("/status/accessModes")
            } else {
                arr("/spec/accessModes")
            };
            let short: Vec<&str> = modes
                .iter()
                .filter_map(Value::as_str)
                .map(|m| match m {
                    "ReadWriteOnce" => "RWO",
                    "ReadOnlyMany" => "ROX",
                    "ReadWriteMany" => "RWX",
                    "ReadWriteOncePod" => "RWOP",
                    other => other,
                })
                .collect();
            json!(short.join(","))
        }
        "@data-count" => {
            let n = ["data", "binaryData"]
                .iter()
                .filter_map(|k| obj.get(*k).and_then(Value::as_object))
                .map(|m| m.len())
                .sum::<usize>();
            json!(n)
        }
        other => workload_builtin(obj, other),
    }
}

/// Columns of Deployments, Endpoints, PodDisruptionBudgets and APIServices, as
/// pkg/printers/internalversion/printers.go (and kube-aggregator's APIService table convertor)
/// compute them.
fn workload_builtin(obj: &Value, name: &str) -> Value {
    let int = |p: &str| obj.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let int_or_str = |p: &str| match obj.pointer(p) {
        Some(Value::Number(n)) => json!(n.to_string()),
        Some(Value::String(s)) => json!(s),
        _ => json!("N/A"),
    };
    let containers = || {
        obj.pointer("/spec/template/spec/containers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let join = |field: &str| {
        let v: Vec<String> = containers()
            .iter()
            .filter_map(|c| c[field].as_str().map(str::to_owned))
            .collect();
        json!(v.join(","))
    };
    match name {
        "@deploy-ready" => json!(format!(
            "{}/{}",
            int("/status/readyReplicas"),
            obj.pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1)
        )),
        "@deploy-updated" => json!(int("/status/updatedReplicas")),
        "@deploy-available" => json!(int("/status/availableReplicas")),
        "@containers" => join("name"),
        "@images" => join("image"),
        "@selector" => {
            let labels: Vec<String> = obj
                .pointer("/spec/selector/matchLabels")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect();
            json!(if labels.is_empty() {
                "<none>".to_string()
            } else {
                labels.join(",")
            })
        }
        "@endpoints" => {
            // formatEndpoints: "ip:port" pairs, at most 3, then " + N more...".
            let mut all = vec![];
            for subset in obj["subsets"].as_array().into_iter().flatten() {
                let ports = subset["ports"].as_array().cloned().unwrap_or_default();
                for addr in subset["addresses"].as_array().into_iter().flatten() {
                    let ip = addr["ip"].as_str().unwrap_or_default();
                    if ports.is_empty() {
                        all.push(ip.to_string());
                    }
                    for p in &ports {
                        all.push(format!("{ip}:{}", p["port"]));
                    }
                }
            }
            let mut s = all.iter().take(3).cloned().collect::<Vec<_>>().join(",");
            if all.len() > 3 {
                s.push_str(&format!(" + {} more...", all.len() - 3));
            }
            json!(if s.is_empty() {
                "<none>".to_string()
            } else {
                s
            })
        }
        // printers.go formatDiscoveryPorts / formatDiscoveryEndpoints: at most 3, then
        // " + N more...", "<unset>" for no ports and "<none>" for no endpoints.
        "@slice-ports" | "@slice-endpoints" => {
            let (field, empty) = if name == "@slice-ports" {
                ("ports", "<unset>")
            } else {
                ("endpoints", "<none>")
            };
            let all: Vec<String> = obj[field]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|e| {
                    if field == "ports" {
                        vec![e["port"].to_string()]
                    } else {
                        e["addresses"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|a| a.as_str().map(str::to_string))
                            .collect()
                    }
                })
                .collect();
            let mut s = all.iter().take(3).cloned().collect::<Vec<_>>().join(",");
            if all.len() > 3 {
                s.push_str(&format!(" + {} more...", all.len() - 3));
            }
            json!(if s.is_empty() { empty.to_string() } else { s })
        }
        "@pdb-min" => int_or_str("/spec/minAvailable"),
        "@pdb-max" => int_or_str("/spec/maxUnavailable"),
        "@pdb-allowed" => json!(int("/status/disruptionsAllowed")),
        "@apiservice-service" => match obj.pointer("/spec/service") {
            Some(s) if s.is_object() => json!(format!(
                "{}/{}",
                s["namespace"].as_str().unwrap_or_default(),
                s["name"].as_str().unwrap_or_default()
            )),
            _ => json!("Local"),
        },
        "@apiservice-available" => {
            match eval_first(obj, ".status.conditions[?(@.type=='Available')]") {
                Some(c) if c["status"] == "True" => json!("True"),
                Some(c) => json!(format!(
                    "{} ({})",
                    c["status"].as_str().unwrap_or_default(),
                    c["reason"].as_str().unwrap_or_default()
                )),
                None => json!("Unknown"),
            }
        }
        _ => Value::Null,
    }
}

/// The cell of `column` for `obj` (dates become ages such as `5m`, like the API server does).
pub fn cell(obj: &Value, column: &Column) -> Value {
    if column.json_path.starts_with('@') {
        return builtin(obj, &column.json_path);
    }
    let Some(v) = eval_first(obj, &column.json_path) else {
        return Value::Null;
    };
    match column.type_.as_str() {
        "date" => match v.as_str().and_then(parse_rfc3339) {
            Some(t) => json!(human_duration(now_unix() - t)),
            None => Value::Null,
        },
        "integer" | "number" | "boolean" => v.clone(),
        _ => match v {
            Value::String(_) | Value::Null => v.clone(),
            Value::Array(_) | Value::Object(_) => json!(v.to_string()),
            other => json!(other.to_string()),
        },
    }
}

/// Column definitions: `Name` plus the kind's printer columns.
pub fn column_definitions(def: &ResourceDef) -> Value {
    let mut cols = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
    })];
    cols.extend(def.columns.iter().map(|c| {
        json!({"name": c.name, "type": if c.type_ == "date" { "date" } else { c.type_.as_str() }, "format": c.format, "description": c.description, "priority": c.priority})
    }));
    Value::Array(cols)
}

/// One table row.
pub fn row(def: &ResourceDef, obj: &Value, include: IncludeObject) -> Value {
    let mut cells = vec![
        obj.pointer("/metadata/name")
            .cloned()
            .unwrap_or(Value::Null),
    ];
    cells.extend(def.columns.iter().map(|c| cell(obj, c)));
    let mut r = json!({"cells": cells});
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            r["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))});
        }
        IncludeObject::Object => r["object"] = obj.clone(),
    }
    r
}

/// A whole Table for a list (or a single object).
pub fn table<V: std::borrow::Borrow<Value>>(
    def: &ResourceDef,
    objs: &[V],
    resource_version: Option<u64>,
    include: IncludeObject,
) -> Value {
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {},
        "columnDefinitions": column_definitions(def),
    });
    // Moved in, not interpolated: `json!` would deep-copy every row.
    t["rows"] = Value::Array(objs.iter().map(|o| row(def, o.borrow(), include)).collect());
    if let Some(rv) = resource_version {
        t["metadata"]["resourceVersion"] = json!(rv.to_string());
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_subset() {
        let o = json!({"status": {"conditions": [{"type": "Paused", "status": "False"}, {"type": "Ready", "status": "True"}],
                       "interfaces": [{"ipAddress": "10.0.0.1"}]},
                       "metadata": {"annotations": {"a.b/c": "yes"}}});
        assert_eq!(
            eval_first(&o, ".status.conditions[?(@.type=='Ready')].status"),
            Some(&json!("True"))
        );
        assert_eq!(
            eval_first(&o, ".status.interfaces[0].ipAddress"),
            Some(&json!("10.0.0.1"))
        );
        assert_eq!(
            eval_first(&o, r".metadata.annotations.a\.b\/c"),
            Some(&json!("yes"))
        );
        assert_eq!(eval(&o, ".status.conditions[*].type").len(), 2);
        assert_eq!(eval_first(&o, ".status.missing"), None);
    }
}
