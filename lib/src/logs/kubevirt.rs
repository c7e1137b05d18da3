//! KubeVirt: the VMI's virt-launcher pod (label `kubevirt.io/created-by: <VMI uid>`,
//! `template.go` RenderLaunchManifest) and its `guest-console-log` sidecar.

use serde_json::Value;

use super::{COMPUTE, CONSOLE_CONTAINER, Located, LogsRequest, Source, has_container, pods};
use crate::api::KUBEVIRT_VMI;
use crate::cluster::Cluster;
use crate::error::{Error, Result};

/// The setting that makes KubeVirt keep a VM's console log, said to the user.
pub const ENABLE: &str = "set spec.template.spec.domain.devices.logSerialConsole: true on the VM (`kubectl vm create --console-log` does) and restart it, or remove spec.configuration.virtualMachineOptions.disableSerialConsoleLog from the KubeVirt CR (then every VM that does not set logSerialConsole: false keeps it from its next start)";

pub(super) async fn locate(cluster: &Cluster, req: &LogsRequest) -> Result<Located> {
    let (ns, name) = (req.namespace.as_str(), req.name.as_str());
    let vmi = KUBEVIRT_VMI
        .api(&cluster.client, Some(ns))
        .get_opt(name)
        .await
        .map_err(|e| cluster.error(e, &KUBEVIRT_VMI.action("get", Some(ns)).named(name)))?
        .and_then(|v| serde_json::to_value(v).ok());
    let launchers = pods(cluster, ns, "kubevirt.io=virt-launcher").await?;
    // Launchers are owned by their VMI and labelled with its uid; the host-name label is the
    // fallback for a pod whose owner reference is gone (as collect-debug-info finds them).
    let uid = vmi.as_ref().map(|v| v["metadata"]["uid"].clone());
    let owned = |p: &&Value| {
        p["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|o| {
                o.iter()
                    .any(|r| r["kind"] == "VirtualMachineInstance" && r["name"] == name)
            })
    };
    let by_uid = |p: &&Value| {
        uid.as_ref()
            .is_some_and(|u| p["metadata"]["labels"]["kubevirt.io/created-by"] == *u)
    };
    let of_vm: Vec<&Value> = launchers.iter().filter(owned).collect();
    let current = launchers.iter().find(by_uid).or_else(|| {
        vmi.as_ref()?;
        launchers.iter().find(|p| {
            p["metadata"]["labels"]["vm.kubevirt.io/name"] == name
                && p["status"]["phase"] == "Running"
        })
    });
    let container = match req.source {
        Source::Console => CONSOLE_CONTAINER,
        Source::Launcher => COMPUTE,
    };
    if req.previous && req.source == Source::Console {
        // The newest launcher pod of an earlier run that is still there.
        let mut earlier: Vec<&Value> = of_vm
            .iter()
            .filter(|p| current.is_none_or(|c| c["metadata"]["uid"] != p["metadata"]["uid"]))
            .copied()
            .collect();
        earlier.sort_by_key(|p| {
            p["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        });
        let Some(pod) = earlier.last() else {
            return Err(Error::NotRunning(format!(
                "no virt-launcher pod of an earlier run of {name}.{ns} is left: KubeVirt deletes it with its VMI at a stop or restart, and its console log with it (collect-debug-info before restarting keeps it)"
            )));
        };
        return console_in(pod, name, ns, false);
    }
    let Some(pod) = current else {
        return Err(Error::NotRunning(format!(
            "{name}.{ns} is not running: it has no virt-launcher pod{}",
            if req.source == Source::Console {
                " (the console history lives in it; --previous reads an earlier run's pod while it is left)"
            } else {
                ""
            }
        )));
    };
    match req.source {
        Source::Console => console_in(pod, name, ns, false),
        Source::Launcher => Ok(Located {
            pod: pod_name(pod),
            container: container.to_owned(),
            previous: req.previous,
        }),
    }
}

fn pod_name(pod: &Value) -> String {
    pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The console container of `pod`, or what to do when the VM's run does not keep it.
fn console_in(pod: &Value, name: &str, ns: &str, previous: bool) -> Result<Located> {
    if !has_container(pod, CONSOLE_CONTAINER) {
        return Err(Error::Usage(format!(
            "{name}.{ns} does not keep its serial console log (its virt-launcher pod {} has no {CONSOLE_CONTAINER} container): {ENABLE}",
            pod_name(pod)
        )));
    }
    Ok(Located {
        pod: pod_name(pod),
        container: CONSOLE_CONTAINER.to_owned(),
        previous,
    })
}
