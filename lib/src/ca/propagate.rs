//! Carrying a CA rotation into the VMs kubectl-vm created: their cloud-init (the user-data
//! Secret `create` made, re-applied by `bootcmd` on every boot) gets the trusted keys as
//! published now and, when asked, a host certificate from the newest key for the host key it
//! already has. The guest applies both at its next boot.
//!
//! Only what is ours is touched ([`check_ownership`]): a Secret labelled as kubectl-vm's and
//! named `<vm>-cloudinit`, whose VM exists, carries kubectl-vm's label, refers to that Secret
//! (KubeVirt `cloudInitNoCloud|cloudInitConfigDrive.secretRef`, Deckhouse
//! `provisioning.userDataRef`) and owns it (an ownerReference with the VM's uid). A label or a
//! name anyone can give a Secret is never enough.
//!
//! Only the host key already certified for that VM is renewed ([`certified_host_key`]): the
//! `ssh_keys.ed25519_public` of the Secret must be the key of the host certificate the Secret
//! holds, and that certificate must be a host certificate for this VM (key ID
//! `kubevm-host:NAMESPACE/NAME` or this VM's host principals) signed by one of the CA keys
//! published now. A Secret whose key does not match its certificate is left alone entirely.
//! Writes carry the resourceVersion that was read, so a concurrent change is not overwritten.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, PostParams};
use russh::keys::PublicKey;
use russh::keys::ssh_key::certificate::CertType;
use russh::keys::ssh_key::{Certificate, HashAlg};
use serde_json::Value;

use crate::api::{DECKHOUSE_VM, KUBEVIRT_VM};
use crate::cluster::Cluster;
use crate::error::{Action, Result};
use crate::names::{CA_KEYS_PATH, HOST_CERT_PATH, REVOKED_KRL_B64_PATH, SSHD_DROP_IN_PATH};
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};

/// Data keys of the user-data Secret (KubeVirt `userdata`, Deckhouse `userData`).
const USER_DATA_KEYS: [&str; 2] = ["userdata", "userData"];

/// Replace the content of the heredoc that writes `path` (`cat > PATH <<'DELIM'` … `DELIM`,
/// at any indentation, as [`crate::create::cloudinit::platform`] writes it) with `lines`.
/// `None` when the text has no such heredoc.
pub fn replace_heredoc(text: &str, path: &str, lines: &[String]) -> Option<String> {
    let opener = format!("cat > {path} <<'");
    let mut out = Vec::new();
    let mut lines_in = text.split_inclusive('\n');
    let mut found = false;
    while let Some(line) = lines_in.next() {
        out.push(line.to_owned());
        let trimmed = line.trim_start();
        let Some(rest) = trimmed.strip_prefix(&opener) else {
            continue;
        };
        let delimiter = rest.trim_end().strip_suffix('\'')?.to_owned();
        let indent = &line[..line.len() - trimmed.len()];
        for body in lines_in.by_ref() {
            if body.trim() == delimiter {
                for l in lines {
                    out.push(format!("{indent}{l}\n"));
                }
                out.push(body.to_owned());
                found = true;
                break;
            }
        }
    }
    found.then(|| out.concat())
}

/// The content lines of the heredoc that writes `path` (see [`replace_heredoc`]), without
/// their indentation; `None` when the text has no such heredoc.
pub fn heredoc_content(text: &str, path: &str) -> Option<Vec<String>> {
    let opener = format!("cat > {path} <<'");
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim_start().strip_prefix(&opener) else {
            continue;
        };
        let delimiter = rest.trim_end().strip_suffix('\'')?;
        let mut body = Vec::new();
        for l in lines.by_ref() {
            if l.trim() == delimiter {
                return Some(body);
            }
            body.push(l.trim().to_owned());
        }
        return None;
    }
    None
}

/// Put the CA's KRL into user data (see [`crate::create::cloudinit::platform::krl_script`]):
/// the heredoc's content replaced; user data written before KRLs reached guests gets the
/// heredoc and its decoding line before the sshd drop-in, and `RevokedKeys` in the drop-in.
/// `None` when the text has no sshd drop-in of ours.
pub fn set_krl(text: &str, krl: &[u8]) -> Option<String> {
    use crate::create::cloudinit::platform::{krl_decode_line, krl_lines, revoked_keys_line};
    let lines = krl_lines(krl);
    if let Some(done) = replace_heredoc(text, REVOKED_KRL_B64_PATH, &lines) {
        return Some(done);
    }
    let mut drop_in = heredoc_content(text, SSHD_DROP_IN_PATH)?;
    drop_in.push(revoked_keys_line());
    let text = replace_heredoc(text, SSHD_DROP_IN_PATH, &drop_in)?;
    let opener = format!("cat > {SSHD_DROP_IN_PATH} <<'");
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if trimmed.starts_with(&opener) {
            let indent = &line[..line.len() - trimmed.len()];
            let mut block = String::new();
            crate::create::cloudinit::platform::heredoc(
                &mut block,
                ">",
                REVOKED_KRL_B64_PATH,
                &(lines.join("\n") + "\n"),
            );
            block.push_str(&krl_decode_line());
            for l in block.lines() {
                out.push_str(&format!("{indent}{l}\n"));
            }
        }
        out.push_str(line);
    }
    Some(out)
}

/// Whether `vm` (a KubeVirt or Deckhouse VirtualMachine as read) is one kubectl-vm made that
/// refers to and owns `secret`; the reason when not.
pub fn check_ownership(secret: &Secret, vm: &Value) -> std::result::Result<(), String> {
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    if vm
        .pointer("/metadata/labels")
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        != Some(&Value::from(MANAGED_BY))
    {
        return Err("the VM was not made by kubectl-vm; not touched".into());
    }
    let volumes = vm
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let kubevirt_ref = volumes
        .filter_map(|v| {
            v.get("cloudInitNoCloud")
                .or_else(|| v.get("cloudInitConfigDrive"))
        })
        .any(|s| s.pointer("/secretRef/name").and_then(Value::as_str) == Some(name));
    let deckhouse_ref = vm
        .pointer("/spec/provisioning/userDataRef")
        .is_some_and(|r| r["kind"] == "Secret" && r["name"].as_str() == Some(name));
    if !kubevirt_ref && !deckhouse_ref {
        return Err(format!(
            "the VM does not use Secret {name:?} for its cloud-init; not touched"
        ));
    }
    let uid = vm.pointer("/metadata/uid").and_then(Value::as_str);
    let owned = secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == "VirtualMachine" && Some(r.uid.as_str()) == uid);
    if uid.is_none() || !owned {
        return Err(format!(
            "Secret {name:?} is not owned by the VM (no ownerReference with its uid); not touched"
        ));
    }
    Ok(())
}

/// The host key of the cloud-config `text` when it is the one certified for VM `vm` in
/// `namespace` (see the module documentation): `Ok(None)` when the text has no host key or no
/// host certificate (nothing to renew), `Err` when the key is not the certified one.
pub fn certified_host_key(
    text: &str,
    namespace: &str,
    vm: &str,
    ca_keys: &[String],
) -> std::result::Result<Option<PublicKey>, String> {
    let (Some(key), Some(cert_lines)) =
        (host_public_key(text), heredoc_content(text, HOST_CERT_PATH))
    else {
        return Ok(None);
    };
    let cert = cert_lines
        .iter()
        .find(|l| !l.is_empty())
        .and_then(|l| Certificate::from_openssh(l).ok())
        .ok_or("its host certificate cannot be read; not touched")?;
    if cert.cert_type() != CertType::Host || cert.public_key() != key.key_data() {
        return Err(
            "its host key is not the one its host certificate certifies; not touched".into(),
        );
    }
    let names_vm = cert.key_id() == format!("kubevm-host:{namespace}/{vm}")
        || cert.valid_principals() == crate::ca::host_principals(vm, namespace).as_slice();
    if !names_vm {
        return Err(format!(
            "its host certificate was not issued for {vm}.{namespace}; not touched"
        ));
    }
    let fingerprints: Vec<_> = ca_keys
        .iter()
        .filter_map(|k| PublicKey::from_openssh(k).ok())
        .map(|k| k.fingerprint(HashAlg::Sha256))
        .collect();
    // Signed by a CA key published now; checked at its own start so an expired certificate can
    // still be renewed.
    cert.validate_at(cert.valid_after(), &fingerprints)
        .map_err(|_| "its host certificate is not signed by the CA; not touched".to_string())?;
    Ok(Some(key))
}

/// The VM `name` in `namespace` (KubeVirt first, then Deckhouse); `None` when neither exists
/// (or the API is not served).
async fn find_vm(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
) -> std::result::Result<Option<Value>, String> {
    for kind in [KUBEVIRT_VM, DECKHOUSE_VM] {
        match kind
            .api(&cluster.client, Some(namespace))
            .get_opt(name)
            .await
        {
            Ok(Some(vm)) => return Ok(Some(serde_json::to_value(vm).unwrap_or_default())),
            Ok(None) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                return Err(cluster
                    .error(e, &kind.action("get", Some(namespace)).named(name))
                    .to_string());
            }
        }
    }
    Ok(None)
}

/// The guest's host public key from the cloud-config (`ssh_keys.ed25519_public`).
pub fn host_public_key(text: &str) -> Option<PublicKey> {
    text.lines()
        .find_map(|l| l.trim_start().strip_prefix("ed25519_public:"))
        .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\''))
        .and_then(|v| PublicKey::from_openssh(v).ok())
}

/// What [`update_vm_trust`] did.
#[derive(Debug, Default)]
pub struct TrustUpdate {
    /// `NAME.NAMESPACE` of the VMs whose cloud-init now has the keys.
    pub updated: Vec<String>,
    /// VMs left as they were, with the reason.
    pub skipped: Vec<(String, String)>,
}

/// Issues a host certificate for a VM's existing host key (the signer, or the CA in the direct
/// mode).
pub trait HostCertifier {
    /// A certificate for `key` as the host of `vm` in `namespace`.
    fn certify(
        &self,
        namespace: &str,
        vm: &str,
        key: &PublicKey,
    ) -> impl std::future::Future<Output = std::result::Result<Certificate, String>> + Send;
}

/// Rewrite the trusted CA keys, the CA's KRL (`krl`, see [`set_krl`]) and, with `certifier`,
/// the host certificate in the cloud-init of every VM kubectl-vm created that the user can
/// list.
pub async fn update_vm_trust<C: HostCertifier + Sync>(
    cluster: &Cluster,
    ca_keys: &[String],
    krl: &[u8],
    certifier: Option<&C>,
) -> Result<TrustUpdate> {
    let (ours, skipped) = our_secrets(cluster).await?;
    let mut result = TrustUpdate {
        skipped,
        ..TrustUpdate::default()
    };
    for OurSecret {
        secret,
        namespace,
        vm,
        target,
    } in ours
    {
        let name = secret.metadata.name.clone().unwrap_or_default();
        match rewrite(&secret, &namespace, &vm, ca_keys, krl, certifier).await {
            Ok(Some(updated)) => {
                let api: Api<Secret> = Api::namespaced(cluster.client.clone(), &namespace);
                let write = Action::new("update", "secrets", "secret")
                    .named(&name)
                    .in_namespace(Some(&namespace));
                match api.replace(&name, &PostParams::default(), &updated).await {
                    Ok(_) => result.updated.push(target),
                    Err(e) => result
                        .skipped
                        .push((target, cluster.error(e, &write).to_string())),
                }
            }
            Ok(None) => result
                .skipped
                .push((target, "its cloud-init has no platform SSH trust".into())),
            Err(why) => result.skipped.push((target, why)),
        }
    }
    Ok(result)
}

/// A cloud-init Secret of a VM kubectl-vm made that refers to and owns it
/// ([`check_ownership`]).
pub struct OurSecret {
    /// The Secret as read (its resourceVersion is what a write carries).
    pub secret: Secret,
    /// Its namespace.
    pub namespace: String,
    /// The VM's name.
    pub vm: String,
    /// `NAME.NAMESPACE`, for messages.
    pub target: String,
}

/// The cloud-init Secrets of VMs kubectl-vm made that the user can list (cluster-wide, else
/// the current namespace), with the ones left alone and why.
pub async fn our_secrets(cluster: &Cluster) -> Result<(Vec<OurSecret>, Vec<(String, String)>)> {
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY},{VM_LABEL}");
    let all: Api<Secret> = Api::all(cluster.client.clone());
    let action = Action::new("list", "secrets", "secret");
    let secrets = match all.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items,
        // Not allowed cluster-wide: the current namespace.
        Err(_) => {
            let api: Api<Secret> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
            api.list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| cluster.error(e, &action.in_namespace(Some(&cluster.namespace))))?
                .items
        }
    };
    let (mut ours, mut skipped) = (Vec::new(), Vec::new());
    for secret in secrets {
        let namespace = secret.metadata.namespace.clone().unwrap_or_default();
        let name = secret.metadata.name.clone().unwrap_or_default();
        let Some(vm) = secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(VM_LABEL))
            .cloned()
        else {
            continue;
        };
        if name != format!("{vm}-cloudinit") {
            continue;
        }
        let target = format!("{vm}.{namespace}");
        let owner = match find_vm(cluster, &namespace, &vm).await {
            Ok(Some(owner)) => owner,
            Ok(None) => {
                skipped.push((target, "no such VM; its Secret is not touched".into()));
                continue;
            }
            Err(why) => {
                skipped.push((target, why));
                continue;
            }
        };
        if let Err(why) = check_ownership(&secret, &owner) {
            skipped.push((target, why));
            continue;
        }
        ours.push(OurSecret {
            secret,
            namespace,
            vm,
            target,
        });
    }
    Ok((ours, skipped))
}

async fn rewrite<C: HostCertifier + Sync>(
    secret: &Secret,
    namespace: &str,
    vm: &str,
    ca_keys: &[String],
    krl: &[u8],
    certifier: Option<&C>,
) -> std::result::Result<Option<Secret>, String> {
    let data = secret.data.clone().unwrap_or_default();
    let Some((key, bytes)) = USER_DATA_KEYS
        .iter()
        .find_map(|k| data.get(*k).map(|v| (*k, v.0.clone())))
    else {
        return Ok(None);
    };
    let text = String::from_utf8(bytes).map_err(|_| "its user data is not text".to_string())?;
    // Judged on the certificate as it is, before the trusted keys change.
    let certified = certified_host_key(&text, namespace, vm, ca_keys)?;
    let Some(text) = replace_heredoc(&text, CA_KEYS_PATH, ca_keys) else {
        return Ok(None);
    };
    let Some(mut text) = set_krl(&text, krl) else {
        return Ok(None);
    };
    if let (Some(certifier), Some(host_key)) = (certifier, certified) {
        let certificate = certifier.certify(namespace, vm, &host_key).await?;
        let line = certificate.to_openssh().map_err(|e| e.to_string())?;
        if let Some(with_cert) = replace_heredoc(&text, HOST_CERT_PATH, &[line]) {
            text = with_cert;
        }
    }
    let mut updated = secret.clone();
    updated.metadata.managed_fields = None;
    let mut data = data;
    data.insert(key.to_owned(), k8s_openapi::ByteString(text.into_bytes()));
    updated.data = Some(data);
    updated.string_data = None;
    Ok(Some(updated))
}

/// Host certificates from the signer (the caller needs the right to update the VM).
pub struct SignerCertifier<'a>(pub &'a Cluster);

impl HostCertifier for SignerCertifier<'_> {
    async fn certify(
        &self,
        namespace: &str,
        vm: &str,
        key: &PublicKey,
    ) -> std::result::Result<Certificate, String> {
        crate::signer::client::host_certificate(self.0, namespace, vm, key)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Host certificates signed here with the CA's newest key (the direct mode).
pub struct CaCertifier<'a>(pub &'a super::CaBundle);

impl HostCertifier for CaCertifier<'_> {
    async fn certify(
        &self,
        namespace: &str,
        vm: &str,
        key: &PublicKey,
    ) -> std::result::Result<Certificate, String> {
        let decision = crate::signer::policy::host_certificate(
            &crate::signer::policy::Limits::default(),
            vm,
            namespace,
        );
        crate::signer::sign::sign(
            self.0.signing_key(),
            key,
            russh::keys::ssh_key::certificate::CertType::Host,
            &decision,
        )
        .map(|s| s.certificate)
        .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER_DATA: &str = "#cloud-config\nssh_keys:\n  ed25519_public: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHcP1uPBmPUxGj6S+v8Wgfc1ckRtXQ4dx2ri8DPz8GLy kubevm-host\nbootcmd:\n- |\n  umask 022\n  cat > /etc/ssh/kubevm_trusted_user_ca_keys <<'KUBEVM_EOF'\n  ssh-ed25519 OLD\n  KUBEVM_EOF\n  cat > /etc/ssh/kubevm_ssh_host_ed25519_key-cert.pub <<'KUBEVM_EOF'\n  ssh-ed25519-cert-v01@openssh.com OLDCERT\n  KUBEVM_EOF\n  echo done\n";

    #[test]
    fn only_the_trust_heredoc_changes() {
        let keys = vec!["ssh-ed25519 OLD".to_string(), "ssh-ed25519 NEW".to_string()];
        let out = replace_heredoc(USER_DATA, CA_KEYS_PATH, &keys).unwrap();
        assert!(out.contains("<<'KUBEVM_EOF'\n  ssh-ed25519 OLD\n  ssh-ed25519 NEW\n  KUBEVM_EOF\n  cat > /etc/ssh/kubevm_ssh_host"), "{out}");
        assert!(out.contains("OLDCERT") && out.ends_with("  echo done\n"));
        // The result is still the same YAML shape: cloud-init reads one bootcmd script.
        let doc: yaml_serde::Value = yaml_serde::from_str(&out).unwrap();
        let script = doc["bootcmd"][0].as_str().unwrap();
        assert!(script.contains("ssh-ed25519 NEW\nKUBEVM_EOF\n"), "{script}");
        assert!(replace_heredoc("#cloud-config\n", CA_KEYS_PATH, &keys).is_none());
        assert_eq!(
            host_public_key(USER_DATA).unwrap().to_openssh().unwrap(),
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHcP1uPBmPUxGj6S+v8Wgfc1ckRtXQ4dx2ri8DPz8GLy kubevm-host"
        );
    }

    /// A guest made before KRLs reached guests gets the KRL block before its drop-in and
    /// `RevokedKeys` in it; the next update replaces only the KRL. The boot script, run by a
    /// real shell (paths moved to a temporary directory), leaves the KRL bytes as published.
    #[test]
    fn the_krl_reaches_old_and_new_user_data() {
        let legacy = format!(
            "#cloud-config\nbootcmd:\n- |\n  umask 022\n  cat > {SSHD_DROP_IN_PATH} <<'KUBEVM_EOF'\n  TrustedUserCAKeys {CA_KEYS_PATH}\n  KUBEVM_EOF\n  echo done\n"
        );
        let mut lists = crate::ca::krl::Revocations::default();
        lists.serials.insert(42);
        let first = lists.to_krl(1, 1);
        let once = set_krl(&legacy, &first).unwrap();
        assert_eq!(
            heredoc_content(&once, SSHD_DROP_IN_PATH).unwrap(),
            [
                format!("TrustedUserCAKeys {CA_KEYS_PATH}"),
                "RevokedKeys /etc/ssh/kubevm_revoked_keys.krl".to_string()
            ]
        );
        lists
            .key_ids
            .insert("kubevm-host:vm/db.primary.prod".into());
        let second = lists.to_krl(2, 2);
        let twice = set_krl(&once, &second).unwrap();
        assert_eq!(twice.matches(REVOKED_KRL_B64_PATH).count(), 2, "{twice}");
        assert_eq!(twice.matches("RevokedKeys").count(), 1, "{twice}");
        let doc: yaml_serde::Value = yaml_serde::from_str(&twice).unwrap();
        let script = doc["bootcmd"][0].as_str().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_str().unwrap();
        std::fs::create_dir_all(dir.path().join("etc/ssh/sshd_config.d")).unwrap();
        let local = script.replace("/etc/", &format!("{root}/etc/"));
        let out = std::process::Command::new("sh")
            .arg("-ec")
            .arg(&local)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            std::fs::read(dir.path().join("etc/ssh/kubevm_revoked_keys.krl")).unwrap(),
            second
        );
        assert!(set_krl("#cloud-config\n", &second).is_none());
    }

    fn secret(name: &str, owner_uid: Option<&str>) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.owner_references = owner_uid.map(|uid| {
            vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "kubevirt.io/v1".into(),
                    kind: "VirtualMachine".into(),
                    name: "web".into(),
                    uid: uid.into(),
                    ..Default::default()
                },
            ]
        });
        s
    }

    #[test]
    fn only_a_vm_of_ours_that_uses_and_owns_the_secret_counts() {
        let kubevirt = serde_json::json!({"metadata": {"uid": "u1", "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
            "spec": {"template": {"spec": {"volumes": [{"name": "cloudinitdisk",
                "cloudInitNoCloud": {"secretRef": {"name": "web-cloudinit"}}}]}}}});
        assert_eq!(
            check_ownership(&secret("web-cloudinit", Some("u1")), &kubevirt),
            Ok(())
        );
        let deckhouse = serde_json::json!({"metadata": {"uid": "u1", "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
            "spec": {"provisioning": {"type": "UserDataRef", "userDataRef": {"kind": "Secret", "name": "web-cloudinit"}}}});
        assert_eq!(
            check_ownership(&secret("web-cloudinit", Some("u1")), &deckhouse),
            Ok(())
        );
        // Not owned, owned by another uid, not referenced, not made by us.
        let e = check_ownership(&secret("web-cloudinit", None), &kubevirt).unwrap_err();
        assert!(e.contains("not owned"), "{e}");
        assert!(check_ownership(&secret("web-cloudinit", Some("u2")), &kubevirt).is_err());
        let e = check_ownership(&secret("other-cloudinit", Some("u1")), &kubevirt).unwrap_err();
        assert!(e.contains("does not use"), "{e}");
        let mut foreign = kubevirt.clone();
        foreign["metadata"]["labels"] = serde_json::json!({});
        let e = check_ownership(&secret("web-cloudinit", Some("u1")), &foreign).unwrap_err();
        assert!(e.contains("not made by kubectl-vm"), "{e}");
    }

    fn user_data(public_key: &str, certificate: &str) -> String {
        format!(
            "#cloud-config\nssh_keys:\n  ed25519_public: {public_key}\nbootcmd:\n- |\n  cat > {HOST_CERT_PATH} <<'KUBEVM_EOF'\n  {certificate}\n  KUBEVM_EOF\n"
        )
    }

    #[test]
    fn only_the_key_certified_for_the_vm_is_renewed() {
        use crate::ca::{CaBundle, HostKeys};
        use std::time::Duration;
        let ca = CaBundle::generate().unwrap();
        let keys = ca.public_keys_openssh().unwrap();
        let hour = Duration::from_secs(3600);
        let web = HostKeys::issue(&ca, "web", "prod", hour).unwrap();
        let text = user_data(&web.public_key, &web.certificate);
        let key = certified_host_key(&text, "prod", "web", &keys)
            .unwrap()
            .unwrap();
        assert_eq!(key.to_openssh().unwrap(), web.public_key);
        // An attacker's key next to web's certificate.
        let other = HostKeys::issue(&ca, "web", "prod", hour).unwrap();
        let swapped = user_data(&other.public_key, &web.certificate);
        let e = certified_host_key(&swapped, "prod", "web", &keys).unwrap_err();
        assert!(e.contains("not the one"), "{e}");
        // The certificate of another VM, and one signed by another CA.
        let e = certified_host_key(&text, "prod", "db", &keys).unwrap_err();
        assert!(e.contains("not issued for db.prod"), "{e}");
        let stranger = CaBundle::generate().unwrap();
        let forged = HostKeys::issue(&stranger, "web", "prod", hour).unwrap();
        let e = certified_host_key(
            &user_data(&forged.public_key, &forged.certificate),
            "prod",
            "web",
            &keys,
        )
        .unwrap_err();
        assert!(e.contains("not signed by the CA"), "{e}");
        // No certificate: nothing to renew.
        let bare = format!(
            "#cloud-config\nssh_keys:\n  ed25519_public: {}\n",
            web.public_key
        );
        assert!(
            certified_host_key(&bare, "prod", "web", &keys)
                .unwrap()
                .is_none()
        );
    }
}
