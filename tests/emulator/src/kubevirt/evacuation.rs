//! KubeVirt's evacuation: the controller that migrates a VMI marked for eviction off its node,
//! and virt-api's `evacuate/cancel` subresource that takes the mark away.
//!
//! - `PUT /apis/subresources.kubevirt.io/v1/namespaces/NS/{virtualmachines|virtualmachineinstances}/NAME/evacuate/cancel`
//!   with an `EvacuateCancelOptions{evacuationNodeName, dryRun}` body (kubevirt
//!   `pkg/virt-api/api.go`, routes `vm-evacuatecancel`/`vmi-evacuatecancel`, since v1.8.0;
//!   handler `pkg/virt-api/rest/evacuate_cancel.go`): the VMI (for a VM: the VM must exist and
//!   be created, its VMI must exist, `FetchVirtualMachineInstanceForVM` in
//!   `pkg/virt-api/rest/subresource.go`) is checked against the node drain taint
//!   (`kubevirt.io/drain:NoSchedule` by default, `pkg/virt-config/configuration.go`: 400
//!   `Node "N" has NodeDrainTaintKey "…"` while the node carries it); a VMI without
//!   `status.evacuationNodeName` answers 200 and nothing changes; otherwise a JSON patch
//!   `test` of `/status/evacuationNodeName` against the body's `evacuationNodeName` and a
//!   `remove` of it (a failing test: 500 InternalError), with the body's dryRun.
//! - The evacuation controller (`pkg/virt-controller/watch/drain/evacuation/evacuation.go`):
//!   a running, live-migratable VMI still on the node its `status.evacuationNodeName` names
//!   (`hasMigratedOnEviction` is false) and without an active migration gets a
//!   VirtualMachineInstanceMigration `generateName: kubevirt-evacuation-`, annotated
//!   `kubevirt.io/evacuationMigration: NODE` (`GenerateNewMigration`), priority
//!   `system-critical`. The mutating webhook labels it `kubevirt.io/vmi-name`.

use crate::core::app::App;
use crate::core::handlers::{Query, ResourcePath};
use crate::core::status::ApiError;
use crate::core::store::Key;
use crate::core::util::{meta_str, random_suffix};
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};

const KV: &str = "kubevirt.io";
/// `virtv1.EvacuationMigrationAnnotation` (`staging/src/kubevirt.io/api/core/v1/types.go`).
pub const EVACUATION_ANNOTATION: &str = "kubevirt.io/evacuationMigration";
/// `NodeDrainTaintDefaultKey` (`pkg/virt-config/configuration.go`).
const DRAIN_TAINT: &str = "kubevirt.io/drain";

/// `PUT …/evacuate/cancel` on a VM or VMI; `None` for any other request.
pub fn action(
    app: &App,
    rp: &ResourcePath,
    q: &Query,
    body: &Bytes,
) -> Option<Result<Response, ApiError>> {
    if rp.group != "subresources.kubevirt.io" || rp.sub.len() != 2 {
        return None;
    }
    if (rp.sub[0].as_str(), rp.sub[1].as_str()) != ("evacuate", "cancel") {
        return None;
    }
    let ns = rp.namespace.as_deref().unwrap_or("");
    let name = rp.name.as_deref().unwrap_or("");
    Some(match rp.plural.as_str() {
        "virtualmachines" | "virtualmachineinstances" => cancel(app, &rp.plural, ns, name, q, body),
        _ => Err(ApiError::path_not_found()),
    })
}

fn cancel(
    app: &App,
    plural: &str,
    ns: &str,
    name: &str,
    q: &Query,
    body: &Bytes,
) -> Result<Response, ApiError> {
    if plural == "virtualmachines" {
        let vm = app
            .store
            .get(&Key::new(KV, "virtualmachines", ns, name))
            .ok_or_else(|| ApiError::not_found(KV, "virtualmachines", name))?;
        if vm.pointer("/status/created") != Some(&json!(true)) {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on virtualmachine.kubevirt.io \"{name}\": VMI is not started"
                ),
            ));
        }
    }
    let vmi_key = Key::new(KV, "virtualmachineinstances", ns, name);
    let vmi = app
        .store
        .get(&vmi_key)
        .ok_or_else(|| ApiError::not_found(KV, "virtualmachineinstances", name))?;
    let status_node = |field: &str| {
        vmi.pointer(&format!("/status/{field}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let evacuation_node = status_node("evacuationNodeName");
    // validateEvacuationNode: the node the VMI is evacuated from (else its own node).
    let checked = if evacuation_node.is_empty() {
        status_node("nodeName")
    } else {
        evacuation_node.clone()
    };
    let node = app
        .store
        .get(&Key::new("", "nodes", "", &checked))
        .ok_or_else(|| {
            ApiError::internal(format!(
                "Internal error occurred: nodes \"{checked}\" not found"
            ))
        })?;
    let tainted = node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|ts| {
            ts.iter()
                .any(|t| t["key"] == DRAIN_TAINT && t["effect"] == "NoSchedule")
        });
    if tainted {
        return Err(ApiError::bad_request(format!(
            "Node \"{checked}\" has NodeDrainTaintKey \"{DRAIN_TAINT}:NoSchedule\""
        )));
    }
    if evacuation_node.is_empty() {
        return Ok((StatusCode::OK, "").into_response());
    }
    // decodeBody: an empty body decodes to empty options (io.EOF is no error).
    let opts: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "Can not unmarshal Request body to struct, error: {e}"
            ))
        })?
    };
    let wanted = opts["evacuationNodeName"].as_str().unwrap_or("");
    if wanted != evacuation_node {
        return Err(ApiError::internal(format!(
            "Internal error occurred: the server rejected our request due to an error in our request: testing value /status/evacuationNodeName failed: {evacuation_node:?} is not {wanted:?}"
        )));
    }
    let dry = opts["dryRun"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == "All"))
        || q.get("dryRun").is_some_and(|v| v == "All");
    if !dry {
        app.store.modify(&vmi_key, |o| {
            if let Some(st) = o["status"].as_object_mut() {
                st.remove("evacuationNodeName");
            }
        });
    }
    Ok((StatusCode::OK, "").into_response())
}

/// The evacuation controller's pass over every VMI (settled or not: it changes no VMI, it
/// only creates the migration a drain asks for).
pub fn controller(app: &App) {
    if app
        .registry
        .find_plural(KV, "virtualmachineinstancemigrations")
        .is_none()
    {
        return;
    }
    let (vmis, _) = app.store.list(KV, "virtualmachineinstances", None);
    for vmi in vmis {
        let node = vmi
            .pointer("/status/evacuationNodeName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if node.is_empty()
            || vmi.pointer("/status/nodeName").and_then(Value::as_str) != Some(node)
            || vmi.pointer("/status/phase").and_then(Value::as_str) != Some("Running")
            || vmi.pointer("/metadata/deletionTimestamp").is_some()
        {
            continue;
        }
        let migratable = crate::core::table::eval_first(
            &vmi,
            ".status.conditions[?(@.type=='LiveMigratable')].status",
        ) == Some(&json!("True"));
        if !migratable {
            continue;
        }
        let ns = meta_str(&vmi, "namespace");
        let name = meta_str(&vmi, "name");
        let (migrations, _) = app
            .store
            .list(KV, "virtualmachineinstancemigrations", Some(ns));
        let active = migrations.iter().any(|m| {
            m.pointer("/spec/vmiName").and_then(Value::as_str) == Some(name)
                && !matches!(
                    m.pointer("/status/phase").and_then(Value::as_str),
                    Some("Succeeded" | "Failed")
                )
        });
        // Upstream retries a failed evacuation with a backoff (the migration controller's);
        // the emulator does not retry: one failed evacuation migration stays the last.
        let failed_before = migrations.iter().any(|m| {
            m.pointer("/spec/vmiName").and_then(Value::as_str) == Some(name)
                && m.pointer("/metadata/annotations")
                    .and_then(|a| a.get(EVACUATION_ANNOTATION))
                    .is_some()
                && m.pointer("/status/phase").and_then(Value::as_str) == Some("Failed")
        });
        if active || failed_before {
            continue;
        }
        let vmim = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": format!("kubevirt-evacuation-{}", random_suffix(5)), "namespace": ns,
                         "labels": {"kubevirt.io/vmi-name": name},
                         "annotations": {EVACUATION_ANNOTATION: node},
                         "finalizers": ["kubevirt.io/migrationJobFinalize"]},
            "spec": {"vmiName": name, "priority": "system-critical"},
        });
        let _ = app
            .store
            .create(KV, "virtualmachineinstancemigrations", vmim);
    }
}
