//! Waiting for a grown PersistentVolumeClaim, on both platforms.
//!
//! Kubernetes grows a claim in two steps. The external-resizer expands the volume (condition
//! `Resizing`, `status.allocatedResourceStatuses.storage: ControllerResizeInProgress`); a
//! filesystem volume then waits for the kubelet of a node where a running pod mounts it
//! (external-resizer `markForPendingNodeExpansion`: condition `FileSystemResizePending`,
//! "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
//! `NodeResizePending`), and only then does `status.capacity` show the new size (kubelet,
//! `resize_util.go` `MarkNodeExpansionFinishedWithRecovery`). While the VM that uses the disk is
//! stopped nothing mounts the claim: the wait ends on that condition and reports the size as
//! applied at the VM's next start instead of running to the timeout.

use serde_json::Value;

use super::{Event, quantity_of, text};
use crate::api::PVC;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::lifecycle::watch::{self, Watched};
use crate::quantity::Quantity;

/// What a claim that waits for node expansion says about it (`FileSystemResizePending` and its
/// message, or the `NodeResizePending` resize status), or `None` if it does not wait for it.
pub(crate) fn node_expansion_pending(pvc: &Value) -> Option<String> {
    let condition = pvc
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "FileSystemResizePending" && c["status"] == "True");
    if let Some(c) = condition {
        let message = text(c, "/message");
        return Some(if message.is_empty() {
            "FileSystemResizePending".to_owned()
        } else {
            format!("FileSystemResizePending: {message}")
        });
    }
    (text(pvc, "/status/allocatedResourceStatuses/storage") == "NodeResizePending")
        .then(|| "NodeResizePending".to_owned())
}

/// How a claim's growth ended.
pub(crate) struct ClaimGrown {
    /// The claim as last seen.
    pub claim: Value,
    /// Set when the claim waits for a pod to mount it (the VM is stopped): its words.
    pub pending: Option<String>,
}

/// Watch claim `claim` until its capacity reaches `size` or, when `vm_stopped`, until it waits
/// for node expansion. Reports each new True condition as a phase.
pub(crate) async fn wait_claim(
    cluster: &Cluster,
    ns: &str,
    claim: &str,
    size: Quantity,
    vm_stopped: bool,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<ClaimGrown> {
    let mut last = String::new();
    watch::until(cluster, &[Watched::new(PVC, ns, claim)], |objs| {
        let Some(p) = objs[0].as_ref() else {
            return Some(Err(Error::Platform(format!(
                "claim {claim} was deleted while it was growing"
            ))));
        };
        let condition = p
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| c["status"] == "True")
            .map(|c| (text(c, "/type").to_owned(), text(c, "/message").to_owned()));
        if let Some((phase, message)) = condition
            && phase != last
        {
            last = phase.clone();
            on_event(Event::Phase { phase, message });
        }
        let capacity = quantity_of(p.pointer("/status/capacity/storage"));
        if capacity.is_some_and(|c| c >= size) {
            return Some(Ok(ClaimGrown {
                claim: p.clone(),
                pending: None,
            }));
        }
        let pending = vm_stopped.then(|| node_expansion_pending(p)).flatten()?;
        Some(Ok(ClaimGrown {
            claim: p.clone(),
            pending: Some(format!("persistentvolumeclaim/{claim}: {pending}")),
        }))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pending_node_expansion_is_read_from_the_condition_or_the_status() {
        let message =
            "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";
        let pvc = json!({"status": {"conditions": [
            {"type": "FileSystemResizePending", "status": "True", "message": message}],
            "allocatedResourceStatuses": {"storage": "NodeResizePending"}}});
        assert_eq!(
            node_expansion_pending(&pvc).as_deref(),
            Some(
                "FileSystemResizePending: Waiting for user to (re-)start a pod to finish file system resize of volume on node."
            )
        );
        let status_only =
            json!({"status": {"allocatedResourceStatuses": {"storage": "NodeResizePending"}}});
        assert_eq!(
            node_expansion_pending(&status_only).as_deref(),
            Some("NodeResizePending")
        );
        let resizing = json!({"status": {"conditions": [{"type": "Resizing", "status": "True"}],
            "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"}}});
        assert_eq!(node_expansion_pending(&resizing), None);
    }
}
