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

/// Watch `objects` until `check` returns `Some`.
pub(crate) async fn until<T>(
    cluster: &Cluster,
    objects: &[Watched],
    mut check: impl FnMut(&[Option<Value>]) -> Option<Result<T>>,
) -> Result<T> {
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
    while let Some((i, event)) = feeds.next().await {
        let w = &objects[i];
        let event =
            event.map_err(|e| cluster.error(e, &w.kind.action("watch", Some(&w.namespace))))?;
        match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                state[i] = Some(serde_json::to_value(o).unwrap_or_default());
            }
            WatchEvent::Deleted(_) => state[i] = None,
            WatchEvent::Bookmark(_) | WatchEvent::Error(_) => continue,
        }
        if let Some(done) = check(&state) {
            return done;
        }
    }
    Err(crate::Error::Internal(
        "the watch ended unexpectedly".into(),
    ))
}
