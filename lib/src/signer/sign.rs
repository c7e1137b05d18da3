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

/// Default smallest RSA modulus certified (NIST SP 800-57: 3072 bits for use beyond 2030).
pub const DEFAULT_MIN_RSA_BITS: u32 = 3072;

/// Whether the signer certifies `key`: Ed25519, ECDSA on NIST P-256/384/521, the FIDO
/// `sk-ssh-ed25519@openssh.com` and `sk-ecdsa-sha2-nistp256@openssh.com`, and RSA with a
/// modulus of at least `min_rsa_bits` and an odd public exponent above 1. Everything else
/// (DSA, short RSA, certificates, unknown algorithms) is refused with why, in one line.
pub fn check_key(key: &PublicKey, min_rsa_bits: u32) -> Result<(), String> {
    use ssh_key::public::KeyData;
    match key.key_data() {
        KeyData::Ed25519(_)
        | KeyData::Ecdsa(_)
        | KeyData::SkEd25519(_)
        | KeyData::SkEcdsaSha2NistP256(_) => Ok(()),
        KeyData::Rsa(rsa) => {
            // Counted from the top set bit (ssh-key's key_size() counts whole bytes).
            let n = rsa.n().as_positive_bytes().unwrap_or_default();
            let bits = n.first().map_or(0, |top| {
                (n.len() as u32 - 1) * 8 + (8 - top.leading_zeros())
            });
            let e = rsa.e().as_positive_bytes().unwrap_or_default();
            if bits < min_rsa_bits {
                Err(format!(
                    "an RSA key of {bits} bits is too short: at least {min_rsa_bits} bits, or use ed25519 or ECDSA"
                ))
            } else if e.last().is_none_or(|b| b & 1 == 0) || e == [1] {
                Err("an RSA key whose public exponent is not an odd number above 1".into())
            } else {
                Ok(())
            }
        }
        other => Err(format!(
            "key type {} is not certified: use ed25519, ECDSA (nistp256/384/521), sk-ssh-ed25519@openssh.com, sk-ecdsa-sha2-nistp256@openssh.com or RSA of at least {min_rsa_bits} bits",
            other.algorithm()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::CaBundle;

    /// A key made by `ssh-keygen -t TYPE [-b BITS]`, or None when this ssh-keygen cannot make
    /// that type (DSA is gone from OpenSSH 10).
    fn keygen(dir: &std::path::Path, kind: &str, bits: Option<&str>) -> Option<PublicKey> {
        let path = dir.join(format!("{kind}-{}", bits.unwrap_or("default")));
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(path.with_extension("pub"));
        let mut cmd = std::process::Command::new("ssh-keygen");
        cmd.args(["-q", "-N", "", "-t", kind]);
        if let Some(bits) = bits {
            cmd.args(["-b", bits]);
        }
        let out = cmd
            .arg("-f")
            .arg(&path)
            .output()
            .expect("ssh-keygen (openssh-client) is installed");
        if !out.status.success() {
            return None;
        }
        let text = std::fs::read_to_string(path.with_extension("pub")).unwrap();
        Some(PublicKey::from_openssh(text.trim()).unwrap())
    }

    /// Issue 32 item 6: the signer certified a 512-bit RSA key and one with n = 15.
    #[test]
    fn only_strong_key_types_are_certified() {
        let dir = tempfile::tempdir().unwrap();
        // (type, bits, certified with the default 3072, certified with a 2048 minimum)
        let cases = [
            ("rsa", Some("1024"), false, false),
            ("rsa", Some("2048"), false, true),
            ("rsa", Some("3072"), true, true),
            ("ed25519", None, true, true),
            ("ecdsa", Some("256"), true, true),
            ("ecdsa", Some("384"), true, true),
            ("ecdsa", Some("521"), true, true),
        ];
        for (kind, bits, default, with_2048) in cases {
            let key = keygen(dir.path(), kind, bits).expect("ssh-keygen makes it");
            assert_eq!(
                check_key(&key, DEFAULT_MIN_RSA_BITS).is_ok(),
                default,
                "{kind} {bits:?}"
            );
            assert_eq!(check_key(&key, 2048).is_ok(), with_2048, "{kind} {bits:?}");
        }
        let err = check_key(
            &keygen(dir.path(), "rsa", Some("2048")).unwrap(),
            DEFAULT_MIN_RSA_BITS,
        )
        .unwrap_err();
        assert_eq!(
            err,
            "an RSA key of 2048 bits is too short: at least 3072 bits, or use ed25519 or ECDSA"
        );
        if let Some(dsa) = keygen(dir.path(), "dsa", None) {
            let err = check_key(&dsa, DEFAULT_MIN_RSA_BITS).unwrap_err();
            assert!(
                err.starts_with("key type ssh-dss is not certified"),
                "{err}"
            );
        }
        // The reviewer's fake RSA key, n = 15 and e = 65537 (RFC 4253 §6.6 wire format).
        let mut blob = Vec::new();
        for field in [&b"ssh-rsa"[..], &[0x01, 0x00, 0x01], &[0x0f]] {
            blob.extend_from_slice(&(field.len() as u32).to_be_bytes());
            blob.extend_from_slice(field);
        }
        use base64::Engine;
        let text = format!(
            "ssh-rsa {}",
            base64::engine::general_purpose::STANDARD.encode(&blob)
        );
        let fake = PublicKey::from_openssh(&text).unwrap();
        let err = check_key(&fake, DEFAULT_MIN_RSA_BITS).unwrap_err();
        assert!(
            err.starts_with("an RSA key of 4 bits is too short"),
            "{err}"
        );
        // FIDO keys (ssh-keygen needs a token to make them): the wire format of PROTOCOL.u2f
        // around the points of ssh-keygen's ed25519 and nistp256 keys.
        let ed = keygen(dir.path(), "ed25519", None).unwrap();
        let ec = keygen(dir.path(), "ecdsa", Some("256")).unwrap();
        let ed_point = ed.key_data().ed25519().unwrap().0.to_vec();
        let ec_point = ec.key_data().ecdsa().unwrap().as_sec1_bytes().to_vec();
        for (name, fields) in [
            (
                "sk-ssh-ed25519@openssh.com",
                vec![ed_point, b"ssh:".to_vec()],
            ),
            (
                "sk-ecdsa-sha2-nistp256@openssh.com",
                vec![b"nistp256".to_vec(), ec_point, b"ssh:".to_vec()],
            ),
        ] {
            let mut blob = Vec::new();
            for field in std::iter::once(name.as_bytes().to_vec()).chain(fields) {
                blob.extend_from_slice(&(field.len() as u32).to_be_bytes());
                blob.extend_from_slice(&field);
            }
            let text = format!(
                "{name} {}",
                base64::engine::general_purpose::STANDARD.encode(&blob)
            );
            let key = PublicKey::from_openssh(&text).unwrap();
            assert_eq!(key.algorithm().as_str(), name);
            assert!(check_key(&key, DEFAULT_MIN_RSA_BITS).is_ok(), "{name}");
        }
    }
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
