//! HTTP entry point: authentication, request parsing (like the API server's RequestInfo),
//! authorization, failure injection, then the REST verbs on stored kinds. Discovery and OpenAPI
//! live in their own modules, watches in `watch.rs`, subresource-only groups in
//! `subresources.rs`.
//!
//! Submodules by concern: `path` (RequestInfo-like URL parsing), `ctx` (one request against a
//! stored kind: decoding, identity checks, validation, field ownership, responses), then one
//! module a verb group: `create`, `read` (get/list), `write` (update/patch), `delete`.

mod create;
mod ctx;
mod delete;
mod path;
mod read;
mod write;

pub use path::{ResourcePath, parse_path};

use crate::core::app::App;
use crate::core::auth::{Attributes, authorize};
use crate::core::status::ApiError;
use crate::core::util::{meta_str, parse_yaml_or_json};
use crate::{core::discovery, core::openapi, core::subresources, core::watch};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use ctx::Ctx;
use http::{HeaderMap, Method, StatusCode, header};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// Largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Query parameters (last value wins).
pub type Query = HashMap<String, String>;

/// The axum fallback handler: every request comes through here.
pub async fn dispatch(State(app): State<Arc<App>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    // Read the body here so the request log holds it; an over-long body is the real
    // server's 413 (it refuses bodies over 3 MiB).
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        // k8s.io/apiserver/pkg/endpoints/handlers/rest.go limitedReadBody:
        // errors.NewRequestEntityTooLargeError(fmt.Sprintf("limit is %d", limit)).
        Err(_) => {
            return ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("Request entity too large: limit is {MAX_BODY}"),
            )
            .into_response();
        }
    };
    let entry = app.requests.record(&parts, &body);
    let req = Request::from_parts(parts, Body::from(body));
    let response = match handle(&app, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    app.requests.set_status(entry, response.status().as_u16());
    response
}

/// A JSON response already serialized.
fn bytes_response(code: StatusCode, body: Vec<u8>) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A JSON response.
pub fn json_response(code: StatusCode, body: &Value, warnings: &[String]) -> Response {
    let mut resp = bytes_response(code, serde_json::to_vec(body).unwrap_or_default());
    for w in warnings {
        // Warning header format: 299 - "<text>"
        if let Ok(v) = http::HeaderValue::try_from(format!("299 - \"{}\"", w.replace('"', "\\\"")))
        {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

fn ok(body: &Value) -> Response {
    json_response(StatusCode::OK, body, &[])
}

/// Whether the client asked for `meta.k8s.io/v1` Table output.
pub fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|a| {
            a.split(',').any(|m| {
                m.contains("as=Table") && m.contains("g=meta.k8s.io") && !m.contains("v=v1beta1")
            })
        })
}

fn query_of(uri: &http::Uri) -> Query {
    axum::extract::Query::<Query>::try_from_uri(uri)
        .map(|q| q.0)
        .unwrap_or_default()
}

fn is_dry_run(q: &Query) -> Result<bool, ApiError> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "Invalid dryRun value {other:?}; the only supported value is \"All\""
        ))),
    }
}

/// `/apis`: the emulator's groups plus the aggregated APIServices' (see `aggregator`).
fn group_list(app: &App) -> Value {
    let mut list = discovery::group_list(&app.registry);
    crate::core::aggregator::merge_group_list(app, &mut list);
    list
}

async fn handle(app: &Arc<App>, req: Request) -> Result<Response, ApiError> {
    let (mut parts, body) = req.into_parts();
    let auth = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = app
        .tokens
        .authenticate(auth)
        .or_else(|| app.sa_tokens.authenticate(&app.store, auth))
        .ok_or_else(ApiError::unauthorized)?;
    let as_groups = parts
        .headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_owned))
        .collect();
    let as_user = parts
        .headers
        .get("impersonate-user")
        .and_then(|v| v.to_str().ok());
    let user = crate::core::auth::impersonate(user, as_user, as_groups)?;
    let path = parts.uri.path().to_string();
    let q = query_of(&parts.uri);
    let body = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| ApiError::bad_request(e.to_string()))?;

    // Non-resource URLs: open to every authenticated user.
    match path.trim_end_matches('/') {
        "/version" => return Ok(ok(&discovery::version())),
        "/api" => {
            return Ok(ok(&discovery::core_versions(
                *app.port.lock().unwrap_or_else(|e| e.into_inner()),
            )));
        }
        "/apis" => return Ok(ok(&group_list(app))),
        "/healthz" | "/livez" | "/readyz" => return Ok((StatusCode::OK, "ok").into_response()),
        "/openapi/v3" => return Ok(ok(&openapi::root(&app.registry))),
        _ => {}
    }
    if let Some(gv) = path.strip_prefix("/openapi/v3/") {
        let rp = parse_path(&format!("/{gv}")).ok_or_else(ApiError::path_not_found)?;
        return openapi::document(&app.registry, &rp.group, &rp.version)
            .map(|d| ok(&d))
            .ok_or_else(ApiError::path_not_found);
    }
    if let Some(g) = path
        .trim_end_matches('/')
        .strip_prefix("/apis/")
        .filter(|g| !g.contains('/'))
    {
        let list = group_list(app);
        let found = list["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["name"] == g);
        return found
            .map(|d| {
                let mut d = d.clone();
                d["kind"] = "APIGroup".into();
                d["apiVersion"] = "v1".into();
                ok(&d)
            })
            .ok_or_else(ApiError::no_handler);
    }
    // Paths no API group serves fall through to the delegation chain's last handler
    // (`ApiError::no_handler`, notfoundhandler.go): a text 404, not a Status.
    let rp = parse_path(&path).ok_or_else(ApiError::no_handler)?;
    // An aggregated APIService's group/version: everything under it goes to its backend.
    if !rp.group.is_empty()
        && let Some(backend) = crate::core::aggregator::backend_for(app, &rp.group, &rp.version)
    {
        return crate::core::aggregator::serve(app, backend, &user, &parts, &q, body).await;
    }
    if rp.plural.is_empty() {
        return discovery::resource_list(&app.registry, &rp.group, &rp.version)
            .map(|d| ok(&d))
            .ok_or_else(ApiError::no_handler);
    }
    if app.registry.aggregated(&rp.group, &rp.version).is_some() {
        return subresources::handle(app, &user, &rp, &mut parts, &q, &body).await;
    }
    let def = app
        .registry
        .find(&rp.group, &rp.version, &rp.plural)
        .ok_or_else(ApiError::no_handler)?;
    if def.namespaced != rp.namespace.is_some() && !(def.namespaced && rp.name.is_none()) {
        return Err(ApiError::path_not_found());
    }
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = match (&parts.method, rp.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if watching => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        // RequestInfo: POST is create, also on a subresource (serviceaccounts/token).
        (&Method::POST, true) if !rp.sub.is_empty() => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        (m, _) => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m})"
            )));
        }
    };
    let name = rp.name.clone().unwrap_or_default();
    let ns = rp.namespace.clone().unwrap_or_default();
    let sub = rp.sub.join("/");
    let attrs = Attributes {
        verb: verb.into(),
        group: def.group.clone(),
        resource: def.plural.clone(),
        subresource: sub.clone(),
        namespace: ns.clone(),
        name: name.clone(),
    };
    authorize(&app.store, &user, &attrs)?;
    app.holds.pass(verb, &def.plural).await;
    // A create names its object in the body, not the URL: rules for one object match it there.
    let failure_name = if verb == "create" {
        parse_yaml_or_json(&body)
            .ok()
            .map(|obj| meta_str(&obj, "name").to_string())
            .unwrap_or_default()
    } else {
        name.clone()
    };
    if let Some(rule) = app.take_failure(verb, &def.plural, &failure_name) {
        return Err(ApiError::from_code(rule.code, rule.message));
    }
    let ctx = Ctx {
        app,
        def: &def,
        version: &rp.version,
        ns: &ns,
        name: &name,
        q: &q,
        headers: &parts.headers,
        user: &user,
        warnings: Default::default(),
    };
    match (verb, sub.as_str()) {
        ("create", "") => ctx.create(&body),
        ("get", "") => ctx.get(),
        ("list", "") => ctx.list(),
        ("watch", "") => watch::serve(
            app,
            &def,
            &rp.version,
            rp.namespace.as_deref(),
            &q,
            wants_table(&parts.headers),
        ),
        ("update", "") => ctx.update(&body, false),
        ("update", "status") if def.has_status => ctx.update(&body, true),
        ("patch", "") => ctx.patch(&body, false),
        ("patch", "status") if def.has_status => ctx.patch(&body, true),
        ("get", "status") if def.has_status => ctx.get(),
        ("delete", "") => ctx.delete(&body),
        ("deletecollection", "") => ctx.delete_collection(),
        ("get", "log") if def.plural == "pods" && def.group.is_empty() => {
            crate::core::podlog::respond(app, &ctx.current()?, &q).await
        }
        ("get" | "create", "exec") if def.plural == "pods" && def.group.is_empty() => {
            crate::core::podexec::serve(app, &mut parts, &user, &ns, &name).await
        }
        ("create", "token") if def.plural == "serviceaccounts" && def.group.is_empty() => {
            let ct = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let answer = crate::core::sa_tokens::token_request(app, &ns, &name, ct, &body)?;
            Ok(json_response(StatusCode::CREATED, &answer, &[]))
        }
        ("get" | "create", "portforward") if def.plural == "pods" && def.group.is_empty() => {
            crate::core::pod_portforward::serve(app, &mut parts, &user, &ns, &name).await
        }
        _ => Err(ApiError::path_not_found()),
    }
}
