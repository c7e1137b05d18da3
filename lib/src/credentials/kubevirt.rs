//! Credentials on KubeVirt: the Secret, the VM's entry, and what the running VMI has.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

use super::{
    CredentialOutcome, Kind, Operation, add_entry, data_key, edit_keys, is_ours, references,
    secret_name, secret_object,
};
use crate::cluster::Cluster;
use crate::enroll::kubevirt::{get_vm, get_vmi, replace_data, secret_action, update_vm};
use crate::enroll::{Activation, SecretChange};
use crate::error::{Error, Result};
use crate::flavor::Flavor;

/// Change `login`'s credentials on VM `name` in `namespace`.
pub async fn apply(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    name: &str,
    login: &str,
    operation: &Operation,
) -> Result<CredentialOutcome> {
    super::validate(login, operation)?;
    crate::platform::of(flavor).access_credentials.check()?;
    let kind = operation.kind();
    let vm = get_vm(cluster, namespace, name).await?;
    let uid = vm["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let secret_name = secret_name(name, kind, login);
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    let existing = api
        .get_opt(&secret_name)
        .await
        .map_err(|e| cluster.error(e, &secret_action("get", namespace, &secret_name)))?;
    if let Some(s) = &existing
        && !is_ours(s, name, &uid, kind, login)
    {
        return Err(Error::Platform(format!(
            "secret {secret_name:?} in namespace {namespace:?} exists and is not kubectl vm's {} of {login:?} on this VM: it is left as it is; delete or rename it first",
            match kind {
                Kind::Keys => "key list",
                Kind::Password => "password",
            }
        )));
    }
    let key = data_key(kind, login);
    let current = existing
        .as_ref()
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(&key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default();
    let (text, keys) = match operation {
        Operation::SetPassword(p) => (p.clone(), 0),
        op => {
            let (lines, missing) = edit_keys(&current, op);
            if let Operation::RemoveKeys(given) = op
                && missing == given.len()
            {
                return Err(Error::Platform(format!(
                    "{login} on {name}.{namespace} has no such key from kubectl vm (secret {secret_name:?}); nothing was changed"
                )));
            }
            (
                lines.iter().map(|l| format!("{l}\n")).collect(),
                lines.len(),
            )
        }
    };
    let change = match &existing {
        Some(_) if text == current => SecretChange::Unchanged,
        Some(s) => {
            replace_data(cluster, namespace, s, &key, text).await?;
            SecretChange::Updated
        }
        None => {
            api.create(
                &PostParams::default(),
                &secret_object(&vm, kind, login, text),
            )
            .await
            .map_err(|e| cluster.error(e, &secret_action("create", namespace, &secret_name)))?;
            SecretChange::Created
        }
    };
    // Removing keys never adds an entry; the others make sure it is there.
    let vm_updated = if matches!(operation, Operation::RemoveKeys(_)) {
        false
    } else {
        update_vm(cluster, namespace, name, vm, |vm| {
            add_entry(vm, kind, login)
        })
        .await?
    };
    let activation = match get_vmi(cluster, namespace, name).await? {
        None => Activation::NextStart,
        Some(vmi) if references(&vmi["spec"], &secret_name) => Activation::Live,
        Some(_) => Activation::RestartRequired,
    };
    Ok(CredentialOutcome {
        vm: format!("{name}.{namespace}"),
        secret: secret_name,
        change,
        vm_updated,
        activation,
        keys,
    })
}
