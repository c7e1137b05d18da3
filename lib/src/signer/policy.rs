//! What the signer signs: every field of a certificate decided from the API server's identity,
//! the VM and the signer's limits, never from what the client claims. Pure logic, no I/O.

use std::time::Duration;

use super::{CertificateRequestSpec, host_principals, scoped_principal};

/// Who asked, as the API server told the signer (`X-Remote-User`, `X-Remote-Group`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// User name.
    pub user: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes (`X-Remote-Extra-*`), for access reviews on the caller's behalf.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// The signer's configuration of lifetimes and users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Lifetime when the request names none.
    pub default_ttl: Duration,
    /// Longest lifetime issued; longer requests are refused.
    pub max_ttl: Duration,
    /// Validity of host certificates.
    pub host_validity: Duration,
    /// The platform user, which every VM created by kubectl-vm has.
    pub platform_user: String,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            default_ttl: Duration::from_secs(300),
            max_ttl: Duration::from_secs(3600),
            host_validity: crate::ca::DEFAULT_HOST_CERT_VALIDITY,
            platform_user: crate::names::DEFAULT_PLATFORM_USER.to_owned(),
        }
    }
}

/// What the signer knows of the VM a certificate is for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmFacts {
    /// VM name.
    pub name: String,
    /// VM namespace.
    pub namespace: String,
    /// Whether it has a deletionTimestamp.
    pub deleting: bool,
    /// Whether its guest accepts only VM-scoped principals ([`super::TRUST_ANNOTATION`]).
    pub scoped: bool,
    /// Logins besides the platform user ([`super::LOGINS_ANNOTATION`]).
    pub logins: Vec<String>,
    /// Agent forwarding allowed ([`super::AGENT_FORWARDING_ANNOTATION`]).
    pub agent_forwarding: bool,
    /// X11 forwarding allowed ([`super::X11_FORWARDING_ANNOTATION`]).
    pub x11_forwarding: bool,
}

impl VmFacts {
    /// Read the facts from a VM object of either platform.
    pub fn from_object(vm: &serde_json::Value) -> VmFacts {
        let meta = &vm["metadata"];
        let annotation = |key: &str| meta["annotations"][key].as_str().unwrap_or_default();
        VmFacts {
            name: meta["name"].as_str().unwrap_or_default().to_owned(),
            namespace: meta["namespace"].as_str().unwrap_or_default().to_owned(),
            deleting: !meta["deletionTimestamp"].is_null(),
            scoped: annotation(super::TRUST_ANNOTATION) == super::TRUST_VM_SCOPED,
            logins: annotation(super::LOGINS_ANNOTATION)
                .split(',')
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
            agent_forwarding: annotation(super::AGENT_FORWARDING_ANNOTATION) == "true",
            x11_forwarding: annotation(super::X11_FORWARDING_ANNOTATION) == "true",
        }
    }
}

/// Why a request is not signed; each maps to an API status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The request itself is wrong (422 Invalid).
    Invalid(String),
    /// The request is well formed but not allowed (403 Forbidden).
    Forbidden(String),
    /// The VM is being deleted (409 Conflict).
    Conflict(String),
}

/// The certificate the signer will sign.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Principals.
    pub principals: Vec<String>,
    /// Key ID.
    pub key_id: String,
    /// Lifetime from now.
    pub ttl: Duration,
    /// Extensions, OpenSSH names.
    pub extensions: Vec<&'static str>,
    /// The login the certificate is for (user certificates).
    pub login: Option<String>,
}

/// A login name the guest can have: POSIX-portable user names as `useradd` accepts them.
pub fn valid_login(login: &str) -> bool {
    let mut chars = login.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    first_ok
        && login.len() <= 32
        && login
            .trim_end_matches('$')
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The key ID of a user certificate: `kubectl-vm:<user>:<namespace>/<vm>`, the user as the
/// API server named it, with control characters replaced so sshd's log line stays one line.
pub fn key_id(caller: &Caller, namespace: &str, vm: &str) -> String {
    let user: String = caller
        .user
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    format!("kubectl-vm:{user}:{namespace}/{vm}")
}

/// Decide a user certificate for `caller` on `vm`. The certificate names exactly one
/// principal, `LOGIN@NAME.NAMESPACE`, for every VM (never the bare login).
///
/// A login other than [`Limits::platform_user`] must be one the VM lists
/// ([`VmFacts::logins`], which says the guest has it). That annotation is written by whoever may
/// edit the VM, so it is not the permission: the signer server also asks the API server whether
/// the caller may `use` the login (`logins.ssh.kubevm.io`, resourceName = login, in the VM's
/// namespace) before it signs.
pub fn user_certificate(
    limits: &Limits,
    caller: &Caller,
    vm: &VmFacts,
    spec: &CertificateRequestSpec,
) -> Result<Decision, Refusal> {
    if vm.deleting {
        return Err(Refusal::Conflict(format!(
            "virtual machine {}.{} is being deleted",
            vm.name, vm.namespace
        )));
    }
    let login = spec
        .login
        .clone()
        .unwrap_or_else(|| limits.platform_user.clone());
    if !valid_login(&login) {
        return Err(Refusal::Invalid(format!(
            "spec.login {login:?} is not a valid user name"
        )));
    }
    if login != limits.platform_user && !vm.logins.contains(&login) {
        let allowed = std::iter::once(limits.platform_user.as_str())
            .chain(vm.logins.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Refusal::Forbidden(format!(
            "login {login:?} is not allowed on virtual machine {}.{} (allowed: {allowed})",
            vm.name, vm.namespace
        )));
    }
    let ttl = match spec.ttl_seconds {
        None => limits.default_ttl,
        Some(0) => {
            return Err(Refusal::Invalid(
                "spec.ttlSeconds must be more than 0".into(),
            ));
        }
        Some(s) if Duration::from_secs(s) > limits.max_ttl => {
            return Err(Refusal::Invalid(format!(
                "spec.ttlSeconds {s} exceeds the signer's maximum of {}",
                limits.max_ttl.as_secs()
            )));
        }
        Some(s) => Duration::from_secs(s),
    };
    // One principal naming the login on this VM, whatever the VM says of itself: a guest made
    // before VM-scoped trust (no `AuthorizedPrincipalsFile`) matches the principal to the login
    // name and so accepts none of these; `kubectl vm ca migrate` gives it the scoped form.
    let principals = vec![scoped_principal(&login, &vm.name, &vm.namespace)];
    let mut extensions = Vec::new();
    if spec.pty {
        extensions.push("permit-pty");
    }
    if spec.port_forwarding {
        extensions.push("permit-port-forwarding");
    }
    if spec.agent_forwarding {
        if !vm.agent_forwarding {
            return Err(Refusal::Forbidden(format!(
                "agent forwarding is not allowed on virtual machine {}.{}",
                vm.name, vm.namespace
            )));
        }
        extensions.push("permit-agent-forwarding");
    }
    if spec.x11_forwarding {
        if !vm.x11_forwarding {
            return Err(Refusal::Forbidden(format!(
                "X11 forwarding is not allowed on virtual machine {}.{}",
                vm.name, vm.namespace
            )));
        }
        extensions.push("permit-X11-forwarding");
    }
    Ok(Decision {
        principals,
        key_id: key_id(caller, &vm.namespace, &vm.name),
        ttl,
        extensions,
        login: Some(login),
    })
}

/// Decide a host certificate for VM `name` in `namespace`.
pub fn host_certificate(limits: &Limits, name: &str, namespace: &str) -> Decision {
    Decision {
        principals: host_principals(name, namespace),
        key_id: format!("kubevm-host:{namespace}/{name}"),
        ttl: limits.host_validity,
        extensions: Vec::new(),
        login: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Caller {
        Caller {
            user: "alice".into(),
            groups: vec!["system:authenticated".into()],
            ..Default::default()
        }
    }

    fn web() -> VmFacts {
        VmFacts {
            name: "web".into(),
            namespace: "dev".into(),
            scoped: true,
            ..Default::default()
        }
    }

    fn spec() -> CertificateRequestSpec {
        CertificateRequestSpec {
            public_key: "ssh-ed25519 AAAA".into(),
            ..Default::default()
        }
    }

    #[test]
    fn platform_user_gets_a_vm_scoped_principal_and_the_default_lifetime() {
        let d = user_certificate(&Limits::default(), &alice(), &web(), &spec()).unwrap();
        assert_eq!(d.principals, ["kubevm@web.dev"]);
        assert_eq!(d.key_id, "kubectl-vm:alice:dev/web");
        assert_eq!(d.ttl, Duration::from_secs(300));
        assert!(d.extensions.is_empty());
    }

    #[test]
    fn older_vms_get_no_bare_login() {
        // Issue 32: a VM without the trust annotation got the bare login too (`root`), which
        // every guest trusting the CA without a principals file accepted.
        let vm = VmFacts {
            scoped: false,
            logins: vec!["root".into()],
            ..web()
        };
        let d = user_certificate(&Limits::default(), &alice(), &vm, &spec()).unwrap();
        assert_eq!(d.principals, ["kubevm@web.dev"]);
        let mut s = spec();
        s.login = Some("root".into());
        let d = user_certificate(&Limits::default(), &alice(), &vm, &s).unwrap();
        assert_eq!(d.principals, ["root@web.dev"]);
    }

    fn name_strategy() -> impl proptest::strategy::Strategy<Value = String> {
        // DNS subdomains (with dots) and the names that collided before (`vm`, `prod.vm`).
        proptest::prop_oneof![
            "[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?){0,3}",
            proptest::strategy::Just("vm".to_string()),
            proptest::strategy::Just("db.primary.prod".to_string()),
        ]
    }

    proptest::proptest! {
        /// Whatever the VM's facts, every principal names the login on exactly this VM.
        #[test]
        fn no_bare_principal_for_any_vm_facts(
            name in name_strategy(),
            namespace in "[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?|vm",
            scoped: bool,
            agent: bool,
            login in "(kubevm|root|ubuntu|[a-z_][a-z0-9_-]{0,8})",
            listed in proptest::collection::vec("[a-z_][a-z0-9_-]{0,8}|root", 0..3),
        ) {
            let vm = VmFacts {
                name: name.clone(),
                namespace: namespace.clone(),
                scoped,
                agent_forwarding: agent,
                logins: listed.into_iter().chain([login.clone()]).collect(),
                ..Default::default()
            };
            let mut s = spec();
            s.login = Some(login.clone());
            let d = user_certificate(&Limits::default(), &alice(), &vm, &s).unwrap();
            proptest::prop_assert_eq!(d.principals, vec![format!("{login}@{name}.{namespace}")]);
        }
    }

    #[test]
    fn other_logins_only_where_the_vm_allows_them() {
        let mut s = spec();
        s.login = Some("root".into());
        let e = user_certificate(&Limits::default(), &alice(), &web(), &s).unwrap_err();
        assert!(matches!(&e, Refusal::Forbidden(m) if m.contains("\"root\" is not allowed")));
        let vm = VmFacts {
            logins: vec!["ops".into()],
            ..web()
        };
        s.login = Some("ops".into());
        let d = user_certificate(&Limits::default(), &alice(), &vm, &s).unwrap();
        assert_eq!(d.principals, ["ops@web.dev"]);
        s.login = Some("Bad Name".into());
        assert!(matches!(
            user_certificate(&Limits::default(), &alice(), &vm, &s),
            Err(Refusal::Invalid(_))
        ));
    }

    #[test]
    fn lifetimes_over_the_cap_are_refused() {
        let mut s = spec();
        s.ttl_seconds = Some(3601);
        let e = user_certificate(&Limits::default(), &alice(), &web(), &s).unwrap_err();
        assert_eq!(
            e,
            Refusal::Invalid("spec.ttlSeconds 3601 exceeds the signer's maximum of 3600".into())
        );
        s.ttl_seconds = Some(0);
        assert!(user_certificate(&Limits::default(), &alice(), &web(), &s).is_err());
        s.ttl_seconds = Some(3600);
        let d = user_certificate(&Limits::default(), &alice(), &web(), &s).unwrap();
        assert_eq!(d.ttl, Duration::from_secs(3600));
    }

    #[test]
    fn extensions_follow_the_request_and_the_vm() {
        let mut s = spec();
        s.pty = true;
        s.port_forwarding = true;
        let d = user_certificate(&Limits::default(), &alice(), &web(), &s).unwrap();
        assert_eq!(d.extensions, ["permit-pty", "permit-port-forwarding"]);
        s.agent_forwarding = true;
        assert!(matches!(
            user_certificate(&Limits::default(), &alice(), &web(), &s),
            Err(Refusal::Forbidden(_))
        ));
        let vm = VmFacts {
            agent_forwarding: true,
            ..web()
        };
        let d = user_certificate(&Limits::default(), &alice(), &vm, &s).unwrap();
        assert!(d.extensions.contains(&"permit-agent-forwarding"));
    }

    #[test]
    fn deleting_vms_get_nothing() {
        let vm = VmFacts {
            deleting: true,
            ..web()
        };
        assert!(matches!(
            user_certificate(&Limits::default(), &alice(), &vm, &spec()),
            Err(Refusal::Conflict(_))
        ));
    }

    #[test]
    fn key_id_is_one_line() {
        let caller = Caller {
            user: "mallory\nAccepted publickey for root".into(),
            ..Default::default()
        };
        assert_eq!(
            key_id(&caller, "dev", "web"),
            "kubectl-vm:mallory?Accepted publickey for root:dev/web"
        );
    }

    #[test]
    fn annotations_are_read() {
        let vm = serde_json::json!({"metadata": {"name": "web", "namespace": "dev",
            "annotations": {"ssh.kubevm.io/trust": "vm-scoped", "ssh.kubevm.io/logins": "alice, ops"}}});
        let facts = VmFacts::from_object(&vm);
        assert!(facts.scoped && !facts.deleting);
        assert_eq!(facts.logins, ["alice", "ops"]);
        let host = host_certificate(&Limits::default(), "web", "dev");
        assert_eq!(host.principals, ["web.dev.vm"]);
    }
}
