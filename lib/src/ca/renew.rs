//! Renewing only the host certificates that are about to expire (`ca rotate --renew-before`).
//!
//! A host certificate is valid a year ([`super::DEFAULT_HOST_CERT_VALIDITY`]) and reaches the
//! guest only at its next boot, so it must be renewed well before it runs out; renewing every
//! VM's on each run would rewrite every Secret for nothing. Here only the VMs of ours
//! ([`super::propagate::our_secrets`]) whose certified host key
//! ([`super::propagate::certified_host_key`]) has a certificate ending within the window get a
//! new one for the same key; the others are reported with the time theirs ends, and not
//! written.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;
use russh::keys::ssh_key::Certificate;

use super::propagate::{
    HostCertifier, OurSecret, certified_host_key, heredoc_content, our_secrets, replace_heredoc,
};
use crate::cluster::Cluster;
use crate::error::{Action, Result};
use crate::names::HOST_CERT_PATH;

/// The window `ca rotate --renew-before` uses when given no value: 60 days, two monthly
/// patch-and-reboot cycles, so a renewed certificate reaches the guest before the old one
/// ends even if one reboot is missed.
pub const DEFAULT_RENEW_BEFORE: Duration = Duration::from_secs(60 * 24 * 3600);

/// Data keys of the user-data Secret (KubeVirt `userdata`, Deckhouse `userData`).
const USER_DATA_KEYS: [&str; 2] = ["userdata", "userData"];

/// What happened to one VM's host certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// A new certificate was written; it is valid until this time (Unix seconds).
    Renewed {
        /// The old certificate's end (Unix seconds).
        was_until: u64,
        /// The new certificate's end (Unix seconds).
        until: u64,
    },
    /// Its certificate ends after the window; nothing was written.
    Kept {
        /// Its end (Unix seconds).
        until: u64,
    },
    /// Left alone, with the reason.
    Skipped(String),
}

/// One VM's result: `NAME.NAMESPACE` and what happened.
pub type VmRenewal = (String, Renewal);

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// The user data of a Secret and its data key.
fn user_data(secret: &Secret) -> Option<(String, String)> {
    let data = secret.data.as_ref()?;
    USER_DATA_KEYS.iter().find_map(|k| {
        data.get(*k)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .map(|t| ((*k).to_owned(), t))
    })
}

/// The end of the host certificate in `text` (Unix seconds), if it has one that parses.
pub fn host_certificate_end(text: &str) -> Option<u64> {
    heredoc_content(text, HOST_CERT_PATH)?
        .iter()
        .find(|l| !l.is_empty())
        .and_then(|l| Certificate::from_openssh(l).ok())
        .map(|c| c.valid_before())
}

/// Renew the host certificates of VMs of ours that end within `window` from now, with
/// `certifier` (the signer, or the CA in the direct mode), for the key already certified.
/// `ca_keys` are the CA keys published now (a certificate must be signed by one of them).
pub async fn renew_expiring<C: HostCertifier + Sync>(
    cluster: &Cluster,
    ca_keys: &[String],
    certifier: &C,
    window: Duration,
) -> Result<Vec<VmRenewal>> {
    let (ours, skipped) = our_secrets(cluster).await?;
    let mut out: Vec<VmRenewal> = skipped
        .into_iter()
        .map(|(t, why)| (t, Renewal::Skipped(why)))
        .collect();
    let deadline = now().saturating_add(window.as_secs());
    for OurSecret {
        secret,
        namespace,
        vm,
        target,
    } in ours
    {
        let renewal = renew_one(
            cluster, &secret, &namespace, &vm, ca_keys, certifier, deadline,
        )
        .await
        .unwrap_or_else(Renewal::Skipped);
        out.push((target, renewal));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

async fn renew_one<C: HostCertifier + Sync>(
    cluster: &Cluster,
    secret: &Secret,
    namespace: &str,
    vm: &str,
    ca_keys: &[String],
    certifier: &C,
    deadline: u64,
) -> std::result::Result<Renewal, String> {
    let (key, text) = user_data(secret).ok_or("its cloud-init has no user data")?;
    let until = host_certificate_end(&text).ok_or("it has no host certificate")?;
    let host_key = certified_host_key(&text, namespace, vm, ca_keys)?
        .ok_or("it has no host key with a certificate")?;
    if until > deadline {
        return Ok(Renewal::Kept { until });
    }
    let certificate = certifier.certify(namespace, vm, &host_key).await?;
    let line = certificate.to_openssh().map_err(|e| e.to_string())?;
    let text = replace_heredoc(&text, HOST_CERT_PATH, &[line])
        .ok_or("its host certificate could not be replaced")?;
    let mut updated = secret.clone();
    updated.metadata.managed_fields = None;
    let mut data = updated.data.take().unwrap_or_default();
    data.insert(key, k8s_openapi::ByteString(text.into_bytes()));
    updated.data = Some(data);
    updated.string_data = None;
    let name = secret.metadata.name.clone().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    let write = Action::new("update", "secrets", "secret")
        .named(&name)
        .in_namespace(Some(namespace));
    // The resourceVersion read: a Secret changed meanwhile is a Conflict, not overwritten.
    api.replace(&name, &PostParams::default(), &updated)
        .await
        .map_err(|e| cluster.error(e, &write).to_string())?;
    Ok(Renewal::Renewed {
        was_until: until,
        until: certificate.valid_before(),
    })
}
