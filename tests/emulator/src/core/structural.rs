//! What kube-apiserver's custom-resource codec does to every object it decodes, on writes
//! (request bodies, patch results) and on reads from storage alike: pruning of unknown fields,
//! removal of nulls that a non-nullable field without a default cannot hold, then defaulting.
//!
//! Modelled on k8s.io/apiextensions-apiserver `pkg/apiserver/schema/pruning/algorithm.go`
//! (`Prune`: fields not in `properties`/`additionalProperties` are dropped, unless the node has
//! `x-kubernetes-preserve-unknown-fields`, which keeps them but still prunes inside the known
//! ones; `apiVersion`/`kind`/`metadata` are kept at the root and in
//! `x-kubernetes-embedded-resource` nodes), `pkg/apiserver/schema/defaulting/prunenulls.go`
//! (`PruneNonNullableNullsWithoutDefaults`) and `defaulting/algorithm.go` (`Default`: a
//! property's `default` is set when the property is absent or a non-nullable null, in the
//! object that holds it; defaults also reach list items and `additionalProperties` values; a
//! default is a value like any other, so defaults inside it apply too). Written from that
//! behaviour, not copied. The order is the codec's (customresource_handler.go): prune, then
//! nulls, then defaults, then (separately) validation.
//!
//! Metadata is not walked here: `schema.rs` checks and prunes it like ObjectMeta decoding does.

use serde_json::{Map, Value};

/// A field the schema does not declare: (path as validation prints it, field name, value).
pub type Unknown = (String, String, Value);

/// Whether the node keeps fields it does not declare.
fn preserves(s: &Value) -> bool {
    s.get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
        || s.get("additionalProperties") == Some(&Value::Bool(true))
}

fn embedded(s: &Value) -> bool {
    s.get("x-kubernetes-embedded-resource")
        .and_then(Value::as_bool)
        == Some(true)
}

fn nullable(s: &Value) -> bool {
    s.get("nullable").and_then(Value::as_bool) == Some(true)
}

fn props(s: &Value) -> Option<&Map<String, Value>> {
    s.get("properties").and_then(Value::as_object)
}

/// The schema of map values, when `additionalProperties` is a schema.
fn additional(s: &Value) -> Option<&Value> {
    s.get("additionalProperties").filter(|a| a.is_object())
}

/// The schema of member `key` of an object node.
fn member<'s>(s: &'s Value, key: &str) -> Option<&'s Value> {
    props(s).and_then(|p| p.get(key)).or_else(|| additional(s))
}

/// Where a node sits, as a chain of parent links: the printed path (`spec.items[0].x`) is
/// built only for an unknown field, so pruning a clean object allocates nothing for paths.
#[derive(Clone, Copy)]
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn render(&self) -> String {
        match self {
            Path::Root => String::new(),
            Path::Key(parent, key) => {
                let parent = parent.render();
                if parent.is_empty() {
                    key.to_string()
                } else {
                    format!("{parent}.{key}")
                }
            }
            Path::Index(parent, i) => format!("{}[{i}]", parent.render()),
        }
    }
}

/// Prunes `obj` (a whole object; `schema` its `openAPIV3Schema`) and returns the unknown
/// fields, outermost first. With `remove` false the object is left as it was (Strict field
/// validation only reports them).
pub fn prune(schema: &Value, obj: &mut Value, remove: bool) -> Vec<Unknown> {
    let mut out = vec![];
    // The root is always treated as an embedded resource (pruning.Prune with
    // isResourceRoot): apiVersion, kind and metadata are never pruned there.
    prune_node(obj, Some(schema), &Path::Root, true, remove, &mut out);
    out
}

fn prune_node(
    x: &mut Value,
    s: Option<&Value>,
    path: &Path,
    root: bool,
    remove: bool,
    out: &mut Vec<Unknown>,
) {
    if let Some(s) = s
        && preserves(s)
    {
        skip_prune(x, s, path, root, remove, out);
        return;
    }
    match x {
        Value::Object(map) => {
            let keep_meta = root || s.is_some_and(embedded);
            // Reported in key order, nested ones where they occur; values are taken (or copied)
            // once the walk over this map is done.
            let mut unknown: Vec<usize> = vec![];
            for (k, v) in map.iter_mut() {
                if keep_meta && is_meta(k, v) {
                    continue;
                }
                match s.and_then(|s| member(s, k)) {
                    Some(cs) => prune_node(v, Some(cs), &Path::Key(path, k), false, remove, out),
                    None => {
                        unknown.push(out.len());
                        out.push((Path::Key(path, k).render(), k.clone(), Value::Null));
                    }
                }
            }
            for at in unknown {
                let k = &out[at].1;
                let v = if remove {
                    map.remove(k)
                } else {
                    map.get(k).cloned()
                };
                out[at].2 = v.unwrap_or(Value::Null);
            }
        }
        Value::Array(items) => {
            let is = s.and_then(|s| s.get("items"));
            for (i, item) in items.iter_mut().enumerate() {
                prune_node(item, is, &Path::Index(path, i), false, remove, out);
            }
        }
        _ => {}
    }
}

/// `apiVersion`/`kind` strings and a `metadata` object of a resource node.
fn is_meta(k: &str, v: &Value) -> bool {
    match k {
        "apiVersion" | "kind" => v.is_string(),
        "metadata" => v.is_object(),
        _ => false,
    }
}

/// A node that preserves unknown fields: only its declared members are pruned inside.
fn skip_prune(
    x: &mut Value,
    s: &Value,
    path: &Path,
    root: bool,
    remove: bool,
    out: &mut Vec<Unknown>,
) {
    match x {
        Value::Object(map) => {
            let keep_meta = root || embedded(s);
            for (k, v) in map.iter_mut() {
                if keep_meta && is_meta(k, v) {
                    continue;
                }
                if let Some(cs) = member(s, k) {
                    prune_node(v, Some(cs), &Path::Key(path, k), false, remove, out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    skip_prune(item, is, &Path::Index(path, i), false, remove, out);
                }
            }
        }
        _ => {}
    }
}

/// Removes nulls of non-nullable fields that have no default (those with one are defaulted
/// by [`default`]). Metadata is left alone.
pub fn prune_nulls(schema: &Value, obj: &mut Value) {
    if let Some(map) = obj.as_object_mut() {
        for (k, v) in map.iter_mut().filter(|(k, _)| k.as_str() != "metadata") {
            nulls(v, member(schema, k));
        }
        map.retain(|k, v| {
            !(v.is_null()
                && k != "metadata"
                && member(schema, k).is_some_and(|s| !nullable(s) && s.get("default").is_none()))
        });
    }
}

fn nulls(x: &mut Value, s: Option<&Value>) {
    match x {
        Value::Object(map) => {
            map.retain(|k, v| {
                let cs = s.and_then(|s| member(s, k));
                !(v.is_null() && cs.is_some_and(|c| !nullable(c) && c.get("default").is_none()))
            });
            for (k, v) in map.iter_mut() {
                nulls(v, s.and_then(|s| member(s, k)));
            }
        }
        Value::Array(items) => {
            let is = s.and_then(|s| s.get("items"));
            for item in items {
                nulls(item, is);
            }
        }
        _ => {}
    }
}

/// Applies the schema's defaults to `obj` (not to its metadata).
pub fn default(schema: &Value, obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let meta = map.remove("metadata");
    default_node(obj, schema);
    if let (Some(m), Some(map)) = (meta, obj.as_object_mut()) {
        map.insert("metadata".into(), m);
    }
}

fn is_non_nullable_null(x: &Value, s: &Value) -> bool {
    x.is_null() && !nullable(s)
}

fn default_node(x: &mut Value, s: &Value) {
    match x {
        Value::Object(map) => {
            if let Some(p) = props(s) {
                for (k, ps) in p {
                    if let Some(d) = ps.get("default")
                        && map.get(k).is_none_or(|v| is_non_nullable_null(v, ps))
                    {
                        map.insert(k.clone(), d.clone());
                    }
                }
            }
            let p = props(s);
            let add = additional(s);
            for (k, v) in map.iter_mut() {
                if let Some(ps) = p.and_then(|p| p.get(k)) {
                    default_node(v, ps);
                } else if let Some(a) = add {
                    if is_non_nullable_null(v, a)
                        && let Some(d) = a.get("default")
                    {
                        *v = d.clone();
                    }
                    default_node(v, a);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for item in items.iter_mut() {
                    if is_non_nullable_null(item, is)
                        && let Some(d) = is.get("default")
                    {
                        *item = d.clone();
                    }
                    default_node(item, is);
                }
            }
        }
        _ => {}
    }
}

/// What decoding an object read from storage does: unknown fields pruned, nulls removed,
/// defaults applied.
pub fn on_read(schema: &Value, obj: &mut Value) {
    prune(schema, obj, true);
    prune_nulls(schema, obj);
    default(schema, obj);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A schema in the shape of the upstream unit tests (defaulting/algorithm_test.go): defaults
    /// on properties, inside list items and map values, under an absent parent.
    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "a": {"type": "string", "default": "A"},
                "n": {"type": "integer", "default": 1},
                "nullableWithDefault": {"type": "string", "nullable": true, "default": "D"},
                "noDefault": {"type": "string"},
                "obj": {"type": "object", "properties": {"x": {"type": "string", "default": "X"}}},
                "objWithDefault": {"type": "object", "default": {},
                    "properties": {"y": {"type": "string", "default": "Y"}}},
                "list": {"type": "array", "items": {"type": "object",
                    "properties": {"z": {"type": "boolean", "default": true}}}},
                "map": {"type": "object", "additionalProperties": {"type": "object",
                    "properties": {"w": {"type": "string", "default": "W"}}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                    "properties": {"known": {"type": "object", "properties": {"k": {"type": "string"}}}}},
                "embedded": {"type": "object", "x-kubernetes-embedded-resource": true,
                    "properties": {"spec": {"type": "object"}}}
            }},
            "status": {"type": "object", "properties": {"phase": {"type": "string", "default": "Pending"}}}
        }})
    }

    #[test]
    fn defaults_apply_where_the_parent_exists() {
        let s = schema();
        let mut obj = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"},
            "spec": {"list": [{}, {"z": false}], "map": {"m": {}}}});
        default(&s, &mut obj);
        assert_eq!(
            obj,
            json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"},
                "spec": {"a": "A", "n": 1, "nullableWithDefault": "D", "objWithDefault": {"y": "Y"},
                    "list": [{"z": true}, {"z": false}], "map": {"m": {"w": "W"}}}})
        );
        // `obj` is absent, so its default `x` is not set; `status` likewise.
        assert!(obj["spec"].get("obj").is_none() && obj.get("status").is_none());
    }

    #[test]
    fn nulls_default_or_go() {
        let s = schema();
        let mut obj = json!({"spec": {"a": null, "noDefault": null, "nullableWithDefault": null,
            "list": [null], "obj": {"x": null}}});
        prune_nulls(&s, &mut obj);
        default(&s, &mut obj);
        // Non-nullable with a default: defaulted. Non-nullable without: removed. Nullable:
        // kept as null. A null list item of a non-nullable item schema without default stays
        // (PruneNonNullableNullsWithoutDefaults only deletes map members).
        assert_eq!(obj["spec"]["a"], "A");
        assert!(obj["spec"].get("noDefault").is_none());
        assert_eq!(obj["spec"]["nullableWithDefault"], Value::Null);
        assert_eq!(obj["spec"]["obj"], json!({"x": "X"}));
        assert_eq!(obj["spec"]["list"], json!([null]));
    }

    #[test]
    fn pruning_keeps_resource_fields_and_preserved_nodes() {
        let s = schema();
        let mut obj = json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"},
            "extra": 1,
            "spec": {"bogus": {"deep": true}, "list": [{"z": true, "q": 1}],
                "free": {"anything": [1], "known": {"k": "v", "gone": 2}},
                "embedded": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                    "spec": {"kept": 1}, "other": 1}}});
        let unknown = prune(&s, &mut obj.clone(), false);
        let paths: Vec<&str> = unknown.iter().map(|u| u.0.as_str()).collect();
        assert_eq!(
            {
                let mut p = paths.clone();
                p.sort();
                p
            },
            [
                "extra",
                "spec.bogus",
                "spec.embedded.other",
                "spec.embedded.spec.kept",
                "spec.free.known.gone",
                "spec.list[0].q"
            ]
        );
        prune(&s, &mut obj, true);
        assert_eq!(
            obj,
            json!({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"},
                "spec": {"list": [{"z": true}],
                    "free": {"anything": [1], "known": {"k": "v"}},
                    "embedded": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                        "spec": {}}}})
        );
    }
}
