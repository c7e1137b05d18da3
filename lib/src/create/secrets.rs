//! Reading the user's Secrets that `create` takes keys and user data from
//! (`--user-data-secret`, `--ssh-key-secret`, `--access-credential`). They are only read,
//! never modified: what comes from them goes into the VM's own user data (and so into
//! kubectl-vm's own Secret when it must not be inline).

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use super::extras::{USER_DATA_KEYS, keys_in_secret};
use super::plan::{DeliveryMethod, VmPlan};
use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};
use crate::validate;

/// The data of Secret `name` in `namespace`, key by key; a missing Secret is an error naming
/// the flag that asked for it.
async fn read(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    flag: &str,
) -> Result<Vec<(String, Vec<u8>)>> {
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    let action = Action::new("get", "secrets", "secret")
        .named(name)
        .in_namespace(Some(namespace));
    let secret = api
        .get_opt(name)
        .await
        .map_err(|e| cluster.error(e, &action))?
        .ok_or_else(|| {
            Error::Platform(format!(
                "{flag} {name}: secret {name:?} not found in namespace {namespace:?}"
            ))
        })?;
    let mut data: Vec<(String, Vec<u8>)> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    // stringData is write-only on a real server; a Secret read back has only data.
    for (k, v) in secret.string_data.unwrap_or_default() {
        data.push((k, v.into_bytes()));
    }
    Ok(data)
}

/// The public keys of Secret `name`, each checked; an error if it holds none.
async fn public_keys(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    flag: &str,
) -> Result<Vec<String>> {
    let keys = keys_in_secret(&read(cluster, namespace, name, flag).await?);
    if keys.is_empty() {
        return Err(Error::Platform(format!(
            "{flag} {name}: the Secret holds no public key"
        )));
    }
    for key in &keys {
        validate::ssh_public_key(key)
            .map_err(|e| Error::Platform(format!("{flag} {name}: {e}")))?;
    }
    Ok(keys)
}

/// Read every Secret the plan names into it: the user data (merged later like a
/// `--cloud-init` file), the `--ssh-key-secret` keys (added to the `--ssh-key` ones), and the
/// keys of access credentials delivered at boot. A `qemuGuestAgent` credential on KubeVirt
/// stays a reference, but its Secret must exist. On Deckhouse, which has no
/// `accessCredentials`, one warning line says what happens instead.
pub async fn load(
    cluster: &Cluster,
    plan: &mut VmPlan,
    warn: &mut dyn FnMut(String),
) -> Result<()> {
    let namespace = plan.namespace.clone();
    if let Some(name) = plan.extras.user_data_secret.clone() {
        let flag = "--user-data-secret";
        let data = read(cluster, &namespace, &name, flag).await?;
        let value = USER_DATA_KEYS
            .iter()
            .find_map(|key| data.iter().find(|(k, _)| k == key).map(|(_, v)| v))
            .ok_or_else(|| {
                Error::Platform(format!(
                    "{flag} {name}: the Secret has no {} key",
                    USER_DATA_KEYS.join(" or ")
                ))
            })?;
        let text = String::from_utf8(value.clone())
            .map_err(|_| Error::Platform(format!("{flag} {name}: the user data is not UTF-8")))?;
        plan.guest.user_data = Some(text);
        plan.guest.user_data_from_secret = true;
    }
    for name in plan.extras.ssh_key_secrets.clone() {
        let keys = public_keys(cluster, &namespace, &name, "--ssh-key-secret").await?;
        plan.guest.ssh_keys.extend(keys);
    }
    let flag = "--access-credential";
    let mut boot_keys = Vec::new();
    for credential in plan.extras.access_credentials.clone() {
        let at_boot = plan.boot_time_credentials().any(|c| *c == credential);
        if !at_boot {
            // Referenced by the VM; KubeVirt reads it when the VM starts.
            read(cluster, &namespace, &credential.secret, flag).await?;
            continue;
        }
        let keys = public_keys(cluster, &namespace, &credential.secret, flag).await?;
        for user in &credential.users {
            boot_keys.push((user.clone(), keys.clone()));
        }
        if !crate::platform::of(plan.flavor).access_credentials.is_yes() {
            let how = match credential.method {
                DeliveryMethod::QemuGuestAgent => " instead of by the guest agent",
                DeliveryMethod::ConfigDrive => "",
            };
            warn(format!(
                "Deckhouse has no accessCredentials: the keys of Secret {} are written into the VM's cloud-init for {} now{how}; later changes to the Secret do not reach the guest",
                credential.secret,
                credential.users.join(", ")
            ));
        }
    }
    plan.guest.boot_keys = boot_keys;
    Ok(())
}

/// Whether the plan names Secrets that [`load`] must read.
pub fn names_secrets(plan: &VmPlan) -> bool {
    plan.extras.user_data_secret.is_some()
        || !plan.extras.ssh_key_secrets.is_empty()
        || plan.boot_time_credentials().next().is_some()
}
