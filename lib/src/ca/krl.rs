//! Revocation by certificate serial and key ID, published as an OpenSSH KRL.
//!
//! `kubectl vm ca revoke --serial N | --key-id ID | --key FILE` keeps three entries in the CA
//! ConfigMap, next to the CA public keys every authenticated user may read:
//! - [`super::REVOKED_KEYS_KEY`] (`revoked.pub`): revoked host keys, one OpenSSH line each;
//! - [`REVOKED_CERTS_KEY`] (`revoked-certs`): revoked certificates, one `serial: N` or
//!   `id: KEY_ID` line each (the syntax of ssh-keygen(1)'s "KEY REVOCATION LISTS" spec);
//! - [`KRL_KEY`] (`revoked.krl`, binaryData): all of the above as an OpenSSH KRL, the file a
//!   guest's sshd reads through `RevokedKeys` and `ssh-keygen -Q -f` checks.
//!
//! No crate on crates.io writes KRLs (ssh-key reads and writes keys and certificates only), so
//! the encoder is here. Format: OpenSSH's `PROTOCOL.krl` (openssh-portable, rev. 1.7): the
//! header (`KRL_MAGIC`, format version 1, KRL version, generation time, flags, reserved,
//! comment), then one `KRL_SECTION_CERTIFICATES` (1) section whose `ca_key` is empty, which
//! "applies to all CAs" (`krl.c` `is_key_revoked` checks the wildcard CA's serials and key IDs
//! after the signing CA's), holding a `KRL_SECTION_CERT_SERIAL_LIST` (0x20) and a
//! `KRL_SECTION_CERT_KEY_ID` (0x23) subsection, and one `KRL_SECTION_EXPLICIT_KEY` (2) section
//! with the revoked plain keys. A section is left out when it would be empty (the format says
//! a key ID or key section holds at least one entry). Serial 0 cannot be revoked: OpenSSH
//! ignores it (`krl.c` `is_cert_revoked`, "Zero serials numbers are ignored"), and the signer
//! never issues it.
//!
//! The serials and key IDs apply to certificates of every trusted CA key, so a CA rotation
//! leaves the KRL as it is.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use ssh_key::{Certificate, PublicKey};

/// ConfigMap key of the revoked certificates, `serial: N` / `id: KEY_ID` lines.
pub const REVOKED_CERTS_KEY: &str = "revoked-certs";
/// ConfigMap binaryData key of the KRL.
pub const KRL_KEY: &str = "revoked.krl";

/// `PROTOCOL.krl` §1: "SSHKRL\n\0".
const KRL_MAGIC: &[u8; 8] = b"SSHKRL\n\0";
const KRL_FORMAT_VERSION: u32 = 1;
const KRL_SECTION_CERTIFICATES: u8 = 1;
const KRL_SECTION_EXPLICIT_KEY: u8 = 2;
const KRL_SECTION_CERT_SERIAL_LIST: u8 = 0x20;
const KRL_SECTION_CERT_KEY_ID: u8 = 0x23;

/// The longest key ID `ca revoke --key-id` takes (the signer's are under 300 bytes).
pub const MAX_KEY_ID_LEN: usize = 1024;

/// Everything revoked: host keys, certificate serials and certificate key IDs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revocations {
    /// Revoked plain keys (host keys), refused certified or not.
    pub keys: Vec<PublicKey>,
    /// Revoked certificate serial numbers (never 0).
    pub serials: BTreeSet<u64>,
    /// Revoked certificate key IDs.
    pub key_ids: BTreeSet<String>,
}

/// Why a certificate is revoked, for messages: `serial 42` or `key ID "kubevm-host:dev/web"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokedBy {
    /// Its serial number is on the list.
    Serial(u64),
    /// Its key ID is on the list.
    KeyId(String),
}

impl std::fmt::Display for RevokedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RevokedBy::Serial(n) => write!(f, "serial {n}"),
            RevokedBy::KeyId(id) => write!(f, "key ID {id:?}"),
        }
    }
}

/// Check a `--key-id` value: not empty, at most [`MAX_KEY_ID_LEN`] bytes, no control
/// characters (a line of `revoked-certs` holds one).
pub fn check_key_id(id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("a key ID cannot be empty".into());
    }
    if id.len() > MAX_KEY_ID_LEN {
        return Err(format!(
            "a key ID of {} bytes is longer than {MAX_KEY_ID_LEN}",
            id.len()
        ));
    }
    if id.chars().any(char::is_control) {
        return Err("a key ID cannot hold control characters".into());
    }
    Ok(())
}

/// Check a `--serial` value: OpenSSH never treats serial 0 as revoked.
pub fn check_serial(serial: u64) -> Result<(), String> {
    if serial == 0 {
        return Err(
            "serial 0 cannot be revoked: OpenSSH ignores it (it means \"no serial\"); revoke by --key-id or --key"
                .into(),
        );
    }
    Ok(())
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_string(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(
        out,
        u32::try_from(bytes.len()).expect("KRL field under 4 GiB"),
    );
    out.extend_from_slice(bytes);
}

fn put_section(out: &mut Vec<u8>, kind: u8, data: &[u8]) {
    out.push(kind);
    put_string(out, data);
}

impl Revocations {
    /// Whether nothing is revoked.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.serials.is_empty() && self.key_ids.is_empty()
    }

    /// What the CA ConfigMap lists; lines that do not parse are skipped.
    pub fn from_configmap(config_map: &ConfigMap) -> Revocations {
        let data = config_map.data.as_ref();
        let keys = data
            .and_then(|d| d.get(super::REVOKED_KEYS_KEY))
            .map(|text| {
                text.lines()
                    .filter_map(|l| PublicKey::from_openssh(l.trim()).ok())
                    .collect()
            })
            .unwrap_or_default();
        let mut out = Revocations {
            keys,
            ..Revocations::default()
        };
        if let Some(text) = data.and_then(|d| d.get(REVOKED_CERTS_KEY)) {
            out.parse_certs(text);
        }
        out
    }

    fn parse_certs(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(serial) = line.strip_prefix("serial: ") {
                if let Ok(n) = serial.trim().parse::<u64>()
                    && n != 0
                {
                    self.serials.insert(n);
                }
            } else if let Some(id) = line.strip_prefix("id: ")
                && check_key_id(id).is_ok()
            {
                self.key_ids.insert(id.to_owned());
            }
        }
    }

    /// The `revoked-certs` text: `serial: N` lines, then `id: KEY_ID` lines.
    pub fn certs_text(&self) -> String {
        let mut out = String::new();
        for n in &self.serials {
            out.push_str(&format!("serial: {n}\n"));
        }
        for id in &self.key_ids {
            out.push_str(&format!("id: {id}\n"));
        }
        out
    }

    /// Why `cert` is revoked by serial or key ID, if it is (as OpenSSH decides: key ID
    /// first; serial 0 never).
    pub fn certificate_revoked(&self, cert: &Certificate) -> Option<RevokedBy> {
        if self.key_ids.contains(cert.key_id()) {
            return Some(RevokedBy::KeyId(cert.key_id().to_owned()));
        }
        let serial = cert.serial();
        (serial != 0 && self.serials.contains(&serial)).then_some(RevokedBy::Serial(serial))
    }

    /// The KRL (`PROTOCOL.krl`), numbered `version`, generated at `generated` (Unix seconds).
    pub fn to_krl(&self, version: u64, generated: u64) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(KRL_MAGIC);
        put_u32(&mut out, KRL_FORMAT_VERSION);
        put_u64(&mut out, version);
        put_u64(&mut out, generated);
        put_u64(&mut out, 0); // flags: none defined
        put_string(&mut out, b""); // reserved
        put_string(&mut out, b"kubectl-vm ca revoke");
        if !self.serials.is_empty() || !self.key_ids.is_empty() {
            let mut section = Vec::new();
            put_string(&mut section, b""); // ca_key: every CA
            put_string(&mut section, b""); // reserved
            if !self.serials.is_empty() {
                let mut list = Vec::new();
                for n in &self.serials {
                    put_u64(&mut list, *n);
                }
                put_section(&mut section, KRL_SECTION_CERT_SERIAL_LIST, &list);
            }
            if !self.key_ids.is_empty() {
                let mut ids = Vec::new();
                for id in &self.key_ids {
                    put_string(&mut ids, id.as_bytes());
                }
                put_section(&mut section, KRL_SECTION_CERT_KEY_ID, &ids);
            }
            put_section(&mut out, KRL_SECTION_CERTIFICATES, &section);
        }
        let blobs: Vec<Vec<u8>> = self.keys.iter().filter_map(|k| k.to_bytes().ok()).collect();
        if !blobs.is_empty() {
            let mut section = Vec::new();
            for blob in &blobs {
                put_string(&mut section, blob);
            }
            put_section(&mut out, KRL_SECTION_EXPLICIT_KEY, &section);
        }
        out
    }

    /// Write the lists and the KRL into the CA ConfigMap (the KRL numbered `version`).
    pub fn store(&self, config_map: &mut ConfigMap, version: u64, generated: u64) {
        let data = config_map.data.get_or_insert_with(BTreeMap::new);
        let lines: Vec<String> = self
            .keys
            .iter()
            .filter_map(|k| {
                let mut k = k.clone();
                k.set_comment("");
                k.to_openssh().ok()
            })
            .collect();
        if lines.is_empty() {
            data.remove(super::REVOKED_KEYS_KEY);
        } else {
            data.insert(super::REVOKED_KEYS_KEY.into(), lines.join("\n") + "\n");
        }
        let certs = self.certs_text();
        if certs.is_empty() {
            data.remove(REVOKED_CERTS_KEY);
        } else {
            data.insert(REVOKED_CERTS_KEY.into(), certs);
        }
        config_map
            .binary_data
            .get_or_insert_with(BTreeMap::new)
            .insert(KRL_KEY.into(), ByteString(self.to_krl(version, generated)));
    }
}

/// The KRL version of the KRL in the ConfigMap (0 without one), so the next is one more.
pub fn krl_version(config_map: &ConfigMap) -> u64 {
    config_map
        .binary_data
        .as_ref()
        .and_then(|d| d.get(KRL_KEY))
        .and_then(|b| b.0.get(12..20))
        .and_then(|v| v.try_into().ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0)
}

/// The KRL published in the ConfigMap, if any.
pub fn krl_of(config_map: &ConfigMap) -> Option<Vec<u8>> {
    config_map
        .binary_data
        .as_ref()
        .and_then(|d| d.get(KRL_KEY))
        .map(|b| b.0.clone())
}

/// The KRL that revokes nothing, which a guest gets when the CA has none yet.
pub fn empty_krl() -> Vec<u8> {
    Revocations::default().to_krl(0, 0)
}

#[cfg(test)]
mod tests;
