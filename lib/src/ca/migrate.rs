//! `kubectl vm ca migrate`: VMs kubectl-vm made before VM-scoped trust get it.
//!
//! Their guests trust every certificate of the CA whose principal is the login name (no
//! `AuthorizedPrincipalsFile`). The signer no longer issues such bare principals, so until they
//! are migrated no certificate opens them. Migrating rewrites the trust section of the
//! cloud-init Secret `create` made (re-applied by `bootcmd` on every boot) to what `create`
//! writes now: a principals file per login naming `LOGIN@NAME.NAMESPACE` and
//! `AuthorizedPrincipalsFile` in the sshd drop-in; then it sets the VM's
//! [`crate::names::TRUST_ANNOTATION`]. The guest applies it at its next boot.
//!
//! Only what is ours is touched: VMs labelled as made by kubectl-vm whose spec references the
//! Secret, a Secret labelled as ours that the VM owns (controller reference with the VM's uid),
//! each written with the resourceVersion that was read.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::{Action, Result};
use crate::flavor::Flavor;
pub use crate::names::TRUST_NONE;
use crate::names::{CA_KEYS_PATH, PRINCIPALS_DIR, SSHD_DROP_IN_PATH};
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::names::{TRUST_ANNOTATION, TRUST_VM_SCOPED};
use crate::signer::scoped_principal;

/// Data keys of the user-data Secret (KubeVirt `userdata`, Deckhouse `userData`).
const USER_DATA_KEYS: [&str; 2] = ["userdata", "userData"];

/// What happened to one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The scoped trust was written (or, with `dry_run`, would be) for these logins; it takes
    /// effect at the VM's next boot.
    Migrated {
        /// The logins that got a principals file.
        logins: Vec<String>,
    },
    /// Its cloud-init has no platform SSH trust; the VM is marked [`TRUST_NONE`].
    NoPlatformTrust,
    /// Left as it is, with the reason (one line).
    Skipped(String),
}

/// One VM and what `migrate` did to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmMigration {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// What happened.
    pub outcome: Outcome,
}

/// The Secret a VM's spec names for its cloud-init user data: KubeVirt
/// `cloudInitNoCloud.secretRef` / `userDataSecretRef` of a volume, Deckhouse
/// `provisioning.userDataRef` of kind Secret.
pub fn user_data_secret(flavor: Flavor, vm: &Value) -> Option<String> {
    match flavor {
        Flavor::KubeVirt => vm
            .pointer("/spec/template/spec/volumes")?
            .as_array()?
            .iter()
            .find_map(|v| {
                let source = v
                    .get("cloudInitNoCloud")
                    .or_else(|| v.get("cloudInitConfigDrive"))?;
                source
                    .pointer("/secretRef/name")
                    .or_else(|| source.pointer("/userDataSecretRef/name"))?
                    .as_str()
                    .map(str::to_owned)
            }),
        Flavor::Deckhouse => {
            let reference = vm.pointer("/spec/provisioning/userDataRef")?;
            (reference["kind"] == "Secret")
                .then(|| reference["name"].as_str().map(str::to_owned))
                .flatten()
        }
    }
}

/// Whether `secret` is ours and owned by the VM with `uid`: kubectl-vm's label and a
/// controller reference to that VM.
pub fn owned_by(secret: &Secret, uid: &str) -> bool {
    let labelled = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .is_some_and(|v| v == MANAGED_BY);
    let owned = secret
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.uid == uid && r.controller == Some(true));
    labelled && owned
}

/// The logins a legacy cloud-config gives platform certificates to: the platform user its
/// `bootcmd` creates (`id -u USER … || useradd`) and the `--guest-user` (the `users` entry with
/// sudo rights), in that order.
pub fn logins_of(user_data: &str) -> Vec<String> {
    let mut logins = Vec::new();
    for line in user_data.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("id -u ")
            && let Some((user, tail)) = rest.split_once(' ')
            && tail.contains("useradd")
            && crate::signer::policy::valid_login(user)
            && !logins.iter().any(|l| l == user)
        {
            logins.push(user.to_owned());
        }
    }
    if let Ok(doc) = yaml_serde::from_str::<yaml_serde::Value>(user_data)
        && let Some(users) = doc.get("users").and_then(|u| u.as_sequence())
    {
        for user in users {
            if user.get("sudo").is_none() {
                continue;
            }
            if let Some(name) = user.get("name").and_then(|n| n.as_str())
                && crate::signer::policy::valid_login(name)
                && !logins.iter().any(|l| l == name)
            {
                logins.push(name.to_owned());
            }
        }
    }
    logins
}

/// Why a cloud-config cannot be migrated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RewriteError {
    /// It has no platform SSH trust (no trusted CA keys file written by kubectl-vm).
    NoPlatformTrust,
    /// It is not in the form kubectl-vm wrote (one line).
    Unexpected(String),
}

/// The cloud-config with VM-scoped trust for VM `name` in `namespace`, as `create` writes it
/// now: after the trusted CA keys, the principals directory is made anew with one file per
/// login naming `LOGIN@NAME.NAMESPACE`, and the sshd drop-in gets `AuthorizedPrincipalsFile`.
/// `Ok(None)` when it already has both.
pub fn rewrite(
    user_data: &str,
    name: &str,
    namespace: &str,
    logins: &[String],
) -> std::result::Result<Option<String>, RewriteError> {
    let ca_opener = format!("cat > {CA_KEYS_PATH} <<'");
    let drop_in_opener = format!("cat > {SSHD_DROP_IN_PATH} <<'");
    let trusted = format!("TrustedUserCAKeys {CA_KEYS_PATH}");
    let authorized = format!("AuthorizedPrincipalsFile {PRINCIPALS_DIR}/%u");
    if !user_data
        .lines()
        .any(|l| l.trim_start().starts_with(&ca_opener))
    {
        return Err(RewriteError::NoPlatformTrust);
    }
    if user_data.lines().any(|l| l.trim() == authorized) {
        return Ok(None);
    }
    if logins.is_empty() {
        return Err(RewriteError::Unexpected(
            "no login found in its cloud-init".into(),
        ));
    }
    let mut out = String::with_capacity(user_data.len() + 256);
    let mut lines = user_data.split_inclusive('\n');
    let (mut principals_written, mut drop_in_written) = (false, false);
    while let Some(line) = lines.next() {
        out.push_str(line);
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let Some(rest) = trimmed
            .strip_prefix(&ca_opener)
            .or_else(|| trimmed.strip_prefix(&drop_in_opener))
        else {
            continue;
        };
        let is_ca = trimmed.starts_with(&ca_opener);
        let delimiter = rest
            .trim_end()
            .strip_suffix('\'')
            .ok_or_else(|| RewriteError::Unexpected(format!("unexpected line {trimmed:?}")))?
            .to_owned();
        let mut closed = false;
        for body in lines.by_ref() {
            if body.trim() == delimiter {
                if !is_ca && !drop_in_written {
                    return Err(RewriteError::Unexpected(format!(
                        "its sshd drop-in has no line {trusted:?}"
                    )));
                }
                out.push_str(body);
                closed = true;
                break;
            }
            out.push_str(body);
            if !is_ca && body.trim() == trusted {
                out.push_str(&format!("{indent}{authorized}\n"));
                drop_in_written = true;
            }
        }
        if !closed {
            return Err(RewriteError::Unexpected(format!(
                "unterminated here-document {delimiter:?}"
            )));
        }
        if is_ca && !principals_written {
            out.push_str(&format!(
                "{indent}rm -rf {PRINCIPALS_DIR}\n{indent}mkdir -p {PRINCIPALS_DIR}\n"
            ));
            for login in logins {
                let principal = scoped_principal(login, name, namespace);
                out.push_str(&format!(
                    "{indent}cat > {PRINCIPALS_DIR}/{login} <<'KUBEVM_EOF'\n{indent}{principal}\n{indent}KUBEVM_EOF\n"
                ));
            }
            principals_written = true;
        }
    }
    if !drop_in_written {
        return Err(RewriteError::Unexpected(
            "its cloud-init has no sshd drop-in written by kubectl-vm".into(),
        ));
    }
    Ok(Some(out))
}

/// Migrate every VM kubectl-vm made on `flavor` that the user can list (all namespaces if
/// allowed, else `cluster.namespace`) and that has no [`TRUST_ANNOTATION`] yet. With `dry_run`
/// nothing is written; the outcomes say what would be done.
pub async fn migrate(cluster: &Cluster, flavor: Flavor, dry_run: bool) -> Result<Vec<VmMigration>> {
    let kind = Kind::vm(flavor);
    let params = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let vms = match kind.api(&cluster.client, None).list(&params).await {
        Ok(list) => list.items,
        Err(_) => {
            kind.api(&cluster.client, Some(&cluster.namespace))
                .list(&params)
                .await
                .map_err(|e| cluster.error(e, &kind.action("list", Some(&cluster.namespace))))?
                .items
        }
    };
    let mut out = Vec::new();
    for vm in vms {
        let vm = serde_json::to_value(vm).unwrap_or_default();
        if !vm["metadata"]["annotations"][TRUST_ANNOTATION].is_null() {
            continue;
        }
        let namespace = vm["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let name = vm["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let outcome = match migrate_one(cluster, flavor, &vm, dry_run).await {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Skipped(e.to_string()),
        };
        out.push(VmMigration {
            namespace,
            name,
            outcome,
        });
    }
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(out)
}

async fn migrate_one(
    cluster: &Cluster,
    flavor: Flavor,
    vm: &Value,
    dry_run: bool,
) -> Result<Outcome> {
    let meta = &vm["metadata"];
    let namespace = meta["namespace"].as_str().unwrap_or_default();
    let name = meta["name"].as_str().unwrap_or_default();
    let uid = meta["uid"].as_str().unwrap_or_default();
    let skip = |why: String| Ok(Outcome::Skipped(why));
    if meta["ownerReferences"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r["controller"] == true))
    {
        return skip(
            "it is controlled by another object (a pool): its template decides its trust; recreate the pool".into(),
        );
    }
    let Some(secret_name) = user_data_secret(flavor, vm) else {
        return mark_none_or_skip(cluster, flavor, vm, dry_run).await;
    };
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    let read = Action::new("get", "secrets", "secret")
        .named(&secret_name)
        .in_namespace(Some(namespace));
    let secret = match secrets.get(&secret_name).await {
        Ok(s) => s,
        Err(e) => return skip(cluster.error(e, &read).to_string()),
    };
    if !owned_by(&secret, uid) {
        return skip(format!(
            "Secret {secret_name} is not one kubectl-vm made for this VM (no label, or the VM does not own it): left alone"
        ));
    }
    let data = secret.data.clone().unwrap_or_default();
    let Some((key, bytes)) = USER_DATA_KEYS
        .iter()
        .find_map(|k| data.get(*k).map(|v| (*k, v.0.clone())))
    else {
        return skip(format!("Secret {secret_name} has no user data"));
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return skip(format!("Secret {secret_name}: its user data is not text"));
    };
    let logins = logins_of(&text);
    let rewritten = match rewrite(&text, name, namespace, &logins) {
        Ok(r) => r,
        Err(RewriteError::NoPlatformTrust) => {
            return mark(cluster, flavor, vm, TRUST_NONE, dry_run)
                .await
                .map(|()| Outcome::NoPlatformTrust);
        }
        Err(RewriteError::Unexpected(why)) => return skip(format!("Secret {secret_name}: {why}")),
    };
    if let Some(text) = rewritten
        && !dry_run
    {
        let mut updated = secret.clone();
        updated.metadata.managed_fields = None;
        let mut data = data;
        data.insert(key.to_owned(), k8s_openapi::ByteString(text.into_bytes()));
        updated.data = Some(data);
        updated.string_data = None;
        let write = Action::new("update", "secrets", "secret")
            .named(&secret_name)
            .in_namespace(Some(namespace));
        // Replace carries the resourceVersion read: a concurrent change is not overwritten.
        secrets
            .replace(&secret_name, &PostParams::default(), &updated)
            .await
            .map_err(|e| cluster.error(e, &write))?;
    }
    mark(cluster, flavor, vm, TRUST_VM_SCOPED, dry_run).await?;
    Ok(Outcome::Migrated { logins })
}

/// Inline user data (no Secret): a VM whose inline cloud-config lacks the trusted CA keys was
/// made without platform SSH and is marked [`TRUST_NONE`]; one with them is left (not ours to
/// rewrite in the VM spec).
async fn mark_none_or_skip(
    cluster: &Cluster,
    flavor: Flavor,
    vm: &Value,
    dry_run: bool,
) -> Result<Outcome> {
    let inline = match flavor {
        Flavor::KubeVirt => vm
            .pointer("/spec/template/spec/volumes")
            .and_then(Value::as_array)
            .and_then(|v| {
                v.iter()
                    .find_map(|v| v.pointer("/cloudInitNoCloud/userData")?.as_str())
            }),
        Flavor::Deckhouse => vm
            .pointer("/spec/provisioning/userData")
            .and_then(Value::as_str),
    };
    if inline.is_some_and(|text| text.contains(CA_KEYS_PATH)) {
        return Ok(Outcome::Skipped(
            "its cloud-init is inline in the VM spec, not in a Secret: recreate it".into(),
        ));
    }
    mark(cluster, flavor, vm, TRUST_NONE, dry_run).await?;
    Ok(Outcome::NoPlatformTrust)
}

/// Set [`TRUST_ANNOTATION`] to `value`, with the VM's uid and resourceVersion as preconditions.
async fn mark(
    cluster: &Cluster,
    flavor: Flavor,
    vm: &Value,
    value: &str,
    dry_run: bool,
) -> Result<()> {
    if dry_run {
        return Ok(());
    }
    let meta = &vm["metadata"];
    let namespace = meta["namespace"].as_str().unwrap_or_default();
    let name = meta["name"].as_str().unwrap_or_default();
    let kind = Kind::vm(flavor);
    let patch = json!({"metadata": {
        "uid": meta["uid"],
        "resourceVersion": meta["resourceVersion"],
        "annotations": {TRUST_ANNOTATION: value},
    }});
    kind.api(&cluster.client, Some(namespace))
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| cluster.error(e, &kind.action("patch", Some(namespace)).named(name)))
        .map(|_| ())
}

#[cfg(test)]
mod tests;
