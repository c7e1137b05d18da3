//! The SSH certificate signer: the only holder of the platform CA's private key.
//!
//! The signer is an aggregated API (`ssh.kubevm.io/v1alpha1`, APIService
//! [`APISERVICE_NAME`]) that the Kubernetes API server fronts. The API server authenticates the
//! user and authorizes the request with RBAC (create on `virtualmachines/sshcertificate` or
//! `virtualmachines/hostcertificate`, optionally limited with `resourceNames`) before it proxies
//! it to the signer with the front-proxy client certificate and the `X-Remote-*` identity
//! headers. The signer then decides what is signed ([`policy`]): principals scoped to one VM,
//! the lifetime, the extensions and the key ID, all from the API server's identity.
//!
//! This module holds the wire types and the client side ([`client`]); [`server`] is the
//! service (`kubectl vm signer serve`) and [`install`] the manifests `ca init --signer` applies.

pub use crate::names::{
    AGENT_FORWARDING_ANNOTATION, DEFAULT_LOGIN_ANNOTATION, LOGINS_ANNOTATION, TRUST_ANNOTATION,
    TRUST_VM_SCOPED, X11_FORWARDING_ANNOTATION,
};

pub mod client;
pub mod install;
pub mod policy;
pub mod server;
pub mod sign;

use serde::{Deserialize, Serialize};

/// API group the signer serves.
pub const GROUP: &str = crate::names::SSH_API_GROUP;
/// API version the signer serves.
pub const VERSION: &str = "v1alpha1";
/// Name of the APIService that registers the signer with the API server.
pub const APISERVICE_NAME: &str = "v1alpha1.ssh.kubevm.io";
/// Subresource of a VM that issues a user certificate.
pub const USER_CERTIFICATE: &str = "sshcertificate";
/// Subresource of a VM that issues a host certificate.
pub const HOST_CERTIFICATE: &str = "hostcertificate";
/// Kind of the request and answer objects.
pub const KIND: &str = "SSHCertificateRequest";

/// The principal a VM-scoped guest accepts for `login` on VM `name` in `namespace`:
/// `LOGIN@NAME.NAMESPACE` (unambiguous: namespaces have no dots, logins no `@`).
pub fn scoped_principal(login: &str, name: &str, namespace: &str) -> String {
    format!("{login}@{name}.{namespace}")
}

/// Suffix of the one name a VM host goes by (see [`host_name`]).
pub const HOST_SUFFIX: &str = ".vm";

/// The one name of VM `name` in `namespace` as an SSH host: `NAME.NAMESPACE.vm`. It is the
/// host certificate's only principal, the ssh-config host name and the known_hosts key, so
/// host trust has one spelling everywhere.
///
/// Injective: namespaces are DNS labels (no dots), so stripping [`HOST_SUFFIX`] and splitting
/// at the last dot gives the pair back ([`vm_of_host_name`]). The former two-principal form
/// (`NAME.NAMESPACE` and `NAME.NAMESPACE.vm`) was not: VM `db.primary.prod` in namespace `vm`
/// got `db.primary.prod.vm`, the name of VM `db.primary` in `prod`.
pub fn host_name(name: &str, namespace: &str) -> String {
    format!("{name}.{namespace}{HOST_SUFFIX}")
}

/// The `(NAME, NAMESPACE)` a [`host_name`] stands for; `None` for anything that is not of that
/// form with a non-empty name and namespace (no check of the characters: callers that use the
/// parts validate them).
pub fn vm_of_host_name(host: &str) -> Option<(&str, &str)> {
    let inner = host.strip_suffix(HOST_SUFFIX)?;
    let (name, namespace) = inner.rsplit_once('.')?;
    (!name.is_empty() && !namespace.is_empty()).then_some((name, namespace))
}

/// The principals of a VM's host certificate: its [`host_name`] only. Never the bare name
/// (which would let `web` in one namespace pass for `web` in another) and never
/// `NAME.NAMESPACE` (which collides with the host name of another VM, see [`host_name`]).
pub fn host_principals(name: &str, namespace: &str) -> Vec<String> {
    vec![host_name(name, namespace)]
}

/// A certificate request, and the signer's answer in `status` (like a TokenRequest).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRequest {
    /// `ssh.kubevm.io/v1alpha1`.
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// What the client asks for.
    pub spec: CertificateRequestSpec,
    /// What the signer issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CertificateStatus>,
}

/// The client's side of a [`CertificateRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateRequestSpec {
    /// The public key to certify, one OpenSSH line.
    pub public_key: String,
    /// User certificates: the guest login (default: the platform user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub login: Option<String>,
    /// User certificates: the lifetime asked for, in seconds (default and cap: the signer's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// User certificates: allow a terminal (`permit-pty`).
    #[serde(default)]
    pub pty: bool,
    /// User certificates: allow `-L` forwarding (`permit-port-forwarding`).
    #[serde(default)]
    pub port_forwarding: bool,
    /// User certificates: ask for agent forwarding (granted only where the VM allows it).
    #[serde(default)]
    pub agent_forwarding: bool,
    /// User certificates: ask for X11 forwarding (granted only where the VM allows it).
    #[serde(default)]
    pub x11_forwarding: bool,
}

/// The signer's side of a [`CertificateRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStatus {
    /// The certificate, one OpenSSH line.
    pub certificate: String,
    /// Its key ID.
    pub key_id: String,
    /// Its serial number, in decimal.
    pub serial: String,
    /// Its principals.
    pub principals: Vec<String>,
    /// Start of validity, RFC 3339.
    pub valid_after: String,
    /// End of validity, RFC 3339.
    pub valid_before: String,
}

/// RFC 3339 (UTC, seconds) of a Unix time, for status fields and log lines.
pub(crate) fn rfc3339(unix: u64) -> String {
    jiff::Timestamp::from_second(unix as i64)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_name_one_vm() {
        assert_eq!(
            scoped_principal("kubevm", "db.primary", "prod"),
            "kubevm@db.primary.prod"
        );
        // The collision of the former form (issue 32): db.primary.prod in `vm` and
        // db.primary in `prod` share no principal.
        assert_eq!(host_principals("web", "dev"), ["web.dev.vm"]);
        assert_eq!(
            host_principals("db.primary", "prod"),
            ["db.primary.prod.vm"]
        );
        assert_eq!(
            host_principals("db.primary.prod", "vm"),
            ["db.primary.prod.vm.vm"]
        );
        assert_eq!(
            vm_of_host_name("db.primary.prod.vm.vm"),
            Some(("db.primary.prod", "vm"))
        );
        assert_eq!(vm_of_host_name("web.vm"), None);
        assert_eq!(vm_of_host_name(".dev.vm"), None);
        assert_eq!(vm_of_host_name("web.dev"), None);
    }

    use proptest::prelude::*;

    /// DNS labels, mostly from a few words so that generated pairs overlap as hostile ones do
    /// (`db.primary.prod` in `vm` against `db.primary` in `prod`).
    fn label() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => prop::sample::select(vec!["vm", "db", "primary", "prod", "a", "x-1"]).prop_map(str::to_owned),
            1 => "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?",
        ]
    }

    /// (VM name, namespace): a DNS subdomain with up to four labels, and a DNS label.
    fn pair() -> impl Strategy<Value = (String, String)> {
        (
            prop::collection::vec(label(), 1..5).prop_map(|l| l.join(".")),
            label(),
        )
    }

    proptest! {
        /// Issue 32: no two distinct (name, namespace) pairs share a host principal, a
        /// known_hosts key or an ssh-config host, and each gives its pair back.
        #[test]
        fn host_names_are_injective(a in pair(), other in pair(), pick in 0u8..3) {
            // Besides an independent pair, the hostile neighbours of `a`: its whole name moved
            // into namespace `vm`, and its name split at its last dot.
            let b = match pick {
                0 => (format!("{}.{}", a.0, a.1), "vm".to_string()),
                1 => match a.0.rsplit_once('.') {
                    Some((n, ns)) => (n.to_string(), ns.to_string()),
                    None => other,
                },
                _ => other,
            };
            let host = |(n, ns): &(String, String)| host_name(n, ns);
            let known_hosts_key = |(n, ns): &(String, String)| crate::ssh::hostkey::HostVerifier {
                vm: n.clone(),
                namespace: ns.clone(),
                ca_keys: Vec::new(),
                known_hosts: Default::default(),
                strict: Default::default(),
                prompt: None,
                certificate_required: true,
                revoked: Default::default(),
            }
            .host_name();
            for p in [&a, &b] {
                let h = host(p);
                prop_assert_eq!(vm_of_host_name(&h), Some((p.0.as_str(), p.1.as_str())));
                let target = crate::ssh::config::vm_of_host(&host(p)).unwrap();
                prop_assert_eq!(&target.name, &p.0);
                prop_assert_eq!(target.namespace.as_deref(), Some(p.1.as_str()));
                prop_assert_eq!(known_hosts_key(p), host(p));
            }
            if a != b {
                let pa = host_principals(&a.0, &a.1);
                prop_assert!(host_principals(&b.0, &b.1).iter().all(|p| !pa.contains(p)));
                prop_assert_ne!(known_hosts_key(&a), known_hosts_key(&b));
                prop_assert_ne!(host(&a), host(&b));
            }
        }
    }

    #[test]
    fn wire_names_are_camel_case() {
        let request = CertificateRequest {
            api_version: format!("{GROUP}/{VERSION}"),
            kind: KIND.into(),
            spec: CertificateRequestSpec {
                public_key: "ssh-ed25519 AAAA".into(),
                login: Some("kubevm".into()),
                ttl_seconds: Some(300),
                port_forwarding: true,
                ..Default::default()
            },
            status: None,
        };
        let json = serde_json::to_value(&request).unwrap();
        assert_eq!(json["apiVersion"], "ssh.kubevm.io/v1alpha1");
        assert_eq!(json["spec"]["publicKey"], "ssh-ed25519 AAAA");
        assert_eq!(json["spec"]["ttlSeconds"], 300);
        assert_eq!(json["spec"]["portForwarding"], true);
        assert!(json.get("status").is_none());
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    }
}
