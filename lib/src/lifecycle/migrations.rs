//! `migrate list`: the live migrations a cluster runs or ran, as one row shape for both
//! platforms, listed once or watched.
//!
//! - KubeVirt: VirtualMachineInstanceMigrations (`kubevirt.io/v1`), whose
//!   `status.migrationState` is upstream's `VirtualMachineInstanceMigrationState` (source and
//!   target node, start/end, mode, failure reason). Those the platform started are marked:
//!   `kubevirt.io/evacuationMigration: NODE` by the evacuation controller for a node drain
//!   (`pkg/virt-controller/watch/drain/evacuation/evacuation.go` `GenerateNewMigration`),
//!   `kubevirt.io/workloadUpdateMigration` by the workload updater
//!   (`staging/src/kubevirt.io/api/core/v1/types.go`). KubeVirt's API reports no byte counts
//!   or iterations: memory processed/remaining are virt-handler metrics
//!   (`kubevirt_vmi_migration_data_processed_bytes`, `…_data_remaining_bytes`,
//!   `pkg/monitoring/metrics/virt-handler/migrationdomainstats/migrationstats_collector.go`),
//!   not fields of any object, so the progress shown is the phase and the copy mode.
//! - Deckhouse: VirtualMachineOperations of type `Migrate` or `Evict`; `status.progress` is
//!   the platform's own percentage; the VM's `status.migrationState` names the nodes. The
//!   evacuation controller's operations (node drains) are annotated
//!   `virtualization.deckhouse.io/evacuation` (deckhouse/virtualization
//!   `images/virtualization-artifact/pkg/controller/evacuation/internal/handler/evacuation.go`,
//!   `pkg/common/annotations/annotations.go` `AnnVMOPEvacuation`).

use std::collections::BTreeMap;

use futures::StreamExt;
use kube::api::{ListParams, WatchEvent, WatchParams};
use serde_json::Value;

use super::deckhouse::VMOP;
use super::kubevirt::KUBEVIRT_VMIM;
use super::{condition, text};
use crate::api::{DECKHOUSE_VM, KUBEVIRT_VMI, Kind};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::vm::restartable_watch;

/// KubeVirt's mark on a migration its evacuation controller made for a drain.
pub const KUBEVIRT_EVACUATION: &str = "kubevirt.io/evacuationMigration";
/// KubeVirt's mark on a migration its workload updater made.
pub const KUBEVIRT_WORKLOAD_UPDATE: &str = "kubevirt.io/workloadUpdateMigration";
/// Deckhouse's mark on an Evict operation its evacuation controller made for a drain.
pub const DECKHOUSE_EVACUATION: &str = "virtualization.deckhouse.io/evacuation";

/// Who started a migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initiator {
    /// A user (or a tool acting for one).
    User,
    /// The platform, draining a node.
    Drain,
    /// The platform, moving a VM to an updated launcher (KubeVirt's workload updater).
    WorkloadUpdate,
}

impl Initiator {
    /// The word shown in the INITIATOR column.
    pub fn word(self) -> &'static str {
        match self {
            Initiator::User => "user",
            Initiator::Drain => "drain",
            Initiator::WorkloadUpdate => "workload-update",
        }
    }
}

/// One migration as `migrate list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Migration {
    /// Namespace.
    pub namespace: String,
    /// The migration object's name (a VMIM or an operation).
    pub name: String,
    /// The VM (or VMI) migrated.
    pub vm: String,
    /// `Migrate` or `Evict` (KubeVirt: `Migrate`, `Evict` for a drain's).
    pub operation: String,
    /// Who started it.
    pub initiator: Initiator,
    /// The platform's phase (KubeVirt migration phase; Deckhouse operation phase).
    pub phase: String,
    /// Whether the phase is final.
    pub finished: bool,
    /// Source node, when known.
    pub source: String,
    /// Target node, when known.
    pub target: String,
    /// What the platform reports of progress: Deckhouse `status.progress` (`50%`), KubeVirt
    /// the copy mode (`PreCopy`, `PostCopy`) once it runs.
    pub progress: String,
    /// When it started (RFC 3339): the migration state's start, else the object's creation.
    pub started: String,
    /// When it ended (RFC 3339), if it did.
    pub ended: String,
    /// Why it failed (or was superseded), if it did.
    pub reason: String,
    /// The migration object.
    pub object: Value,
}

/// Where a platform keeps its migrations, and how one becomes a row: the one place the
/// platforms are told apart.
struct Source {
    /// The migration objects.
    kind: Kind,
    /// The object whose `status.nodeName` is the VM's node (KubeVirt: the VMI).
    host: Kind,
    /// Where a migration names its VM (or VMI).
    host_pointer: &'static str,
    /// The row of a migration object and its host (`None`: no migration).
    summarize: fn(&Value, Option<&Value>) -> Option<Migration>,
}

fn source(flavor: Flavor) -> Source {
    match flavor {
        Flavor::KubeVirt => Source {
            kind: KUBEVIRT_VMIM,
            host: KUBEVIRT_VMI,
            host_pointer: "/spec/vmiName",
            summarize: |m, vmi| Some(summarize_kubevirt(m, vmi)),
        },
        Flavor::Deckhouse => Source {
            kind: VMOP,
            host: DECKHOUSE_VM,
            host_pointer: "/spec/virtualMachineName",
            summarize: summarize_deckhouse,
        },
    }
}

/// The kind `migrate list` reads on a platform.
pub fn kind(flavor: Flavor) -> Kind {
    source(flavor).kind
}

/// The row for `object` (`host`: the VMI on KubeVirt, the VM on Deckhouse, for the nodes);
/// `None` for an object that is no migration (a Deckhouse Start/Stop/… operation).
pub fn summarize(flavor: Flavor, object: &Value, host: Option<&Value>) -> Option<Migration> {
    (source(flavor).summarize)(object, host)
}

fn annotation<'a>(object: &'a Value, name: &str) -> Option<&'a str> {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(name))
        .and_then(Value::as_str)
}

fn summarize_kubevirt(m: &Value, vmi: Option<&Value>) -> Migration {
    // The VMI's state is virt-handler's own and names the migration it belongs to; the
    // migration's copy (virt-controller's) may lag or be missing.
    let uid = text(m, "/metadata/uid");
    let state = vmi
        .and_then(|v| v.pointer("/status/migrationState"))
        .filter(|s| !uid.is_empty() && text(s, "/migrationUid") == uid)
        .or_else(|| m.pointer("/status/migrationState"))
        .unwrap_or(&Value::Null);
    let phase = match text(m, "/status/phase") {
        "" => "Pending",
        p => p,
    };
    let initiator = if annotation(m, KUBEVIRT_EVACUATION).is_some() {
        Initiator::Drain
    } else if annotation(m, KUBEVIRT_WORKLOAD_UPDATE).is_some() {
        Initiator::WorkloadUpdate
    } else {
        Initiator::User
    };
    let reason = if phase == "Failed" {
        match text(state, "/failureReason") {
            "" => condition(m, "Failed")
                .and_then(|c| c["message"].as_str())
                .unwrap_or("")
                .to_owned(),
            r => r.to_owned(),
        }
    } else {
        String::new()
    };
    let finished = matches!(phase, "Succeeded" | "Failed");
    let mut source = text(state, "/sourceNode").to_owned();
    if source.is_empty() {
        // An evacuation names the node it drains before the state does; a pending migration
        // leaves from where its VMI runs.
        source = match annotation(m, KUBEVIRT_EVACUATION) {
            Some(node) => node.to_owned(),
            None if !finished => vmi
                .map(|v| text(v, "/status/nodeName").to_owned())
                .unwrap_or_default(),
            None => String::new(),
        };
    }
    let ended = match text(state, "/endTimestamp") {
        "" => phase_time(m, &["Succeeded", "Failed"]),
        e => e.to_owned(),
    };
    Migration {
        namespace: text(m, "/metadata/namespace").to_owned(),
        name: text(m, "/metadata/name").to_owned(),
        vm: text(m, "/spec/vmiName").to_owned(),
        operation: if initiator == Initiator::Drain {
            "Evict"
        } else {
            "Migrate"
        }
        .to_owned(),
        initiator,
        phase: phase.to_owned(),
        finished,
        source,
        target: text(state, "/targetNode").to_owned(),
        progress: text(state, "/mode").to_owned(),
        started: match text(state, "/startTimestamp") {
            "" => text(m, "/metadata/creationTimestamp").to_owned(),
            s => s.to_owned(),
        },
        ended,
        reason,
        object: m.clone(),
    }
}

/// When the migration entered the first of `phases` (`status.phaseTransitionTimestamps`).
fn phase_time(m: &Value, phases: &[&str]) -> String {
    m.pointer("/status/phaseTransitionTimestamps")
        .and_then(Value::as_array)
        .and_then(|ts| {
            ts.iter()
                .find(|t| phases.contains(&t["phase"].as_str().unwrap_or("")))
        })
        .map(|t| text(t, "/phaseTransitionTimestamp").to_owned())
        .unwrap_or_default()
}

fn summarize_deckhouse(op: &Value, vm: Option<&Value>) -> Option<Migration> {
    let operation = text(op, "/spec/type");
    if !matches!(operation, "Migrate" | "Evict") {
        return None;
    }
    let phase = match text(op, "/status/phase") {
        "" => "Pending",
        p => p,
    };
    let finished = matches!(phase, "Completed" | "Failed" | "Superseded");
    let completed = condition(op, "Completed");
    let created = text(op, "/metadata/creationTimestamp");
    let reason = if matches!(phase, "Failed" | "Superseded") {
        completed
            .map(|c| {
                let (r, msg) = (text(c, "/reason"), text(c, "/message"));
                match (r.is_empty(), msg.is_empty()) {
                    (false, false) => format!("{r}: {msg}"),
                    (false, true) => r.to_owned(),
                    _ => msg.to_owned(),
                }
            })
            .unwrap_or_default()
    } else {
        String::new()
    };
    // The VM's migration state is this operation's when it began after the operation was made.
    let state = vm
        .and_then(|vm| vm.pointer("/status/migrationState"))
        .filter(|s| text(s, "/startTimestamp") >= created);
    let (mut source, target) = state
        .map(|s| {
            (
                text(s, "/source/node").to_owned(),
                text(s, "/target/node").to_owned(),
            )
        })
        .unwrap_or_default();
    if source.is_empty() && !finished {
        source = vm
            .map(|vm| text(vm, "/status/nodeName").to_owned())
            .unwrap_or_default();
    }
    let ended = if finished {
        completed
            .map(|c| text(c, "/lastTransitionTime").to_owned())
            .unwrap_or_default()
    } else {
        String::new()
    };
    Some(Migration {
        namespace: text(op, "/metadata/namespace").to_owned(),
        name: text(op, "/metadata/name").to_owned(),
        vm: text(op, "/spec/virtualMachineName").to_owned(),
        operation: operation.to_owned(),
        initiator: if annotation(op, DECKHOUSE_EVACUATION).is_some() {
            Initiator::Drain
        } else {
            Initiator::User
        },
        phase: phase.to_owned(),
        finished,
        source,
        target,
        progress: text(op, "/status/progress").to_owned(),
        started: created.to_owned(),
        ended,
        reason,
        object: op.clone(),
    })
}

/// The migrations `list` found, and the resource version to watch from.
#[derive(Debug, Clone)]
pub struct MigrationList {
    /// The rows, sorted by namespace, start and name.
    pub items: Vec<Migration>,
    /// The list's resource version.
    pub resource_version: String,
}

fn to_value(o: kube::api::DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or_default()
}

/// The hosts (VMIs or VMs) in `namespace`, by (namespace, name), for the rows' nodes.
async fn hosts(
    cluster: &Cluster,
    host: Kind,
    namespace: Option<&str>,
) -> Result<BTreeMap<(String, String), Value>> {
    let list = host
        .api(&cluster.client, namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.error(e, &host.action("list", namespace)))?;
    Ok(list
        .items
        .into_iter()
        .map(to_value)
        .map(|o| {
            (
                (
                    text(&o, "/metadata/namespace").to_owned(),
                    text(&o, "/metadata/name").to_owned(),
                ),
                o,
            )
        })
        .collect())
}

fn host_key(src: &Source, object: &Value) -> (String, String) {
    (
        text(object, "/metadata/namespace").to_owned(),
        text(object, src.host_pointer).to_owned(),
    )
}

/// The migrations in `namespace` (all namespaces when `None`); `selector` selects the
/// migration objects by their labels (KubeVirt's carry `kubevirt.io/vmi-name`).
pub async fn list(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: Option<&str>,
    selector: Option<&str>,
) -> Result<MigrationList> {
    let src = source(flavor);
    let kind = src.kind;
    let mut params = ListParams::default();
    if let Some(s) = selector {
        params = params.labels(s);
    }
    let list = kind
        .api(&cluster.client, namespace)
        .list(&params)
        .await
        .map_err(|e| cluster.error(e, &kind.action("list", namespace)))?;
    let hosts = hosts(cluster, src.host, namespace).await?;
    let mut items: Vec<Migration> = list
        .items
        .into_iter()
        .map(to_value)
        .filter_map(|o| (src.summarize)(&o, hosts.get(&host_key(&src, &o))))
        .collect();
    items.sort_by(|a, b| {
        (&a.namespace, &a.started, &a.name).cmp(&(&b.namespace, &b.started, &b.name))
    });
    Ok(MigrationList {
        items,
        resource_version: list.metadata.resource_version.unwrap_or_default(),
    })
}

/// A change `watch` reports.
#[derive(Debug, Clone, PartialEq)]
pub enum MigrationChange {
    /// Added or changed.
    Updated(Migration),
    /// Deleted (cancelled, or cleaned up).
    Deleted(Migration),
}

/// Watch migrations from `resource_version` on and call `on_change` for each whose row
/// changed. A 410 Gone re-lists, reports what differs, and goes on. Runs until the server or
/// `on_change` fails; the caller's error type carries both.
pub async fn watch<E: From<Error>>(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: Option<&str>,
    selector: Option<&str>,
    initial: MigrationList,
    mut on_change: impl FnMut(MigrationChange) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let src = source(flavor);
    let kind = src.kind;
    let key = |m: &Migration| (m.namespace.clone(), m.name.clone());
    let mut last: BTreeMap<(String, String), Migration> =
        initial.items.iter().map(|m| (key(m), m.clone())).collect();
    let mut version = initial.resource_version;
    loop {
        let mut params = WatchParams::default().timeout(290);
        if let Some(s) = selector {
            params = params.labels(s);
        }
        let api = kind.api(&cluster.client, namespace);
        let mut feed = restartable_watch(api, params, version.clone()).boxed();
        let expired = loop {
            let Some(event) = feed.next().await else {
                return Err(Error::Internal("the watch ended unexpectedly".into()).into());
            };
            let event = match event {
                Ok(e) => e,
                Err(kube::Error::Api(s)) if s.code == 410 => break true,
                Err(e) => return Err(cluster.error(e, &kind.action("watch", namespace)).into()),
            };
            let (object, deleted) = match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => (to_value(o), false),
                WatchEvent::Deleted(o) => (to_value(o), true),
                WatchEvent::Bookmark(_) => continue,
                WatchEvent::Error(s) if s.code == 410 => break true,
                WatchEvent::Error(s) => {
                    return Err(Error::from_status(
                        s.code,
                        &s.reason,
                        &s.message,
                        &kind.action("watch", namespace),
                        &cluster.server,
                    )
                    .into());
                }
            };
            version = text(&object, "/metadata/resourceVersion").to_owned();
            // The host, for the nodes.
            let host = if deleted {
                None
            } else {
                let (ns, name) = host_key(&src, &object);
                src.host
                    .api(&cluster.client, Some(&ns))
                    .get_opt(&name)
                    .await
                    .map_err(|e| cluster.error(e, &src.host.action("get", Some(&ns))))?
                    .map(to_value)
            };
            let Some(row) = (src.summarize)(&object, host.as_ref()) else {
                continue;
            };
            if deleted {
                // The last row seen knows the nodes the deleted object's own status may not.
                let row = last.remove(&key(&row)).unwrap_or(row);
                on_change(MigrationChange::Deleted(row))?;
            } else if last.get(&key(&row)).is_none_or(|old| !same_row(old, &row)) {
                last.insert(key(&row), row.clone());
                on_change(MigrationChange::Updated(row))?;
            }
        };
        if expired {
            let fresh = list(cluster, flavor, namespace, selector).await?;
            let now: BTreeMap<_, _> = fresh.items.iter().map(|m| (key(m), m.clone())).collect();
            for (id, old) in &last {
                if !now.contains_key(id) {
                    on_change(MigrationChange::Deleted(old.clone()))?;
                }
            }
            for (id, row) in &now {
                if last.get(id).is_none_or(|old| !same_row(old, row)) {
                    on_change(MigrationChange::Updated(row.clone()))?;
                }
            }
            last = now;
            version = fresh.resource_version;
        }
    }
}

/// Whether two rows show the same (the object's resourceVersion aside).
fn same_row(a: &Migration, b: &Migration) -> bool {
    let strip = |m: &Migration| Migration {
        object: Value::Null,
        ..m.clone()
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubevirt_rows_name_nodes_mode_and_the_drain() {
        let m = json!({"metadata": {"name": "kubevirt-evacuation-abcde", "namespace": "default",
            "creationTimestamp": "2026-01-01T10:00:00Z",
            "annotations": {"kubevirt.io/evacuationMigration": "node-1"}},
            "spec": {"vmiName": "web"},
            "status": {"phase": "Running", "migrationState": {"sourceNode": "node-1",
                "targetNode": "node-2", "mode": "PreCopy", "startTimestamp": "2026-01-01T10:00:02Z"}}});
        let row = summarize(Flavor::KubeVirt, &m, None).unwrap();
        assert_eq!(row.initiator, Initiator::Drain);
        assert_eq!(row.operation, "Evict");
        assert_eq!(
            (row.source.as_str(), row.target.as_str()),
            ("node-1", "node-2")
        );
        assert_eq!(row.progress, "PreCopy");
        assert_eq!(row.started, "2026-01-01T10:00:02Z");
        assert!(!row.finished);
        let failed = json!({"metadata": {"name": "m", "namespace": "default"},
            "spec": {"vmiName": "web"},
            "status": {"phase": "Failed", "migrationState": {"failureReason": "Live migration timed out"}}});
        let row = summarize(Flavor::KubeVirt, &failed, None).unwrap();
        assert!(row.finished);
        assert_eq!(row.reason, "Live migration timed out");
        assert_eq!(row.initiator, Initiator::User);
    }

    #[test]
    fn deckhouse_rows_take_progress_and_nodes_and_skip_other_operations() {
        let op = json!({"metadata": {"name": "evacuation-x1", "namespace": "dev",
            "creationTimestamp": "2026-01-01T10:00:00Z",
            "annotations": {"virtualization.deckhouse.io/evacuation": "true"}},
            "spec": {"type": "Evict", "virtualMachineName": "linux-vm"},
            "status": {"phase": "InProgress", "progress": "50%"}});
        let vm = json!({"status": {"nodeName": "node-1"}});
        let row = summarize(Flavor::Deckhouse, &op, Some(&vm)).unwrap();
        assert_eq!(row.initiator, Initiator::Drain);
        assert_eq!(row.progress, "50%");
        assert_eq!(row.source, "node-1");
        let start = json!({"metadata": {"name": "s"}, "spec": {"type": "Start"}});
        assert!(summarize(Flavor::Deckhouse, &start, None).is_none());
        let failed = json!({"metadata": {"name": "m", "creationTimestamp": "2026-01-01T10:00:00Z"},
            "spec": {"type": "Migrate", "virtualMachineName": "v"},
            "status": {"phase": "Failed", "conditions": [{"type": "Completed", "status": "False",
                "reason": "NotConverging", "message": "Live migration is not completed",
                "lastTransitionTime": "2026-01-01T10:05:00Z"}]}});
        let row = summarize(Flavor::Deckhouse, &failed, None).unwrap();
        assert_eq!(row.reason, "NotConverging: Live migration is not completed");
        assert_eq!(row.ended, "2026-01-01T10:05:00Z");
    }
}
