//! HTTP entry point: authentication, request parsing (like the API server's RequestInfo),
//! authorization, failure injection, then the REST verbs on stored kinds. Discovery and OpenAPI
//! live in their own modules, watches in `watch.rs`, subresource-only groups in
//! `subresources.rs`.

use crate::app::App;
use crate::auth::{Attributes, User, authorize, rbac_allows};
use crate::patch::PatchType;
use crate::registry::ResourceDef;
use crate::schema::FieldValidation;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{Key, Propagation, StoreError};
use crate::table::IncludeObject;
use crate::util::{meta_mut, meta_str, parse_yaml_or_json, random_suffix};
use crate::{discovery, openapi, subresources, table, watch};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, Method, StatusCode, header};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

/// Largest request body accepted (the real server's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Query parameters (last value wins).
pub type Query = HashMap<String, String>;

/// A parsed resource URL (`/apis/G/V[/namespaces/NS]/PLURAL[/NAME[/SUB…]]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResourcePath {
    /// API group ("" for `/api`).
    pub group: String,
    /// Version.
    pub version: String,
    /// Namespace, if the URL has one.
    pub namespace: Option<String>,
    /// Plural resource ("" for the group/version discovery URL).
    pub plural: String,
    /// Object name, if any.
    pub name: Option<String>,
    /// Subresource path segments (`status`, `log`, `portforward/22/tcp`, …).
    pub sub: Vec<String>,
}

/// Parses a resource URL; None for non-resource URLs.
pub fn parse_path(path: &str) -> Option<ResourcePath> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let mut rp = ResourcePath {
        group: group.into(),
        version: version.into(),
        ..Default::default()
    };
    let mut rest: Vec<&str> = rest.to_vec();
    // Same rule as k8s.io/apiserver's RequestInfoFactory: "namespaces/X/…" scopes the rest,
    // except the namespace's own subresources (status, finalize).
    if rest.first() == Some(&"namespaces") && rest.len() > 1 {
        rp.namespace = Some(rest[1].to_string());
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest.drain(0..2);
        } else {
            rp.namespace = None;
        }
    }
    if let Some(p) = rest.first() {
        rp.plural = p.to_string();
    }
    if let Some(n) = rest.get(1) {
        rp.name = Some(n.to_string());
    }
    rp.sub = rest.iter().skip(2).map(|s| s.to_string()).collect();
    Some(rp)
}

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

/// A JSON response.
pub fn json_response(code: StatusCode, body: &Value, warnings: &[String]) -> Response {
    let mut resp = (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(body).unwrap_or_default(),
    )
        .into_response();
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

async fn handle(app: &Arc<App>, req: Request) -> Result<Response, ApiError> {
    let (mut parts, body) = req.into_parts();
    let auth = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = app
        .tokens
        .authenticate(auth)
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
    let user = crate::auth::impersonate(user, as_user, as_groups)?;
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
        "/apis" => return Ok(ok(&discovery::group_list(&app.registry))),
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
        return discovery::group(&app.registry, g)
            .map(|d| ok(&d))
            .ok_or_else(ApiError::path_not_found);
    }
    let rp = parse_path(&path).ok_or_else(ApiError::path_not_found)?;
    if rp.plural.is_empty() {
        return discovery::resource_list(&app.registry, &rp.group, &rp.version)
            .map(|d| ok(&d))
            .ok_or_else(ApiError::path_not_found);
    }
    if app.registry.aggregated(&rp.group, &rp.version).is_some() {
        return subresources::handle(app, &user, &rp, &mut parts, &q, &body).await;
    }
    let def = app
        .registry
        .find(&rp.group, &rp.version, &rp.plural)
        .ok_or_else(ApiError::path_not_found)?;
    if def.namespaced != rp.namespace.is_some() && !(def.namespaced && rp.name.is_none()) {
        return Err(ApiError::path_not_found());
    }
    let watching = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = match (&parts.method, rp.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if watching => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
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
    if let Err(denied) = authorize(&user, &attrs)
        && !rbac_allows(&app.store, &user, &attrs)
    {
        return Err(denied);
    }
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
            crate::podlog::respond(&ctx.current()?, &q)
        }
        ("get" | "create", "exec") if def.plural == "pods" && def.group.is_empty() => {
            crate::podexec::serve(app, &mut parts, &user, &ns, &name).await
        }
        ("get" | "create", "portforward") if def.plural == "pods" && def.group.is_empty() => {
            crate::pod_portforward::serve(app, &mut parts, &user, &ns, &name).await
        }
        _ => Err(ApiError::path_not_found()),
    }
}

/// One request against a stored kind.
struct Ctx<'a> {
    app: &'a Arc<App>,
    def: &'a ResourceDef,
    version: &'a str,
    ns: &'a str,
    name: &'a str,
    q: &'a Query,
    headers: &'a HeaderMap,
    user: &'a User,
}

impl Ctx<'_> {
    fn key(&self) -> Key {
        Key::new(&self.def.group, &self.def.plural, self.ns, self.name)
    }

    /// The object as served at the request's version.
    fn present(&self, mut obj: Value) -> Value {
        if let Some(m) = obj.as_object_mut() {
            m.insert(
                "apiVersion".into(),
                json!(self.def.api_version(self.version)),
            );
            m.insert("kind".into(), json!(self.def.kind));
        }
        obj
    }

    /// Records field ownership of a create/update/non-apply patch (see fieldmanager.rs).
    fn own_update(&self, live: Option<&Value>, new: &mut Value) {
        let ua = self
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let manager = crate::fieldmanager::manager_or_user_agent(
            self.q.get("fieldManager").map(String::as_str),
            ua,
        );
        let av = self.def.api_version(self.version);
        let w = crate::fieldmanager::Writer {
            manager: &manager,
            api_version: &av,
            shape: crate::fieldmanager::shape_of(self.def),
        };
        crate::fieldmanager::update(&w, live, new);
    }

    /// Server-side apply ownership: conflicts (unless `force=true`), pruning, managedFields.
    fn own_apply(
        &self,
        live: Option<&Value>,
        applied: &Value,
        merged: &mut Value,
    ) -> Result<(), ApiError> {
        let manager = self.q.get("fieldManager").cloned().unwrap_or_default();
        let av = self.def.api_version(self.version);
        let w = crate::fieldmanager::Writer {
            manager: &manager,
            api_version: &av,
            shape: crate::fieldmanager::shape_of(self.def),
        };
        let force = self.q.get("force").is_some_and(|f| f == "true");
        crate::fieldmanager::apply(&w, live, applied, merged, force)
    }

    fn respond(
        &self,
        code: StatusCode,
        obj: Value,
        warnings: &[String],
    ) -> Result<Response, ApiError> {
        let obj = self.present(obj);
        if wants_table(self.headers) {
            let include = IncludeObject::parse(self.q.get("includeObject").map(String::as_str));
            return Ok(json_response(
                code,
                &table::table(self.def, &[obj], None, include),
                warnings,
            ));
        }
        Ok(json_response(code, &obj, warnings))
    }

    fn store_err(&self, e: StoreError) -> ApiError {
        match e {
            StoreError::NotFound => {
                ApiError::not_found(&self.def.group, &self.def.plural, self.name)
            }
            StoreError::AlreadyExists => {
                ApiError::already_exists(&self.def.group, &self.def.plural, self.name)
            }
            StoreError::Conflict => {
                ApiError::conflict(&self.def.group, &self.def.plural, self.name)
            }
        }
    }

    fn current(&self) -> Result<Value, ApiError> {
        self.app
            .store
            .get(&self.key())
            .ok_or_else(|| ApiError::not_found(&self.def.group, &self.def.plural, self.name))
    }

    fn decode(&self, body: &Bytes) -> Result<Value, ApiError> {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if ct.contains("protobuf") || ct.contains("cbor") {
            // Typed clients (e.g. `kubectl auth whoami`) send protobuf; a review's body carries
            // nothing the answer depends on, anything else must be JSON or YAML here.
            if !self.def.stored {
                return Ok(json!({}));
            }
            if ct.contains("protobuf")
                && crate::protobuf::supported(&self.def.group, &self.def.plural)
            {
                return crate::protobuf::decode(&self.def.kind, body).map_err(|e| {
                    ApiError::bad_request(format!("error decoding request body: {e}"))
                });
            }
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct})"
                ),
            ));
        }
        let v = parse_yaml_or_json(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?;
        if !v.is_object() {
            return Err(ApiError::bad_request("the request body must be an object"));
        }
        Ok(v)
    }

    /// Checks apiVersion/kind/namespace of a body against the URL and fills what is missing.
    fn check_identity(&self, obj: &mut Value) -> Result<(), ApiError> {
        let want_av = self.def.api_version(self.version);
        let av = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if (!kind.is_empty() && kind != self.def.kind) || (!av.is_empty() && av != want_av) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            ))
            .with_kind_hint(&kind, &self.def.kind));
        }
        obj["apiVersion"] = json!(want_av);
        obj["kind"] = json!(self.def.kind);
        let meta = meta_mut(obj);
        let body_ns = meta
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if self.def.namespaced {
            if !body_ns.is_empty() && body_ns != self.ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), json!(self.ns));
        } else {
            meta.remove("namespace");
        }
        Ok(())
    }

    fn validate(&self, obj: &mut Value) -> Result<Vec<String>, ApiError> {
        let mode = FieldValidation::parse(self.q.get("fieldValidation").map(String::as_str))?;
        crate::strategy::prepare(self.def, obj)?;
        let warnings = crate::schema::validate(self.def, self.version, obj, mode)?;
        crate::admission::admit(self.def, obj)?;
        Ok(warnings)
    }

    fn create(&self, body: &Bytes) -> Result<Response, ApiError> {
        if self.def.namespaced && self.ns.is_empty() {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
        let mut obj = self.decode(body)?;
        self.check_identity(&mut obj)?;
        if !self.def.stored {
            return self.review(obj);
        }
        self.own_update(None, &mut obj);
        self.create_object(obj)
    }

    fn create_object(&self, mut obj: Value) -> Result<Response, ApiError> {
        let meta = meta_mut(&mut obj);
        // Server-owned fields are reset on create.
        for f in [
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "selfLink",
        ] {
            meta.remove(f);
        }
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let gen_name = meta
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() && !gen_name.is_empty() {
            meta.insert(
                "name".into(),
                json!(format!("{gen_name}{}", random_suffix(5))),
            );
        }
        let name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            return Err(ApiError::invalid(
                &self.def.group,
                &self.def.kind,
                "",
                vec![crate::status::Cause {
                    reason: "FieldValueRequired",
                    field: "metadata.name".into(),
                    message: "Required value: name or generateName is required".into(),
                }],
            ));
        }
        if self.def.namespaced
            && self
                .app
                .store
                .get(&Key::new("", "namespaces", "", self.ns))
                .is_none()
        {
            return Err(ApiError::not_found("", "namespaces", self.ns));
        }
        if self.def.has_status {
            obj.as_object_mut().expect("object").remove("status");
        }
        defaults_on_create(self.def, &mut obj);
        let warnings = self.validate(&mut obj)?;
        crate::quota::check(&self.app.store, self.def, self.ns, &name)?;
        if is_dry_run(self.q)? {
            let obj = self.app.store.prepare_new(obj);
            return self.respond(StatusCode::CREATED, obj, &warnings);
        }
        let stored = self
            .app
            .store
            .create(&self.def.group, &self.def.plural, obj)
            .map_err(|e| match e {
                StoreError::AlreadyExists => {
                    ApiError::already_exists(&self.def.group, &self.def.plural, &name)
                }
                other => self.store_err(other),
            })?;
        self.respond(StatusCode::CREATED, stored, &warnings)
    }

    /// Create-only review kinds (SelfSubjectReview): answered, never stored.
    fn review(&self, mut obj: Value) -> Result<Response, ApiError> {
        obj["metadata"] = json!({"creationTimestamp": null});
        obj["status"] =
            json!({"userInfo": {"username": self.user.name, "groups": self.user.groups}});
        self.respond(StatusCode::CREATED, obj, &[])
    }

    fn get(&self) -> Result<Response, ApiError> {
        let obj = self.current()?;
        self.respond(StatusCode::OK, obj, &[])
    }

    fn selectors(&self) -> Result<(LabelSelector, FieldSelector), ApiError> {
        let ls = LabelSelector::parse(
            self.q
                .get("labelSelector")
                .map(String::as_str)
                .unwrap_or(""),
        )?;
        let fs = FieldSelector::parse(
            self.q
                .get("fieldSelector")
                .map(String::as_str)
                .unwrap_or(""),
        )?;
        Ok((ls, fs))
    }

    fn list(&self) -> Result<Response, ApiError> {
        let (ls, fs) = self.selectors()?;
        let ns = (!self.ns.is_empty()).then_some(self.ns);
        let page = self.app.store.with_kind(
            &self.def.group,
            &self.def.plural,
            ns,
            |items, rv, compacted| {
                let items = items
                    .into_iter()
                    .filter(|o| ls.matches(o) && fs.matches(o))
                    .collect();
                crate::paging::page(items, self.q, rv, compacted)
            },
        )?;
        let (rv, items) = (page.resource_version, page.items);
        let items: Vec<Value> = items.into_iter().map(|o| self.present(o)).collect();
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some(token) = page.continue_token {
            meta["continue"] = json!(token);
        }
        if let Some(n) = page.remaining {
            meta["remainingItemCount"] = json!(n);
        }
        if wants_table(self.headers) {
            let include = IncludeObject::parse(self.q.get("includeObject").map(String::as_str));
            let mut t = table::table(self.def, &items, Some(rv), include);
            t["metadata"] = meta;
            return Ok(ok(&t));
        }
        Ok(ok(&json!({
            "apiVersion": self.def.api_version(self.version),
            "kind": format!("{}List", self.def.kind),
            "metadata": meta,
            "items": items,
        })))
    }

    /// Shared tail of PUT and PATCH: keeps status or spec as the subresource demands, checks
    /// the precondition, validates and stores.
    fn write(
        &self,
        mut new: Value,
        current: Value,
        status_only: bool,
        expected_rv: Option<u64>,
    ) -> Result<Response, ApiError> {
        if status_only {
            let status = new.get("status").cloned();
            new = current.clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    new.as_object_mut().expect("object").remove("status");
                }
            }
        } else if self.def.has_status {
            match current.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    new.as_object_mut().expect("object").remove("status");
                }
            }
        }
        let meta = meta_mut(&mut new);
        meta.insert("name".into(), json!(self.name));
        // Unchanged status is not re-validated on main-resource writes (CRD validation
        // ratcheting, GA since Kubernetes 1.33).
        let kept_status = if !status_only && self.def.has_status {
            new.as_object_mut().and_then(|m| m.remove("status"))
        } else {
            None
        };
        let warnings = self.validate(&mut new)?;
        if let Some(s) = kept_status {
            new["status"] = s;
        }
        if is_dry_run(self.q)? {
            let cur_rv: u64 = meta_str(&current, "resourceVersion").parse().unwrap_or(0);
            if expected_rv.is_some_and(|rv| rv != cur_rv) {
                return Err(self.store_err(StoreError::Conflict));
            }
            return self.respond(StatusCode::OK, new, &warnings);
        }
        let stored = self
            .app
            .store
            .update(&self.def.group, &self.def.plural, new, expected_rv)
            .map_err(|e| self.store_err(e))?;
        self.respond(StatusCode::OK, stored, &warnings)
    }

    fn update(&self, body: &Bytes, status_only: bool) -> Result<Response, ApiError> {
        let mut obj = self.decode(body)?;
        self.check_identity(&mut obj)?;
        let body_name = meta_str(&obj, "name").to_string();
        if body_name != self.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                self.name
            )));
        }
        let current = self.current()?;
        let rv_text = meta_str(&obj, "resourceVersion").to_string();
        let expected = if rv_text.is_empty() {
            // Custom resources refuse unconditional updates; built-in kinds allow them.
            if !self.def.group.is_empty() && !status_only {
                return Err(ApiError::invalid(
                    &self.def.group,
                    &self.def.kind,
                    self.name,
                    vec![crate::status::Cause {
                        reason: "FieldValueInvalid",
                        field: "metadata.resourceVersion".into(),
                        message: "Invalid value: 0x0: must be specified for an update".into(),
                    }],
                ));
            }
            None
        } else {
            Some(rv_text.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("invalid resourceVersion {rv_text:?}"))
            })?)
        };
        if !status_only {
            self.own_update(Some(&current), &mut obj);
        }
        self.write(obj, current, status_only, expected)
    }

    fn patch(&self, body: &Bytes, status_only: bool) -> Result<Response, ApiError> {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let kind = PatchType::from_content_type(ct)?;
        let patch = parse_yaml_or_json(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
        if kind == PatchType::Apply && self.q.get("fieldManager").is_none_or(|f| f.is_empty()) {
            return Err(ApiError::bad_request(
                "PATCH (apply): fieldManager is required for apply requests",
            ));
        }
        let current = match self.app.store.get(&self.key()) {
            Some(c) => c,
            None if kind == PatchType::Apply && !status_only => {
                // Server-side apply creates missing objects.
                let mut obj = crate::patch::without_directives(&patch);
                self.check_identity(&mut obj)?;
                if meta_str(&obj, "name") != self.name {
                    return Err(ApiError::bad_request(
                        "the name of the object does not match the name on the URL",
                    ));
                }
                let applied = obj.clone();
                self.own_apply(None, &applied, &mut obj)?;
                return self.create_object(obj);
            }
            None => {
                return Err(ApiError::not_found(
                    &self.def.group,
                    &self.def.plural,
                    self.name,
                ));
            }
        };
        let mut applied = patch.clone();
        if kind == PatchType::Apply {
            self.check_identity(&mut applied)?;
        }
        let mut new = current.clone();
        crate::patch::apply(kind, &mut new, &patch)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the patch result is not an object"));
        }
        match (status_only, kind) {
            (true, _) => {}
            (false, PatchType::Apply) => self.own_apply(Some(&current), &applied, &mut new)?,
            (false, _) => self.own_update(Some(&current), &mut new),
        }
        let cur_rv = meta_str(&current, "resourceVersion").to_string();
        let new_rv = meta_str(&new, "resourceVersion").to_string();
        // A patch that sets metadata.resourceVersion is a precondition.
        let expected = if !new_rv.is_empty() && new_rv != cur_rv {
            new_rv.parse().ok().or(Some(0))
        } else {
            None
        };
        meta_mut(&mut new).insert("namespace".into(), json!(self.ns));
        if !self.def.namespaced {
            meta_mut(&mut new).remove("namespace");
        }
        self.write(new, current, status_only, expected)
    }

    fn propagation(&self, body: &Bytes) -> Result<(Propagation, bool, Option<String>), ApiError> {
        let opts = if body.is_empty() {
            json!({})
        } else {
            parse_yaml_or_json(body).unwrap_or(json!({}))
        };
        let policy = self.q.get("propagationPolicy").cloned().or_else(|| {
            opts.get("propagationPolicy")
                .and_then(Value::as_str)
                .map(String::from)
        });
        let propagation = match policy.as_deref() {
            None | Some("Background") => Propagation::Cascade,
            Some("Foreground") => Propagation::Foreground,
            Some("Orphan") => Propagation::Orphan,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "unsupported propagationPolicy {other:?}"
                )));
            }
        };
        let dry = is_dry_run(self.q)?
            || opts
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        let precondition_uid = opts
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from);
        Ok((propagation, dry, precondition_uid))
    }

    fn delete(&self, body: &Bytes) -> Result<Response, ApiError> {
        let (propagation, dry, uid) = self.propagation(body)?;
        let current = self.current()?;
        if let Some(uid) = uid
            && uid != meta_str(&current, "uid")
        {
            return Err(ApiError::uid_precondition(
                &self.def.group,
                &self.def.plural,
                self.name,
                &uid,
                meta_str(&current, "uid"),
            ));
        }
        if dry {
            return self.respond(StatusCode::OK, current, &[]);
        }
        if propagation == Propagation::Foreground {
            let marked = crate::gc::delete_foreground(self.app, &self.key())
                .ok_or_else(|| self.store_err(StoreError::NotFound))?;
            return self.respond(StatusCode::OK, marked, &[]);
        }
        let deleted = self
            .app
            .store
            .delete(&self.key(), propagation)
            .ok_or_else(|| self.store_err(StoreError::NotFound))?;
        self.respond(StatusCode::OK, deleted, &[])
    }

    fn delete_collection(&self) -> Result<Response, ApiError> {
        let (ls, fs) = self.selectors()?;
        let (propagation, dry, _) = self.propagation(&Bytes::new())?;
        let ns = (!self.ns.is_empty()).then_some(self.ns);
        let (items, rv) = self.app.store.list(&self.def.group, &self.def.plural, ns);
        let mut deleted = vec![];
        for obj in items.into_iter().filter(|o| ls.matches(o) && fs.matches(o)) {
            if dry {
                deleted.push(self.present(obj));
            } else if let Some(d) = self.app.store.delete(
                &Key::of(&self.def.group, &self.def.plural, &obj),
                propagation,
            ) {
                deleted.push(self.present(d));
            }
        }
        Ok(ok(&json!({
            "apiVersion": self.def.api_version(self.version),
            "kind": format!("{}List", self.def.kind),
            "metadata": {"resourceVersion": rv.to_string()},
            "items": deleted,
        })))
    }
}

/// What a real server's create strategy fills in.
fn defaults_on_create(def: &ResourceDef, obj: &mut Value) {
    if def.group.is_empty() && def.plural == "namespaces" {
        let name = meta_str(obj, "name").to_string();
        obj["status"] = json!({"phase": "Active"});
        let labels = meta_mut(obj).entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
    }
}

trait KindHint {
    fn with_kind_hint(self, got: &str, want: &str) -> Self;
}

impl KindHint for ApiError {
    /// A kind mismatch reads better than the apiVersion message.
    fn with_kind_hint(mut self, got: &str, want: &str) -> Self {
        if !got.is_empty() && got != want {
            self.message =
                format!("the kind in the data ({got}) does not match the expected kind ({want})");
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_info() {
        let rp =
            parse_path("/apis/kubevirt.io/v1/namespaces/prod/virtualmachines/db.primary").unwrap();
        assert_eq!(
            (
                rp.group.as_str(),
                rp.namespace.as_deref(),
                rp.plural.as_str(),
                rp.name.as_deref()
            ),
            (
                "kubevirt.io",
                Some("prod"),
                "virtualmachines",
                Some("db.primary")
            )
        );
        let rp = parse_path("/api/v1/namespaces/dev").unwrap();
        assert_eq!(
            (rp.namespace, rp.plural.as_str(), rp.name.as_deref()),
            (None, "namespaces", Some("dev"))
        );
        let rp = parse_path("/api/v1/namespaces/dev/status").unwrap();
        assert_eq!(
            (rp.plural.as_str(), rp.name.as_deref(), rp.sub),
            ("namespaces", Some("dev"), vec!["status".to_string()])
        );
        let rp = parse_path("/api/v1/namespaces/dev/pods/p/log").unwrap();
        assert_eq!(
            (rp.namespace.as_deref(), rp.plural.as_str(), rp.sub),
            (Some("dev"), "pods", vec!["log".to_string()])
        );
        let rp = parse_path("/apis/kubevirt.io/v1/virtualmachines").unwrap();
        assert_eq!((rp.namespace, rp.name), (None, None));
        assert!(parse_path("/version").is_none());
    }
}
