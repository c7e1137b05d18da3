//! KubeVirt: `snapshot.kubevirt.io/v1beta1` VirtualMachineSnapshot, VirtualMachineSnapshotContent
//! and VirtualMachineRestore (FACTS §1; behaviour from kubevirt `pkg/storage/snapshot/`).
//!
//! - A snapshot's `status.phase` goes `InProgress → Succeeded` (`readyToUse: true`) or
//!   `Failed`; `status.indications` holds `Online` when the VM ran and then `GuestAgent` (the
//!   agent froze the filesystems) or `NoGuestAgent` (crash-consistent only).
//! - Its size is the sum of the claims in its content's `spec.volumeBackups`.
//! - A restore needs the target VM stopped: virt-controller waits, stops it, or fails
//!   according to `spec.targetReadinessPolicy`. kubectl-vm checks first and asks for
//!   `FailImmediate`, so a VM started in between fails the restore instead of the restore
//!   waiting five minutes. `spec.target` may name a VM that does not exist: it is created,
//!   halted, with new disks (`restore-<restore uid>-<volume>`).

use std::collections::{BTreeMap, HashMap};

use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use serde_json::{Value, json};

use super::{Deleted, DryRun, Event, Options, Outcome, RestoreRequest, Snapshot, text};
use crate::api::{KUBEVIRT_VM, KUBEVIRT_VMI, Kind};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::{Flavor, Platform};
use crate::lifecycle::watch::{self, Watched};
use crate::lifecycle::{self, Action, VmRef};
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};
use crate::quantity::Quantity;

/// VirtualMachineSnapshot.
pub const VM_SNAPSHOT: Kind = Kind {
    group: "snapshot.kubevirt.io",
    version: "v1beta1",
    kind: "VirtualMachineSnapshot",
    plural: "virtualmachinesnapshots",
    namespaced: true,
};

/// VirtualMachineSnapshotContent.
pub const VM_SNAPSHOT_CONTENT: Kind = Kind {
    group: "snapshot.kubevirt.io",
    version: "v1beta1",
    kind: "VirtualMachineSnapshotContent",
    plural: "virtualmachinesnapshotcontents",
    namespaced: true,
};

/// VirtualMachineRestore.
pub const VM_RESTORE: Kind = Kind {
    group: "snapshot.kubevirt.io",
    version: "v1beta1",
    kind: "VirtualMachineRestore",
    plural: "virtualmachinerestores",
    namespaced: true,
};

/// The reason virt-controller fails a restore of a running VM (`restore.go`,
/// `targetNotReadyFailureMessage`).
pub const NOT_POWERED_OFF: &str = "Restore target VMI must be powered off before restore operation";

pub(super) fn is_ours(obj: &Value) -> bool {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        == Some(&json!(MANAGED_BY))
}

pub(super) fn labels(vm: &str) -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL, MANAGED_BY.to_owned()),
        (VM_LABEL, vm.to_owned()),
    ])
}

pub(super) async fn get_opt(
    cluster: &Cluster,
    kind: Kind,
    ns: &str,
    name: &str,
) -> Result<Option<Value>> {
    kind.api(&cluster.client, Some(ns))
        .get_opt(name)
        .await
        .map(|o| o.map(|o| serde_json::to_value(o).unwrap_or_default()))
        .map_err(|e| cluster.error(e, &kind.action("get", Some(ns)).named(name)))
}

pub(super) async fn get(cluster: &Cluster, kind: Kind, ns: &str, name: &str) -> Result<Value> {
    kind.api(&cluster.client, Some(ns))
        .get(name)
        .await
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .map_err(|e| cluster.error(e, &kind.action("get", Some(ns)).named(name)))
}

/// Create `obj` (create semantics: an existing object of that name is left alone).
pub(super) async fn create_obj(
    cluster: &Cluster,
    kind: Kind,
    ns: &str,
    obj: &Value,
    dry_run: bool,
) -> Result<Value> {
    let shown = {
        let n = text(obj, "/metadata/name");
        if n.is_empty() {
            text(obj, "/metadata/generateName").to_owned()
        } else {
            n.to_owned()
        }
    };
    let dynamic: kube::api::DynamicObject =
        serde_json::from_value(obj.clone()).map_err(|e| Error::Internal(e.to_string()))?;
    let made = kind
        .api(&cluster.client, Some(ns))
        .create(&PostParams { dry_run, ..Default::default() }, &dynamic)
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists" => Error::NotOurs(format!(
                "{} {shown:?} already exists in namespace {ns:?}; it is left as it is (nothing was changed)",
                kind.kind
            )),
            e => cluster.error(e, &kind.action("create", Some(ns)).named(&shown)),
        })?;
    Ok(serde_json::to_value(made).unwrap_or_default())
}

pub(super) fn conditions(obj: &Value) -> impl Iterator<Item = &Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn condition_reason<'a>(obj: &'a Value, type_: &str) -> Option<&'a str> {
    conditions(obj)
        .find(|c| c["type"] == type_)
        .map(|c| text(c, "/reason"))
}

fn indications(obj: &Value) -> Vec<String> {
    obj.pointer("/status/indications")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| i.as_str().map(str::to_owned))
        .collect()
}

/// The disks (PVC and DataVolume volumes of `vm`) a finished snapshot left out, as `disk
/// VOLUME (claim CLAIM)`: KubeVirt lists every volume without a backup in
/// `status.snapshotVolumes.excludedVolumes` (`pkg/storage/snapshot/snapshot.go`
/// `updateSnapshotSnapshotableVolumes`), cloud-init and container disks too; a claim is left
/// out when it is unbound or its storage class has no VolumeSnapshotClass (`getSnapshotPVC`).
pub fn excluded_disks(snapshot: &Value, vm: &Value) -> Vec<String> {
    let excluded: Vec<&str> = snapshot
        .pointer("/status/snapshotVolumes/excludedVolumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    vm.pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| excluded.contains(&text(v, "/name")))
        .filter_map(|v| {
            let claim = v
                .pointer("/persistentVolumeClaim/claimName")
                .or_else(|| v.pointer("/dataVolume/name"))
                .and_then(Value::as_str)?;
            Some(format!("disk {} (claim {claim})", text(v, "/name")))
        })
        .collect()
}

/// The snapshot object `create` sends.
pub fn snapshot_object(ns: &str, vm: &str, name: &str) -> Value {
    json!({
        "apiVersion": VM_SNAPSHOT.api_version(), "kind": VM_SNAPSHOT.kind,
        "metadata": {"name": name, "namespace": ns, "labels": labels(vm)},
        "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": vm}},
    })
}

/// The restore object `restore` sends.
pub fn restore_object(ns: &str, snapshot: &str, target: &str) -> Value {
    json!({
        "apiVersion": VM_RESTORE.api_version(), "kind": VM_RESTORE.kind,
        "metadata": {"generateName": format!("{snapshot}-restore-"), "namespace": ns, "labels": labels(target)},
        "spec": {
            "target": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": target},
            "virtualMachineSnapshotName": snapshot,
            "targetReadinessPolicy": "FailImmediate",
        },
    })
}

/// Wait until snapshot `name` of `vm` is ready to use, reporting its phase and progress
/// reason as they change; a failed snapshot gives its `Failure` reason (or `status.error`).
async fn wait_taken(
    cluster: &Cluster,
    ns: &str,
    vm: &str,
    name: &str,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Value> {
    let mut last = String::new();
    watch::until(cluster, &[Watched::new(VM_SNAPSHOT, ns, name)], |objs| {
        let Some(s) = &objs[0] else {
            return Some(Err(Error::Platform(format!(
                "virtualmachinesnapshot {name} was deleted while being taken"
            ))));
        };
        let phase = text(s, "/status/phase");
        let reason = condition_reason(s, "Progressing").unwrap_or("");
        let now = format!("{phase}\n{reason}");
        if !phase.is_empty() && now != last {
            last = now;
            on_event(Event::Phase {
                phase: phase.to_owned(),
                message: reason.to_owned(),
            });
        }
        match phase {
            "Succeeded" if s.pointer("/status/readyToUse") == Some(&json!(true)) => {
                Some(Ok(s.clone()))
            }
            "Failed" => {
                let why = condition_reason(s, "Failure")
                    .filter(|r| !r.is_empty())
                    .or(s.pointer("/status/error/message").and_then(Value::as_str))
                    .unwrap_or("failed");
                Some(Err(Error::Stuck(format!(
                    "snapshot {name} of {vm}.{ns} failed: {why}"
                ))))
            }
            _ => None,
        }
    })
    .await
}

/// Take snapshot `name` of VM `vm`.
pub async fn create(
    cluster: &Cluster,
    ns: &str,
    vm: &str,
    name: &str,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let vm_ref = VmRef {
        namespace: ns.to_owned(),
        name: vm.to_owned(),
    };
    let source = lifecycle::get_vm(cluster, Flavor::KubeVirt, &vm_ref).await?;
    let vmi = get_opt(cluster, KUBEVIRT_VMI, ns, vm).await?;
    // Before the snapshot says so: a running guest without an agent is not frozen.
    let mut no_agent = vmi.as_ref().is_some_and(|v| {
        !conditions(v).any(|c| c["type"] == "AgentConnected" && c["status"] == "True")
    });
    let obj = snapshot_object(ns, vm, name);
    let mut outcome = Outcome {
        snapshot: name.to_owned(),
        vm: format!("{vm}.{ns}"),
        object_ref: VM_SNAPSHOT.object_ref(name),
        object: Some(obj.clone()),
        waited: false,
        no_agent,
        restarted: false,
    };
    if options.dry_run == DryRun::Client {
        return Ok(outcome);
    }
    let made = create_obj(
        cluster,
        VM_SNAPSHOT,
        ns,
        &obj,
        options.dry_run == DryRun::Server,
    )
    .await?;
    outcome.object = Some(made);
    if options.dry_run == DryRun::Server {
        return Ok(outcome);
    }
    on_event(Event::Created(format!("virtualmachinesnapshot/{name}")));
    if no_agent {
        on_event(Event::Notice(format!(
            "{vm}.{ns} runs without a connected guest agent: the snapshot is crash-consistent, not filesystem-consistent"
        )));
    }
    if !options.wait {
        return Ok(outcome);
    }
    let done = wait_taken(cluster, ns, vm, name, on_event).await?;
    let ind = indications(&done);
    if ind.iter().any(|i| i == "NoGuestAgent") && !no_agent {
        on_event(Event::Notice(format!(
            "{vm}.{ns} had no guest agent: the snapshot is crash-consistent, not filesystem-consistent"
        )));
    }
    no_agent = ind.iter().any(|i| i == "NoGuestAgent");
    let left_out = excluded_disks(&done, &source);
    if !left_out.is_empty() {
        on_event(Event::Notice(format!(
            "snapshot {name} of {vm}.{ns} leaves out {}: KubeVirt did not snapshot it (no VolumeSnapshotClass for its storage class, or unbound); a restore leaves it as it is then",
            left_out.join(", "),
        )));
    }
    outcome.no_agent = no_agent;
    outcome.object = Some(done);
    outcome.waited = true;
    Ok(outcome)
}

/// Total size of a content's volume backups.
fn content_size(content: &Value) -> Option<Quantity> {
    let backups = content
        .pointer("/spec/volumeBackups")
        .and_then(Value::as_array)?;
    let mut total = 0u64;
    for b in backups {
        let q = b.pointer("/persistentVolumeClaim/spec/resources/requests/storage")?;
        let text = match q {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        total += Quantity::parse(&text).ok()?.bytes();
    }
    Some(Quantity::from_bytes(total))
}

/// One listed snapshot from the object and the contents of its namespace.
pub fn row(s: &Value, contents: &HashMap<(String, String), Value>) -> Snapshot {
    let ns = text(s, "/metadata/namespace").to_owned();
    let content = text(s, "/status/virtualMachineSnapshotContentName");
    let size = contents
        .get(&(ns.clone(), content.to_owned()))
        .and_then(content_size)
        .map(|q| q.to_string())
        .unwrap_or_default();
    Snapshot {
        name: text(s, "/metadata/name").to_owned(),
        namespace: ns,
        vm: text(s, "/spec/source/name").to_owned(),
        phase: text(s, "/status/phase").to_owned(),
        ready: s.pointer("/status/readyToUse") == Some(&json!(true)),
        size,
        indications: indications(s),
        created: text(s, "/metadata/creationTimestamp").to_owned(),
        ours: is_ours(s),
        left_out: s
            .pointer("/status/snapshotVolumes/excludedVolumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        object: s.clone(),
    }
}

/// The snapshots in `ns` (or all namespaces), of `vm` when given, sorted by namespace, name.
pub async fn list(cluster: &Cluster, ns: Option<&str>, vm: Option<&str>) -> Result<Vec<Snapshot>> {
    let list = |kind: Kind| async move {
        kind.api(&cluster.client, ns)
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .map(|o| serde_json::to_value(o).unwrap_or_default())
                    .collect::<Vec<_>>()
            })
            .map_err(|e| cluster.error(e, &kind.action("list", ns)))
    };
    let snapshots = list(VM_SNAPSHOT).await?;
    // Sizes are a nicety: a user who may not read contents still gets the list.
    let contents: HashMap<(String, String), Value> = list(VM_SNAPSHOT_CONTENT)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            (
                (
                    text(&c, "/metadata/namespace").to_owned(),
                    text(&c, "/metadata/name").to_owned(),
                ),
                c,
            )
        })
        .collect();
    let mut rows: Vec<Snapshot> = snapshots
        .iter()
        .filter(|s| vm.is_none_or(|v| text(s, "/spec/source/name") == v))
        .map(|s| row(s, &contents))
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(rows)
}

/// Delete snapshots `names` (all checked first).
pub async fn delete(
    cluster: &Cluster,
    ns: &str,
    names: &[String],
    force: bool,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Vec<Deleted>> {
    let mut found = vec![];
    for name in names {
        let s = get(cluster, VM_SNAPSHOT, ns, name).await?;
        if !force && !is_ours(&s) {
            return Err(Error::NotOurs(format!(
                "virtualmachinesnapshot {name} was not made by kubectl vm; it is left as it is (pass --force to delete it anyway; nothing was deleted)"
            )));
        }
        found.push(s);
    }
    let mut deleted = vec![];
    for s in &found {
        let name = text(s, "/metadata/name").to_owned();
        deleted.push(Deleted {
            name: name.clone(),
            object_ref: VM_SNAPSHOT.object_ref(&name),
        });
        if options.dry_run == DryRun::Client {
            continue;
        }
        let params = DeleteParams {
            dry_run: options.dry_run == DryRun::Server,
            preconditions: Some(Preconditions {
                uid: Some(text(s, "/metadata/uid").to_owned()),
                resource_version: None,
            }),
            ..Default::default()
        };
        VM_SNAPSHOT
            .api(&cluster.client, Some(ns))
            .delete(&name, &params)
            .await
            .map_err(|e| cluster.error(e, &VM_SNAPSHOT.action("delete", Some(ns)).named(&name)))?;
    }
    if options.dry_run == DryRun::None && options.wait {
        for d in &deleted {
            watch::until(cluster, &[Watched::new(VM_SNAPSHOT, ns, &d.name)], |objs| {
                objs[0].is_none().then_some(Ok(()))
            })
            .await?;
            on_event(Event::Phase {
                phase: "Deleted".into(),
                message: d.name.clone(),
            });
        }
    }
    Ok(deleted)
}

/// What a restore works on once it is checked: the snapshot, the VM it was taken of, the VM
/// it restores into, and whether that one runs.
struct Restorable {
    snap: Value,
    source: String,
    target: String,
    running: bool,
}

/// The checks before anything changes: the snapshot is ready, a new VM's name is free, and a
/// running target is stopped only when asked to (`--stop`).
async fn check_restorable(
    cluster: &Cluster,
    ns: &str,
    request: &RestoreRequest,
) -> Result<Restorable> {
    let snap_name = &request.snapshot;
    let snap = get(cluster, VM_SNAPSHOT, ns, snap_name).await?;
    if snap.pointer("/status/readyToUse") != Some(&json!(true)) {
        return Err(Error::Usage(format!(
            "snapshot {snap_name} is not ready to restore (phase {}); nothing was changed",
            match text(&snap, "/status/phase") {
                "" => "unknown",
                p => p,
            }
        )));
    }
    let source = text(&snap, "/spec/source/name").to_owned();
    let target = request.new_vm.clone().unwrap_or_else(|| source.clone());
    let existing = get_opt(cluster, KUBEVIRT_VM, ns, &target).await?;
    if request.new_vm.is_some() && existing.is_some() {
        return Err(Error::NotOurs(format!(
            "VM {target}.{ns} already exists; KubeVirt restores into a new VM only under a free name (\"restore source and restore target are different but restore target already exists\"); nothing was changed"
        )));
    }
    let running =
        existing.is_some() && get_opt(cluster, KUBEVIRT_VMI, ns, &target).await?.is_some();
    if running && !request.stop {
        return Err(Error::Usage(format!(
            "{target}.{ns} is running: KubeVirt restores only a stopped VM (\"{NOT_POWERED_OFF}\"); stop it first, or pass --stop to stop it, restore and start it again (nothing was changed)"
        )));
    }
    Ok(Restorable {
        snap,
        source,
        target,
        running,
    })
}

/// Stop or start the VM `vm` around the restore (`--stop`), its phases reported as the VM's.
async fn power(
    cluster: &Cluster,
    platform: &Platform,
    vm: &VmRef,
    action: &Action,
    wait: bool,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<()> {
    let target = &vm.name;
    let power = lifecycle::Options {
        dry_run: DryRun::None,
        wait,
        timeout: options.timeout,
        want_object: false,
    };
    let relay = |e: lifecycle::Event| {
        if let lifecycle::Event::Phase { phase, .. } = e {
            on_event(Event::Phase {
                phase,
                message: format!("VM {target}"),
            });
        }
    };
    lifecycle::run(cluster, platform, action, vm, &power, &relay).await?;
    Ok(())
}

/// Restore a snapshot (see the module documentation).
pub async fn restore(
    cluster: &Cluster,
    platform: &Platform,
    ns: &str,
    request: &RestoreRequest,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let snap_name = &request.snapshot;
    let Restorable {
        snap,
        source,
        target,
        running,
    } = check_restorable(cluster, ns, request).await?;
    // The new VM's own identity is made from the user data the snapshot keeps, not from the
    // source (which may be gone): a Secret it names that is gone refuses the restore here.
    let user_data = match &request.new_vm {
        Some(_) => kept_user_data(cluster, ns, &snap, &source, &target).await?,
        None => None,
    };
    let obj = restore_object(ns, snap_name, &target);
    let mut outcome = Outcome {
        snapshot: snap_name.clone(),
        vm: format!("{target}.{ns}"),
        object_ref: VM_RESTORE.object_ref(&format!("{snap_name}-restore-")),
        object: Some(obj.clone()),
        waited: false,
        no_agent: false,
        restarted: false,
    };
    if options.dry_run == DryRun::Client {
        return Ok(outcome);
    }
    if options.dry_run == DryRun::Server {
        outcome.object = Some(create_obj(cluster, VM_RESTORE, ns, &obj, true).await?);
        return Ok(outcome);
    }
    let vm_ref = VmRef {
        namespace: ns.to_owned(),
        name: target.clone(),
    };
    if running {
        on_event(Event::Notice(format!(
            "stopping {target}.{ns} for the restore"
        )));
        let stop = Action::Stop {
            grace_period: None,
            force: false,
        };
        power(cluster, platform, &vm_ref, &stop, true, options, on_event).await?;
    }
    let made = create_obj(cluster, VM_RESTORE, ns, &obj, false).await?;
    let restore_name = text(&made, "/metadata/name").to_owned();
    outcome.object_ref = VM_RESTORE.object_ref(&restore_name);
    outcome.object = Some(made);
    on_event(Event::Created(format!(
        "virtualmachinerestore/{restore_name}"
    )));
    // A new VM needs its own identity once it exists: wait for it.
    if !options.wait && !running && request.new_vm.is_none() {
        return Ok(outcome);
    }
    if !options.wait && request.new_vm.is_some() {
        on_event(Event::Notice(format!(
            "waiting anyway: {target}.{ns} gets its own SSH identity once it exists"
        )));
    }
    let done = wait_restored(cluster, ns, &restore_name, snap_name, &target, on_event).await?;
    outcome.object = Some(done);
    outcome.waited = true;
    if request.new_vm.is_some() {
        own_identity(
            cluster,
            platform,
            ns,
            &source,
            &target,
            user_data.as_deref(),
            on_event,
        )
        .await?;
    }
    if running {
        on_event(Event::Notice(format!("starting {target}.{ns} again")));
        let start = Action::Start { paused: false };
        power(
            cluster,
            platform,
            &vm_ref,
            &start,
            options.wait,
            options,
            on_event,
        )
        .await?;
        outcome.restarted = true;
    }
    Ok(outcome)
}

/// A VM restored under a new name gets its own cloud-init (principals, host key, host
/// certificate) from the user data the snapshot kept ([`crate::clone::identity`]).
async fn own_identity(
    cluster: &Cluster,
    platform: &Platform,
    ns: &str,
    source: &str,
    target: &str,
    user_data: Option<&str>,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<()> {
    if let Some(secret) = crate::clone::identity::kubevirt_restored_vm(
        cluster,
        platform,
        ns,
        source,
        target,
        user_data,
        &mut |w| on_event(Event::Notice(w)),
    )
    .await?
    {
        on_event(Event::Notice(format!(
            "secret/{secret}: {target}'s own cloud-init (principals, host key, host certificate)"
        )));
    }
    Ok(())
}

/// The user data the snapshot keeps for the new VM's own identity (read from the snapshot
/// content, not the source, which may be gone); a Secret it names that is gone refuses the
/// restore.
async fn kept_user_data(
    cluster: &Cluster,
    ns: &str,
    snap: &Value,
    source: &str,
    target: &str,
) -> Result<Option<String>> {
    let content = get(
        cluster,
        VM_SNAPSHOT_CONTENT,
        ns,
        text(snap, "/status/virtualMachineSnapshotContentName"),
    )
    .await?;
    let kept = content
        .pointer("/spec/source/virtualMachine")
        .cloned()
        .unwrap_or_default();
    match crate::clone::identity::kept_kubevirt(cluster, ns, &kept).await? {
        crate::clone::identity::Kept::None => Ok(None),
        crate::clone::identity::Kept::Text(t) => Ok(Some(t)),
        crate::clone::identity::Kept::Gone(secret) => Err(Error::Platform(format!(
            "{target} cannot get its own SSH identity: {source}'s user data was in secret {secret:?}, which is gone, and a KubeVirt snapshot keeps only its name; nothing was created"
        ))),
    }
}

/// Watches the VirtualMachineRestore until it completes, reporting its Ready reason; a
/// Failure condition ends with its reason.
async fn wait_restored(
    cluster: &Cluster,
    ns: &str,
    restore_name: &str,
    snap_name: &str,
    target: &str,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Value> {
    let mut last = String::new();
    watch::until(
        cluster,
        &[Watched::new(VM_RESTORE, ns, restore_name)],
        |objs| {
            let Some(r) = &objs[0] else {
                return Some(Err(Error::Platform(format!(
                    "virtualmachinerestore {restore_name} was deleted while restoring"
                ))));
            };
            let reason = condition_reason(r, "Ready").unwrap_or("").to_owned();
            if !reason.is_empty() && reason != last {
                last = reason.clone();
                on_event(Event::Phase {
                    phase: "Restoring".into(),
                    message: reason.clone(),
                });
            }
            if r.pointer("/status/complete") == Some(&json!(true)) {
                return Some(Ok(r.clone()));
            }
            conditions(r)
                .find(|c| c["type"] == "Failure" && c["status"] == "True")
                .map(|c| {
                    Err(Error::Stuck(format!(
                        "restore of {snap_name} into {target}.{ns} failed: {}",
                        text(c, "/reason")
                    )))
                })
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_labelled_as_ours_and_ask_to_fail_on_a_running_vm() {
        let s = snapshot_object("ns", "web", "web-1");
        assert!(is_ours(&s));
        assert_eq!(s["spec"]["source"]["kind"], "VirtualMachine");
        let r = restore_object("ns", "web-1", "web2");
        assert!(is_ours(&r));
        assert_eq!(r["spec"]["targetReadinessPolicy"], "FailImmediate");
        assert_eq!(r["spec"]["target"]["name"], "web2");
        assert_eq!(r["metadata"]["generateName"], "web-1-restore-");
    }

    #[test]
    fn sizes_add_up_the_backed_up_claims() {
        let content = json!({"spec": {"volumeBackups": [
            {"persistentVolumeClaim": {"spec": {"resources": {"requests": {"storage": "1Gi"}}}}},
            {"persistentVolumeClaim": {"spec": {"resources": {"requests": {"storage": "512Mi"}}}}},
        ]}});
        assert_eq!(
            content_size(&content).map(|q| q.bytes()),
            Some(1536 * 1024 * 1024)
        );
        assert_eq!(content_size(&json!({})), None);
    }
}
