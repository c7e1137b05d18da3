//! Authentication (bearer tokens for the two users of the generated kubeconfig) and a tiny
//! authorizer standing in for RBAC: `admin` may do anything; `alice` may only read
//! (get/list/watch) in namespace `dev`. Denials carry the real API server's wording.

use crate::status::ApiError;
use crate::util::random_token;

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Username (`admin`, `alice`).
    pub name: String,
    /// Groups, as a SelfSubjectReview reports them.
    pub groups: Vec<String>,
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
            })
        } else if token == self.alice {
            Some(User {
                name: "alice".into(),
                groups: vec!["system:authenticated".into()],
            })
        } else {
            None
        }
    }
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

/// Decides whether `user` may perform `attrs`.
pub fn authorize(user: &User, attrs: &Attributes) -> Result<(), ApiError> {
    if user.name == "admin" {
        return Ok(());
    }
    let read = matches!(attrs.verb.as_str(), "get" | "list" | "watch");
    if read && attrs.namespace == "dev" {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alice_reads_dev_only() {
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
        assert!(authorize(&alice, &a).is_ok());
        a.namespace = "prod".into();
        let e = authorize(&alice, &a).unwrap_err();
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
        assert!(authorize(&alice, &a).unwrap_err().message.starts_with(
            "virtualmachines.kubevirt.io \"web\" is forbidden: User \"alice\" cannot get"
        ));
        let pods = Attributes {
            verb: "delete".into(),
            resource: "pods".into(),
            namespace: "dev".into(),
            name: "p".into(),
            ..Default::default()
        };
        assert!(authorize(&alice, &pods).unwrap_err().message.contains("pods \"p\" is forbidden: User \"alice\" cannot delete resource \"pods\" in API group \"\" in the namespace \"dev\""));
    }
}
