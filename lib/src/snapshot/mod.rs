//! VM snapshots: take one, list them, delete them, and roll a VM back to one (or restore it
//! into a new VM).
//!
//! KubeVirt ([`kubevirt`], FACTS §1 `snapshot.kubevirt.io/v1beta1`): a VirtualMachineSnapshot
//! made here (labelled as ours) that the snapshot controller turns into a
//! VirtualMachineSnapshotContent with one VolumeSnapshot per disk, freezing the guest through
//! its agent when it runs (`status.indications` says `GuestAgent` or `NoGuestAgent`); a restore
//! is a VirtualMachineRestore, which needs the target VM stopped (upstream `restore.go`:
//! "Restore target VMI must be powered off before restore operation") and can also create a
//! new VM.
//!
//! Deckhouse ([`deckhouse`]): a `virtualization.deckhouse.io` VirtualMachineSnapshot (one
//! VirtualDiskSnapshot per disk, owned by it), restored into its VM by a VirtualMachineOperation
//! `Restore`; the platform stops a running VM for that and starts it again.
//!
//! Restoring a running VM is refused before anything changes unless the caller asks to stop it
//! ([`RestoreRequest::stop`]): then it is stopped, restored, and started again. Deleting only
//! touches snapshots made by kubectl-vm unless forced, always with the uid read as a
//! precondition. Progress is reported as [`Event`]s; the caller renders them.

pub mod deckhouse;
pub mod deckhouse_new_vm;
pub mod kubevirt;

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

pub use crate::api::DryRun;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::{Flavor, Platform};

/// How to run a change.
#[derive(Debug, Clone)]
pub struct Options {
    /// Dry run strategy.
    pub dry_run: DryRun,
    /// Wait for the end state.
    pub wait: bool,
    /// How long to wait.
    pub timeout: Duration,
}

/// One snapshot, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// The VM it was taken of.
    pub vm: String,
    /// The platform's phase (`InProgress`, `Succeeded`, `Failed`, …).
    pub phase: String,
    /// Whether it can be restored.
    pub ready: bool,
    /// Total size of its disks' snapshots, where known (else "").
    pub size: String,
    /// How consistent it is: `GuestAgent` (frozen by the agent), `NoGuestAgent`
    /// (crash-consistent), `Online`, … as the platform says.
    pub indications: Vec<String>,
    /// `metadata.creationTimestamp`.
    pub created: String,
    /// Whether kubectl-vm made it.
    pub ours: bool,
    /// The VM's disks the snapshot does not hold: KubeVirt's
    /// `status.snapshotVolumes.excludedVolumes` (volumes whose storage cannot snapshot);
    /// Deckhouse never leaves a disk out but fails the snapshot, naming the disk whose snapshot
    /// failed, which is listed here.
    pub left_out: Vec<String>,
    /// The object itself (for `-o yaml|json`).
    #[serde(skip)]
    pub object: Value,
}

/// Progress of a change.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An object was made (or would be, with a dry run): `kind/name`.
    Created(String),
    /// The object moved on: phase and the platform's message.
    Phase {
        /// e.g. `InProgress`.
        phase: String,
        /// The platform's message, if any.
        message: String,
    },
    /// Something worth telling (the guest agent is missing, the VM is being stopped, …).
    Notice(String),
}

/// What a create or restore did.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The snapshot's name.
    pub snapshot: String,
    /// The VM (`NAME.NAMESPACE`): the snapshot's source, or the restore's target.
    pub vm: String,
    /// The object made (`kind.group/name`), for `-o name`.
    pub object_ref: String,
    /// That object after the change (with a client dry run: as it would be sent).
    pub object: Option<Value>,
    /// Whether the wait ran to the end state.
    pub waited: bool,
    /// Create: the snapshot is not filesystem-consistent because no guest agent froze it.
    pub no_agent: bool,
    /// Restore: the VM was stopped for it and started again.
    pub restarted: bool,
}

/// What to restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreRequest {
    /// The snapshot.
    pub snapshot: String,
    /// Restore into a new VM of this name instead of the snapshot's VM.
    pub new_vm: Option<String>,
    /// Stop the VM if it runs, and start it again afterwards.
    pub stop: bool,
}

/// A deleted (or, with a dry run, deletable) snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Deleted {
    /// Its name.
    pub name: String,
    /// `kind.group/name`.
    pub object_ref: String,
}

/// The default name of a snapshot of `vm` taken at `unix` seconds: `VM-YYYYMMDD-HHMMSS`,
/// shortened to fit a name.
pub fn default_name(vm: &str, unix: i64) -> String {
    let stamp = jiff::Timestamp::from_second(unix)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .strftime("%Y%m%d-%H%M%S")
        .to_string();
    let room = 63 - stamp.len() - 1;
    let base: String = vm.chars().take(room).collect();
    format!("{}-{stamp}", base.trim_end_matches(['-', '.']))
}

/// Check a snapshot (or new VM) name locally. One line, exit 2.
pub fn check_name(what: &'static str, name: &str) -> Result<()> {
    crate::validate::dns_label(what, name).map_err(|e| Error::Usage(e.to_string()))
}

/// Take a snapshot `name` of VM `vm`.
pub async fn create(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    vm: &str,
    name: &str,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    check_name("snapshot", name)?;
    let work = async {
        match flavor {
            Flavor::KubeVirt => {
                kubevirt::create(cluster, namespace, vm, name, options, on_event).await
            }
            Flavor::Deckhouse => {
                deckhouse::create(cluster, namespace, vm, name, options, on_event).await
            }
        }
    };
    bounded(
        options,
        work,
        &format!("snapshot {name} of {vm}.{namespace}"),
    )
    .await
}

/// The kind of a flavor's snapshots (for `kind.group/name`).
pub fn snapshot_kind(flavor: Flavor) -> crate::api::Kind {
    match flavor {
        Flavor::KubeVirt => kubevirt::VM_SNAPSHOT,
        Flavor::Deckhouse => deckhouse::VM_SNAPSHOT,
    }
}

/// The snapshots in `namespace` (all namespaces when `None`), of VM `vm` when given.
pub async fn list(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: Option<&str>,
    vm: Option<&str>,
) -> Result<Vec<Snapshot>> {
    match flavor {
        Flavor::KubeVirt => kubevirt::list(cluster, namespace, vm).await,
        Flavor::Deckhouse => deckhouse::list(cluster, namespace, vm).await,
    }
}

/// Delete snapshots `names`: only ours unless `force`, each with its uid as a precondition.
/// Every name is checked before the first delete.
pub async fn delete(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    names: &[String],
    force: bool,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Vec<Deleted>> {
    for n in names {
        check_name("snapshot", n)?;
    }
    let work = async {
        match flavor {
            Flavor::KubeVirt => {
                kubevirt::delete(cluster, namespace, names, force, options, on_event).await
            }
            Flavor::Deckhouse => {
                deckhouse::delete(cluster, namespace, names, force, options, on_event).await
            }
        }
    };
    bounded(
        options,
        work,
        &format!("snapshots to be deleted in {namespace}"),
    )
    .await
}

/// Restore a snapshot into its VM (stopping and restarting it when `request.stop`) or into a
/// new VM.
pub async fn restore(
    cluster: &Cluster,
    platform: &Platform,
    namespace: &str,
    request: &RestoreRequest,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    check_name("snapshot", &request.snapshot)?;
    if let Some(n) = &request.new_vm {
        check_name("new VM", n)?;
    }
    let work = async {
        match platform.flavor {
            Flavor::KubeVirt => {
                kubevirt::restore(cluster, platform, namespace, request, options, on_event).await
            }
            Flavor::Deckhouse => {
                deckhouse::restore(cluster, platform, namespace, request, options, on_event).await
            }
        }
    };
    bounded(
        options,
        work,
        &format!("snapshot {} to be restored", request.snapshot),
    )
    .await
}

async fn bounded<T>(
    options: &Options,
    work: impl Future<Output = Result<T>>,
    what: &str,
) -> Result<T> {
    match tokio::time::timeout(options.timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(format!(
            "{what} (after {}s; raise --timeout, or pass --no-wait)",
            options.timeout.as_secs()
        ))),
    }
}

/// `s` at `pointer` in `obj`, or "".
pub(crate) fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_carry_the_time_and_fit_a_label() {
        // 2026-12-03T07:35:41Z, as `date -u -d @1796283341` prints it.
        assert_eq!(default_name("web", 1796283341), "web-20261203-073541");
        let long = "a".repeat(70);
        let name = default_name(&long, 0);
        assert_eq!(name.len(), 63);
        assert!(name.ends_with("-19700101-000000"));
        assert!(check_name("snapshot", &name).is_ok());
    }

    #[test]
    fn bad_names_are_usage_errors() {
        assert!(matches!(
            check_name("snapshot", "Bad_Name"),
            Err(Error::Usage(_))
        ));
    }
}
