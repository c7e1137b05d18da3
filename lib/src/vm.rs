//! Virtual machines of both platforms read into one shape: [`VmSummary`] for `list`,
//! [`VmDetails`] for `get`, and a watch that reports changed summaries.
//!
//! KubeVirt keeps the runtime state (node, IP, guest agent) on the VirtualMachineInstance, so
//! its VMs are joined with their instances; Deckhouse reports all of it on the VM.

use kube::api::{DynamicObject, ListParams};
use serde_json::Value;

use crate::api::{EVENT, KUBEVIRT_VMI, Kind};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::{Flavor, Platform};
use crate::target::{Target, TargetKind};

mod paged;
mod watch;
pub use paged::{Detail, PAGE_SIZE, Versions, list_pages};
pub(crate) use watch::restartable_watch;
pub use watch::{VmChange, watch};

/// Where to look for VMs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// One namespace.
    Namespace(String),
    /// Every namespace (`-A`).
    AllNamespaces,
}

impl Scope {
    fn namespace(&self) -> Option<&str> {
        match self {
            Scope::Namespace(ns) => Some(ns),
            Scope::AllNamespaces => None,
        }
    }
}

/// One VM as `list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct VmSummary {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Status as the platform prints it (`Running`, `Stopped`, `Provisioning`, …).
    pub status: String,
    /// Node the VM runs on.
    pub node: Option<String>,
    /// First IP address.
    pub ip: Option<String>,
    /// Creation time.
    pub created: Option<jiff::Timestamp>,
    /// CPU cores.
    pub cpu: Option<String>,
    /// Memory size.
    pub memory: Option<String>,
    /// Deckhouse: the guaranteed share of CPU time, as applied (`.status.resources.cpu.coreFraction`,
    /// the CRD's CoreFraction column) or else as asked (`.spec.cpu.coreFraction`); `None` on
    /// KubeVirt, or when neither says (the class default then applies).
    pub core_fraction: Option<String>,
    /// Whether the guest agent is connected (`None`: not running or unknown).
    pub agent: Option<bool>,
    /// Whether the VM can be live-migrated (`None`: not running or unknown).
    pub migratable: Option<bool>,
    /// KubeVirt run strategy or Deckhouse run policy.
    pub run_strategy: Option<String>,
    /// The pool the VM is a replica of: the VirtualMachinePool controlling it (KubeVirt) or
    /// its [`crate::names::POOL_LABEL`] label (Deckhouse pools made by `create`).
    pub pool: Option<String>,
    /// How its guest trusts SSH.
    pub trust: TrustState,
    /// The VM object as the server returned it; with [`Detail::Row`] only the fields a row
    /// needs.
    pub object: Value,
}

/// A page of VMs plus the resource version to watch from.
#[derive(Debug, Clone)]
pub struct VmList {
    /// The VMs, sorted by namespace and name.
    pub items: Vec<VmSummary>,
    /// Resource version of the VM list.
    pub resource_version: Option<String>,
    /// Resource version of the instance list (KubeVirt only).
    pub instance_resource_version: Option<String>,
}

/// A condition line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// Condition type.
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    pub reason: Option<String>,
    /// Human message.
    pub message: Option<String>,
}

/// A disk of the VM.
#[derive(Debug, Clone, PartialEq)]
pub struct Disk {
    /// Disk (volume or block device) name.
    pub name: String,
    /// Where its data comes from, e.g. `DataVolume web-root` or `VirtualDisk web-root`.
    pub source: String,
    /// Size, when known.
    pub size: Option<String>,
    /// The import of a disk the platform provisions (DataVolume, VirtualDisk): its phase and
    /// progress, as `create --wait` reports them.
    pub import: Option<crate::wait::DiskProgress>,
}

/// An event about the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLine {
    /// `Normal` or `Warning`.
    pub type_: String,
    /// Reason.
    pub reason: String,
    /// When it last happened.
    pub last_seen: Option<jiff::Timestamp>,
    /// Message.
    pub message: String,
}

/// One VM as `get` shows it.
#[derive(Debug, Clone)]
pub struct VmDetails {
    /// The summary fields.
    pub summary: VmSummary,
    /// The platform.
    pub flavor: Flavor,
    /// VM conditions (and instance conditions on KubeVirt).
    pub conditions: Vec<Condition>,
    /// Network interfaces: what the VM asks for joined by name with what the running
    /// machine reports ([`crate::network`]).
    pub interfaces: Vec<crate::network::NetInterface>,
    /// Guest OS as the agent reports it.
    pub guest_os: Option<String>,
    /// How the guest trusts SSH certificates, for VMs kubectl-vm created (see [`ssh_trust`]).
    pub ssh_trust: Option<String>,
    /// Disks.
    pub disks: Vec<Disk>,
    /// Recent events, oldest first (empty when events cannot be read).
    pub events: Vec<EventLine>,
    /// The instance object (KubeVirt, when running).
    pub instance: Option<Value>,
    /// Where it may run: `(what, value)` lines of its placement ([`crate::placement::summary`]).
    pub placement: Vec<(&'static str, String)>,
    /// Why it cannot be scheduled, as the scheduler says it (from the platform's condition).
    pub unschedulable: Option<String>,
}

/// The value KubeVirt gives the `vm.kubevirt.io/name` label of a VM's virt-launcher pod: the
/// template's `spec.hostname`, else the VM's name up to its first dot, cut to 63 characters
/// (kubevirt `pkg/util/net/dns` SanitizeHostname, applied in `pkg/virt-controller/services/
/// template.go`). Two VMs can share it, so a selector on it alone may match both.
pub fn kubevirt_launcher_host_label(vm: &Value) -> String {
    if let Some(hostname) = vm
        .pointer("/spec/template/spec/hostname")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty())
    {
        return hostname.to_owned();
    }
    let name = vm
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    name.split('.')
        .next()
        .unwrap_or(name)
        .chars()
        .take(63)
        .collect()
}

/// How a VM's guest trusts SSH, from the VM's label and annotation (the TRUST column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustState {
    /// Made by kubectl-vm with VM-scoped trust: its guest accepts only certificates naming it
    /// (`LOGIN@NAME.NAMESPACE`), and the platform vouches for its host (a host certificate of
    /// the CA is the only proof `ssh`, `scp` and `ssh-config` accept).
    VmScoped,
    /// Made by kubectl-vm before VM-scoped trust: its guest would accept any certificate of the
    /// CA for the login, but the signer issues only VM-scoped ones, so no certificate opens it
    /// until `kubectl vm ca migrate` and a restart.
    Legacy,
    /// Not made by kubectl-vm, enrolled (`kubectl vm enroll`): certificates naming it, host key
    /// trusted on first use.
    Enrolled,
    /// No platform SSH trust.
    None,
}

impl TrustState {
    /// Read it from a VM object of either platform.
    pub fn of(vm: &Value) -> TrustState {
        let meta = &vm["metadata"];
        let ours = meta["labels"][crate::names::MANAGED_BY_LABEL] == crate::names::MANAGED_BY;
        let trust = &meta["annotations"][crate::names::TRUST_ANNOTATION];
        let scoped = *trust == crate::names::TRUST_VM_SCOPED;
        match (ours, scoped) {
            (true, true) => TrustState::VmScoped,
            (true, false) if trust.is_null() => TrustState::Legacy,
            (false, true) => TrustState::Enrolled,
            _ => TrustState::None,
        }
    }

    /// The TRUST column: `vm-scoped`, `legacy`, `enrolled` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            TrustState::VmScoped => "vm-scoped",
            TrustState::Legacy => "legacy",
            TrustState::Enrolled => "enrolled",
            TrustState::None => "none",
        }
    }

    /// Whether the platform vouches for the VM's host: only a host certificate of the CA
    /// proves it (no known_hosts, no trust on first use).
    pub fn platform_vouches(self) -> bool {
        self == TrustState::VmScoped
    }
}

/// What `get` says of the VM's SSH trust (see [`TrustState`]); `None` when it has none.
pub fn ssh_trust(vm: &Value) -> Option<String> {
    match TrustState::of(vm) {
        TrustState::VmScoped => Some(
            "vm-scoped: certificates for LOGIN@NAME.NAMESPACE only; host proven by its host certificate".into(),
        ),
        TrustState::Legacy => Some(
            "legacy: made before VM-scoped trust; no certificate opens it until `kubectl vm ca migrate` and a restart".into(),
        ),
        TrustState::Enrolled => Some(
            "enrolled: certificates for LOGIN@NAME.NAMESPACE only; host key trusted on first use".into(),
        ),
        TrustState::None => None,
    }
}

fn text(value: &Value, pointer: &str) -> Option<String> {
    match value.pointer(pointer)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn timestamp(value: &Value, pointer: &str) -> Option<jiff::Timestamp> {
    value.pointer(pointer)?.as_str()?.parse().ok()
}

fn condition_status(object: &Value, type_: &str) -> Option<bool> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
        .and_then(|c| c.get("status")?.as_str())
        .map(|s| s == "True")
}

fn conditions(object: &Value) -> Vec<Condition> {
    let Some(list) = object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .map(|c| Condition {
            type_: text(c, "/type").unwrap_or_default(),
            status: text(c, "/status").unwrap_or_else(|| "Unknown".into()),
            reason: text(c, "/reason"),
            message: text(c, "/message"),
        })
        .collect()
}

/// The pool of a VM: its controlling VirtualMachinePool, else its pool label.
fn pool_of(vm: &Value) -> Option<String> {
    vm.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|r| r["controller"] == true && r["kind"] == "VirtualMachinePool")
        .and_then(|r| r["name"].as_str())
        .or_else(|| vm["metadata"]["labels"][crate::names::POOL_LABEL].as_str())
        .map(str::to_owned)
}

/// Summarise a KubeVirt VM and its instance (if it has one).
pub fn summarize_kubevirt(vm: &Value, vmi: Option<&Value>) -> VmSummary {
    // The instance has the effective values (instancetypes expanded); the VM's template
    // fills in what the instance does not say, and is all there is while stopped.
    let domains: Vec<&Value> = [
        vmi.and_then(|i| i.pointer("/spec/domain")),
        vm.pointer("/spec/template/spec/domain"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let cpu = domains.iter().find_map(|d| {
        let count = |field: &str| d.pointer(&format!("/cpu/{field}")).and_then(Value::as_u64);
        match (count("cores"), count("sockets"), count("threads")) {
            (None, None, None) => text(d, "/resources/requests/cpu"),
            (cores, sockets, threads) => {
                Some((cores.unwrap_or(1) * sockets.unwrap_or(1) * threads.unwrap_or(1)).to_string())
            }
        }
    });
    let memory = domains
        .iter()
        .find_map(|d| text(d, "/memory/guest").or_else(|| text(d, "/resources/requests/memory")));
    let run_strategy = text(vm, "/spec/runStrategy").or_else(|| {
        vm.pointer("/spec/running")
            .and_then(Value::as_bool)
            .map(|running| if running { "Always" } else { "Halted" }.to_owned())
    });
    VmSummary {
        namespace: text(vm, "/metadata/namespace").unwrap_or_default(),
        name: text(vm, "/metadata/name").unwrap_or_default(),
        status: text(vm, "/status/printableStatus")
            .or_else(|| vmi.and_then(|i| text(i, "/status/phase")))
            .unwrap_or_else(|| "Unknown".into()),
        node: vmi.and_then(|i| text(i, "/status/nodeName")),
        ip: vmi.and_then(|i| text(i, "/status/interfaces/0/ipAddress")),
        created: timestamp(vm, "/metadata/creationTimestamp"),
        cpu,
        memory,
        core_fraction: None,
        agent: vmi.map(|i| condition_status(i, "AgentConnected").unwrap_or(false)),
        migratable: vmi.map(|i| condition_status(i, "LiveMigratable").unwrap_or(false)),
        run_strategy,
        pool: pool_of(vm),
        trust: TrustState::of(vm),
        object: vm.clone(),
    }
}

/// Summarise a Deckhouse VM.
pub fn summarize_deckhouse(vm: &Value) -> VmSummary {
    let running = matches!(
        text(vm, "/status/phase").as_deref(),
        Some("Running" | "Migrating" | "Pause" | "Degraded")
    );
    VmSummary {
        namespace: text(vm, "/metadata/namespace").unwrap_or_default(),
        name: text(vm, "/metadata/name").unwrap_or_default(),
        status: text(vm, "/status/phase").unwrap_or_else(|| "Pending".into()),
        node: text(vm, "/status/nodeName"),
        ip: text(vm, "/status/ipAddress"),
        created: timestamp(vm, "/metadata/creationTimestamp"),
        cpu: text(vm, "/status/resources/cpu/cores").or_else(|| text(vm, "/spec/cpu/cores")),
        memory: text(vm, "/status/resources/memory/size").or_else(|| text(vm, "/spec/memory/size")),
        core_fraction: text(vm, "/status/resources/cpu/coreFraction")
            .or_else(|| text(vm, "/spec/cpu/coreFraction")),
        agent: running.then(|| condition_status(vm, "AgentReady").unwrap_or(false)),
        migratable: running.then(|| condition_status(vm, "Migratable").unwrap_or(false)),
        run_strategy: text(vm, "/spec/runPolicy"),
        pool: pool_of(vm),
        trust: TrustState::of(vm),
        object: vm.clone(),
    }
}

fn to_value(object: DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

fn key(object: &Value) -> (String, String) {
    (
        text(object, "/metadata/namespace").unwrap_or_default(),
        text(object, "/metadata/name").unwrap_or_default(),
    )
}

/// List the VMs in scope, optionally filtered by a label selector: whole objects, sorted by
/// namespace and name, read a page at a time (see [`list_pages`]).
pub async fn list(
    cluster: &Cluster,
    platform: &Platform,
    scope: &Scope,
    selector: Option<&str>,
) -> Result<VmList> {
    let mut items = Vec::new();
    let versions = list_pages(cluster, platform, scope, selector, Detail::Object, |page| {
        items.extend(page);
        Ok::<(), Error>(())
    })
    .await?;
    items.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(VmList {
        items,
        resource_version: versions.vms,
        instance_resource_version: versions.instances,
    })
}

/// Read one VM in detail: status, conditions, interfaces, guest OS, disks and events.
/// A `vmi/NAME` target (KubeVirt) also finds an instance that has no VM.
pub async fn get(
    cluster: &Cluster,
    platform: &Platform,
    target: &Target,
    namespace: &str,
) -> Result<VmDetails> {
    let name = target.name.as_str();
    let vm_kind = Kind::vm(platform.flavor);
    if target.kind == TargetKind::Vmi && crate::platform::of(platform.flavor).instance.is_none() {
        return Err(Error::InvalidTarget(format!(
            "target {target}: Deckhouse virtualization has no VirtualMachineInstance; use vm/{name}"
        )));
    }
    let vm = vm_kind
        .api(&cluster.client, Some(namespace))
        .get_opt(name)
        .await
        .map_err(|e| cluster.error(e, &vm_kind.action("get", Some(namespace)).named(name)))?
        .map(to_value);
    let (events, vmi) = match platform.flavor {
        Flavor::Deckhouse => (events_for(cluster, name, namespace).await, None),
        Flavor::KubeVirt => {
            let vmi_api = KUBEVIRT_VMI.api(&cluster.client, Some(namespace));
            let (events, vmi) =
                tokio::join!(events_for(cluster, name, namespace), vmi_api.get_opt(name));
            let vmi = vmi.map_err(|e| {
                cluster.error(e, &KUBEVIRT_VMI.action("get", Some(namespace)).named(name))
            })?;
            (events, vmi.map(to_value))
        }
    };
    let mut details = match (platform.flavor, vm, vmi) {
        (Flavor::Deckhouse, Some(vm), _) => deckhouse_details(&vm, events),
        (Flavor::KubeVirt, Some(vm), vmi) => kubevirt_details(&vm, vmi, events),
        (Flavor::KubeVirt, None, Some(vmi)) if target.kind == TargetKind::Vmi => {
            kubevirt_details(&vmi, Some(vmi.clone()), events)
        }
        (_, None, _) => {
            let kind = if target.kind == TargetKind::Vmi {
                KUBEVIRT_VMI
            } else {
                vm_kind
            };
            let missing = Error::NotFound {
                kind: kind.kind.to_ascii_lowercase(),
                name: name.to_owned(),
                namespace: Some(namespace.to_owned()),
            };
            return Err(cluster.explain_not_found(missing, namespace).await);
        }
    };
    disk_imports(cluster, platform.flavor, namespace, &mut details.disks).await;
    let caps = crate::platform::of(platform.flavor);
    details.placement = crate::placement::summary(&caps.placement, &details.summary.object);
    details.unschedulable = details
        .conditions
        .iter()
        .find(|c| {
            caps.unschedulable
                .matches(&c.type_, &c.status, c.reason.as_deref())
        })
        .and_then(|c| c.message.clone())
        .filter(|m| !m.is_empty());
    if details.unschedulable.is_some() && caps.instance.is_some() {
        // The launcher pod's FailedScheduling events, beside the VM's own.
        details
            .events
            .extend(launcher_scheduling_events(cluster, name, namespace).await);
        details.events.sort_by_key(|e| e.last_seen);
    }
    Ok(details)
}

/// Reads the import state of the disks the platform provisions (DataVolumes, VirtualDisks),
/// the way `create --wait` follows them. Best effort: a disk that cannot be read keeps none.
async fn disk_imports(cluster: &Cluster, flavor: Flavor, namespace: &str, disks: &mut [Disk]) {
    let kind = crate::platform::of(flavor).disk;
    let prefix = format!("{} ", kind.kind);
    let api = kind.api(&cluster.client, Some(namespace));
    let reads = disks.iter().map(|disk| {
        let api = api.clone();
        let name = disk.source.strip_prefix(prefix.as_str()).map(str::to_owned);
        async move {
            let name = name?;
            let object = api.get_opt(&name).await.ok()??;
            Some(crate::wait::disk_progress(flavor, &to_value(object)))
        }
    });
    let imports = futures::future::join_all(reads).await;
    for (disk, import) in disks.iter_mut().zip(imports) {
        disk.import = import;
    }
}

/// Details of a KubeVirt VM from its objects.
pub fn kubevirt_details(vm: &Value, vmi: Option<Value>, events: Vec<EventLine>) -> VmDetails {
    let summary = summarize_kubevirt(vm, vmi.as_ref());
    let mut all_conditions = conditions(vm);
    if let Some(vmi) = &vmi {
        for condition in conditions(vmi) {
            if !all_conditions.iter().any(|c| c.type_ == condition.type_) {
                all_conditions.push(condition);
            }
        }
    }
    let interfaces = crate::network::kubevirt_interfaces(vm, vmi.as_ref());
    let guest_os = vmi.as_ref().and_then(|i| {
        text(i, "/status/guestOSInfo/prettyName").or_else(|| {
            let name = text(i, "/status/guestOSInfo/name")?;
            Some(match text(i, "/status/guestOSInfo/version") {
                Some(version) => format!("{name} {version}"),
                None => name,
            })
        })
    });
    let disks = vm
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .map(|volumes| volumes.iter().map(kubevirt_disk).collect())
        .unwrap_or_default();
    VmDetails {
        summary,
        flavor: Flavor::KubeVirt,
        conditions: all_conditions,
        interfaces,
        guest_os,
        ssh_trust: ssh_trust(vm),
        disks,
        events,
        instance: vmi,
        placement: Vec::new(),
        unschedulable: None,
    }
}

fn kubevirt_disk(volume: &Value) -> Disk {
    let name = text(volume, "/name").unwrap_or_default();
    let source = [
        ("dataVolume", "/dataVolume/name", "DataVolume"),
        (
            "persistentVolumeClaim",
            "/persistentVolumeClaim/claimName",
            "PersistentVolumeClaim",
        ),
        ("containerDisk", "/containerDisk/image", "containerDisk"),
        ("emptyDisk", "/emptyDisk/capacity", "emptyDisk"),
        ("cloudInitNoCloud", "", "cloud-init NoCloud"),
        ("cloudInitConfigDrive", "", "cloud-init ConfigDrive"),
        ("secret", "/secret/secretName", "Secret"),
        ("configMap", "/configMap/name", "ConfigMap"),
    ]
    .iter()
    .find(|(field, _, _)| volume.get(*field).is_some())
    .map(|(_, pointer, label)| match text(volume, pointer) {
        Some(detail) if !pointer.is_empty() => format!("{label} {detail}"),
        _ => (*label).to_owned(),
    })
    .unwrap_or_else(|| "other".into());
    Disk {
        name,
        source,
        size: None,
        import: None,
    }
}

/// Details of a Deckhouse VM from its object.
pub fn deckhouse_details(vm: &Value, events: Vec<EventLine>) -> VmDetails {
    let summary = summarize_deckhouse(vm);
    let status_refs = vm
        .pointer("/status/blockDeviceRefs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let disks = vm
        .pointer("/spec/blockDeviceRefs")
        .and_then(Value::as_array)
        .map(|refs| {
            refs.iter()
                .map(|r| {
                    let kind = text(r, "/kind").unwrap_or_default();
                    let name = text(r, "/name").unwrap_or_default();
                    let size = status_refs
                        .iter()
                        .find(|s| {
                            text(s, "/kind") == Some(kind.clone())
                                && text(s, "/name") == Some(name.clone())
                        })
                        .and_then(|s| text(s, "/size"));
                    Disk {
                        source: format!("{kind} {name}"),
                        name,
                        size,
                        import: None,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let interfaces = crate::network::deckhouse_interfaces(vm);
    let guest_os =
        text(vm, "/status/guestOSInfo/prettyName").or_else(|| text(vm, "/status/guestOSInfo/name"));
    VmDetails {
        flavor: Flavor::Deckhouse,
        conditions: conditions(vm),
        interfaces,
        guest_os,
        ssh_trust: ssh_trust(vm),
        disks,
        events,
        instance: None,
        summary,
        placement: Vec::new(),
        unschedulable: None,
    }
}

/// Events about the VM (and its instance), oldest first. Best effort: a user who may not
/// read events still gets the rest of `get`.
/// kube-scheduler's `FailedScheduling` events on the virt-launcher pods of KubeVirt VM `name`
/// (pods `virt-launcher-NAME-…`); best effort.
async fn launcher_scheduling_events(
    cluster: &Cluster,
    name: &str,
    namespace: &str,
) -> Vec<EventLine> {
    let params = ListParams::default().fields("involvedObject.kind=Pod,reason=FailedScheduling");
    let Ok(list) = EVENT
        .api(&cluster.client, Some(namespace))
        .list(&params)
        .await
    else {
        return Vec::new();
    };
    let prefix = format!("virt-launcher-{name}-");
    list.items
        .into_iter()
        .map(to_value)
        .filter(|e| {
            text(e, "/involvedObject/name").is_some_and(|n| n.starts_with(&prefix))
                && text(e, "/reason").as_deref() == Some("FailedScheduling")
        })
        .map(|e| EventLine {
            type_: text(&e, "/type").unwrap_or_else(|| "Warning".into()),
            reason: text(&e, "/reason").unwrap_or_default(),
            last_seen: timestamp(&e, "/lastTimestamp")
                .or_else(|| timestamp(&e, "/eventTime"))
                .or_else(|| timestamp(&e, "/metadata/creationTimestamp")),
            message: text(&e, "/message").unwrap_or_default(),
        })
        .collect()
}

async fn events_for(cluster: &Cluster, name: &str, namespace: &str) -> Vec<EventLine> {
    let params = ListParams::default().fields(&format!("involvedObject.name={name}"));
    let Ok(list) = EVENT
        .api(&cluster.client, Some(namespace))
        .list(&params)
        .await
    else {
        return Vec::new();
    };
    let mut events: Vec<EventLine> = list
        .items
        .into_iter()
        .map(to_value)
        .filter(|e| {
            matches!(
                text(e, "/involvedObject/kind").as_deref(),
                Some("VirtualMachine" | "VirtualMachineInstance") | None
            )
        })
        .map(|e| EventLine {
            type_: text(&e, "/type").unwrap_or_else(|| "Normal".into()),
            reason: text(&e, "/reason").unwrap_or_default(),
            last_seen: timestamp(&e, "/lastTimestamp")
                .or_else(|| timestamp(&e, "/eventTime"))
                .or_else(|| timestamp(&e, "/metadata/creationTimestamp")),
            message: text(&e, "/message").unwrap_or_default(),
        })
        .collect();
    events.sort_by_key(|e| e.last_seen);
    events
}

#[cfg(test)]
mod tests {
    #[test]
    fn ssh_trust_tells_scoped_from_older_vms() {
        let scoped = serde_json::json!({"metadata": {"annotations": {"ssh.kubevm.io/trust": "vm-scoped"},
            "labels": {"app.kubernetes.io/managed-by": "kubectl-vm"}}});
        assert!(super::ssh_trust(&scoped).unwrap().starts_with("vm-scoped"));
        assert!(super::TrustState::of(&scoped).platform_vouches());
        let older = serde_json::json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "kubectl-vm"}}});
        assert!(super::ssh_trust(&older).unwrap().starts_with("legacy"));
        let enrolled =
            serde_json::json!({"metadata": {"annotations": {"ssh.kubevm.io/trust": "vm-scoped"}}});
        assert_eq!(
            super::TrustState::of(&enrolled),
            super::TrustState::Enrolled
        );
        assert!(!super::TrustState::of(&enrolled).platform_vouches());
        let without = serde_json::json!({"metadata": {"annotations": {"ssh.kubevm.io/trust": "none"},
            "labels": {"app.kubernetes.io/managed-by": "kubectl-vm"}}});
        assert_eq!(super::TrustState::of(&without).as_str(), "none");
        let foreign = serde_json::json!({"metadata": {"name": "x"}});
        assert_eq!(super::ssh_trust(&foreign), None);
    }

    use super::*;
    use serde_json::json;

    fn kubevirt_vm() -> Value {
        json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "prod", "creationTimestamp": "2026-11-01T10:00:00Z"},
            "spec": {"runStrategy": "Always", "template": {"spec": {
                "domain": {"cpu": {"cores": 2, "sockets": 2}, "memory": {"guest": "4Gi"}, "devices": {}},
                "volumes": [
                    {"name": "root", "dataVolume": {"name": "web-root"}},
                    {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config"}}
                ]}}},
            "status": {"printableStatus": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        })
    }

    fn kubevirt_vmi() -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "prod"},
            "spec": {"domain": {"cpu": {"cores": 2, "sockets": 2}, "memory": {"guest": "4Gi"}}},
            "status": {"phase": "Running", "nodeName": "node-1",
                "interfaces": [{"name": "default", "ipAddress": "10.244.0.7", "ipAddresses": ["10.244.0.7", "fd00::7"], "mac": "52:54:00:00:00:01"}],
                "guestOSInfo": {"prettyName": "Ubuntu 24.04 LTS"},
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "AgentConnected", "status": "True"}, {"type": "LiveMigratable", "status": "False", "message": "disk is RWO"}]}
        })
    }

    #[test]
    fn kubevirt_vm_joined_with_instance() {
        let s = summarize_kubevirt(&kubevirt_vm(), Some(&kubevirt_vmi()));
        assert_eq!(s.status, "Running");
        assert_eq!(s.node.as_deref(), Some("node-1"));
        assert_eq!(s.ip.as_deref(), Some("10.244.0.7"));
        assert_eq!(s.cpu.as_deref(), Some("4"));
        assert_eq!(s.memory.as_deref(), Some("4Gi"));
        assert_eq!((s.agent, s.migratable), (Some(true), Some(false)));
        assert_eq!(s.run_strategy.as_deref(), Some("Always"));
    }

    #[test]
    fn stopped_kubevirt_vm_has_no_runtime_fields() {
        let mut vm = kubevirt_vm();
        vm["spec"] = json!({"running": false, "template": {"spec": {"domain": {"resources": {"requests": {"memory": "1Gi"}}}}}});
        vm["status"] = json!({"printableStatus": "Stopped"});
        let s = summarize_kubevirt(&vm, None);
        assert_eq!(
            (s.status.as_str(), s.node, s.agent),
            ("Stopped", None, None)
        );
        assert_eq!(s.run_strategy.as_deref(), Some("Halted"));
        assert_eq!(s.memory.as_deref(), Some("1Gi"));
        assert_eq!(s.cpu, None);
    }

    #[test]
    fn kubevirt_details_merge_conditions_and_disks() {
        let d = kubevirt_details(&kubevirt_vm(), Some(kubevirt_vmi()), Vec::new());
        let types: Vec<&str> = d.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "AgentConnected", "LiveMigratable"]);
        assert_eq!(d.interfaces[0].ips, ["10.244.0.7", "fd00::7"]);
        assert_eq!(d.guest_os.as_deref(), Some("Ubuntu 24.04 LTS"));
        assert_eq!(d.disks[0].source, "DataVolume web-root");
        assert_eq!(d.disks[1].source, "cloud-init NoCloud");
    }

    #[test]
    fn deckhouse_vm() {
        let vm = json!({
            "metadata": {"name": "linux-vm", "namespace": "dev"},
            "spec": {"runPolicy": "AlwaysOn", "cpu": {"cores": 1}, "memory": {"size": "1Gi"},
                "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "linux-vm-root"}]},
            "status": {"phase": "Running", "nodeName": "node-2", "ipAddress": "10.66.10.12",
                "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "linux-vm-root", "size": "10Gi"}],
                "conditions": [{"type": "AgentReady", "status": "True"}]}
        });
        let d = deckhouse_details(&vm, Vec::new());
        let s = &d.summary;
        assert_eq!(
            (s.status.as_str(), s.ip.as_deref()),
            ("Running", Some("10.66.10.12"))
        );
        assert_eq!((s.agent, s.migratable), (Some(true), Some(false)));
        assert_eq!(s.cpu.as_deref(), Some("1"));
        assert_eq!(d.disks[0].size.as_deref(), Some("10Gi"));
        assert_eq!(d.interfaces[0].ips, ["10.66.10.12"]);
    }
}
