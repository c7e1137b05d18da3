//! A KubeVirt copy's network data. KubeVirt's clone gives the new VM no MAC addresses unless
//! the clone names new ones (`spec.newMacAddresses`, `pkg/virt-controller/watch/clone/vm-target.go`),
//! so cloud-init network data that finds its cards by MAC (what `create --ip NAME=…` writes)
//! would match none of the copy's cards, and the copy would boot without a network. A MAC is
//! also part of a VM's identity: two VMs with one MAC on one network break both. The copy gets
//! MACs of its own, and the network data rewritten for them, in its own Secret.

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::Value;

/// The network data of the copy and the MACs it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyNetwork {
    /// Interface name → the copy's MAC (the clone's `newMacAddresses`).
    pub new_macs: BTreeMap<String, String>,
    /// The source's network data with each of its MACs replaced by the copy's.
    pub text: String,
}

fn cloud_init(volume: &Value) -> Option<&Value> {
    volume
        .get("cloudInitNoCloud")
        .or_else(|| volume.get("cloudInitConfigDrive"))
}

/// The Secret the network data of cloud-init volume `volume` is in (`networkDataSecretRef`).
pub fn secret_of(volume: &Value) -> Option<&str> {
    cloud_init(volume)?
        .pointer("/networkDataSecretRef/name")
        .and_then(Value::as_str)
}

/// The network data of cloud-init volume `volume` (a KubeVirt volume with `cloudInitNoCloud`
/// or `cloudInitConfigDrive`): from `secret`, the data of the Secret [`secret_of`] names (key
/// `networkdata`, else `networkData`, as virt-launcher reads it), else inline `networkData` /
/// `networkDataBase64`. `None` without any.
pub fn text(volume: &Value, secret: Option<&BTreeMap<String, String>>) -> Option<String> {
    let src = cloud_init(volume)?;
    if secret_of(volume).is_some() {
        return ["networkdata", "networkData"]
            .iter()
            .find_map(|k| secret?.get(*k).cloned());
    }
    if let Some(text) = src.get("networkData").and_then(Value::as_str) {
        return Some(text.to_owned());
    }
    src.get("networkDataBase64")
        .and_then(Value::as_str)
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
}

/// For a copy of `vm` whose network data is `text` (empty without any): a new MAC (from
/// `new_mac`) for each interface with a `macAddress`, and the text with those MACs replaced.
/// `None` when no interface has one.
pub fn for_copy(
    vm: &Value,
    text: &str,
    mut new_mac: impl FnMut() -> String,
) -> Option<CopyNetwork> {
    let interfaces = vm
        .pointer("/spec/template/spec/domain/devices/interfaces")
        .and_then(Value::as_array)?;
    let mut new_macs = BTreeMap::new();
    let mut out = text.to_owned();
    for iface in interfaces {
        let (Some(name), Some(mac)) = (
            iface.get("name").and_then(Value::as_str),
            iface.get("macAddress").and_then(Value::as_str),
        ) else {
            continue;
        };
        let old = mac.to_ascii_lowercase();
        let new = new_mac();
        out = replace_ignoring_case(&out, &old, &new);
        new_macs.insert(name.to_owned(), new);
    }
    (!new_macs.is_empty()).then_some(CopyNetwork {
        new_macs,
        text: out,
    })
}

/// The VM's interfaces with the MACs of `copy` (for a merge patch, which replaces the list).
pub fn interfaces_with(vm: &Value, copy: &CopyNetwork) -> Value {
    let mut interfaces = vm
        .pointer("/spec/template/spec/domain/devices/interfaces")
        .cloned()
        .unwrap_or(Value::Array(Vec::new()));
    for iface in interfaces.as_array_mut().into_iter().flatten() {
        let name = iface
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(mac) = copy.new_macs.get(name) {
            iface["macAddress"] = Value::String(mac.clone());
        }
    }
    interfaces
}

/// `text` with every occurrence of `old` (ASCII, any case) replaced by `new`.
fn replace_ignoring_case(text: &str, old: &str, new: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (at, _) in lower.match_indices(old) {
        out.push_str(&text[last..at]);
        out.push_str(new);
        last = at + old.len();
    }
    out.push_str(&text[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_mac_the_network_data_names_is_new_in_the_copy() {
        let vm = json!({"spec": {"template": {"spec": {"domain": {"devices": {"interfaces": [
            {"name": "default", "masquerade": {}, "macAddress": "02:aa:bb:cc:dd:01"},
            {"name": "storage", "bridge": {}, "macAddress": "02:AA:BB:CC:DD:02"},
            {"name": "other", "bridge": {}, "macAddress": "02:aa:bb:cc:dd:03"},
        ]}}}}}});
        let text = "version: 2\nethernets:\n  default:\n    match:\n      macaddress: 02:aa:bb:cc:dd:01\n    dhcp4: true\n  storage:\n    match:\n      macaddress: '02:aa:bb:cc:dd:02'\n    addresses: [192.168.50.10/24]\n";
        let mut n = 0;
        let copy = for_copy(&vm, text, || {
            n += 1;
            format!("02:00:00:00:00:0{n}")
        })
        .unwrap();
        assert_eq!(
            copy.new_macs,
            BTreeMap::from([
                ("default".to_owned(), "02:00:00:00:00:01".to_owned()),
                ("storage".to_owned(), "02:00:00:00:00:02".to_owned()),
                ("other".to_owned(), "02:00:00:00:00:03".to_owned()),
            ])
        );
        assert_eq!(
            copy.text,
            "version: 2\nethernets:\n  default:\n    match:\n      macaddress: 02:00:00:00:00:01\n    dhcp4: true\n  storage:\n    match:\n      macaddress: '02:00:00:00:00:02'\n    addresses: [192.168.50.10/24]\n"
        );
        // No MAC in the VM: nothing to carry.
        let plain = json!({"spec": {"template": {"spec": {"domain": {"devices": {"interfaces": [
            {"name": "default", "masquerade": {}}]}}}}}});
        assert!(for_copy(&plain, text, || unreachable!()).is_none());
    }

    #[test]
    fn network_data_comes_from_the_named_secret_else_inline() {
        let by_ref = json!({"name": "c", "cloudInitNoCloud": {"secretRef": {"name": "s"},
            "networkDataSecretRef": {"name": "s"}}});
        assert_eq!(secret_of(&by_ref), Some("s"));
        let data = BTreeMap::from([("networkData".to_owned(), "v2".to_owned())]);
        assert_eq!(text(&by_ref, Some(&data)).as_deref(), Some("v2"));
        assert_eq!(text(&by_ref, None), None);
        let inline = json!({"name": "c", "cloudInitNoCloud": {"networkData": "inline"}});
        assert_eq!(
            (secret_of(&inline), text(&inline, None).as_deref()),
            (None, Some("inline"))
        );
        // "version: 2" in base64, as `echo -n 'version: 2' | base64` prints it.
        let b64 =
            json!({"name": "c", "cloudInitConfigDrive": {"networkDataBase64": "dmVyc2lvbjogMg=="}});
        assert_eq!(text(&b64, None).as_deref(), Some("version: 2"));
    }
}
