//! Deckhouse: `virtualization.deckhouse.io/v1alpha2` VirtualMachineSnapshot, restored by a
//! VirtualMachineOperation `type: Restore` (FACTS §10; deckhouse/virtualization
//! `pkg/controller/vmsnapshot/internal/life_cycle.go`, `pkg/controller/vmop/snapshot/`).
//!
//! - A snapshot goes `Pending → InProgress → Ready` (or `Failed`), its condition
//!   `VirtualMachineSnapshotReady` carrying the platform's message. With
//!   `spec.requiredConsistency` (the platform's default) a running VM is frozen through its
//!   agent, and without a ready agent the platform fails the snapshot. kubectl-vm asks for
//!   consistency unless the VM runs without a ready agent: then it asks for a crash-consistent
//!   snapshot and says so, as on KubeVirt. `status.consistent` is true when the VM was stopped
//!   or frozen.
//! - `spec.keepIPAddress: Never`: the default `Always` turns the VM's automatic IP address
//!   into a static one, a change to an object kubectl-vm did not make.
//! - Each disk gets a VirtualDiskSnapshot owned by the snapshot: deleting the snapshot deletes
//!   them (and the Secret holding the VM's spec).
//! - A restore is an operation `Restore` with `restore.mode: Strict`. The platform restores a
//!   running VM by putting it in maintenance mode, which stops it, and starts it again
//!   afterwards (`enter_maintenance_step.go`); kubectl-vm refuses that unless `--stop` says
//!   stopping is fine. Each disk is recreated from its VirtualDiskSnapshot.
//! - `--new-vm NEW`: kubectl-vm makes NEW's disks (from the VirtualDiskSnapshots), its Secret
//!   and then NEW itself from what the snapshot keeps (see `deckhouse_new_vm`).

use kube::api::{DeleteParams, ListParams, Preconditions};
use serde_json::{Value, json};

use super::kubevirt::{conditions, create_obj, get, is_ours, labels};
use super::{Deleted, DryRun, Event, Options, Outcome, RestoreRequest, Snapshot, text};
use crate::api::{DECKHOUSE_VM, Kind};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::lifecycle::deckhouse::VMOP;
use crate::lifecycle::watch::{self, Watched};
use crate::lifecycle::{self, VmRef};

/// Deckhouse's VirtualMachineSnapshot.
pub const VM_SNAPSHOT: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualMachineSnapshot",
    plural: "virtualmachinesnapshots",
    namespaced: true,
};

/// Deckhouse's VirtualDiskSnapshot (one per disk of a VM snapshot).
pub const VD_SNAPSHOT: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualDiskSnapshot",
    plural: "virtualdisksnapshots",
    namespaced: true,
};

/// The condition a snapshot reports its progress in.
const READY: &str = "VirtualMachineSnapshotReady";

fn ready_message(obj: &Value) -> (String, String) {
    conditions(obj)
        .find(|c| c["type"] == READY)
        .map(|c| {
            (
                text(c, "/reason").to_owned(),
                text(c, "/message").to_owned(),
            )
        })
        .unwrap_or_default()
}

fn condition_true(obj: &Value, type_: &str) -> bool {
    conditions(obj).any(|c| c["type"] == type_ && c["status"] == "True")
}

/// Whether a VM runs without a ready guest agent (so it cannot be frozen).
pub fn runs_without_agent(vm: &Value) -> bool {
    text(vm, "/status/phase") != "Stopped" && !condition_true(vm, "AgentReady")
}

/// The snapshot object `create` sends.
pub fn snapshot_object(ns: &str, vm: &str, name: &str, consistent: bool) -> Value {
    json!({
        "apiVersion": VM_SNAPSHOT.api_version(), "kind": VM_SNAPSHOT.kind,
        "metadata": {"name": name, "namespace": ns, "labels": labels(vm)},
        "spec": {"virtualMachineName": vm, "requiredConsistency": consistent, "keepIPAddress": "Never"},
    })
}

/// The operation `restore` sends.
pub fn restore_object(ns: &str, snapshot: &str, vm: &str) -> Value {
    json!({
        "apiVersion": VMOP.api_version(), "kind": VMOP.kind,
        "metadata": {"generateName": format!("{snapshot}-restore-"), "namespace": ns, "labels": labels(vm)},
        "spec": {"type": "Restore", "virtualMachineName": vm,
            "restore": {"mode": "Strict", "virtualMachineSnapshotName": snapshot}},
    })
}

async fn vm_of(cluster: &Cluster, ns: &str, name: &str) -> Result<Value> {
    let vm = VmRef {
        namespace: ns.to_owned(),
        name: name.to_owned(),
    };
    lifecycle::get_vm(cluster, Flavor::Deckhouse, &vm).await
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
    let vm_obj = vm_of(cluster, ns, vm).await?;
    let no_agent = runs_without_agent(&vm_obj);
    let obj = snapshot_object(ns, vm, name, !no_agent);
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
            "{vm}.{ns} runs without a ready guest agent: the snapshot is crash-consistent, not filesystem-consistent"
        )));
    }
    if !options.wait {
        return Ok(outcome);
    }
    let mut last = String::new();
    let done = watch::until(cluster, &[Watched::new(VM_SNAPSHOT, ns, name)], |objs| {
        let Some(s) = &objs[0] else {
            return Some(Err(Error::Platform(format!(
                "virtualmachinesnapshot {name} was deleted while being taken"
            ))));
        };
        let phase = text(s, "/status/phase");
        let (_, message) = ready_message(s);
        let now = format!("{phase}\n{message}");
        if !phase.is_empty() && now != last {
            last = now;
            on_event(Event::Phase {
                phase: phase.to_owned(),
                message: message.clone(),
            });
        }
        matches!(phase, "Ready" | "Failed").then(|| Ok(s.clone()))
    })
    .await?;
    if text(&done, "/status/phase") == "Failed" {
        let (_, message) = ready_message(&done);
        let disks = failed_disks(cluster, ns, &done).await;
        return Err(Error::Stuck(if disks.is_empty() {
            format!(
                "snapshot {name} of {vm}.{ns} failed: {}",
                if message.is_empty() {
                    "failed"
                } else {
                    &message
                }
            )
        } else {
            format!("snapshot {name} of {vm}.{ns} failed: {}", disks.join("; "))
        }));
    }
    outcome.no_agent = done.pointer("/status/consistent") != Some(&json!(true));
    outcome.object = Some(done);
    outcome.waited = true;
    Ok(outcome)
}

/// For a failed snapshot: "disk D cannot be snapshotted: <reason>: <message>" for each of its
/// VirtualDiskSnapshots that failed (`status.virtualDiskSnapshotNames`; Deckhouse fails the VM
/// snapshot when one of them fails, e.g. storage without a default VolumeSnapshotClass). Those
/// that cannot be read are left out (the caller falls back to the snapshot's own message).
async fn failed_disks(cluster: &Cluster, ns: &str, snapshot: &Value) -> Vec<String> {
    let names: Vec<String> = snapshot
        .pointer("/status/virtualDiskSnapshotNames")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect();
    let mut out = vec![];
    for n in names {
        let Ok(Some(vds)) = super::kubevirt::get_opt(cluster, VD_SNAPSHOT, ns, &n).await else {
            continue;
        };
        if text(&vds, "/status/phase") != "Failed" {
            continue;
        }
        let c = conditions(&vds)
            .find(|c| c["type"] == "VirtualDiskSnapshotReady")
            .cloned()
            .unwrap_or_default();
        out.push(format!(
            "disk {} cannot be snapshotted (VirtualDiskSnapshot {n}, {}: {})",
            text(&vds, "/spec/virtualDiskName"),
            text(&c, "/reason"),
            text(&c, "/message").trim_end_matches('.')
        ));
    }
    out
}

/// One listed snapshot.
pub fn row(s: &Value) -> Snapshot {
    let mut indications = vec![];
    if s.pointer("/status/consistent") == Some(&json!(true)) {
        indications.push("Consistent".to_owned());
    } else if text(s, "/status/phase") == "Ready" {
        indications.push("PotentiallyInconsistent".to_owned());
    }
    Snapshot {
        name: text(s, "/metadata/name").to_owned(),
        namespace: text(s, "/metadata/namespace").to_owned(),
        vm: text(s, "/spec/virtualMachineName").to_owned(),
        phase: text(s, "/status/phase").to_owned(),
        ready: text(s, "/status/phase") == "Ready",
        // The platform reports no size for VM or disk snapshots.
        size: String::new(),
        indications,
        created: text(s, "/metadata/creationTimestamp").to_owned(),
        ours: is_ours(s),
        left_out: failed_disk(s).into_iter().collect(),
        object: s.clone(),
    }
}

/// The disk whose snapshot failed a Failed snapshot: its `VirtualMachineSnapshotReady` message
/// names the VirtualDiskSnapshot ("The virtual disk snapshot %q is failed: cannot take
/// snapshot. …", `vmsnapshot/internal/life_cycle.go`), which Deckhouse names
/// `<disk>-<snapshot uid>` (`getVDSnapshotName`).
fn failed_disk(s: &Value) -> Option<String> {
    if text(s, "/status/phase") != "Failed" {
        return None;
    }
    let (_, message) = ready_message(s);
    let rest = message.strip_prefix("The virtual disk snapshot \"")?;
    let vds = &rest[..rest.find("\" is failed")?];
    let disk = vds
        .strip_suffix(text(s, "/metadata/uid"))?
        .strip_suffix('-')?;
    (!disk.is_empty()).then(|| disk.to_owned())
}

/// The snapshots in `ns` (or all namespaces), of `vm` when given, sorted by namespace, name.
pub async fn list(cluster: &Cluster, ns: Option<&str>, vm: Option<&str>) -> Result<Vec<Snapshot>> {
    let items = VM_SNAPSHOT
        .api(&cluster.client, ns)
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.error(e, &VM_SNAPSHOT.action("list", ns)))?
        .items;
    let mut rows: Vec<Snapshot> = items
        .into_iter()
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .filter(|s| vm.is_none_or(|v| text(s, "/spec/virtualMachineName") == v))
        .map(|s| row(&s))
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(rows)
}

/// Delete snapshots `names` (all checked first); their VirtualDiskSnapshots go with them.
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

/// Wait until the restore operation `op_name` completes, reporting its phase and the reason
/// of its `Completed` condition as they change; a failed or superseded one gives its message.
async fn wait_restored(
    cluster: &Cluster,
    ns: &str,
    op_name: &str,
    snap_name: &str,
    target: &str,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Value> {
    let mut last = String::new();
    watch::until(cluster, &[Watched::new(VMOP, ns, op_name)], |objs| {
        let Some(op) = &objs[0] else {
            return Some(Err(Error::Platform(format!(
                "virtualmachineoperation {op_name} was deleted while restoring"
            ))));
        };
        let phase = text(op, "/status/phase");
        let completed = conditions(op).find(|c| c["type"] == "Completed");
        let reason = completed.map(|c| text(c, "/reason")).unwrap_or("");
        let now = format!("{phase}\n{reason}");
        if !phase.is_empty() && now != last {
            last = now;
            on_event(Event::Phase {
                phase: phase.to_owned(),
                message: reason.to_owned(),
            });
        }
        match phase {
            "Completed" => Some(Ok(op.clone())),
            "Failed" | "Superseded" => Some(Err(Error::Stuck(format!(
                "restore of {snap_name} into {target}.{ns} failed: {}",
                completed.map(|c| text(c, "/message")).unwrap_or(phase)
            )))),
            _ => None,
        }
    })
    .await
}

/// Wait until VM `target` runs again.
async fn wait_running(cluster: &Cluster, ns: &str, target: &str) -> Result<()> {
    watch::until(cluster, &[Watched::new(DECKHOUSE_VM, ns, target)], |objs| {
        objs[0]
            .as_ref()
            .is_some_and(|v| text(v, "/status/phase") == "Running")
            .then_some(Ok(()))
    })
    .await
}

/// Restore a snapshot into its VM, or as a new VM (see the module documentation).
pub async fn restore(
    cluster: &Cluster,
    platform: &crate::flavor::Platform,
    ns: &str,
    request: &RestoreRequest,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let snap_name = &request.snapshot;
    let snap = get(cluster, VM_SNAPSHOT, ns, snap_name).await?;
    if text(&snap, "/status/phase") != "Ready" {
        return Err(Error::Usage(format!(
            "snapshot {snap_name} is not ready to restore (phase {}); nothing was changed",
            match text(&snap, "/status/phase") {
                "" => "unknown",
                p => p,
            }
        )));
    }
    if let Some(new_vm) = &request.new_vm {
        return super::deckhouse_new_vm::restore(
            cluster, platform, ns, &snap, new_vm, options, on_event,
        )
        .await;
    }
    let target = text(&snap, "/spec/virtualMachineName").to_owned();
    let vm = vm_of(cluster, ns, &target).await?;
    let running = text(&vm, "/status/phase") != "Stopped";
    if running && !request.stop {
        return Err(Error::Usage(format!(
            "{target}.{ns} is {}: Deckhouse restores a running VM by stopping it (\"VM is in maintenance mode for restore operation.\") and starting it again; pass --stop to allow that, or stop it first (nothing was changed)",
            match text(&vm, "/status/phase") {
                "" => "not stopped",
                p => p,
            }
        )));
    }
    let obj = restore_object(ns, snap_name, &target);
    let mut outcome = Outcome {
        snapshot: snap_name.clone(),
        vm: format!("{target}.{ns}"),
        object_ref: VMOP.object_ref(&format!("{snap_name}-restore-")),
        object: Some(obj.clone()),
        waited: false,
        no_agent: false,
        restarted: false,
    };
    if options.dry_run == DryRun::Client {
        return Ok(outcome);
    }
    if options.dry_run == DryRun::Server {
        outcome.object = Some(create_obj(cluster, VMOP, ns, &obj, true).await?);
        return Ok(outcome);
    }
    if running {
        on_event(Event::Notice(format!(
            "Deckhouse stops {target}.{ns} for the restore and starts it again"
        )));
    }
    let made = create_obj(cluster, VMOP, ns, &obj, false).await?;
    let op_name = text(&made, "/metadata/name").to_owned();
    outcome.object_ref = VMOP.object_ref(&op_name);
    outcome.object = Some(made);
    on_event(Event::Created(format!("virtualmachineoperation/{op_name}")));
    if !options.wait {
        return Ok(outcome);
    }
    let done = wait_restored(cluster, ns, &op_name, snap_name, &target, on_event).await?;
    outcome.object = Some(done);
    outcome.waited = true;
    outcome.restarted = running;
    if running {
        // The platform starts it again; wait until it runs, as `--stop` promises.
        wait_running(cluster, ns, &target).await?;
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consistency_is_asked_for_unless_the_vm_runs_without_an_agent() {
        let running = |agent: &str| {
            json!({"status": {"phase": "Running",
                "conditions": [{"type": "AgentReady", "status": agent}]}})
        };
        assert!(runs_without_agent(&running("False")));
        assert!(!runs_without_agent(&running("True")));
        assert!(!runs_without_agent(
            &json!({"status": {"phase": "Stopped"}})
        ));
        let s = snapshot_object("ns", "web", "web-1", false);
        assert!(is_ours(&s));
        assert_eq!(s["spec"]["requiredConsistency"], false);
        assert_eq!(s["spec"]["keepIPAddress"], "Never");
    }

    #[test]
    fn restores_are_strict_operations_labelled_as_ours() {
        let r = restore_object("ns", "web-1", "web");
        assert!(is_ours(&r));
        assert_eq!(r["spec"]["type"], "Restore");
        assert_eq!(r["spec"]["restore"]["mode"], "Strict");
        assert_eq!(r["spec"]["restore"]["virtualMachineSnapshotName"], "web-1");
        assert_eq!(r["metadata"]["generateName"], "web-1-restore-");
    }

    #[test]
    fn a_failed_snapshot_lists_the_disk_that_failed_it() {
        let failed = json!({"metadata": {"uid": "u-1"}, "status": {"phase": "Failed", "conditions": [
            {"type": "VirtualMachineSnapshotReady", "status": "False", "reason": "VirtualMachineSnapshotFailed",
             "message": "The virtual disk snapshot \"scratch-u-1\" is failed: cannot take snapshot. VolumeSnapshot \"x\" has an error: e."}]}});
        assert_eq!(failed_disk(&failed).as_deref(), Some("scratch"));
        let mut other = failed.clone();
        other["status"]["conditions"][0]["message"] =
            json!("Cannot take a snapshot: the virtual machine \"vm\" is not ready.");
        assert_eq!(failed_disk(&other), None);
        let mut ready = failed;
        ready["status"]["phase"] = json!("Ready");
        assert_eq!(failed_disk(&ready), None);
    }

    #[test]
    fn rows_show_the_platform_phase_and_consistency() {
        let s = json!({"metadata": {"name": "a", "namespace": "ns"},
            "spec": {"virtualMachineName": "web"},
            "status": {"phase": "Ready", "consistent": true}});
        let r = row(&s);
        assert!(r.ready);
        assert_eq!(r.vm, "web");
        assert_eq!(r.indications, ["Consistent"]);
        let s = json!({"metadata": {"name": "b", "namespace": "ns"}, "spec": {"virtualMachineName": "web"},
            "status": {"phase": "Ready"}});
        assert_eq!(row(&s).indications, ["PotentiallyInconsistent"]);
    }
}
