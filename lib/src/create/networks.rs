//! `create --network` (secondary networks, as `set network --add` makes them) and `--ip`.
//!
//! `--ip ADDRESS` (Deckhouse): a fixed address in the main cluster network, a
//! VirtualMachineIPAddress of type Static that the VM names in
//! `spec.virtualMachineIPAddressName` (the virtualization user guide, "Assigning a specific IP
//! address"). KubeVirt gives the pod network's address from the pod's CNI, so it is refused
//! there with the reason.
//!
//! `--ip NAME=ADDRESS/PREFIX` (KubeVirt): a static IPv4 address of the secondary network NAME
//! (one of this create's `--network`s), written into the guest's cloud-init network data
//! ([`network_data`]): every interface gets a MAC address made here, and the network data
//! (Networking Config Version 2) matches each interface by it. Deckhouse's reason for refusing
//! it is in its platform table (`secondary_static_ip`).

use std::net::Ipv4Addr;

use serde_json::{Value, json};

use super::plan::{OsType, VmPlan};
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

/// `--ip NAME=ADDRESS/PREFIX`: a static IPv4 address of secondary network NAME.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticIp {
    /// The `--network` (KubeVirt: interface) name.
    pub network: String,
    /// The address.
    pub address: Ipv4Addr,
    /// The prefix length, 1 to 32.
    pub prefix: u8,
}

impl StaticIp {
    /// Parse `NAME=ADDRESS/PREFIX` (one line on error, naming the flag): a valid IPv4 address,
    /// a prefix of 1 to 32, and not the network or broadcast address of a subnet that has them
    /// (a /31 or /32 has neither, RFC 3021).
    pub fn parse(text: &str) -> std::result::Result<StaticIp, String> {
        let usage = || {
            format!(
                "invalid --ip {text:?}: give NAME=ADDRESS/PREFIX, e.g. storage=192.168.50.10/24"
            )
        };
        let (network, cidr) = text.split_once('=').ok_or_else(usage)?;
        if network.is_empty() {
            return Err(usage());
        }
        let (address, prefix) = cidr.split_once('/').ok_or_else(usage)?;
        let address: Ipv4Addr = address
            .parse()
            .map_err(|_| format!("invalid --ip {text:?}: {address:?} is not an IPv4 address"))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| (1..=32).contains(p))
            .ok_or_else(|| {
                format!("invalid --ip {text:?}: the prefix length must be a number from 1 to 32")
            })?;
        let host_mask = u32::MAX.checked_shr(u32::from(prefix)).unwrap_or(0);
        let host = u32::from(address) & host_mask;
        let subnet = Ipv4Addr::from(u32::from(address) & !host_mask);
        if prefix <= 30 && host == 0 {
            return Err(format!(
                "invalid --ip {text:?}: {address} is the network address of {subnet}/{prefix}: give a host address"
            ));
        }
        if prefix <= 30 && host == host_mask {
            return Err(format!(
                "invalid --ip {text:?}: {address} is the broadcast address of {subnet}/{prefix}: give a host address"
            ));
        }
        Ok(StaticIp {
            network: network.to_owned(),
            address,
            prefix,
        })
    }

    /// `ADDRESS/PREFIX`, as network data writes it.
    pub fn cidr(&self) -> String {
        format!("{}/{}", self.address, self.prefix)
    }
}

/// The `--ip` without a `NAME=`: the main network's address (Deckhouse).
pub fn main_ip(plan: &VmPlan) -> Option<&str> {
    plan.extras
        .ip
        .iter()
        .find(|t| !t.contains('='))
        .map(String::as_str)
}

/// The `--ip NAME=ADDRESS/PREFIX` of a validated plan.
pub fn static_ips(plan: &VmPlan) -> Vec<StaticIp> {
    plan.extras
        .ip
        .iter()
        .filter(|t| t.contains('='))
        .filter_map(|t| StaticIp::parse(t).ok())
        .collect()
}

/// The checks of `--network` and `--ip`, before any request; one line each.
pub(crate) fn validate(plan: &VmPlan) -> std::result::Result<(), String> {
    let x = &plan.extras;
    let text = |e: Error| {
        format!("--network: {e}").replace("--network: invalid --add", "invalid --network")
    };
    let req = request(plan).map_err(text)?;
    spec::check(plan.flavor, &req).map_err(text)?;
    let caps = crate::platform::of(plan.flavor);
    let (main, secondary): (Vec<&String>, Vec<&String>) =
        x.ip.iter().partition(|t| !t.contains('='));
    if let [first, second, ..] = main.as_slice() {
        return Err(format!(
            "--ip {first} and --ip {second}: the main network takes one address"
        ));
    }
    if let Some(ip) = main.first() {
        if let Some(why) = caps.fixed_ip.reason() {
            return Err(why.into());
        }
        if ip.parse::<Ipv4Addr>().is_err() {
            return Err(format!(
                "invalid --ip {ip:?}: give an IPv4 address, e.g. 10.66.10.20"
            ));
        }
    }
    let mut seen: Vec<String> = Vec::new();
    for text in secondary {
        if let Some(why) = caps.secondary_static_ip.reason() {
            return Err(why.into());
        }
        let ip = StaticIp::parse(text)?;
        if !req.add.iter().any(|a| a.name == ip.network) {
            return Err(format!(
                "--ip {text}: {:?} is not a --network of this VM: add --network {}[=NAD]",
                ip.network, ip.network
            ));
        }
        if seen.contains(&ip.network) {
            return Err(format!(
                "--ip {text}: network {:?} has an address already: one address per network",
                ip.network
            ));
        }
        if plan.os == OsType::Windows {
            return Err(format!(
                "--ip {text}: the address is written into cloud-init network data, which Linux guests apply: configure a Windows guest's address inside it"
            ));
        }
        seen.push(ip.network);
    }
    if !x.ip.is_empty() && plan.replicas.is_some() {
        return Err("--ip is one address: it cannot be used with --replicas".into());
    }
    Ok(())
}

/// KubeVirt: the guest's network data for `--ip NAME=ADDRESS/PREFIX` (`None` without one),
/// with the MAC address made for each interface it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkData {
    /// Each interface of the VM (the pod network's first) and the MAC address made for it.
    pub macs: Vec<(String, String)>,
    /// The cloud-init network configuration, Networking Config Version 2.
    pub text: String,
}

/// A locally administered unicast MAC address (the first octet's bit 1 set, bit 0 clear:
/// IEEE 802 "U/L" and "I/G" bits), `02:xx:xx:xx:xx:xx`, the rest random.
pub fn random_mac() -> String {
    let mut bytes = [0u8; 5];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    let mut mac = String::from("02");
    for b in bytes {
        mac.push_str(&format!(":{b:02x}"));
    }
    mac
}

/// The network data of `plan`, with MAC addresses made by [`random_mac`], for the interfaces
/// `pod_interface` (the pod network's) and each `--network`.
///
/// Cloud-init's Networking Config Version 2: one `ethernets` entry per interface, matched by
/// `macaddress` (without `set-name` cloud-init takes the name of the interface that has that
/// MAC: `cloudinit/net/network_state.py` `handle_ethernets`); the pod network's by DHCP, a
/// static one with `addresses` and no DHCP, any other secondary network by DHCP but
/// `optional` (its network may have no DHCP server, and the boot does not wait for it).
pub fn network_data(plan: &VmPlan, pod_interface: &str) -> Option<NetworkData> {
    let ips = static_ips(plan);
    if ips.is_empty() {
        return None;
    }
    let mut names = vec![pod_interface.to_owned()];
    if let Ok(req) = request(plan) {
        names.extend(req.add.into_iter().map(|a| a.name));
    }
    let macs: Vec<(String, String)> = names.into_iter().map(|n| (n, random_mac())).collect();
    Some(NetworkData {
        text: network_config(&macs, pod_interface, &ips),
        macs,
    })
}

/// The Networking Config Version 2 text for interfaces `macs`.
pub fn network_config(macs: &[(String, String)], pod_interface: &str, ips: &[StaticIp]) -> String {
    let mut ethernets = serde_json::Map::new();
    for (name, mac) in macs {
        let mut entry = json!({"match": {"macaddress": mac}});
        match ips.iter().find(|ip| ip.network == *name) {
            Some(ip) => {
                entry["addresses"] = json!([ip.cidr()]);
                entry["dhcp4"] = json!(false);
            }
            None => {
                entry["dhcp4"] = json!(true);
                if name != pod_interface {
                    entry["optional"] = json!(true);
                }
            }
        }
        ethernets.insert(name.clone(), entry);
    }
    let config = json!({"version": 2, "ethernets": ethernets});
    yaml_serde::to_string(&config).expect("a JSON value always serialises as YAML")
}

/// Give each interface of the built KubeVirt VM the MAC address `macs` holds for it.
pub(super) fn set_macs(vm: &mut Value, macs: &[(String, String)]) {
    let Some(interfaces) = vm
        .pointer_mut("/spec/template/spec/domain/devices/interfaces")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for interface in interfaces {
        if let Some((_, mac)) = macs.iter().find(|(n, _)| interface["name"] == *n) {
            interface["macAddress"] = json!(mac);
        }
    }
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
    if main_ip(plan).is_some() {
        vm["spec"]["virtualMachineIPAddressName"] = json!(ip_address_name(&plan.name));
    }
}

/// The VirtualMachineIPAddress of `--ip` (not owned by the VM: `delete --keep-ip` keeps it).
pub(super) fn ip_address(plan: &VmPlan) -> Option<PlannedObject> {
    let ip = main_ip(plan)?;
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

#[cfg(test)]
mod tests;
