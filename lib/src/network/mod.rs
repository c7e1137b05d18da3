//! A VM's network interfaces as `kubectl vm network list` and `get` show them: what the VM
//! asks for (KubeVirt: the template's interfaces and networks; Deckhouse: `spec.networks`)
//! joined with what the running machine reports (KubeVirt: the VMI's `status.interfaces`;
//! Deckhouse: the VM's `status.networks`), and the state that follows.

pub mod spec;

use serde::Serialize;
use serde_json::Value;

use crate::cluster::Cluster;
use crate::error::Result;
use crate::flavor::{Flavor, Platform};

/// One interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetInterface {
    /// KubeVirt: the interface's name; Deckhouse: the network's (`main` for the Main one).
    pub name: String,
    /// `pod`, `multus NAMESPACE/NAD` (KubeVirt); `Main`, `Network NAME`, `ClusterNetwork NAME`.
    pub network: String,
    /// KubeVirt binding (`masquerade`, `bridge`, ...); none on Deckhouse.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
    /// MAC address, as reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// IP addresses, as reported.
    pub ips: Vec<String>,
    /// The interface's name inside the guest (KubeVirt `interfaceName`, from the guest agent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_name: Option<String>,
    /// `attached`, `plugging`, `unplugging`, `detached` (KubeVirt `absent`, gone from the
    /// instance), `removed` (gone from the VM, still on the running machine), `stopped`.
    pub state: String,
}

fn text<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn list<'a>(v: &'a Value, pointer: &str) -> Vec<&'a Value> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

const BINDINGS: &[&str] = &["masquerade", "bridge", "sriov", "passt", "slirp", "binding"];

fn kubevirt_network(n: Option<&Value>, namespace: &str) -> String {
    match n {
        Some(n) if n.get("pod").is_some() => "pod".into(),
        Some(n) => match text(n, "/multus/networkName") {
            Some(name) if name.contains('/') => format!("multus {name}"),
            Some(name) => format!("multus {namespace}/{name}"),
            None => "other".into(),
        },
        None => "(none)".into(),
    }
}

fn ips(iface: &Value) -> Vec<String> {
    let all: Vec<String> = list(iface, "/ipAddresses")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    if !all.is_empty() {
        return all;
    }
    text(iface, "/ipAddress")
        .map(str::to_owned)
        .into_iter()
        .collect()
}

/// A KubeVirt VM's interfaces, with its VMI when it runs.
pub fn kubevirt_interfaces(vm: &Value, vmi: Option<&Value>) -> Vec<NetInterface> {
    let namespace = text(vm, "/metadata/namespace").unwrap_or("default");
    // A VM's template spec, or the spec of an instance read without its VM (`get vmi/NAME`).
    let spec = match vm.pointer("/spec/template/spec") {
        Some(spec) => spec,
        None => vm.pointer("/spec").unwrap_or(&Value::Null),
    };
    let networks = list(spec, "/networks");
    let status = vmi
        .map(|v| list(v, "/status/interfaces"))
        .unwrap_or_default();
    let reported = |name: &str| {
        status
            .iter()
            .find(|s| text(s, "/name") == Some(name))
            .copied()
    };
    let mut out: Vec<NetInterface> = list(spec, "/domain/devices/interfaces")
        .into_iter()
        .map(|i| {
            let name = text(i, "/name").unwrap_or("").to_owned();
            let network = networks
                .iter()
                .find(|n| text(n, "/name") == Some(&name))
                .copied();
            let seen = reported(&name);
            let absent = text(i, "/state") == Some("absent");
            let state = match (vmi.is_some(), absent, seen.is_some()) {
                (false, true, _) => "detached",
                (false, false, _) => "stopped",
                (true, false, true) => "attached",
                (true, false, false) => "plugging",
                (true, true, true) => "unplugging",
                (true, true, false) => "detached",
            };
            NetInterface {
                network: kubevirt_network(network, namespace),
                binding: BINDINGS
                    .iter()
                    .find(|b| i.get(**b).is_some())
                    .map(|b| (*b).to_owned()),
                mac: seen
                    .and_then(|s| text(s, "/mac"))
                    .or_else(|| text(i, "/macAddress"))
                    .map(str::to_owned),
                ips: seen.map(ips).unwrap_or_default(),
                guest_name: seen
                    .and_then(|s| text(s, "/interfaceName"))
                    .map(str::to_owned),
                state: state.into(),
                name,
            }
        })
        .collect();
    // Reported by the running machine but gone from the VM (a restart removes them), or the
    // pod network's default interface of a VM that declares none.
    for s in &status {
        let name = text(s, "/name").unwrap_or("default");
        if out.iter().any(|o| o.name == name) {
            continue;
        }
        let declared = !out.is_empty();
        out.push(NetInterface {
            name: name.to_owned(),
            network: if declared {
                "(removed)".into()
            } else {
                "pod".into()
            },
            binding: None,
            mac: text(s, "/mac").map(str::to_owned),
            ips: ips(s),
            guest_name: text(s, "/interfaceName").map(str::to_owned),
            state: if declared { "removed" } else { "attached" }.into(),
        });
    }
    out
}

fn deckhouse_label(n: &Value) -> (String, String) {
    let type_ = text(n, "/type").unwrap_or("Main");
    match text(n, "/name") {
        Some(name) if type_ != "Main" => (name.to_owned(), format!("{type_} {name}")),
        _ => ("main".to_owned(), "Main".to_owned()),
    }
}

/// A Deckhouse VM's networks.
pub fn deckhouse_interfaces(vm: &Value) -> Vec<NetInterface> {
    let running = matches!(
        text(vm, "/status/phase"),
        Some("Running" | "Migrating" | "Stopping")
    );
    let mut spec = list(vm, "/spec/networks");
    let main = serde_json::json!({"type": "Main"});
    if spec.is_empty() {
        spec.push(&main);
    }
    let status = list(vm, "/status/networks");
    let key = |n: &Value| deckhouse_label(n).1;
    let mut out: Vec<NetInterface> = spec
        .iter()
        .map(|n| {
            let (name, network) = deckhouse_label(n);
            let seen = status.iter().find(|s| key(s) == network).copied();
            let main = network == "Main";
            // The Main network is the pod's: a running VM has it even where the platform
            // reports no `status.networks` (before the controller's first pass, older versions).
            let attached = seen.is_some() || (main && status.is_empty());
            let mut ips: Vec<String> = seen
                .and_then(|s| text(s, "/ipAddress"))
                .map(str::to_owned)
                .into_iter()
                .collect();
            if main && ips.is_empty() {
                ips.extend(text(vm, "/status/ipAddress").map(str::to_owned));
            }
            let state = match (running, attached) {
                (false, _) => "stopped",
                (true, true) => "attached",
                (true, false) => "plugging",
            };
            NetInterface {
                name,
                network,
                binding: None,
                mac: seen.and_then(|s| text(s, "/macAddress")).map(str::to_owned),
                ips,
                guest_name: None,
                state: state.into(),
            }
        })
        .collect();
    for s in status {
        let (name, network) = deckhouse_label(s);
        if running && !out.iter().any(|o| o.network == network) {
            out.push(NetInterface {
                name,
                network,
                binding: None,
                mac: text(s, "/macAddress").map(str::to_owned),
                ips: text(s, "/ipAddress")
                    .map(str::to_owned)
                    .into_iter()
                    .collect(),
                guest_name: None,
                state: "removed".into(),
            });
        }
    }
    out
}

/// Read VM `name` in `namespace` (and its instance) and list its interfaces.
pub async fn interfaces(
    cluster: &Cluster,
    platform: &Platform,
    namespace: &str,
    name: &str,
) -> Result<Vec<NetInterface>> {
    let kind = crate::api::Kind::vm(platform.flavor);
    let ns = Some(namespace);
    let object = kind
        .api(&cluster.client, ns)
        .get(name)
        .await
        .map_err(|e| cluster.error(e, &kind.action("get", ns).named(name)))?;
    let object = serde_json::to_value(object).unwrap_or_default();
    match platform.flavor {
        Flavor::KubeVirt => {
            let vmi_kind = crate::api::KUBEVIRT_VMI;
            let vmi = vmi_kind
                .api(&cluster.client, ns)
                .get_opt(name)
                .await
                .map_err(|e| cluster.error(e, &vmi_kind.action("get", ns).named(name)))?
                .map(|v| serde_json::to_value(v).unwrap_or_default());
            Ok(kubevirt_interfaces(&object, vmi.as_ref()))
        }
        Flavor::Deckhouse => Ok(deckhouse_interfaces(&object)),
    }
}

/// The networks a VM's secondary interface can name in the cluster's namespace, as shell
/// completion offers them, with their kind
/// ([`Capabilities::network_attachment`](crate::platform::Capabilities::network_attachment));
/// none where the platform names networks otherwise or they cannot be listed.
pub async fn attachment_names(cluster: &Cluster, flavor: Flavor) -> Vec<(String, &'static str)> {
    let Some(kind) = crate::platform::of(flavor).network_attachment else {
        return vec![];
    };
    let Ok(list) = kind
        .api(&cluster.client, Some(&cluster.namespace))
        .list_metadata(&Default::default())
        .await
    else {
        return vec![];
    };
    list.items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .map(|n| (n, kind.kind))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubevirt_joins_template_and_vmi_status() {
        let vm = json!({"metadata": {"namespace": "prod"}, "spec": {"template": {"spec": {
            "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}},
                {"name": "blue", "bridge": {}}, {"name": "red", "bridge": {}, "state": "absent"}]}},
            "networks": [{"name": "default", "pod": {}}, {"name": "blue", "multus": {"networkName": "blue"}},
                {"name": "red", "multus": {"networkName": "infra/red"}}]}}}});
        let vmi = json!({"status": {"interfaces": [
            {"name": "default", "ipAddress": "10.244.0.7", "ipAddresses": ["10.244.0.7", "fd00::7"], "mac": "02:00:00:00:00:01", "interfaceName": "eth0"},
            {"name": "red", "mac": "02:00:00:00:00:03"}]}});
        let l = kubevirt_interfaces(&vm, Some(&vmi));
        let rows: Vec<(&str, &str, &str)> = l
            .iter()
            .map(|i| (i.name.as_str(), i.network.as_str(), i.state.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("default", "pod", "attached"),
                ("blue", "multus prod/blue", "plugging"),
                ("red", "multus infra/red", "unplugging")
            ]
        );
        assert_eq!(l[0].ips, ["10.244.0.7", "fd00::7"]);
        assert_eq!(l[0].binding.as_deref(), Some("masquerade"));
        assert_eq!(l[0].guest_name.as_deref(), Some("eth0"));
        assert_eq!(l[2].guest_name, None);
        // An instance read without its VM (`get vmi/NAME`): its own spec, not a template.
        let mut alone = vmi.clone();
        alone["spec"] = vm["spec"]["template"]["spec"].clone();
        let l = kubevirt_interfaces(&alone, Some(&alone));
        assert_eq!(l[1].network, "multus default/blue");
        assert_eq!(l[2].state, "unplugging");
        let stopped = kubevirt_interfaces(&vm, None);
        assert_eq!(stopped[1].state, "stopped");
        assert_eq!(stopped[2].state, "detached");
    }

    #[test]
    fn deckhouse_lists_main_and_additional_networks() {
        let vm = json!({"spec": {"networks": [{"type": "Main"}, {"type": "ClusterNetwork", "name": "corp-net"}]},
            "status": {"phase": "Running", "ipAddress": "10.66.10.2", "networks": [{"type": "Main"},
                {"type": "ClusterNetwork", "name": "corp-net", "macAddress": "32:a6:a1:0a:92:48", "ipAddress": "192.168.200.4"},
                {"type": "Network", "name": "old", "macAddress": "32:a6:a1:0a:92:49"}]}});
        let l = deckhouse_interfaces(&vm);
        assert_eq!(l[0].ips, ["10.66.10.2"]);
        assert_eq!(
            (
                l[1].name.as_str(),
                l[1].network.as_str(),
                l[1].state.as_str()
            ),
            ("corp-net", "ClusterNetwork corp-net", "attached")
        );
        assert_eq!(l[1].ips, ["192.168.200.4"]);
        assert_eq!(l[2].state, "removed");
        let bare = deckhouse_interfaces(&json!({"status": {"phase": "Stopped"}}));
        assert_eq!(
            (bare[0].name.as_str(), bare[0].state.as_str()),
            ("main", "stopped")
        );
    }
}
