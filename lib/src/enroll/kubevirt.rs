//! Enrollment on KubeVirt: the Secrets, the VM's accessCredentials and annotations, and what
//! the running VMI has.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams, Preconditions};
use serde_json::Value;

use super::{
    Activation, EnrollEvent, EnrollOutcome, LOGIN_LABEL, SecretChange, add_to_vm, is_ours,
    login_allowed, references, remove_entry, remove_login, secret_content, secret_name,
    secret_object, secret_text, trust_lines,
};
use crate::api::{KUBEVIRT_VM, KUBEVIRT_VMI};
use crate::ca::propagate::TrustUpdate;
use crate::ca::store;
use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};
use crate::flavor::Flavor;
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};

/// Tries of a VM update that lost a race with another writer.
const UPDATE_TRIES: usize = 4;

pub(crate) fn secret_action(verb: &'static str, namespace: &str, name: &str) -> Action {
    Action::new(verb, "secrets", "secret")
        .named(name)
        .in_namespace(Some(namespace))
}

pub(crate) async fn get_vm(cluster: &Cluster, namespace: &str, name: &str) -> Result<Value> {
    let api = KUBEVIRT_VM.api(&cluster.client, Some(namespace));
    let vm = api
        .get(name)
        .await
        .map_err(|e| cluster.error(e, &KUBEVIRT_VM.action("get", Some(namespace)).named(name)))?;
    let vm = serde_json::to_value(vm).map_err(|e| Error::Internal(e.to_string()))?;
    if !vm["metadata"]["deletionTimestamp"].is_null() {
        return Err(Error::Platform(format!(
            "virtual machine {name}.{namespace} is being deleted"
        )));
    }
    Ok(vm)
}

pub(crate) async fn get_vmi(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
) -> Result<Option<Value>> {
    let api = KUBEVIRT_VMI.api(&cluster.client, Some(namespace));
    let vmi = api
        .get_opt(name)
        .await
        .map_err(|e| cluster.error(e, &KUBEVIRT_VMI.action("get", Some(namespace)).named(name)))?;
    Ok(vmi.and_then(|v| serde_json::to_value(v).ok()))
}

/// Apply `change` to the VM and write it with the resourceVersion read, reading again when
/// another writer came first. Whether the VM changed.
pub(crate) async fn update_vm(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    mut vm: Value,
    change: impl Fn(&mut Value) -> bool,
) -> Result<bool> {
    let api = KUBEVIRT_VM.api(&cluster.client, Some(namespace));
    let action = KUBEVIRT_VM.action("update", Some(namespace)).named(name);
    for _ in 0..UPDATE_TRIES {
        if !change(&mut vm) {
            return Ok(false);
        }
        if let Some(meta) = vm["metadata"].as_object_mut() {
            meta.remove("managedFields");
        }
        let object: DynamicObject =
            serde_json::from_value(vm.clone()).map_err(|e| Error::Internal(e.to_string()))?;
        match api.replace(name, &PostParams::default(), &object).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                vm = get_vm(cluster, namespace, name).await?;
            }
            Err(e) => return Err(cluster.error(e, &action)),
        }
    }
    Err(Error::Conflict(format!(
        "virtual machine {name}.{namespace} kept changing while it was updated; try again"
    )))
}

/// The Secrets of `logins` as they are, each refused when its name is taken by something not
/// ours.
async fn our_secrets(
    cluster: &Cluster,
    vm: &Value,
    namespace: &str,
    logins: &[String],
) -> Result<Vec<Option<Secret>>> {
    let name = vm["metadata"]["name"].as_str().unwrap_or_default();
    let uid = vm["metadata"]["uid"].as_str().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    let mut out = Vec::new();
    for login in logins {
        let secret_name = secret_name(name, login);
        let secret = api
            .get_opt(&secret_name)
            .await
            .map_err(|e| cluster.error(e, &secret_action("get", namespace, &secret_name)))?;
        if let Some(s) = &secret
            && !is_ours(s, name, uid, login)
        {
            return Err(Error::Platform(format!(
                "secret {secret_name:?} in namespace {namespace:?} exists and is not kubectl vm's enrollment of {login:?} on this VM: it is left as it is; delete or rename it first"
            )));
        }
        out.push(secret);
    }
    Ok(out)
}

async fn replace_content(
    cluster: &Cluster,
    namespace: &str,
    secret: &Secret,
    text: String,
) -> Result<()> {
    replace_data(cluster, namespace, secret, super::SECRET_KEY, text).await
}

/// Replace the data of `secret` with `key: text`, with the resourceVersion read.
pub(crate) async fn replace_data(
    cluster: &Cluster,
    namespace: &str,
    secret: &Secret,
    key: &str,
    text: String,
) -> Result<()> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    let mut updated = secret.clone();
    updated.metadata.managed_fields = None;
    updated.data = Some([(key.to_owned(), k8s_openapi::ByteString(text.into_bytes()))].into());
    updated.string_data = None;
    // The resourceVersion read goes with it: a concurrent change is not overwritten.
    api.replace(&name, &PostParams::default(), &updated)
        .await
        .map_err(|e| cluster.error(e, &secret_action("update", namespace, &name)))?;
    Ok(())
}

/// Enroll `logins` of VM `name` in `namespace` in the platform CA's trust (module docs).
pub async fn enroll(
    cluster: &Cluster,
    flavor: Flavor,
    ca_namespace: &str,
    namespace: &str,
    name: &str,
    logins: &[String],
    events: &mut (dyn FnMut(EnrollEvent) + Send),
) -> Result<EnrollOutcome> {
    super::validate_logins(logins)?;
    crate::platform::of(flavor).enroll.check()?;
    let vm = get_vm(cluster, namespace, name).await?;
    let ca_keys = store::read_public_keys(cluster, ca_namespace)
        .await?
        .ok_or_else(|| {
            Error::Platform(format!(
                "no platform SSH CA in namespace {ca_namespace:?}: run `kubectl vm ca init` first"
            ))
        })?;
    let existing = our_secrets(cluster, &vm, namespace, logins).await?;
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    // The Secrets this run made: deleted again (by uid) when a later step fails, so that a
    // failed enroll leaves nothing behind.
    let mut made: Vec<(String, String)> = Vec::new();
    for (login, secret) in logins.iter().zip(&existing) {
        let lines = trust_lines(&ca_keys, login, name, namespace);
        let secret_name = secret_name(name, login);
        let change = match secret {
            Some(s) if secret_content(s) == secret_text(&lines) => SecretChange::Unchanged,
            Some(s) => {
                replace_content(cluster, namespace, s, secret_text(&lines)).await?;
                SecretChange::Updated
            }
            None => {
                let object = secret_object(&vm, login, &lines, !login_allowed(&vm, login));
                // Create semantics: a Secret made meanwhile by someone else fails with 409.
                let created = api.create(&PostParams::default(), &object).await;
                match created {
                    Ok(created) => made.push((
                        secret_name.clone(),
                        created.metadata.uid.unwrap_or_default(),
                    )),
                    Err(e) => {
                        let err =
                            cluster.error(e, &secret_action("create", namespace, &secret_name));
                        undo_secrets(cluster, &api, namespace, &made).await?;
                        return Err(err);
                    }
                }
                SecretChange::Created
            }
        };
        events(EnrollEvent::Secret {
            login: login.clone(),
            name: secret_name,
            change,
        });
    }
    let changed = match update_vm(cluster, namespace, name, vm, |vm| {
        logins
            .iter()
            .fold(false, |changed, login| add_to_vm(vm, login) | changed)
    })
    .await
    {
        Ok(changed) => changed,
        Err(e) => {
            undo_secrets(cluster, &api, namespace, &made).await?;
            return Err(e);
        }
    };
    events(if changed {
        EnrollEvent::VmUpdated
    } else {
        EnrollEvent::VmUnchanged
    });
    let activation = match get_vmi(cluster, namespace, name).await? {
        None => Activation::NextStart,
        Some(vmi)
            if logins
                .iter()
                .all(|l| references(&vmi["spec"], &secret_name(name, l))) =>
        {
            Activation::Live
        }
        Some(_) => Activation::RestartRequired,
    };
    Ok(EnrollOutcome {
        vm: format!("{name}.{namespace}"),
        logins: logins.to_vec(),
        activation,
    })
}

/// End the enrollment of `logins` on VM `name` in `namespace`.
///
/// The guest drops the trust lines only when the agent rewrites `authorized_keys` from an
/// emptied Secret, so: a running VMI that refers to the Secret gets it emptied (live) and the
/// VM template loses the entry (the emptied Secret stays while that VMI reads it); a stopped
/// VM keeps the entry with the emptied Secret, so the guest drops the lines at its next start
/// (run the removal again after that); a VM whose running VMI never had the entry loses the
/// entry and the Secret.
pub async fn unenroll(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    name: &str,
    logins: &[String],
    events: &mut (dyn FnMut(EnrollEvent) + Send),
) -> Result<EnrollOutcome> {
    super::validate_logins(logins)?;
    crate::platform::of(flavor).enroll.check()?;
    let vm = get_vm(cluster, namespace, name).await?;
    let existing = our_secrets(cluster, &vm, namespace, logins).await?;
    let vmi = get_vmi(cluster, namespace, name).await?;
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    // What stays in the VM template: stopped VMs keep the entry until the guest had it empty.
    let mut drop_entry = Vec::new();
    let mut added = Vec::new();
    for (login, secret) in logins.iter().zip(&existing) {
        let secret_name = secret_name(name, login);
        let added_login = secret.as_ref().is_some_and(|s| {
            s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(super::ADDED_LOGIN_ANNOTATION))
                .is_some_and(|v| v == "true")
        });
        added.push(added_login);
        let in_vmi = vmi
            .as_ref()
            .is_some_and(|v| references(&v["spec"], &secret_name));
        let in_template = references(&vm["spec"]["template"]["spec"], &secret_name);
        let change = match secret {
            None => SecretChange::Absent,
            Some(s) if in_vmi || (vmi.is_none() && in_template) => {
                if secret_content(s).is_empty() {
                    SecretChange::Unchanged
                } else {
                    replace_content(cluster, namespace, s, String::new()).await?;
                    SecretChange::Emptied
                }
            }
            Some(s) => {
                let uid = s.metadata.uid.clone().unwrap_or_default();
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                api.delete(&secret_name, &params).await.map_err(|e| {
                    cluster.error(e, &secret_action("delete", namespace, &secret_name))
                })?;
                SecretChange::Deleted
            }
        };
        drop_entry.push(vmi.is_some() || !in_template || secret.is_none());
        events(EnrollEvent::Secret {
            login: login.clone(),
            name: secret_name,
            change,
        });
    }
    let changed = update_vm(cluster, namespace, name, vm, |vm| {
        let mut changed = false;
        for ((login, drop), added_login) in logins.iter().zip(&drop_entry).zip(&added) {
            // A stopped VM keeps the entry for its next boot; the signer stops issuing at
            // once either way.
            if *drop {
                changed |= remove_entry(vm, login);
            }
            if *added_login {
                changed |= remove_login(vm, login);
            }
        }
        changed
    })
    .await?;
    events(if changed {
        EnrollEvent::VmUpdated
    } else {
        EnrollEvent::VmUnchanged
    });
    Ok(EnrollOutcome {
        vm: format!("{name}.{namespace}"),
        logins: logins.to_vec(),
        activation: if vmi.is_some() {
            Activation::Live
        } else {
            Activation::NextStart
        },
    })
}

/// Rewrite the enrollment Secrets of every VM the user can list with `ca_keys` (after a CA
/// rotation). Emptied Secrets (enrollments being removed) stay empty. Live in running guests.
pub async fn update_enrolled(cluster: &Cluster, ca_keys: &[String]) -> Result<TrustUpdate> {
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY},{LOGIN_LABEL},{VM_LABEL}");
    let all: Api<Secret> = Api::all(cluster.client.clone());
    let secrets = match all.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items,
        Err(_) => {
            let api: Api<Secret> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
            api.list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| {
                    cluster.error(
                        e,
                        &Action::new("list", "secrets", "secret")
                            .in_namespace(Some(&cluster.namespace)),
                    )
                })?
                .items
        }
    };
    let mut result = TrustUpdate::default();
    for secret in secrets {
        let namespace = secret.metadata.namespace.clone().unwrap_or_default();
        let labels = secret.metadata.labels.clone().unwrap_or_default();
        let (Some(vm), Some(login)) = (labels.get(VM_LABEL), labels.get(LOGIN_LABEL)) else {
            continue;
        };
        if secret.metadata.name.as_deref() != Some(secret_name(vm, login).as_str()) {
            continue;
        }
        let target = format!("{vm}.{namespace} (enrolled login {login})");
        let current = secret_content(&secret);
        if current.is_empty() {
            continue;
        }
        let text = secret_text(&trust_lines(ca_keys, login, vm, &namespace));
        if current == text {
            result.updated.push(target);
            continue;
        }
        match replace_content(cluster, &namespace, &secret, text).await {
            Ok(()) => result.updated.push(target),
            Err(e) => result.skipped.push((target, e.to_string())),
        }
    }
    Ok(result)
}

/// Deletes the Secrets `made` (name, uid) by this run after a later step failed.
async fn undo_secrets(
    cluster: &Cluster,
    api: &Api<Secret>,
    namespace: &str,
    made: &[(String, String)],
) -> Result<()> {
    for (secret_name, uid) in made {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(secret_name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                return Err(cluster.error(e, &secret_action("delete", namespace, secret_name)));
            }
        }
    }
    Ok(())
}
