//! A VM's SSH host identity: an Ed25519 host key and a host certificate signed by the CA, so
//! clients trust the VM through the CA instead of trust-on-first-use.

use std::time::Duration;

use ssh_key::certificate::CertType;
use ssh_key::{Algorithm, Certificate, LineEnding, PrivateKey};

use super::{CaBundle, CaError};

/// How long a host certificate is valid unless told otherwise: one year. Bounded, so a host key
/// that leaked (a copied disk, an old snapshot) stops being vouched for by itself; not shorter,
/// because a renewed certificate (`kubectl vm ca rotate` re-certifies each VM's key) reaches
/// the guest only at its next boot, and a year spans the usual patch-and-reboot cycle, while a
/// VM whose certificate expired can no longer be reached by `ssh` at all (the platform vouches
/// for it, so there is no fall-back to trust on first use).
pub const DEFAULT_HOST_CERT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The principals a VM's host certificate names: the one function that decides them.
pub use crate::signer::host_principals;

/// A host key pair and its certificate, all in OpenSSH text form, ready for cloud-init.
#[derive(Clone, PartialEq, Eq)]
pub struct HostKeys {
    /// Private key, `-----BEGIN OPENSSH PRIVATE KEY-----` form.
    pub private_key: String,
    /// Public key, one line.
    pub public_key: String,
    /// Host certificate, one line (`ssh-ed25519-cert-v01@openssh.com …`).
    pub certificate: String,
}

impl std::fmt::Debug for HostKeys {
    /// Leaves the private key out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKeys")
            .field("public_key", &self.public_key)
            .field("certificate", &self.certificate)
            .finish_non_exhaustive()
    }
}

impl HostKeys {
    /// A fresh Ed25519 host key for VM `vm` in `namespace`.
    pub fn generate_key(vm: &str, namespace: &str) -> Result<PrivateKey, CaError> {
        let mut rng = ssh_key::rand_core::UnwrapErr(ssh_key::getrandom::SysRng);
        let mut key = PrivateKey::random(&mut rng, Algorithm::Ed25519)?;
        key.set_comment(format!("kubevm-host:{namespace}/{vm}"));
        Ok(key)
    }

    /// The key and a certificate for it (from the signer) in cloud-init form.
    pub fn with_certificate(
        key: &PrivateKey,
        certificate: &Certificate,
    ) -> Result<HostKeys, CaError> {
        Ok(HostKeys {
            private_key: key.to_openssh(LineEnding::LF)?.to_string(),
            public_key: key.public_key().to_openssh()?,
            certificate: certificate.to_openssh()?,
        })
    }

    /// Generate a host key for VM `vm` in `namespace` and sign a host certificate for it with
    /// the CA's signing key (the direct mode, without a signer service), valid from now (less
    /// a minute of clock skew) for `validity`.
    pub fn issue(
        ca: &CaBundle,
        vm: &str,
        namespace: &str,
        validity: Duration,
    ) -> Result<HostKeys, CaError> {
        let key = Self::generate_key(vm, namespace)?;
        let limits = crate::signer::policy::Limits {
            host_validity: validity,
            ..Default::default()
        };
        let decision = crate::signer::policy::host_certificate(&limits, vm, namespace);
        let signed = crate::signer::sign::sign(
            ca.signing_key(),
            key.public_key(),
            CertType::Host,
            &decision,
        )?;
        Self::with_certificate(&key, &signed.certificate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ssh_key::{Certificate, HashAlg};

    #[test]
    fn host_certificate_is_signed_by_the_ca() {
        let ca = CaBundle::generate().unwrap();
        let host = HostKeys::issue(&ca, "web", "prod", DEFAULT_HOST_CERT_VALIDITY).unwrap();
        let cert = Certificate::from_openssh(&host.certificate).unwrap();
        assert_eq!(cert.cert_type(), CertType::Host);
        assert_eq!(cert.valid_principals(), ["web.prod.vm"]);
        let ca_fp = ca.signing_key().public_key().fingerprint(HashAlg::Sha256);
        cert.validate([&ca_fp]).unwrap();
        let key = PrivateKey::from_openssh(&host.private_key).unwrap();
        assert_eq!(cert.public_key(), key.public_key().key_data());
        assert!(host.public_key.starts_with("ssh-ed25519 "));
        // Bounded validity: a year (plus the minute of clock skew allowed before now).
        let span = cert.valid_before() - cert.valid_after();
        assert!(span <= 365 * 24 * 3600 + 120, "{span}");
        assert!(span >= 365 * 24 * 3600, "{span}");
        assert!(!format!("{host:?}").contains("PRIVATE KEY"));
    }

    #[test]
    fn ssh_keygen_reads_the_certificate() {
        let ca = CaBundle::generate().unwrap();
        let host = HostKeys::issue(&ca, "db", "team-a", Duration::from_secs(3600)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ssh_host_ed25519_key-cert.pub");
        std::fs::write(&path, &host.certificate).unwrap();
        // Fails (never skips) without ssh-keygen: CI installs openssh-client.
        let out = std::process::Command::new("ssh-keygen")
            .arg("-L")
            .arg("-f")
            .arg(&path)
            .output()
            .expect("ssh-keygen not found: install openssh-client");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("host certificate"), "{text}");
        // The signing CA, fingerprinted by ssh-keygen itself.
        let ca_pub = dir.path().join("ca.pub");
        std::fs::write(&ca_pub, &ca.public_keys_openssh().unwrap()[0]).unwrap();
        let listed = std::process::Command::new("ssh-keygen")
            .args(["-l", "-E", "sha256", "-f"])
            .arg(&ca_pub)
            .output()
            .expect("ssh-keygen not found: install openssh-client");
        let listed = String::from_utf8_lossy(&listed.stdout);
        let ca_fingerprint = listed.split_whitespace().nth(1).expect("a fingerprint");
        assert!(
            text.contains(&format!("Signing CA: ED25519 {ca_fingerprint}")),
            "{text}"
        );
        assert!(
            text.contains("db.team-a.vm") && text.contains("Key ID: \"kubevm-host:team-a/db\"")
        );
    }
}
