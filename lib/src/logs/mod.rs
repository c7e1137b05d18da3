//! `kubectl vm logs VM`: the guest's serial console history as the platform keeps it, or the
//! virt-launcher's own log, read through the `pods/log` subresource and streamed (never held
//! whole).
//!
//! KubeVirt keeps the serial console in the `guest-console-log` container of the VM's
//! virt-launcher pod (kubevirt `pkg/virt-controller/services/serialconsolelog.go`: a native
//! sidecar running `virt-tail` on libvirt's serial log). It is there unless
//! `spec.template.spec.domain.devices.logSerialConsole` is false, or, when that is unset, the
//! KubeVirt CR sets `spec.configuration.virtualMachineOptions.disableSerialConsoleLog`; both
//! take effect at the VM's next start (a new launcher pod). Deckhouse virtualization runs that
//! same KubeVirt but its module always sets `disableSerialConsoleLog: {}`
//! (deckhouse/virtualization `templates/kubevirt/kubevirt.yaml`) and its VirtualMachine has no
//! field to turn it on: it keeps no console history ([`crate::platform::Capabilities::console_log`]).
//!
//! `--previous`: a restart makes a new VMI and a new launcher pod; the old pod is deleted with
//! the old VMI, and with it its console log. `previous` of the *current* pod's container would
//! only name an earlier instance of the `virt-tail` sidecar, not the VM's previous run. So
//! `--previous` reads the newest launcher pod of the VM other than the current one while the
//! cluster still has it (a VM just restarted, a pod not yet collected), and says plainly when
//! none is left. With `--launcher` it is kubectl's `--previous`: the launcher container's
//! earlier instance in the current pod.

mod deckhouse;
mod kubevirt;

use std::time::Duration;

use futures::AsyncReadExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};
use serde_json::Value;

use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};
use crate::flavor::Flavor;

/// The launcher container that runs libvirt and qemu (both platforms).
pub const COMPUTE: &str = "compute";
/// KubeVirt's serial console log container (upstream `serialconsolelog.go`).
pub const CONSOLE_CONTAINER: &str = "guest-console-log";

/// Which log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The guest's serial console history.
    Console,
    /// The virt-launcher's own container (`compute`).
    Launcher,
}

/// What to read.
#[derive(Debug, Clone)]
pub struct LogsRequest {
    /// VM namespace.
    pub namespace: String,
    /// VM name.
    pub name: String,
    /// Console or launcher.
    pub source: Source,
    /// Keep reading as lines arrive.
    pub follow: bool,
    /// Only lines newer than this.
    pub since: Option<Duration>,
    /// Only the last N lines.
    pub tail: Option<i64>,
    /// Prefix each line with the time it was written.
    pub timestamps: bool,
    /// Before the last restart (see the module documentation).
    pub previous: bool,
}

impl LogsRequest {
    /// Checks what can be checked without the cluster.
    pub fn validate(&self) -> Result<()> {
        if let Some(t) = self.tail
            && t < 0
        {
            return Err(Error::Usage(format!(
                "--tail must be 0 or more (or -1: all lines), not {t}"
            )));
        }
        if self.since.is_some_and(|d| d.is_zero()) {
            return Err(Error::Usage("--since must be more than 0s".into()));
        }
        Ok(())
    }
}

/// Where a log is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The pod.
    pub pod: String,
    /// Its container.
    pub container: String,
    /// The container's previous instance (kubelet's `previous=true`).
    pub previous: bool,
}

/// Finds the pod and container that hold the log the request asks for.
pub async fn locate(cluster: &Cluster, flavor: Flavor, req: &LogsRequest) -> Result<Located> {
    if req.source == Source::Console {
        crate::platform::of(flavor)
            .console_log
            .check()
            .map_err(|e| Error::Usage(e.to_string()))?;
    }
    match flavor {
        Flavor::KubeVirt => kubevirt::locate(cluster, req).await,
        Flavor::Deckhouse => deckhouse::locate(cluster, req).await,
    }
}

/// Streams the log at `at` into `out` as it arrives (a buffer at a time: memory does not grow
/// with the log), until it ends (with `follow`, when the container ends). The inner result is
/// writing to `out` (a closed pipe is the reader's choice, not a failure of the cluster).
pub async fn copy(
    cluster: &Cluster,
    req: &LogsRequest,
    at: &Located,
    out: &mut (impl std::io::Write + ?Sized),
) -> Result<std::io::Result<()>> {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &req.namespace);
    let params = LogParams {
        container: Some(at.container.clone()),
        follow: req.follow,
        previous: at.previous,
        since_seconds: req.since.map(|d| d.as_secs().max(1) as i64),
        tail_lines: req.tail,
        timestamps: req.timestamps,
        ..LogParams::default()
    };
    let action = Action::new("get", "pods/log", "pod")
        .named(&at.pod)
        .in_namespace(Some(&req.namespace));
    let stream = api
        .log_stream(&at.pod, &params)
        .await
        .map_err(|e| cluster.error(e, &action))?;
    let mut stream = std::pin::pin!(stream);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| Error::Transfer(format!("reading the log of pod/{}: {e}", at.pod)))?;
        if n == 0 {
            break;
        }
        let written = out
            .write_all(&buf[..n])
            .and_then(|()| if req.follow { out.flush() } else { Ok(()) });
        if let Err(e) = written {
            return Ok(Err(e));
        }
    }
    Ok(out.flush())
}

/// Whether `pod` has a container (or init container, where native sidecars live) `name`.
fn has_container(pod: &Value, name: &str) -> bool {
    ["containers", "initContainers"].iter().any(|field| {
        pod["spec"][field]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["name"] == name))
    })
}

/// The pods in `namespace` matching `selector`, as JSON.
async fn pods(cluster: &Cluster, namespace: &str, selector: &str) -> Result<Vec<Value>> {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    let list = api
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .map_err(|e| {
            cluster.error(
                e,
                &Action::new("list", "pods", "pod").in_namespace(Some(namespace)),
            )
        })?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|p| serde_json::to_value(p).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> LogsRequest {
        LogsRequest {
            namespace: "default".into(),
            name: "web".into(),
            source: Source::Console,
            follow: false,
            since: None,
            tail: None,
            timestamps: false,
            previous: false,
        }
    }

    #[test]
    fn bad_tail_and_since_are_refused() {
        assert!(req().validate().is_ok());
        let r = LogsRequest {
            tail: Some(-2),
            ..req()
        };
        assert!(matches!(r.validate(), Err(Error::Usage(m)) if m.contains("--tail")));
        let r = LogsRequest {
            since: Some(Duration::ZERO),
            ..req()
        };
        assert!(matches!(r.validate(), Err(Error::Usage(m)) if m.contains("--since")));
    }

    #[test]
    fn sidecars_count_as_containers() {
        let pod = serde_json::json!({"spec": {"containers": [{"name": "compute"}],
            "initContainers": [{"name": "guest-console-log"}]}});
        assert!(has_container(&pod, CONSOLE_CONTAINER));
        assert!(has_container(&pod, COMPUTE));
        assert!(!has_container(&pod, "other"));
    }
}
