//! A VM's disks: list them, hotplug one into the VM and unplug it again.
//!
//! KubeVirt ([`kubevirt`]): `PUT …/virtualmachines/NAME/addvolume|removevolume` (FACTS §2;
//! the change is persisted in the VM's template, and a running VMI gets it live), progress from
//! the VMI's `status.volumeStatus`. Deckhouse ([`deckhouse`]): a
//! VirtualMachineBlockDeviceAttachment made here (labelled as ours), deleted with its uid as a
//! precondition on detach, progress from its `status.phase`. A new blank disk (`--size`) is a
//! DataVolume / VirtualDisk made here with create semantics. Progress is reported as
//! [`Event`]s; the caller renders them.
//!
//! Growing a disk ([`resize`]): KubeVirt patches the claim behind the disk
//! (`spec.resources.requests.storage`) and waits for its `status.capacity`; Deckhouse patches
//! the VirtualDisk's `spec.persistentVolumeClaim.size` and waits through phase `Resizing` back
//! to `Ready`. Both are refused before any change when the size is not larger or the
//! StorageClass has no `allowVolumeExpansion: true` (kube-apiserver's PersistentVolumeClaimResize
//! admission would refuse the claim's growth).

pub mod deckhouse;
mod growth;
pub mod kubevirt;

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

pub use crate::api::DryRun;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::quantity::Quantity;

/// What a disk comes from, as the user names it (`pvc/NAME`, `dv/NAME`, `vd/NAME`, `vi/NAME`,
/// `cvi/NAME`, or a bare NAME).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SourceKind {
    /// A bare name: KubeVirt a DataVolume if there is one, else a PVC; Deckhouse a VirtualDisk.
    Auto,
    /// A PersistentVolumeClaim (KubeVirt).
    Pvc,
    /// A CDI DataVolume (KubeVirt).
    DataVolume,
    /// A VirtualDisk (Deckhouse).
    VirtualDisk,
    /// A VirtualImage, attached read-only (Deckhouse).
    VirtualImage,
    /// A ClusterVirtualImage, attached read-only (Deckhouse).
    ClusterVirtualImage,
}

impl SourceKind {
    /// Whether the platform has this kind.
    pub fn on(self, flavor: Flavor) -> bool {
        self.prefix().is_none_or(|p| {
            crate::platform::of(flavor)
                .disk_source_prefixes
                .contains(&p)
        })
    }

    /// The short kind prefix (`pvc`, `dv`, `vd`, `vi`, `cvi`); `None` for a bare name.
    pub fn prefix(self) -> Option<&'static str> {
        match self {
            SourceKind::Auto => None,
            SourceKind::Pvc => Some("pvc"),
            SourceKind::DataVolume => Some("dv"),
            SourceKind::VirtualDisk => Some("vd"),
            SourceKind::VirtualImage => Some("vi"),
            SourceKind::ClusterVirtualImage => Some("cvi"),
        }
    }
}

/// Parse `[KIND/]NAME` for `flavor`. One line, exit 2 on bad input.
pub fn parse_source(text: &str, flavor: Flavor) -> Result<(SourceKind, String)> {
    let (kind, name) = parse_source_syntax(text)?;
    if !kind.on(flavor) {
        return Err(Error::Usage(format!(
            "disk {text:?}: {} has no such kind; use {}",
            flavor.display_name(),
            crate::platform::of(flavor).disk_source_hint
        )));
    }
    Ok((kind, name))
}

/// What [`parse_source`] checks without knowing the platform (the kind prefix is known, the
/// name a DNS-1123 subdomain): checked before the first request.
pub fn parse_source_syntax(text: &str) -> Result<(SourceKind, String)> {
    let (kind, name) = match text.split_once('/') {
        None => (SourceKind::Auto, text),
        Some((k, n)) => {
            let kind = match k {
                "pvc" | "persistentvolumeclaim" => SourceKind::Pvc,
                "dv" | "datavolume" => SourceKind::DataVolume,
                "vd" | "virtualdisk" => SourceKind::VirtualDisk,
                "vi" | "virtualimage" => SourceKind::VirtualImage,
                "cvi" | "clustervirtualimage" => SourceKind::ClusterVirtualImage,
                other => {
                    return Err(Error::Usage(format!(
                        "disk {text:?}: unknown kind {other:?}; use pvc/, dv/ (KubeVirt) or vd/, vi/, cvi/ (Deckhouse)"
                    )));
                }
            };
            (kind, n)
        }
    };
    crate::validate::dns_subdomain("disk", name).map_err(|e| Error::Usage(e.to_string()))?;
    Ok((kind, name.to_owned()))
}

/// The bus of a hotplugged disk (KubeVirt hotplugs `scsi` and `virtio` disks; Deckhouse always
/// uses SCSI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bus {
    /// SCSI (the default, as virtctl's).
    Scsi,
    /// virtio-blk.
    Virtio,
}

impl Bus {
    /// The KubeVirt name.
    pub fn as_str(self) -> &'static str {
        match self {
            Bus::Scsi => "scsi",
            Bus::Virtio => "virtio",
        }
    }
}

/// What to attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRequest {
    /// The source's kind.
    pub kind: SourceKind,
    /// The source's name (the new disk's, with `size`).
    pub name: String,
    /// Make a new blank disk of this size first.
    pub size: Option<Quantity>,
    /// The new disk's StorageClass.
    pub storage_class: Option<String>,
    /// KubeVirt: the volume's name in the VM (default: the source's name).
    pub volume: Option<String>,
    /// KubeVirt: the disk's bus.
    pub bus: Bus,
    /// KubeVirt: the serial the guest sees (default: the volume's name when it fits).
    pub serial: Option<String>,
    /// Attach read-only (images are always read-only).
    pub read_only: bool,
}

/// Longest serial QEMU passes to a virtio-blk disk (`VIRTIO_BLK_ID_BYTES`).
pub const MAX_SERIAL: usize = 20;

/// Whether `serial` is one KubeVirt accepts (`^[A-Za-z0-9_.+-]+$`, vmi-create-admitter) and
/// the guest sees whole.
pub fn valid_serial(serial: &str) -> bool {
    !serial.is_empty()
        && serial.len() <= MAX_SERIAL
        && serial
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
}

impl AttachRequest {
    /// The volume's name in the VM.
    pub fn volume_name(&self) -> &str {
        self.volume.as_deref().unwrap_or(&self.name)
    }

    /// The serial to set: the given one, else the volume's name when it is a valid serial.
    pub fn serial(&self) -> Option<String> {
        match &self.serial {
            Some(s) => Some(s.clone()),
            None => Some(self.volume_name().to_owned()).filter(|s| valid_serial(s)),
        }
    }

    /// The checks that need no platform (the volume name, the serial, a size above 0): made
    /// before the first request.
    pub fn validate_local(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Usage(m));
        if let Some(v) = &self.volume {
            crate::validate::dns_label("volume", v).map_err(|e| Error::Usage(e.to_string()))?;
        }
        if let Some(s) = &self.serial
            && !valid_serial(s)
        {
            return bad(format!(
                "serial {s:?}: use at most {MAX_SERIAL} of A-Z a-z 0-9 _ . + -"
            ));
        }
        match self.size {
            Some(size) if size.bytes() == 0 => bad("--size must be more than 0".into()),
            None if self.storage_class.is_some() => {
                bad("--storage-class goes with --size (a new disk)".into())
            }
            _ => Ok(()),
        }
    }

    /// Check everything that needs no request, for `flavor`. One line, exit 2.
    pub fn validate(&self, flavor: Flavor) -> Result<()> {
        let bad = |m: String| Err(Error::Usage(m));
        self.validate_local()?;
        if !self.kind.on(flavor) {
            return bad(format!(
                "{:?} is not a disk kind of {}",
                self.kind,
                flavor.display_name()
            ));
        }
        if self.size.is_some()
            && !matches!(
                self.kind,
                SourceKind::Auto | SourceKind::DataVolume | SourceKind::VirtualDisk
            )
        {
            let caps = crate::platform::of(flavor);
            return bad(format!(
                "--size makes a new {}; name it NAME or {}/NAME",
                caps.disk.kind, caps.new_disk_prefix
            ));
        }
        let caps = crate::platform::of(flavor);
        if let Some(why) = caps.disk_device_options.reason()
            && (self.volume.is_some() || self.serial.is_some() || self.bus != Bus::Scsi)
        {
            return bad(why.into());
        }
        if let Some(why) = caps.read_only_disks.reason()
            && self.read_only
            && self.kind != SourceKind::VirtualImage
            && self.kind != SourceKind::ClusterVirtualImage
        {
            return bad(why.into());
        }
        Ok(())
    }
}

/// How to run an attach or detach.
#[derive(Debug, Clone)]
pub struct Options {
    /// Dry run strategy.
    pub dry_run: DryRun,
    /// Wait until the platform says attached / detached.
    pub wait: bool,
    /// How long to wait.
    pub timeout: Duration,
}

/// One disk of a VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// The disk's name in the VM (KubeVirt: the volume's; Deckhouse: the device's).
    pub name: String,
    /// What it is: `pvc/NAME`, `dv/NAME`, `containerDisk`, `cloudInitNoCloud`, `vd/NAME`, …
    pub source: String,
    /// Bus (`virtio`, `scsi`, `sata`, `cdrom`, …), where known.
    pub bus: String,
    /// Size, where known.
    pub size: String,
    /// The serial the guest sees, if set.
    pub serial: String,
    /// The guest's device name (`vda`, `sda`), where known.
    pub target: String,
    /// Whether it was hotplugged (not part of how the VM starts).
    pub hotplugged: bool,
    /// Read-only.
    pub read_only: bool,
    /// Attachment state: `Ready`/`Attached`, a hotplug phase, `Pending`, or `-` when the VM does
    /// not run.
    pub state: String,
}

/// Progress of an attach or detach.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An object was made (or would be, with a dry run): `kind/name`.
    Created(String),
    /// The platform accepted the request.
    Accepted(String),
    /// An object this run made was deleted again because a later step failed: `kind/name`.
    Removed(String),
    /// The attachment moved on: phase and the platform's message.
    Phase {
        /// e.g. `AttachedToNode`, `InProgress`.
        phase: String,
        /// The platform's message, if any.
        message: String,
    },
}

/// What an attach or detach did.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// `NAME.NAMESPACE` of the VM.
    pub vm: String,
    /// The disk's name in the VM.
    pub disk: String,
    /// The object that represents the attachment (`kind.group/name`), for `-o name`.
    pub object_ref: String,
    /// The object after the change (the VM on KubeVirt, the VMBDA on Deckhouse); with a dry
    /// run the request instead (KubeVirt's AddVolumeOptions / RemoveVolumeOptions, the VMBDA).
    pub object: Option<Value>,
    /// Whether the wait ran to the end state.
    pub waited: bool,
    /// Whether the VM runs, so the change is live (else it applies at the next start).
    pub live: bool,
}

/// When the guest sees a grown disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestSees {
    /// The running guest sees the new size now.
    Now,
    /// The VM runs, but the guest sees the new size only after a restart.
    AfterRestart,
    /// The VM does not run: it starts with the new size.
    AtNextStart,
}

/// What a resize did.
#[derive(Debug, Clone, PartialEq)]
pub struct Resized {
    /// `NAME.NAMESPACE` of the VM.
    pub vm: String,
    /// The disk's name in the VM.
    pub disk: String,
    /// The object that was grown (`persistentvolumeclaim/NAME`, `virtualdisk.…/NAME`).
    pub object_ref: String,
    /// That object after the change; with a dry run the patch (client) or the object as the
    /// server would store it (server).
    pub object: Option<Value>,
    /// The size before.
    pub from: Quantity,
    /// The size asked for.
    pub to: Quantity,
    /// Whether the wait ran to the new capacity.
    pub waited: bool,
    /// When the guest sees it.
    pub guest: GuestSees,
    /// Set when the wait ended with the storage grown but the new size held for the VM's next
    /// start (the claim waits for a pod to mount it): the platform's words for it.
    pub pending: Option<String>,
}

/// Refuse a size that does not grow the disk. One line, exit 2.
pub fn check_growth(disk: &str, current: Quantity, wanted: Quantity) -> Result<()> {
    if wanted <= current {
        return Err(Error::Usage(format!(
            "--size {wanted} is not larger than disk {disk}'s {current}: a disk only grows (nothing was changed)"
        )));
    }
    Ok(())
}

/// Refuse growing a claim of StorageClass `class` unless it has `allowVolumeExpansion: true`
/// (what kube-apiserver's PersistentVolumeClaimResize admission checks). A class we may not read
/// is left to the server to judge.
pub(crate) async fn check_expandable(cluster: &Cluster, disk: &str, class: &str) -> Result<()> {
    let refuse = |why: String| {
        Err(Error::Usage(format!(
            "disk {disk} cannot grow: {why}; nothing was changed"
        )))
    };
    if class.is_empty() {
        return refuse(
            "its claim has no StorageClass (only dynamically provisioned claims grow)".into(),
        );
    }
    let api = STORAGE_CLASS.api(&cluster.client, None);
    match api.get_opt(class).await {
        Ok(Some(sc)) => {
            let sc = serde_json::to_value(sc).unwrap_or_default();
            if sc.get("allowVolumeExpansion") == Some(&Value::Bool(true)) {
                Ok(())
            } else {
                refuse(format!(
                    "StorageClass {class} does not allow volume expansion (allowVolumeExpansion is not true)"
                ))
            }
        }
        Ok(None) => refuse(format!("its StorageClass {class} does not exist")),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        Err(e) => Err(cluster.error(e, &STORAGE_CLASS.action("get", None).named(class))),
    }
}

/// The StorageClass kind (cluster-scoped).
pub const STORAGE_CLASS: crate::api::Kind = crate::api::Kind {
    group: "storage.k8s.io",
    version: "v1",
    kind: "StorageClass",
    plural: "storageclasses",
    namespaced: false,
};

/// A quantity in JSON (a string or a number), as bytes.
pub(crate) fn quantity_of(v: Option<&Value>) -> Option<Quantity> {
    let text = quantity_text(v);
    Quantity::parse(&text).ok()
}

/// Grow disk `disk` (its name in the VM, or its claim's / VirtualDisk's name) of VM `name` to
/// `size`.
#[allow(clippy::too_many_arguments)]
pub async fn resize(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    name: &str,
    disk: &str,
    size: Quantity,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Resized> {
    let last = std::sync::Mutex::new(String::new());
    let on_event = remembering(&last, on_event);
    let what = format!("disk {disk} of {name}.{namespace} to grow to {size}");
    let work = async {
        match flavor {
            Flavor::KubeVirt => {
                kubevirt::resize(cluster, namespace, name, disk, size, options, &on_event).await
            }
            Flavor::Deckhouse => {
                deckhouse::resize(cluster, namespace, name, disk, size, options, &on_event).await
            }
        }
    };
    bounded(options, work, &what, &last).await
}

/// List the disks of VM `name`.
pub async fn list(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    name: &str,
) -> Result<Vec<Disk>> {
    match flavor {
        Flavor::KubeVirt => kubevirt::list(cluster, namespace, name).await,
        Flavor::Deckhouse => deckhouse::list(cluster, namespace, name).await,
    }
}

/// Attach a disk to VM `name`.
pub async fn attach(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    name: &str,
    request: &AttachRequest,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    request.validate(flavor)?;
    let last = std::sync::Mutex::new(String::new());
    let on_event = remembering(&last, on_event);
    let what = format!(
        "{} to be attached to {name}.{namespace}",
        request.volume_name()
    );
    let work = async {
        match flavor {
            Flavor::KubeVirt => {
                kubevirt::attach(cluster, namespace, name, request, options, &on_event).await
            }
            Flavor::Deckhouse => {
                deckhouse::attach(cluster, namespace, name, request, options, &on_event).await
            }
        }
    };
    bounded(options, work, &what, &last).await
}

/// Detach disk `disk` (its name in the VM, or its source's name) from VM `name`.
pub async fn detach(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    name: &str,
    disk: &str,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let last = std::sync::Mutex::new(String::new());
    let on_event = remembering(&last, on_event);
    let what = format!("{disk} to be detached from {name}.{namespace}");
    let work = async {
        match flavor {
            Flavor::KubeVirt => {
                kubevirt::detach(cluster, namespace, name, disk, options, &on_event).await
            }
            Flavor::Deckhouse => {
                deckhouse::detach(cluster, namespace, name, disk, options, &on_event).await
            }
        }
    };
    bounded(options, work, &what, &last).await
}

/// `on_event`, keeping the last phase and message in `last` for the timeout's message (a
/// hotplug that cannot go on stays in its phase with the platform's reason).
fn remembering<'a>(
    last: &'a std::sync::Mutex<String>,
    on_event: &'a (dyn Fn(Event) + Send + Sync),
) -> impl Fn(Event) + Send + Sync + 'a {
    move |event: Event| {
        if let Event::Phase { phase, message } = &event {
            let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
            *l = if message.is_empty() {
                phase.clone()
            } else {
                format!("{phase}: {message}")
            };
        }
        on_event(event)
    }
}

async fn bounded<T>(
    options: &Options,
    work: impl Future<Output = Result<T>>,
    what: &str,
    last: &std::sync::Mutex<String>,
) -> Result<T> {
    match tokio::time::timeout(options.timeout, work).await {
        Ok(result) => result,
        Err(_) => {
            let last = last.lock().unwrap_or_else(|e| e.into_inner()).clone();
            Err(Error::Timeout(format!(
                "{what} (after {}s{}; raise --timeout, or pass --no-wait)",
                options.timeout.as_secs(),
                if last.is_empty() {
                    String::new()
                } else {
                    format!("; last state {last}")
                }
            )))
        }
    }
}

/// `s` at `pointer` in `obj`, or "".
pub(crate) fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// A quantity as JSON (a string or a number) in text.
pub(crate) fn quantity_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// Sends the merge patch that grows a disk (a PVC or a VirtualDisk), as a server dry run when
/// asked, and returns the object as the server answered.
async fn send_growth_patch(
    cluster: &Cluster,
    kind: crate::api::Kind,
    ns: &str,
    name: &str,
    patch: &Value,
    dry_run: DryRun,
) -> Result<Value> {
    let params = kube::api::PatchParams {
        dry_run: dry_run == DryRun::Server,
        ..Default::default()
    };
    let patched = kind
        .api(&cluster.client, Some(ns))
        .patch(name, &params, &kube::api::Patch::Merge(patch))
        .await
        .map_err(|e| cluster.error(e, &kind.action("patch", Some(ns)).named(name)))?;
    Ok(serde_json::to_value(patched).unwrap_or_default())
}

/// Deletes `name` of `kind`, made by this run (its `uid`), after a later step failed: an attach
/// is all or nothing. The uid precondition leaves an object someone else made meanwhile alone.
pub(crate) async fn remove_created(
    cluster: &crate::cluster::Cluster,
    kind: crate::api::Kind,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<()> {
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..kube::api::DeleteParams::background()
    };
    match kind
        .api(&cluster.client, Some(ns))
        .delete(name, &params)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(cluster.error(e, &kind.action("delete", Some(ns)).named(name))),
    }
}

/// The disks `disk attach` takes in the cluster's namespace (and cluster-wide images), as
/// shell completion offers them: each name with the prefix its kind is written with
/// ([`Capabilities::attachable_disks`](crate::platform::Capabilities::attachable_disks)) and
/// the kind. A kind that cannot be listed is left out: completion says nothing rather than fail.
pub async fn attachable_names(cluster: &Cluster, flavor: Flavor) -> Vec<(String, &'static str)> {
    let mut out: Vec<(String, &'static str)> = Vec::new();
    for (kind, prefix) in crate::platform::of(flavor).attachable_disks {
        let ns = kind.namespaced.then_some(cluster.namespace.as_str());
        let Ok(list) = kind
            .api(&cluster.client, ns)
            .list_metadata(&Default::default())
            .await
        else {
            continue;
        };
        for name in list.items.into_iter().filter_map(|o| o.metadata.name) {
            let value = format!("{prefix}{name}");
            if !out.iter().any(|(v, _)| *v == value) {
                out.push((value, kind.kind));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_parsed_per_platform() {
        assert_eq!(
            parse_source("pvc/data", Flavor::KubeVirt).unwrap(),
            (SourceKind::Pvc, "data".into())
        );
        assert_eq!(
            parse_source("data", Flavor::Deckhouse).unwrap(),
            (SourceKind::Auto, "data".into())
        );
        assert!(matches!(
            parse_source("vd/data", Flavor::KubeVirt),
            Err(Error::Usage(_))
        ));
        assert!(matches!(
            parse_source("xx/data", Flavor::KubeVirt),
            Err(Error::Usage(_))
        ));
        assert!(matches!(
            parse_source("pvc/Data_1", Flavor::KubeVirt),
            Err(Error::Usage(_))
        ));
    }

    #[test]
    fn a_disk_only_grows() {
        let gi = |n: u64| Quantity::from_bytes(n << 30);
        assert!(check_growth("data", gi(1), gi(2)).is_ok());
        for wanted in [gi(1), Quantity::from_bytes(1)] {
            assert!(matches!(
                check_growth("data", gi(1), wanted),
                Err(Error::Usage(_))
            ));
        }
        assert_eq!(
            quantity_of(Some(&serde_json::json!("1536Mi"))),
            Some(Quantity::from_bytes(3 << 29))
        );
        assert_eq!(quantity_of(None), None);
    }

    #[test]
    fn growth_patches_carry_the_size_and_the_resource_version() {
        let size = Quantity::parse("20Gi").unwrap();
        assert_eq!(
            kubevirt::claim_growth_patch(size, "42"),
            serde_json::json!({"metadata": {"resourceVersion": "42"},
                "spec": {"resources": {"requests": {"storage": "20Gi"}}}})
        );
        assert_eq!(
            deckhouse::disk_growth_patch(size, "7"),
            serde_json::json!({"metadata": {"resourceVersion": "7"},
                "spec": {"persistentVolumeClaim": {"size": "20Gi"}}})
        );
    }

    #[test]
    fn requests_are_checked_locally() {
        let base = AttachRequest {
            kind: SourceKind::Auto,
            name: "data".into(),
            size: None,
            storage_class: None,
            volume: None,
            bus: Bus::Scsi,
            serial: None,
            read_only: false,
        };
        assert!(base.validate(Flavor::KubeVirt).is_ok());
        assert_eq!(base.serial().as_deref(), Some("data"));
        let long = AttachRequest {
            volume: Some("a-very-long-volume-name-x".into()),
            ..base.clone()
        };
        assert_eq!(long.serial(), None);
        for bad in [
            AttachRequest {
                serial: Some("has space".into()),
                ..base.clone()
            },
            AttachRequest {
                storage_class: Some("x".into()),
                ..base.clone()
            },
            AttachRequest {
                size: Some(Quantity::from_bytes(0)),
                ..base.clone()
            },
            AttachRequest {
                kind: SourceKind::Pvc,
                size: Some(Quantity::from_bytes(1 << 30)),
                ..base.clone()
            },
        ] {
            assert!(
                matches!(bad.validate(Flavor::KubeVirt), Err(Error::Usage(_))),
                "{bad:?}"
            );
        }
        let dh = AttachRequest {
            bus: Bus::Virtio,
            ..base.clone()
        };
        assert!(matches!(
            dh.validate(Flavor::Deckhouse),
            Err(Error::Usage(_))
        ));
        let ro = AttachRequest {
            read_only: true,
            ..base
        };
        assert!(matches!(
            ro.validate(Flavor::Deckhouse),
            Err(Error::Usage(_))
        ));
    }
}
