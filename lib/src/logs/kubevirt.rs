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
        let Some(pod) = earlier_run(&of_vm, current) else {
            return Err(Error::NotRunning(format!(
                "no virt-launcher pod of an earlier run of {name}.{ns} is left: KubeVirt deletes it with its VMI at a stop or restart, and its console log with it (collect-debug-info before restarting keeps it)"
            )));
        };
        return console_in(pod, name, ns, false);
    }
    let Some(pod) = current else {
        // No instance: a VM that does not exist says so (404), one that is stopped below.
        if vmi.is_none() {
            crate::api::KUBEVIRT_VM
                .api(&cluster.client, Some(ns))
                .get(name)
                .await
                .map_err(|e| {
                    cluster.error(
                        e,
                        &crate::api::KUBEVIRT_VM.action("get", Some(ns)).named(name),
                    )
                })?;
        }
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

/// The newest launcher pod of an earlier run of the VM that the cluster still has: one of
/// the VM's launchers (`of_vm`) other than the current one.
fn earlier_run<'a>(of_vm: &[&'a Value], current: Option<&Value>) -> Option<&'a Value> {
    of_vm
        .iter()
        .filter(|p| current.is_none_or(|c| c["metadata"]["uid"] != p["metadata"]["uid"]))
        .max_by_key(|p| p["metadata"]["creationTimestamp"].as_str().unwrap_or(""))
        .copied()
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn previous_is_the_newest_other_launcher() {
        let pod = |uid: &str, t: &str| json!({"metadata": {"name": format!("p-{uid}"), "uid": uid, "creationTimestamp": t}});
        let (old, older, now) = (
            pod("b", "2026-01-02T00:00:00Z"),
            pod("a", "2026-01-01T00:00:00Z"),
            pod("c", "2026-01-03T00:00:00Z"),
        );
        let all = [&older, &old, &now];
        assert_eq!(super::earlier_run(&all, Some(&now)), Some(&old));
        assert_eq!(super::earlier_run(&[&now], Some(&now)), None);
        assert_eq!(super::earlier_run(&all, None), Some(&now));
    }
}
