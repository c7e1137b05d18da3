//! The network cards of a real guest: one per interface the platform reports, with the MAC it
//! reports, so what `kubectl get vmi` says is what the guest sees.
//!
//! - KubeVirt: the VMI's `status.interfaces` (one per interface of the spec, `network.rs`);
//!   the pod network's interface is the guest's link to the emulator (qemu's user network, with
//!   the port forwards), a Multus interface with bridge binding is a card on a link of its own.
//! - Deckhouse: the VM's `status.networks`: `Main` (no MAC reported: qemu's own) and the
//!   additional networks with their `macAddress`.
//!
//! A secondary card is on a qemu hub of its own (`-netdev hubport`): the guest sees the card and
//! its link, and configures it from its cloud-init network data as on a bridge.

use std::collections::BTreeSet;
use std::io;
use std::path::Path;

use serde_json::{Value, json};

use super::process::qmp;

/// One card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Nic {
    /// The platform's interface or network name.
    pub name: String,
    /// The MAC the platform reports, if any.
    pub mac: Option<String>,
    /// The pod (main) network's card.
    pub main: bool,
}

fn text<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// The cards of a KubeVirt guest from its VMI (`spec.networks` says which is the pod's).
pub(super) fn kubevirt(vmi: &Value) -> Vec<Nic> {
    let networks = vmi
        .pointer("/spec/networks")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let pod = |name: &str| {
        networks
            .iter()
            .find(|n| text(n, "name") == Some(name))
            .is_none_or(|n| n.get("pod").is_some())
    };
    let reported = vmi
        .pointer("/status/interfaces")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut nics: Vec<Nic> = reported
        .iter()
        .map(|i| {
            let name = text(i, "name").unwrap_or("default").to_owned();
            Nic {
                main: pod(&name),
                mac: text(i, "mac").map(str::to_owned),
                name,
            }
        })
        .collect();
    finish(&mut nics);
    nics
}

/// The cards of a Deckhouse guest from its VM's `status.networks`.
pub(super) fn deckhouse(vm: &Value) -> Vec<Nic> {
    let reported = vm
        .pointer("/status/networks")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut nics: Vec<Nic> = reported
        .iter()
        .map(|n| Nic {
            main: text(n, "type") == Some("Main"),
            name: text(n, "name").unwrap_or("main").to_owned(),
            mac: text(n, "macAddress").map(str::to_owned),
        })
        .collect();
    finish(&mut nics);
    nics
}

/// The main card first (the guest's first card is the one cloud-init's fallback configures),
/// exactly one of it.
fn finish(nics: &mut Vec<Nic>) {
    nics.sort_by_key(|n| !n.main);
    if nics.first().is_none_or(|n| !n.main) {
        nics.insert(
            0,
            Nic {
                name: "default".into(),
                mac: None,
                main: true,
            },
        );
    }
    let mut seen_main = false;
    nics.retain(|n| !(n.main && std::mem::replace(&mut seen_main, true)));
}

impl Nic {
    /// The qemu ids of a secondary card and of its netdev, and its hub: derived from the MAC
    /// (else the name), so a later pass finds what an earlier one plugged.
    fn ids(&self) -> (String, String, u32) {
        let key: String = match &self.mac {
            Some(mac) => mac.chars().filter(char::is_ascii_hexdigit).collect(),
            None => self
                .name
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .collect(),
        };
        let hub = key
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
            % 1_000_000;
        (
            format!("{DEVICE_PREFIX}{key}"),
            format!("{NETDEV_PREFIX}{key}"),
            hub,
        )
    }

    fn device(&self, netdev: &str) -> Value {
        let mut args = json!({"driver": "virtio-net-pci", "netdev": netdev});
        if let Some(mac) = &self.mac {
            args["mac"] = json!(mac);
        }
        args
    }
}

/// Prefix of the qemu ids of secondary cards (`nic…`) and their netdevs (`nd…`).
const DEVICE_PREFIX: &str = "nic";
const NETDEV_PREFIX: &str = "nd";

/// The qemu arguments of `nics`; the main card on netdev `main_netdev` (which the caller
/// defines), each other on a hub of its own.
pub(super) fn args(nics: &[Nic], main_netdev: &str) -> Vec<String> {
    let mut args = Vec::new();
    for nic in nics {
        let mut device = if nic.main {
            format!("virtio-net-pci,netdev={main_netdev}")
        } else {
            let (id, netdev, hub) = nic.ids();
            args.extend([
                "-netdev".to_owned(),
                format!("hubport,id={netdev},hubid={hub}"),
            ]);
            format!("virtio-net-pci,id={id},netdev={netdev}")
        };
        if let Some(mac) = &nic.mac {
            device.push_str(&format!(",mac={mac}"));
        }
        args.extend(["-device".to_owned(), device]);
    }
    args
}

/// The QMP commands that make a qemu whose secondary cards are `plugged` (device ids) hold
/// exactly the secondary cards of `want`: `device_del` of what is gone (the guest acknowledges
/// the ACPI eject), `netdev_add` and `device_add` of what is new. `netdevs` are the netdevs
/// still defined: one whose card is gone is deleted.
pub(super) fn commands(
    plugged: &BTreeSet<String>,
    netdevs: &BTreeSet<String>,
    want: &[Nic],
) -> Vec<Value> {
    let secondary: Vec<&Nic> = want.iter().filter(|n| !n.main).collect();
    let wanted: BTreeSet<String> = secondary.iter().map(|n| n.ids().0).collect();
    let mut out = Vec::new();
    for id in plugged.difference(&wanted) {
        out.push(json!({"execute": "device_del", "arguments": {"id": id}}));
    }
    for netdev in netdevs {
        let device = format!("{DEVICE_PREFIX}{}", &netdev[NETDEV_PREFIX.len()..]);
        if !plugged.contains(&device) && !wanted.contains(&device) {
            out.push(json!({"execute": "netdev_del", "arguments": {"id": netdev}}));
        }
    }
    for nic in secondary {
        let (id, netdev, hub) = nic.ids();
        if plugged.contains(&id) {
            continue;
        }
        if !netdevs.contains(&netdev) {
            out.push(json!({"execute": "netdev_add", "arguments": {
                "type": "hubport", "id": netdev, "hubid": hub}}));
        }
        let mut device = nic.device(&netdev);
        device["id"] = json!(id);
        out.push(json!({"execute": "device_add", "arguments": device}));
    }
    out
}

/// The secondary cards and netdevs qemu holds now.
fn present(qmp_path: &Path) -> io::Result<(BTreeSet<String>, BTreeSet<String>)> {
    let names = |path: &str, prefix: &str| -> io::Result<BTreeSet<String>> {
        let r = qmp(
            qmp_path,
            &json!({"execute": "qom-list", "arguments": {"path": path}}),
        )?;
        Ok(r["return"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["name"].as_str())
            .filter(|n| n.starts_with(prefix))
            .map(str::to_owned)
            .collect())
    };
    let devices = names("/machine/peripheral", DEVICE_PREFIX)?;
    // Netdevs are not QOM objects: the hubs' ports are listed as the hubs' children.
    let netdevs = hubport_netdevs(qmp_path)?;
    Ok((devices, netdevs))
}

/// The ids of the hub-port netdevs, from `info network`.
fn hubport_netdevs(qmp_path: &Path) -> io::Result<BTreeSet<String>> {
    let r = qmp(
        qmp_path,
        &json!({"execute": "human-monitor-command", "arguments": {"command-line": "info network"}}),
    )?;
    let text = r["return"].as_str().unwrap_or("");
    Ok(text
        .split(|c: char| c.is_whitespace() || c == ':')
        .filter(|w| w.starts_with(NETDEV_PREFIX) && w.len() > NETDEV_PREFIX.len())
        .map(str::to_owned)
        .collect())
}

/// Makes the qemu behind `qmp_path` hold exactly `want`'s secondary cards; `Ok(true)` when it
/// already did (nothing sent).
pub(super) fn sync(qmp_path: &Path, want: &[Nic]) -> io::Result<bool> {
    let (plugged, netdevs) = present(qmp_path)?;
    let commands = commands(&plugged, &netdevs, want);
    let settled = commands.is_empty();
    let mut first_error = None;
    for c in commands {
        if let Err(e) = qmp(qmp_path, &c)
            && first_error.is_none()
        {
            first_error = Some(e);
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(settled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubevirt_cards_carry_the_reported_macs_pod_network_first() {
        let vmi = json!({
            "spec": {"networks": [{"name": "storage", "multus": {"networkName": "storage"}},
                                  {"name": "default", "pod": {}}]},
            "status": {"interfaces": [
                {"name": "storage", "mac": "02:aa:bb:cc:dd:01"},
                {"name": "default", "mac": "02:aa:bb:cc:dd:02", "ipAddress": "10.244.0.5"},
            ]},
        });
        let nics = kubevirt(&vmi);
        let hubport = format!("hubport,id=nd02aabbccdd01,hubid={}", nics[1].ids().2);
        assert_eq!(
            args(&nics, "net0"),
            [
                "-device",
                "virtio-net-pci,netdev=net0,mac=02:aa:bb:cc:dd:02",
                "-netdev",
                hubport.as_str(),
                "-device",
                "virtio-net-pci,id=nic02aabbccdd01,netdev=nd02aabbccdd01,mac=02:aa:bb:cc:dd:01",
            ]
        );
        // No status yet: the pod network's card alone, with qemu's MAC.
        assert_eq!(
            args(&kubevirt(&json!({})), "net0"),
            ["-device", "virtio-net-pci,netdev=net0"]
        );
    }

    #[test]
    fn deckhouse_cards_follow_status_networks() {
        let vm = json!({"status": {"networks": [
            {"type": "Main"},
            {"type": "Network", "name": "storage", "macAddress": "02:cc:dd:aa:bb:02"},
        ]}});
        let nics = deckhouse(&vm);
        assert_eq!(nics.len(), 2);
        assert!(nics[0].main && nics[0].mac.is_none());
        assert_eq!(
            (nics[1].name.as_str(), nics[1].mac.as_deref()),
            ("storage", Some("02:cc:dd:aa:bb:02"))
        );
    }

    #[test]
    fn a_card_added_is_plugged_and_one_removed_unplugged() {
        let main = Nic {
            name: "default".into(),
            mac: None,
            main: true,
        };
        let storage = Nic {
            name: "storage".into(),
            mac: Some("02:00:00:00:00:01".into()),
            main: false,
        };
        let none = BTreeSet::new();
        let c = commands(&none, &none, &[main.clone(), storage.clone()]);
        let (id, netdev, hub) = storage.ids();
        assert_eq!(
            c,
            [
                json!({"execute": "netdev_add", "arguments": {"type": "hubport", "id": netdev, "hubid": hub}}),
                json!({"execute": "device_add", "arguments": {"driver": "virtio-net-pci",
                    "netdev": netdev, "mac": "02:00:00:00:00:01", "id": id}}),
            ]
        );
        let plugged = BTreeSet::from([id.clone()]);
        let netdevs = BTreeSet::from([netdev.clone()]);
        assert!(commands(&plugged, &netdevs, &[main.clone(), storage.clone()]).is_empty());
        // Removed: the card first, its netdev once the guest has let the card go.
        assert_eq!(
            commands(&plugged, &netdevs, std::slice::from_ref(&main)),
            [json!({"execute": "device_del", "arguments": {"id": id}})]
        );
        assert_eq!(
            commands(&none, &netdevs, &[main]),
            [json!({"execute": "netdev_del", "arguments": {"id": netdev}})]
        );
    }
}
