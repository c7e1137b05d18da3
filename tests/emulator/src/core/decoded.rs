//! Objects as decoded from storage, kept per resourceVersion, as kube-apiserver's watch cache
//! keeps them: the cacher decodes an object once when its event arrives from etcd (the custom
//! resource codec prunes and defaults it then, `structural.rs`), and lists and gets served from
//! the cache reuse that decoded object instead of decoding every item on every request
//! (k8s.io/apiserver `pkg/storage/cacher`, watchCache's store of decoded objects). A change of
//! the object (a new resourceVersion) or of its kind's schema (the real server rebuilds a
//! custom resource's storage and cache when its CRD changes) decodes it again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::core::store::Key;

#[derive(Debug)]
struct Entry {
    resource_version: String,
    schema: usize,
    object: Arc<Value>,
}

/// Decoded objects by key and API version.
#[derive(Debug, Default)]
pub struct DecodedCache {
    entries: Mutex<HashMap<(Key, String), Entry>>,
}

/// How many entries may be kept before stale ones (deleted or long-changed objects) are
/// dropped: far above any fixture, so a steady list never re-decodes.
const CAPACITY: usize = 50_000;

impl DecodedCache {
    /// `stored` as served at `version`: the cached decoding when the object's resourceVersion
    /// and the schema (`schema`, compared by identity) are those it was decoded with,
    /// otherwise `decode` of a copy, remembered.
    pub fn get(
        &self,
        key: &Key,
        version: &str,
        schema: Option<&Arc<Value>>,
        stored: &Value,
        decode: impl FnOnce(&mut Value),
    ) -> Arc<Value> {
        let rv = stored
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or("");
        let schema_id = schema.map_or(0, |s| Arc::as_ptr(s) as usize);
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let cache_key = (key.clone(), version.to_string());
        if let Some(entry) = entries.get(&cache_key)
            && entry.resource_version == rv
            && entry.schema == schema_id
            && !rv.is_empty()
        {
            return entry.object.clone();
        }
        let mut object = stored.clone();
        decode(&mut object);
        let object = Arc::new(object);
        if entries.len() >= CAPACITY {
            entries.clear();
        }
        entries.insert(
            cache_key,
            Entry {
                resource_version: rv.to_string(),
                schema: schema_id,
                object: object.clone(),
            },
        );
        object
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::cell::Cell;

    fn obj(rv: &str, x: i64) -> Value {
        json!({"metadata": {"name": "a", "namespace": "n", "resourceVersion": rv}, "spec": {"x": x}})
    }

    #[test]
    fn decodes_once_per_resource_version_and_schema() {
        let cache = DecodedCache::default();
        let key = Key::new("g", "things", "n", "a");
        let schema = Arc::new(json!({"type": "object"}));
        let decodes = Cell::new(0);
        let decode = |o: &mut Value| {
            decodes.set(decodes.get() + 1);
            o["decoded"] = json!(true);
        };
        let first = cache.get(&key, "v1", Some(&schema), &obj("5", 1), decode);
        assert_eq!(first["decoded"], true);
        let again = cache.get(&key, "v1", Some(&schema), &obj("5", 1), decode);
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(decodes.get(), 1);
        // A new resourceVersion is a new object.
        let changed = cache.get(&key, "v1", Some(&schema), &obj("6", 2), decode);
        assert_eq!(changed["spec"]["x"], 2);
        assert_eq!(decodes.get(), 2);
        // Another served version, or a replaced schema, decodes again.
        cache.get(&key, "v1beta1", Some(&schema), &obj("6", 2), decode);
        assert_eq!(decodes.get(), 3);
        let schema2 = Arc::new(json!({"type": "object"}));
        cache.get(&key, "v1", Some(&schema2), &obj("6", 2), decode);
        assert_eq!(decodes.get(), 4);
        // Objects without a resourceVersion (not from storage) are never taken from the cache.
        let bare = json!({"metadata": {"name": "a", "namespace": "n"}});
        cache.get(&key, "v1", None, &bare, decode);
        cache.get(&key, "v1", None, &bare, decode);
        assert_eq!(decodes.get(), 6);
    }
}
