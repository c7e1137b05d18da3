//! API aggregation, as kube-aggregator does it in front of kube-apiserver: an APIService
//! (`apiregistration.k8s.io/v1`) with `spec.service` makes `spec.group`/`spec.version` served
//! by proxy to that Service's endpoints.
//!
//! - discovery (`/apis`, `/apis/GROUP`) lists the APIServices' groups (`handler_apis.go`),
//! - everything under `/apis/GROUP/VERSION` is authorized here with RequestInfo attributes and
//!   then proxied (`handler_proxy.go`, `proxy.rs`),
//! - `available.rs` keeps each APIService's `Available` condition as the availability
//!   controller does; an APIService that is not Available answers `503 service unavailable`.
//!
//! Backends are resolved by endpoint routing (`--enable-aggregator-routing=true`): the
//! Service's port named by `spec.service.port` (default 443), then a ready address of the
//! Endpoints object of the same name with the port of the same port name, chosen at random for
//! each request. A request whose chosen endpoint is dead gets the proxy's `503` with the dial
//! error; the aggregator does not try another endpoint (see [`resolve`]).

pub mod available;
pub mod proxy;

use crate::core::app::App;
use crate::core::auth::{Attributes, User, authorize};
use crate::core::handlers::{Query, parse_path};
use crate::core::registry::compare_versions;
use crate::core::status::ApiError;
use crate::core::store::Key;
use axum::body::Bytes;
use axum::response::Response;
use http::{Method, StatusCode};
use serde_json::{Value, json};
use std::sync::Arc;

/// The APIService group.
pub const GROUP: &str = "apiregistration.k8s.io";

/// An APIService's backend: `spec.service` and what the proxy needs from the spec.
#[derive(Debug, Clone)]
pub struct Backend {
    /// APIService name (`VERSION.GROUP`).
    pub name: String,
    /// `spec.group`.
    pub group: String,
    /// `spec.version`.
    pub version: String,
    /// `spec.service.namespace`.
    pub namespace: String,
    /// `spec.service.name`.
    pub service: String,
    /// `spec.service.port` (443 when unset, as the APIService defaulting does).
    pub port: i64,
    /// `spec.caBundle` decoded (PEM).
    pub ca_bundle: Vec<u8>,
    /// `spec.insecureSkipTLSVerify`.
    pub insecure: bool,
    /// Whether the `Available` condition is True.
    pub available: bool,
}

impl Backend {
    fn of(obj: &Value) -> Option<Backend> {
        let spec = &obj["spec"];
        let svc = spec["service"].as_object()?;
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        use base64::Engine;
        let ca_bundle = base64::engine::general_purpose::STANDARD
            .decode(spec["caBundle"].as_str().unwrap_or_default())
            .unwrap_or_default();
        let available = obj["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        Some(Backend {
            name: s(&obj["metadata"]["name"]),
            group: s(&spec["group"]),
            version: s(&spec["version"]),
            namespace: svc.get("namespace").map(s).unwrap_or_default(),
            service: svc.get("name").map(s).unwrap_or_default(),
            port: svc.get("port").and_then(Value::as_i64).unwrap_or(443),
            ca_bundle,
            insecure: spec["insecureSkipTLSVerify"].as_bool().unwrap_or(false),
            available,
        })
    }

    /// The TLS server name the proxy verifies (`remote.BuildTransportConfig`:
    /// `NAME.NAMESPACE.svc`).
    pub fn server_name(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }
}

/// The stored APIServices with `spec.service`, as (object, backend).
pub fn remote(app: &App) -> Vec<(Value, Backend)> {
    app.store
        .list(GROUP, "apiservices", None)
        .0
        .into_iter()
        .filter_map(|o| Backend::of(&o).map(|b| (o, b)))
        .collect()
}

/// The backend serving `group/version`, if an APIService with a service registers it.
pub fn backend_for(app: &App, group: &str, version: &str) -> Option<Backend> {
    remote(app)
        .into_iter()
        .map(|(_, b)| b)
        .find(|b| b.group == group && b.version == version)
}

/// Adds the remote APIServices' groups to an `/apis` APIGroupList (handler_apis.go: APIServices
/// sorted by `groupPriorityMinimum`, then name, and within a group by `versionPriority`, then
/// version; the first version is the preferred one). A group the emulator serves itself keeps
/// its versions first.
pub fn merge_group_list(app: &App, list: &mut Value) {
    let mut services: Vec<Value> = remote(app).into_iter().map(|(o, _)| o).collect();
    let int = |o: &Value, f: &str| o["spec"][f].as_i64().unwrap_or(0);
    let text = |o: &Value, f: &str| o["spec"][f].as_str().unwrap_or_default().to_string();
    services.sort_by(|a, b| {
        int(b, "groupPriorityMinimum")
            .cmp(&int(a, "groupPriorityMinimum"))
            .then_with(|| text(a, "group").cmp(&text(b, "group")))
            .then_with(|| int(b, "versionPriority").cmp(&int(a, "versionPriority")))
            .then_with(|| compare_versions(&text(a, "version"), &text(b, "version")))
    });
    let Some(groups) = list["groups"].as_array_mut() else {
        return;
    };
    for svc in services {
        let (group, version) = (text(&svc, "group"), text(&svc, "version"));
        let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
        match groups.iter_mut().find(|g| g["name"] == group.as_str()) {
            Some(g) => {
                let versions = g["versions"].as_array_mut().expect("versions");
                if !versions.iter().any(|v| v["version"] == version.as_str()) {
                    versions.push(gv);
                }
            }
            None => groups
                .push(json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})),
        }
    }
}

/// `503` with body `service unavailable`: handler_proxy.go `proxyError(w, req, "service
/// unavailable", http.StatusServiceUnavailable)` for an APIService that is not Available or
/// whose endpoint does not resolve; `http.Error` writes it as text.
pub fn service_unavailable() -> Response {
    proxy::http_error(StatusCode::SERVICE_UNAVAILABLE, "service unavailable")
}

/// RequestInfo's verb for a resource request (k8s.io/apiserver/pkg/endpoints/request/
/// requestinfo.go): GET/HEAD get or list (watch with `watch=true`), POST create, PUT update,
/// PATCH patch, DELETE delete or deletecollection; other methods their lower-case name.
pub fn request_verb(method: &Method, named: bool, q: &Query) -> String {
    let watching = q
        .get("watch")
        .is_some_and(|w| !w.is_empty() && w != "0" && !w.eq_ignore_ascii_case("false"));
    match (method, named) {
        (&Method::GET | &Method::HEAD, true) => "get",
        (&Method::GET | &Method::HEAD, false) if watching => "watch",
        (&Method::GET | &Method::HEAD, false) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        (m, _) => return m.as_str().to_ascii_lowercase(),
    }
    .to_string()
}

/// Serves a request under `/apis/GROUP/VERSION` of an aggregated APIService: authorization of
/// resource requests, availability, endpoint resolution, then the proxy.
pub async fn serve(
    app: &Arc<App>,
    backend: Backend,
    user: &User,
    parts: &http::request::Parts,
    q: &Query,
    body: Bytes,
) -> Result<Response, ApiError> {
    let path = parts.uri.path();
    if let Some(rp) = parse_path(path).filter(|rp| !rp.plural.is_empty()) {
        let attrs = Attributes {
            verb: request_verb(&parts.method, rp.name.is_some(), q),
            group: rp.group.clone(),
            resource: rp.plural.clone(),
            // RequestInfo takes one subresource segment; deeper segments do not count.
            subresource: rp.sub.first().cloned().unwrap_or_default(),
            namespace: rp.namespace.clone().unwrap_or_default(),
            name: rp.name.clone().unwrap_or_default(),
        };
        authorize(&app.store, user, &attrs)?;
    }
    if !backend.available {
        return Ok(service_unavailable());
    }
    let Some(addr) = resolve(app, &backend) else {
        return Ok(service_unavailable());
    };
    let front_proxy = app.front_proxy.get().expect("set at start");
    let tls = proxy::client_config(&backend, Some(front_proxy), backend.insecure);
    let tls = match tls {
        Ok(tls) => tls,
        // handler_proxy.go: a transport that cannot be built is a 500 with its error.
        Err(e) => return Ok(proxy::http_error(StatusCode::INTERNAL_SERVER_ERROR, &e)),
    };
    let target = proxy::Target {
        addr,
        server_name: backend.server_name(),
        tls,
    };
    Ok(proxy::forward(&target, parts, user, body).await)
}

/// The `IP:PORT` to send a request for `backend` to, as kube-aggregator's endpoint routing
/// picks it for every proxied request (kube-aggregator `pkg/apiserver/resolvers.go`
/// `aggregatorEndpointRouting.ResolveEndpoint` → k8s.io/apiserver `pkg/util/proxy/proxy.go`
/// `ResolveEndpoint`): of every ready address ([`resolve_all`]), one chosen uniformly at random
/// (`rand.Intn`). `handler_proxy.go` resolves once per request and hands the one location to the
/// UpgradeAwareHandler: a dead endpoint is the responder's `503` with the dial error, never a
/// retry on another endpoint (`ResolveEndpointWithVisited`, the retrying resolver, serves
/// webhooks, not the proxy). None when anything is missing (`service unavailable`).
pub fn resolve(app: &App, backend: &Backend) -> Option<String> {
    let mut all = resolve_all(app, backend);
    if all.is_empty() {
        return None;
    }
    Some(all.swap_remove(random_below(all.len())))
}

/// Every `IP:PORT` the proxy may send a request for `backend` to (`ResolveEndpoints`): the
/// Service's port equal to `spec.service.port`, a ClusterIP, NodePort or LoadBalancer Service,
/// the Endpoints of the same name, each ready address of each subset with the port of the same
/// name as the Service's port, in order. Empty when anything is missing.
pub fn resolve_all(app: &App, backend: &Backend) -> Vec<String> {
    let Some(svc) = app.store.get(&Key::new(
        "",
        "services",
        &backend.namespace,
        &backend.service,
    )) else {
        return vec![];
    };
    let Some(port_name) = service_port_name(&svc, backend.port) else {
        return vec![];
    };
    let ty = svc["spec"]["type"].as_str().unwrap_or("ClusterIP");
    if !matches!(ty, "ClusterIP" | "NodePort" | "LoadBalancer") {
        return vec![];
    }
    let Some(eps) = app.store.get(&Key::new(
        "",
        "endpoints",
        &backend.namespace,
        &backend.service,
    )) else {
        return vec![];
    };
    ready_addresses(&eps, &port_name)
}

/// A uniformly random index below `n` (> 0), from the OS generator.
fn random_below(n: usize) -> usize {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random number generator failed");
    // n is tiny next to 2^64: the modulo bias is negligible.
    (u64::from_le_bytes(bytes) % n as u64) as usize
}

/// The name ("" when unnamed) of the Service port whose `port` is `port`.
pub fn service_port_name(svc: &Value, port: i64) -> Option<String> {
    svc["spec"]["ports"]
        .as_array()?
        .iter()
        .find(|p| p["port"].as_i64() == Some(port))
        .map(|p| p["name"].as_str().unwrap_or_default().to_string())
}

/// `IP:PORT` of every ready address of an Endpoints object with a port named `port_name`.
pub fn ready_addresses(eps: &Value, port_name: &str) -> Vec<String> {
    let mut out = vec![];
    for subset in eps["subsets"].as_array().into_iter().flatten() {
        for p in subset["ports"].as_array().into_iter().flatten() {
            if p["name"].as_str().unwrap_or_default() != port_name {
                continue;
            }
            let Some(port) = p["port"].as_i64() else {
                continue;
            };
            for a in subset["addresses"].as_array().into_iter().flatten() {
                let ip = a["ip"].as_str().unwrap_or_default();
                out.push(if ip.contains(':') {
                    format!("[{ip}]:{port}")
                } else {
                    format!("{ip}:{port}")
                });
            }
        }
    }
    out
}
