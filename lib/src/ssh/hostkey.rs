//! Host verification: a host certificate signed by the platform CA naming this VM only
//! (`NAME.NAMESPACE.vm`, [`crate::signer::host_name`]), else, for VMs whose trust the platform
//! did not set up, the key recorded in kubectl-vm's own known_hosts file, keyed
//! `NAME.NAMESPACE.vm`, with OpenSSH's `StrictHostKeyChecking` choices.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use russh::keys::ssh_key::certificate::CertType;
use russh::keys::ssh_key::{Certificate, HashAlg, PublicKey};

/// `--strict-host-key-checking`: what to do with a host that is not known yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StrictHostKeyChecking {
    /// Ask on the terminal (refuse without one), like OpenSSH's default.
    #[default]
    Ask,
    /// Refuse unknown hosts.
    Yes,
    /// Record unknown hosts without asking.
    AcceptNew,
    /// Record unknown hosts without asking (a changed key still refuses).
    No,
}

impl std::str::FromStr for StrictHostKeyChecking {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ask" => Ok(Self::Ask),
            "yes" => Ok(Self::Yes),
            "accept-new" => Ok(Self::AcceptNew),
            "no" | "off" => Ok(Self::No),
            other => Err(format!(
                "invalid --strict-host-key-checking {other:?}: use yes, accept-new, no or ask"
            )),
        }
    }
}

/// The question asked for an unknown host (OpenSSH wording).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownHost {
    /// `NAME.NAMESPACE`.
    pub host: String,
    /// Algorithm, e.g. `ED25519`.
    pub algorithm: String,
    /// `SHA256:…`.
    pub fingerprint: String,
}

/// Answers the unknown-host question; `None` means no terminal to ask on.
pub type Prompt = Arc<dyn Fn(&UnknownHost) -> Option<bool> + Send + Sync>;

/// Why a host was not trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRejection {
    /// The host certificate is not one the platform CA issued for this VM.
    BadCertificate {
        /// What is wrong with it.
        reason: String,
    },
    /// The known_hosts file holds another key for this host.
    Changed {
        /// `NAME.NAMESPACE`.
        host: String,
        /// Fingerprint on record.
        expected: String,
        /// Fingerprint the host presented.
        presented: String,
        /// The known_hosts file and line.
        file: PathBuf,
        /// 1-based line number of the recorded key.
        line: usize,
    },
    /// Unknown host and strict checking (or a "no" at the prompt).
    Unknown {
        /// The host.
        host: UnknownHost,
        /// Whether the user was asked and said no.
        declined: bool,
    },
    /// A plain host key from a VM whose trust the platform set up: only a host certificate
    /// of the platform CA proves such a VM, never a key on first use.
    CertificateRequired {
        /// `NAME.NAMESPACE.vm`.
        host: String,
        /// Algorithm, e.g. `ED25519`.
        algorithm: String,
        /// `SHA256:…` of the key presented.
        fingerprint: String,
    },
    /// The host key is on the platform's revocation list (`kubectl vm ca revoke`).
    Revoked {
        /// `SHA256:…` of the revoked key.
        fingerprint: String,
    },
    /// The host certificate is revoked by serial or key ID (`kubectl vm ca revoke`).
    RevokedCertificate {
        /// `serial 42` or `key ID "…"`.
        by: String,
    },
    /// The known_hosts file could not be read or written.
    File(String),
}

impl std::fmt::Display for HostRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostRejection::BadCertificate { reason } => {
                write!(f, "host certificate refused: {reason}")
            }
            HostRejection::Changed {
                host,
                expected,
                presented,
                file,
                line,
            } => write!(
                f,
                "REMOTE HOST IDENTIFICATION HAS CHANGED for {host}: expected {expected} ({}:{line}), host presented {presented}; if the VM was recreated, remove that line",
                file.display()
            ),
            HostRejection::Unknown { host, declined } => {
                if *declined {
                    write!(f, "host key verification failed: {} not trusted", host.host)
                } else {
                    write!(
                        f,
                        "host key verification failed: no host key known for {} ({} key {}) and --strict-host-key-checking is yes",
                        host.host, host.algorithm, host.fingerprint
                    )
                }
            }
            HostRejection::CertificateRequired {
                host,
                algorithm,
                fingerprint,
            } => write!(
                f,
                "host key verification failed: {host} was set up by kubectl-vm, so only a host certificate of the platform CA proves it, and it presented a plain {algorithm} key {fingerprint}"
            ),
            HostRejection::Revoked { fingerprint } => write!(
                f,
                "host key verification failed: the host key {fingerprint} is revoked by the platform (`kubectl vm ca revoke`)"
            ),
            HostRejection::RevokedCertificate { by } => write!(
                f,
                "host key verification failed: the host certificate ({by}) is revoked by the platform (`kubectl vm ca revoke`)"
            ),
            HostRejection::File(e) => write!(f, "known_hosts: {e}"),
        }
    }
}

/// How the host was trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostTrust {
    /// A valid platform host certificate.
    Certificate {
        /// The certificate's key ID.
        key_id: String,
    },
    /// The key recorded in known_hosts.
    Known,
    /// A new key, now recorded in known_hosts.
    Recorded {
        /// The host and key recorded.
        host: UnknownHost,
    },
}

/// The known_hosts file under `~/.kube/kubectl-vm/`, keyed `NAME.NAMESPACE.vm`. The former
/// `known_hosts` (keyed `NAME.NAMESPACE`: its entry `db.primary.prod.vm` for VM `db.primary.prod` in
/// namespace `vm` would read as the new key of VM `db.primary` in `prod`) is no longer read.
pub const KNOWN_HOSTS_FILE: &str = "vm_known_hosts";

/// The default known_hosts file: `~/.kube/kubectl-vm/vm_known_hosts`.
pub fn default_known_hosts() -> Option<PathBuf> {
    std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| {
        PathBuf::from(h)
            .join(".kube/kubectl-vm")
            .join(KNOWN_HOSTS_FILE)
    })
}

/// Everything needed to decide whether to trust a host.
#[derive(Clone)]
pub struct HostVerifier {
    /// The VM name.
    pub vm: String,
    /// The VM namespace.
    pub namespace: String,
    /// Trusted platform CA keys (from the CA ConfigMap); empty without a CA.
    pub ca_keys: Vec<PublicKey>,
    /// What the CA ConfigMap revokes: host keys (refused plain or certified), certificate
    /// serials and key IDs.
    pub revoked: crate::ca::krl::Revocations,
    /// The known_hosts file.
    pub known_hosts: PathBuf,
    /// Policy for unknown hosts.
    pub strict: StrictHostKeyChecking,
    /// Asks about unknown hosts when `strict` is [`StrictHostKeyChecking::Ask`].
    pub prompt: Option<Prompt>,
    /// The platform vouches for this VM ([`crate::vm::TrustState::VmScoped`]): only a host
    /// certificate of the platform CA is accepted, a plain key never (no known_hosts, no TOFU).
    pub certificate_required: bool,
}

impl std::fmt::Debug for HostVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostVerifier")
            .field("vm", &self.vm)
            .field("namespace", &self.namespace)
            .field("known_hosts", &self.known_hosts)
            .field("strict", &self.strict)
            .field("certificate_required", &self.certificate_required)
            .finish_non_exhaustive()
    }
}

fn algorithm_name(key: &PublicKey) -> String {
    match key.algorithm() {
        russh::keys::Algorithm::Ed25519 => "ED25519".into(),
        other => other.as_str().to_ascii_uppercase(),
    }
}

impl HostVerifier {
    /// The host's one name, the known_hosts key and certificate principal:
    /// `NAME.NAMESPACE.vm` ([`crate::signer::host_name`]).
    pub fn host_name(&self) -> String {
        crate::signer::host_name(&self.vm, &self.namespace)
    }

    /// Check a host certificate against the platform CA.
    pub fn check_certificate(&self, cert: &Certificate) -> Result<HostTrust, HostRejection> {
        let bad = |reason: String| HostRejection::BadCertificate { reason };
        let fingerprints: Vec<_> = self
            .ca_keys
            .iter()
            .map(|k| k.fingerprint(HashAlg::Sha256))
            .collect();
        let signer = cert.signature_key().fingerprint(HashAlg::Sha256);
        if !fingerprints.contains(&signer) {
            return Err(bad(format!(
                "signed by {signer}, which is not the platform SSH CA{}",
                if self.ca_keys.is_empty() {
                    " (no CA is published: `kubectl vm ca show`)"
                } else {
                    ""
                }
            )));
        }
        // validate() checks the signature and the validity window, not type or principals.
        cert.validate(fingerprints.iter())
            .map_err(|e| bad(format!("invalid: {e}")))?;
        if cert.cert_type() != CertType::Host {
            return Err(bad("it is not a host certificate".into()));
        }
        if !cert.critical_options().is_empty() {
            return Err(bad("it has critical options".into()));
        }
        // It must name this VM, and nothing but this VM: a bare `web` would let web.dev pass
        // for web.prod, and a certificate of the former two-principal form issued for
        // `db.primary.prod` in namespace `vm` also names `db.primary.prod.vm`, this host name
        // of `db.primary` in `prod`. Its other principal gives it away; the legacy
        // `NAME.NAMESPACE` of this very VM is the only other name allowed.
        let name = self.host_name();
        let legacy = format!("{}.{}", self.vm, self.namespace);
        let principals = cert.valid_principals();
        if !principals.contains(&name) || principals.iter().any(|p| *p != name && *p != legacy) {
            return Err(bad(format!(
                "it is for {}, not {name} alone",
                principals.join(", "),
            )));
        }
        Ok(HostTrust::Certificate {
            key_id: cert.key_id().to_string(),
        })
    }

    /// Check a plain host key against known_hosts, asking or recording as `strict` says.
    pub fn check_key(&self, key: &PublicKey) -> Result<HostTrust, HostRejection> {
        let host = self.host_name();
        let presented = key.fingerprint(HashAlg::Sha256).to_string();
        if self.certificate_required {
            return Err(HostRejection::CertificateRequired {
                host,
                algorithm: algorithm_name(key),
                fingerprint: presented,
            });
        }
        let entries = read_known_hosts(&self.known_hosts).map_err(HostRejection::File)?;
        let mut changed = None;
        for entry in entries
            .iter()
            .filter(|e| e.hosts.iter().any(|h| h == &host))
        {
            if entry.key.key_data() == key.key_data() {
                return Ok(HostTrust::Known);
            }
            changed.get_or_insert(entry);
        }
        if let Some(entry) = changed {
            return Err(HostRejection::Changed {
                host,
                expected: entry.key.fingerprint(HashAlg::Sha256).to_string(),
                presented,
                file: self.known_hosts.clone(),
                line: entry.line,
            });
        }
        let unknown = UnknownHost {
            host: host.clone(),
            algorithm: algorithm_name(key),
            fingerprint: presented,
        };
        let accept = match self.strict {
            StrictHostKeyChecking::Yes => false,
            StrictHostKeyChecking::AcceptNew | StrictHostKeyChecking::No => true,
            StrictHostKeyChecking::Ask => match self.prompt.as_ref().and_then(|p| p(&unknown)) {
                Some(answer) => {
                    if !answer {
                        return Err(HostRejection::Unknown {
                            host: unknown,
                            declined: true,
                        });
                    }
                    true
                }
                None => false,
            },
        };
        if !accept {
            return Err(HostRejection::Unknown {
                host: unknown,
                declined: false,
            });
        }
        append_known_host(&self.known_hosts, &host, key).map_err(HostRejection::File)?;
        Ok(HostTrust::Recorded { host: unknown })
    }

    /// Check what the server presented.
    pub fn check(
        &self,
        presented: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<HostTrust, HostRejection> {
        let key_data = match presented {
            russh::keys::PublicKeyOrCertificate::Certificate(cert) => cert.public_key().clone(),
            russh::keys::PublicKeyOrCertificate::PublicKey { key, .. } => key.key_data().clone(),
        };
        if let Some(revoked) = self.revoked.keys.iter().find(|k| *k.key_data() == key_data) {
            return Err(HostRejection::Revoked {
                fingerprint: revoked.fingerprint(HashAlg::Sha256).to_string(),
            });
        }
        if let russh::keys::PublicKeyOrCertificate::Certificate(cert) = presented
            && let Some(by) = self.revoked.certificate_revoked(cert)
        {
            return Err(HostRejection::RevokedCertificate { by: by.to_string() });
        }
        match presented {
            russh::keys::PublicKeyOrCertificate::Certificate(cert) => self.check_certificate(cert),
            russh::keys::PublicKeyOrCertificate::PublicKey { key, .. } => self.check_key(key),
        }
    }
}

/// One usable known_hosts line.
#[derive(Debug, Clone)]
pub struct KnownHost {
    /// Host patterns (plain names only; hashed entries are skipped).
    pub hosts: Vec<String>,
    /// The recorded key.
    pub key: PublicKey,
    /// 1-based line number.
    pub line: usize,
}

/// Read a known_hosts file; a missing file is empty. Markers (`@cert-authority`,
/// `@revoked`), hashed names and unparsable lines are skipped.
pub fn read_known_hosts(path: &Path) -> Result<Vec<KnownHost>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_text = line.trim();
        if line_text.is_empty() || line_text.starts_with('#') || line_text.starts_with('@') {
            continue;
        }
        let Some((hosts, key)) = line_text.split_once(char::is_whitespace) else {
            continue;
        };
        let Ok(key) = PublicKey::from_openssh(key.trim()) else {
            continue;
        };
        out.push(KnownHost {
            hosts: hosts
                .split(',')
                .filter(|h| !h.starts_with('|'))
                .map(str::to_owned)
                .collect(),
            key,
            line: i + 1,
        });
    }
    Ok(out)
}

/// Append `host key` to a known_hosts file, creating it (0600, directory 0700) if needed.
pub fn append_known_host(path: &Path, host: &str, key: &PublicKey) -> Result<(), String> {
    let mut key = key.clone();
    key.set_comment("");
    let line = key
        .to_openssh()
        .map_err(|e| format!("cannot encode the host key: {e}"))?;
    if let Some(dir) = path.parent() {
        crate::ssh::files::create_private_dir(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let mut file = crate::ssh::files::open_private_append(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    writeln!(file, "{host} {}", line.trim())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::{CaBundle, HostKeys};
    use std::time::Duration;

    fn verifier(dir: &Path, ca: &CaBundle, strict: StrictHostKeyChecking) -> HostVerifier {
        HostVerifier {
            vm: "web".into(),
            namespace: "prod".into(),
            ca_keys: ca.public_keys(),
            known_hosts: dir.join("sub/known_hosts"),
            strict,
            prompt: None,
            certificate_required: false,
            revoked: Default::default(),
        }
    }

    fn host_cert(ca: &CaBundle, vm: &str, ns: &str) -> Certificate {
        let keys = HostKeys::issue(ca, vm, ns, Duration::from_secs(3600)).unwrap();
        Certificate::from_openssh(&keys.certificate).unwrap()
    }

    #[test]
    fn platform_host_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CaBundle::generate().unwrap();
        let v = verifier(dir.path(), &ca, StrictHostKeyChecking::Yes);
        assert!(matches!(
            v.check_certificate(&host_cert(&ca, "web", "prod")),
            Ok(HostTrust::Certificate { .. })
        ));
        let other_ca = CaBundle::generate().unwrap();
        let err = v
            .check_certificate(&host_cert(&other_ca, "web", "prod"))
            .unwrap_err();
        assert!(err.to_string().contains("not the platform SSH CA"), "{err}");
        let err = v
            .check_certificate(&host_cert(&ca, "db", "prod"))
            .unwrap_err();
        assert!(err.to_string().contains("not web.prod.vm"), "{err}");
        // web in another namespace, with a certificate of the old form that also named the
        // bare `web`: refused (this passed before host verification required NAME.NAMESPACE).
        let key = HostKeys::generate_key("web", "dev").unwrap();
        let old_form = crate::signer::policy::Decision {
            principals: vec!["web.dev".into(), "web".into()],
            key_id: "kubevm-host:dev/web".into(),
            ttl: Duration::from_secs(3600),
            extensions: vec![],
            login: None,
        };
        let signed = crate::signer::sign::sign(
            ca.signing_key(),
            key.public_key(),
            CertType::Host,
            &old_form,
        )
        .unwrap();
        let err = v.check_certificate(&signed.certificate).unwrap_err();
        assert!(
            err.to_string()
                .contains("it is for web.dev, web, not web.prod.vm alone"),
            "{err}"
        );
        // Still trusted during a CA rotation: the older key signed it.
        let mut rotated = ca.clone();
        rotated.rotate().unwrap();
        let v2 = verifier(dir.path(), &rotated, StrictHostKeyChecking::Yes);
        assert!(v2.check_certificate(&host_cert(&ca, "web", "prod")).is_ok());
    }

    fn sign_host(ca: &CaBundle, principals: &[&str]) -> Certificate {
        let key = HostKeys::generate_key("x", "y").unwrap();
        let decision = crate::signer::policy::Decision {
            principals: principals.iter().map(|p| p.to_string()).collect(),
            key_id: "kubevm-host:test".into(),
            ttl: Duration::from_secs(3600),
            extensions: vec![],
            login: None,
        };
        crate::signer::sign::sign(
            ca.signing_key(),
            key.public_key(),
            CertType::Host,
            &decision,
        )
        .unwrap()
        .certificate
    }

    #[test]
    fn certificates_of_the_former_form_name_only_their_own_vm() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CaBundle::generate().unwrap();
        let mut v = verifier(dir.path(), &ca, StrictHostKeyChecking::Yes);
        v.vm = "db.primary".into();
        v.namespace = "prod".into();
        // This VM's own certificate of the former form keeps working.
        let own = sign_host(&ca, &["db.primary.prod", "db.primary.prod.vm"]);
        assert!(v.check_certificate(&own).is_ok());
        // Issue 32: the former form for db.primary.prod in namespace `vm` named
        // db.primary.prod.vm too, and passed for db.primary in prod.
        let colliding = sign_host(&ca, &["db.primary.prod.vm", "db.primary.prod.vm.vm"]);
        let err = v.check_certificate(&colliding).unwrap_err();
        assert!(
            err.to_string().contains("not db.primary.prod.vm alone"),
            "{err}"
        );
        // The new form for that VM does not even name it.
        let new = host_cert(&ca, "db.primary.prod", "vm");
        assert!(v.check_certificate(&new).is_err());
        assert!(
            v.check_certificate(&host_cert(&ca, "db.primary", "prod"))
                .is_ok()
        );
    }

    #[test]
    fn a_vm_the_platform_vouches_for_needs_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CaBundle::generate().unwrap();
        let key = crate::ssh::cert::fresh_key().unwrap();
        for strict in [
            StrictHostKeyChecking::AcceptNew,
            StrictHostKeyChecking::No,
            StrictHostKeyChecking::Ask,
        ] {
            let mut v = verifier(dir.path(), &ca, strict);
            v.certificate_required = true;
            v.prompt = Some(Arc::new(|_| Some(true)));
            let err = v.check_key(key.public_key()).unwrap_err();
            assert!(
                matches!(&err, HostRejection::CertificateRequired { host, .. } if host == "web.prod.vm"),
                "{err:?}"
            );
            assert!(err.to_string().contains("only a host certificate"), "{err}");
            assert!(!v.known_hosts.exists(), "nothing recorded");
            assert!(v.check_certificate(&host_cert(&ca, "web", "prod")).is_ok());
        }
        // A key recorded earlier does not help either.
        let mut v = verifier(dir.path(), &ca, StrictHostKeyChecking::AcceptNew);
        assert!(v.check_key(key.public_key()).is_ok());
        v.certificate_required = true;
        assert!(v.check_key(key.public_key()).is_err());
    }

    #[test]
    fn revoked_host_keys_are_refused_with_or_without_a_certificate() {
        use russh::keys::PublicKeyOrCertificate;
        let dir = tempfile::tempdir().unwrap();
        let ca = CaBundle::generate().unwrap();
        let keys = HostKeys::issue(&ca, "web", "prod", Duration::from_secs(3600)).unwrap();
        let cert = Certificate::from_openssh(&keys.certificate).unwrap();
        let key = PublicKey::from_openssh(&keys.public_key).unwrap();
        let mut v = verifier(dir.path(), &ca, StrictHostKeyChecking::AcceptNew);
        assert!(
            v.check(&PublicKeyOrCertificate::Certificate(cert.clone()))
                .is_ok()
        );
        v.revoked.keys = vec![key.clone()];
        let expected = key.fingerprint(HashAlg::Sha256).to_string();
        for presented in [
            PublicKeyOrCertificate::Certificate(cert),
            PublicKeyOrCertificate::PublicKey {
                key: key.clone(),
                hash_alg: None,
            },
        ] {
            match v.check(&presented) {
                Err(HostRejection::Revoked { fingerprint }) => assert_eq!(fingerprint, expected),
                other => panic!("{other:?}"),
            }
        }
        assert!(!v.known_hosts.exists(), "a revoked key is not recorded");
    }

    /// A host certificate revoked by serial or by key ID is refused; the same key with a
    /// certificate of another serial and ID, and the hostile pair's certificate, are not.
    #[test]
    fn host_certificates_revoked_by_serial_or_key_id_are_refused() {
        use russh::keys::PublicKeyOrCertificate;
        let dir = tempfile::tempdir().unwrap();
        let ca = CaBundle::generate().unwrap();
        let mut v = verifier(dir.path(), &ca, StrictHostKeyChecking::AcceptNew);
        v.vm = "db.primary".into();
        v.namespace = "prod".into();
        let cert = host_cert(&ca, "db.primary", "prod");
        let fresh = host_cert(&ca, "db.primary", "prod");
        assert!(
            v.check(&PublicKeyOrCertificate::Certificate(cert.clone()))
                .is_ok()
        );
        v.revoked.serials.insert(cert.serial());
        match v.check(&PublicKeyOrCertificate::Certificate(cert.clone())) {
            Err(HostRejection::RevokedCertificate { by }) => {
                assert_eq!(by, format!("serial {}", cert.serial()))
            }
            other => panic!("{other:?}"),
        }
        assert!(
            v.check(&PublicKeyOrCertificate::Certificate(fresh.clone()))
                .is_ok()
        );
        // By key ID: the ID names the pair, so `db.primary.prod` in `vm` is not caught by it.
        v.revoked.serials.clear();
        v.revoked
            .key_ids
            .insert("kubevm-host:prod/db.primary".into());
        let err = v
            .check(&PublicKeyOrCertificate::Certificate(fresh))
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "host key verification failed: the host certificate (key ID \"kubevm-host:prod/db.primary\") is revoked by the platform (`kubectl vm ca revoke`)"
        );
        let mut other = verifier(dir.path(), &ca, StrictHostKeyChecking::AcceptNew);
        other.vm = "db.primary.prod".into();
        other.namespace = "vm".into();
        other.revoked = v.revoked.clone();
        let theirs = host_cert(&ca, "db.primary.prod", "vm");
        assert!(
            other
                .check(&PublicKeyOrCertificate::Certificate(theirs))
                .is_ok()
        );
    }

    #[test]
    fn known_hosts_policy() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CaBundle::generate().unwrap();
        let key = crate::ssh::cert::fresh_key().unwrap();
        let strict = verifier(dir.path(), &ca, StrictHostKeyChecking::Yes);
        assert!(matches!(
            strict.check_key(key.public_key()),
            Err(HostRejection::Unknown {
                declined: false,
                ..
            })
        ));
        let accept = verifier(dir.path(), &ca, StrictHostKeyChecking::AcceptNew);
        assert!(matches!(
            accept.check_key(key.public_key()),
            Ok(HostTrust::Recorded { .. })
        ));
        let text = std::fs::read_to_string(&accept.known_hosts).unwrap();
        assert!(text.starts_with("web.prod.vm ssh-ed25519 "), "{text}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&accept.known_hosts)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(strict.check_key(key.public_key()), Ok(HostTrust::Known));
        let other = crate::ssh::cert::fresh_key().unwrap();
        match strict.check_key(other.public_key()) {
            Err(HostRejection::Changed {
                expected,
                presented,
                line,
                ..
            }) => {
                assert_eq!(
                    expected,
                    key.public_key().fingerprint(HashAlg::Sha256).to_string()
                );
                assert_eq!(
                    presented,
                    other.public_key().fingerprint(HashAlg::Sha256).to_string()
                );
                assert_eq!(line, 1);
            }
            other => panic!("{other:?}"),
        }
        // A changed key refuses even with accept-new / no.
        let no = verifier(dir.path(), &ca, StrictHostKeyChecking::No);
        assert!(matches!(
            no.check_key(other.public_key()),
            Err(HostRejection::Changed { .. })
        ));
    }

    #[test]
    fn ssh_keygen_reads_our_known_hosts() {
        let dir = tempfile::tempdir().unwrap();
        let key = crate::ssh::cert::fresh_key().unwrap();
        let path = dir.path().join("known_hosts");
        append_known_host(&path, "web.prod", key.public_key()).unwrap();
        let out = std::process::Command::new("ssh-keygen")
            .args(["-F", "web.prod", "-f"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("web.prod ssh-ed25519"));
    }

    #[test]
    fn prompt_answers() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CaBundle::generate().unwrap();
        let key = crate::ssh::cert::fresh_key().unwrap();
        let mut v = verifier(dir.path(), &ca, StrictHostKeyChecking::Ask);
        v.prompt = Some(Arc::new(|_| Some(false)));
        assert!(matches!(
            v.check_key(key.public_key()),
            Err(HostRejection::Unknown { declined: true, .. })
        ));
        v.prompt = Some(Arc::new(|h| Some(h.host == "web.prod.vm")));
        assert!(matches!(
            v.check_key(key.public_key()),
            Ok(HostTrust::Recorded { .. })
        ));
    }
}
