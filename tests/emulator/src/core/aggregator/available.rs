//! The `Available` condition of remote APIServices, as kube-aggregator's availability
//! controller keeps it (staging/src/k8s.io/kube-aggregator/pkg/controllers/status/remote/
//! remote_available_controller.go): the Service must exist; a ClusterIP Service must have the
//! port and endpoints with a ready address on that port's name; then a discovery GET of
//! `/apis/GROUP/VERSION` at the endpoint (front-proxy certificate, server certificate not
//! verified, as `system:kube-aggregator` in `system:masters`, 5 s timeout) must answer 2xx/3xx,
//! for one of five attempts made at once, each to an endpoint chosen at random.
//!
//! v1.36 reads EndpointSlices; the emulator reads the Endpoints object of the Service's name,
//! as the EndpointSlice mirroring controller would mirror it, and words the reasons as v1.36
//! does. Checks run when APIServices, Services or Endpoints change and every 30 s (the
//! controller's resync period).

use super::{GROUP, proxy};
use crate::core::app::App;
use crate::core::auth::User;
use crate::core::controllers::set_condition;
use crate::core::store::Key;
use axum::body::Body;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, watch};

/// How often every APIService is checked without a change (the controller's resync).
const RESYNC: Duration = Duration::from_secs(30);

/// Runs the checks until `shutdown` flips.
pub async fn run(app: Arc<App>, mut shutdown: watch::Receiver<bool>) {
    let mut rx = app.store.subscribe();
    let mut tick = tokio::time::interval(RESYNC);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let relevant = |k: &Key| {
        (k.group == GROUP && k.plural == "apiservices")
            || (k.group.is_empty() && matches!(k.plural.as_str(), "services" | "endpoints"))
    };
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tick.tick() => {}
            ev = rx.recv() => match ev {
                Err(broadcast::error::RecvError::Closed) => break,
                Ok(ev) if !relevant(&ev.key) => {
                    // Drain the rest of a burst, rechecking if any of it matters.
                    let mut any = false;
                    while let Ok(ev) = rx.try_recv() {
                        any |= relevant(&ev.key);
                    }
                    if !any {
                        continue;
                    }
                }
                _ => while rx.try_recv().is_ok() {},
            },
        }
        check_all(&app).await;
    }
}

/// Checks every remote APIService once and writes changed conditions.
pub async fn check_all(app: &App) {
    for (obj, backend) in super::remote(app) {
        let (ok, reason, message) = check(app, &backend).await;
        let mut status = obj["status"].clone();
        if !status.is_object() {
            status = serde_json::json!({});
        }
        let before = status.clone();
        set_condition(&mut status, "Available", ok, reason, &message);
        let unchanged = |a: &Value, b: &Value| {
            let cond = |s: &Value| {
                s["conditions"]
                    .as_array()
                    .and_then(|c| c.iter().find(|c| c["type"] == "Available").cloned())
            };
            cond(a) == cond(b)
        };
        if unchanged(&before, &status) {
            continue;
        }
        let key = Key::new(GROUP, "apiservices", "", &backend.name);
        app.store.modify(&key, |o| {
            // Skip a stale write if the APIService changed meanwhile (the next pass redoes it).
            if o["metadata"]["uid"] == obj["metadata"]["uid"] {
                o["status"] = status;
            }
        });
    }
}

/// One availability check: (available, reason, message).
async fn check(app: &App, backend: &super::Backend) -> (bool, &'static str, String) {
    let (ns, name) = (&backend.namespace, &backend.service);
    let Some(svc) = app.store.get(&Key::new("", "services", ns, name)) else {
        return (
            false,
            "ServiceNotFound",
            format!("service/{name} in \"{ns}\" is not present"),
        );
    };
    if svc["spec"]["type"].as_str().unwrap_or("ClusterIP") == "ClusterIP" {
        let Some(port_name) = super::service_port_name(&svc, backend.port) else {
            return (
                false,
                "ServicePortError",
                format!(
                    "service/{name} in \"{ns}\" is not listening on port {}",
                    backend.port
                ),
            );
        };
        let eps = app.store.get(&Key::new("", "endpoints", ns, name));
        let has_subsets = eps
            .as_ref()
            .and_then(|e| e["subsets"].as_array())
            .is_some_and(|s| !s.is_empty());
        if !has_subsets {
            return (
                false,
                "EndpointsNotFound",
                format!("cannot find endpointslices for service/{name} in \"{ns}\""),
            );
        }
        if eps
            .as_ref()
            .is_none_or(|e| super::ready_addresses(e, &port_name).is_empty())
        {
            return (
                false,
                "MissingEndpoints",
                format!(
                    "endpointslices for service/{name} in \"{ns}\" have no addresses with port name \"{port_name}\""
                ),
            );
        }
    }
    // Five discovery GETs at once, each to an endpoint resolved at random as the proxy does;
    // one success is enough, else the last error (remote_available_controller.go: `attempts :=
    // 5`, "if we had at least one success, we are successful overall").
    let attempts = (0..5).map(|_| async {
        let Some(addr) = super::resolve(app, backend) else {
            return Err(format!("no endpoints available for service \"{name}\""));
        };
        let url = format!("https://{addr}/apis/{}/{}", backend.group, backend.version);
        discovery_get(app, backend, &addr)
            .await
            .map_err(|e| format!("failing or missing response from {url}: {e}"))
    });
    let results = futures::future::join_all(attempts).await;
    match results.iter().find(|r| r.is_ok()) {
        Some(_) => (true, "Passed", "all checks passed".into()),
        None => (
            false,
            "FailedDiscoveryCheck",
            results
                .into_iter()
                .filter_map(Result::err)
                .next_back()
                .unwrap_or_default(),
        ),
    }
}

/// The discovery GET; Err is Go's wording of what went wrong.
async fn discovery_get(app: &App, backend: &super::Backend, addr: &str) -> Result<(), String> {
    let url = format!("https://{addr}/apis/{}/{}", backend.group, backend.version);
    let tls = proxy::client_config(backend, app.front_proxy.get(), true)?;
    let target = proxy::Target {
        addr: addr.to_string(),
        server_name: backend.server_name(),
        tls,
    };
    let mut request = http::Request::get(format!("/apis/{}/{}", backend.group, backend.version))
        .body(Body::empty())
        .expect("a valid request");
    let aggregator = User {
        name: "system:kube-aggregator".into(),
        groups: vec!["system:masters".into()],
        ..Default::default()
    };
    proxy::set_auth_proxy_headers(request.headers_mut(), &aggregator);
    request.headers_mut().insert(
        http::header::HOST,
        http::HeaderValue::from_str(addr).map_err(|e| e.to_string())?,
    );
    let resp = proxy::round_trip(&target, request, Some(Duration::from_secs(5)))
        .await
        .map_err(|e| format!("Get \"{url}\": {e}"))?;
    let code = resp.status().as_u16();
    if !(200..300).contains(&code) {
        return Err(format!("bad status from {url}: {code}"));
    }
    Ok(())
}
