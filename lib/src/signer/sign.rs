//! Signing a [`Decision`] with the CA key: the one place certificates are built, for the
//! signer service and for the direct mode alike.

use std::time::{SystemTime, UNIX_EPOCH};

use russh::keys::ssh_key::certificate::{Builder, CertType};
use russh::keys::ssh_key::{self, Certificate, HashAlg, PrivateKey, PublicKey};

use super::policy::Decision;
use super::{CertificateStatus, rfc3339};

/// How far in the past a certificate becomes valid, for clock skew between signer and guest.
pub const BACKDATE_SECS: u64 = 60;

/// A signed certificate with what the audit line and the API answer say of it.
#[derive(Debug, Clone)]
pub struct Signed {
    /// The certificate.
    pub certificate: Certificate,
    /// Its serial number (random, never 0).
    pub serial: u64,
    /// SHA-256 fingerprint of the certified key.
    pub fingerprint: String,
}

impl Signed {
    /// The status of the API answer.
    pub fn status(&self) -> Result<CertificateStatus, ssh_key::Error> {
        Ok(CertificateStatus {
            certificate: self.certificate.to_openssh()?,
            key_id: self.certificate.key_id().to_owned(),
            serial: self.serial.to_string(),
            principals: self.certificate.valid_principals().to_vec(),
            valid_after: rfc3339(self.certificate.valid_after()),
            valid_before: rfc3339(self.certificate.valid_before()),
        })
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Sign `public_key` as `decision` says, valid from a minute ago for `decision.ttl`.
pub fn sign(
    ca: &PrivateKey,
    public_key: &PublicKey,
    cert_type: CertType,
    decision: &Decision,
) -> Result<Signed, ssh_key::Error> {
    let now = now_secs();
    sign_window(
        ca,
        public_key,
        cert_type,
        decision,
        now.saturating_sub(BACKDATE_SECS),
        now.saturating_add(decision.ttl.as_secs()),
    )
}

/// Sign for an explicit validity window (`decision.ttl` is not used; tests make expired
/// certificates with it).
pub fn sign_window(
    ca: &PrivateKey,
    public_key: &PublicKey,
    cert_type: CertType,
    decision: &Decision,
    valid_after: u64,
    valid_before: u64,
) -> Result<Signed, ssh_key::Error> {
    let mut rng = ssh_key::rand_core::UnwrapErr(ssh_key::getrandom::SysRng);
    let mut builder = Builder::new_with_random_nonce(
        &mut rng,
        public_key.key_data().clone(),
        valid_after,
        valid_before,
    )?;
    let serial = ssh_key::rand_core::Rng::next_u64(&mut rng).max(1);
    builder.serial(serial)?;
    builder.cert_type(cert_type)?;
    builder.key_id(decision.key_id.clone())?;
    for principal in &decision.principals {
        builder.valid_principal(principal.clone())?;
    }
    for extension in &decision.extensions {
        builder.extension(*extension, "")?;
    }
    let certificate = builder.sign(ca)?;
    Ok(Signed {
        certificate,
        serial,
        fingerprint: public_key.fingerprint(HashAlg::Sha256).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::CaBundle;
    use crate::signer::CertificateRequestSpec;
    use crate::signer::policy::{Caller, Limits, VmFacts, user_certificate};

    #[test]
    fn ssh_keygen_reads_what_the_policy_decided() {
        let ca = CaBundle::generate().unwrap();
        let key = crate::ssh::cert::fresh_key().unwrap();
        let vm = VmFacts {
            name: "web".into(),
            namespace: "dev".into(),
            scoped: true,
            ..Default::default()
        };
        let spec = CertificateRequestSpec {
            pty: true,
            ttl_seconds: Some(120),
            ..Default::default()
        };
        let caller = Caller {
            user: "alice".into(),
            ..Default::default()
        };
        let decision = user_certificate(&Limits::default(), &caller, &vm, &spec).unwrap();
        let signed = sign(
            ca.signing_key(),
            key.public_key(),
            CertType::User,
            &decision,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("id-cert.pub");
        std::fs::write(&path, signed.certificate.to_openssh().unwrap()).unwrap();
        let out = std::process::Command::new("ssh-keygen")
            .arg("-L")
            .arg("-f")
            .arg(&path)
            .output()
            .expect("ssh-keygen (openssh-client) is installed by tests/tools/install-test-deps.sh");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(
            text.contains("Key ID: \"kubectl-vm:alice:dev/web\""),
            "{text}"
        );
        assert!(
            text.contains(&format!("Serial: {}", signed.serial)),
            "{text}"
        );
        let principals = text.split("Principals:").nth(1).unwrap();
        let principals = principals.split("Critical Options:").next().unwrap();
        assert_eq!(
            principals.split_whitespace().collect::<Vec<_>>(),
            ["kubevm@web.dev"]
        );
        let extensions = text.split("Extensions:").nth(1).unwrap();
        assert_eq!(
            extensions.split_whitespace().collect::<Vec<_>>(),
            ["permit-pty"]
        );
        // Valid for 2 minutes plus the minute of backdating.
        let c = &signed.certificate;
        assert_eq!(c.valid_before() - c.valid_after(), 180);
    }
}
