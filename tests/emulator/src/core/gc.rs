//! Foreground cascading deletion, which takes time on a real cluster: the API server sets
//! `metadata.deletionTimestamp` and the finalizer `foregroundDeletion` and answers 200 with the
//! object (k8s.io/apiserver/pkg/registry/generic/registry/store.go `updateForGracefulDeletionAndFinalizers`,
//! `shouldDeleteDependents`); the garbage collector deletes the dependents, then removes the
//! finalizer and the object goes (pkg/controller/garbagecollector `processDeletingDependentsItem`).
//! Here the collector runs one controller step (`import_step`) later.

use crate::core::app::App;
use crate::core::store::{Key, Propagation};
use crate::core::util::meta_str;
use serde_json::Value;
use std::sync::Arc;

/// The finalizer of an object whose dependents are being deleted first.
pub const FOREGROUND: &str = "foregroundDeletion";

/// Marks `key` for foreground deletion and schedules the collector; returns the marked object.
pub fn delete_foreground(app: &Arc<App>, key: &Key) -> Option<Value> {
    let marked = app.store.mark_deleting(key, FOREGROUND)?;
    let app = app.clone();
    let key = key.clone();
    let uid = meta_str(&marked, "uid").to_string();
    tokio::spawn(async move {
        tokio::time::sleep(app.import_step).await;
        // Dependents first (each with its own dependents), then the owner.
        let dependents: Vec<Key> = app
            .store
            .all()
            .into_iter()
            .filter(|(_, o)| {
                o.pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid.as_str()))
            })
            .map(|(k, _)| k)
            .collect();
        for dependent in dependents {
            app.store.delete(&dependent, Propagation::Cascade);
        }
        tokio::time::sleep(app.import_step).await;
        if app
            .store
            .get(&key)
            .is_some_and(|o| meta_str(&o, "uid") == uid)
        {
            app.store.delete(&key, Propagation::Cascade);
        }
    });
    Some(marked)
}

/// Creates `obj` (in `group`/`plural`) as a dependent of `owner` (stored under `owner_key`),
/// unless its owner is gone. A reconciler may act on an owner it read just before the owner was
/// deleted: the garbage collector deletes a dependent whose owners are all absent
/// (k8s.io/kubernetes pkg/controller/garbagecollector/garbagecollector.go `attemptToDeleteItem`),
/// so an object created after its owner went is removed again at once. Returns whether the
/// object exists afterwards.
pub fn create_dependent(
    app: &App,
    owner_key: &Key,
    owner: &Value,
    group: &str,
    plural: &str,
    obj: Value,
) -> bool {
    let key = Key::of(group, plural, &obj);
    create_dependent_object(app, owner_key, owner, group, plural, obj).is_some()
        || (app
            .store
            .get(owner_key)
            .is_some_and(|o| meta_str(&o, "uid") == meta_str(owner, "uid"))
            && app.store.get(&key).is_some())
}

/// [`create_dependent`] that returns the object as stored (`None` when it was not created or
/// was removed again because its owner went).
pub fn create_dependent_object(
    app: &App,
    owner_key: &Key,
    owner: &Value,
    group: &str,
    plural: &str,
    obj: Value,
) -> Option<Value> {
    let uid = meta_str(owner, "uid");
    let owner_alive = || {
        app.store
            .get(owner_key)
            .is_some_and(|o| meta_str(&o, "uid") == uid)
    };
    if !owner_alive() {
        return None;
    }
    let key = Key::of(group, plural, &obj);
    let created = app.store.create(group, plural, obj).ok()?;
    if !owner_alive() {
        app.store.delete(&key, Propagation::Cascade);
        return None;
    }
    Some(created)
}
