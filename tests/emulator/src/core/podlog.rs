//! `GET pods/NAME/log`: container logs as the kubelet serves them through the API server.
//!
//! Where the text comes from (fixture annotations on the pod):
//! - `emulator.kubevm.io/log.<container>`: the current log of that container;
//! - `emulator.kubevm.io/previous-log.<container>`: the log of its previous (terminated) instance;
//! - `emulator.kubevm.io/log`: the current log of the pod's first container (older fixtures);
//! - `emulator.kubevm.io/log-lines.<container>`: `N` makes a synthetic log of N numbered lines
//!   (benchmarks: no megabytes of YAML in a fixture).
//!
//! Lines may start with an RFC 3339 timestamp and a space, as the kubelet stores them;
//! `sinceSeconds`/`sinceTime` filter on it and `timestamps=true` keeps it in the answer.
//!
//! Server behaviour copied (kubernetes `pkg/registry/core/pod/strategy.go` `LogLocation`,
//! kubelet `pkg/kubelet/kubelet_pods.go` `GetContainerLogs`/`validateContainerLogStatus`):
//! - no `container` and more than one container: 400 `a container name must be specified for
//!   pod P, choose one of: [a b]`;
//! - an unknown container: 400 `container X is not valid for pod P`;
//! - `previous=true` with no terminated instance (restartCount 0): 400
//!   `previous terminated container "X" in pod "P" not found`;
//! - `tailLines` keeps the last N lines, `limitBytes` cuts the answer, both after `sinceSeconds`.

use std::sync::Arc;

use crate::core::app::App;
use crate::core::handlers::Query;
use crate::core::status::ApiError;
use crate::core::store::Key;
use crate::core::util::{now_unix, parse_rfc3339};
use crate::kubevirt::console_log;
use axum::body::Body;
use axum::response::Response;
use http::{StatusCode, header};
use serde_json::Value;

const ANNOTATION: &str = "emulator.kubevm.io/log";

/// The answer to a log request for `pod`. `follow=true` keeps the answer open while the pod
/// runs, with the lines its container writes from then on (the kubelet's `--follow`: it ends
/// when the container does; here when the pod stops running or is deleted).
pub async fn respond(app: &Arc<App>, pod: &Value, q: &Query) -> Result<Response, ApiError> {
    let container = container_of(pod, q)?;
    let previous = q.get("previous").is_some_and(|p| p == "true" || p == "1");
    let follow = q.get("follow").is_some_and(|f| f == "true" || f == "1");
    let fixture_log = annotation(pod, &format!("{ANNOTATION}.{container}")).is_some()
        || annotation(pod, &format!("emulator.kubevm.io/log-lines.{container}")).is_some();
    let transcript = if container == console_log::CONTAINER && !previous && !fixture_log {
        console_log::transcript_of(app, pod).await
    } else {
        None
    };
    let (text, live) = match &transcript {
        Some(t) => {
            let (lines, next) = t.lines_from(0);
            let mut raw = lines.join("\n");
            raw.push('\n');
            (filter(&raw, q), Some((t.clone(), next)))
        }
        None => (log_text(pod, q)?, None),
    };
    let body = if follow {
        let timestamps = q.get("timestamps").is_some_and(|t| t == "true" || t == "1");
        let uid = crate::core::util::meta_str(pod, "uid").to_owned();
        let key = Key::of("", "pods", pod);
        let app = app.clone();
        let grown = live.as_ref().map(|(t, _)| t.subscribe());
        let state = Follow {
            first: Some(text),
            live,
            grown,
            app,
            key,
            uid,
            timestamps,
        };
        let stream = futures::stream::unfold(state, |mut st| async move {
            if let Some(first) = st.first.take() {
                return Some((Ok::<_, std::io::Error>(bytes::Bytes::from(first)), st));
            }
            loop {
                let out = st.next_lines().await;
                if !out.is_empty() {
                    return Some((Ok(bytes::Bytes::from(out)), st));
                }
                if !st.pod_runs() {
                    return None;
                }
            }
        });
        Body::from_stream(stream)
    } else {
        Body::from(text)
    };
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(body)
        .expect("response"))
}

/// A follow in progress.
struct Follow {
    /// What was there when the request came (sent first).
    first: Option<String>,
    /// The console transcript and the index of its next line, for `guest-console-log`.
    live: Option<(Arc<console_log::Transcript>, u64)>,
    grown: Option<tokio::sync::watch::Receiver<u64>>,
    app: Arc<App>,
    key: Key,
    uid: String,
    timestamps: bool,
}

impl Follow {
    /// The lines added since the last call, after waiting a little for some.
    async fn next_lines(&mut self) -> String {
        let grown = &mut self.grown;
        let wait = async {
            match grown.as_mut() {
                Some(g) => {
                    let _ = g.changed().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_millis(250), wait).await;
        let mut out = String::new();
        if let Some((t, next)) = self.live.as_mut() {
            let (lines, after) = t.lines_from(*next);
            *next = after;
            for line in &lines {
                let shown = if self.timestamps {
                    line.as_str()
                } else {
                    line.split_once(' ').map_or(line.as_str(), |(_, r)| r)
                };
                out.push_str(shown);
                out.push('\n');
            }
        }
        out
    }

    /// Whether the same pod still runs (a follow ends with its container).
    fn pod_runs(&self) -> bool {
        self.app.store.get(&self.key).is_some_and(|p| {
            crate::core::util::meta_str(&p, "uid") == self.uid
                && p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
                && p.pointer("/metadata/deletionTimestamp").is_none()
        })
    }
}

fn annotation<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    pod["metadata"]["annotations"][key].as_str()
}

/// The container a request names (or the only one), checked against the pod.
fn container_of(pod: &Value, q: &Query) -> Result<String, ApiError> {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let containers: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(
            pod["spec"]["initContainers"]
                .as_array()
                .into_iter()
                .flatten(),
        )
        .filter_map(|c| c["name"].as_str())
        .collect();
    let main_count = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    match q.get("container").filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c.as_str()) => Ok(c.clone()),
        Some(c) => Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {pod_name}"
        ))),
        None if main_count == 1 => Ok(containers[0].to_owned()),
        None => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {pod_name}, choose one of: [{}]",
            containers[..main_count].join(" ")
        ))),
    }
}

/// The log text a request selects, filtered as the query says.
pub fn log_text(pod: &Value, q: &Query) -> Result<String, ApiError> {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let container = container_of(pod, q)?;
    let containers: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let previous = q.get("previous").is_some_and(|p| p == "true" || p == "1");
    let raw = if previous {
        let restarts = pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(
                pod["status"]["initContainerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten(),
            )
            .find(|s| s["name"] == container.as_str())
            .and_then(|s| s["restartCount"].as_u64())
            .unwrap_or(0);
        match annotation(pod, &format!("emulator.kubevm.io/previous-log.{container}")) {
            Some(text) if restarts > 0 => text.to_owned(),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "previous terminated container \"{container}\" in pod \"{pod_name}\" not found"
                )));
            }
        }
    } else if let Some(text) = annotation(pod, &format!("{ANNOTATION}.{container}")) {
        text.to_owned()
    } else if let Some(n) = annotation(pod, &format!("emulator.kubevm.io/log-lines.{container}"))
        .and_then(|n| n.parse::<usize>().ok())
    {
        synthetic(&container, n)
    } else if containers.first() == Some(&container.as_str()) {
        annotation(pod, ANNOTATION).unwrap_or_default().to_owned()
    } else {
        String::new()
    };
    Ok(filter(&raw, q))
}

/// `n` numbered log lines of `container`, as a busy launcher writes them.
fn synthetic(container: &str, n: usize) -> String {
    let mut out = String::with_capacity(n * 120);
    for i in 1..=n {
        out.push_str(&format!(
            "{{\"component\":\"virt-launcher\",\"container\":\"{container}\",\"level\":\"info\",\"msg\":\"synthetic line {i} of {n}: domain event processed\",\"pos\":\"client.go:{i}\"}}\n"
        ));
    }
    out
}

/// Applies `sinceSeconds`/`sinceTime`, `timestamps`, `tailLines` and `limitBytes`.
fn filter(raw: &str, q: &Query) -> String {
    let since = q
        .get("sinceSeconds")
        .and_then(|s| s.parse::<i64>().ok())
        .map(|s| now_unix() - s)
        .or_else(|| q.get("sinceTime").and_then(|t| parse_rfc3339(t)));
    let timestamps = q.get("timestamps").is_some_and(|t| t == "true" || t == "1");
    let mut lines: Vec<String> = Vec::new();
    for line in raw.lines() {
        let (stamp, rest) = match line.split_once(' ') {
            Some((first, rest)) => match parse_rfc3339(first) {
                Some(t) => (Some(t), rest),
                None => (None, line),
            },
            None => (None, line),
        };
        if let (Some(since), Some(t)) = (since, stamp)
            && t < since
        {
            continue;
        }
        lines.push(if timestamps { line } else { rest }.to_owned());
    }
    if let Some(n) = q.get("tailLines").and_then(|t| t.parse::<usize>().ok()) {
        lines.drain(..lines.len().saturating_sub(n));
    }
    let mut text = lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    if let Some(limit) = q.get("limitBytes").and_then(|l| l.parse::<usize>().ok())
        && text.len() > limit
    {
        let mut cut = limit;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(pairs: &[(&str, &str)]) -> Query {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "annotations": {
                "emulator.kubevm.io/log.a": "2020-01-01T00:00:00Z old\nundated\n2999-01-01T00:00:00Z new\n",
                "emulator.kubevm.io/previous-log.a": "crashed\n",
                "emulator.kubevm.io/log-lines.b": "5"
            }},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"containerStatuses": [{"name": "a", "restartCount": 2}, {"name": "b", "restartCount": 0}]}
        })
    }

    #[test]
    fn container_must_be_named_when_several() {
        let e = log_text(&pod(), &q(&[])).unwrap_err();
        assert_eq!(
            e.message,
            "a container name must be specified for pod p, choose one of: [a b]"
        );
        let e = log_text(&pod(), &q(&[("container", "c")])).unwrap_err();
        assert_eq!(e.message, "container c is not valid for pod p");
    }

    #[test]
    fn previous_needs_a_restart() {
        assert_eq!(
            log_text(&pod(), &q(&[("container", "a"), ("previous", "true")])).unwrap(),
            "crashed\n"
        );
        let e = log_text(&pod(), &q(&[("container", "b"), ("previous", "true")])).unwrap_err();
        assert_eq!(
            e.message,
            "previous terminated container \"b\" in pod \"p\" not found"
        );
    }

    #[test]
    fn since_tail_timestamps_and_limit() {
        let all = log_text(&pod(), &q(&[("container", "a")])).unwrap();
        assert_eq!(all, "old\nundated\nnew\n");
        let since = log_text(&pod(), &q(&[("container", "a"), ("sinceSeconds", "60")])).unwrap();
        assert_eq!(since, "undated\nnew\n");
        let stamped = log_text(
            &pod(),
            &q(&[
                ("container", "a"),
                ("timestamps", "true"),
                ("tailLines", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(stamped, "2999-01-01T00:00:00Z new\n");
        let cut = log_text(&pod(), &q(&[("container", "a"), ("limitBytes", "5")])).unwrap();
        assert_eq!(cut, "old\nu");
        let synthetic = log_text(&pod(), &q(&[("container", "b"), ("tailLines", "2")])).unwrap();
        assert_eq!(synthetic.lines().count(), 2);
        assert!(synthetic.contains("synthetic line 5 of 5"), "{synthetic}");
    }
}
