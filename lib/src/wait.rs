//! Waiting for a new VM: its disks import (with progress), then it reaches the state its run
//! strategy asks for.

use std::time::Duration;

use kube::api::ListParams;
use serde_json::Value;

use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::names::companion_selector;

/// How often the state is read.
const POLL: Duration = Duration::from_millis(500);

/// A disk being provisioned.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskProgress {
    /// Disk (DataVolume or VirtualDisk) name.
    pub name: String,
    /// Its phase (`ImportInProgress`, `Provisioning`, `Succeeded`, `Ready`, …).
    pub phase: String,
    /// Import progress in percent, when the platform reports it.
    pub percent: Option<f64>,
    /// Whether the disk is done.
    pub ready: bool,
    /// Whether its storage binds it only when the VM first starts (WaitForFirstConsumer):
    /// CDI phase `PendingPopulation`/`WaitForFirstConsumer`, Deckhouse `WaitForFirstConsumer`.
    pub pending_first_consumer: bool,
    /// An import error the platform reports (failed phase, or a failing condition).
    pub error: Option<String>,
    /// How often CDI restarted the importer (`status.restartCount`).
    pub restarts: u64,
}

/// What the VM and its disks look like now.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// VM status (`Provisioning`, `Starting`, `Running`, `Stopped`, …).
    pub vm_status: String,
    /// Why the VM is stuck, when its status is an error state (with the platform's message).
    pub vm_error: Option<String>,
    /// The disks created for it.
    pub disks: Vec<DiskProgress>,
}

/// KubeVirt `printableStatus` values that do not fix themselves (KubeVirt FACTS: VM status).
const KUBEVIRT_ERROR_STATES: [&str; 6] = [
    "ErrorUnschedulable",
    "ErrImagePull",
    "ImagePullBackOff",
    "CrashLoopBackOff",
    "DataVolumeError",
    "ErrorPvcNotFound",
];

/// Deckhouse VM phases that mean it is stuck.
const DECKHOUSE_ERROR_PHASES: [&str; 2] = ["Failed", "Degraded"];

/// An import counts as failing once CDI restarted it this often with an error condition.
const FAILING_RESTARTS: u64 = 3;

/// Wait until VM `name` exists (a pool's replica, which its controller makes after `create`
/// returned), polling.
pub async fn until_exists(
    cluster: &Cluster,
    flavor: Flavor,
    name: &str,
    namespace: &str,
    timeout: Duration,
) -> Result<()> {
    let vm_kind = Kind::vm(flavor);
    let api = vm_kind.api(&cluster.client, Some(namespace));
    let work = async {
        loop {
            let found = api.get_opt(name).await.map_err(|e| {
                cluster.error(e, &vm_kind.action("get", Some(namespace)).named(name))
            })?;
            if found.is_some() {
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(format!(
            "virtualmachine {name:?} in namespace {namespace:?} to be created"
        ))),
    }
}

/// Wait until VM `name` has status `want` (`Running`, or `Stopped` for a VM created stopped),
/// calling `on_change` whenever the snapshot changes.
///
/// The wait ends early with the reason when a disk or the VM is stuck in an error state: a
/// failed import, an import CDI keeps restarting with an error, a VM status such as
/// ErrorUnschedulable or ErrImagePull, a Deckhouse VM Failed or Degraded. When waiting for
/// `Stopped`, disks on WaitForFirstConsumer storage are not waited for (they bind when the VM
/// first starts): the returned snapshot marks them `pending_first_consumer`.
pub async fn until_status(
    cluster: &Cluster,
    flavor: Flavor,
    name: &str,
    namespace: &str,
    want: &str,
    timeout: Duration,
    mut on_change: impl FnMut(&Snapshot),
) -> Result<Snapshot> {
    let work = async {
        let mut last: Option<Snapshot> = None;
        let mut first_restarts: Vec<(String, u64)> = Vec::new();
        loop {
            let snapshot = read(cluster, flavor, name, namespace).await?;
            if last.as_ref() != Some(&snapshot) {
                on_change(&snapshot);
            }
            for d in &snapshot.disks {
                if !first_restarts.iter().any(|(n, _)| *n == d.name) {
                    first_restarts.push((d.name.clone(), d.restarts));
                }
            }
            let first = |disk: &str| {
                first_restarts
                    .iter()
                    .find(|(n, _)| n == disk)
                    .map_or(0, |(_, r)| *r)
            };
            if let Some(reason) = stuck(&snapshot, name, &first) {
                return Err(Error::Stuck(reason));
            }
            let disks_settled = snapshot
                .disks
                .iter()
                .all(|d| d.ready || d.pending_first_consumer);
            let stopped_with_waiting_disks = want == "Stopped"
                && disks_settled
                && snapshot.disks.iter().any(|d| d.pending_first_consumer);
            if snapshot.vm_status == want || stopped_with_waiting_disks {
                return Ok(snapshot);
            }
            last = Some(snapshot);
            tokio::time::sleep(POLL).await;
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(format!(
            "virtualmachine {name:?} in namespace {namespace:?} to be {want}"
        ))),
    }
}

/// Why the wait cannot succeed, if it cannot. `first_restarts` gives each disk's restart
/// count when the wait began.
pub fn stuck(
    snapshot: &Snapshot,
    name: &str,
    first_restarts: &dyn Fn(&str) -> u64,
) -> Option<String> {
    for d in &snapshot.disks {
        let Some(error) = &d.error else { continue };
        let failing = d.phase == "Failed"
            || d.restarts >= FAILING_RESTARTS
            || d.restarts > first_restarts(&d.name)
            || d.phase == "ImagePullFailed";
        if failing {
            let retried = if d.restarts > 0 {
                format!(" (import restarted {} times)", d.restarts)
            } else {
                String::new()
            };
            return Some(format!(
                "disk {:?} of virtual machine {name:?} cannot be provisioned: {error}{retried}",
                d.name
            ));
        }
    }
    snapshot
        .vm_error
        .as_ref()
        .map(|e| format!("virtual machine {name:?} is stuck: {e}"))
}

/// Read the VM's status and its disks' progress once.
pub async fn read(
    cluster: &Cluster,
    flavor: Flavor,
    name: &str,
    namespace: &str,
) -> Result<Snapshot> {
    let vm_kind = Kind::vm(flavor);
    let vm = vm_kind
        .api(&cluster.client, Some(namespace))
        .get(name)
        .await
        .map_err(|e| cluster.error(e, &vm_kind.action("get", Some(namespace)).named(name)))?;
    let vm = serde_json::to_value(vm).unwrap_or(Value::Null);
    let caps = crate::platform::of(flavor);
    let vm_status = vm
        .pointer(&caps.vm_state_pointer())
        .and_then(Value::as_str)
        .unwrap_or("Pending")
        .to_owned();
    let vm_error = vm_error(flavor, &vm);
    let disk_kind = caps.disk;
    let params = ListParams::default().labels(&companion_selector(name));
    let disks = disk_kind
        .api(&cluster.client, Some(namespace))
        .list(&params)
        .await
        .map_err(|e| cluster.error(e, &disk_kind.action("list", Some(namespace))))?;
    let mut disks: Vec<DiskProgress> = disks
        .items
        .into_iter()
        .map(|d| serde_json::to_value(d).unwrap_or(Value::Null))
        .map(|d| disk_progress(flavor, &d))
        .collect();
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Snapshot {
        vm_status,
        vm_error,
        disks,
    })
}

/// The message of condition `type_` when its status is `False`/`True` as given.
fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Why a VM is stuck, from its status (KubeVirt printableStatus, Deckhouse phase), with the
/// message of its failing condition when it has one.
pub fn vm_error(flavor: Flavor, vm: &Value) -> Option<String> {
    let (status, stuck) = match flavor {
        Flavor::KubeVirt => {
            let s = vm
                .pointer("/status/printableStatus")
                .and_then(Value::as_str)?;
            (s, KUBEVIRT_ERROR_STATES.contains(&s))
        }
        Flavor::Deckhouse => {
            let s = vm.pointer("/status/phase").and_then(Value::as_str)?;
            (s, DECKHOUSE_ERROR_PHASES.contains(&s))
        }
    };
    if !stuck {
        return None;
    }
    let message = ["Failure", "PodScheduled", "Synchronized", "Ready"]
        .iter()
        .filter_map(|t| condition(vm, t))
        .filter(|c| c["status"] != "True" || c["type"] == "Failure")
        .find_map(|c| c["message"].as_str().filter(|m| !m.is_empty()));
    Some(match message {
        Some(m) => format!("{status}: {m}"),
        None => status.to_owned(),
    })
}

/// The progress of one DataVolume (KubeVirt) or VirtualDisk (Deckhouse) object.
pub(crate) fn disk_progress(flavor: Flavor, disk: &Value) -> DiskProgress {
    let phase = disk
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending")
        .to_owned();
    let percent = disk
        .pointer("/status/progress")
        .and_then(Value::as_str)
        .and_then(|p| p.trim_end_matches('%').parse::<f64>().ok());
    let (ready, pending_first_consumer) = match flavor {
        Flavor::KubeVirt => (
            phase == "Succeeded",
            phase == "PendingPopulation" || phase == "WaitForFirstConsumer",
        ),
        Flavor::Deckhouse => (phase == "Ready", phase == "WaitForFirstConsumer"),
    };
    let restarts = disk
        .pointer("/status/restartCount")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let message = |c: &Value| {
        c["message"]
            .as_str()
            .filter(|m| !m.is_empty())
            .map(String::from)
    };
    let error = match flavor {
        // CDI: the importer's failure is on the Running condition (False, reason Error or
        // ImagePullFailed); a Failed phase says so on Ready.
        Flavor::KubeVirt => condition(disk, "Running")
            .filter(|c| {
                c["status"] == "False"
                    && matches!(
                        c["reason"].as_str(),
                        Some("Error" | "ImagePullFailed" | "CrashLoopBackOff")
                    )
            })
            .map(|c| {
                message(c).unwrap_or_else(|| c["reason"].as_str().unwrap_or("Error").to_owned())
            })
            .or_else(|| {
                (phase == "Failed").then(|| {
                    condition(disk, "Ready")
                        .and_then(message)
                        .unwrap_or_else(|| "import failed".into())
                })
            }),
        Flavor::Deckhouse => (phase == "Failed").then(|| {
            condition(disk, "Ready")
                .and_then(message)
                .unwrap_or_else(|| "provisioning failed".into())
        }),
    };
    // An image that cannot be pulled does not get better with retries.
    let image_pull_failed =
        condition(disk, "Running").is_some_and(|c| c["reason"] == "ImagePullFailed");
    DiskProgress {
        name: disk
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        phase: if image_pull_failed {
            "ImagePullFailed".into()
        } else {
            phase
        },
        percent: if ready { Some(100.0) } else { percent },
        ready,
        pending_first_consumer,
        error,
        restarts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn never(_: &str) -> u64 {
        0
    }

    fn snapshot(flavor: Flavor, disk: Value) -> Snapshot {
        Snapshot {
            vm_status: "Provisioning".into(),
            vm_error: None,
            disks: vec![disk_progress(flavor, &disk)],
        }
    }

    /// A CDI import whose importer keeps failing: Running False/Error with the importer's
    /// message and a restartCount (CDI `updateDvStatusFromPod`).
    fn failing_dv(restarts: u64, reason: &str) -> Value {
        json!({"metadata": {"name": "web-root"}, "status": {"phase": "ImportInProgress",
            "progress": "N/A", "restartCount": restarts, "conditions": [
                {"type": "Bound", "status": "True", "reason": "Bound"},
                {"type": "Running", "status": "False", "reason": reason,
                 "message": "Unable to connect to http data source: expected status code 200, got 404. Status: 404 Not Found"},
                {"type": "Ready", "status": "False", "reason": "TransferRunning"}]}})
    }

    #[test]
    fn a_cdi_import_that_keeps_failing_ends_the_wait() {
        let s = snapshot(Flavor::KubeVirt, failing_dv(3, "Error"));
        assert_eq!(
            stuck(&s, "web", &never).unwrap(),
            "disk \"web-root\" of virtual machine \"web\" cannot be provisioned: Unable to connect to http data source: expected status code 200, got 404. Status: 404 Not Found (import restarted 3 times)"
        );
        // One failure is not yet a pattern; a count that grows during the wait is.
        let s = snapshot(Flavor::KubeVirt, failing_dv(1, "Error"));
        assert!(stuck(&s, "web", &|_| 1).is_none());
        assert!(stuck(&s, "web", &never).is_some());
        // A registry image that cannot be pulled fails at once.
        let s = snapshot(Flavor::KubeVirt, failing_dv(0, "ImagePullFailed"));
        assert!(stuck(&s, "web", &never).is_some());
    }

    #[test]
    fn failed_disks_and_stuck_vms_end_the_wait() {
        let vd = json!({"metadata": {"name": "web-root"}, "status": {"phase": "Failed",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ProvisioningFailed",
                            "message": "Failed to import: 404 Not Found"}]}});
        let s = snapshot(Flavor::Deckhouse, vd);
        assert!(
            stuck(&s, "web", &never)
                .unwrap()
                .ends_with("cannot be provisioned: Failed to import: 404 Not Found")
        );

        // KubeVirt VM status as the API reports an unschedulable VM (printableStatus and the
        // VMI's PodScheduled condition mirrored onto the VM).
        let vm = json!({"status": {"printableStatus": "ErrorUnschedulable", "conditions": [
            {"type": "Ready", "status": "False", "reason": "GuestNotRunning", "message": "Guest VM is not reported as running"},
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/3 nodes are available: 3 Insufficient memory."}]}});
        assert_eq!(
            vm_error(Flavor::KubeVirt, &vm).unwrap(),
            "ErrorUnschedulable: 0/3 nodes are available: 3 Insufficient memory."
        );
        for status in ["ErrImagePull", "CrashLoopBackOff", "DataVolumeError"] {
            let vm = json!({"status": {"printableStatus": status}});
            assert_eq!(vm_error(Flavor::KubeVirt, &vm).as_deref(), Some(status));
        }
        assert!(
            vm_error(
                Flavor::KubeVirt,
                &json!({"status": {"printableStatus": "Starting"}})
            )
            .is_none()
        );
        let degraded = json!({"status": {"phase": "Degraded"}});
        assert_eq!(
            vm_error(Flavor::Deckhouse, &degraded).as_deref(),
            Some("Degraded")
        );
        let s = Snapshot {
            vm_status: "Degraded".into(),
            vm_error: Some("Degraded".into()),
            disks: vec![],
        };
        assert_eq!(
            stuck(&s, "web", &never).unwrap(),
            "virtual machine \"web\" is stuck: Degraded"
        );
    }

    #[test]
    fn wait_for_first_consumer_disks_are_recognised() {
        for phase in ["PendingPopulation", "WaitForFirstConsumer"] {
            let dv = json!({"metadata": {"name": "d"}, "status": {"phase": phase}});
            let p = disk_progress(Flavor::KubeVirt, &dv);
            assert!(
                p.pending_first_consumer && !p.ready && p.error.is_none(),
                "{phase}"
            );
        }
        let vd = json!({"metadata": {"name": "d"}, "status": {"phase": "WaitForFirstConsumer"}});
        assert!(disk_progress(Flavor::Deckhouse, &vd).pending_first_consumer);
        let vd = json!({"metadata": {"name": "d"}, "status": {"phase": "Provisioning"}});
        assert!(!disk_progress(Flavor::Deckhouse, &vd).pending_first_consumer);
    }

    #[test]
    fn progress_is_read_from_both_platforms() {
        let dv = json!({"metadata": {"name": "web-root"}, "status": {"phase": "ImportInProgress", "progress": "45.5%"}});
        let p = disk_progress(Flavor::KubeVirt, &dv);
        assert_eq!((p.percent, p.ready), (Some(45.5), false));
        let vd = json!({"metadata": {"name": "web-root"}, "status": {"phase": "Ready", "progress": "100%"}});
        let p = disk_progress(Flavor::Deckhouse, &vd);
        assert_eq!(
            (p.phase.as_str(), p.percent, p.ready),
            ("Ready", Some(100.0), true)
        );
        let pending = json!({"metadata": {"name": "x"}});
        assert_eq!(disk_progress(Flavor::Deckhouse, &pending).phase, "Pending");
    }
}
