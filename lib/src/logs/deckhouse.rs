//! Deckhouse: the VM's virt-launcher pod, named in `status.virtualMachinePods` (the active
//! one), else found by the label `vm.kubevirt.internal.virtualization.deckhouse.io/name`.
//! Only its launcher log: the platform keeps no console history (see the module above).

use serde_json::Value;

use super::{COMPUTE, Located, LogsRequest, pods};
use crate::api::DECKHOUSE_VM;
use crate::cluster::Cluster;
use crate::error::{Error, Result};

pub(super) async fn locate(cluster: &Cluster, req: &LogsRequest) -> Result<Located> {
    let (ns, name) = (req.namespace.as_str(), req.name.as_str());
    let vm = DECKHOUSE_VM
        .api(&cluster.client, Some(ns))
        .get(name)
        .await
        .map_err(|e| cluster.error(e, &DECKHOUSE_VM.action("get", Some(ns)).named(name)))?;
    let vm = serde_json::to_value(vm).map_err(|e| Error::Internal(e.to_string()))?;
    let active = vm["status"]["virtualMachinePods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["active"] == true)
        .and_then(|p| p["name"].as_str())
        .map(str::to_owned);
    let pod = match active {
        Some(p) => Some(p),
        None => {
            let selector = format!("vm.kubevirt.internal.virtualization.deckhouse.io/name={name}");
            let found = pods(cluster, ns, &selector).await?;
            found
                .iter()
                .find(|p| p["status"]["phase"] == "Running")
                .and_then(|p: &Value| p["metadata"]["name"].as_str())
                .map(str::to_owned)
        }
    };
    let Some(pod) = pod else {
        return Err(Error::NotRunning(format!(
            "{name}.{ns} is not running: it has no virt-launcher pod"
        )));
    };
    Ok(Located {
        pod,
        container: COMPUTE.to_owned(),
        previous: req.previous,
    })
}
