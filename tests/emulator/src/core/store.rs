//! The object store: every object keyed by group, plural, namespace and name, one global
//! `resourceVersion` counter, an in-memory event log for watch replay, and a broadcast channel
//! for live watchers and controllers. Garbage collection of owned objects happens here, at
//! delete time (a real cluster does it asynchronously; tests prefer determinism).

use crate::core::util::{meta_mut, meta_str, new_uid, now_rfc3339};
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

/// How many events are kept for `watch?resourceVersion=N` replay before answering 410 Gone.
pub const EVENT_LOG_CAPACITY: usize = 10_000;

/// Identity of a stored object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// API group ("" for core).
    pub group: String,
    /// Plural resource name.
    pub plural: String,
    /// Namespace, "" for cluster-scoped objects.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl Key {
    /// Builds a key.
    pub fn new(group: &str, plural: &str, namespace: &str, name: &str) -> Self {
        Key {
            group: group.into(),
            plural: plural.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The key of `obj` stored as `group`/`plural`.
    pub fn of(group: &str, plural: &str, obj: &Value) -> Self {
        Key::new(
            group,
            plural,
            meta_str(obj, "namespace"),
            meta_str(obj, "name"),
        )
    }
}

/// The objects of one kind (optionally in one namespace): keys sort by group, plural,
/// namespace, name, so they are one contiguous range of the map and nothing else is visited.
fn of_kind<'a>(
    objects: &'a BTreeMap<Key, Value>,
    group: &'a str,
    plural: &'a str,
    namespace: Option<&'a str>,
) -> impl Iterator<Item = &'a Value> + 'a {
    let start = Key::new(group, plural, namespace.unwrap_or(""), "");
    objects
        .range(start..)
        .take_while(move |(k, _)| {
            k.group == group && k.plural == plural && namespace.is_none_or(|ns| k.namespace == ns)
        })
        .map(|(_, v)| v)
}

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object deleted (the object carries the deletion's resourceVersion).
    Deleted,
}

impl EventType {
    /// `ADDED`, `MODIFIED`, `DELETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as logged and broadcast.
#[derive(Debug, Clone)]
pub struct Event {
    /// What happened.
    pub kind: EventType,
    /// Which object.
    pub key: Key,
    /// The object after the change (before it, for deletions).
    pub object: Value,
    /// The object before a modification (lets watchers with selectors see objects leave).
    pub old: Option<Value>,
    /// The resourceVersion of this change.
    pub rv: u64,
}

/// Why a store operation failed; `handlers/` turns these into `Status` errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// No such object.
    NotFound,
    /// The name is taken.
    AlreadyExists,
    /// `resourceVersion` precondition failed.
    Conflict,
}

/// What happens to dependents (objects whose `ownerReferences` name the deleted object).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Delete dependents too (`Background`; immediate here).
    Cascade,
    /// Keep dependents and drop their owner reference.
    Orphan,
    /// `Foreground`: the handler marks the object and `gc.rs` deletes dependents first; a
    /// store-level delete with it cascades like `Cascade`.
    Foreground,
}

struct Inner {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    log: VecDeque<Arc<Event>>,
    /// Events with rv <= compacted are no longer in the log.
    compacted: u64,
}

/// The in-memory object store.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Event>>,
    /// Tells open watches to end (after [`Store::compact`]).
    pub watches_end: tokio::sync::watch::Sender<u64>,
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

fn rv_of(obj: &Value) -> Option<u64> {
    meta_str(obj, "resourceVersion").parse().ok()
}

/// Whether an object's kind keeps `metadata.generation` (see `strategy::tracks_generation`).
fn has_generation(obj: &Value) -> bool {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    !(api_version == "v1" && matches!(kind, "Secret" | "ConfigMap" | "Namespace"))
}

/// Everything but metadata and status: a change here bumps `metadata.generation`.
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

impl Store {
    /// An empty store (resourceVersion starts at 1000, to look like a real cluster's).
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(4096);
        Store {
            inner: Mutex::new(Inner {
                objects: BTreeMap::new(),
                rv: 1000,
                log: VecDeque::new(),
                compacted: 1000,
            }),
            tx,
            watches_end: tokio::sync::watch::channel(0).0,
        }
    }

    /// The oldest resourceVersion still served (older ones are Gone).
    pub fn compacted(&self) -> u64 {
        self.lock().compacted
    }

    /// Compacts everything up to the current resourceVersion and ends open watches.
    pub fn compact(&self) {
        {
            let mut inner = self.lock();
            // The current revision stays valid (etcd keeps the compaction revision itself).
            inner.compacted = inner.rv;
            inner.log.clear();
        }
        self.watches_end.send_modify(|n| *n += 1);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Subscribes to future events (controllers).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// One object.
    pub fn get(&self, key: &Key) -> Option<Value> {
        self.lock().objects.get(key).cloned()
    }

    /// Objects of a kind, optionally in one namespace, plus the store's resourceVersion.
    pub fn list(&self, group: &str, plural: &str, namespace: Option<&str>) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = of_kind(&inner.objects, group, plural, namespace)
            .cloned()
            .collect();
        (items, inner.rv)
    }

    /// Runs `f` on the objects of a kind (optionally in one namespace) without copying them,
    /// with the store's resourceVersion and oldest servable one (lists copy only their page,
    /// as the API server serves lists from its watch cache).
    pub fn with_kind<R>(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        f: impl FnOnce(Vec<&Value>, u64, u64) -> R,
    ) -> R {
        let inner = self.lock();
        let items = of_kind(&inner.objects, group, plural, namespace).collect();
        f(items, inner.rv, inner.compacted)
    }

    /// All objects (for garbage collection and tests).
    pub fn all(&self) -> Vec<(Key, Value)> {
        self.lock()
            .objects
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn emit(
        inner: &mut Inner,
        tx: &broadcast::Sender<Arc<Event>>,
        kind: EventType,
        key: Key,
        object: Value,
        old: Option<Value>,
    ) {
        let ev = Arc::new(Event {
            kind,
            key,
            object,
            old,
            rv: inner.rv,
        });
        inner.log.push_back(ev.clone());
        while inner.log.len() > EVENT_LOG_CAPACITY {
            if let Some(dropped) = inner.log.pop_front() {
                inner.compacted = dropped.rv;
            }
        }
        // Nobody listening is fine.
        let _ = tx.send(ev);
    }

    fn bump(inner: &mut Inner, obj: &mut Value) {
        inner.rv += 1;
        meta_mut(obj).insert("resourceVersion".into(), json!(inner.rv.to_string()));
    }

    /// Stores `obj` at `key` with the next resourceVersion and sends its event: `Added`
    /// without an `old` object, `Modified` with one. Returns the stored object.
    fn put_locked(
        inner: &mut Inner,
        tx: &broadcast::Sender<Arc<Event>>,
        key: Key,
        mut obj: Value,
        old: Option<Value>,
    ) -> Value {
        Self::bump(inner, &mut obj);
        inner.objects.insert(key.clone(), obj.clone());
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        Self::emit(inner, tx, kind, key, obj.clone(), old);
        obj
    }

    /// Fills the server-owned metadata of a new object.
    fn init_meta(obj: &mut Value) {
        let generation = has_generation(obj);
        let meta = meta_mut(obj);
        if meta
            .get("uid")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            meta.insert("uid".into(), json!(new_uid()));
        }
        if meta
            .get("creationTimestamp")
            .and_then(Value::as_str)
            .is_none()
        {
            meta.insert("creationTimestamp".into(), json!(now_rfc3339()));
        }
        if generation && meta.get("generation").and_then(Value::as_i64).is_none() {
            meta.insert("generation".into(), json!(1));
        }
    }

    /// Prepares a new object without storing it (dry run): uid, timestamps, generation.
    pub fn prepare_new(&self, mut obj: Value) -> Value {
        Self::init_meta(&mut obj);
        obj
    }

    /// Creates an object; fails if the key is taken.
    pub fn create(&self, group: &str, plural: &str, mut obj: Value) -> Result<Value, StoreError> {
        let key = Key::of(group, plural, &obj);
        let mut inner = self.lock();
        if inner.objects.contains_key(&key) {
            return Err(StoreError::AlreadyExists);
        }
        Self::init_meta(&mut obj);
        Ok(Self::put_locked(&mut inner, &self.tx, key, obj, None))
    }

    /// Replaces an existing object. `expected_rv` is the client's precondition; uid and
    /// creationTimestamp are kept; generation grows when anything outside metadata/status
    /// changed.
    pub fn update(
        &self,
        group: &str,
        plural: &str,
        mut obj: Value,
        expected_rv: Option<u64>,
    ) -> Result<Value, StoreError> {
        let key = Key::of(group, plural, &obj);
        let mut inner = self.lock();
        let old = inner
            .objects
            .get(&key)
            .cloned()
            .ok_or(StoreError::NotFound)?;
        if expected_rv.is_some_and(|rv| Some(rv) != rv_of(&old)) {
            return Err(StoreError::Conflict);
        }
        Self::carry_meta(&old, &mut obj);
        if old == obj {
            // A no-op write does not bump resourceVersion (like etcd3's GuaranteedUpdate).
            return Ok(old);
        }
        Ok(Self::put_locked(&mut inner, &self.tx, key, obj, Some(old)))
    }

    /// Copies server-owned metadata from `old` and computes generation.
    fn carry_meta(old: &Value, obj: &mut Value) {
        let old_copy = json!({"apiVersion": old.get("apiVersion"), "kind": old.get("kind")});
        let old_gen = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let generation = if spec_part(old) != spec_part(obj) {
            old_gen + 1
        } else {
            old_gen
        };
        let meta = meta_mut(obj);
        for f in ["uid", "creationTimestamp", "deletionTimestamp"] {
            match old.get("metadata").and_then(|m| m.get(f)) {
                Some(v) => meta.insert(f.into(), v.clone()),
                None => meta.remove(f),
            };
        }
        if has_generation(&old_copy) {
            meta.insert("generation".into(), json!(generation));
        } else {
            meta.remove("generation");
        }
        meta.insert(
            "resourceVersion".into(),
            old.pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(Value::Null),
        );
    }

    /// Creates or replaces an object with no checks (fixtures, tests' `put_object`); keeps the
    /// given metadata where present.
    pub fn upsert(&self, group: &str, plural: &str, mut obj: Value) -> Value {
        let key = Key::of(group, plural, &obj);
        let mut inner = self.lock();
        let old = inner.objects.get(&key).cloned();
        if let Some(old) = &old {
            let meta = meta_mut(&mut obj);
            for f in ["uid", "creationTimestamp"] {
                if !meta.contains_key(f)
                    && let Some(v) = old.get("metadata").and_then(|m| m.get(f))
                {
                    meta.insert(f.into(), v.clone());
                }
            }
        }
        Self::init_meta(&mut obj);
        Self::put_locked(&mut inner, &self.tx, key, obj, old)
    }

    /// Read-modify-write for controllers: `f` edits the object; nothing is written (and no
    /// event sent) if it did not change. Returns the stored object.
    pub fn modify(&self, key: &Key, f: impl FnOnce(&mut Value)) -> Option<Value> {
        let mut inner = self.lock();
        let old = inner.objects.get(key).cloned()?;
        let mut obj = old.clone();
        f(&mut obj);
        if obj == old {
            return Some(old);
        }
        Self::carry_meta(&old, &mut obj);
        Some(Self::put_locked(
            &mut inner,
            &self.tx,
            key.clone(),
            obj,
            Some(old),
        ))
    }

    /// Sets `deletionTimestamp` (server-owned, so `modify` cannot) and adds `finalizer`:
    /// the object is being deleted but stays until the finalizer goes. Returns it.
    pub fn mark_deleting(&self, key: &Key, finalizer: &str) -> Option<Value> {
        let mut inner = self.lock();
        let old = inner.objects.get(key).cloned()?;
        let mut obj = old.clone();
        let meta = meta_mut(&mut obj);
        if meta.get("deletionTimestamp").is_none_or(Value::is_null) {
            meta.insert("deletionTimestamp".into(), json!(now_rfc3339()));
            meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        let finalizers = meta.entry("finalizers").or_insert_with(|| json!([]));
        if let Some(list) = finalizers.as_array_mut()
            && !list.iter().any(|f| f == finalizer)
        {
            list.push(json!(finalizer));
        }
        if obj == old {
            return Some(old);
        }
        Some(Self::put_locked(
            &mut inner,
            &self.tx,
            key.clone(),
            obj,
            Some(old),
        ))
    }

    /// Deletes an object and, depending on `propagation`, its dependents (recursively); a
    /// namespace takes its contents with it. Returns the deleted object.
    pub fn delete(&self, key: &Key, propagation: Propagation) -> Option<Value> {
        let mut inner = self.lock();
        let deleted = Self::delete_locked(&mut inner, &self.tx, key)?;
        let mut queue = vec![(key.clone(), deleted.clone())];
        while let Some((k, obj)) = queue.pop() {
            let uid = meta_str(&obj, "uid").to_string();
            let dependents: Vec<Key> = inner
                .objects
                .iter()
                .filter(|(dk, dv)| {
                    (k.group.is_empty() && k.plural == "namespaces" && dk.namespace == k.name)
                        || owner_uids(dv).any(|u| u == uid)
                })
                .map(|(dk, _)| dk.clone())
                .collect();
            for dk in dependents {
                let in_deleted_ns = k.group.is_empty() && k.plural == "namespaces";
                if propagation == Propagation::Orphan && !in_deleted_ns {
                    let old = inner.objects.get(&dk).cloned().expect("dependent");
                    let mut obj = old.clone();
                    if let Some(refs) = obj
                        .pointer_mut("/metadata/ownerReferences")
                        .and_then(Value::as_array_mut)
                    {
                        refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()));
                    }
                    // ObjectMeta round-trips through Go's typed struct (omitempty): an empty
                    // list is not stored (apiextensions-apiserver schemaobjectmeta.Coerce).
                    if obj
                        .pointer("/metadata/ownerReferences")
                        .and_then(Value::as_array)
                        .is_some_and(Vec::is_empty)
                    {
                        meta_mut(&mut obj).remove("ownerReferences");
                    }
                    Self::put_locked(&mut inner, &self.tx, dk, obj, Some(old));
                } else if let Some(d) = Self::delete_locked(&mut inner, &self.tx, &dk) {
                    queue.push((dk, d));
                }
            }
        }
        Some(deleted)
    }

    fn delete_locked(
        inner: &mut Inner,
        tx: &broadcast::Sender<Arc<Event>>,
        key: &Key,
    ) -> Option<Value> {
        let mut obj = inner.objects.remove(key)?;
        Self::bump(inner, &mut obj);
        Self::emit(
            inner,
            tx,
            EventType::Deleted,
            key.clone(),
            obj.clone(),
            None,
        );
        Some(obj)
    }

    /// Events after `rv` from the log plus a receiver for later ones, taken atomically so no
    /// event is missed or duplicated. `Err(compacted)` if `rv` is older than the log.
    #[allow(clippy::type_complexity)]
    pub fn watch_from(
        &self,
        rv: u64,
    ) -> Result<(Vec<Arc<Event>>, broadcast::Receiver<Arc<Event>>), u64> {
        let inner = self.lock();
        if rv < inner.compacted {
            return Err(inner.compacted);
        }
        let rx = self.tx.subscribe();
        let replay = inner.log.iter().filter(|e| e.rv > rv).cloned().collect();
        Ok((replay, rx))
    }

    /// A snapshot of a kind plus a receiver for later events, taken atomically (a watch without
    /// resourceVersion first sends the snapshot as ADDED events).
    #[allow(clippy::type_complexity)]
    pub fn snapshot_and_subscribe(
        &self,
        group: &str,
        plural: &str,
    ) -> (Vec<Value>, u64, broadcast::Receiver<Arc<Event>>) {
        let inner = self.lock();
        let rx = self.tx.subscribe();
        let items = inner
            .objects
            .iter()
            .filter(|(k, _)| k.group == group && k.plural == plural)
            .map(|(_, v)| v.clone())
            .collect();
        (items, inner.rv, rx)
    }
}

fn owner_uids(obj: &Value) -> impl Iterator<Item = &str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(name: &str) -> Value {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": name, "namespace": "default"}, "spec": {"running": false}})
    }

    #[test]
    fn lists_take_exactly_one_kind_and_namespace() {
        let s = Store::new();
        let put = |group: &str, plural: &str, ns: &str, name: &str| {
            let obj = json!({"metadata": {"name": name, "namespace": ns}});
            s.create(group, plural, obj).unwrap();
        };
        // Neighbours in key order on every side: a shorter and a longer plural, a group with
        // the same prefix, namespaces before, between and after.
        put("kubevirt.io", "virtualmachines", "a", "x");
        put("kubevirt.io", "virtualmachines", "a-b", "y");
        put("kubevirt.io", "virtualmachines", "b", "z");
        put("kubevirt.io", "virtualmachine", "a", "shorter");
        put("kubevirt.io", "virtualmachinesx", "a", "longer");
        put("kubevirt.io", "virtualmachineinstances", "a", "x");
        put("kubevirt.iox", "virtualmachines", "a", "group");
        put("", "virtualmachines", "a", "core");
        let names = |ns: Option<&str>| {
            let mut names: Vec<String> = s
                .list("kubevirt.io", "virtualmachines", ns)
                .0
                .iter()
                .map(|o| meta_str(o, "name").to_string())
                .collect();
            names.sort();
            names
        };
        assert_eq!(names(None), ["x", "y", "z"]);
        assert_eq!(names(Some("a")), ["x"]);
        assert_eq!(names(Some("a-b")), ["y"]);
        assert!(names(Some("c")).is_empty());
        let seen = s.with_kind(
            "kubevirt.io",
            "virtualmachineinstances",
            None,
            |items, _, _| items.len(),
        );
        assert_eq!(seen, 1);
    }

    #[test]
    fn create_update_conflict() {
        let s = Store::new();
        let a = s
            .create("kubevirt.io", "virtualmachines", vm("web"))
            .unwrap();
        assert_eq!(
            s.create("kubevirt.io", "virtualmachines", vm("web")),
            Err(StoreError::AlreadyExists)
        );
        let rv: u64 = meta_str(&a, "resourceVersion").parse().unwrap();
        let mut b = a.clone();
        b["spec"]["running"] = json!(true);
        let b2 = s
            .update("kubevirt.io", "virtualmachines", b.clone(), Some(rv))
            .unwrap();
        assert_eq!(b2["metadata"]["generation"], 2);
        assert_eq!(b2["metadata"]["uid"], a["metadata"]["uid"]);
        // The same precondition again is now stale.
        assert_eq!(
            s.update("kubevirt.io", "virtualmachines", b, Some(rv)),
            Err(StoreError::Conflict)
        );
    }

    #[test]
    fn watch_replay_and_gc() {
        let s = Store::new();
        let start = s.current_rv();
        let owner = s
            .create("kubevirt.io", "virtualmachines", vm("web"))
            .unwrap();
        let mut child = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "web", "namespace": "default",
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": "web", "uid": owner["metadata"]["uid"], "controller": true}]}});
        child = s
            .create("kubevirt.io", "virtualmachineinstances", child)
            .unwrap();
        let mid: u64 = meta_str(&child, "resourceVersion").parse().unwrap();
        s.delete(
            &Key::of("kubevirt.io", "virtualmachines", &owner),
            Propagation::Cascade,
        )
        .unwrap();
        assert!(
            s.get(&Key::of("kubevirt.io", "virtualmachineinstances", &child))
                .is_none()
        );
        let (replay, _) = s.watch_from(start).unwrap();
        let kinds: Vec<_> = replay
            .iter()
            .map(|e| (e.kind, e.key.plural.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                (EventType::Added, "virtualmachines"),
                (EventType::Added, "virtualmachineinstances"),
                (EventType::Deleted, "virtualmachines"),
                (EventType::Deleted, "virtualmachineinstances")
            ]
        );
        let (replay, _) = s.watch_from(mid).unwrap();
        assert_eq!(replay.len(), 2);
        assert!(s.watch_from(1).is_err(), "older than the log is Gone");
    }
}
