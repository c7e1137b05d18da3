//! Guest credentials through KubeVirt's accessCredentials and the guest agent (virtctl's
//! `credentials add-ssh-key|remove-ssh-key|set-password`): SSH public keys of a guest user
//! (`sshPublicKey` with `qemuGuestAgent{users}`: the user's whole `authorized_keys` becomes
//! the keys of the VM's entries for that user) and a user's password (`userPassword` with
//! `qemuGuestAgent`: the Secret's key is the user, its value the password, set with the
//! agent's `guest-set-user-password`; virt-launcher
//! `pkg/virt-launcher/virtwrap/access-credentials/access_credentials.go`).
//!
//! Each user's keys and password live in Secrets made here and owned by the VM
//! (`NAME-kubevm-keys-USER`, `NAME-kubevm-password-USER`); a Secret of that name that is not
//! ours is refused. As with [`crate::enroll`], a new entry reaches a running VM at its restart
//! (`RestartRequired`); changes of the Secrets are live. Removing the last key leaves the entry
//! with an empty Secret, which is what makes the agent empty the file.

mod kubevirt;

pub use kubevirt::apply;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};

use crate::enroll::{Activation, owned_by_vm};
use crate::error::{Error, Result};
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};

/// Label naming what a credential Secret holds: `keys` or `password`.
pub const KIND_LABEL: &str = "kubevm.io/credential";
/// Label naming the guest user of a credential Secret.
pub const LOGIN_LABEL: &str = "kubevm.io/credential-login";
/// Longest password accepted (the agent takes it base64-encoded in one JSON message).
pub const MAX_PASSWORD: usize = 1024;

/// What a credential Secret holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// SSH public keys, one per line.
    Keys,
    /// A password.
    Password,
}

impl Kind {
    /// The [`KIND_LABEL`] value.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Keys => "keys",
            Kind::Password => "password",
        }
    }
}

/// A change of one guest user's credentials.
#[derive(Clone, PartialEq, Eq)]
pub enum Operation {
    /// Add these public keys (OpenSSH lines).
    AddKeys(Vec<String>),
    /// Remove these public keys (matched by key, not comment).
    RemoveKeys(Vec<String>),
    /// Set this password.
    SetPassword(String),
}

impl std::fmt::Debug for Operation {
    /// Leaves the password out.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Operation::AddKeys(k) => f.debug_tuple("AddKeys").field(k).finish(),
            Operation::RemoveKeys(k) => f.debug_tuple("RemoveKeys").field(k).finish(),
            Operation::SetPassword(_) => f.write_str("SetPassword(..)"),
        }
    }
}

impl Operation {
    /// What the Secret of this operation holds.
    pub fn kind(&self) -> Kind {
        match self {
            Operation::SetPassword(_) => Kind::Password,
            _ => Kind::Keys,
        }
    }
}

/// The Secret of `kind` for `login` on VM `vm`.
pub fn secret_name(vm: &str, kind: Kind, login: &str) -> String {
    format!("{vm}-kubevm-{}-{login}", kind.as_str())
}

/// The data key of the Secret: `authorized_keys`, or the user for a password (KubeVirt reads
/// the user name from the key).
pub fn data_key(kind: Kind, login: &str) -> String {
    match kind {
        Kind::Keys => crate::enroll::SECRET_KEY.to_owned(),
        Kind::Password => login.to_owned(),
    }
}

/// Check the operation's input: the user (as [`crate::enroll::validate_logins`]), every key
/// an OpenSSH public key on one line, a password non-empty, one line, at most
/// [`MAX_PASSWORD`] bytes. One line, before any request.
pub fn validate(login: &str, operation: &Operation) -> Result<()> {
    crate::enroll::validate_logins(std::slice::from_ref(&login.to_owned()))?;
    match operation {
        Operation::AddKeys(keys) | Operation::RemoveKeys(keys) => {
            if keys.is_empty() {
                return Err(Error::Usage("no public key given".into()));
            }
            for key in keys {
                crate::validate::ssh_public_key(key).map_err(|e| Error::Usage(e.to_string()))?;
            }
        }
        Operation::SetPassword(p) => {
            if p.is_empty() {
                return Err(Error::Usage("the password is empty".into()));
            }
            if p.contains(['\n', '\r', '\0']) {
                return Err(Error::Usage(
                    "the password has a line break or NUL character: give one line".into(),
                ));
            }
            if p.len() > MAX_PASSWORD {
                return Err(Error::Usage(format!(
                    "the password is {} bytes long; use at most {MAX_PASSWORD}",
                    p.len()
                )));
            }
        }
    }
    Ok(())
}

/// The key part of an OpenSSH public key line (type and base64), without options or comment.
fn key_of(line: &str) -> Option<String> {
    ssh_key::PublicKey::from_openssh(line.trim())
        .ok()
        .and_then(|k| k.to_openssh().ok())
        .map(|t| t.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
}

/// The key lines after `operation` on `current` (the Secret's text), and how many of the
/// keys to remove were not there.
pub fn edit_keys(current: &str, operation: &Operation) -> (Vec<String>, usize) {
    let mut lines: Vec<String> = current
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let mut missing = 0;
    match operation {
        Operation::AddKeys(keys) => {
            for key in keys {
                let k = key_of(key);
                if !lines.iter().any(|l| key_of(l) == k) {
                    lines.push(key.trim().to_owned());
                }
            }
        }
        Operation::RemoveKeys(keys) => {
            for key in keys {
                let k = key_of(key);
                let before = lines.len();
                lines.retain(|l| key_of(l) != k);
                if lines.len() == before {
                    missing += 1;
                }
            }
        }
        Operation::SetPassword(_) => {}
    }
    (lines, missing)
}

/// A credential Secret of `kind` for `login`, owned by `vm` (a VM object as JSON).
pub fn secret_object(vm: &Value, kind: Kind, login: &str, text: String) -> Secret {
    let name = vm["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = vm["metadata"]["namespace"].as_str().unwrap_or_default();
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(name, kind, login)),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
                (VM_LABEL.to_owned(), name.to_owned()),
                (KIND_LABEL.to_owned(), kind.as_str().to_owned()),
                (LOGIN_LABEL.to_owned(), login.to_owned()),
            ])),
            owner_references: Some(vec![owned_by_vm(vm, name)]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            data_key(kind, login),
            k8s_openapi::ByteString(text.into_bytes()),
        )])),
        type_: Some("Opaque".into()),
        ..Secret::default()
    }
}

/// Whether `secret` is our credential Secret of `kind` for `login` on the VM with `vm_uid`.
pub fn is_ours(secret: &Secret, vm: &str, vm_uid: &str, kind: Kind, login: &str) -> bool {
    let labels = secret.metadata.labels.clone().unwrap_or_default();
    let label = |k: &str| labels.get(k).map(String::as_str);
    label(MANAGED_BY_LABEL) == Some(MANAGED_BY)
        && label(VM_LABEL) == Some(vm)
        && label(KIND_LABEL) == Some(kind.as_str())
        && label(LOGIN_LABEL) == Some(login)
        && secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.uid == vm_uid && r.kind == "VirtualMachine")
}

/// The accessCredentials entry of a credential Secret.
pub fn entry(kind: Kind, secret: &str, login: &str) -> Value {
    match kind {
        Kind::Keys => crate::enroll::credential_entry(secret, login),
        Kind::Password => json!({"userPassword": {
            "source": {"secret": {"secretName": secret}},
            "propagationMethod": {"qemuGuestAgent": {}},
        }}),
    }
}

/// Whether a VM template or VMI `spec` has an accessCredentials entry with Secret `secret`.
pub fn references(spec: &Value, secret: &str) -> bool {
    spec["accessCredentials"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            [
                "/sshPublicKey/source/secret/secretName",
                "/userPassword/source/secret/secretName",
            ]
            .iter()
            .any(|p| c.pointer(p) == Some(&json!(secret)))
        })
}

/// Add the entry of `kind` for `login` to the VM template. Whether it was missing.
pub fn add_entry(vm: &mut Value, kind: Kind, login: &str) -> bool {
    let name = vm["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let secret = secret_name(&name, kind, login);
    let spec = &mut vm["spec"]["template"]["spec"];
    if references(spec, &secret) {
        return false;
    }
    if !spec["accessCredentials"].is_array() {
        spec["accessCredentials"] = json!([]);
    }
    spec["accessCredentials"]
        .as_array_mut()
        .expect("an array")
        .push(entry(kind, &secret, login));
    true
}

/// What [`apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialOutcome {
    /// `NAME.NAMESPACE`.
    pub vm: String,
    /// The Secret's name.
    pub secret: String,
    /// What happened to it.
    pub change: crate::enroll::SecretChange,
    /// Whether the VM got the accessCredentials entry now.
    pub vm_updated: bool,
    /// When it takes effect.
    pub activation: Activation,
    /// Keys the user has from this Secret afterwards (key operations).
    pub keys: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHcP1uPBmPUxGj6S+v8Wgfc1ckRtXQ4dx2ri8DPz8GLy alice";
    const B: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOjcUOu3CPh1XYxF1ICtUqbdS+dwjLNOlntjsq5HTqJy bob";

    #[test]
    fn keys_are_added_once_and_removed_by_key() {
        let (lines, _) = edit_keys("", &Operation::AddKeys(vec![A.into(), A.into()]));
        assert_eq!(lines, [A]);
        // Another comment is the same key.
        let same = A.replace(" alice", " other-comment");
        let (lines, _) = edit_keys(
            &format!("{A}\n"),
            &Operation::AddKeys(vec![same.clone(), B.into()]),
        );
        assert_eq!(lines, [A, B]);
        let (lines, missing) = edit_keys(
            &format!("{A}\n{B}\n"),
            &Operation::RemoveKeys(vec![same, B.into()]),
        );
        assert!(lines.is_empty());
        assert_eq!(missing, 0);
        let (_, missing) = edit_keys(&format!("{A}\n"), &Operation::RemoveKeys(vec![B.into()]));
        assert_eq!(missing, 1);
    }

    #[test]
    fn input_is_checked_locally() {
        assert!(validate("debian", &Operation::AddKeys(vec![A.into()])).is_ok());
        for (login, op) in [
            ("Root", Operation::AddKeys(vec![A.into()])),
            ("debian", Operation::AddKeys(vec!["not a key".into()])),
            ("debian", Operation::AddKeys(vec![])),
            ("debian", Operation::SetPassword(String::new())),
            ("debian", Operation::SetPassword("a\nb".into())),
            (
                "debian",
                Operation::SetPassword("x".repeat(MAX_PASSWORD + 1)),
            ),
        ] {
            assert!(
                matches!(validate(login, &op), Err(Error::Usage(_))),
                "{login} {op:?}"
            );
        }
        assert_eq!(
            format!("{:?}", Operation::SetPassword("hunter2".into())),
            "SetPassword(..)"
        );
    }

    #[test]
    fn password_secret_and_entry_are_kubevirt_shaped() {
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "dev", "uid": "u1"},
            "spec": {"template": {"spec": {}}}});
        let s = secret_object(&vm, Kind::Password, "debian", "pw".into());
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("web-kubevm-password-debian")
        );
        assert_eq!(s.data.as_ref().unwrap()["debian"].0, b"pw");
        assert!(is_ours(&s, "web", "u1", Kind::Password, "debian"));
        assert!(!is_ours(&s, "web", "u1", Kind::Keys, "debian"));
        let mut v = vm.clone();
        assert!(add_entry(&mut v, Kind::Password, "debian"));
        assert!(!add_entry(&mut v, Kind::Password, "debian"));
        assert_eq!(
            v["spec"]["template"]["spec"]["accessCredentials"][0],
            json!({"userPassword": {"source": {"secret": {"secretName": "web-kubevm-password-debian"}},
                "propagationMethod": {"qemuGuestAgent": {}}}})
        );
    }
}
