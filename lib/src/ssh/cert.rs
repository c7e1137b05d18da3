//! Short-lived user certificates: a fresh in-memory key per run, signed through the
//! [`Signer`] seam.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use russh::keys::ssh_key::certificate::CertType;
use russh::keys::ssh_key::{self, Algorithm, Certificate, PrivateKey, PublicKey};

use super::SshError;
use crate::ca::CaBundle;

/// Default certificate lifetime (`--ttl`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);
/// Longest certificate lifetime accepted.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// How far in the past a certificate becomes valid, for clock skew between us and the guest.
pub const BACKDATE: Duration = Duration::from_secs(60);

/// A host key named on the command line (`ca revoke --key`), with its SHA256 fingerprint.
#[derive(Debug, Clone)]
pub struct NamedHostKey {
    /// The key.
    pub key: PublicKey,
    /// `SHA256:…`.
    pub fingerprint: String,
}

/// The host key in `text`: an OpenSSH public key line, or a host certificate line (its key).
pub fn host_key_of(text: &str) -> Result<NamedHostKey, String> {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .ok_or("no key in it")?;
    let key = if let Ok(cert) = Certificate::from_openssh(line) {
        if cert.cert_type() != CertType::Host {
            return Err("it is a user certificate, not a host key".into());
        }
        PublicKey::from(cert.public_key().clone())
    } else {
        PublicKey::from_openssh(line)
            .map_err(|e| format!("not an OpenSSH public key or certificate: {e}"))?
    };
    let fingerprint = key.fingerprint(ssh_key::HashAlg::Sha256).to_string();
    Ok(NamedHostKey { key, fingerprint })
}

/// Check a `--ttl` value: more than zero and at most [`MAX_TTL`].
pub fn check_ttl(ttl: Duration) -> Result<(), String> {
    if ttl.is_zero() {
        Err("--ttl must be more than 0".into())
    } else if ttl > MAX_TTL {
        Err(format!(
            "--ttl {}s is longer than the maximum of 1h",
            ttl.as_secs()
        ))
    } else {
        Ok(())
    }
}

/// The key ID written into a user certificate, so the guest's sshd log names the person:
/// `kubectl-vm:<kubernetes user>:<namespace>/<vm>`.
pub fn key_id(kubernetes_user: &str, namespace: &str, vm: &str) -> String {
    format!("kubectl-vm:{kubernetes_user}:{namespace}/{vm}")
}

/// What a user certificate should say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRequest {
    /// The login name the certificate is good for (its only principal).
    pub principal: String,
    /// The key ID (see [`key_id`]).
    pub key_id: String,
    /// Lifetime from now; the certificate is also valid [`BACKDATE`] in the past.
    pub ttl: Duration,
    /// Add `permit-pty` (a terminal session).
    pub pty: bool,
    /// Add `permit-port-forwarding` (`-L`).
    pub port_forwarding: bool,
    /// Also valid for the ssh-config flow, which needs every permission OpenSSH might use.
    pub interactive_all: bool,
}

/// Signs user certificates. Today: [`CaSigner`], which holds the CA key read from the CA
/// Secret; an in-cluster signing service can implement the same trait so users never hold
/// the CA key.
pub trait Signer: Send + Sync {
    /// Sign a certificate for `public_key` as `request` says.
    fn sign(
        &self,
        public_key: &PublicKey,
        request: &CertRequest,
    ) -> impl Future<Output = Result<Certificate, SshError>> + Send;
}

/// A [`Signer`] holding the CA private key in memory.
#[derive(Debug, Clone)]
pub struct CaSigner {
    bundle: CaBundle,
}

impl CaSigner {
    /// Sign with the newest key of `bundle`.
    pub fn new(bundle: CaBundle) -> CaSigner {
        CaSigner { bundle }
    }
}

use crate::signer::sign::now_secs;

/// Sign a user certificate with `ca` directly (what [`CaSigner`] does), valid from
/// `now - BACKDATE` to `now + ttl`.
pub fn sign_with_key(
    ca: &PrivateKey,
    public_key: &PublicKey,
    request: &CertRequest,
) -> Result<Certificate, SshError> {
    check_ttl(request.ttl).map_err(SshError::Usage)?;
    let now = now_secs();
    sign_window(
        ca,
        public_key,
        request,
        now.saturating_sub(BACKDATE.as_secs()),
        now + request.ttl.as_secs(),
    )
}

/// Sign for an explicit validity window (tests use it for expired certificates): `request`
/// as a [`crate::signer::policy::Decision`] with its one principal, through the signer's
/// certificate builder.
pub fn sign_window(
    ca: &PrivateKey,
    public_key: &PublicKey,
    request: &CertRequest,
    valid_after: u64,
    valid_before: u64,
) -> Result<Certificate, SshError> {
    let mut extensions = Vec::new();
    if request.pty || request.interactive_all {
        extensions.push("permit-pty");
    }
    if request.port_forwarding || request.interactive_all {
        extensions.push("permit-port-forwarding");
    }
    let decision = crate::signer::policy::Decision {
        principals: vec![request.principal.clone()],
        key_id: request.key_id.clone(),
        ttl: request.ttl,
        extensions,
        login: Some(request.principal.clone()),
    };
    Ok(crate::signer::sign::sign_window(
        ca,
        public_key,
        CertType::User,
        &decision,
        valid_after,
        valid_before,
    )?
    .certificate)
}

impl Signer for CaSigner {
    fn sign(
        &self,
        public_key: &PublicKey,
        request: &CertRequest,
    ) -> impl Future<Output = Result<Certificate, SshError>> + Send {
        let result = sign_with_key(self.bundle.user_signing_key(), public_key, request);
        async move { result }
    }
}

/// A fresh Ed25519 key that lives only in memory.
pub fn fresh_key() -> Result<PrivateKey, SshError> {
    let mut rng = ssh_key::rand_core::UnwrapErr(ssh_key::getrandom::SysRng);
    Ok(PrivateKey::random(&mut rng, Algorithm::Ed25519)?)
}

/// A fresh key with a certificate for it: what `ssh` authenticates with.
#[derive(Clone)]
pub struct UserIdentity {
    /// The private key (never written to disk by `ssh`).
    pub key: Arc<PrivateKey>,
    /// Its certificate.
    pub certificate: Certificate,
}

impl std::fmt::Debug for UserIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserIdentity")
            .field("key_id", &self.certificate.key_id())
            .field("principals", &self.certificate.valid_principals())
            .finish_non_exhaustive()
    }
}

impl UserIdentity {
    /// Generate a key and have `signer` certify it.
    pub async fn issue<S: Signer>(signer: &S, request: &CertRequest) -> Result<Self, SshError> {
        let key = fresh_key()?;
        let certificate = signer.sign(key.public_key(), request).await?;
        Ok(UserIdentity {
            key: Arc::new(key),
            certificate,
        })
    }

    /// The private key and the certificate in OpenSSH file form (for `ssh -i` and
    /// `CertificateFile`); whoever writes them must make them 0600.
    pub fn openssh_files(&self) -> Result<(String, String), SshError> {
        let key = self.key.to_openssh(ssh_key::LineEnding::LF)?.to_string();
        Ok((key, format!("{}\n", self.certificate.to_openssh()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use russh::keys::ssh_key::HashAlg;

    fn request() -> CertRequest {
        CertRequest {
            principal: "kubevm".into(),
            key_id: key_id("alice", "prod", "web"),
            ttl: DEFAULT_TTL,
            pty: true,
            port_forwarding: false,
            interactive_all: false,
        }
    }

    #[test]
    fn ttl_limits() {
        assert!(check_ttl(Duration::from_secs(300)).is_ok());
        assert!(check_ttl(Duration::from_secs(3600)).is_ok());
        assert!(check_ttl(Duration::from_secs(3601)).is_err());
        assert!(check_ttl(Duration::ZERO).is_err());
    }

    #[tokio::test]
    async fn certificate_content() {
        let ca = CaBundle::generate().unwrap();
        let signer = CaSigner::new(ca.clone());
        let id = UserIdentity::issue(&signer, &request()).await.unwrap();
        let cert = &id.certificate;
        assert_eq!(cert.cert_type(), CertType::User);
        assert_eq!(cert.valid_principals(), ["kubevm"]);
        assert_eq!(cert.key_id(), "kubectl-vm:alice:prod/web");
        let exts: Vec<_> = cert.extensions().keys().cloned().collect();
        assert_eq!(exts, ["permit-pty"]);
        let now = now_secs();
        assert!(cert.valid_after() <= now - 59 && cert.valid_after() >= now - 61);
        assert!(cert.valid_before() >= now + 299 && cert.valid_before() <= now + 301);
        let ca_fp = ca.signing_key().public_key().fingerprint(HashAlg::Sha256);
        cert.validate([&ca_fp]).unwrap();
        assert_eq!(cert.public_key(), id.key.public_key().key_data());
    }

    #[test]
    fn ssh_keygen_agrees() {
        let ca = CaBundle::generate().unwrap();
        let key = fresh_key().unwrap();
        let mut req = request();
        req.port_forwarding = true;
        let cert = sign_with_key(ca.signing_key(), key.public_key(), &req).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("id-cert.pub");
        std::fs::write(&path, cert.to_openssh().unwrap()).unwrap();
        let out = std::process::Command::new("ssh-keygen")
            .arg("-L")
            .arg("-f")
            .arg(&path)
            .output()
            .expect("ssh-keygen (openssh-client) is installed by tests/tools/install-test-deps.sh");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("user certificate"), "{text}");
        assert!(
            text.contains("Key ID: \"kubectl-vm:alice:prod/web\""),
            "{text}"
        );
        assert!(text.contains(&ca.fingerprints()[0]), "{text}");
        let exts = text.split("Extensions:").nth(1).unwrap();
        assert!(exts.contains("permit-pty") && exts.contains("permit-port-forwarding"));
        assert!(!exts.contains("permit-X11") && !exts.contains("permit-agent"));
    }
}
