//! kubectl's `-v N` request logging, as a tower layer on the API client:
//! 6 logs each request's method, URL, status and latency; 7 adds the request headers;
//! 8 adds request and response bodies (cut at 1024 characters); 9 shows bodies whole.
//! Secret values are masked: Secret `data`/`stringData` values, `token` fields, and
//! `Authorization` headers. Streams (watches, logs, upgraded connections) are never buffered.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::{HeaderMap, Request, Response};
use http_body_util::BodyExt;
use kube::client::{Body, DynBody};
use serde_json::Value;
use tower::{BoxError, Layer, Service};

/// Where log lines go, and how much to log (kubectl's `-v`).
#[derive(Clone)]
pub struct HttpLog {
    /// kubectl verbosity: below 6 nothing is logged.
    pub level: u8,
    /// Receives each line (the command writes it to stderr).
    pub sink: Arc<dyn Fn(&str) + Send + Sync>,
}

impl fmt::Debug for HttpLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpLog")
            .field("level", &self.level)
            .finish()
    }
}

/// Bodies are cut at this many characters below level 9 (as kubectl does at 8).
const CUT: usize = 1024;

/// The layer that logs through an [`HttpLog`], for requests to `server`.
#[derive(Clone, Debug)]
pub struct HttpLogLayer {
    log: HttpLog,
    server: String,
}

impl HttpLogLayer {
    /// Logs requests to `server` (prefixed to each path) at `log.level`.
    pub fn new(log: HttpLog, server: impl Into<String>) -> Self {
        HttpLogLayer {
            log,
            server: server.into(),
        }
    }
}

impl<S> Layer<S> for HttpLogLayer {
    type Service = HttpLogService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        HttpLogService {
            inner,
            log: self.log.clone(),
            server: self.server.clone(),
        }
    }
}

/// The service [`HttpLogLayer`] wraps around the client stack.
pub struct HttpLogService<S> {
    inner: S,
    log: HttpLog,
    server: String,
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<Response<Box<DynBody>>, BoxError>> + Send>>;

impl<S> Service<Request<Body>> for HttpLogService<S>
where
    S: Service<Request<Body>, Response = Response<Box<DynBody>>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let log = self.log.clone();
        let level = log.level;
        let method = req.method().clone();
        let url = format!("{}{}", self.server, req.uri());
        let streaming = is_stream(&req);
        let headers = (level >= 7).then(|| masked_headers(req.headers()));
        let body = if level >= 8 {
            req.body().try_clone()
        } else {
            None
        };
        let started = Instant::now();
        let call = self.inner.call(req);
        Box::pin(async move {
            if level >= 7 {
                (log.sink)(&format!("{method} {url}"));
                for line in headers.unwrap_or_default() {
                    (log.sink)(&format!("    {line}"));
                }
            }
            if let Some(body) = body
                && let Ok(bytes) = body.collect_bytes().await
                && !bytes.is_empty()
            {
                (log.sink)(&format!("Request Body: {}", shown(&bytes, level)));
            }
            let result = call.await;
            let millis = started.elapsed().as_millis();
            let response = match result {
                Ok(response) => response,
                Err(e) => {
                    if level >= 6 {
                        (log.sink)(&format!(
                            "{method} {url} failed in {millis} milliseconds: {e}"
                        ));
                    }
                    return Err(e);
                }
            };
            let status = response.status();
            if level >= 6 {
                (log.sink)(&format!(
                    "{method} {url} {} {} in {millis} milliseconds",
                    status.as_u16(),
                    status.canonical_reason().unwrap_or("")
                ));
            }
            if level < 8 || streaming || status == http::StatusCode::SWITCHING_PROTOCOLS {
                return Ok(response);
            }
            let (parts, body) = response.into_parts();
            let bytes = body.collect().await?.to_bytes();
            (log.sink)(&format!("Response Body: {}", shown(&bytes, level)));
            let body: Box<DynBody> = Box::new(
                http_body_util::Full::new(bytes)
                    .map_err(|never: std::convert::Infallible| -> BoxError { match never {} }),
            );
            Ok(Response::from_parts(parts, body))
        })
    }
}

/// Watches, followed logs and connection upgrades stream: their bodies are never read here.
fn is_stream(req: &Request<Body>) -> bool {
    let query = req.uri().query().unwrap_or("");
    query
        .split('&')
        .any(|p| p == "watch=true" || p == "watch=1" || p == "follow=true")
        || req.headers().contains_key(http::header::UPGRADE)
}

/// `Name: value` lines, with credentials masked.
fn masked_headers(headers: &HeaderMap) -> Vec<String> {
    headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes());
            let shown = match name.as_str() {
                "authorization" | "proxy-authorization" => match value.split_once(' ') {
                    Some((scheme, _)) => format!("{scheme} <masked>"),
                    None => "<masked>".to_owned(),
                },
                "cookie" => "<masked>".to_owned(),
                _ => value.into_owned(),
            };
            format!("{}: {shown}", name.as_str())
        })
        .collect()
}

/// A body as logged: JSON with secrets masked, cut at [`CUT`] characters below level 9.
fn shown(bytes: &[u8], level: u8) -> String {
    let text = match serde_json::from_slice::<Value>(bytes) {
        Ok(mut value) => {
            mask(&mut value);
            value.to_string()
        }
        // Not JSON (YAML, protobuf, text): only its size, since it cannot be masked.
        Err(_) => format!("<{} bytes, not JSON>", bytes.len()),
    };
    if level >= 9 || text.chars().count() <= CUT {
        return text;
    }
    let cut: String = text.chars().take(CUT).collect();
    format!("{cut} [truncated {} chars]", text.chars().count() - CUT)
}

/// Masks secret material in a JSON document in place: the values of a Secret's `data` and
/// `stringData` (also inside lists and watch events), and every `token` field.
pub fn mask(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.get("kind").and_then(Value::as_str) == Some("Secret") {
                for field in ["data", "stringData"] {
                    if let Some(Value::Object(entries)) = map.get_mut(field) {
                        for v in entries.values_mut() {
                            *v = Value::String("<masked>".into());
                        }
                    }
                }
            }
            for (key, v) in map.iter_mut() {
                if key == "token" && v.is_string() {
                    *v = Value::String("<masked>".into());
                } else {
                    mask(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_masked_everywhere() {
        let mut list = json!({"kind": "SecretList", "items": [
            {"kind": "Secret", "metadata": {"name": "a"}, "data": {"key": "c2VjcmV0"}, "stringData": {"pw": "hunter2"}},
        ]});
        mask(&mut list);
        assert_eq!(list["items"][0]["data"]["key"], "<masked>");
        assert_eq!(list["items"][0]["stringData"]["pw"], "<masked>");
        assert_eq!(list["items"][0]["metadata"]["name"], "a");
        let mut review = json!({"kind": "TokenReview", "spec": {"token": "eyJhbGciOi"}});
        mask(&mut review);
        assert_eq!(review["spec"]["token"], "<masked>");
        // A ConfigMap's data is not secret.
        let mut cm = json!({"kind": "ConfigMap", "data": {"ca.pub": "ssh-ed25519 AAAA"}});
        mask(&mut cm);
        assert_eq!(cm["data"]["ca.pub"], "ssh-ed25519 AAAA");
    }

    #[test]
    fn authorization_is_masked() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer abc.def".parse().unwrap());
        headers.insert("accept", "application/json".parse().unwrap());
        assert_eq!(
            masked_headers(&headers),
            vec!["authorization: Bearer <masked>", "accept: application/json"]
        );
    }

    #[test]
    fn long_bodies_are_cut_below_level_9() {
        let body = serde_json::to_vec(&json!({"x": "y".repeat(2000)})).unwrap();
        let cut = shown(&body, 8);
        assert!(
            cut.ends_with(&format!("[truncated {} chars]", body.len() - CUT)),
            "{cut}"
        );
        assert_eq!(shown(&body, 9).len(), body.len());
    }
}
