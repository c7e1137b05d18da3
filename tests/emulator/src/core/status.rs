//! `metav1.Status` errors: every failure the emulator returns goes through [`ApiError`], so
//! `reason`, `code`, `details` and the message wording match what a real API server sends.

use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One field-level problem reported inside an `Invalid` (422) error.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`, `FieldValueTooLong`, …
    pub reason: &'static str,
    /// Field path such as `spec.template.spec.domain.foo`.
    pub field: String,
    /// The part after `<field>: `, e.g. `Required value`.
    pub message: String,
}

impl Cause {
    /// The `field: message` line Kubernetes prints for a cause.
    pub fn line(&self) -> String {
        if self.field.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.field, self.message)
        }
    }
}

/// An error answered as a Kubernetes `Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status code (also `.code` of the Status).
    pub code: u16,
    /// `.reason` (`NotFound`, `Conflict`, …).
    pub reason: String,
    /// `.message`.
    pub message: String,
    /// `.details` if any.
    pub details: Option<Value>,
    /// Extra response headers (e.g. `Warning`).
    pub headers: Vec<(String, String)>,
    /// Answered as Go's `http.NotFound` text instead of a `Status` (see [`ApiError::no_handler`]).
    pub plain_text: bool,
}

/// Resource name as Kubernetes prints it in messages: `virtualmachines.kubevirt.io`, or just
/// `pods` for the core group.
pub fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(group: &str, kind: &str, name: Option<&str>) -> Value {
    let mut d = serde_json::Map::new();
    if let Some(n) = name.filter(|n| !n.is_empty()) {
        d.insert("name".into(), json!(n));
    }
    if !group.is_empty() {
        d.insert("group".into(), json!(group));
    }
    d.insert("kind".into(), json!(kind));
    Value::Object(d)
}

impl ApiError {
    /// A bare error with the given code, reason and message.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
            headers: vec![],
            plain_text: false,
        }
    }

    /// The reason Kubernetes associates with an HTTP code (used by failure injection).
    pub fn reason_for_code(code: u16) -> &'static str {
        match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            406 => "NotAcceptable",
            409 => "Conflict",
            410 => "Expired",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        }
    }

    /// An error for an arbitrary code, reason derived from it (failure injection).
    pub fn from_code(code: u16, message: impl Into<String>) -> Self {
        Self::new(code, Self::reason_for_code(code), message)
    }

    /// 404 `virtualmachines.kubevirt.io "web" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        );
        e.details = Some(details(group, plural, Some(name)));
        e
    }

    /// 404 for a path that serves nothing (as the real server answers unknown URLs).
    pub fn path_not_found() -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        e.details = Some(json!({}));
        e
    }

    /// A path no handler of the API server serves (an API group that is not installed, e.g.
    /// `subresources.kubevirt.io` without virt-api's APIService): the request falls through the
    /// delegation chain (kube-aggregator → kube-apiserver → apiextensions-apiserver, whose
    /// CRD handler delegates a group/resource it has no CRD for) to its last handler,
    /// k8s.io/apiserver `pkg/util/notfoundhandler/notfoundhandler.go` `ServeHTTP`, which once the
    /// mux is complete calls Go's `http.NotFound`: 404, `text/plain; charset=utf-8`,
    /// `X-Content-Type-Options: nosniff`, body `404 page not found\n` — not a Status. (client-go
    /// renders it as `the server could not find the requested resource`; kube-rs keeps the text
    /// with reason `Failed to parse error data`.)
    pub fn no_handler() -> Self {
        let mut e = Self::new(404, "NotFound", "404 page not found");
        e.plain_text = true;
        e
    }

    /// 409 `AlreadyExists`.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        );
        e.details = Some(details(group, plural, Some(name)));
        e
    }

    /// 409 `Conflict` for a stale `resourceVersion`.
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(group, plural)
            ),
        );
        e.details = Some(details(group, plural, Some(name)));
        e
    }

    /// 409 `Conflict` of a delete whose uid precondition does not match, worded as the API
    /// server's `storage.Preconditions.Check` (k8s.io/apiserver/pkg/storage/interfaces.go)
    /// wrapped by `errors.NewConflict` (storeerr.InterpretDeleteError).
    pub fn uid_precondition(group: &str, plural: &str, name: &str, want: &str, have: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {want}, UID in object meta: {have}",
                qualified(group, plural)
            ),
        );
        e.details = Some(details(group, plural, Some(name)));
        e
    }

    /// 422 `Invalid`: `Kind.group "name" is invalid: cause[, cause…]`.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let qkind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let lines: Vec<String> = causes.iter().map(Cause::line).collect();
        let body = if lines.len() == 1 {
            lines[0].clone()
        } else {
            format!("[{}]", lines.join(", "))
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{qkind} \"{name}\" is invalid: {body}"),
        );
        let mut d = details(group, kind, Some(name));
        d["causes"] = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        e.details = Some(d);
        e
    }

    /// 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405 `MethodNotAllowed`.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 401 `Unauthorized`.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 `Forbidden` with the real API server's wording.
    pub fn forbidden(group: &str, plural: &str, name: &str, reason_text: &str) -> Self {
        let q = qualified(group, plural);
        let message = if name.is_empty() {
            format!("{q} is forbidden: {reason_text}")
        } else {
            format!("{q} \"{name}\" is forbidden: {reason_text}")
        };
        let mut e = Self::new(403, "Forbidden", message);
        e.details = Some(details(group, plural, Some(name)));
        e
    }

    /// 410 `Expired`/Gone for a watch whose resourceVersion fell out of the event log.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 500 `InternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = http::StatusCode::from_u16(self.code)
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        if self.plain_text {
            return (
                code,
                [
                    (http::header::CONTENT_TYPE, "text/plain; charset=utf-8"),
                    (http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                ],
                format!("{}\n", self.message),
            )
                .into_response();
        }
        let mut resp = (
            code,
            [(http::header::CONTENT_TYPE, "application/json")],
            serde_json::to_vec(&self.to_status()).unwrap_or_default(),
        )
            .into_response();
        for (k, v) in &self.headers {
            if let (Ok(k), Ok(v)) = (
                http::HeaderName::try_from(k.as_str()),
                http::HeaderValue::try_from(v.as_str()),
            ) {
                resp.headers_mut().append(k, v);
            }
        }
        resp
    }
}
