//! Subresource-only API groups (KubeVirt's `subresources.kubevirt.io` served by virt-api,
//! Deckhouse's `subresources.virtualization.deckhouse.io`).
//!
//! Implemented so far: `GET /apis/subresources.kubevirt.io/v1/version` and `/healthz`.
//! Everything else is authorized and checked for the target object like the real API, then
//! answered with 501 `NotImplemented` — never a fake success. New handlers (start/stop/restart,
//! console, VNC and port-forward websockets, …) belong in [`action`].

use crate::core::app::App;
use crate::core::auth::{Attributes, User, authorize};
use crate::core::handlers::{Query, ResourcePath, json_response};
use crate::core::status::ApiError;
use crate::core::store::Key;
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::{Method, StatusCode};
use serde_json::json;
use std::sync::Arc;

/// The KubeVirt version virt-api reports.
pub const KUBEVIRT_VERSION: &str = "v1.9.0";

/// Handles a request under a subresource-only group.
pub async fn handle(
    app: &Arc<App>,
    user: &User,
    rp: &ResourcePath,
    parts: &mut http::request::Parts,
    q: &Query,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let method = &parts.method.clone();
    if rp.group == "subresources.kubevirt.io" && rp.namespace.is_none() {
        match (method, rp.plural.as_str()) {
            (&Method::GET, "version") => {
                return Ok(json_response(
                    StatusCode::OK,
                    &json!({
                        "gitVersion": KUBEVIRT_VERSION,
                        "gitCommit": "0000000000000000000000000000000000000000",
                        "gitTreeState": "clean",
                        "buildDate": "2026-04-01T00:00:00Z",
                        "goVersion": "go1.24.9",
                        "compiler": "gc",
                        "platform": "linux/amd64"
                    }),
                    &[],
                ));
            }
            (&Method::GET, "healthz") => return Ok((StatusCode::OK, "ok").into_response()),
            _ => {}
        }
    }
    let (Some(ns), Some(name), Some(sub)) =
        (rp.namespace.as_deref(), rp.name.as_deref(), rp.sub.first())
    else {
        return Err(ApiError::path_not_found());
    };
    // kube-apiserver authorizes a request for an aggregated API before it proxies it, with the
    // attributes of k8s.io/apiserver/pkg/endpoints/request/requestinfo.go: the verb from the
    // method (GET of a named object `get`, also for a websocket upgrade; PUT `update`; POST
    // `create`), the URL's group, resource and name, and its first segment after the name as
    // the subresource (`vnc/screenshot` is authorized as `vnc`). RBAC decides, as for any other
    // request: KubeVirt's `kubevirt.io:edit`/`admin` grant `get` on
    // `virtualmachineinstances/console|vnc|portforward` and `update` on
    // `virtualmachines/start|stop|restart|migrate|addvolume|removevolume`
    // (pkg/virt-operator/resource/generate/rbac/cluster.go); Deckhouse's capabilities grant
    // get/create/update on `virtualmachines/console|vnc` and `virtualmachines/portforward`
    // (deckhouse/virtualization templates/rbacv2/use/capabilities/access_console.yaml,
    // forward_port.yaml).
    let verb = match *method {
        Method::GET => "get",
        Method::PUT => "update",
        Method::POST => "create",
        _ => {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
    };
    authorize(
        &app.store,
        user,
        &Attributes {
            verb: verb.into(),
            group: rp.group.clone(),
            resource: rp.plural.clone(),
            subresource: sub.clone(),
            namespace: ns.into(),
            name: name.into(),
        },
    )?;
    if let Some(rule) = app.take_failure(sub, &rp.plural, name) {
        return Err(ApiError::from_code(rule.code, rule.message));
    }
    // The target must exist (virt-api answers 404 with the object's own Status).
    let (group, plural) = match (rp.group.as_str(), rp.plural.as_str()) {
        ("subresources.kubevirt.io", p) => ("kubevirt.io", p),
        ("subresources.virtualization.deckhouse.io", p) => ("virtualization.deckhouse.io", p),
        _ => return Err(ApiError::path_not_found()),
    };
    if app.registry.find_plural(group, plural).is_none() {
        return Err(ApiError::path_not_found());
    }
    if app.store.get(&Key::new(group, plural, ns, name)).is_none() {
        return Err(ApiError::not_found(group, plural, name));
    }
    if let Some(answer) = crate::kubevirt::guestagent::answer(app, &rp.plural, ns, name, sub) {
        return answer.map(|v| json_response(StatusCode::OK, &v, &[]));
    }
    if group == "kubevirt.io"
        && *method == Method::GET
        && let Some(answer) =
            crate::kubevirt::objectgraph::answer(app, &rp.plural, ns, name, sub, body)
    {
        return answer.map(|v| json_response(StatusCode::OK, &v, &[]));
    }
    // Websocket streams (console, VNC, Deckhouse's session probe) live in `streams`.
    if let Some(response) = crate::core::streams::handle(app, user, rp, parts, q).await {
        return response;
    }
    if let Some(response) = crate::core::portforward::handle(app, rp, parts, q).await {
        return response;
    }
    action(app, rp, sub, q, body).await
}

/// Dispatches one subresource action on an existing object.
async fn action(
    app: &Arc<App>,
    rp: &ResourcePath,
    sub: &str,
    q: &Query,
    body: &Bytes,
) -> Result<Response, ApiError> {
    // start/stop/restart/migrate, pause/unpause/softreboot.
    if let Some(result) = crate::core::lifecycle::action(app, rp, sub, q, body) {
        return result;
    }
    // memorydump/removememorydump (memory_dump.rs).
    if let Some(result) = crate::kubevirt::memory_dump::action(app, rp, sub, q, body) {
        return result;
    }
    // evacuate/cancel (evacuation.rs).
    if let Some(result) = crate::kubevirt::evacuation::action(app, rp, q, body) {
        return result;
    }
    // addvolume/removevolume.
    if let Some(result) = crate::kubevirt::hotplug::action(app, rp, sub, q, body) {
        return result;
    }
    Err(ApiError::new(
        501,
        "NotImplemented",
        format!(
            "kubevm-emulator does not implement {}/{sub} in {}/{} yet",
            rp.plural, rp.group, rp.version
        ),
    ))
}
