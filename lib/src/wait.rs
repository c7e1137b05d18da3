//! Waiting for a new VM: its disks import (with progress), then it reaches the state its run
//! strategy asks for.

use std::time::Duration;

use kube::api::ListParams;
use serde_json::Value;

use crate::api::{DATA_VOLUME, Kind, VIRTUAL_DISK};
use crate::cluster::Cluster;
use crate::create::companion_selector;
use crate::error::{Error, Result};
use crate::flavor::Flavor;

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
}

/// What the VM and its disks look like now.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// VM status (`Provisioning`, `Starting`, `Running`, `Stopped`, …).
    pub vm_status: String,
    /// The disks created for it.
    pub disks: Vec<DiskProgress>,
}

/// Wait until VM `name` has status `want` (`Running`, or `Stopped` for a VM created stopped),
/// calling `on_change` whenever the snapshot changes. A failed disk import ends the wait.
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
        loop {
            let snapshot = read(cluster, flavor, name, namespace).await?;
            if last.as_ref() != Some(&snapshot) {
                on_change(&snapshot);
            }
            if let Some(failed) = snapshot.disks.iter().find(|d| d.phase == "Failed") {
                return Err(Error::Invalid(format!(
                    "disk {:?} of virtual machine {name:?} failed to provision; see `kubectl describe` of the disk",
                    failed.name
                )));
            }
            if snapshot.vm_status == want {
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
    let status_pointer = match flavor {
        Flavor::KubeVirt => "/status/printableStatus",
        Flavor::Deckhouse => "/status/phase",
    };
    let vm_status = vm
        .pointer(status_pointer)
        .and_then(Value::as_str)
        .unwrap_or("Pending")
        .to_owned();
    let disk_kind = match flavor {
        Flavor::KubeVirt => DATA_VOLUME,
        Flavor::Deckhouse => VIRTUAL_DISK,
    };
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
    Ok(Snapshot { vm_status, disks })
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
    let ready = match flavor {
        Flavor::KubeVirt => phase == "Succeeded",
        Flavor::Deckhouse => phase == "Ready",
    };
    DiskProgress {
        name: disk
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        phase,
        percent: if ready { Some(100.0) } else { percent },
        ready,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
