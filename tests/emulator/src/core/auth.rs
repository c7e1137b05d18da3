//! Authentication (bearer tokens for the two users of the generated kubeconfig) and the
//! authorizer: members of `system:masters` (`admin`) may do anything, as kube-apiserver's
//! `system:masters` short-circuit does; everyone may create a SelfSubjectReview
//! (`system:basic-user`); everything else, subresources of aggregated APIs included, is decided
//! by the stored RBAC objects alone ([`rbac_allows`]: RoleBindings in the request's namespace
//! and ClusterRoleBindings to the user or their groups). `alice`'s rights are such objects too
//! (`bootstrap::alice_view`: read in namespace `dev`, no Secrets, no subresources). Denials carry
//! the real API server's wording.

use crate::core::status::ApiError;
use crate::core::store::{Key, Store};
use crate::core::util::random_token;
use serde_json::Value;
use std::collections::BTreeMap;

/// An authenticated user (`user.Info`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    /// Username (`admin`, `alice`, `system:serviceaccount:NS:NAME`).
    pub name: String,
    /// UID ("" for the token users; a ServiceAccount's uid for its tokens).
    pub uid: String,
    /// Groups, as a SelfSubjectReview reports them.
    pub groups: Vec<String>,
    /// Extra attributes (`authentication.kubernetes.io/credential-id` of ServiceAccount tokens).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// Whether this is a ServiceAccount (`system:serviceaccount:NS:NAME`).
    pub fn is_service_account(&self) -> bool {
        self.name.starts_with("system:serviceaccount:")
    }
}

/// The bearer tokens of this emulator instance (random per start).
#[derive(Debug, Clone)]
pub struct Tokens {
    /// Token of `admin`.
    pub admin: String,
    /// Token of `alice`.
    pub alice: String,
}

impl Tokens {
    /// Fresh random tokens.
    pub fn generate() -> Self {
        Tokens {
            admin: random_token(),
            alice: random_token(),
        }
    }

    /// The user presenting `Authorization: Bearer <token>`, if valid.
    pub fn authenticate(&self, authorization: Option<&str>) -> Option<User> {
        let token = authorization?.strip_prefix("Bearer ")?.trim();
        if token == self.admin {
            Some(User {
                name: "admin".into(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
                ..Default::default()
            })
        } else if token == self.alice {
            Some(User {
                name: "alice".into(),
                groups: vec!["system:authenticated".into()],
                ..Default::default()
            })
        } else {
            None
        }
    }
}

/// Apply `Impersonate-User`/`Impersonate-Group` headers: only members of `system:masters`
/// may impersonate (as if bound to a role with the `impersonate` verb); anyone else gets the
/// real API server's Forbidden. Impersonated users are in `system:authenticated` too.
pub fn impersonate(
    user: User,
    as_user: Option<&str>,
    as_groups: Vec<String>,
) -> Result<User, ApiError> {
    let Some(name) = as_user else {
        if as_groups.is_empty() {
            return Ok(user);
        }
        return Err(ApiError::bad_request(
            "requested impersonation of groups without impersonating a user",
        ));
    };
    if !user.groups.iter().any(|g| g == "system:masters") {
        let why = format!(
            "User \"{}\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope",
            user.name
        );
        return Err(ApiError::forbidden("", "users", name, &why));
    }
    let mut groups = as_groups;
    groups.push("system:authenticated".into());
    Ok(User {
        name: name.to_owned(),
        groups,
        ..Default::default()
    })
}

/// What a request wants to do (like `authorizer.Attributes`).
#[derive(Debug, Clone, Default)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// API group.
    pub group: String,
    /// Plural resource.
    pub resource: String,
    /// Subresource (`status`, `log`, `console`, …) or "".
    pub subresource: String,
    /// Namespace or "" (cluster scope / all namespaces).
    pub namespace: String,
    /// Object name or "".
    pub name: String,
}

/// Decides whether `user` may perform `attrs`, as kube-apiserver's authorizer chain does for
/// every resource request (its attributes from the request's path and method:
/// k8s.io/apiserver/pkg/endpoints/request/requestinfo.go): [`authorize_fixed`], then RBAC.
pub fn authorize(store: &Store, user: &User, attrs: &Attributes) -> Result<(), ApiError> {
    let denied = authorize_fixed(user, attrs);
    if denied.is_err() && rbac_allows(store, user, attrs) {
        return Ok(());
    }
    denied
}

/// What holds without any stored RBAC object: `system:masters` may do anything
/// (plugin/pkg/auth/authorizer/rbac: the superuser group), and everyone may create a
/// SelfSubjectReview (bootstrap ClusterRole `system:basic-user`). Anything else is the RBAC
/// authorizer's Forbidden.
pub fn authorize_fixed(user: &User, attrs: &Attributes) -> Result<(), ApiError> {
    if user.name == "admin" || user.groups.iter().any(|g| g == "system:masters") {
        return Ok(());
    }
    // Like the system:basic-user ClusterRole: everyone may ask who they are.
    if attrs.verb == "create"
        && attrs.group == "authentication.k8s.io"
        && attrs.resource == "selfsubjectreviews"
    {
        return Ok(());
    }
    let resource = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    let scope = if attrs.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", attrs.namespace)
    };
    let why = format!(
        "User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
        user.name, attrs.verb, attrs.group
    );
    Err(ApiError::forbidden(
        &attrs.group,
        &attrs.resource,
        &attrs.name,
        &why,
    ))
}

/// Whether the stored Roles/ClusterRoles, through RoleBindings in the request's namespace or
/// ClusterRoleBindings, grant `attrs` to `user` (matching user name, group or ServiceAccount;
/// verbs, API groups and resources with `*`; resourceNames when set).
pub fn rbac_allows(store: &Store, user: &User, attrs: &Attributes) -> bool {
    rbac_allowed_by(store, user, attrs).is_some()
}

/// What grants `attrs` to `user`, worded as the RBAC authorizer's reason
/// (plugin/pkg/auth/authorizer/rbac/rbac.go: `RBAC: allowed by <binding describer>`, the
/// describers of pkg/registry/rbac/validation/rule.go), or None.
pub fn rbac_allowed_by(store: &Store, user: &User, attrs: &Attributes) -> Option<String> {
    const RBAC: &str = "rbac.authorization.k8s.io";
    // pkg/registry/rbac/validation/rule.go appliesToUser; a ServiceAccount subject without a
    // namespace means the binding's.
    let subject_of = |binding: &Value, namespace: &str| -> Option<String> {
        binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|s| {
                let name = s["name"].as_str().unwrap_or_default();
                let kind = s["kind"].as_str().unwrap_or_default();
                let applies = match kind {
                    "User" => user.name == name,
                    "Group" => user.groups.iter().any(|g| g == name),
                    "ServiceAccount" => {
                        let ns = s["namespace"].as_str().filter(|n| !n.is_empty());
                        let ns = ns.unwrap_or(namespace);
                        !ns.is_empty() && user.name == format!("system:serviceaccount:{ns}:{name}")
                    }
                    _ => false,
                };
                applies.then(|| match kind {
                    "ServiceAccount" => {
                        let ns = s["namespace"].as_str().filter(|n| !n.is_empty());
                        format!("{kind} \"{name}/{}\"", ns.unwrap_or(namespace))
                    }
                    _ => format!("{kind} \"{name}\""),
                })
            })
    };
    let role_of = |binding: &Value, namespace: &str| {
        let name = binding["roleRef"]["name"].as_str().unwrap_or_default();
        match binding["roleRef"]["kind"].as_str() {
            Some("Role") => store.get(&Key::new(RBAC, "roles", namespace, name)),
            Some("ClusterRole") => store.get(&Key::new(RBAC, "clusterroles", "", name)),
            _ => None,
        }
    };
    let mut bindings: Vec<(Value, String)> = Vec::new();
    let (cluster, _) = store.list(RBAC, "clusterrolebindings", None);
    bindings.extend(cluster.into_iter().map(|b| (b, String::new())));
    if !attrs.namespace.is_empty() {
        let (namespaced, _) = store.list(RBAC, "rolebindings", Some(&attrs.namespace));
        bindings.extend(namespaced.into_iter().map(|b| (b, attrs.namespace.clone())));
    }
    bindings.iter().find_map(|(binding, namespace)| {
        let subject = subject_of(binding, namespace)?;
        let role = role_of(binding, namespace)?;
        let grants = role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| rule_matches(rule, attrs));
        let name = binding["metadata"]["name"].as_str().unwrap_or_default();
        let binding_name = if namespace.is_empty() {
            format!("ClusterRoleBinding \"{name}\"")
        } else {
            format!("RoleBinding \"{name}/{namespace}\"")
        };
        grants.then(|| {
            format!(
                "RBAC: allowed by {binding_name} of {} \"{}\" to {subject}",
                binding["roleRef"]["kind"].as_str().unwrap_or_default(),
                binding["roleRef"]["name"].as_str().unwrap_or_default()
            )
        })
    })
}

fn rule_matches(rule: &Value, attrs: &Attributes) -> bool {
    let list = |field: &str| -> Vec<&str> {
        rule[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    };
    let has = |field: &str, want: &str| list(field).iter().any(|v| *v == "*" || *v == want);
    let resource = if attrs.subresource.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}/{}", attrs.resource, attrs.subresource)
    };
    // pkg/apis/rbac/v1/evaluation_helpers.go ResourceMatches: `*` matches every resource and
    // subresource, `*/SUB` subresource SUB of any resource; anything else exactly.
    let any_sub = format!("*/{}", attrs.subresource);
    let resource_matches = list("resources")
        .iter()
        .any(|r| *r == "*" || *r == resource || (!attrs.subresource.is_empty() && *r == any_sub));
    let names = list("resourceNames");
    has("verbs", &attrs.verb)
        && has("apiGroups", &attrs.group)
        && resource_matches
        && (names.is_empty() || (!attrs.name.is_empty() && names.contains(&attrs.name.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store holding what the emulator seeds for `alice`.
    fn seeded() -> Store {
        let store = Store::new();
        let registry = crate::core::registry::Registry::new(crate::ServeFlavor::KubeVirt);
        for obj in crate::core::bootstrap::alice_view(&registry) {
            let plural = match obj["kind"].as_str() {
                Some("ClusterRole") => "clusterroles",
                _ => "rolebindings",
            };
            store
                .create("rbac.authorization.k8s.io", plural, obj)
                .unwrap();
        }
        store
    }

    #[test]
    fn alice_reads_dev_only() {
        let store = &seeded();
        let t = Tokens::generate();
        let alice = t
            .authenticate(Some(&format!("Bearer {}", t.alice)))
            .unwrap();
        assert!(t.authenticate(Some("Bearer nope")).is_none());
        let mut a = Attributes {
            verb: "list".into(),
            group: "kubevirt.io".into(),
            resource: "virtualmachines".into(),
            namespace: "dev".into(),
            ..Default::default()
        };
        assert!(authorize(store, &alice, &a).is_ok());
        // Her Role names resources: no Secrets, no subresource.
        let mut secret = a.clone();
        (secret.group, secret.resource, secret.verb) = ("".into(), "secrets".into(), "get".into());
        assert!(authorize(store, &alice, &secret).is_err());
        let mut console = a.clone();
        console.verb = "get".into();
        console.group = "subresources.kubevirt.io".into();
        console.resource = "virtualmachineinstances".into();
        console.subresource = "console".into();
        console.name = "web".into();
        assert!(authorize(store, &alice, &console).is_err());
        a.namespace = "prod".into();
        let e = authorize(store, &alice, &a).unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "virtualmachines.kubevirt.io is forbidden: User \"alice\" cannot list resource \"virtualmachines\" in API group \"kubevirt.io\" in the namespace \"prod\""
        );
        assert_eq!(
            e.to_status()["details"],
            serde_json::json!({"group": "kubevirt.io", "kind": "virtualmachines"})
        );
        a.verb = "get".into();
        a.name = "web".into();
        assert!(
            authorize(store, &alice, &a)
                .unwrap_err()
                .message
                .starts_with(
                    "virtualmachines.kubevirt.io \"web\" is forbidden: User \"alice\" cannot get"
                )
        );
        let pods = Attributes {
            verb: "delete".into(),
            resource: "pods".into(),
            namespace: "dev".into(),
            name: "p".into(),
            ..Default::default()
        };
        assert!(authorize(store, &alice, &pods).unwrap_err().message.contains("pods \"p\" is forbidden: User \"alice\" cannot delete resource \"pods\" in API group \"\" in the namespace \"dev\""));
    }

    #[test]
    fn only_masters_impersonate() {
        let t = Tokens::generate();
        let admin = t
            .authenticate(Some(&format!("Bearer {}", t.admin)))
            .unwrap();
        let alice = t
            .authenticate(Some(&format!("Bearer {}", t.alice)))
            .unwrap();
        let bob = impersonate(admin.clone(), Some("bob"), vec![]).unwrap();
        assert_eq!(bob.name, "bob");
        let read_prod = Attributes {
            verb: "list".into(),
            group: "kubevirt.io".into(),
            resource: "virtualmachines".into(),
            namespace: "prod".into(),
            ..Default::default()
        };
        let store = &seeded();
        assert!(authorize(store, &bob, &read_prod).is_err());
        let mut read_dev = read_prod.clone();
        read_dev.namespace = "dev".into();
        assert!(
            authorize(store, &bob, &read_dev).is_err(),
            "alice's Role only"
        );
        let master = impersonate(admin, Some("bob"), vec!["system:masters".into()]).unwrap();
        assert!(authorize(store, &master, &read_prod).is_ok());
        assert!(impersonate(alice, Some("admin"), vec![]).is_err());
    }

    #[test]
    fn role_bindings_grant_more() {
        let t = Tokens::generate();
        let alice = t
            .authenticate(Some(&format!("Bearer {}", t.alice)))
            .unwrap();
        let store = Store::new();
        let get_cm = |name: &str| Attributes {
            verb: "get".into(),
            resource: "configmaps".into(),
            namespace: "kubevm-system".into(),
            name: name.into(),
            ..Default::default()
        };
        assert!(!rbac_allows(&store, &alice, &get_cm("ca")));
        let rbac = "rbac.authorization.k8s.io";
        store
            .create(rbac, "roles", serde_json::json!({"metadata": {"name": "reader", "namespace": "kubevm-system"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["ca"], "verbs": ["get"]}]}))
            .unwrap();
        assert!(!rbac_allows(&store, &alice, &get_cm("ca")), "not bound yet");
        store
            .create(
                rbac,
                "rolebindings",
                serde_json::json!({"metadata": {"name": "reader", "namespace": "kubevm-system"},
                "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "reader"},
                "subjects": [{"apiGroup": rbac, "kind": "Group", "name": "system:authenticated"}]}),
            )
            .unwrap();
        assert!(rbac_allows(&store, &alice, &get_cm("ca")));
        assert!(
            !rbac_allows(&store, &alice, &get_cm("other")),
            "resourceNames"
        );
        let mut list = get_cm("");
        list.verb = "list".into();
        assert!(!rbac_allows(&store, &alice, &list));
        let mut elsewhere = get_cm("ca");
        elsewhere.namespace = "prod".into();
        assert!(!rbac_allows(&store, &alice, &elsewhere));
        // `*/SUB` matches that subresource of any resource, `*` everything
        // (pkg/apis/rbac/v1/evaluation_helpers.go ResourceMatches).
        let console = |resources: &[&str]| {
            let rule = serde_json::json!({"apiGroups": ["subresources.kubevirt.io"],
                "resources": resources, "verbs": ["get"]});
            rule_matches(
                &rule,
                &Attributes {
                    verb: "get".into(),
                    group: "subresources.kubevirt.io".into(),
                    resource: "virtualmachineinstances".into(),
                    subresource: "console".into(),
                    namespace: "dev".into(),
                    name: "web".into(),
                },
            )
        };
        assert!(console(&["*/console"]) && console(&["*"]));
        assert!(console(&["virtualmachineinstances/console"]));
        assert!(!console(&["virtualmachineinstances"]) && !console(&["*/vnc"]));
    }
}
