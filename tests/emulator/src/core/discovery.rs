//! Legacy discovery documents: `/version`, `/api`, `/apis`, `/api/v1`, `/apis/G/V`.
//! Aggregated discovery (`as=APIGroupDiscoveryList`) is not offered: clients asking for it get
//! the legacy document with `Content-Type: application/json` and fall back, as with an old server.

use crate::core::registry::{Registry, compare_versions};
use serde_json::{Value, json};

/// The Kubernetes version the emulator claims to be.
pub const KUBE_GIT_VERSION: &str = "v1.36.0";

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1", "minor": "36",
        "emulationMajor": "1", "emulationMinor": "36",
        "minCompatibilityMajor": "1", "minCompatibilityMinor": "35",
        "gitVersion": KUBE_GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-04-22T00:00:00Z",
        "goVersion": "go1.26.2",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `/api`.
pub fn core_versions(port: u16) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": format!("127.0.0.1:{port}")}]
    })
}

/// `/apis`.
pub fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg
        .groups()
        .into_iter()
        .map(|(g, versions)| {
            let vs: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
                .collect();
            json!({"name": g, "versions": vs, "preferredVersion": vs[0].clone()})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/G` (one group), or None if not served.
pub fn group(reg: &Registry, name: &str) -> Option<Value> {
    let list = group_list(reg);
    let g = list["groups"]
        .as_array()?
        .iter()
        .find(|g| g["name"] == name)?
        .clone();
    let mut g = g;
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

/// `/api/v1` or `/apis/G/V`, or None if that group/version is not served.
pub fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut resources = vec![];
    for r in reg
        .resources
        .iter()
        .filter(|r| r.group == group && r.serves(version))
    {
        let mut e = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            e["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            e["categories"] = json!(r.categories);
        }
        resources.push(e);
        if r.has_status {
            resources.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        for sub in &r.extra_subresources {
            if *sub == "token" {
                // serviceaccounts/token answers a TokenRequest (pkg/registry/core/serviceaccount).
                resources.push(json!({"name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced,
                    "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
                continue;
            }
            resources.push(json!({"name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": r.kind, "verbs": ["get"]}));
        }
    }
    if let Some(a) = reg.aggregated(group, version) {
        for (name, namespaced, verbs) in &a.entries {
            resources.push(json!({"name": name, "singularName": "", "namespaced": namespaced, "kind": "", "verbs": verbs}));
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// Whether any version of `group` is served, and its versions (most preferred first).
pub fn versions_of(reg: &Registry, group: &str) -> Vec<String> {
    let mut v: Vec<String> = reg
        .groups()
        .into_iter()
        .find(|(g, _)| g == group)
        .map(|(_, v)| v)
        .unwrap_or_default();
    v.sort_by(|a, b| compare_versions(a, b));
    v
}
