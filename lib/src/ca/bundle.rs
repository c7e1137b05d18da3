//! `CaBundle`: the CA's Ed25519 keys, their rotation and their Secret/ConfigMap form.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use ssh_key::{Algorithm, HashAlg, LineEnding, PrivateKey, PublicKey};

use super::objects::metadata;
use super::{CONFIGMAP_NAME, CaError, PRIVATE_KEYS_KEY, PUBLIC_KEYS_KEY, SECRET_NAME};

const PEM_END: &str = "-----END OPENSSH PRIVATE KEY-----";

/// The CA's private keys, oldest first. Every key is trusted; the newest one signs.
#[derive(Clone)]
pub struct CaBundle {
    keys: Vec<PrivateKey>,
}

impl std::fmt::Debug for CaBundle {
    /// Shows fingerprints only, never key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle")
            .field("fingerprints", &self.fingerprints())
            .finish()
    }
}

/// A fresh Ed25519 key with a comment that dates it.
fn new_key() -> Result<PrivateKey, CaError> {
    let mut rng = ssh_key::rand_core::UnwrapErr(ssh_key::getrandom::SysRng);
    let mut key = PrivateKey::random(&mut rng, Algorithm::Ed25519)?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    key.set_comment(format!("kubevm-ca@{now}"));
    Ok(key)
}

/// `SHA256:…` fingerprint of a public key, as `ssh-keygen -l` prints it.
pub fn fingerprint(key: &PublicKey) -> String {
    key.fingerprint(HashAlg::Sha256).to_string()
}

impl CaBundle {
    /// A new CA with one freshly generated Ed25519 key.
    pub fn generate() -> Result<CaBundle, CaError> {
        Ok(CaBundle {
            keys: vec![new_key()?],
        })
    }

    /// The key that signs new host certificates: the newest one (clients trust every
    /// published key, so a VM created during a rotation already carries the new key's).
    pub fn signing_key(&self) -> &PrivateKey {
        self.keys.last().expect("a CaBundle always holds a key")
    }

    /// The key that signs user certificates: the oldest one, which every guest created before
    /// the rotation trusts; after `rotate --finish` that is the new key.
    pub fn user_signing_key(&self) -> &PrivateKey {
        self.keys.first().expect("a CaBundle always holds a key")
    }

    /// All trusted public keys, oldest first.
    pub fn public_keys(&self) -> Vec<PublicKey> {
        self.keys.iter().map(|k| k.public_key().clone()).collect()
    }

    /// All trusted public keys as OpenSSH lines (`ssh-ed25519 AAAA… comment`), oldest first.
    pub fn public_keys_openssh(&self) -> Result<Vec<String>, CaError> {
        self.keys
            .iter()
            .map(|k| k.public_key().to_openssh().map_err(CaError::from))
            .collect()
    }

    /// Fingerprints of all trusted keys, oldest first.
    pub fn fingerprints(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|k| fingerprint(k.public_key()))
            .collect()
    }

    /// Whether an old key is still trusted next to the signing key.
    pub fn in_rotation(&self) -> bool {
        self.keys.len() > 1
    }

    /// Start a rotation: add a new signing key. The old keys stay trusted (published) until
    /// [`CaBundle::finish_rotation`], so host certificates signed by them keep verifying while
    /// VMs pick up the new key on their next boot.
    pub fn rotate(&mut self) -> Result<(), CaError> {
        self.keys.push(new_key()?);
        Ok(())
    }

    /// End a rotation: stop trusting every key but the signing key. Returns how many keys
    /// were dropped.
    pub fn finish_rotation(&mut self) -> usize {
        let dropped = self.keys.len() - 1;
        self.keys.drain(..dropped);
        dropped
    }

    /// The Secret holding the private keys.
    pub fn to_secret(&self, namespace: &str) -> Result<Secret, CaError> {
        let mut pems = String::new();
        for key in &self.keys {
            pems.push_str(&key.to_openssh(LineEnding::LF)?);
        }
        Ok(Secret {
            metadata: metadata(SECRET_NAME, namespace),
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from([(
                PRIVATE_KEYS_KEY.to_string(),
                ByteString(pems.into_bytes()),
            )])),
            ..Secret::default()
        })
    }

    /// The ConfigMap publishing the public keys.
    pub fn to_configmap(&self, namespace: &str) -> Result<ConfigMap, CaError> {
        let mut lines = self.public_keys_openssh()?.join("\n");
        lines.push('\n');
        Ok(ConfigMap {
            metadata: metadata(CONFIGMAP_NAME, namespace),
            data: Some(BTreeMap::from([(PUBLIC_KEYS_KEY.to_string(), lines)])),
            ..ConfigMap::default()
        })
    }

    /// Read the CA back from its Secret.
    pub fn from_secret(secret: &Secret) -> Result<CaBundle, CaError> {
        let object = object_name("Secret", &secret.metadata);
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(PRIVATE_KEYS_KEY))
            .ok_or_else(|| CaError::Missing {
                object: object.clone(),
                key: PRIVATE_KEYS_KEY,
            })?;
        let damaged = |reason: String| CaError::Damaged {
            object: object.clone(),
            reason,
        };
        let text = std::str::from_utf8(&bytes.0)
            .map_err(|_| damaged(format!("{PRIVATE_KEYS_KEY} is not text")))?;
        let mut keys = Vec::new();
        for pem in text
            .split_inclusive(PEM_END)
            .filter(|p| !p.trim().is_empty())
        {
            let key = PrivateKey::from_openssh(pem.trim())
                .map_err(|e| damaged(format!("key {} cannot be read: {e}", keys.len() + 1)))?;
            keys.push(key);
        }
        if keys.is_empty() {
            return Err(damaged(format!("{PRIVATE_KEYS_KEY} holds no key")));
        }
        Ok(CaBundle { keys })
    }
}

/// `Kind namespace/name` for messages.
fn object_name(
    kind: &str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> String {
    format!(
        "{kind} {}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// The trusted CA public keys published in the ConfigMap, oldest first.
pub fn trusted_keys_from_configmap(config_map: &ConfigMap) -> Result<Vec<PublicKey>, CaError> {
    let object = object_name("ConfigMap", &config_map.metadata);
    let text = config_map
        .data
        .as_ref()
        .and_then(|d| d.get(PUBLIC_KEYS_KEY))
        .ok_or_else(|| CaError::Missing {
            object: object.clone(),
            key: PUBLIC_KEYS_KEY,
        })?;
    let keys = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .enumerate()
        .map(|(i, line)| {
            PublicKey::from_openssh(line).map_err(|e| CaError::Damaged {
                object: object.clone(),
                reason: format!("line {} is not a public key: {e}", i + 1),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if keys.is_empty() {
        return Err(CaError::Damaged {
            object,
            reason: format!("{PUBLIC_KEYS_KEY} holds no key"),
        });
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_round_trip_keeps_order() {
        let mut ca = CaBundle::generate().unwrap();
        ca.rotate().unwrap();
        let secret = ca.to_secret("kubevm-system").unwrap();
        assert_eq!(secret.metadata.name.as_deref(), Some(SECRET_NAME));
        let back = CaBundle::from_secret(&secret).unwrap();
        assert_eq!(back.fingerprints(), ca.fingerprints());
        assert_eq!(
            back.signing_key().public_key(),
            ca.signing_key().public_key()
        );
    }

    #[test]
    fn configmap_round_trip() {
        let ca = CaBundle::generate().unwrap();
        let cm = ca.to_configmap("kubevm-system").unwrap();
        let text = &cm.data.as_ref().unwrap()[PUBLIC_KEYS_KEY];
        assert!(text.starts_with("ssh-ed25519 ") && text.ends_with('\n'));
        let keys = trusted_keys_from_configmap(&cm).unwrap();
        assert_eq!(keys, ca.public_keys());
    }

    #[test]
    fn fingerprints_look_like_ssh_keygen() {
        let ca = CaBundle::generate().unwrap();
        let fp = &ca.fingerprints()[0];
        assert!(fp.starts_with("SHA256:") && fp.len() == 7 + 43, "{fp}");
        assert!(!format!("{ca:?}").contains("PRIVATE"));
    }

    #[test]
    fn fingerprint_matches_ssh_keygen() {
        let ca = CaBundle::generate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pub");
        std::fs::write(&path, &ca.public_keys_openssh().unwrap()[0]).unwrap();
        // Fails (never skips) without ssh-keygen: CI installs openssh-client.
        let out = std::process::Command::new("ssh-keygen")
            .args(["-l", "-E", "sha256", "-f"])
            .arg(&path)
            .output()
            .expect("ssh-keygen not found: install openssh-client");
        assert!(out.status.success());
        let printed = String::from_utf8_lossy(&out.stdout);
        // `256 SHA256:… comment (ED25519)`: the whole fingerprint field, not a substring.
        assert_eq!(
            printed.split_whitespace().nth(1),
            Some(ca.fingerprints()[0].as_str()),
            "{printed}"
        );
    }

    #[test]
    fn rotation_keeps_old_key_trusted_until_finished() {
        let mut ca = CaBundle::generate().unwrap();
        let old = ca.fingerprints()[0].clone();
        ca.rotate().unwrap();
        assert!(ca.in_rotation());
        let fps = ca.fingerprints();
        assert_eq!(fps.len(), 2);
        assert_eq!(fps[0], old, "old key still trusted");
        assert_eq!(
            fingerprint(ca.signing_key().public_key()),
            fps[1],
            "newest signs"
        );
        let cm = ca.to_configmap("ns").unwrap();
        assert_eq!(trusted_keys_from_configmap(&cm).unwrap().len(), 2);
        assert_eq!(ca.finish_rotation(), 1);
        assert_eq!(ca.fingerprints(), vec![fps[1].clone()]);
        assert!(!ca.in_rotation());
        assert_eq!(ca.finish_rotation(), 0);
    }

    #[test]
    fn damaged_objects_are_reported() {
        let mut secret = CaBundle::generate().unwrap().to_secret("ns").unwrap();
        secret.data = Some(BTreeMap::from([(
            PRIVATE_KEYS_KEY.into(),
            ByteString(b"junk".to_vec()),
        )]));
        let e = CaBundle::from_secret(&secret).unwrap_err().to_string();
        assert!(e.contains("Secret ns/kubevm-ssh-ca is damaged"), "{e}");
        secret.data = None;
        let e = CaBundle::from_secret(&secret).unwrap_err().to_string();
        assert!(e.contains("no \"ca.keys\" entry"), "{e}");
        let mut cm = CaBundle::generate().unwrap().to_configmap("ns").unwrap();
        cm.data = Some(BTreeMap::from([(
            PUBLIC_KEYS_KEY.into(),
            "ssh-ed25519 !!!\n".into(),
        )]));
        let e = trusted_keys_from_configmap(&cm).unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
    }
}
