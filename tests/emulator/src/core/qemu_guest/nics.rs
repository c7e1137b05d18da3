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

use serde_json::Value;

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

/// The qemu arguments of `nics`; the main card on netdev `main_netdev` (which the caller
/// defines), each other on a hub of its own.
pub(super) fn args(nics: &[Nic], main_netdev: &str) -> Vec<String> {
    let mut args = Vec::new();
    for (i, nic) in nics.iter().enumerate() {
        let netdev = if nic.main {
            main_netdev.to_owned()
        } else {
            let id = format!("nic{i}");
            args.extend(["-netdev".to_owned(), format!("hubport,id={id},hubid={i}")]);
            id
        };
        let mut device = format!("virtio-net-pci,netdev={netdev}");
        if let Some(mac) = &nic.mac {
            device.push_str(&format!(",mac={mac}"));
        }
        args.extend(["-device".to_owned(), device]);
    }
    args
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
        assert_eq!(
            args(&nics, "net0"),
            [
                "-device",
                "virtio-net-pci,netdev=net0,mac=02:aa:bb:cc:dd:02",
                "-netdev",
                "hubport,id=nic1,hubid=1",
                "-device",
                "virtio-net-pci,netdev=nic1,mac=02:aa:bb:cc:dd:01",
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
}
