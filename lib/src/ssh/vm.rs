//! Connecting to a VM: the Kubernetes user (for the certificate's key ID), the identity
//! (a CA-signed certificate, else `-i FILE` or the ssh-agent), the platform CA keys for host
//! verification, the portforward stream to the guest's sshd, and the SSH handshake over it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::Api;
use kube::api::PostParams;
use russh::keys::PublicKey;

use super::SshError;
use super::cert::{self, UserIdentity};
use super::client::{Auth, Connection};
use super::hostkey::{self, HostVerifier, Prompt, StrictHostKeyChecking};
use crate::api::Kind;
use crate::ca::store;
use crate::cluster::Cluster;
use crate::error::Error;
use crate::flavor::Flavor;
use crate::signer::CertificateRequestSpec;
use crate::signer::client::{self as signer_client, Mode, SignerError};
use crate::signer::policy::{self, Caller, Limits, Refusal, VmFacts};
use crate::signer::sign::sign;
use crate::stream::{self, StreamKind, StreamTarget};
use russh::keys::ssh_key::certificate::CertType;

/// The platform user `create` provisions: the login when none is given.
pub const DEFAULT_USER: &str = crate::names::DEFAULT_PLATFORM_USER;

/// Where and how to log in.
#[derive(Debug, Clone)]
pub struct SshOptions {
    /// The platform.
    pub flavor: Flavor,
    /// VM namespace.
    pub namespace: String,
    /// VM name.
    pub vm: String,
    /// Login name (default [`DEFAULT_USER`]).
    pub user: String,
    /// Guest port of sshd.
    pub port: u16,
    /// Certificate lifetime.
    pub ttl: Duration,
    /// `-i FILE`: use this key instead of a certificate.
    pub identity_file: Option<PathBuf>,
    /// Unknown-host policy.
    pub strict: StrictHostKeyChecking,
    /// The known_hosts file (default `~/.kube/kubectl-vm/known_hosts`).
    pub known_hosts: PathBuf,
    /// Namespace of the platform CA.
    pub ca_namespace: String,
    /// The certificate should allow a terminal.
    pub pty: bool,
    /// The certificate should allow `-L` forwarding.
    pub port_forwarding: bool,
    /// Where the certificate comes from ([`crate::signer::client::mode`]).
    pub mode: Mode,
}

/// Things worth telling the user while connecting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SshEvent {
    /// The CA could not be read; another identity is used (one line).
    Fallback(String),
    /// Something the user should know about how the certificate was made (one line).
    Notice(String),
    /// A new host key was recorded in known_hosts (trust on first use: a VM whose host the
    /// platform does not vouch for).
    HostRecorded {
        /// `NAME.NAMESPACE.vm`.
        host: String,
        /// `SHA256:…`.
        fingerprint: String,
        /// The file.
        file: PathBuf,
    },
}

/// Why connecting failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// A Kubernetes API error before the stream opened (VM not found, forbidden, …).
    #[error("{0}")]
    Api(#[from] Error),
    /// The VM is not reachable now: stopped, paused, no sshd on the port.
    #[error("{0}")]
    Unreachable(String),
    /// SSH failed: host verification, authentication, transport.
    #[error("{0}")]
    Ssh(#[from] SshError),
    /// The signer gave no certificate (unavailable, forbidden, refused).
    #[error("{0}")]
    Signer(#[from] SignerError),
}

/// The login when none is given: the VM's [`crate::names::DEFAULT_LOGIN_ANNOTATION`] (an
/// enrolled VM without the platform user), else [`DEFAULT_USER`]. A VM that cannot be read
/// (not found, not allowed) gives [`DEFAULT_USER`]: connecting reports the real error.
pub async fn default_login(cluster: &Cluster, flavor: Flavor, namespace: &str, vm: &str) -> String {
    let kind = Kind::vm(flavor);
    let annotated = kind
        .api(&cluster.client, Some(namespace))
        .get(vm)
        .await
        .ok()
        .and_then(|o| {
            o.metadata
                .annotations
                .and_then(|a| a.get(crate::names::DEFAULT_LOGIN_ANNOTATION).cloned())
        })
        .filter(|l| policy::valid_login(l));
    annotated.unwrap_or_else(|| DEFAULT_USER.to_owned())
}

/// Whether only a host certificate of the platform CA may prove VM `vm`'s host: the VM says the
/// platform set up its trust ([`crate::vm::TrustState::platform_vouches`]). A VM the user may
/// not read counts as vouched for (fail closed: no trust on first use on a guess); one that does
/// not exist is left to the connection to report.
pub async fn certificate_required(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    vm: &str,
) -> Result<bool, Error> {
    let kind = Kind::vm(flavor);
    match kind.api(&cluster.client, Some(namespace)).get(vm).await {
        Ok(object) => {
            let value = serde_json::to_value(object).unwrap_or_default();
            Ok(crate::vm::TrustState::of(&value).platform_vouches())
        }
        Err(e) => match cluster.error(e, &kind.action("get", Some(namespace)).named(vm)) {
            Error::Forbidden { .. } => Ok(true),
            Error::NotFound { .. } => Ok(false),
            other => Err(other),
        },
    }
}

/// The Kubernetes user name from a SelfSubjectReview, `unknown` if the server cannot say.
pub async fn kubernetes_user(cluster: &Cluster) -> String {
    let api: Api<SelfSubjectReview> = Api::all(cluster.client.clone());
    match api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(review) => review
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "unknown".into()),
        Err(_) => "unknown".into(),
    }
}

/// Pick the identity: `-i FILE` when given; else a fresh in-memory key with a certificate
/// from the signer (signer mode) or signed here with the CA Secret (direct mode, for those
/// who may read it); else the ssh-agent.
pub async fn identity(
    cluster: &Cluster,
    options: &SshOptions,
    events: &(dyn Fn(SshEvent) + Send + Sync),
) -> Result<Auth, ConnectError> {
    if let Some(path) = &options.identity_file {
        let key = russh::keys::load_secret_key(path, None)
            .map_err(|e| SshError::Usage(format!("cannot load the key {}: {e}", path.display())))?;
        return Ok(Auth::Key(Arc::new(key)));
    }
    let spec = CertificateRequestSpec {
        login: Some(options.user.clone()),
        ttl_seconds: Some(options.ttl.as_secs()),
        pty: options.pty,
        port_forwarding: options.port_forwarding,
        ..Default::default()
    };
    let target = CertTarget {
        mode: options.mode,
        flavor: options.flavor,
        namespace: &options.namespace,
        vm: &options.vm,
        ca_namespace: &options.ca_namespace,
    };
    match issue_certificate(cluster, &target, cert::fresh_key()?, spec, events).await? {
        Some(id) => Ok(Auth::Certificate(Box::new(id))),
        None => {
            if std::env::var_os("SSH_AUTH_SOCK").is_none_or(|s| s.is_empty()) {
                return Err(SshError::AuthRefused(format!(
                    "cannot read the SSH CA (Secret {}/{}) and the cluster has no SSH signer: pass -i FILE, or start an ssh-agent with your key",
                    options.ca_namespace,
                    crate::ca::SECRET_NAME
                ))
                .into());
            }
            events(SshEvent::Fallback(format!(
                "cannot read the SSH CA (Secret {}/{}); using the ssh-agent",
                options.ca_namespace,
                crate::ca::SECRET_NAME
            )));
            Ok(Auth::Agent)
        }
    }
}

/// Which VM a certificate is for, and where certificates come from.
#[derive(Debug, Clone, Copy)]
pub struct CertTarget<'a> {
    /// Signer or direct mode.
    pub mode: Mode,
    /// The platform (the direct mode reads the VM).
    pub flavor: Flavor,
    /// VM namespace.
    pub namespace: &'a str,
    /// VM name.
    pub vm: &'a str,
    /// Namespace of the CA (direct mode).
    pub ca_namespace: &'a str,
}

/// A user certificate for `key`: from the signer, or in the direct mode signed here under the
/// same policy. `None` in the direct mode when the CA Secret cannot be read (the caller falls
/// back to other keys).
pub async fn issue_certificate(
    cluster: &Cluster,
    target: &CertTarget<'_>,
    key: russh::keys::PrivateKey,
    spec: CertificateRequestSpec,
    events: &(dyn Fn(SshEvent) + Send + Sync),
) -> Result<Option<UserIdentity>, ConnectError> {
    let certificate = match target.mode {
        Mode::Signer => {
            signer_client::user_certificate(
                cluster,
                target.namespace,
                target.vm,
                key.public_key(),
                spec,
            )
            .await?
        }
        Mode::Direct => {
            let Some(bundle) = store::read_bundle(cluster, target.ca_namespace).await? else {
                return Ok(None);
            };
            events(SshEvent::Notice(signer_client::DIRECT_MODE_NOTICE.into()));
            let kind = Kind::vm(target.flavor);
            let vm = kind
                .api(&cluster.client, Some(target.namespace))
                .get(target.vm)
                .await
                .map_err(|e| {
                    cluster.error(
                        e,
                        &kind.action("get", Some(target.namespace)).named(target.vm),
                    )
                })?;
            let facts = VmFacts::from_object(&serde_json::to_value(vm).unwrap_or_default());
            let caller = Caller {
                user: kubernetes_user(cluster).await,
                ..Default::default()
            };
            let decision = policy::user_certificate(&Limits::default(), &caller, &facts, &spec)
                .map_err(|refusal| {
                    SshError::AuthRefused(match refusal {
                        Refusal::Invalid(m) | Refusal::Forbidden(m) | Refusal::Conflict(m) => m,
                    })
                })?;
            sign(
                bundle.user_signing_key(),
                key.public_key(),
                CertType::User,
                &decision,
            )
            .map_err(SshError::Key)?
            .certificate
        }
    };
    Ok(Some(UserIdentity {
        key: Arc::new(key),
        certificate,
    }))
}

/// The platform CA public keys and what it revokes (host keys, certificate serials and key
/// IDs), read from the CA ConfigMap once; both empty without a CA or for a user who may not
/// read it.
pub async fn host_trust(
    cluster: &Cluster,
    ca_namespace: &str,
) -> Result<(Vec<PublicKey>, crate::ca::krl::Revocations), Error> {
    let config_map = match store::read_configmap(cluster, ca_namespace).await {
        Ok(Some(cm)) => cm,
        Ok(None) | Err(Error::Forbidden { .. }) => return Ok((Vec::new(), Default::default())),
        Err(e) => return Err(e),
    };
    let keys = crate::ca::trusted_keys_from_configmap(&config_map).unwrap_or_default();
    Ok((
        keys,
        crate::ca::krl::Revocations::from_configmap(&config_map),
    ))
}

/// The platform CA public keys, for host certificates; empty without a CA.
pub async fn ca_keys(cluster: &Cluster, ca_namespace: &str) -> Result<Vec<PublicKey>, Error> {
    let lines = match store::read_public_keys(cluster, ca_namespace).await {
        Ok(lines) => lines.unwrap_or_default(),
        // A user who may not read the ConfigMap falls back to known_hosts.
        Err(Error::Forbidden { .. }) => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(lines
        .iter()
        .filter_map(|l| PublicKey::from_openssh(l).ok())
        .collect())
}

/// Open a raw byte stream to `port` of the VM's guest (one portforward websocket), with
/// "VM stopped", "VM paused" and "nothing listens" told apart.
pub async fn open_port(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    vm: &str,
    port: u16,
    protocol: &str,
) -> Result<stream::PlatformStream, ConnectError> {
    let target = StreamTarget::new(
        flavor,
        namespace,
        vm,
        StreamKind::PortForward {
            port,
            protocol: protocol.to_owned(),
        },
    );
    stream::open(cluster, &target)
        .await
        .map_err(|e| classify_open_error(e, namespace, vm, port))
}

/// Turn a failed portforward upgrade into what the user needs to know.
pub fn classify_open_error(err: Error, namespace: &str, vm: &str, port: u16) -> ConnectError {
    match err {
        Error::NotRunning(message) => ConnectError::Unreachable(format!(
            "VM {vm}.{namespace} is not running ({message}); start it with `kubectl vm start`"
        )),
        Error::Conflict(message) if message.to_ascii_lowercase().contains("paused") => {
            ConnectError::Unreachable(format!(
                "VM {vm}.{namespace} is paused ({message}); unpause it first"
            ))
        }
        Error::Api { code, message, .. }
            if code >= 500 && message.to_ascii_lowercase().contains("dial") =>
        {
            ConnectError::Unreachable(format!(
                "nothing accepts connections on port {port} of VM {vm}.{namespace} ({message})"
            ))
        }
        other => ConnectError::Api(other),
    }
}

/// Connect and log in to the VM's sshd.
pub async fn connect(
    cluster: &Cluster,
    options: &SshOptions,
    prompt: Option<Prompt>,
    events: &(dyn Fn(SshEvent) + Send + Sync),
) -> Result<Connection, ConnectError> {
    let auth = identity(cluster, options, events).await?;
    let (ca_keys, revoked) = host_trust(cluster, &options.ca_namespace).await?;
    let verifier = HostVerifier {
        vm: options.vm.clone(),
        namespace: options.namespace.clone(),
        ca_keys,
        revoked,
        known_hosts: options.known_hosts.clone(),
        strict: options.strict,
        prompt,
        certificate_required: certificate_required(
            cluster,
            options.flavor,
            &options.namespace,
            &options.vm,
        )
        .await?,
    };
    let stream = open_port(
        cluster,
        options.flavor,
        &options.namespace,
        &options.vm,
        options.port,
        "tcp",
    )
    .await?;
    let on_host = |trust: &super::HostTrust| {
        if let super::HostTrust::Recorded { host } = trust {
            events(SshEvent::HostRecorded {
                host: host.host.clone(),
                fingerprint: host.fingerprint.clone(),
                file: options.known_hosts.clone(),
            });
        }
    };
    let connection = Connection::connect_with(stream.io, verifier, &options.user, &auth, on_host)
        .await
        .map_err(|e| match e {
            SshError::AuthRefused(m) if matches!(auth, Auth::Certificate(_)) => {
                SshError::AuthRefused(format!(
                    "{m}: the guest does not accept the platform certificate (does it trust the CA? `kubectl vm get {}.{}` shows how it was created)",
                    options.vm, options.namespace
                ))
            }
            other => other,
        })?;
    Ok(connection)
}

/// The default known_hosts path, or an error when `HOME` is unset.
pub fn known_hosts_path() -> Result<PathBuf, SshError> {
    hostkey::default_known_hosts().ok_or_else(|| {
        SshError::Usage(format!(
            "HOME is not set: cannot find ~/.kube/kubectl-vm/{}",
            hostkey::KNOWN_HOSTS_FILE
        ))
    })
}
