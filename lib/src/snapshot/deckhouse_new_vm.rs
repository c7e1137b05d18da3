//! Deckhouse: `restore SNAPSHOT --new-vm NEW`, made by kubectl-vm itself from what the snapshot
//! keeps, in the order that makes a first boot with the source's identity impossible:
//!
//! 1. NEW's disks: one VirtualDisk `NEW-x` per VirtualDiskSnapshot of the snapshot (of disk
//!    `SRC-x`), `spec.dataSource: {type: ObjectRef, objectRef: {kind: VirtualDiskSnapshot}}`,
//!    as Deckhouse's own restorer makes them (deckhouse/virtualization `pkg/controller/service/
//!    restorer/snapshot_resources.go` `getVirtualDisks`: no size or class, the VirtualDisk
//!    controller takes them from the VolumeSnapshot, `vd/internal/source/step/
//!    create_pvc_from_vdsnapshot_step.go`);
//! 2. NEW's provisioning Secret (`SRC-cloudinit` → `NEW-cloudinit`, or `NEW-cloudinit` for
//!    user data the VM held inline) from the copy the snapshot keeps (`provisioner`, else the
//!    source's Secret as it is), with NEW's own identity when it holds kubectl-vm's platform
//!    part ([`crate::clone::identity`]: principals, a fresh host key, its certificate);
//! 3. NEW's VirtualMachine, last, from the VM spec the snapshot keeps (its Secret's `vm` key,
//!    `service/restorer/secret_restorer.go`), without what belongs to the source: status, uid,
//!    resourceVersion, owners, finalizers, its VirtualMachineIPAddress (NEW gets a fresh IP)
//!    and the MAC address names of extra networks (as the platform's clone does,
//!    `snapshot_resources.go` `Prepare`); its disks and its Secret renamed.
//!
//! Before 3 there is no VM that could boot, so NEW — AlwaysOn or not — first boots with its own
//! identity. (A VirtualMachineSnapshotOperation `CreateVirtualMachine` created NEW with the
//! source's runPolicy while its Secret was still being rewritten, and a restorer that only
//! `Create`s the Secret fails on one made first; its customization offers only names.)
//!
//! All create semantics, labelled as ours for NEW; the disks and the Secret are then owned by
//! NEW, so `delete NEW` removes them. A taken name is refused before anything is made; a
//! snapshot that keeps no VM spec is refused in one line. All or nothing: when a step fails,
//! what was made is deleted (the VM first), each with its uid as a precondition. `--wait` waits
//! until NEW's disks are provisioned (Ready, or WaitForFirstConsumer until NEW starts); a disk
//! that fails undoes the restore. A dry run shows (client) or sends with `dryRun` (server) the
//! objects without making a host key: the user data is shown without one. The source VM and
//! the snapshot are not touched.

use serde_json::{Value, json};

use super::kubevirt::{create_obj, get, get_opt};
use super::{DryRun, Event, Options, Outcome, text};
use crate::api::{DECKHOUSE_VM, Kind, SECRET, VIRTUAL_DISK};
use crate::clone::{deckhouse::new_name, identity, our_labels};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::lifecycle::watch::{self, Watched};

/// Annotations of the source's VM that are not carried to NEW: what kubectl apply recorded
/// (the source's own manifest) and what Deckhouse's restorers put on what they made.
const SOURCE_ANNOTATIONS: [&str; 3] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    identity::MADE_BY_OPERATION,
    "virtualization.deckhouse.io/restore-power-state",
];

/// A disk of NEW: `(source disk, new disk, VirtualDiskSnapshot)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disk {
    /// The source's disk (`spec.virtualDiskName` of the snapshot).
    pub old: String,
    /// NEW's disk.
    pub new: String,
    /// The VirtualDiskSnapshot it is made from.
    pub snapshot: String,
}

/// Where the kept VM's user data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserData {
    /// In the Secret of this name (`provisioning.userDataRef`).
    Secret(String),
    /// Inline in the VM spec (`provisioning.userData` or `userDataBase64`).
    Inline(String),
    /// None (or a kind kubectl-vm does not copy).
    None,
}

/// Where the VM spec `vm` keeps its user data.
pub fn user_data_of(vm: &Value) -> UserData {
    let p = vm.pointer("/spec/provisioning").unwrap_or(&Value::Null);
    if let Some(name) = p
        .get("userDataRef")
        .filter(|r| r["kind"] == "Secret")
        .and_then(|r| r["name"].as_str())
    {
        return UserData::Secret(name.to_owned());
    }
    if let Some(t) = p.get("userData").and_then(Value::as_str) {
        return UserData::Inline(t.to_owned());
    }
    use base64::Engine;
    if let Some(t) = p
        .get("userDataBase64")
        .and_then(Value::as_str)
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
    {
        return UserData::Inline(t);
    }
    UserData::None
}

/// NEW's VirtualDisk `disk`, made from its VirtualDiskSnapshot, labelled as ours.
pub fn disk_object(ns: &str, target: &str, disk: &Disk) -> Value {
    json!({
        "apiVersion": VIRTUAL_DISK.api_version(), "kind": VIRTUAL_DISK.kind,
        "metadata": {"name": disk.new, "namespace": ns, "labels": our_labels(target)},
        "spec": {"dataSource": {"type": "ObjectRef",
            "objectRef": {"kind": "VirtualDiskSnapshot", "name": disk.snapshot}}},
    })
}

/// NEW's VirtualMachine from the VM spec the snapshot keeps (`kept`; see the module
/// documentation), its disks renamed as `disks` say and its user data in Secret `secret` when
/// given. A VirtualDisk of the VM that the snapshot holds no snapshot of is refused.
pub fn vm_object(
    kept: &Value,
    ns: &str,
    target: &str,
    disks: &[Disk],
    secret: Option<&str>,
) -> Result<Value> {
    let mut spec = kept.get("spec").cloned().unwrap_or_else(|| json!({}));
    if let Some(map) = spec.as_object_mut() {
        map.remove("virtualMachineIPAddressName");
    }
    for net in spec
        .pointer_mut("/networks")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(map) = net.as_object_mut() {
            map.remove("virtualMachineMACAddressName");
        }
    }
    for r in spec
        .pointer_mut("/blockDeviceRefs")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if r["kind"] != "VirtualDisk" {
            continue;
        }
        let old = r["name"].as_str().unwrap_or_default().to_owned();
        let Some(d) = disks.iter().find(|d| d.old == old) else {
            return Err(Error::Platform(format!(
                "the snapshot holds no copy of disk {old:?} of its VM; nothing was created"
            )));
        };
        r["name"] = json!(d.new);
    }
    if let Some(secret) = secret {
        spec["provisioning"] = json!({"type": "UserDataRef",
            "userDataRef": {"kind": "Secret", "name": secret}});
    }
    let mut labels = kept
        .pointer("/metadata/labels")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    for (k, v) in our_labels(target).as_object().into_iter().flatten() {
        labels[k] = v.clone();
    }
    let mut metadata = json!({"name": target, "namespace": ns, "labels": labels});
    if let Some(a) = kept
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        let kept: serde_json::Map<String, Value> = a
            .iter()
            .filter(|(k, _)| !SOURCE_ANNOTATIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !kept.is_empty() {
            metadata["annotations"] = Value::Object(kept);
        }
    }
    Ok(json!({
        "apiVersion": DECKHOUSE_VM.api_version(), "kind": "VirtualMachine",
        "metadata": metadata, "spec": spec,
    }))
}

/// The objects of a restore as one `v1` List (dry runs).
fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

/// Refuses a taken name (nothing made yet).
async fn ensure_free(cluster: &Cluster, kind: Kind, ns: &str, name: &str) -> Result<()> {
    if get_opt(cluster, kind, ns, name).await?.is_some() {
        return Err(Error::NotOurs(format!(
            "{} {name:?} already exists in namespace {ns:?}; nothing was created (choose another name for --new-vm)",
            kind.kind.to_ascii_lowercase()
        )));
    }
    Ok(())
}

/// Object `key` of the snapshot's Secret `secret` (as read): deckhouse/virtualization
/// `service/restorer/secret_restorer.go` puts base64 of the JSON into `Data` (so base64 twice
/// in the API); once-encoded JSON is taken too.
fn kept_object(secret: &Value, key: &str) -> Option<Value> {
    use base64::Engine;
    let b64 = &base64::engine::general_purpose::STANDARD;
    let once = b64
        .decode(secret.pointer(&format!("/data/{key}"))?.as_str()?)
        .ok()?;
    serde_json::from_slice(&once)
        .ok()
        .or_else(|| serde_json::from_slice(&b64.decode(&once).ok()?).ok())
}

/// The snapshot's Secret (`status.virtualMachineSnapshotSecretName`), if it can be read.
async fn snapshot_secret(cluster: &Cluster, ns: &str, snap: &Value) -> Result<Option<Value>> {
    let secret = text(snap, "/status/virtualMachineSnapshotSecretName");
    if secret.is_empty() {
        return Ok(None);
    }
    get_opt(cluster, SECRET, ns, secret).await
}

/// NEW's disks: one per VirtualDiskSnapshot of the snapshot.
async fn disks_of(
    cluster: &Cluster,
    ns: &str,
    snap: &Value,
    source: &str,
    target: &str,
) -> Result<Vec<Disk>> {
    let mut disks = vec![];
    for vds in snap
        .pointer("/status/virtualDiskSnapshotNames")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let obj = get(cluster, super::deckhouse::VD_SNAPSHOT, ns, vds).await?;
        let old = text(&obj, "/spec/virtualDiskName").to_owned();
        disks.push(Disk {
            new: new_name(source, target, &old),
            old,
            snapshot: vds.to_owned(),
        });
    }
    Ok(disks)
}

/// Restore snapshot `snap` (Ready, already read) as a new VM `target`.
pub async fn restore(
    cluster: &Cluster,
    platform: &crate::flavor::Platform,
    ns: &str,
    snap: &Value,
    target: &str,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let snap_name = text(snap, "/metadata/name").to_owned();
    let source = text(snap, "/spec/virtualMachineName").to_owned();
    let kept_secret = snapshot_secret(cluster, ns, snap).await?;
    let Some(kept) = kept_secret.as_ref().and_then(|s| kept_object(s, "vm")) else {
        return Err(Error::Platform(format!(
            "snapshot {snap_name} keeps no VM spec (no `vm` in its Secret {:?}) to make {target} from; nothing was created",
            text(snap, "/status/virtualMachineSnapshotSecretName")
        )));
    };
    let disks = disks_of(cluster, ns, snap, &source, target).await?;
    let (user_data, secret) = user_data_for(
        cluster,
        ns,
        &snap_name,
        kept_secret.as_ref(),
        &kept,
        &source,
        target,
    )
    .await?;
    let vm = vm_object(&kept, ns, target, &disks, secret.as_deref())?;
    ensure_names_free(cluster, ns, target, &disks, secret.as_deref()).await?;
    let dry = options.dry_run != DryRun::None;
    let new_text = own_identity(
        cluster,
        platform,
        ns,
        &source,
        target,
        user_data.as_deref(),
        dry,
        on_event,
    )
    .await?;
    let secret_obj = secret.as_ref().zip(new_text.as_ref()).map(|(name, t)| {
        let mut s = identity::secret_object(crate::flavor::Flavor::Deckhouse, ns, target, t);
        s["metadata"]["name"] = json!(name);
        s
    });
    let objects = objects_in_order(ns, target, &disks, secret_obj, vm);
    let mut outcome = Outcome {
        snapshot: snap_name.clone(),
        vm: format!("{target}.{ns}"),
        object_ref: DECKHOUSE_VM.object_ref(target),
        object: None,
        waited: false,
        no_agent: false,
        restarted: false,
    };
    if let Some(preview) = dry_run_result(cluster, ns, &objects, options).await? {
        outcome.object = Some(preview);
        return Ok(outcome);
    }
    let (made, new_vm) = create_in_order(cluster, ns, &objects, on_event).await?;
    if let Err(e) = adopt(cluster, ns, target, &made, &new_vm).await {
        undo(cluster, ns, &made, on_event).await;
        return Err(e);
    }
    if secret.is_some() && new_text != user_data {
        on_event(Event::Notice(format!(
            "{target} has its own SSH identity (principals, host key, host certificate), made before the VM"
        )));
    }
    outcome.object = Some(new_vm);
    if !options.wait {
        return Ok(outcome);
    }
    if let Err(e) = provisioned(cluster, ns, &disks, on_event).await {
        undo(cluster, ns, &made, on_event).await;
        return Err(e);
    }
    outcome.waited = true;
    Ok(outcome)
}

/// Refuse before anything is made when NEW, one of its disks or its Secret already exists.
async fn ensure_names_free(
    cluster: &Cluster,
    ns: &str,
    target: &str,
    disks: &[Disk],
    secret: Option<&str>,
) -> Result<()> {
    ensure_free(cluster, DECKHOUSE_VM, ns, target).await?;
    for d in disks {
        ensure_free(cluster, VIRTUAL_DISK, ns, &d.new).await?;
    }
    if let Some(name) = secret {
        ensure_free(cluster, SECRET, ns, name).await?;
    }
    Ok(())
}

/// The objects of NEW in the order they are made: its disks, the Secret with its own
/// identity, then the VM.
fn objects_in_order(
    ns: &str,
    target: &str,
    disks: &[Disk],
    secret: Option<Value>,
    vm: Value,
) -> Vec<(Kind, Value)> {
    let mut objects: Vec<(Kind, Value)> = disks
        .iter()
        .map(|d| (VIRTUAL_DISK, disk_object(ns, target, d)))
        .collect();
    objects.extend(secret.map(|s| (SECRET, s)));
    objects.push((DECKHOUSE_VM, vm));
    objects
}

/// What a dry run shows: the objects as they would be sent (client), or as the server took
/// them (server), in a List; `None` when it is no dry run.
async fn dry_run_result(
    cluster: &Cluster,
    ns: &str,
    objects: &[(Kind, Value)],
    options: &Options,
) -> Result<Option<Value>> {
    match options.dry_run {
        DryRun::Client => Ok(Some(list(objects.iter().map(|(_, o)| o.clone()).collect()))),
        DryRun::Server => {
            let mut sent = vec![];
            for (kind, obj) in objects {
                sent.push(create_obj(cluster, *kind, ns, obj, true).await?);
            }
            Ok(Some(list(sent)))
        }
        DryRun::None => Ok(None),
    }
}

/// The user data NEW gets and the name of its Secret: the copy the snapshot keeps (the source
/// and its Secret may be gone), else the source's Secret as it is; without either NEW would
/// have no identity of its own, so nothing is made. Inline user data moves into a Secret when
/// it holds kubectl vm's SSH setup.
async fn user_data_for(
    cluster: &Cluster,
    ns: &str,
    snap_name: &str,
    kept_secret: Option<&Value>,
    kept: &Value,
    source: &str,
    target: &str,
) -> Result<(Option<String>, Option<String>)> {
    Ok(match user_data_of(kept) {
        UserData::Secret(old) => {
            let found = match kept_secret
                .and_then(|s| kept_object(s, "provisioner"))
                .and_then(|p| identity::secret_user_data(&p))
            {
                Some(t) => Some(t),
                None => identity::read_secret(cluster, ns, &old).await?,
            };
            let Some(found) = found else {
                return Err(Error::Platform(format!(
                    "{target} cannot get its own SSH identity: {source}'s user data (secret {old:?}) is neither kept by snapshot {snap_name} nor in namespace {ns:?}; nothing was created"
                )));
            };
            (Some(found), Some(new_name(source, target, &old)))
        }
        UserData::Inline(t) if identity::has_platform_ssh(&t) => {
            (Some(t), Some(identity::secret_name(target)))
        }
        UserData::Inline(_) | UserData::None => (None, None),
    })
}

/// `user_data` with NEW's own identity (principals, a fresh host key and its certificate)
/// where it holds the platform's SSH setup; a dry run makes no host key, so the user data is
/// shown without one.
#[allow(clippy::too_many_arguments)]
async fn own_identity(
    cluster: &Cluster,
    platform: &crate::flavor::Platform,
    ns: &str,
    source: &str,
    target: &str,
    user_data: Option<&str>,
    dry: bool,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Option<String>> {
    let Some(text) = user_data.filter(|t| identity::has_platform_ssh(t)) else {
        return Ok(user_data.map(str::to_owned));
    };
    let host = if dry {
        None
    } else {
        crate::create::checks::vm_host_keys(
            cluster,
            platform,
            crate::ca::DEFAULT_NAMESPACE,
            target,
            ns,
            &mut |w| on_event(Event::Notice(w)),
        )
        .await?
    };
    Ok(Some(
        identity::reissue(text, source, target, ns, host.as_ref())
            .map_err(Error::Platform)?
            .unwrap_or_else(|| text.to_owned()),
    ))
}

/// Creates `objects` in their order (NEW's VirtualMachine last); on a failure what was made is
/// deleted. Returns what was made (kind, name, uid) and NEW as created.
async fn create_in_order(
    cluster: &Cluster,
    ns: &str,
    objects: &[(Kind, Value)],
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<(Vec<(Kind, String, String)>, Value)> {
    let mut made: Vec<(Kind, String, String)> = vec![];
    let mut new_vm = Value::Null;
    for (kind, obj) in objects {
        let name = text(obj, "/metadata/name").to_owned();
        match create_obj(cluster, *kind, ns, obj, false).await {
            Ok(o) => {
                made.push((*kind, name.clone(), text(&o, "/metadata/uid").to_owned()));
                on_event(Event::Created(format!(
                    "{}/{name}",
                    kind.kind.to_ascii_lowercase()
                )));
                if kind.kind == DECKHOUSE_VM.kind {
                    new_vm = o;
                }
            }
            Err(e) => {
                undo(cluster, ns, &made, on_event).await;
                return Err(e);
            }
        }
    }
    Ok((made, new_vm))
}

/// NEW owns its disks and its Secret (`delete NEW` removes them).
async fn adopt(
    cluster: &Cluster,
    ns: &str,
    target: &str,
    made: &[(Kind, String, String)],
    new_vm: &Value,
) -> Result<()> {
    let owner = json!({
        "apiVersion": DECKHOUSE_VM.api_version(), "kind": "VirtualMachine",
        "name": target, "uid": new_vm.pointer("/metadata/uid").cloned().unwrap_or_default(),
    });
    for (kind, name, _) in made {
        match kind.kind {
            "VirtualDisk" => add_owner(cluster, *kind, ns, name, &owner).await?,
            "Secret" => add_owner(cluster, *kind, ns, name, &identity::owner_of(new_vm)).await?,
            _ => {}
        }
    }
    Ok(())
}

/// Adds `owner` to `name` (a patch carrying the resourceVersion read): a controller's
/// status write in between is a conflict, after which it is read and tried again.
async fn add_owner(
    cluster: &Cluster,
    kind: Kind,
    ns: &str,
    name: &str,
    owner: &Value,
) -> Result<()> {
    let mut tries = 0;
    loop {
        match crate::clone::deckhouse::add_owner(cluster, &kind, ns, name, owner).await {
            Err(Error::Conflict(_)) if tries < 10 => tries += 1,
            done => return done,
        }
    }
}

/// Waits until NEW's disks are provisioned: Ready, or WaitForFirstConsumer (bound when NEW
/// first starts); a Failed disk is an error.
async fn provisioned(
    cluster: &Cluster,
    ns: &str,
    disks: &[Disk],
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<()> {
    if disks.is_empty() {
        return Ok(());
    }
    let watched: Vec<Watched> = disks
        .iter()
        .map(|d| Watched::new(VIRTUAL_DISK, ns, &d.new))
        .collect();
    let mut last = String::new();
    watch::until(cluster, &watched, |objs| {
        let mut phases = vec![];
        for (d, obj) in disks.iter().zip(objs) {
            let Some(obj) = obj else {
                return Some(Err(Error::Platform(format!(
                    "virtualdisk {} was deleted while restoring",
                    d.new
                ))));
            };
            let phase = text(obj, "/status/phase");
            if phase == "Failed" {
                let why = super::kubevirt::conditions(obj)
                    .find(|c| c["type"] == "Ready")
                    .map(|c| text(c, "/message"))
                    .filter(|m| !m.is_empty())
                    .unwrap_or("no reason given");
                return Some(Err(Error::Stuck(format!(
                    "virtualdisk {} failed: {why}",
                    d.new
                ))));
            }
            phases.push((d.new.as_str(), phase, text(obj, "/status/progress")));
        }
        let now = phases
            .iter()
            .map(|(n, p, pr)| format!("{n} {p} {pr}"))
            .collect::<Vec<_>>()
            .join(", ");
        if now != last {
            last = now.clone();
            let phase = phases
                .iter()
                .map(|(_, p, _)| *p)
                .find(|p| !matches!(*p, "Ready" | "WaitForFirstConsumer"))
                .unwrap_or("Ready");
            on_event(Event::Phase {
                phase: if phase.is_empty() { "Pending" } else { phase }.to_owned(),
                message: now,
            });
        }
        phases
            .iter()
            .all(|(_, p, _)| matches!(*p, "Ready" | "WaitForFirstConsumer"))
            .then_some(Ok(()))
    })
    .await
}

/// All or nothing: delete what was `made` (`(kind, name, uid)`), the VM first so nothing
/// boots, each with its uid as a precondition (never an object someone else made since).
async fn undo(
    cluster: &Cluster,
    ns: &str,
    made: &[(Kind, String, String)],
    on_event: &(dyn Fn(Event) + Send + Sync),
) {
    for (kind, name, uid) in made.iter().rev() {
        if delete_with_uid(cluster, *kind, ns, name, uid).await {
            on_event(Event::Notice(format!(
                "deleted {}/{name}, made by the failed restore",
                kind.kind.to_ascii_lowercase()
            )));
        }
    }
}

/// Delete `name` of `kind` if it still has `uid`; whether it was deleted.
async fn delete_with_uid(cluster: &Cluster, kind: Kind, ns: &str, name: &str, uid: &str) -> bool {
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    kind.api(&cluster.client, Some(ns))
        .delete(name, &params)
        .await
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_objects_are_read_as_upstream_stores_them() {
        use base64::Engine;
        let b64 = &base64::engine::general_purpose::STANDARD;
        // `base64 -w0 <<< '...'` twice, as `secret_restorer.go` leaves it in the API.
        let provisioner =
            r#"{"metadata":{"name":"web-cloudinit"},"data":{"userData":"I2Nsb3VkLWNvbmZpZwo="}}"#;
        let twice = b64.encode(b64.encode(provisioner));
        let secret = json!({"data": {"provisioner": twice, "vm": b64.encode(r#"{"kind":"VirtualMachine"}"#)}});
        let kept = kept_object(&secret, "provisioner").unwrap();
        assert_eq!(
            identity::secret_user_data(&kept).as_deref(),
            Some("#cloud-config\n")
        );
        // Once-encoded JSON is read too.
        assert_eq!(
            kept_object(&secret, "vm").unwrap()["kind"],
            "VirtualMachine"
        );
        assert_eq!(kept_object(&secret, "vmip"), None);
    }

    fn disks() -> Vec<Disk> {
        vec![Disk {
            old: "web-root".into(),
            new: new_name("web", "copy", "web-root"),
            snapshot: "web-root-u1".into(),
        }]
    }

    #[test]
    fn disks_come_from_their_snapshots_as_the_platform_makes_them() {
        let d = disk_object("ns", "copy", &disks()[0]);
        assert_eq!(d["metadata"]["name"], "copy-root");
        assert_eq!(
            d["spec"],
            json!({"dataSource": {"type": "ObjectRef",
                "objectRef": {"kind": "VirtualDiskSnapshot", "name": "web-root-u1"}}})
        );
        assert!(super::super::kubevirt::is_ours(&d));
        assert_eq!(d["metadata"]["labels"]["kubevm.io/vm"], "copy");
    }

    #[test]
    fn the_new_vm_keeps_nothing_of_the_source_instance() {
        // As the platform keeps it (the whole object, status included).
        let kept = json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-web", "resourceVersion": "7",
                "finalizers": ["virtualization.deckhouse.io/vm-controller"],
                "ownerReferences": [{"kind": "X", "name": "x", "uid": "u-x"}],
                "labels": {"kubevm.io/vm": "web", "app": "shop"},
                "annotations": {"ssh.kubevm.io/trust": "vm-scoped",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"metadata\":{\"name\":\"web\"}}"}},
            "spec": {"runPolicy": "AlwaysOn", "virtualMachineIPAddressName": "web-ip",
                "networks": [{"type": "Main"}, {"type": "Network", "name": "lan", "virtualMachineMACAddressName": "web-mac"}],
                "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "web-root"}, {"kind": "ClusterVirtualImage", "name": "ubuntu"}],
                "provisioning": {"type": "UserDataRef", "userDataRef": {"kind": "Secret", "name": "web-cloudinit"}}},
            "status": {"phase": "Running"}});
        let vm = vm_object(&kept, "ns", "copy", &disks(), Some("copy-cloudinit")).unwrap();
        assert_eq!(
            vm["metadata"],
            json!({"name": "copy", "namespace": "ns",
                "labels": {"kubevm.io/vm": "copy", "app": "shop", "app.kubernetes.io/managed-by": "kubectl-vm"},
                "annotations": {"ssh.kubevm.io/trust": "vm-scoped"}})
        );
        assert_eq!(vm.get("status"), None);
        assert_eq!(
            vm["spec"],
            json!({"runPolicy": "AlwaysOn",
                "networks": [{"type": "Main"}, {"type": "Network", "name": "lan"}],
                "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "copy-root"}, {"kind": "ClusterVirtualImage", "name": "ubuntu"}],
                "provisioning": {"type": "UserDataRef", "userDataRef": {"kind": "Secret", "name": "copy-cloudinit"}}})
        );
        assert!(!vm.to_string().contains("web"), "{vm}");
        // A disk the snapshot holds no copy of is not shared with the source.
        let err = vm_object(&kept, "ns", "copy", &[], None).unwrap_err();
        assert!(err.to_string().contains("\"web-root\""), "{err}");
    }

    #[test]
    fn user_data_is_found_by_reference_or_inline() {
        let by_ref = json!({"spec": {"provisioning": {"type": "UserDataRef",
            "userDataRef": {"kind": "Secret", "name": "web-cloudinit"}}}});
        assert_eq!(
            user_data_of(&by_ref),
            UserData::Secret("web-cloudinit".into())
        );
        let inline =
            json!({"spec": {"provisioning": {"type": "UserData", "userData": "#cloud-config\n"}}});
        assert_eq!(
            user_data_of(&inline),
            UserData::Inline("#cloud-config\n".into())
        );
        // `printf '#cloud-config\n' | base64`
        let b64 = json!({"spec": {"provisioning": {"type": "UserData", "userDataBase64": "I2Nsb3VkLWNvbmZpZwo="}}});
        assert_eq!(
            user_data_of(&b64),
            UserData::Inline("#cloud-config\n".into())
        );
        assert_eq!(user_data_of(&json!({"spec": {}})), UserData::None);
    }
}
