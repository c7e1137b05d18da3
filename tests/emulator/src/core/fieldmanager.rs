//! Field ownership (`metadata.managedFields`) as the API server keeps it for server-side apply.
//!
//! Modelled on k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager (and its `internal`
//! package: `structuredmerge.go`, `stripmeta.go`, `managedfields.go`, `conflict.go`) and on
//! sigs.k8s.io/structured-merge-diff v4 (`typed/tofieldset.go`, `merge/update.go`,
//! `fieldpath/serialize.go`). Written from their documented behaviour, not copied:
//!
//! - A field set is a set of paths; a path element is `f:<field>` or, for an item of a list
//!   with a merge key, `k:{"name":"x"}`. Serialised as FieldsV1: nested objects, `{}` for a
//!   member without children, `".": {}` for a member that also has children.
//! - The applied configuration's set holds its leaves (scalars, atomic lists, empty objects,
//!   nulls) and every keyed list item (`tofieldset.go`).
//! - Apply: a field in the applied set that another manager owns and whose value the apply
//!   changes is a conflict (409, `conflict.go`), unless `force=true`, which moves the field
//!   to the applier. Equal values are co-owned. Fields the manager applied last time and no
//!   longer applies, and nobody else owns, are removed (`merge/update.go` prune).
//! - Update/Patch/Create record an `Update` entry with the fields that the request changed;
//!   those fields leave the other managers' sets (no conflicts for updates).
//! - apiVersion/kind and server-owned metadata (name, namespace, uid, resourceVersion,
//!   generation, creationTimestamp, managedFields, …) are never owned (`stripmeta.go`), nor
//!   is `status` through the main resource when status is a subresource (reset fields).
//!
//! - An Update owns, besides the leaves it changed, every non-leaf node it added (a non-empty
//!   object or a keyed list item absent before): `typed.Compare` runs the merge walker with a
//!   post-item hook that puts such paths in `Added`, and FieldsV1 then shows them as `".": {}`.
//!   A custom resource's "before" on create is an empty object, so every object its creator
//!   sends is such a node (`f:spec: {".": {}, …}`); the `metadata` node itself is stripped.
//!
//! Approximations (no OpenAPI types here): a list of objects that all have `name` is keyed by
//! `name` for built-in kinds; lists of custom resources are atomic (as CRD lists without
//! `x-kubernetes-list-type` are); lists of scalars are atomic. For built-in kinds, whose
//! "before" on create is the typed zero value (structs present, pointers and maps absent), only
//! `labels`/`annotations` and `data`/`binaryData`/`stringData` are known as nodes an Update can
//! add. `/status` writes record nothing.

use crate::core::status::ApiError;
use crate::core::util::now_rfc3339;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

/// A path: FieldsV1 keys (`f:spec`, `k:{"name":"x"}`) from the root.
pub type Path = Vec<String>;
/// A set of owned paths.
pub type FieldSet = BTreeSet<Path>;

/// Metadata that no manager owns (stripmeta.go).
const SERVER_META: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "managedFields",
    "generateName",
];

/// How a kind's objects are walked.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Lists of objects that all carry `name` are keyed by it (built-in kinds).
    pub keyed_lists: bool,
    /// `status` is a subresource, so main-resource writes own none of it.
    pub status_subresource: bool,
    /// A custom resource: every object is a node an Update can add (see the module comment).
    pub custom: bool,
}

/// Who writes: the manager name and the request's group/version.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    /// `fieldManager`, or the user agent's program name.
    pub manager: &'a str,
    /// `apps/v1`, `v1`, `kubevirt.io/v1`, ….
    pub api_version: &'a str,
    /// Shape of the kind.
    pub shape: Shape,
}

/// The shape of a stored kind: built-in kinds (core or `*.k8s.io` groups) key lists of named
/// objects; custom resources' lists are atomic.
pub fn shape_of(def: &crate::core::registry::ResourceDef) -> Shape {
    let builtin = !def.group.contains('.') || def.group.ends_with(".k8s.io");
    Shape {
        keyed_lists: builtin,
        status_subresource: def.has_status,
        custom: !builtin,
    }
}

/// The default manager of a non-apply write: the `fieldManager` query parameter, else the
/// user agent up to its first `/` (handlers/rest.go `managerOrUserAgent`/`prefixFromUserAgent`).
pub fn manager_or_user_agent(field_manager: Option<&str>, user_agent: &str) -> String {
    match field_manager.filter(|m| !m.is_empty()) {
        Some(m) => m.to_string(),
        None => user_agent.split('/').next().unwrap_or("").to_string(),
    }
}

fn key_elem(item: &Value) -> String {
    let name = item.get("name").cloned().unwrap_or(Value::Null);
    format!("k:{}", json!({ "name": name }))
}

fn keyed(list: &[Value], shape: Shape) -> bool {
    shape.keyed_lists
        && !list.is_empty()
        && list
            .iter()
            .all(|i| i.get("name").is_some_and(|n| !n.is_null()))
}

/// The object without what nobody owns.
fn ownable(obj: &Value, shape: Shape) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
        if shape.status_subresource {
            m.remove("status");
        }
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            for f in SERVER_META {
                meta.remove(*f);
            }
            if meta.is_empty() {
                m.remove("metadata");
            }
        }
    }
    o
}

/// The field set of an object (tofieldset.go): leaves and keyed list items.
pub fn fields_of(obj: &Value, shape: Shape) -> FieldSet {
    let mut set = FieldSet::new();
    walk(&ownable(obj, shape), &mut vec![], shape, &mut set);
    set
}

fn walk(v: &Value, path: &mut Path, shape: Shape, set: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(format!("f:{k}"));
                walk(child, path, shape, set);
                path.pop();
            }
        }
        Value::Array(items) if keyed(items, shape) => {
            for item in items {
                path.push(key_elem(item));
                set.insert(path.clone());
                if let Some(m) = item.as_object() {
                    for (k, child) in m {
                        path.push(format!("f:{k}"));
                        walk(child, path, shape, set);
                        path.pop();
                    }
                }
                path.pop();
            }
        }
        _ => {
            if !path.is_empty() {
                set.insert(path.clone());
            }
        }
    }
}

/// The value at a path, if present.
pub fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for pe in path {
        cur = if let Some(f) = pe.strip_prefix("f:") {
            cur.as_object()?.get(f)?
        } else {
            let want = key_name(pe)?;
            cur.as_array()?
                .iter()
                .find(|i| i.get("name") == Some(&want))?
        };
    }
    Some(cur)
}

fn key_name(pe: &str) -> Option<Value> {
    let k: Value = serde_json::from_str(pe.strip_prefix("k:")?).ok()?;
    k.get("name").cloned()
}

fn value_at_mut<'a>(obj: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = obj;
    for pe in path {
        cur = if let Some(f) = pe.strip_prefix("f:") {
            cur.as_object_mut()?.get_mut(f)?
        } else {
            let want = key_name(pe)?;
            cur.as_array_mut()?
                .iter_mut()
                .find(|i| i.get("name") == Some(&want))?
        };
    }
    Some(cur)
}

/// Removes the value at a path (a field or a keyed list item).
fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for pe in parent {
        let next = if let Some(f) = pe.strip_prefix("f:") {
            cur.as_object_mut().and_then(|m| m.get_mut(f))
        } else {
            let want = key_name(pe);
            cur.as_array_mut()
                .and_then(|a| a.iter_mut().find(|i| i.get("name") == want.as_ref()))
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(a) = cur.as_array_mut() {
        let want = key_name(last);
        a.retain(|i| i.get("name") != want.as_ref());
    }
}

/// Whether a write changed the field at `path`: objects compare by presence only (their
/// children are fields of their own), everything else by value.
fn changed(old: &Value, new: &Value, path: &[String]) -> bool {
    match (value_at(old, path), value_at(new, path)) {
        (Some(Value::Object(_)), Some(Value::Object(_))) => false,
        (a, b) => a != b,
    }
}

/// The path as structured-merge-diff prints it (`.spec.foo`, `.spec.x[name="a"].y`).
pub fn path_string(path: &[String]) -> String {
    let mut s = String::new();
    for pe in path {
        if let Some(f) = pe.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(Value::Object(k)) = pe
            .strip_prefix("k:")
            .and_then(|j| serde_json::from_str::<Value>(j).ok())
        {
            let parts: Vec<String> = k.iter().map(|(n, v)| format!("{n}={v}")).collect();
            s.push_str(&format!("[{}]", parts.join(",")));
        }
    }
    s
}

/// FieldsV1 JSON of a set (fieldpath/serialize.go).
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for pe in path {
            cur = cur
                .entry(pe.clone())
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("object");
        }
    }
    // Members with children get a "." marker.
    fn mark(m: &mut Map<String, Value>, path: &mut Path, set: &FieldSet) {
        for (k, v) in m.iter_mut() {
            path.push(k.clone());
            let child = v.as_object_mut().expect("object");
            if !child.is_empty() {
                mark(child, path, set);
                if set.contains(path) {
                    child.insert(".".into(), json!({}));
                }
            }
            path.pop();
        }
    }
    mark(&mut root, &mut vec![], set);
    Value::Object(root)
}

/// Parses FieldsV1 JSON into a set.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn go(m: &Map<String, Value>, path: &mut Path, set: &mut FieldSet) {
        for (k, child) in m {
            if k == "." {
                set.insert(path.clone());
                continue;
            }
            path.push(k.clone());
            match child.as_object() {
                Some(c) if !c.is_empty() => go(c, path, set),
                _ => {
                    set.insert(path.clone());
                }
            }
            path.pop();
        }
    }
    let mut set = FieldSet::new();
    if let Some(m) = v.as_object() {
        go(m, &mut vec![], &mut set);
    }
    set
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: Option<String>,
    set: FieldSet,
}

impl Entry {
    fn is(&self, manager: &str, operation: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource.is_none()
    }

    /// The manager as conflict messages print it (conflict.go `printManager`).
    fn printed(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            s.push_str(&format!(" with subresource {sub:?}"));
        }
        if self.operation == "Update" {
            s.push_str(&format!(" using {} at {}", self.api_version, self.time));
        }
        s
    }

    fn to_json(&self) -> Value {
        let mut e = json!({
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(&self.set),
        });
        if let Some(s) = &self.subresource {
            e["subresource"] = json!(s);
        }
        e
    }
}

fn entries(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return vec![];
    };
    list.iter()
        .filter_map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).map(String::from);
            Some(Entry {
                manager: s("manager")?,
                operation: s("operation").unwrap_or_else(|| "Update".into()),
                api_version: s("apiVersion").unwrap_or_default(),
                time: s("time").unwrap_or_default(),
                subresource: s("subresource"),
                set: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
            })
        })
        .collect()
}

/// Stores the entries on `obj`: empty sets dropped, unchanged entries keep their time (so a
/// no-op write leaves the object as it was).
fn store(obj: &mut Value, before: &[Entry], mut now: Vec<Entry>, shape: Shape) {
    // Fields that no longer exist are owned by nobody.
    let mut present = fields_of(obj, shape);
    present.extend(map_nodes(obj, shape));
    for e in &mut now {
        e.set.retain(|p| present.contains(p));
        if let Some(old) = before.iter().find(|o| {
            o.manager == e.manager && o.operation == e.operation && o.subresource == e.subresource
        }) && old.set == e.set
            && old.api_version == e.api_version
        {
            e.time = old.time.clone();
        }
    }
    now.retain(|e| !e.set.is_empty());
    let list: Vec<Value> = now.iter().map(Entry::to_json).collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

fn conflict_error(conflicts: &[(String, Path)]) -> ApiError {
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, p)| {
            json!({"type": "FieldManagerConflict", "message": format!("conflict with {m}"),
                   "field": path_string(p)})
        })
        .collect();
    let message = if let [(m, p)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {m}: {}",
            path_string(p)
        )
    } else {
        let managers: BTreeSet<&String> = conflicts.iter().map(|(m, _)| m).collect();
        let mut lines = vec![];
        for m in managers {
            lines.push(format!("conflicts with {m}:"));
            for (_, p) in conflicts.iter().filter(|(o, _)| o == m) {
                lines.push(format!("- {}", path_string(p)));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let mut e = ApiError::new(409, "Conflict", message);
    e.details = Some(json!({ "causes": causes }));
    e
}

/// Server-side apply by `w`: `live` is the stored object (None on create), `applied` the
/// applied configuration, `merged` the live object with the configuration merged in. Checks
/// conflicts, prunes what the manager stopped applying and records ownership on `merged`.
pub fn apply(
    w: &Writer,
    live: Option<&Value>,
    applied: &Value,
    merged: &mut Value,
    force: bool,
) -> Result<(), ApiError> {
    let empty = json!({});
    let live = live.unwrap_or(&empty);
    let before = entries(live);
    let mut now = before.clone();
    let new_set = fields_of(applied, w.shape);
    // An applied atomic list replaces the live one whole (the strategic-merge approximation
    // in patch.rs merged it item by item).
    for p in &new_set {
        if let (Some(a @ Value::Array(_)), Some(m)) =
            (value_at(applied, p), value_at_mut(merged, p))
        {
            *m = a.clone();
        }
    }
    // Conflicts: fields of the applied set that others own and the apply changes.
    let mut conflicts: Vec<(String, Path)> = vec![];
    for e in now.iter_mut().filter(|e| !e.is(w.manager, "Apply")) {
        let hits: Vec<Path> = e
            .set
            .intersection(&new_set)
            .filter(|p| changed(live, merged, p))
            .cloned()
            .collect();
        if force {
            for p in &hits {
                e.set.remove(p);
            }
        } else {
            conflicts.extend(hits.into_iter().map(|p| (e.printed(), p)));
        }
    }
    if !conflicts.is_empty() {
        conflicts.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        return Err(conflict_error(&conflicts));
    }
    // Pruning: what this manager applied before, applies no more and nobody else owns.
    let previous = now
        .iter()
        .find(|e| e.is(w.manager, "Apply"))
        .map(|e| e.set.clone())
        .unwrap_or_default();
    let others: Vec<&Entry> = now.iter().filter(|e| !e.is(w.manager, "Apply")).collect();
    let mut gone: Vec<&Path> = previous
        .difference(&new_set)
        .filter(|p| {
            !new_set.iter().any(|n| n.starts_with(p))
                && !others
                    .iter()
                    .any(|o| o.set.iter().any(|q| q.starts_with(p)))
        })
        .collect();
    gone.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in gone {
        remove_at(merged, p);
    }
    let entry = Entry {
        manager: w.manager.to_string(),
        operation: "Apply".into(),
        api_version: w.api_version.to_string(),
        time: now_rfc3339(),
        subresource: None,
        set: new_set,
    };
    match now.iter_mut().find(|e| e.is(w.manager, "Apply")) {
        Some(e) => *e = entry,
        None => now.push(entry),
    }
    store(merged, &before, now, w.shape);
    Ok(())
}

/// The object nodes an Update owns when it adds them (see the module comment): for custom
/// resources every non-empty object but `metadata` itself; for built-in kinds `labels` and
/// `annotations` of any `metadata`, and `data`/`binaryData`/`stringData`.
fn map_nodes(obj: &Value, shape: Shape) -> FieldSet {
    fn go(v: &Value, path: &mut Path, custom: bool, set: &mut FieldSet) {
        let Some(m) = v.as_object() else { return };
        for (k, child) in m {
            path.push(format!("f:{k}"));
            let in_meta = path.len() >= 2 && path[path.len() - 2] == "f:metadata";
            let node = if custom {
                !(path.len() == 1 && k == "metadata")
            } else {
                in_meta && (k == "labels" || k == "annotations")
            };
            if node && child.as_object().is_some_and(|c| !c.is_empty()) {
                set.insert(path.clone());
            }
            go(child, path, custom, set);
            path.pop();
        }
    }
    let o = ownable(obj, shape);
    let mut set = FieldSet::new();
    go(&o, &mut vec![], shape.custom, &mut set);
    if shape.keyed_lists {
        for k in ["data", "binaryData", "stringData"] {
            if o.get(k)
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty())
            {
                set.insert(vec![format!("f:{k}")]);
            }
        }
    }
    set
}

/// A create, update or non-apply patch by `w`: the fields it changed become the manager's
/// `Update` entry and leave every other manager's set.
pub fn update(w: &Writer, live: Option<&Value>, new: &mut Value) {
    let empty = json!({});
    let live = live.unwrap_or(&empty);
    let before = entries(live);
    let mut now = before.clone();
    let mut touched: FieldSet = fields_of(new, w.shape)
        .into_iter()
        .filter(|p| changed(live, new, p))
        .collect();
    // A node the request added is owned too (FieldsV1 `.: {}`).
    touched.extend(
        map_nodes(new, w.shape)
            .into_iter()
            .filter(|p| value_at(live, p).is_none()),
    );
    for e in now.iter_mut().filter(|e| !e.is(w.manager, "Update")) {
        e.set.retain(|p| !touched.contains(p));
    }
    match now.iter_mut().find(|e| e.is(w.manager, "Update")) {
        Some(e) => {
            e.set.extend(touched);
            e.api_version = w.api_version.to_string();
            e.time = now_rfc3339();
        }
        None => now.push(Entry {
            manager: w.manager.to_string(),
            operation: "Update".into(),
            api_version: w.api_version.to_string(),
            time: now_rfc3339(),
            subresource: None,
            set: touched,
        }),
    }
    store(new, &before, now, w.shape);
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUILTIN: Shape = Shape {
        keyed_lists: true,
        status_subresource: true,
        custom: false,
    };
    const CRD: Shape = Shape {
        keyed_lists: false,
        status_subresource: true,
        custom: true,
    };

    fn w(m: &str, shape: Shape) -> Writer<'_> {
        Writer {
            manager: m,
            api_version: "v1",
            shape,
        }
    }

    #[test]
    fn field_set_in_fields_v1_notation() {
        // The documented example of the server-side apply page (kubernetes.io/docs/reference/
        // using-api/server-side-apply): keyed containers, labels leaves, no apiVersion/kind/name.
        let obj = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labels": {"app": "x"}},
            "spec": {"replicas": 3, "selector": {},
                "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx:1"}]}}},
            "status": {"replicas": 1}});
        let v1 = to_fields_v1(&fields_of(&obj, BUILTIN));
        assert_eq!(
            v1,
            json!({"f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {"f:replicas": {}, "f:selector": {},
                    "f:template": {"f:spec": {"f:containers": {
                        "k:{\"name\":\"nginx\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})
        );
        assert_eq!(from_fields_v1(&v1), fields_of(&obj, BUILTIN));
        // Custom resources: lists without a list type are atomic, one field.
        let vm = json!({"spec": {"template": {"spec": {"volumes": [{"name": "a"}]}}}});
        assert_eq!(
            to_fields_v1(&fields_of(&vm, CRD)),
            json!({"f:spec": {"f:template": {"f:spec": {"f:volumes": {}}}}})
        );
        // Re-applying a shorter atomic list replaces the list.
        let mut live = vm.clone();
        apply(&w("a", CRD), None, &vm, &mut live, false).unwrap();
        let two =
            json!({"spec": {"template": {"spec": {"volumes": [{"name": "a"}, {"name": "b"}]}}}});
        let mut merged = live.clone();
        crate::core::patch::strategic_merge(&mut merged, &two);
        apply(&w("a", CRD), Some(&live), &two, &mut merged, false).unwrap();
        let mut again = merged.clone();
        crate::core::patch::strategic_merge(&mut again, &vm);
        apply(&w("a", CRD), Some(&merged), &vm, &mut again, false).unwrap();
        assert_eq!(
            again["spec"]["template"]["spec"]["volumes"],
            json!([{"name": "a"}])
        );
        assert_eq!(
            path_string(&[
                "f:spec".into(),
                "k:{\"name\":\"c\"}".into(),
                "f:image".into()
            ]),
            ".spec[name=\"c\"].image"
        );
    }

    #[test]
    fn an_update_owns_the_nodes_it_adds() {
        // kubernetes/website content/en/docs/tasks/extend-kubernetes/custom-resources/
        // custom-resource-definitions.md: a CronTab created by `kubectl apply` (client-side,
        // so an Update), as a real server lists it.
        let crontab = json!({"apiVersion": "stable.example.com/v1", "kind": "CronTab",
            "metadata": {"name": "my-new-cron-object", "namespace": "default",
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {"cronSpec": "* * * * */5", "image": "my-awesome-cron-image"}});
        let mut obj = crontab.clone();
        update(&w("kubectl-client-side-apply", CRD), None, &mut obj);
        assert_eq!(
            obj["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:metadata": {"f:annotations": {".": {},
                    "f:kubectl.kubernetes.io/last-applied-configuration": {}}},
                "f:spec": {".": {}, "f:cronSpec": {}, "f:image": {}}})
        );
        // A later Update that adds a nested object owns that node, not `spec` (which existed).
        let mut edited = obj.clone();
        edited["spec"]["schedule"] = json!({"zone": "UTC"});
        update(&w("editor", CRD), Some(&obj), &mut edited);
        assert_eq!(
            edited["metadata"]["managedFields"][1]["fieldsV1"],
            json!({"f:spec": {"f:schedule": {".": {}, "f:zone": {}}}})
        );
        // The same request through server-side apply owns leaves only (tofieldset.go).
        let mut applied = crontab.clone();
        apply(&w("kubectl", CRD), None, &crontab, &mut applied, false).unwrap();
        assert_eq!(
            applied["metadata"]["managedFields"][0]["fieldsV1"],
            json!({"f:metadata": {"f:annotations": {
                    "f:kubectl.kubernetes.io/last-applied-configuration": {}}},
                "f:spec": {"f:cronSpec": {}, "f:image": {}}})
        );
    }

    #[test]
    fn conflict_force_coownership_and_pruning() {
        let a = json!({"metadata": {"name": "x"}, "spec": {"foo": "1", "bar": "1"}});
        let mut obj = a.clone();
        apply(&w("a", CRD), None, &a, &mut obj, false).unwrap();
        // B sets foo to the same value: co-owned, no conflict.
        let b = json!({"metadata": {"name": "x"}, "spec": {"foo": "1"}});
        let mut merged = obj.clone();
        apply(&w("b", CRD), Some(&obj), &b, &mut merged, false).unwrap();
        let mf = merged["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(mf.len(), 2);
        assert_eq!(mf[1]["fieldsV1"], json!({"f:spec": {"f:foo": {}}}));
        let obj = merged;
        // B changes foo and bar: two conflicts with A.
        let b2 = json!({"metadata": {"name": "x"}, "spec": {"foo": "2", "bar": "2"}});
        let mut merged = obj.clone();
        crate::core::patch::strategic_merge(&mut merged, &b2);
        let err = apply(&w("b", CRD), Some(&obj), &b2, &mut merged.clone(), false).unwrap_err();
        assert_eq!(err.code, 409);
        assert_eq!(
            err.message,
            "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.bar\n- .spec.foo"
        );
        assert_eq!(
            err.details.unwrap()["causes"][0],
            json!({"type": "FieldManagerConflict", "message": "conflict with \"a\"", "field": ".spec.bar"})
        );
        // Forced: B takes both; A keeps nothing and its entry goes.
        apply(&w("b", CRD), Some(&obj), &b2, &mut merged, true).unwrap();
        let mf = merged["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(mf.len(), 1);
        assert_eq!(mf[0]["manager"], "b");
        // B stops applying bar: pruned, since nobody else owns it.
        let obj = merged;
        let b3 = json!({"metadata": {"name": "x"}, "spec": {"foo": "2"}});
        let mut merged = obj.clone();
        crate::core::patch::strategic_merge(&mut merged, &b3);
        apply(&w("b", CRD), Some(&obj), &b3, &mut merged, false).unwrap();
        assert_eq!(merged["spec"], json!({"foo": "2"}));
    }

    #[test]
    fn update_takes_fields_and_prints_like_the_server() {
        let a = json!({"metadata": {"name": "x"}, "spec": {"foo": "1"}});
        let mut obj = a.clone();
        apply(&w("a", CRD), None, &a, &mut obj, false).unwrap();
        let mut edited = obj.clone();
        edited["spec"]["foo"] = json!("9");
        edited["spec"]["new"] = json!(true);
        update(&w("kubectl-edit", CRD), Some(&obj), &mut edited);
        let mf = edited["metadata"]["managedFields"].as_array().unwrap();
        // A lost foo (its only field), so only the Update entry remains.
        assert_eq!(mf.len(), 1);
        assert_eq!(mf[0]["operation"], "Update");
        assert_eq!(
            mf[0]["fieldsV1"],
            json!({"f:spec": {"f:foo": {}, "f:new": {}}})
        );
        // Re-applying A's value now conflicts with the Update manager, printed with its
        // apiVersion and time.
        let mut merged = edited.clone();
        crate::core::patch::strategic_merge(&mut merged, &a);
        let err = apply(&w("a", CRD), Some(&edited), &a, &mut merged, false).unwrap_err();
        let time = mf[0]["time"].as_str().unwrap();
        assert_eq!(
            err.message,
            format!(
                "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using v1 at {time}: .spec.foo"
            )
        );
        assert_eq!(
            manager_or_user_agent(None, "kubectl/v1.36.0 (linux/amd64)"),
            "kubectl"
        );
        assert_eq!(manager_or_user_agent(Some("x"), "kubectl/v1"), "x");
    }
}
