//! A new VM's own platform identity (`clone`, `snapshot restore --new-vm`).
//!
//! The platforms copy a VM with its cloud-init: KubeVirt's VirtualMachineClone and
//! VirtualMachineRestore copy the spec (the cloud-init volume still names the source's Secret
//! or holds its text inline), Deckhouse's clone restorer copies the provisioning Secret under a
//! new name. What `create` put there for the source is its identity: the principals files
//! (`LOGIN@SRC.NS`), the host key (`ssh_keys`) and the host certificate naming the source. Here
//! that platform part is made again for the new VM, as `create` makes it
//! ([`crate::create::cloudinit::platform`]): principals naming the new VM
//! ([`crate::signer::scoped_principal`]), a fresh host key and a host certificate for it from
//! the signer (or the CA in the direct mode, [`crate::create::checks::vm_host_keys`]). The rest
//! of the user data (what the user supplied) is carried over as it is.
//!
//! `ssh_keys` is replaced as a whole: host keys of any type in the source's user data would be
//! the source's host keys. The guest applies the new data as a new instance: its
//! NoCloud `instance-id` changes with the VM (KubeVirt `pkg/cloud-init/cloud-init.go`:
//! `NAME.NAMESPACE` or the VMI's firmware UUID, which a clone does not keep; the emulator: the
//! VM's uid), so cloud-init's per-instance `ssh` module deletes the host keys copied on the
//! disk and writes the new `ssh_keys`.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::{Value, json};
use yaml_serde::{Mapping, Value as Yaml};

use crate::ca::HostKeys;
use crate::cluster::Cluster;
use crate::create::cloudinit::platform::heredoc;
use crate::error::{Action, Error, Result};
use crate::flavor::Flavor;
use crate::names::{HOST_CERT_PATH, PRINCIPALS_DIR, SSHD_DROP_IN_PATH};

/// The file name of the platform part in a MIME multipart user data (see
/// `create::cloudinit::merge::multipart`).
const PLATFORM_PART: &str = "filename=\"kubevm-platform.cfg\"";
/// Data keys user data is read from (KubeVirt `userdata`, Deckhouse `userData`).
const USER_DATA_KEYS: [&str; 2] = ["userdata", "userData"];

/// The name of the user-data Secret of VM `vm` (as `create` names it).
pub fn secret_name(vm: &str) -> String {
    format!("{vm}-cloudinit")
}

/// Whether user data holds kubectl-vm's platform SSH setup (the sshd drop-in it writes).
pub fn has_platform_ssh(text: &str) -> bool {
    text.contains(&format!("cat > {SSHD_DROP_IN_PATH} <<'"))
}

/// The lines of a heredoc body up to its delimiter (consumed).
fn take_body<'a>(lines: &mut impl Iterator<Item = &'a str>, delimiter: &str) -> Vec<&'a str> {
    let mut body = Vec::new();
    for line in lines.by_ref() {
        if line.trim_end() == delimiter {
            break;
        }
        body.push(line);
    }
    body
}

/// `(rest, delimiter)` of a heredoc opener `cat > PREFIXrest <<'DELIM'`.
fn opener<'a>(line: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    let rest = line.strip_prefix(&format!("cat > {prefix}"))?;
    let (path_rest, delimiter) = rest.split_once(" <<'")?;
    Some((path_rest, delimiter.trim_end().strip_suffix('\'')?))
}

/// The platform's boot script (one `bootcmd` entry) for VM `target` in `namespace`: each
/// principals file names the new VM, the host certificate is `host`'s (or none, and no
/// `HostCertificate` line, without one); everything else is kept.
pub fn reissue_script(
    script: &str,
    target: &str,
    namespace: &str,
    host: Option<&HostKeys>,
) -> String {
    let mut out = String::new();
    let mut lines = script.split_inclusive('\n');
    let mut cert_written = false;
    while let Some(line) = lines.next() {
        if let Some((login, delimiter)) = opener(line, &format!("{PRINCIPALS_DIR}/")) {
            take_body(&mut lines, delimiter);
            let principal = crate::signer::scoped_principal(login, target, namespace);
            heredoc(
                &mut out,
                ">",
                &format!("{PRINCIPALS_DIR}/{login}"),
                &format!("{principal}\n"),
            );
        } else if let Some(("", delimiter)) = opener(line, HOST_CERT_PATH) {
            take_body(&mut lines, delimiter);
            if let Some(host) = host {
                heredoc(&mut out, ">", HOST_CERT_PATH, &host.certificate);
                cert_written = true;
            }
        } else if let Some(("", delimiter)) = opener(line, SSHD_DROP_IN_PATH) {
            let mut content: String = take_body(&mut lines, delimiter)
                .into_iter()
                .filter(|l| !l.starts_with("HostCertificate "))
                .collect();
            if let Some(host) = host {
                if !cert_written {
                    heredoc(&mut out, ">", HOST_CERT_PATH, &host.certificate);
                }
                content.push_str(&format!("HostCertificate {HOST_CERT_PATH}\n"));
            }
            heredoc(&mut out, ">", SSHD_DROP_IN_PATH, &content);
        } else {
            out.push_str(line);
        }
    }
    out
}

/// `(before, platform cloud-config, after)`: the whole text when it is a `#cloud-config`, the
/// body of the platform part of a MIME multipart archive otherwise.
fn split_platform(text: &str) -> Option<(&str, &str, &str)> {
    if text.trim_start().starts_with("#cloud-config") {
        return Some(("", text, ""));
    }
    let header = text.find(PLATFORM_PART)?;
    let start = header + text[header..].find("\n\n")? + 2;
    let end = start
        + text[start..]
            .find("\n--")
            .map_or(text.len() - start, |i| i + 1);
    Some((&text[..start], &text[start..end], &text[end..]))
}

/// The user data `text` of VM `source` made VM `target`'s (see the module documentation):
/// `Ok(None)` when it has no platform SSH setup (nothing of ours to regenerate).
pub fn reissue(
    text: &str,
    source: &str,
    target: &str,
    namespace: &str,
    host: Option<&HostKeys>,
) -> std::result::Result<Option<String>, String> {
    if !has_platform_ssh(text) {
        return Ok(None);
    }
    let (before, platform, after) =
        split_platform(text).ok_or("the platform part of the source's user data is not found")?;
    let mut doc: Mapping = yaml_serde::from_str(platform)
        .map_err(|e| format!("the source's user data is not a readable cloud-config: {e}"))?;
    let key = |k: &str| Yaml::String(k.to_owned());
    match host {
        Some(host) => {
            let mut keys = Mapping::new();
            keys.insert(key("ed25519_private"), key(&host.private_key));
            keys.insert(key("ed25519_public"), key(&host.public_key));
            doc.insert(key("ssh_keys"), Yaml::Mapping(keys));
        }
        None => {
            doc.remove("ssh_keys");
        }
    }
    if doc.get("hostname").and_then(Yaml::as_str) == Some(source) {
        doc.insert(key("hostname"), key(target));
    }
    if let Some(Yaml::Sequence(items)) = doc.get_mut("bootcmd") {
        for item in items {
            if let Yaml::String(script) = item
                && has_platform_ssh(script)
            {
                *script = reissue_script(script, target, namespace, host);
            }
        }
    }
    let yaml = yaml_serde::to_string(&Yaml::Mapping(doc))
        .map_err(|e| format!("the new user data does not serialise: {e}"))?;
    Ok(Some(format!("{before}#cloud-config\n{yaml}{after}")))
}

/// Where a VM keeps its cloud-init user data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserDataSource {
    /// Inline in the VM (KubeVirt: the volume at this index of `spec.template.spec.volumes`).
    Inline(Option<usize>),
    /// In this Secret (KubeVirt: the volume at this index).
    Secret(String, Option<usize>),
}

/// `(where, text)` of the user data of `vm` (as read): `Ok(None)` without any.
pub async fn read_user_data(
    cluster: &Cluster,
    flavor: Flavor,
    vm: &Value,
) -> Result<Option<(UserDataSource, String)>> {
    let ns = vm
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let inline = |src: &Value| -> Option<String> {
        if let Some(t) = src.get("userData").and_then(Value::as_str) {
            return Some(t.to_owned());
        }
        use base64::Engine;
        src.get("userDataBase64")
            .and_then(Value::as_str)
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .and_then(|b| String::from_utf8(b).ok())
    };
    match flavor {
        Flavor::KubeVirt => {
            for (i, v) in volumes(vm).iter().enumerate() {
                let Some(src) = cloud_init_source(v) else {
                    continue;
                };
                if let Some(name) = src.pointer("/secretRef/name").and_then(Value::as_str) {
                    let text = read_secret(cluster, ns, name).await?;
                    return Ok(text.map(|t| (UserDataSource::Secret(name.to_owned(), Some(i)), t)));
                }
                return Ok(inline(src).map(|t| (UserDataSource::Inline(Some(i)), t)));
            }
            Ok(None)
        }
        Flavor::Deckhouse => {
            let Some(p) = vm.pointer("/spec/provisioning") else {
                return Ok(None);
            };
            if let Some(name) = p
                .get("userDataRef")
                .filter(|r| r["kind"] == "Secret")
                .and_then(|r| r["name"].as_str())
            {
                let text = read_secret(cluster, ns, name).await?;
                return Ok(text.map(|t| (UserDataSource::Secret(name.to_owned(), None), t)));
            }
            Ok(inline(p).map(|t| (UserDataSource::Inline(None), t)))
        }
    }
}

/// Where the user data of a VM restored from a snapshot comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// The VM has no cloud-init user data.
    None,
    /// This text (what the snapshot holds, or the Secret it names).
    Text(String),
    /// It names this Secret, which is gone: a KubeVirt snapshot keeps only the reference.
    Gone(String),
}

/// The user data of the KubeVirt VM `vm` as a snapshot keeps it (its content's
/// `spec.source.virtualMachine`, kubevirt `pkg/storage/snapshot/snapshot.go` `createContent`):
/// inline in its cloud-init volume, or in the Secret that volume names, which the snapshot does
/// not hold (only the VM and its volumes' claims are captured), read as it is now.
pub async fn kept_kubevirt(cluster: &Cluster, ns: &str, vm: &Value) -> Result<Kept> {
    let mut vm = vm.clone();
    vm["metadata"]["namespace"] = json!(ns);
    let Some(volume) = volumes(&vm)
        .into_iter()
        .find_map(|v| cloud_init_source(&v).cloned())
    else {
        return Ok(Kept::None);
    };
    if let Some(name) = volume.pointer("/secretRef/name").and_then(Value::as_str) {
        return Ok(match read_secret(cluster, ns, name).await? {
            Some(text) => Kept::Text(text),
            None => Kept::Gone(name.to_owned()),
        });
    }
    Ok(
        match read_user_data(cluster, Flavor::KubeVirt, &vm).await? {
            Some((_, text)) => Kept::Text(text),
            None => Kept::None,
        },
    )
}

/// The user data in the Secret object `secret` (as JSON; `userdata` or `userData`).
pub fn secret_user_data(secret: &Value) -> Option<String> {
    use base64::Engine;
    USER_DATA_KEYS
        .iter()
        .find_map(|k| {
            secret
                .pointer(&format!("/data/{k}"))
                .and_then(Value::as_str)
        })
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
}

fn volumes(vm: &Value) -> Vec<Value> {
    vm.pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn cloud_init_source(volume: &Value) -> Option<&Value> {
    volume
        .get("cloudInitNoCloud")
        .or_else(|| volume.get("cloudInitConfigDrive"))
}

/// The keys of Secret `name` with their values as text (values that are not UTF-8 left out),
/// `None` when there is no such Secret.
pub async fn read_secret_data(
    cluster: &Cluster,
    ns: &str,
    name: &str,
) -> Result<Option<std::collections::BTreeMap<String, String>>> {
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), ns);
    let action = Action::new("get", "secrets", "secret")
        .named(name)
        .in_namespace(Some(ns));
    let Some(secret) = api
        .get_opt(name)
        .await
        .map_err(|e| cluster.error(e, &action))?
    else {
        return Ok(None);
    };
    Ok(Some(
        secret
            .data
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(k, v)| String::from_utf8(v.0).ok().map(|t| (k, t)))
            .collect(),
    ))
}

/// The network data of KubeVirt cloud-init volume `volume` in namespace `ns`, read from the
/// Secret it names or inline ([`super::network_data::text`]).
pub async fn read_network_data(
    cluster: &Cluster,
    ns: &str,
    volume: &Value,
) -> Result<Option<String>> {
    let secret = match super::network_data::secret_of(volume) {
        Some(name) => read_secret_data(cluster, ns, name).await?,
        None => None,
    };
    Ok(super::network_data::text(volume, secret.as_ref()))
}

/// The user data in Secret `name` (`userdata` or `userData`), `None` without it.
pub async fn read_secret(cluster: &Cluster, ns: &str, name: &str) -> Result<Option<String>> {
    let Some(data) = read_secret_data(cluster, ns, name).await? else {
        return Ok(None);
    };
    Ok(USER_DATA_KEYS.iter().find_map(|k| data.get(*k).cloned()))
}

/// The JSON patch (a `spec.patches` entry) that points the KubeVirt VM's cloud-init volume at
/// `index` to Secret `secret`, keeping its network data unless `network_in_secret` (the copy's
/// network data is in `secret` too: see [`super::network_data`]).
pub fn kubevirt_volume_patch(
    source: &Value,
    index: usize,
    secret: &str,
    network_in_secret: bool,
) -> Option<String> {
    let volume = volumes(source).get(index)?.clone();
    let key = if volume.get("cloudInitNoCloud").is_some() {
        "cloudInitNoCloud"
    } else {
        "cloudInitConfigDrive"
    };
    let mut value = volume.get(key)?.clone();
    let map = value.as_object_mut()?;
    for k in ["userData", "userDataBase64", "secretRef"] {
        map.remove(k);
    }
    map.insert("secretRef".into(), json!({ "name": secret }));
    if network_in_secret {
        for k in ["networkData", "networkDataBase64"] {
            map.remove(k);
        }
        map.insert("networkDataSecretRef".into(), json!({ "name": secret }));
    }
    Some(
        json!({"op": "replace", "path": format!("/spec/template/spec/volumes/{index}/{key}"), "value": value})
            .to_string(),
    )
}

/// The user-data Secret of the new VM `target` (labelled as ours for it; owned by it once it
/// exists), for `flavor`.
pub fn secret_object(flavor: Flavor, ns: &str, target: &str, text: &str) -> Value {
    let (type_, key) = match flavor {
        Flavor::KubeVirt => ("Opaque", crate::create::kubevirt::SECRET_KEY),
        Flavor::Deckhouse => (
            crate::create::deckhouse::SECRET_TYPE,
            crate::create::deckhouse::SECRET_KEY,
        ),
    };
    use base64::Engine;
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": type_,
        "metadata": {"name": secret_name(target), "namespace": ns,
            "labels": super::our_labels(target)},
        "data": {key: base64::engine::general_purpose::STANDARD.encode(text)},
    })
}

/// Create `secret` (create semantics: a taken name fails); returns its uid.
pub async fn create_secret(cluster: &Cluster, secret: &Value) -> Result<String> {
    let ns = secret["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = secret["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), ns);
    let object: Secret = serde_json::from_value(secret.clone())
        .map_err(|e| Error::Internal(format!("the Secret does not serialise: {e}")))?;
    let action = Action::new("create", "secrets", "secret")
        .named(name)
        .in_namespace(Some(ns));
    let made = api
        .create(&Default::default(), &object)
        .await
        .map_err(|e| cluster.error(e, &action))?;
    Ok(made.metadata.uid.unwrap_or_default())
}

/// The annotation Deckhouse's restorers put on what an operation made (value: its uid;
/// `annotations.AnnVMOPRestore`).
pub const MADE_BY_OPERATION: &str = "virtualization.deckhouse.io/vmoprestore";

/// Whether `obj` was made by the Deckhouse operation whose uid is `op_uid`.
pub fn made_by(obj: &Value, op_uid: &str) -> bool {
    !op_uid.is_empty()
        && obj
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(MADE_BY_OPERATION))
            .and_then(Value::as_str)
            == Some(op_uid)
}

/// Replace the user data of Secret `name`, which the Deckhouse operation `op_uid` copied for
/// VM `target`, with `text`, labelled as ours for `target`, with the resourceVersion read (a
/// concurrent change fails the write instead of being lost). A Secret of that name that the
/// operation did not make is never touched: `Ok(false)`.
pub async fn rewrite_secret(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    target: &str,
    text: &str,
    op_uid: &str,
) -> Result<bool> {
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), ns);
    let action = |verb: &'static str| {
        Action::new(verb, "secrets", "secret")
            .named(name)
            .in_namespace(Some(ns))
    };
    let mut secret = api
        .get(name)
        .await
        .map_err(|e| cluster.error(e, &action("get")))?;
    if !made_by(&serde_json::to_value(&secret).unwrap_or_default(), op_uid) {
        return Ok(false);
    }
    let mut data = secret.data.clone().unwrap_or_default();
    let key = USER_DATA_KEYS
        .iter()
        .find(|k| data.contains_key(**k))
        .copied()
        .unwrap_or(crate::create::deckhouse::SECRET_KEY);
    data.insert(
        key.to_owned(),
        k8s_openapi::ByteString(text.as_bytes().to_vec()),
    );
    secret.data = Some(data);
    secret.string_data = None;
    secret.metadata.managed_fields = None;
    let labels = secret.metadata.labels.get_or_insert_default();
    labels.insert(
        crate::names::MANAGED_BY_LABEL.into(),
        crate::names::MANAGED_BY.into(),
    );
    labels.insert(crate::names::VM_LABEL.into(), target.into());
    api.replace(name, &Default::default(), &secret)
        .await
        .map_err(|e| cluster.error(e, &action("update")))?;
    Ok(true)
}

/// Delete Secret `name` if it still has `uid` (a precondition: never someone else's).
pub async fn delete_secret(cluster: &Cluster, ns: &str, name: &str, uid: &str) -> Result<()> {
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), ns);
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(cluster.error(
            e,
            &Action::new("delete", "secrets", "secret")
                .named(name)
                .in_namespace(Some(ns)),
        )),
    }
}

/// The ownerReference that makes VM `vm` (as read) own an object, as `create` sets it.
pub fn owner_of(vm: &Value) -> Value {
    json!({
        "apiVersion": vm["apiVersion"], "kind": "VirtualMachine",
        "name": vm["metadata"]["name"], "uid": vm["metadata"]["uid"],
        "controller": true, "blockOwnerDeletion": true,
    })
}

#[cfg(test)]
mod tests;

/// After `snapshot restore --new-vm` on KubeVirt: the VM `target`, restored halted from a
/// snapshot of `source` (upstream `restore.go`), still names the source's cloud-init (its
/// Secret, or the text inline). When that holds a platform part, `target` gets its own
/// Secret (created with create semantics, owned by `target`) with its own identity, and its
/// cloud-init volume is pointed at it (a merge patch carrying the resourceVersion read).
/// The user data `text` is what the snapshot keeps ([`kept_kubevirt`], read before the
/// restore was made): the source and its Secret may be gone by now.
/// Returns the Secret's name, or `None` when there was nothing of ours to regenerate.
#[allow(clippy::too_many_arguments)]
pub async fn kubevirt_restored_vm(
    cluster: &Cluster,
    platform: &crate::flavor::Platform,
    ns: &str,
    source: &str,
    target: &str,
    text: Option<&str>,
    notice: &mut dyn FnMut(String),
) -> Result<Option<String>> {
    let kind = crate::api::KUBEVIRT_VM;
    let api = kind.api(&cluster.client, Some(ns));
    let vm = api
        .get(target)
        .await
        .map_err(|e| cluster.error(e, &kind.action("get", Some(ns)).named(target)))?;
    let vm = serde_json::to_value(vm).unwrap_or_default();
    let Some(index) = volumes(&vm)
        .iter()
        .position(|v| cloud_init_source(v).is_some())
    else {
        return Ok(None);
    };
    let Some(text) = text.filter(|t| has_platform_ssh(t)).map(str::to_owned) else {
        return Ok(None);
    };
    let name = secret_name(target);
    if read_secret_object(cluster, ns, &name).await? {
        return Err(Error::NotOurs(format!(
            "secret {name:?} already exists in namespace {ns:?}; {target} still uses {source}'s cloud-init: give it its own before starting it"
        )));
    }
    let host = crate::create::checks::vm_host_keys(
        cluster,
        platform,
        crate::ca::DEFAULT_NAMESPACE,
        target,
        ns,
        notice,
    )
    .await?;
    let new_text = reissue(&text, source, target, ns, host.as_ref())
        .map_err(Error::Platform)?
        .unwrap_or(text);
    // The restored VM keeps the source's MACs (a restore to a new VM copies the spec): it gets
    // its own, and its network data follows them (see [`super::network_data`]).
    let network_text = read_network_data(cluster, ns, &volumes(&vm)[index])
        .await?
        .unwrap_or_default();
    let copy_network =
        super::network_data::for_copy(&vm, &network_text, crate::create::networks::random_mac);
    let network_in_secret = copy_network
        .as_ref()
        .is_some_and(|_| !network_text.is_empty());
    let mut secret = secret_object(Flavor::KubeVirt, ns, target, &new_text);
    secret["metadata"]["ownerReferences"] = json!([owner_of(&vm)]);
    if let (true, Some(n)) = (network_in_secret, &copy_network) {
        use base64::Engine;
        secret["data"][crate::create::kubevirt::NETWORK_DATA_KEY] =
            json!(base64::engine::general_purpose::STANDARD.encode(&n.text));
    }
    create_secret(cluster, &secret).await?;
    let mut volumes = volumes(&vm);
    let Some(patch) = kubevirt_volume_patch(&vm, index, &name, network_in_secret) else {
        return Ok(None);
    };
    let patch: Value = serde_json::from_str(&patch).unwrap_or_default();
    volumes[index] = json!({ "name": volumes[index]["name"] });
    let key = patch["path"]
        .as_str()
        .and_then(|p| p.rsplit('/').next())
        .unwrap_or("cloudInitNoCloud")
        .to_owned();
    volumes[index][key] = patch["value"].clone();
    api.patch(
        target,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({
            "metadata": {"resourceVersion": vm["metadata"]["resourceVersion"]},
            "spec": {"template": {"spec": match &copy_network {
                Some(n) => json!({"volumes": volumes, "domain": {"devices": {
                    "interfaces": super::network_data::interfaces_with(&vm, n)}}}),
                None => json!({"volumes": volumes}),
            }}},
        })),
    )
    .await
    .map_err(|e| cluster.error(e, &kind.action("patch", Some(ns)).named(target)))?;
    Ok(Some(name))
}

/// Whether Secret `name` exists.
async fn read_secret_object(cluster: &Cluster, ns: &str, name: &str) -> Result<bool> {
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), ns);
    api.get_opt(name).await.map(|s| s.is_some()).map_err(|e| {
        cluster.error(
            e,
            &Action::new("get", "secrets", "secret")
                .named(name)
                .in_namespace(Some(ns)),
        )
    })
}
