//! `create --network` (secondary networks, as `set network --add` makes them) and `--ip`
//! (Deckhouse: a fixed address in the main cluster network, a VirtualMachineIPAddress of type
//! Static that the VM names in `spec.virtualMachineIPAddressName`; the virtualization user
//! guide, "Assigning a specific IP address"). KubeVirt gives the pod network's address from the
//! pod's CNI, so `--ip` is refused there with the reason.

use std::net::Ipv4Addr;

use serde_json::{Value, json};

use super::plan::VmPlan;
use super::{PlannedObject, metadata};
use crate::error::{Error, Result};
use crate::network::spec::{self, Networks};

/// The name of the VirtualMachineIPAddress `create --ip` makes for VM `vm`.
pub fn ip_address_name(vm: &str) -> String {
    format!("{vm}-ip")
}

fn request(plan: &VmPlan) -> Result<Networks> {
    Ok(Networks {
        add: plan
            .extras
            .networks
            .iter()
            .map(|t| spec::Attach::parse(t))
            .collect::<Result<_>>()?,
        remove: vec![],
    })
}

/// The checks of `--network` and `--ip`, before any request; one line each.
pub(crate) fn validate(plan: &VmPlan) -> std::result::Result<(), String> {
    let x = &plan.extras;
    let text = |e: Error| {
        format!("--network: {e}").replace("--network: invalid --add", "invalid --network")
    };
    let req = request(plan).map_err(text)?;
    spec::check(plan.flavor, &req).map_err(text)?;
    if let Some(ip) = &x.ip {
        if let Some(why) = crate::platform::of(plan.flavor).fixed_ip.reason() {
            return Err(why.into());
        }
        if ip.parse::<Ipv4Addr>().is_err() {
            return Err(format!(
                "invalid --ip {ip:?}: give an IPv4 address, e.g. 10.66.10.20"
            ));
        }
        if plan.replicas.is_some() {
            return Err("--ip is one address: it cannot be used with --replicas".into());
        }
    }
    Ok(())
}

/// Add the secondary networks to the built VM object (KubeVirt: its template; Deckhouse:
/// `spec.networks`) and, for `--ip`, name the VirtualMachineIPAddress.
pub(super) fn apply(plan: &VmPlan, vm: &mut Value) {
    if let Ok(req) = request(plan)
        && !req.add.is_empty()
    {
        // Checked by `validate`: the edit of a fresh VM cannot be refused.
        let _ = spec::edit(plan.flavor, &req, vm);
    }
    if plan.extras.ip.is_some() {
        vm["spec"]["virtualMachineIPAddressName"] = json!(ip_address_name(&plan.name));
    }
}

/// The VirtualMachineIPAddress of `--ip` (not owned by the VM: `delete --keep-ip` keeps it).
pub(super) fn ip_address(plan: &VmPlan) -> Option<PlannedObject> {
    let ip = plan.extras.ip.as_ref()?;
    Some(PlannedObject::new(json!({
        "apiVersion": crate::api::VIRTUAL_MACHINE_IP_ADDRESS.api_version(),
        "kind": "VirtualMachineIPAddress",
        "metadata": metadata(plan, &ip_address_name(&plan.name)),
        "spec": {"type": "Static", "staticIP": ip},
    })))
}

/// The network objects `--network` names must exist (KubeVirt's NetworkAttachmentDefinitions,
/// Deckhouse's Networks and ClusterNetworks).
pub async fn check(cluster: &crate::cluster::Cluster, plan: &VmPlan) -> Result<()> {
    let req = request(plan)?;
    let vm = json!({"metadata": {"namespace": plan.namespace}});
    for object in spec::objects(plan.flavor, &req, &vm)? {
        spec::must_exist(cluster, &object).await?;
    }
    Ok(())
}
