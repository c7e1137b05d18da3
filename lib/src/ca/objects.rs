//! The Kubernetes objects around the CA besides its Secret and ConfigMap: the namespace, and
//! the Role/RoleBinding that let every authenticated user read the public keys.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::CONFIGMAP_NAME;

/// Name of the Role and RoleBinding that grant read access to the public-key ConfigMap.
pub const READER_NAME: &str = "kubevm-ssh-ca-reader";
/// The group every authenticated user belongs to.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// Metadata with kubectl-vm's managed-by label.
pub(crate) fn metadata(name: &str, namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(namespace.to_string()),
        labels: Some(BTreeMap::from([(
            "app.kubernetes.io/managed-by".to_string(),
            "kubectl-vm".to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

/// The namespace that holds the CA.
pub fn namespace(name: &str) -> Namespace {
    let mut meta = metadata(name, "");
    meta.namespace = None;
    Namespace {
        metadata: meta,
        ..Namespace::default()
    }
}

/// A Role allowing `get` on the public-key ConfigMap only.
pub fn reader_role(namespace: &str) -> Role {
    Role {
        metadata: metadata(READER_NAME, namespace),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![CONFIGMAP_NAME.into()]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        }]),
    }
}

/// Binds [`reader_role`] to every authenticated user.
pub fn reader_role_binding(namespace: &str) -> RoleBinding {
    RoleBinding {
        metadata: metadata(READER_NAME, namespace),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: READER_NAME.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Group".into(),
            name: AUTHENTICATED_GROUP.into(),
            namespace: None,
        }]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_grants_get_on_the_configmap_only() {
        let role = serde_json::to_value(reader_role("kubevm-system")).unwrap();
        assert_eq!(role["metadata"]["namespace"], "kubevm-system");
        assert_eq!(
            role["rules"],
            serde_json::json!([{"apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": ["kubevm-ssh-ca"], "verbs": ["get"]}])
        );
        let binding = serde_json::to_value(reader_role_binding("kubevm-system")).unwrap();
        assert_eq!(binding["subjects"][0]["name"], "system:authenticated");
        assert_eq!(binding["subjects"][0]["kind"], "Group");
        assert_eq!(binding["roleRef"]["name"], READER_NAME);
        let ns = serde_json::to_value(namespace("kubevm-system")).unwrap();
        assert_eq!(ns["metadata"]["name"], "kubevm-system");
        assert!(ns["metadata"].get("namespace").is_none());
    }
}
