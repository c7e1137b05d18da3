//! Carrying a CA rotation into the VMs kubectl-vm created: their cloud-init (the user-data
//! Secret `create` made, re-applied by `bootcmd` on every boot) gets the trusted keys as
//! published now and, when asked, a host certificate from the newest key for the host key it
//! already has. The guest applies both at its next boot.
//!
//! Only Secrets labelled as kubectl-vm's and named `<vm>-cloudinit` are touched, with the
//! resourceVersion that was read, so a concurrent change is not overwritten.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, PostParams};
use russh::keys::PublicKey;
use russh::keys::ssh_key::Certificate;

use crate::cluster::Cluster;
use crate::create::cloudinit::platform::{CA_KEYS_PATH, HOST_CERT_PATH};
use crate::create::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};
use crate::error::{Action, Result};

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

/// Rewrite the trusted CA keys (and, with `certifier`, the host certificate) in the cloud-init
/// of every VM kubectl-vm created that the user can list.
pub async fn update_vm_trust<C: HostCertifier + Sync>(
    cluster: &Cluster,
    ca_keys: &[String],
    certifier: Option<&C>,
) -> Result<TrustUpdate> {
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
    let mut result = TrustUpdate::default();
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
        match rewrite(&secret, &namespace, &vm, ca_keys, certifier).await {
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

async fn rewrite<C: HostCertifier + Sync>(
    secret: &Secret,
    namespace: &str,
    vm: &str,
    ca_keys: &[String],
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
    let Some(mut text) = replace_heredoc(&text, CA_KEYS_PATH, ca_keys) else {
        return Ok(None);
    };
    if let (Some(certifier), Some(host_key)) = (certifier, host_public_key(&text)) {
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
}
