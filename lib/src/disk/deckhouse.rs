//! Deckhouse: disks from the VM's `spec.blockDeviceRefs` and `status.blockDeviceRefs`;
//! hotplug through a VirtualMachineBlockDeviceAttachment (`vmbda`, FACTS §12:
//! `spec{virtualMachineName, blockDeviceRef{kind, name}}`, phases `Pending|InProgress|
//! Attached|Failed|Terminating`). The attachment is made here with create semantics and our
//! labels; detaching deletes it with its uid as a precondition. Images are attached read-only
//! and hotplugged devices always use SCSI (the CRD's description).

use std::collections::BTreeMap;

use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use serde_json::{Value, json};

use super::{
    AttachRequest, Disk, DryRun, Event, GuestSees, Options, Outcome, Resized, SourceKind,
    check_expandable, check_growth, quantity_of, quantity_text, text,
};
use crate::api::{DECKHOUSE_VM, Kind, VIRTUAL_DISK};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::lifecycle::VmRef;
use crate::lifecycle::watch::{self, Watched};
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};
use crate::quantity::Quantity;

pub use crate::api::VMBDA;

pub use crate::api::{CLUSTER_VIRTUAL_IMAGE, VIRTUAL_IMAGE};

fn array<'a>(obj: &'a Value, pointer: &str) -> impl Iterator<Item = &'a Value> {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn short(kind: &str) -> &'static str {
    match kind {
        "VirtualImage" => "vi",
        "ClusterVirtualImage" => "cvi",
        _ => "vd",
    }
}

fn is_ours(obj: &Value) -> bool {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        == Some(&json!(MANAGED_BY))
}

async fn get_vm(cluster: &Cluster, ns: &str, name: &str) -> Result<Value> {
    crate::lifecycle::get_vm(
        cluster,
        Flavor::Deckhouse,
        &VmRef {
            namespace: ns.to_owned(),
            name: name.to_owned(),
        },
    )
    .await
}

async fn get_opt(cluster: &Cluster, kind: Kind, ns: &str, name: &str) -> Result<Option<Value>> {
    let ns = kind.namespaced.then_some(ns);
    kind.api(&cluster.client, ns)
        .get_opt(name)
        .await
        .map(|o| o.map(|o| serde_json::to_value(o).unwrap_or_default()))
        .map_err(|e| cluster.error(e, &kind.action("get", ns).named(name)))
}

/// The serial the guest reads for block device `kind`/`name`: Deckhouse gives every disk the
/// hex md5 of its object's uid (`kvbuilder.GenerateSerialFromObject`, used by the VM builder
/// and the attachment service). Empty when the object is gone.
async fn serial_of(cluster: &Cluster, ns: &str, kind: &str, name: &str) -> Result<String> {
    let kind = match kind {
        "VirtualImage" => VIRTUAL_IMAGE,
        "ClusterVirtualImage" => CLUSTER_VIRTUAL_IMAGE,
        _ => crate::api::VIRTUAL_DISK,
    };
    Ok(get_opt(cluster, kind, ns, name)
        .await?
        .map(|o| serial_from_uid(text(&o, "/metadata/uid")))
        .unwrap_or_default())
}

/// Deckhouse's disk serial for an object uid: its md5, in hex.
pub fn serial_from_uid(uid: &str) -> String {
    use md5::Digest;
    md5::Md5::digest(uid.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The attachments in `ns` (all, or of VM `vm`).
async fn attachments(cluster: &Cluster, ns: &str, vm: Option<&str>) -> Result<Vec<Value>> {
    let list = VMBDA
        .api(&cluster.client, Some(ns))
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.error(e, &VMBDA.action("list", Some(ns))))?;
    Ok(list
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .filter(|b| vm.is_none_or(|vm| text(b, "/spec/virtualMachineName") == vm))
        .collect())
}

/// The disks of VM `name`: its own block devices, then hotplugged ones.
pub async fn list(cluster: &Cluster, ns: &str, name: &str) -> Result<Vec<Disk>> {
    let vm = get_vm(cluster, ns, name).await?;
    let running = matches!(
        text(&vm, "/status/phase"),
        "Running" | "Migrating" | "Stopping"
    );
    let paravirtual = vm.pointer("/spec/enableParavirtualization") != Some(&json!(false));
    let status: Vec<&Value> = array(&vm, "/status/blockDeviceRefs").collect();
    let find = |kind: &str, dev: &str| {
        status
            .iter()
            .find(|s| s["kind"] == kind && s["name"] == dev)
            .copied()
    };
    let mut out = vec![];
    for r in array(&vm, "/spec/blockDeviceRefs") {
        let (kind, dev) = (text(r, "/kind"), text(r, "/name"));
        let st = find(kind, dev);
        out.push(Disk {
            name: dev.to_owned(),
            source: format!("{}/{dev}", short(kind)),
            bus: if paravirtual { "virtio" } else { "sata" }.into(),
            size: quantity_text(st.and_then(|s| s.get("size"))),
            serial: serial_of(cluster, ns, kind, dev).await?,
            target: st
                .map(|s| text(s, "/target").to_owned())
                .unwrap_or_default(),
            hotplugged: false,
            read_only: kind != "VirtualDisk",
            state: match st {
                _ if !running => "-".into(),
                Some(s) if s["attached"] == true => "Attached".into(),
                _ => "Pending".into(),
            },
        });
    }
    for b in attachments(cluster, ns, Some(name)).await? {
        let (kind, dev) = (
            text(&b, "/spec/blockDeviceRef/kind"),
            text(&b, "/spec/blockDeviceRef/name"),
        );
        let st = find(kind, dev);
        let phase = text(&b, "/status/phase");
        out.push(Disk {
            name: dev.to_owned(),
            source: format!("{}/{dev}", short(kind)),
            bus: "scsi".into(),
            size: quantity_text(st.and_then(|s| s.get("size"))),
            serial: serial_of(cluster, ns, kind, dev).await?,
            target: st
                .map(|s| text(s, "/target").to_owned())
                .unwrap_or_default(),
            hotplugged: true,
            read_only: kind != "VirtualDisk",
            state: if phase.is_empty() {
                "Pending".into()
            } else {
                phase.to_owned()
            },
        });
    }
    Ok(out)
}

/// The attachment's name: `VM-DEVICE`.
pub fn attachment_name(vm: &str, device: &str) -> String {
    format!("{vm}-{device}")
}

/// A new blank VirtualDisk, labelled as ours.
pub fn blank_disk(ns: &str, vm: &str, request: &AttachRequest) -> Value {
    let mut pvc = json!({"size": request.size.map(|s| s.to_string()).unwrap_or_default()});
    if let Some(class) = &request.storage_class {
        pvc["storageClassName"] = json!(class);
    }
    json!({
        "apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
        "metadata": {"name": request.name, "namespace": ns,
            "labels": BTreeMap::from([(MANAGED_BY_LABEL, MANAGED_BY), (VM_LABEL, vm)])},
        "spec": {"persistentVolumeClaim": pvc},
    })
}

/// The attachment of `device` (`kind`) to VM `vm`, labelled as ours.
pub fn attachment(ns: &str, vm: &str, kind: &str, device: &str) -> Value {
    json!({
        "apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachineBlockDeviceAttachment",
        "metadata": {"name": attachment_name(vm, device), "namespace": ns,
            "labels": BTreeMap::from([(MANAGED_BY_LABEL, MANAGED_BY), (VM_LABEL, vm)])},
        "spec": {"virtualMachineName": vm, "blockDeviceRef": {"kind": kind, "name": device}},
    })
}

async fn create(
    cluster: &Cluster,
    kind: Kind,
    ns: &str,
    obj: Value,
    dry_run: bool,
) -> Result<Option<String>> {
    let name = text(&obj, "/metadata/name").to_owned();
    let obj: kube::api::DynamicObject =
        serde_json::from_value(obj).map_err(|e| Error::Internal(e.to_string()))?;
    let made = kind
        .api(&cluster.client, Some(ns))
        .create(&PostParams { dry_run, ..Default::default() }, &obj)
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists" => Error::NotOurs(format!(
                "{} {name:?} already exists in namespace {ns:?}; it is left as it is (nothing was changed)",
                kind.kind
            )),
            e => cluster.error(e, &kind.action("create", Some(ns)).named(&name)),
        })?;
    Ok(made.metadata.uid.filter(|_| !dry_run))
}

/// The first condition that is not True, as `reason: message`.
fn why(obj: &Value) -> String {
    array(obj, "/status/conditions")
        .filter(|c| c["status"] != "True")
        .map(|c| {
            let (r, m) = (text(c, "/reason"), text(c, "/message"));
            if m.is_empty() {
                r.to_owned()
            } else {
                format!("{r}: {m}")
            }
        })
        .next()
        .unwrap_or_default()
}

/// Attach `request` to VM `name` with a VMBDA.
pub async fn attach(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    request: &AttachRequest,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let vm = get_vm(cluster, ns, name).await?;
    let (kind, dev_kind) = match request.kind {
        SourceKind::VirtualImage => ("VirtualImage", VIRTUAL_IMAGE),
        SourceKind::ClusterVirtualImage => ("ClusterVirtualImage", CLUSTER_VIRTUAL_IMAGE),
        _ => ("VirtualDisk", VIRTUAL_DISK),
    };
    let dev = &request.name;
    if array(&vm, "/spec/blockDeviceRefs").any(|r| r["kind"] == kind && r["name"] == json!(dev)) {
        return Err(Error::Usage(format!(
            "{name}.{ns} already has {kind} {dev} in its spec.blockDeviceRefs; nothing was changed"
        )));
    }
    let existing = get_opt(cluster, dev_kind, ns, dev).await?;
    check_source(existing.as_ref(), request, kind, dev_kind, ns)?;
    let all = attachments(cluster, ns, None).await?;
    let bda_name = attachment_name(name, dev);
    crate::validate::dns_subdomain("attachment", &bda_name)
        .map_err(|e| Error::Usage(e.to_string()))?;
    if let Some(b) = all.iter().find(|b| text(b, "/metadata/name") == bda_name) {
        return Err(Error::Usage(format!(
            "attachment {bda_name} exists already (phase {}){}; nothing was changed",
            text(b, "/status/phase"),
            if is_ours(b) {
                ""
            } else {
                ", not made by kubectl vm"
            }
        )));
    }
    // A VirtualDisk is attached to one VM at a time.
    if kind == "VirtualDisk"
        && request.size.is_none()
        && let Some(h) = disk_holder(cluster, ns, dev, &all).await?
    {
        return Err(Error::Usage(format!(
            "VirtualDisk {dev} is in use by {h} in namespace {ns:?}; detach it there first (nothing was changed)"
        )));
    }
    let server_dry = options.dry_run == DryRun::Server;
    let live = matches!(text(&vm, "/status/phase"), "Running" | "Migrating");
    let mut outcome = Outcome {
        vm: format!("{name}.{ns}"),
        disk: dev.clone(),
        object_ref: VMBDA.object_ref(&bda_name),
        object: None,
        waited: false,
        live,
    };
    let mut created_uid = None;
    if request.size.is_some() {
        if options.dry_run != DryRun::Client {
            created_uid = create(
                cluster,
                VIRTUAL_DISK,
                ns,
                blank_disk(ns, name, request),
                server_dry,
            )
            .await?;
        }
        on_event(Event::Created(format!("virtualdisk/{dev}")));
    }
    let bda = attachment(ns, name, kind, dev);
    if options.dry_run == DryRun::Client {
        outcome.object = Some(bda);
        return Ok(outcome);
    }
    if let Err(e) = create(cluster, VMBDA, ns, bda.clone(), server_dry).await {
        // All or nothing: the new VirtualDisk goes again when it could not be attached.
        if let Some(uid) = &created_uid {
            super::remove_created(cluster, VIRTUAL_DISK, ns, dev, uid).await?;
            on_event(Event::Removed(format!("virtualdisk/{dev}")));
        }
        return Err(e);
    }
    on_event(Event::Created(format!(
        "virtualmachineblockdeviceattachment/{bda_name}"
    )));
    if server_dry {
        outcome.object = Some(bda);
        return Ok(outcome);
    }
    if options.wait {
        wait_attached(cluster, ns, name, kind, dev, &bda_name, on_event).await?;
        outcome.waited = true;
    }
    outcome.object = get_opt(cluster, VMBDA, ns, &bda_name).await?;
    Ok(outcome)
}

/// Refuses a source that is there when a new disk was asked for (`--size`), or missing when
/// an existing one was.
fn check_source(
    existing: Option<&Value>,
    request: &AttachRequest,
    kind: &str,
    dev_kind: Kind,
    ns: &str,
) -> Result<()> {
    let dev = &request.name;
    match (existing, request.size) {
        (Some(d), Some(_)) => Err(Error::Usage(format!(
            "VirtualDisk {dev:?} exists in namespace {ns:?}{}; attach it without --size, or pick another name",
            if is_ours(d) {
                ""
            } else {
                " and is not kubectl vm's"
            }
        ))),
        (None, None) => Err(Error::Usage(format!(
            "no {kind} {dev:?}{}; nothing was changed{}",
            if dev_kind.namespaced {
                format!(" in namespace {ns:?}")
            } else {
                String::new()
            },
            if kind == "VirtualDisk" {
                " (a new disk needs --size)"
            } else {
                ""
            }
        ))),
        _ => Ok(()),
    }
}

/// Who holds VirtualDisk `dev` already: a VM naming it in its spec, or another attachment.
async fn disk_holder(
    cluster: &Cluster,
    ns: &str,
    dev: &str,
    all: &[Value],
) -> Result<Option<String>> {
    let list = DECKHOUSE_VM
        .api(&cluster.client, Some(ns))
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.error(e, &DECKHOUSE_VM.action("list", Some(ns))))?;
    Ok(list
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .find(|v| {
            array(v, "/spec/blockDeviceRefs")
                .any(|r| r["kind"] == "VirtualDisk" && r["name"] == dev)
        })
        .map(|v| format!("VM {}", text(&v, "/metadata/name")))
        .or_else(|| {
            all.iter()
                .find(|b| {
                    text(b, "/spec/blockDeviceRef/kind") == "VirtualDisk"
                        && text(b, "/spec/blockDeviceRef/name") == dev
                })
                .map(|b| {
                    format!(
                        "VM {} (attachment {})",
                        text(b, "/spec/virtualMachineName"),
                        text(b, "/metadata/name")
                    )
                })
        }))
}

/// Watches the attachment until it is Attached, reporting its phases; Failed ends with the
/// platform's reason.
async fn wait_attached(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    kind: &str,
    dev: &str,
    bda_name: &str,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<()> {
    let mut last = String::new();
    watch::until(cluster, &[Watched::new(VMBDA, ns, bda_name)], |objs| {
        let Some(b) = objs[0].as_ref() else {
            return Some(Err(Error::Platform(format!("attachment {bda_name} was deleted while attaching {dev}"))));
        };
        let phase = text(b, "/status/phase");
        let message = why(b);
        let seen = format!("{phase} {message}");
        if !phase.is_empty() && seen != last {
            last = seen;
            on_event(Event::Phase { phase: phase.to_owned(), message: message.clone() });
        }
        match phase {
            "Attached" => Some(Ok(())),
            "Failed" => Some(Err(Error::Platform(format!(
                "{kind} {dev} could not be attached to {name}.{ns}: {message} (attachment {bda_name} is left for inspection; `kubectl vm disk detach {name}.{ns} {dev}` removes it)"
            )))),
            _ => None,
        }
    })
    .await
}

/// Detach device `disk` from VM `name`: delete our attachment of it.
pub async fn detach(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    disk: &str,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let vm = get_vm(cluster, ns, name).await?;
    let found = attachments(cluster, ns, Some(name))
        .await?
        .into_iter()
        .find(|b| {
            text(b, "/spec/blockDeviceRef/name") == disk || text(b, "/metadata/name") == disk
        });
    let Some(bda) = found else {
        if array(&vm, "/spec/blockDeviceRefs").any(|r| r["name"] == json!(disk)) {
            return Err(Error::Usage(format!(
                "{disk} is one of {name}.{ns}'s own block devices (spec.blockDeviceRefs), not hotplugged; remove it from the VM's spec instead"
            )));
        }
        return Err(Error::Usage(format!(
            "{name}.{ns} has no disk {disk:?} (see `kubectl vm disk list {name}.{ns}`)"
        )));
    };
    let bda_name = text(&bda, "/metadata/name").to_owned();
    if !is_ours(&bda) {
        return Err(Error::NotOurs(format!(
            "attachment {bda_name} of {disk} was not made by kubectl vm; it is left as it is (delete it with kubectl if you mean to)"
        )));
    }
    let dev = text(&bda, "/spec/blockDeviceRef/name").to_owned();
    let mut outcome = Outcome {
        vm: format!("{name}.{ns}"),
        disk: dev.clone(),
        object_ref: VMBDA.object_ref(&bda_name),
        object: Some(bda.clone()),
        waited: false,
        live: matches!(text(&vm, "/status/phase"), "Running" | "Migrating"),
    };
    if options.dry_run == DryRun::Client {
        return Ok(outcome);
    }
    let params = DeleteParams {
        dry_run: options.dry_run == DryRun::Server,
        preconditions: Some(Preconditions {
            uid: Some(text(&bda, "/metadata/uid").to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    VMBDA
        .api(&cluster.client, Some(ns))
        .delete(&bda_name, &params)
        .await
        .map_err(|e| cluster.error(e, &VMBDA.action("delete", Some(ns)).named(&bda_name)))?;
    if options.dry_run == DryRun::Server {
        return Ok(outcome);
    }
    on_event(Event::Accepted(format!(
        "deleted virtualmachineblockdeviceattachment/{bda_name}"
    )));
    if options.wait {
        let objects = [
            Watched::new(VMBDA, ns, &bda_name),
            Watched::new(DECKHOUSE_VM, ns, name),
        ];
        watch::until(cluster, &objects, |objs| {
            let listed = objs[1].as_ref().is_some_and(|v| {
                array(v, "/status/blockDeviceRefs")
                    .any(|r| r["name"] == json!(dev) && r["hotplugged"] == true)
            });
            (objs[0].is_none() && !listed).then_some(Ok(()))
        })
        .await?;
        outcome.waited = true;
    }
    Ok(outcome)
}

/// The merge patch that grows a VirtualDisk to `size`; `resource_version` makes it fail rather
/// than overwrite a change made since we read the disk.
pub fn disk_growth_patch(size: Quantity, resource_version: &str) -> Value {
    json!({"metadata": {"resourceVersion": resource_version},
        "spec": {"persistentVolumeClaim": {"size": size.to_string()}}})
}

/// Grow VirtualDisk `disk` of VM `name` to `size`: patch `spec.persistentVolumeClaim.size`,
/// then wait through phase `Resizing` back to `Ready` with the new `status.capacity`
/// (virtualization `pkg/controller/vd/internal/resizing.go`).
pub async fn resize(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    disk: &str,
    size: Quantity,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Resized> {
    let vm = get_vm(cluster, ns, name).await?;
    check_grows(cluster, &vm, ns, name, disk).await?;
    let Some(vd) = get_opt(cluster, VIRTUAL_DISK, ns, disk).await? else {
        return Err(Error::Usage(format!(
            "no VirtualDisk {disk:?} in namespace {ns:?}; nothing was changed"
        )));
    };
    let from = quantity_of(vd.pointer("/status/capacity"))
        .or_else(|| quantity_of(vd.pointer("/spec/persistentVolumeClaim/size")))
        .unwrap_or(Quantity::from_bytes(0));
    check_growth(disk, from, size)?;
    if text(&vd, "/status/phase") != "Ready" {
        return Err(Error::Usage(format!(
            "VirtualDisk {disk} is {}, not Ready: Deckhouse grows Ready disks only; nothing was changed",
            text(&vd, "/status/phase")
        )));
    }
    let class = [
        "/status/storageClassName",
        "/spec/persistentVolumeClaim/storageClassName",
    ]
    .iter()
    .map(|p| text(&vd, p))
    .find(|c| !c.is_empty())
    .unwrap_or("");
    check_expandable(cluster, disk, class).await?;
    let guest = if matches!(text(&vm, "/status/phase"), "Running" | "Migrating") {
        // Deckhouse grows a disk in use by a running VM online (its user guide, "Resizing disks").
        GuestSees::Now
    } else {
        GuestSees::AtNextStart
    };
    let patch = disk_growth_patch(size, text(&vd, "/metadata/resourceVersion"));
    let mut outcome = Resized {
        vm: format!("{name}.{ns}"),
        disk: disk.to_owned(),
        object_ref: VIRTUAL_DISK.object_ref(disk),
        object: None,
        from,
        to: size,
        waited: false,
        guest,
        pending: None,
    };
    if options.dry_run == DryRun::Client {
        outcome.object = Some(patch);
        return Ok(outcome);
    }
    outcome.object = Some(
        super::send_growth_patch(cluster, VIRTUAL_DISK, ns, disk, &patch, options.dry_run).await?,
    );
    if options.dry_run == DryRun::Server {
        return Ok(outcome);
    }
    on_event(Event::Accepted(format!(
        "virtualdisk/{disk} asks for {size}"
    )));
    if !options.wait {
        return Ok(outcome);
    }
    // The generation our change made: a disk observed at it and Ready again without the new
    // capacity has handed the growth to its claim, which (the VM stopped) waits for a pod.
    let generation = outcome
        .object
        .as_ref()
        .and_then(|o| o.pointer("/metadata/generation"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let stopped = guest == GuestSees::AtNextStart;
    let (mut disk_now, short) =
        wait_disk(cluster, ns, disk, size, stopped, generation, on_event).await?;
    if short {
        (disk_now, outcome.pending) =
            follow_claim(cluster, ns, disk, size, generation, disk_now, on_event).await?;
    }
    outcome.object = Some(disk_now);
    outcome.waited = true;
    Ok(outcome)
}

/// Refuses a disk the VM does not have, or one that is not a VirtualDisk (images are
/// read-only).
async fn check_grows(
    cluster: &Cluster,
    vm: &Value,
    ns: &str,
    name: &str,
    disk: &str,
) -> Result<()> {
    let own = array(vm, "/spec/blockDeviceRefs")
        .find(|r| r["name"] == json!(disk))
        .map(|r| text(r, "/kind").to_owned());
    let kind = match own {
        Some(k) => Some(k),
        None => attachments(cluster, ns, Some(name))
            .await?
            .into_iter()
            .find(|b| text(b, "/spec/blockDeviceRef/name") == disk)
            .map(|b| text(&b, "/spec/blockDeviceRef/kind").to_owned()),
    };
    match kind.as_deref() {
        None => Err(Error::Usage(format!(
            "{name}.{ns} has no disk {disk:?} (see `kubectl vm disk list {name}.{ns}`)"
        ))),
        Some("VirtualDisk") => Ok(()),
        Some(other) => Err(Error::Usage(format!(
            "{disk} of {name}.{ns} is a {other}, which is read-only: only a VirtualDisk grows"
        ))),
    }
}

/// The disk reported Ready short of the new size: follow its claim, which (the VM stopped)
/// may wait for a pod to finish growing. Returns the disk as last seen and what is still
/// pending, if anything.
async fn follow_claim(
    cluster: &Cluster,
    ns: &str,
    disk: &str,
    size: Quantity,
    generation: i64,
    mut disk_now: Value,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<(Value, Option<String>)> {
    let mut pending = None;
    let claim = text(&disk_now, "/status/target/persistentVolumeClaimName").to_owned();
    let readable = match get_opt(cluster, crate::api::PVC, ns, &claim).await {
        Ok(found) => found.is_some(),
        // A user who may not read claims still gets Deckhouse's own account below.
        Err(Error::Forbidden { .. }) => false,
        Err(e) => return Err(e),
    };
    if readable {
        let grown = super::growth::wait_claim(cluster, ns, &claim, size, true, on_event).await?;
        if grown.pending.is_some() {
            pending = grown.pending;
        } else {
            // The claim grew after all (a pod mounted it): the disk follows.
            disk_now = wait_disk(cluster, ns, disk, size, false, generation, on_event)
                .await?
                .0;
        }
    } else {
        pending = Some(format!(
            "Deckhouse reports VirtualDisk {disk} Ready at {}",
            text(&disk_now, "/status/capacity")
        ));
    }
    Ok((disk_now, pending))
}

/// Watch VirtualDisk `disk` through `Resizing` until it is `Ready` at `size` (`(disk, false)`)
/// or, with `stopped`, `Ready` at a smaller capacity once it observed `generation`
/// (`(disk, true)`: its claim holds the growth). A refusal (`ResizingNotAvailable`) is an error.
async fn wait_disk(
    cluster: &Cluster,
    ns: &str,
    disk: &str,
    size: Quantity,
    stopped: bool,
    generation: i64,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<(Value, bool)> {
    let mut last = String::new();
    watch::until(cluster, &[Watched::new(VIRTUAL_DISK, ns, disk)], |objs| {
        let Some(d) = objs[0].as_ref() else {
            return Some(Err(Error::Platform(format!(
                "VirtualDisk {disk} was deleted while it was growing"
            ))));
        };
        let phase = text(d, "/status/phase");
        let resizing = array(d, "/status/conditions").find(|c| c["type"] == "Resizing");
        let message = resizing
            .map(|c| text(c, "/message").to_owned())
            .unwrap_or_default();
        let seen = format!("{phase} {message}");
        if !phase.is_empty() && seen != last {
            last = seen;
            on_event(Event::Phase {
                phase: phase.to_owned(),
                message: message.clone(),
            });
        }
        if let Some(c) = resizing
            && c["status"] == "False"
            && text(c, "/reason") == "ResizingNotAvailable"
        {
            return Some(Err(Error::Platform(format!(
                "VirtualDisk {disk} cannot grow (Deckhouse: {message})"
            ))));
        }
        let settled = phase == "Ready" && resizing.is_none();
        let capacity = quantity_of(d.pointer("/status/capacity"));
        if settled && capacity.is_some_and(|c| c >= size) {
            return Some(Ok((d.clone(), false)));
        }
        let observed = d
            .pointer("/status/observedGeneration")
            .and_then(Value::as_i64)
            .is_some_and(|g| g >= generation);
        (settled && stopped && observed).then(|| Ok((d.clone(), true)))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_is_the_md5_of_the_uid() {
        // `printf %s 5f1c2d1e-7a37-4c57-9d6c-1b1f1b0a4d2e | md5sum`
        assert_eq!(
            serial_from_uid("5f1c2d1e-7a37-4c57-9d6c-1b1f1b0a4d2e"),
            "5aafc6b5db4deb7083696ae97f6e56c3"
        );
    }
}
