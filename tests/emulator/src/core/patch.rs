//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch (an
//! approximation: lists of objects merge by their key field, `$patch`/`$setElementOrder`
//! directives are honoured, other directives are dropped) and server-side apply (the applied
//! configuration is merged into the live object like a strategic merge patch; field ownership,
//! conflicts and pruning are `fieldmanager.rs`).

use crate::core::status::ApiError;
use serde_json::Value;

/// The patch flavours Kubernetes accepts, by Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchType {
    /// From the request's Content-Type; 415 for anything else.
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(Self::Apply),
            other => Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {other:?})"
                ),
            )),
        }
    }
}

/// Applies a patch of `kind` (body already decoded) to `target`.
pub fn apply(kind: PatchType, target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    match kind {
        PatchType::Merge => {
            json_patch::merge(target, patch);
            Ok(())
        }
        PatchType::Json => {
            let p: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            // A failed `test` op or a bad path is a 422 on a real server.
            json_patch::patch(target, &p).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })
        }
        PatchType::Strategic | PatchType::Apply => {
            strategic_merge(target, patch);
            Ok(())
        }
    }
}

const MERGE_KEYS: &[&str] = &[
    "name",
    "containerPort",
    "mountPath",
    "devicePath",
    "ip",
    "type",
];

fn is_directive(k: &str) -> bool {
    k.starts_with('$')
}

/// A copy of `v` without `$…` directive keys.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !is_directive(k))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip).collect()),
        other => other.clone(),
    }
}

fn merge_key(items: &[Value]) -> Option<&'static str> {
    MERGE_KEYS
        .iter()
        .copied()
        .find(|k| !items.is_empty() && items.iter().all(|i| i.get(*k).is_some()))
}

/// Strategic-merge `patch` into `target`.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let (Some(t), Some(p)) = (target.as_object_mut(), patch.as_object()) else {
        *target = strip(patch);
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip(patch);
        return;
    }
    for (k, v) in p {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(del)) = (t.get_mut(field), v.as_array()) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if is_directive(k) {
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), v) {
            (Some(Value::Array(cur)), Value::Array(items)) => {
                let order = p
                    .get(&format!("$setElementOrder/{k}"))
                    .and_then(Value::as_array);
                merge_list(cur, items, order);
            }
            (Some(cur @ Value::Object(_)), Value::Object(_)) => strategic_merge(cur, v),
            _ => {
                t.insert(k.clone(), strip(v));
            }
        }
    }
}

fn merge_list(cur: &mut Vec<Value>, items: &[Value], order: Option<&Vec<Value>>) {
    let key = merge_key(items).filter(|k| cur.iter().all(|c| c.get(*k).is_some()));
    let Some(key) = key.filter(|_| items.iter().all(Value::is_object)) else {
        // Lists of scalars (or without a merge key) are replaced.
        *cur = items.iter().map(strip).collect();
        return;
    };
    for item in items {
        let id = item.get(key);
        let pos = cur.iter().position(|c| c.get(key) == id);
        if item.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(i) = pos {
                cur.remove(i);
            }
            continue;
        }
        match pos {
            Some(i) => strategic_merge(&mut cur[i], item),
            None => cur.push(strip(item)),
        }
    }
    if let Some(order) = order {
        let rank = |v: &Value| {
            order
                .iter()
                .position(|o| o.get(key) == v.get(key))
                .unwrap_or(usize::MAX)
        };
        cur.sort_by_key(rank);
    }
}

/// Removes `$`-directives from a whole object (for a create through apply or SMP).
pub fn without_directives(v: &Value) -> Value {
    strip(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_deletes_with_null() {
        let mut o = json!({"spec": {"a": 1, "b": 2}, "metadata": {"labels": {"x": "1"}}});
        apply(
            PatchType::Merge,
            &mut o,
            &json!({"spec": {"a": null, "c": 3}, "metadata": {"labels": {"y": "2"}}}),
        )
        .unwrap();
        assert_eq!(
            o,
            json!({"spec": {"b": 2, "c": 3}, "metadata": {"labels": {"x": "1", "y": "2"}}})
        );
    }

    #[test]
    fn json_patch_ops_and_test_failure() {
        let mut o = json!({"spec": {"runStrategy": "Halted", "list": [1, 2]}});
        let p = json!([{"op": "test", "path": "/spec/runStrategy", "value": "Halted"},
                       {"op": "replace", "path": "/spec/runStrategy", "value": "Always"},
                       {"op": "add", "path": "/spec/list/-", "value": 3}]);
        apply(PatchType::Json, &mut o, &p).unwrap();
        assert_eq!(
            o,
            json!({"spec": {"runStrategy": "Always", "list": [1, 2, 3]}})
        );
        let err = apply(
            PatchType::Json,
            &mut o,
            &json!([{"op": "test", "path": "/spec/runStrategy", "value": "Halted"}]),
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
    }

    #[test]
    fn strategic_merges_lists_by_name() {
        let mut o = json!({"spec": {"containers": [{"name": "a", "image": "x", "args": ["1"]}, {"name": "b", "image": "y"}]}});
        let p = json!({"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
            "containers": [{"name": "a", "image": "x2"}, {"name": "b", "$patch": "delete"}, {"name": "c", "image": "z"}]}});
        apply(PatchType::Strategic, &mut o, &p).unwrap();
        assert_eq!(
            o,
            json!({"spec": {"containers": [{"name": "a", "image": "x2", "args": ["1"]}, {"name": "c", "image": "z"}]}})
        );
    }
}
