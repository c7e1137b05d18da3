//! `?watch=true`: a chunked stream of newline-delimited `{"type": …, "object": …}` events.
//!
//! Without `resourceVersion` (or with "0") the current objects come first as ADDED; with one,
//! events after it are replayed from the store's log (an ERROR event with a 410 `Expired` Status
//! if it is older than the log, as the real watch cache answers). Label/field selectors apply to
//! each event, and an object that stops (starts) matching is sent as DELETED (ADDED).

use crate::core::app::App;
use crate::core::registry::ResourceDef;
use crate::core::selector::{FieldSelector, LabelSelector};
use crate::core::status::ApiError;
use crate::core::store::{Event, EventType};
use crate::core::table::{self, IncludeObject};
use axum::body::{Body, Bytes};
use axum::response::Response;
use http::{StatusCode, header};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::time::{Instant, Interval};

/// Default watch duration when the client sets no `timeoutSeconds` (the real server picks
/// 30–60 minutes).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);
/// How often BOOKMARK events are sent when the client allows them.
const BOOKMARK_EVERY: Duration = Duration::from_secs(5);

/// What a watcher wants to see and how to render it.
struct Filter {
    def: Arc<ResourceDef>,
    version: String,
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
    table: bool,
    include: IncludeObject,
}

impl Filter {
    fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    fn concerns(&self, ev: &Event) -> bool {
        ev.key.group == self.def.group
            && ev.key.plural == self.def.plural
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| ev.key.namespace == ns)
    }

    fn render(&self, kind: &str, obj: &Value) -> Bytes {
        let mut obj = obj.clone();
        // Objects are decoded from storage: pruned and defaulted (structural.rs).
        if kind != "BOOKMARK"
            && let Some(schema) = self.def.schema.for_version(&self.version)
        {
            crate::core::structural::on_read(&schema, &mut obj);
        }
        obj["apiVersion"] = json!(self.def.api_version(&self.version));
        obj["kind"] = json!(self.def.kind);
        if self.table && kind != "BOOKMARK" {
            obj = table::table(&self.def, &[obj], None, self.include);
        }
        // Not `json!`, which would deep-copy the object once more.
        let mut event = serde_json::Map::new();
        event.insert("type".into(), kind.into());
        event.insert("object".into(), obj);
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }

    /// The event a watcher sees for a store change, honouring selectors.
    fn translate(&self, ev: &Event) -> Option<Bytes> {
        if !self.concerns(ev) {
            return None;
        }
        let now = self.matches(&ev.object);
        let kind = match ev.kind {
            EventType::Added if now => "ADDED",
            EventType::Deleted if now => "DELETED",
            EventType::Modified => {
                let before = ev.old.as_ref().is_none_or(|o| self.matches(o));
                match (before, now) {
                    (true, true) => "MODIFIED",
                    (false, true) => "ADDED",
                    (true, false) => "DELETED",
                    (false, false) => return None,
                }
            }
            _ => return None,
        };
        Some(self.render(kind, &ev.object))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        self.render("BOOKMARK", &json!({"metadata": meta}))
    }
}

struct WatchState {
    pending: VecDeque<Bytes>,
    rx: broadcast::Receiver<Arc<Event>>,
    filter: Filter,
    deadline: Instant,
    bookmarks: Option<Interval>,
    last_rv: u64,
    done: bool,
    /// Changes when the store is compacted (`Store::compact`): the watch ends.
    end: tokio::sync::watch::Receiver<u64>,
}

/// Starts a watch on `def` (optionally in one namespace).
pub fn serve(
    app: &Arc<App>,
    def: &Arc<ResourceDef>,
    version: &str,
    namespace: Option<&str>,
    q: &crate::core::handlers::Query,
    table: bool,
) -> Result<Response, ApiError> {
    let filter = Filter {
        def: def.clone(),
        version: version.to_string(),
        namespace: namespace.map(String::from),
        labels: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fields: FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""))?,
        table,
        include: IncludeObject::parse(q.get("includeObject").map(String::as_str)),
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT);
    let allow_bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let send_initial = q.get("sendInitialEvents").is_some_and(|v| v == "true");
    let rv_param = q.get("resourceVersion").map(String::as_str).unwrap_or("");

    let mut pending = VecDeque::new();
    let (rx, last_rv) = if rv_param.is_empty() || rv_param == "0" || send_initial {
        let (items, rv, rx) = app.store.snapshot_and_subscribe(&def.group, &def.plural);
        for obj in items.iter().filter(|o| {
            namespace.is_none_or(|ns| crate::core::util::meta_str(o, "namespace") == ns)
                && filter.matches(o)
        }) {
            pending.push_back(filter.render("ADDED", obj));
        }
        if send_initial {
            pending.push_back(filter.bookmark(rv, true));
        }
        (rx, rv)
    } else {
        let rv: u64 = rv_param
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv_param:?}")))?;
        match app.store.watch_from(rv) {
            Ok((replay, rx)) => {
                pending.extend(replay.iter().filter_map(|e| filter.translate(e)));
                (rx, rv)
            }
            Err(oldest) => {
                let status = ApiError::gone(format!("too old resource version: {rv} ({oldest})"))
                    .to_status();
                let line = format!("{}\n", json!({"type": "ERROR", "object": status}));
                return Ok(stream_response(futures::stream::iter([Ok::<
                    _,
                    std::convert::Infallible,
                >(
                    Bytes::from(line),
                )])));
            }
        }
    };
    let state = WatchState {
        pending,
        rx,
        filter,
        deadline: Instant::now() + timeout,
        bookmarks: allow_bookmarks
            .then(|| tokio::time::interval_at(Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY)),
        last_rv,
        done: false,
        end: app.store.watches_end.subscribe(),
    };
    Ok(stream_response(futures::stream::unfold(state, next_chunk)))
}

fn stream_response<S>(s: S) -> Response
where
    S: futures::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send + 'static,
{
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(s))
        .expect("response")
}

enum Next {
    Timeout,
    Event(Result<Arc<Event>, broadcast::error::RecvError>),
    Bookmark,
}

async fn next_chunk(
    mut st: WatchState,
) -> Option<(Result<Bytes, std::convert::Infallible>, WatchState)> {
    loop {
        if let Some(b) = st.pending.pop_front() {
            return Some((Ok(b), st));
        }
        if st.done {
            return None;
        }
        let next = {
            let WatchState {
                rx,
                bookmarks,
                deadline,
                end,
                ..
            } = &mut st;
            let deadline = *deadline;
            let tick = async {
                match bookmarks.as_mut() {
                    Some(i) => {
                        i.tick().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => Next::Timeout,
                _ = end.changed() => Next::Timeout,
                ev = rx.recv() => Next::Event(ev),
                _ = tick => Next::Bookmark,
            }
        };
        match next {
            Next::Timeout | Next::Event(Err(broadcast::error::RecvError::Closed)) => return None,
            Next::Event(Ok(ev)) => {
                st.last_rv = st.last_rv.max(ev.rv);
                if let Some(line) = st.filter.translate(&ev) {
                    st.pending.push_back(line);
                }
            }
            Next::Event(Err(broadcast::error::RecvError::Lagged(_))) => {
                // Too slow a reader: end the watch the way the server does, so it re-lists.
                let status =
                    ApiError::gone("too old resource version: the watch fell behind").to_status();
                st.pending.push_back(Bytes::from(format!(
                    "{}\n",
                    json!({"type": "ERROR", "object": status})
                )));
                st.done = true;
            }
            Next::Bookmark => {
                let b = st.filter.bookmark(st.last_rv, false);
                st.pending.push_back(b);
            }
        }
    }
}
