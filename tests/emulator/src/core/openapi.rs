//! OpenAPI v3 documents, as much as kubectl needs.
//!
//! kubectl (create/apply/replace with the default `--validate=strict`) fetches `/openapi/v3`,
//! then the document of the object's group/version, and looks for a PATCH operation tagged with
//! the object's `x-kubernetes-group-version-kind` that accepts the `fieldValidation` query
//! parameter. If it finds one, it leaves validation to the server and sends
//! `fieldValidation=Strict`. So each document lists the resource paths with their operations
//! and parameters. Component schemas are omitted on purpose: kubectl then uses a JSON merge
//! patch for `apply` on custom kinds, exactly as on a real cluster (and `kubectl explain` is
//! not supported).

use crate::core::registry::{Registry, ResourceDef};
use serde_json::{Map, Value, json};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// FNV-1a, to give each document a stable `hash` like the real server does.
fn hash(s: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100000001b3);
    }
    format!("{h:016X}")
}

/// Every served group/version.
fn group_versions(reg: &Registry) -> Vec<(String, String)> {
    let mut out = vec![("".to_string(), "v1".to_string())];
    for (g, vs) in reg.groups() {
        for v in vs {
            out.push((g.clone(), v));
        }
    }
    out
}

/// `/openapi/v3`: the discovery document listing one URL per group/version.
pub fn root(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for (g, v) in group_versions(reg) {
        let p = gv_path(&g, &v);
        let doc = document(reg, &g, &v)
            .map(|d| d.to_string())
            .unwrap_or_default();
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", hash(&doc))}),
        );
    }
    json!({"paths": paths})
}

fn param(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

fn operations(def: &ResourceDef, version: &str, item: bool) -> Value {
    let gvk = json!({"group": def.group, "version": version, "kind": def.kind});
    let op = |action: &str, params: Vec<Value>| {
        json!({"operationId": format!("{action}{}", def.kind), "x-kubernetes-action": action,
               "x-kubernetes-group-version-kind": gvk, "parameters": params,
               "responses": {"200": {"description": "OK"}}})
    };
    let write = || {
        vec![
            param("dryRun"),
            param("fieldManager"),
            param("fieldValidation"),
        ]
    };
    if item {
        let mut patch_params = write();
        patch_params.push(param("force"));
        json!({"get": op("get", vec![]), "put": op("put", write()), "patch": op("patch", patch_params),
               "delete": op("delete", vec![param("dryRun"), param("propagationPolicy")])})
    } else {
        json!({"get": op("list", vec![param("labelSelector"), param("fieldSelector"), param("watch")]),
               "post": op("post", write())})
    }
}

/// `/openapi/v3/api/v1`, `/openapi/v3/apis/G/V`.
pub fn document(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let defs: Vec<_> = reg
        .resources
        .iter()
        .filter(|r| r.group == group && r.serves(version))
        .collect();
    if defs.is_empty() && reg.aggregated(group, version).is_none() {
        return None;
    }
    let prefix = format!("/{}", gv_path(group, version));
    let mut paths = Map::new();
    for def in defs {
        let base = if def.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}", def.plural)
        } else {
            format!("{prefix}/{}", def.plural)
        };
        if !def.stored {
            // Create-only kinds get a PATCH entry too: there is no /openapi/v2 here, so kubectl
            // must find fieldValidation support in v3 or it cannot validate at all.
            let mut ops = operations(def, version, false);
            ops["patch"] = operations(def, version, true)["patch"].clone();
            paths.insert(base, ops);
            continue;
        }
        paths.insert(base.clone(), operations(def, version, false));
        paths.insert(format!("{base}/{{name}}"), operations(def, version, true));
        if def.has_status {
            paths.insert(
                format!("{base}/{{name}}/status"),
                operations(def, version, true),
            );
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": crate::core::discovery::KUBE_GIT_VERSION},
        "paths": paths,
        "components": {"schemas": {}}
    }))
}
