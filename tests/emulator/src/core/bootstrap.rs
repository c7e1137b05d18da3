//! What a fresh cluster's control plane writes at start that aggregated API servers rely on:
//! the bootstrap RBAC they bind to (`system:auth-delegator`,
//! `kube-system/extension-apiserver-authentication-reader`) and the ConfigMap
//! `kube-system/extension-apiserver-authentication` describing how to trust the front proxy.

use crate::core::app::App;
use crate::core::registry::Registry;
use crate::core::tls::{FRONT_PROXY_CLIENT_CN, FrontProxy};
use serde_json::{Value, json};
use std::collections::BTreeMap;

const RBAC: &str = "rbac.authorization.k8s.io/v1";

/// Labels and annotation every bootstrap policy object carries
/// (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go `addDefaultMetadata`).
fn bootstrap_meta(name: &str, namespace: Option<&str>) -> Value {
    let mut meta = json!({
        "name": name,
        "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
        "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"},
    });
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    meta
}

/// The bootstrap RBAC objects the emulator seeds.
pub fn policy() -> Vec<Value> {
    vec![
        // bootstrappolicy/policy.go ClusterRoles(): system:auth-delegator.
        json!({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": bootstrap_meta("system:auth-delegator", None),
        "rules": [
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
        ]}),
        // bootstrappolicy/namespace_policy.go: the reader Role and its binding to the
        // controller manager and scheduler.
        json!({"apiVersion": RBAC, "kind": "Role",
            "metadata": bootstrap_meta("extension-apiserver-authentication-reader", Some("kube-system")),
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": ["extension-apiserver-authentication"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": RBAC, "kind": "RoleBinding",
        "metadata": bootstrap_meta("system::extension-apiserver-authentication-reader", Some("kube-system")),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "extension-apiserver-authentication-reader"},
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-controller-manager"},
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-scheduler"},
        ]}),
    ]
}

/// The namespace the test user `alice` may read.
pub const ALICE_NAMESPACE: &str = "dev";
/// The RoleBinding that gives `alice` her rights (delete it for a user with none).
pub const ALICE_BINDING: &str = "kubevm-emulator:alice-view";
/// The ClusterRole it binds.
pub const VIEW_ROLE: &str = "kubevm-emulator:view";

/// The test user `alice`'s rights, as real RBAC objects an administrator could write: a
/// ClusterRole reading (get/list/watch) every namespaced resource this flavor serves except
/// Secrets, naming resources only, so no subresource (console, VNC, port-forward, exec, logs:
/// what Kubernetes' `view` ClusterRole also leaves out, bootstrappolicy/policy.go), bound to
/// `alice` in namespace `dev` by a RoleBinding. Anything more a test gives her with its own
/// Role, as on a real cluster.
pub fn alice_view(registry: &Registry) -> Vec<Value> {
    let mut by_group: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for def in registry.resources.iter().filter(|d| d.namespaced) {
        if def.group.is_empty() && def.plural == "secrets" {
            continue;
        }
        by_group.entry(&def.group).or_default().push(&def.plural);
    }
    let rules: Vec<Value> = by_group
        .into_iter()
        .map(|(group, plurals)| {
            json!({"apiGroups": [group], "resources": plurals, "verbs": ["get", "list", "watch"]})
        })
        .collect();
    vec![
        json!({"apiVersion": RBAC, "kind": "ClusterRole", "metadata": {"name": VIEW_ROLE},
            "rules": rules}),
        json!({"apiVersion": RBAC, "kind": "RoleBinding",
            "metadata": {"name": ALICE_BINDING, "namespace": ALICE_NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": VIEW_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}),
    ]
}

/// `kube-system/extension-apiserver-authentication` as kube-apiserver's
/// cluster-authentication-trust controller writes it
/// (pkg/controlplane/controller/clusterauthenticationtrust `getConfigMapDataFor`): the client
/// CA, and with a request-header CA the JSON string lists of the request-header flags.
/// `requestheader-uid-headers` is always written there; it is `[]` as on a cluster whose
/// kube-apiserver has no `--requestheader-uid-headers` (kubeadm sets none).
pub fn authentication_configmap(client_ca_pem: &str, front_proxy: &FrontProxy) -> Value {
    let list = |v: &[&str]| serde_json::to_string(v).unwrap_or_default();
    json!({"apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
    "data": {
        "client-ca-file": client_ca_pem,
        "requestheader-client-ca-file": front_proxy.ca_pem,
        "requestheader-allowed-names": list(&[FRONT_PROXY_CLIENT_CN]),
        "requestheader-username-headers": list(&["X-Remote-User"]),
        "requestheader-uid-headers": list(&[]),
        "requestheader-group-headers": list(&["X-Remote-Group"]),
        "requestheader-extra-headers-prefix": list(&["X-Remote-Extra-"]),
    }})
}

/// Seeds the bootstrap policy, `alice`'s rights and the authentication ConfigMap.
pub fn seed(app: &App, client_ca_pem: &str, front_proxy: &FrontProxy) -> Result<(), String> {
    for obj in policy().into_iter().chain(alice_view(&app.registry)) {
        app.put(obj)?;
    }
    app.put(authentication_configmap(client_ca_pem, front_proxy))?;
    Ok(())
}
