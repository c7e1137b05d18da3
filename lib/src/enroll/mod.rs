//! Enrolling a VM that kubectl-vm did not create in the platform SSH trust (KubeVirt).
//!
//! OpenSSH accepts `cert-authority,principals="…" KEY` lines in `authorized_keys`
//! (sshd(8), AUTHORIZED_KEYS FILE FORMAT), and KubeVirt's `accessCredentials` with
//! `propagationMethod.qemuGuestAgent{users}` writes every line of a Secret verbatim into those
//! users' `authorized_keys` through the guest agent (virt-launcher
//! `pkg/virt-launcher/virtwrap/access-credentials/access_credentials.go`). So enrolling login
//! `L` of VM `V` in namespace `N` means:
//!
//! - a Secret `V-kubevm-trust-L` (created by us, owned by the VM) with one line per published
//!   CA key: `cert-authority,principals="L@V.N" <CA key>`, the same VM-scoped principal the
//!   signer puts in certificates ([`crate::signer::scoped_principal`]). One Secret per login:
//!   an accessCredentials entry gives all its lines to all its users, and a line naming `L`'s
//!   principal in another user's file would let `L`'s certificate log in as that user.
//! - an accessCredentials entry with that Secret for user `L`, and `L` in the VM's
//!   [`crate::names::LOGINS_ANNOTATION`] so the signer issues certificates for it.
//!
//! A new accessCredentials entry reaches a running VM only when it restarts (KubeVirt sets the
//! VM condition `RestartRequired`: accessCredentials are not live-updatable,
//! `pkg/virt-controller/watch/vm/vm.go`); changes of the Secret's content are live (the agent
//! rewrites `authorized_keys` on every change). KubeVirt replaces the whole `authorized_keys`
//! of an enrolled user with the keys of the VM's accessCredentials for that user.

pub(crate) mod kubevirt;

pub use kubevirt::{enroll, unenroll, update_enrolled};

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::names::{
    DEFAULT_LOGIN_ANNOTATION, LOGINS_ANNOTATION, TRUST_ANNOTATION, TRUST_VM_SCOPED,
};
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};
use crate::signer::scoped_principal;

/// Label on an enrollment Secret naming the login it is for.
pub const LOGIN_LABEL: &str = "ssh.kubevm.io/enrolled-login";
/// Annotation on an enrollment Secret: `"true"` when enrolling added the login to the VM's
/// [`LOGINS_ANNOTATION`] (so removing the enrollment takes it out again).
pub const ADDED_LOGIN_ANNOTATION: &str = "ssh.kubevm.io/added-login";
/// Data key of the enrollment Secret.
pub const SECRET_KEY: &str = "authorized_keys";
/// Most logins one command enrolls.
pub const MAX_LOGINS: usize = 16;

/// The enrollment Secret of `login` on VM `vm`.
pub fn secret_name(vm: &str, login: &str) -> String {
    format!("{vm}-kubevm-trust-{login}")
}

/// Check `--guest-user` values: guest logins that can also be part of a Secret name (lowercase
/// letters, digits, `-`; no `_` or `$`), no duplicates. One line, before any request.
pub fn validate_logins(logins: &[String]) -> Result<()> {
    if logins.is_empty() {
        return Err(Error::Usage(
            "--guest-user is required: name the guest user(s) to enroll".into(),
        ));
    }
    if logins.len() > MAX_LOGINS {
        return Err(Error::Usage(format!(
            "--guest-user names {} users; enroll at most {MAX_LOGINS} at once",
            logins.len()
        )));
    }
    for (i, login) in logins.iter().enumerate() {
        let starts = login.chars().next().is_some_and(|c| c.is_ascii_lowercase());
        let chars = login
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !starts || !chars || login.len() > 32 || login.ends_with('-') {
            return Err(Error::Usage(format!(
                "--guest-user {login:?} is not a login that can be enrolled: use 1 to 32 lowercase letters, digits and '-', starting with a letter"
            )));
        }
        if logins[..i].contains(login) {
            return Err(Error::Usage(format!(
                "--guest-user {login:?} is given twice"
            )));
        }
    }
    Ok(())
}

/// The `authorized_keys` lines that let certificates of any of `ca_keys` log in as `login` on
/// VM `vm` in `namespace`, and no other certificates.
pub fn trust_lines(ca_keys: &[String], login: &str, vm: &str, namespace: &str) -> Vec<String> {
    let principal = scoped_principal(login, vm, namespace);
    ca_keys
        .iter()
        .map(|key| format!("cert-authority,principals=\"{principal}\" {}", key.trim()))
        .collect()
}

/// The text stored in an enrollment Secret.
pub fn secret_text(lines: &[String]) -> String {
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// An enrollment Secret of `login` for `vm` (a VM object as JSON), owned by the VM.
pub fn secret_object(vm: &Value, login: &str, lines: &[String], added_login: bool) -> Secret {
    let name = vm["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = vm["metadata"]["namespace"].as_str().unwrap_or_default();
    let labels = BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
        (VM_LABEL.to_owned(), name.to_owned()),
        (LOGIN_LABEL.to_owned(), login.to_owned()),
    ]);
    let annotations =
        BTreeMap::from([(ADDED_LOGIN_ANNOTATION.to_owned(), added_login.to_string())]);
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(name, login)),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owned_by_vm(vm, name)]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            SECRET_KEY.to_owned(),
            k8s_openapi::ByteString(secret_text(lines).into_bytes()),
        )])),
        type_: Some("Opaque".into()),
        ..Secret::default()
    }
}

/// Whether `secret` is the enrollment Secret kubectl-vm made for `login` on the VM with
/// `vm_uid`: our labels and an ownerReference to that very VM. Anything else with its name is
/// not ours to change.
pub fn is_ours(secret: &Secret, vm: &str, vm_uid: &str, login: &str) -> bool {
    let labels = secret.metadata.labels.clone().unwrap_or_default();
    let label = |k: &str| labels.get(k).map(String::as_str);
    label(MANAGED_BY_LABEL) == Some(MANAGED_BY)
        && label(VM_LABEL) == Some(vm)
        && label(LOGIN_LABEL) == Some(login)
        && secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.uid == vm_uid && r.kind == "VirtualMachine")
}

/// The text an enrollment Secret holds now.
pub fn secret_content(secret: &Secret) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(SECRET_KEY))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}

/// The accessCredentials entry for `login` with Secret `secret`.
pub fn credential_entry(secret: &str, login: &str) -> Value {
    json!({"sshPublicKey": {
        "source": {"secret": {"secretName": secret}},
        "propagationMethod": {"qemuGuestAgent": {"users": [login]}},
    }})
}

/// Whether a VM template or VMI `spec` has an accessCredentials entry with Secret `secret`.
pub fn references(spec: &Value, secret: &str) -> bool {
    spec["accessCredentials"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c.pointer("/sshPublicKey/source/secret/secretName") == Some(&json!(secret)))
}

fn logins_of(vm: &Value) -> Vec<String> {
    vm["metadata"]["annotations"][LOGINS_ANNOTATION]
        .as_str()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn annotations_mut(vm: &mut Value) -> &mut serde_json::Map<String, Value> {
    let meta = &mut vm["metadata"];
    if !meta["annotations"].is_object() {
        meta["annotations"] = json!({});
    }
    meta["annotations"].as_object_mut().expect("an object")
}

/// Whether `login` is already one the signer issues certificates for on this VM.
pub fn login_allowed(vm: &Value, login: &str) -> bool {
    logins_of(vm).iter().any(|l| l == login)
}

/// Add the accessCredentials entry of `login` to the VM template and `login` to the logins
/// the signer allows; a VM without a trust annotation (not made by `create`) is marked
/// VM-scoped, which is what the enrollment lines accept. Whether anything changed.
pub fn add_to_vm(vm: &mut Value, login: &str) -> bool {
    let name = vm["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let secret = secret_name(&name, login);
    let mut changed = false;
    let spec = &mut vm["spec"]["template"]["spec"];
    if !references(spec, &secret) {
        if !spec["accessCredentials"].is_array() {
            spec["accessCredentials"] = json!([]);
        }
        spec["accessCredentials"]
            .as_array_mut()
            .expect("an array")
            .push(credential_entry(&secret, login));
        changed = true;
    }
    let mut logins = logins_of(vm);
    if !logins.iter().any(|l| l == login) {
        logins.push(login.to_owned());
        annotations_mut(vm).insert(LOGINS_ANNOTATION.into(), json!(logins.join(",")));
        changed = true;
    }
    let ours = vm["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY;
    if !ours && vm["metadata"]["annotations"][TRUST_ANNOTATION].is_null() {
        annotations_mut(vm).insert(TRUST_ANNOTATION.into(), json!(TRUST_VM_SCOPED));
        changed = true;
    }
    // A VM not made by `create` has no platform user: `ssh VM` logs in as the first enrolled.
    if !ours && vm["metadata"]["annotations"][DEFAULT_LOGIN_ANNOTATION].is_null() {
        annotations_mut(vm).insert(DEFAULT_LOGIN_ANNOTATION.into(), json!(login));
        changed = true;
    }
    changed
}

/// Remove the accessCredentials entry of `login` from the VM template. Whether it was there.
pub fn remove_entry(vm: &mut Value, login: &str) -> bool {
    let name = vm["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let secret = secret_name(&name, login);
    let Some(spec) = vm
        .pointer_mut("/spec/template/spec")
        .and_then(Value::as_object_mut)
    else {
        return false;
    };
    let Some(list) = spec
        .get_mut("accessCredentials")
        .and_then(Value::as_array_mut)
    else {
        return false;
    };
    let before = list.len();
    list.retain(|c| c.pointer("/sshPublicKey/source/secret/secretName") != Some(&json!(secret)));
    let changed = list.len() != before;
    if list.is_empty() {
        spec.remove("accessCredentials");
    }
    changed
}

/// Take `login` out of the logins the signer allows on the VM (and out of the default login).
/// Whether it was there.
pub fn remove_login(vm: &mut Value, login: &str) -> bool {
    if vm["metadata"]["annotations"][DEFAULT_LOGIN_ANNOTATION] == login {
        annotations_mut(vm).remove(DEFAULT_LOGIN_ANNOTATION);
    }
    let logins = logins_of(vm);
    if !logins.iter().any(|l| l == login) {
        return false;
    }
    let rest: Vec<String> = logins.into_iter().filter(|l| l != login).collect();
    let annotations = annotations_mut(vm);
    if rest.is_empty() {
        annotations.remove(LOGINS_ANNOTATION);
    } else {
        annotations.insert(LOGINS_ANNOTATION.into(), json!(rest.join(",")));
    }
    true
}

/// What happened to one login's Secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretChange {
    /// Created.
    Created,
    /// Its lines were replaced (the CA keys changed since).
    Updated,
    /// Already as wanted.
    Unchanged,
    /// Emptied: the running guest drops the lines, and the VMI still refers to it.
    Emptied,
    /// Deleted.
    Deleted,
    /// There was none.
    Absent,
}

/// When the trust takes effect (or ends) in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// The running guest gets it through the agent now.
    Live,
    /// The VM runs without the new accessCredentials entry: KubeVirt applies it after a
    /// restart (the VM's `RestartRequired` condition says so).
    RestartRequired,
    /// The VM is not running: at its next start.
    NextStart,
}

/// Progress of [`enroll`] and [`unenroll`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnrollEvent {
    /// A login's Secret was handled.
    Secret {
        /// The login.
        login: String,
        /// The Secret's name.
        name: String,
        /// What happened.
        change: SecretChange,
    },
    /// The VM object was updated (accessCredentials, annotations).
    VmUpdated,
    /// The VM already had everything.
    VmUnchanged,
}

/// What [`enroll`] or [`unenroll`] did, in the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrollOutcome {
    /// `NAME.NAMESPACE`.
    pub vm: String,
    /// The logins handled.
    pub logins: Vec<String>,
    /// When it takes effect.
    pub activation: Activation,
}

/// The ownerReference that ties a Secret to VM `name` (`vm` as read from the server), so
/// garbage collection removes the Secret with the VM.
pub(crate) fn owned_by_vm(vm: &Value, name: &str) -> OwnerReference {
    OwnerReference {
        api_version: vm["apiVersion"].as_str().unwrap_or("kubevirt.io/v1").into(),
        kind: vm["kind"].as_str().unwrap_or("VirtualMachine").into(),
        name: name.to_owned(),
        uid: vm["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        ..OwnerReference::default()
    }
}

#[cfg(test)]
mod tests;
