//! Errors of the library, each one line that names the object and the reason.
//!
//! API failures are classified from the server's `Status` (NotFound, Forbidden, Conflict, …)
//! together with what the client was doing ([`Action`]), so that the message can name the
//! verb and resource even when the server's text does not.

use std::fmt;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a request was doing, used to word its failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    /// Kubernetes verb: get, list, watch, create, update, patch, delete.
    pub verb: &'static str,
    /// Plural resource with group, as RBAC names it (`virtualmachines.kubevirt.io`, `pods`).
    pub resource: String,
    /// Lower-case kind for "not found" messages (`virtualmachine`).
    pub kind: String,
    /// Object name, when the request addresses one object.
    pub name: Option<String>,
    /// Namespace, when the request is namespaced.
    pub namespace: Option<String>,
}

impl Action {
    /// An action on one resource type.
    pub fn new(verb: &'static str, resource: impl Into<String>, kind: impl Into<String>) -> Self {
        Action {
            verb,
            resource: resource.into(),
            kind: kind.into(),
            name: None,
            namespace: None,
        }
    }

    /// The same action on the named object.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The same action in a namespace (`None` for all namespaces or cluster scope).
    pub fn in_namespace(mut self, namespace: Option<&str>) -> Self {
        self.namespace = namespace.map(str::to_owned);
        self
    }

    /// The discovery request that finds the platform.
    pub fn discovery() -> Self {
        Action::new("get", "api groups", "api group list")
    }
}

/// Every failure the library reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig, context, cluster or user selection is unusable.
    #[error("{0}")]
    Config(String),
    /// A target (`NAME`, `NAME.NAMESPACE`, `vm/NAME`, …) or namespace is malformed or contradictory.
    #[error("{0}")]
    InvalidTarget(String),
    /// Neither KubeVirt nor Deckhouse virtualization is served by the cluster.
    #[error(
        "neither KubeVirt (kubevirt.io/v1) nor Deckhouse virtualization (virtualization.deckhouse.io/v1alpha2) is installed in this cluster; use --flavor to override detection"
    )]
    NoPlatform,
    /// The object does not exist.
    #[error("{kind} {name:?} not found{}", in_ns(namespace))]
    NotFound {
        /// Lower-case kind.
        kind: String,
        /// Object name.
        name: String,
        /// Namespace, if namespaced.
        namespace: Option<String>,
    },
    /// The server does not serve the resource type at all.
    #[error(
        "the server does not serve {resource}; {}",
        missing_component(resource)
    )]
    NotServed {
        /// Plural resource with group.
        resource: String,
    },
    /// The API server answered 503: an aggregated API whose server is down or not ready.
    #[error(
        "{resource} is unavailable: the API server answered 503 ({message}); {}",
        missing_component(resource)
    )]
    Unavailable {
        /// Plural resource with group.
        resource: String,
        /// The server's message.
        message: String,
    },
    /// RBAC refused the request.
    #[error("forbidden: {} cannot {verb} {resource}{}{}", user.as_ref().map(|u| format!("user {u:?}")).unwrap_or_else(|| "you".into()), name.as_ref().map(|n| format!(" {n:?}")).unwrap_or_default(), in_ns(namespace))]
    Forbidden {
        /// The user the server named, if it did.
        user: Option<String>,
        /// The verb that was refused.
        verb: String,
        /// Plural resource with group.
        resource: String,
        /// Object name, if one object was addressed.
        name: Option<String>,
        /// Namespace of the request.
        namespace: Option<String>,
    },
    /// The server refused the request with its own explanation (a quota, an admission webhook,
    /// a policy): its message, unchanged.
    #[error("{0}")]
    Refused(String),
    /// The credentials were not accepted.
    #[error(
        "unauthorized: the API server at {server} did not accept your credentials ({message}); log in again or check the user in your kubeconfig"
    )]
    Unauthorized {
        /// Server address.
        server: String,
        /// The server's message.
        message: String,
    },
    /// The object changed or already exists.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The server refused the object as invalid.
    #[error("invalid: {0}")]
    Invalid(String),
    /// Any other error status from the API server.
    #[error("the server answered {code} {reason}: {message}")]
    Api {
        /// HTTP status code.
        code: u16,
        /// Status reason (e.g. `InternalError`).
        reason: String,
        /// The server's message.
        message: String,
    },
    /// The API server could not be reached.
    #[error(
        "cannot reach the Kubernetes API server at {server}: {cause} (is the cluster up, and are --context and KUBECONFIG right?)"
    )]
    Unreachable {
        /// Server address tried.
        server: String,
        /// Underlying cause, one line.
        cause: String,
    },
    /// Creating a set of objects failed part way (and what was undone).
    #[error("cannot create {object}: {reason}{undo}")]
    Apply {
        /// `kind "name"` of the object that failed.
        object: String,
        /// Why.
        reason: String,
        /// What was removed again, e.g. `; removed the 2 objects created before it`.
        undo: String,
    },
    /// The platform refused an action or could not complete it; the message says why and,
    /// where it can, what to do.
    #[error("{0}")]
    Platform(String),
    /// The VM is not running (yet): a stream cannot be opened now; wait and retry.
    #[error("{0}")]
    NotRunning(String),
    /// A wait ran out of time.
    #[error("timed out waiting for {0}")]
    Timeout(String),
    /// A bug or an unexpected answer.
    #[error("{0}")]
    Internal(String),
    /// Input that the cluster showed to be unusable (a class that does not exist, sizes its
    /// policy refuses): a usage error, like a bad flag.
    #[error("{0}")]
    Usage(String),
    /// Refused to change objects kubectl-vm did not make (e.g. `create` over an existing one).
    #[error("{0}")]
    NotOurs(String),
    /// A wait that cannot succeed: a disk or the VM is stuck in an error state.
    #[error("{0}")]
    Stuck(String),
    /// A data transfer (export download) failed; the message says what is kept and how to resume.
    #[error("{0}")]
    Transfer(String),
}

fn in_ns(namespace: &Option<String>) -> String {
    namespace
        .as_ref()
        .map(|ns| format!(" in namespace {ns:?}"))
        .unwrap_or_default()
}

impl Error {
    /// Classify a kube client error raised while doing `action` against `server`.
    pub fn from_kube(err: kube::Error, action: &Action) -> Self {
        Self::from_kube_at(err, action, "")
    }

    /// Like [`Error::from_kube`], naming the server for connection failures.
    pub fn from_kube_at(err: kube::Error, action: &Action, server: &str) -> Self {
        match err {
            kube::Error::Api(status) => {
                let details = status.details.as_ref();
                let named = details.map(|d| StatusNames {
                    kind: &d.kind,
                    group: &d.group,
                    name: &d.name,
                });
                Self::classify(
                    status.code,
                    &status.reason,
                    &status.message,
                    named,
                    action,
                    server,
                )
            }
            kube::Error::Auth(e) => Error::Config(format!("cannot get credentials: {e}")),
            kube::Error::HyperError(e) => Error::Unreachable {
                server: server.to_owned(),
                cause: root_cause(&e),
            },
            kube::Error::Service(e) => Error::Unreachable {
                server: server.to_owned(),
                cause: root_cause(e.as_ref()),
            },
            kube::Error::SerdeError(e) => Error::Internal(format!(
                "unexpected answer to {} {}: {e}",
                action.verb, action.resource
            )),
            other => Error::Internal(one_line(&other.to_string())),
        }
    }

    /// Classify an error `Status` from the API server.
    pub fn from_status(
        code: u16,
        reason: &str,
        message: &str,
        action: &Action,
        server: &str,
    ) -> Self {
        Self::classify(code, reason, message, None, action, server)
    }

    /// Classify a `Status` whose `details` (when present) name the object the server means.
    fn classify(
        code: u16,
        reason: &str,
        message: &str,
        details: Option<StatusNames<'_>>,
        action: &Action,
        server: &str,
    ) -> Self {
        let other = details.filter(|d| d.names_other_than(action));
        match (code, reason) {
            // The API server's own answer for a path no API serves (an aggregated group that
            // is not registered): not the object missing.
            (404, _) if message.trim() == NO_SUCH_PATH || reason == NOT_A_STATUS => {
                Error::NotServed {
                    resource: action.resource.clone(),
                }
            }
            (503, _) => Error::Unavailable {
                resource: action.resource.clone(),
                message: one_line(message.trim()),
            },
            // The server names what is missing: a namespace for a create in a missing one
            // (NamespaceLifecycle admission), or an object the request refers to.
            (404, _) | (_, "NotFound") if other.is_some() => {
                let d = other.expect("checked");
                Error::NotFound {
                    kind: singular(d.kind),
                    name: d.name.to_owned(),
                    // Its scope is unknown here (a StorageClass has none): name no namespace.
                    namespace: None,
                }
            }
            (404, _) | (_, "NotFound") if action.name.is_none() => Error::NotServed {
                resource: action.resource.clone(),
            },
            (404, _) | (_, "NotFound") => Error::NotFound {
                kind: action.kind.clone(),
                name: action.name.clone().unwrap_or_default(),
                namespace: action.namespace.clone(),
            },
            // A quota, an admission webhook or a policy refused: its message says why; only
            // the authorizer's own `User "x" cannot VERB resource …` is reworded.
            (403, _) | (_, "Forbidden")
                if !message.trim().is_empty() && denied_in_message(message).is_none() =>
            {
                Error::Refused(one_line(message))
            }
            (403, _) | (_, "Forbidden") => match denied_in_message(message) {
                // The server refused something other than the request itself (impersonation).
                Some((verb, resource)) if resource != action.resource => Error::Forbidden {
                    user: user_in_message(message),
                    verb,
                    resource,
                    name: None,
                    namespace: None,
                },
                _ => Error::Forbidden {
                    user: user_in_message(message),
                    verb: action.verb.to_owned(),
                    resource: action.resource.clone(),
                    name: action.name.clone(),
                    namespace: action.namespace.clone(),
                },
            },
            (401, _) => Error::Unauthorized {
                server: server.to_owned(),
                message: one_line(message),
            },
            (409, _) => Error::Conflict(one_line(message)),
            (422, _) => Error::Invalid(one_line(message)),
            _ => Error::Api {
                code,
                reason: reason.to_owned(),
                message: one_line(message),
            },
        }
    }

    /// Whether the error is a NotFound.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }
}

/// client-go's message for a 404 whose body is not a `Status` (a path that no API serves).
pub const NO_SUCH_PATH: &str = "the server could not find the requested resource";

/// The reason kube-rs gives an error answer whose body is not a `Status`. kube-apiserver answers
/// a path no API group serves (an aggregated group that is not registered: virt-api missing)
/// with Go's `http.NotFound` text, `404 page not found` (k8s.io/apiserver
/// `pkg/util/notfoundhandler`); every API (virt-api included) answers a missing object with a
/// `Status`. So a 404 without a Status is the path, never the object.
pub const NOT_A_STATUS: &str = "Failed to parse error data";

/// Which component serves `resource`, for messages about it missing or down.
fn missing_component(resource: &str) -> &'static str {
    if resource.ends_with("subresources.kubevirt.io") {
        "KubeVirt's API component (virt-api, APIService v1.subresources.kubevirt.io) is not installed or not ready"
    } else if resource.ends_with("subresources.virtualization.deckhouse.io") {
        "Deckhouse virtualization's API (virtualization-api, APIService v1alpha2.subresources.virtualization.deckhouse.io) is not installed or not ready"
    } else if resource.ends_with("upload.cdi.kubevirt.io") {
        "CDI's upload API (cdi-apiserver, APIService v1beta1.upload.cdi.kubevirt.io) is not installed or not ready"
    } else if resource.ends_with(crate::signer::GROUP) {
        "the SSH signer (APIService v1alpha1.ssh.kubevm.io) is not installed or not ready"
    } else {
        "is the platform installed? (check --flavor and --context)"
    }
}

/// What a `Status`'s `details` name: `kind` is the plural resource (`namespaces`).
#[derive(Clone, Copy)]
struct StatusNames<'a> {
    kind: &'a str,
    group: &'a str,
    name: &'a str,
}

impl StatusNames<'_> {
    /// Whether the details name a resource other than the one `action` addressed.
    fn names_other_than(&self, action: &Action) -> bool {
        if self.kind.is_empty() || self.name.is_empty() {
            return false;
        }
        let (plural, group) = action
            .resource
            .split_once('.')
            .unwrap_or((action.resource.as_str(), ""));
        let plural = plural.split('/').next().unwrap_or(plural);
        self.kind != plural || (!self.group.is_empty() && self.group != group)
    }
}

/// `namespaces` → `namespace`, `storageclasses` → `storageclass`, `policies` → `policy`.
fn singular(plural: &str) -> String {
    if let Some(stem) = plural.strip_suffix("ies") {
        return format!("{stem}y");
    }
    if let Some(stem) = plural.strip_suffix("es")
        && ["ss", "ch", "sh", "x"]
            .iter()
            .any(|end| stem.ends_with(end))
    {
        return stem.to_owned();
    }
    plural.strip_suffix('s').unwrap_or(plural).to_owned()
}

/// The `User "alice"` part of an API server's Forbidden message.
fn user_in_message(message: &str) -> Option<String> {
    let rest = &message[message.find("User \"")? + 6..];
    Some(rest[..rest.find('"')?].to_owned())
}

/// The verb and `resource.group` of the authorizer's Forbidden message
/// (`… is forbidden: User "alice" cannot impersonate resource "users" in API group "" …`,
/// worded by k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go
/// `forbiddenMessage`); `None` for any other 403 (quota, admission webhook, policy).
fn denied_in_message(message: &str) -> Option<(String, String)> {
    if message.contains("admission webhook") {
        return None;
    }
    let rest = &message[message.find("User \"")?..];
    let rest = &rest[rest.find("\" cannot ")? + 9..];
    let (verb, rest) = rest.split_once(" resource \"")?;
    let (resource, rest) = rest.split_once('"')?;
    let group = rest.strip_prefix(" in API group \"")?.split('"').next()?;
    let resource = if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    };
    Some((verb.to_owned(), resource))
}

/// The innermost cause of an error chain, which names the real problem
/// ("Connection refused") instead of the wrapper ("client error (Connect)").
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause: &dyn std::error::Error = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    one_line(&cause.to_string())
}

/// Fold a possibly multi-line message into one line.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm_get() -> Action {
        Action::new("get", "virtualmachines.kubevirt.io", "virtualmachine")
            .named("web")
            .in_namespace(Some("prod"))
    }

    #[test]
    fn not_found_names_object_and_namespace() {
        let err = Error::from_status(
            404,
            "NotFound",
            "virtualmachines.kubevirt.io \"web\" not found",
            &vm_get(),
            "",
        );
        assert_eq!(
            err.to_string(),
            "virtualmachine \"web\" not found in namespace \"prod\""
        );
    }

    #[test]
    fn not_found_on_a_list_means_not_served() {
        let action = Action::new("list", "virtualmachines.kubevirt.io", "virtualmachine");
        let err = Error::from_status(
            404,
            "NotFound",
            "the server could not find the requested resource",
            &action,
            "",
        );
        assert_eq!(
            err.to_string(),
            "the server does not serve virtualmachines.kubevirt.io; is the platform installed? (check --flavor and --context)"
        );
    }

    #[test]
    fn a_missing_subresource_api_is_not_a_missing_vm() {
        // kubectl vm start on a cluster without virt-api: the PUT's 404 is the API server's
        // own, for the unregistered group (before: `virtualmachine "web" not found`).
        let start = Action::new(
            "update",
            "virtualmachines.subresources.kubevirt.io",
            "virtualmachine",
        )
        .named("web")
        .in_namespace(Some("prod"));
        let err = Error::from_status(404, "NotFound", NO_SUCH_PATH, &start, "");
        assert_eq!(
            err.to_string(),
            "the server does not serve virtualmachines.subresources.kubevirt.io; KubeVirt's API component (virt-api, APIService v1.subresources.kubevirt.io) is not installed or not ready"
        );
        // What kube-apiserver really sends for that path: Go's `http.NotFound` text, which
        // kube-rs keeps with reason `Failed to parse error data`.
        let err = Error::from_status(404, NOT_A_STATUS, "404 page not found", &start, "");
        assert!(matches!(err, Error::NotServed { .. }), "{err}");
        // virt-api's own 404 still names the VM.
        let err = Error::from_status(
            404,
            "NotFound",
            "virtualmachine.kubevirt.io \"web\" not found",
            &start,
            "",
        );
        assert!(err.is_not_found());
        // Registered but down: the API server's 503, with what is missing.
        let err = Error::from_status(
            503,
            "Failed to parse error data",
            "service unavailable",
            &start,
            "",
        );
        assert_eq!(
            err.to_string(),
            "virtualmachines.subresources.kubevirt.io is unavailable: the API server answered 503 (service unavailable); KubeVirt's API component (virt-api, APIService v1.subresources.kubevirt.io) is not installed or not ready"
        );
    }

    #[test]
    fn forbidden_names_user_verb_and_resource() {
        let action = Action::new("list", "virtualmachines.kubevirt.io", "virtualmachine")
            .in_namespace(Some("prod"));
        let message = "virtualmachines.kubevirt.io is forbidden: User \"alice\" cannot list resource \"virtualmachines\" in API group \"kubevirt.io\" in the namespace \"prod\"";
        let err = Error::from_status(403, "Forbidden", message, &action, "");
        assert_eq!(
            err.to_string(),
            "forbidden: user \"alice\" cannot list virtualmachines.kubevirt.io in namespace \"prod\""
        );
    }

    #[test]
    fn forbidden_impersonation_names_what_was_refused() {
        let message = "users \"admin\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope";
        let action = Action::new("list", "virtualmachines.kubevirt.io", "virtualmachine")
            .in_namespace(Some("dev"));
        let err = Error::from_status(403, "Forbidden", message, &action, "");
        assert_eq!(
            err.to_string(),
            "forbidden: user \"alice\" cannot impersonate users"
        );
    }

    #[test]
    fn forbidden_without_user_says_you() {
        let err = Error::from_status(403, "Forbidden", "", &vm_get(), "");
        assert_eq!(
            err.to_string(),
            "forbidden: you cannot get virtualmachines.kubevirt.io \"web\" in namespace \"prod\""
        );
    }

    #[test]
    fn conflict_and_other_statuses_stay_one_line() {
        let err = Error::from_status(
            409,
            "Conflict",
            "the object\nhas been modified",
            &vm_get(),
            "",
        );
        assert_eq!(err.to_string(), "conflict: the object has been modified");
        let err = Error::from_status(500, "InternalError", "boom", &vm_get(), "");
        assert_eq!(
            err.to_string(),
            "the server answered 500 InternalError: boom"
        );
    }

    /// A `kube::Error` from a `Status` as the API server sends it (JSON).
    fn api_error(status: serde_json::Value) -> kube::Error {
        kube::Error::Api(Box::new(serde_json::from_value(status).unwrap()))
    }

    #[test]
    fn quota_refusal_keeps_the_servers_message() {
        // Worded by the ResourceQuota admission plugin (k8s.io/apiserver/pkg/admission/plugin/
        // resourcequota/controller.go: "exceeded quota: %s, requested: %s, used: %s, limited: %s"
        // wrapped by admission.NewForbidden as `<resource> "<name>" is forbidden: …`).
        let message = "persistentvolumeclaims \"web-root\" is forbidden: exceeded quota: compute, requested: requests.storage=20Gi, used: requests.storage=90Gi, limited: requests.storage=100Gi";
        let action = Action::new("create", "persistentvolumeclaims", "persistentvolumeclaim")
            .named("web-root")
            .in_namespace(Some("prod"));
        let err = Error::from_kube(
            api_error(serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                "reason": "Forbidden", "message": message,
                "details": {"name": "web-root", "kind": "persistentvolumeclaims"}
            })),
            &action,
        );
        assert_eq!(err.to_string(), message);
    }

    #[test]
    fn webhook_denial_keeps_the_servers_message() {
        // k8s.io/apiserver/pkg/admission/plugin/webhook/errors/statuserror.go ToStatusErr:
        // "admission webhook %q denied the request: %s"; controller-runtime webhooks answer 403.
        let message = "admission webhook \"vm.virtualization-controller.validate.d8-virtualization\" denied the request: the virtual machine class \"generic\" does not allow 100 cores";
        let err = Error::from_status(403, "Forbidden", message, &vm_get(), "");
        assert_eq!(err.to_string(), message);
        // Even when the webhook's own text quotes an RBAC-like sentence.
        let message = "admission webhook \"policy.example.org\" denied the request: User \"alice\" cannot create resource \"virtualmachines\" in API group \"kubevirt.io\" here";
        let err = Error::from_status(403, "Forbidden", message, &vm_get(), "");
        assert_eq!(err.to_string(), message);
    }

    #[test]
    fn missing_namespace_is_named_from_the_details() {
        // NamespaceLifecycle admission (k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle)
        // answers a create in a missing namespace with NotFound for the namespace.
        let action = Action::new("patch", "virtualmachines.kubevirt.io", "virtualmachine")
            .named("w")
            .in_namespace(Some("x"));
        let err = Error::from_kube(
            api_error(serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                "reason": "NotFound", "message": "namespaces \"x\" not found",
                "details": {"name": "x", "kind": "namespaces"}
            })),
            &action,
        );
        assert_eq!(err.to_string(), "namespace \"x\" not found");
    }

    #[test]
    fn not_found_of_another_kind_names_that_kind() {
        let action = Action::new("create", "virtualmachines.kubevirt.io", "virtualmachine")
            .named("w")
            .in_namespace(Some("prod"));
        let err = Error::from_kube(
            api_error(serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                "reason": "NotFound", "message": "storageclasses.storage.k8s.io \"fast\" not found",
                "details": {"name": "fast", "group": "storage.k8s.io", "kind": "storageclasses"}
            })),
            &action,
        );
        assert_eq!(err.to_string(), "storageclass \"fast\" not found");
        // Details that name the requested object itself keep the action's wording.
        let err = Error::from_kube(
            api_error(serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
                "reason": "NotFound", "message": "virtualmachines.kubevirt.io \"w\" not found",
                "details": {"name": "w", "group": "kubevirt.io", "kind": "virtualmachines"}
            })),
            &action,
        );
        assert_eq!(
            err.to_string(),
            "virtualmachine \"w\" not found in namespace \"prod\""
        );
    }

    #[test]
    fn singular_of_plurals() {
        assert_eq!(singular("namespaces"), "namespace");
        assert_eq!(singular("storageclasses"), "storageclass");
        assert_eq!(singular("policies"), "policy");
        assert_eq!(singular("virtualdisks"), "virtualdisk");
    }
}
