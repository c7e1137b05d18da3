//! Watching a few named objects until a condition on them holds: one list per object (for a
//! consistent starting point), then watches from there; `check` sees the latest version of
//! every object (None while it does not exist) after each change.

use futures::StreamExt;
use kube::api::{ListParams, WatchEvent, WatchParams};
use serde_json::Value;

use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::Result;
use crate::vm::restartable_watch;

/// An object to watch.
#[derive(Debug, Clone)]
pub(crate) struct Watched {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl Watched {
    pub fn new(kind: Kind, namespace: &str, name: &str) -> Self {
        Watched {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// Watch `objects` until `check` returns `Some`. When the server says the resource version is
/// gone (410 Expired, as an ERROR event or as the answer to a watch, after an etcd
/// compaction), every object is listed again and watching goes on from there, as `list -w`
/// (`vm/watch.rs`) and kubectl's reflector do.
pub(crate) async fn until<T>(
    cluster: &Cluster,
    objects: &[Watched],
    mut check: impl FnMut(&[Option<Value>]) -> Option<Result<T>>,
) -> Result<T> {
    loop {
        let mut state: Vec<Option<Value>> = Vec::with_capacity(objects.len());
        let mut feeds = Vec::with_capacity(objects.len());
        for (i, w) in objects.iter().enumerate() {
            let api = w.kind.api(&cluster.client, Some(&w.namespace));
            let field = format!("metadata.name={}", w.name);
            let list = api
                .list(&ListParams::default().fields(&field))
                .await
                .map_err(|e| cluster.error(e, &w.kind.action("list", Some(&w.namespace))))?;
            state.push(
                list.items
                    .into_iter()
                    .next()
                    .map(|o| serde_json::to_value(o).unwrap_or_default()),
            );
            let rv = list.metadata.resource_version.unwrap_or_default();
            let params = WatchParams::default().fields(&field).timeout(290);
            feeds.push(
                restartable_watch(api, params, rv)
                    .map(move |e| (i, e))
                    .boxed(),
            );
        }
        if let Some(done) = check(&state) {
            return done;
        }
        let mut feeds = futures::stream::select_all(feeds);
        // Until the resource version is gone (then list again) or `check` is done.
        loop {
            let Some((i, event)) = feeds.next().await else {
                return Err(crate::Error::Internal(
                    "the watch ended unexpectedly".into(),
                ));
            };
            let w = &objects[i];
            let event = match event {
                Ok(event) => event,
                Err(kube::Error::Api(s)) if s.code == 410 => break,
                Err(e) => return Err(cluster.error(e, &w.kind.action("watch", Some(&w.namespace)))),
            };
            match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                    state[i] = Some(serde_json::to_value(o).unwrap_or_default());
                }
                WatchEvent::Deleted(_) => state[i] = None,
                WatchEvent::Bookmark(_) => continue,
                // k8s.io/apiserver answers a watch from a compacted resource version with an
                // ERROR event carrying a 410 Expired Status.
                WatchEvent::Error(status) if status.code == 410 => break,
                WatchEvent::Error(status) => {
                    return Err(crate::Error::from_status(
                        status.code,
                        &status.reason,
                        &status.message,
                        &w.kind.action("watch", Some(&w.namespace)),
                        &cluster.server,
                    ));
                }
            }
            if let Some(done) = check(&state) {
                return done;
            }
        }
    }
}
