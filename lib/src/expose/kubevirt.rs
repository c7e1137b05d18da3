//! KubeVirt: virt-launcher's pod carries `vm.kubevirt.io/name: <host name>` (the template's
//! `spec.hostname`, else the VM's name up to its first dot: see
//! [`crate::vm::kubevirt_launcher_host_label`]). Another VM in the namespace with the same
//! host name would be selected too, so that is refused before anything is created.

use kube::api::ListParams;
use serde_json::{Value, json};

use crate::api::KUBEVIRT_VM;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::lifecycle::VmRef;
use crate::vm::kubevirt_launcher_host_label;

/// The pod label virt-controller sets to the guest's host name.
pub const HOST_NAME_LABEL: &str = "vm.kubevirt.io/name";

/// The Service selector for `vm`, refused when another VM's pod would match it too.
pub async fn selector(cluster: &Cluster, target: &VmRef, vm: &Value) -> Result<Value> {
    let host = kubevirt_launcher_host_label(vm);
    let ns = &target.namespace;
    let list = KUBEVIRT_VM
        .api(&cluster.client, Some(ns))
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.error(e, &KUBEVIRT_VM.action("list", Some(ns))))?;
    let sharing: Vec<String> = list
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .filter(|other| other["metadata"]["name"] != json!(target.name))
        .filter(|other| kubevirt_launcher_host_label(other) == host)
        .filter_map(|other| other["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    if !sharing.is_empty() {
        return Err(Error::Platform(format!(
            "VM {} has the host name {host:?} that VM {} in namespace {ns:?} has too, and KubeVirt labels their pods alike ({HOST_NAME_LABEL}={host}): a Service would reach both; give one of them its own spec.template.spec.hostname (nothing was created)",
            target.name,
            sharing.join(", ")
        )));
    }
    Ok(json!({ HOST_NAME_LABEL: host }))
}
