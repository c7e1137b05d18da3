//! The network part of a VM's spec, as `create --network` and `set network` edit it.
//!
//! KubeVirt: a secondary network is an interface with bridge binding on a Multus
//! NetworkAttachmentDefinition (`spec.template.spec.domain.devices.interfaces[]` and
//! `spec.template.spec.networks[].multus.networkName`). Under `vmRolloutStrategy: LiveUpdate`
//! virt-controller hot-plugs a new one into the running VMI (through a live migration,
//! `MigrationRequired`), and unplugs one whose interface is marked `state: absent`
//! (`pkg/network/vmliveupdate/restart.go`: an interface removed outright needs a restart, so
//! a running VM's interface is marked absent, a stopped VM's removed). Otherwise
//! `RestartRequired`.
//!
//! Deckhouse: `spec.networks[]` entries of type `Network` (the project's) or `ClusterNetwork`;
//! the list starts with the `Main` network (implicit when `spec.networks` is unset). Adding or
//! removing an additional network applies without a restart (the virtualization user guide,
//! "Additional network interfaces").

use serde_json::{Value, json};

use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;

/// A network to add: `NAME[=NETWORK]` as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attach {
    /// KubeVirt: the interface's name; Deckhouse: `[network/|clusternetwork/]NAME`.
    pub name: String,
    /// KubeVirt: the NetworkAttachmentDefinition, `[NAMESPACE/]NAME` (default: `name`).
    pub network: Option<String>,
}

impl Attach {
    /// Parse `NAME[=NETWORK]`.
    pub fn parse(text: &str) -> Result<Attach> {
        let (name, network) = match text.split_once('=') {
            Some((n, net)) => (n, Some(net.to_owned())),
            None => (text, None),
        };
        if name.is_empty() || network.as_deref() == Some("") {
            return Err(Error::InvalidTarget(format!(
                "invalid --add {text:?}: use NAME[=NETWORK]"
            )));
        }
        Ok(Attach {
            name: name.to_owned(),
            network,
        })
    }
}

/// What to change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Networks {
    /// Networks to attach.
    pub add: Vec<Attach>,
    /// Networks (KubeVirt: interfaces) to detach, by name.
    pub remove: Vec<String>,
}

/// A Deckhouse network reference: its type and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeckhouseNetwork {
    /// `Network` or `ClusterNetwork`.
    pub type_: &'static str,
    /// Its name.
    pub name: String,
}

fn label(what: &'static str, text: &str, name: &str) -> Result<()> {
    crate::validate::dns_label(what, name)
        .map(|_| ())
        .map_err(|e| Error::InvalidTarget(format!("invalid {text:?}: {e}")))
}

impl DeckhouseNetwork {
    /// Parse `NAME`, `network/NAME` or `clusternetwork/NAME`.
    pub fn parse(text: &str) -> Result<DeckhouseNetwork> {
        let (type_, name) = match text.split_once('/') {
            None => ("Network", text),
            Some((k, n)) if k.eq_ignore_ascii_case("network") => ("Network", n),
            Some((k, n)) if k.eq_ignore_ascii_case("clusternetwork") => ("ClusterNetwork", n),
            Some((k, _)) => {
                return Err(Error::InvalidTarget(format!(
                    "invalid network {text:?}: {k:?} is not a Deckhouse network kind (network/NAME or clusternetwork/NAME)"
                )));
            }
        };
        label("network name", text, name)?;
        Ok(DeckhouseNetwork {
            type_,
            name: name.to_owned(),
        })
    }
}

/// A KubeVirt NetworkAttachmentDefinition reference: `[NAMESPACE/]NAME`.
pub fn parse_nad(text: &str) -> Result<(Option<String>, String)> {
    let (ns, name) = match text.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, text),
    };
    if let Some(ns) = ns {
        label("namespace", text, ns)?;
    }
    crate::validate::dns_subdomain("network attachment definition", name)
        .map_err(|e| Error::InvalidTarget(format!("invalid network {text:?}: {e}")))?;
    Ok((ns.map(str::to_owned), name.to_owned()))
}

impl Networks {
    /// Parse the flags' texts (before any request).
    pub fn parse(add: &[String], remove: &[String]) -> Result<Networks> {
        let n = Networks {
            add: add
                .iter()
                .map(|t| Attach::parse(t))
                .collect::<Result<_>>()?,
            remove: remove.to_vec(),
        };
        if n == Networks::default() {
            return Err(Error::InvalidTarget(
                "nothing to change: give --add NAME[=NETWORK] or --remove NAME".into(),
            ));
        }
        Ok(n)
    }
}

/// A network object a VM is attached to, which must exist first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkObject {
    /// Its kind.
    pub kind: Kind,
    /// Its namespace (`None`: cluster-scoped).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// What the platform needs to serve the kind, said when the cluster does not.
    pub needs: &'static str,
}

/// Refuse a network object that does not exist (or a cluster that serves none of its kind),
/// as the cluster's state: exit 1, like a missing VirtualMachineClass or Secret.
pub(crate) async fn must_exist(cluster: &Cluster, object: &NetworkObject) -> Result<()> {
    let (kind, ns, name) = (object.kind, object.namespace.as_deref(), &object.name);
    let api = kind.api(&cluster.client, ns);
    match api.get_opt(name).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => {
            let place = ns
                .map(|ns| format!(" in namespace {ns:?}"))
                .unwrap_or_default();
            Err(Error::Platform(format!(
                "{} {name:?} not found{place}: create it first (a VM attaches to an existing network)",
                kind.kind.to_lowercase()
            )))
        }
        Err(e) => match cluster.error(e, &kind.action("get", ns).named(name)) {
            Error::NotServed { .. } => Err(Error::Platform(format!(
                "the cluster serves no {}.{}: {}",
                kind.plural, kind.group, object.needs
            ))),
            other => Err(other),
        },
    }
}

/// KubeVirt: edit the template's interfaces and networks.
pub(crate) fn kubevirt_edit(request: &Networks, vm: &mut Value) -> Result<()> {
    let vm_name = vm
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let running = vm.pointer("/status/created").and_then(Value::as_bool) == Some(true);
    let spec = crate::placement::object_at(vm, "/spec/template/spec");
    let mut networks = spec
        .get("networks")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let devices = spec
        .entry("domain")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| Error::Internal("spec.template.spec.domain is not an object".into()))?
        .entry("devices")
        .or_insert_with(|| json!({}));
    let mut interfaces = devices
        .get("interfaces")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let named = |l: &[Value], n: &str| l.iter().position(|i| i["name"] == n);
    let refuse = |what: String| Error::Usage(format!("virtualmachine {vm_name:?}: {what}"));
    for a in &request.add {
        if named(&interfaces, &a.name).is_some() || named(&networks, &a.name).is_some() {
            return Err(refuse(format!(
                "has an interface or network named {:?} already",
                a.name
            )));
        }
        let nad = a.network.clone().unwrap_or_else(|| a.name.clone());
        interfaces.push(json!({"name": a.name, "bridge": {}}));
        networks.push(json!({"name": a.name, "multus": {"networkName": nad}}));
    }
    for name in &request.remove {
        let Some(at) = named(&interfaces, name) else {
            return Err(refuse(format!("has no interface named {name:?}")));
        };
        let net = named(&networks, name);
        if net.is_some_and(|n| networks[n].get("pod").is_some()) {
            return Err(refuse(format!(
                "{name:?} is its pod network (the primary interface), not a secondary network"
            )));
        }
        let bridge = interfaces[at].get("bridge").is_some();
        if running && bridge {
            // Hot-unplug: KubeVirt unplugs an interface marked absent (only bridge binding
            // can be: virt-api's VM admitter).
            interfaces[at]["state"] = json!("absent");
        } else {
            interfaces.remove(at);
            if let Some(n) = net {
                networks.remove(n);
            }
        }
    }
    devices["interfaces"] = Value::Array(interfaces);
    spec.insert("networks".into(), Value::Array(networks));
    Ok(())
}

/// KubeVirt: the NetworkAttachmentDefinitions `request` attaches `vm` to, as
/// (namespace, name).
pub(crate) fn kubevirt_nads(request: &Networks, vm: &Value) -> Result<Vec<(String, String)>> {
    let vm_ns = vm
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    request
        .add
        .iter()
        .map(|a| {
            let (ns, name) = parse_nad(a.network.as_deref().unwrap_or(&a.name))?;
            Ok((ns.unwrap_or_else(|| vm_ns.to_owned()), name))
        })
        .collect()
}

/// KubeVirt: local checks of names.
pub(crate) fn kubevirt_check(request: &Networks) -> Result<()> {
    for a in &request.add {
        label("interface name", &a.name, &a.name)?;
        parse_nad(a.network.as_deref().unwrap_or(&a.name))?;
    }
    for r in &request.remove {
        label("interface name", r, r)?;
    }
    Ok(())
}

/// Deckhouse: local checks.
pub(crate) fn deckhouse_check(request: &Networks) -> Result<()> {
    for a in &request.add {
        if let Some(net) = &a.network {
            return Err(Error::InvalidTarget(format!(
                "--add {}={net}: a Deckhouse VM attaches a network by its name (network/NAME or clusternetwork/NAME); there is no interface name to give",
                a.name
            )));
        }
        DeckhouseNetwork::parse(&a.name)?;
    }
    for r in &request.remove {
        if r.eq_ignore_ascii_case("main") {
            return Err(Error::InvalidTarget(
                "--remove main: the Main network is the VM's cluster network, not an additional one".into(),
            ));
        }
        DeckhouseNetwork::parse(r)?;
    }
    Ok(())
}

/// Deckhouse: edit `spec.networks`.
pub(crate) fn deckhouse_edit(request: &Networks, vm: &mut Value) -> Result<()> {
    let vm_name = vm
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let spec = crate::placement::object_at(vm, "/spec");
    let mut list = spec
        .get("networks")
        .and_then(Value::as_array)
        .cloned()
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| vec![json!({"type": "Main"})]);
    let refuse = |what: String| Error::Usage(format!("virtualmachine {vm_name:?}: {what}"));
    let same = |n: &Value, d: &DeckhouseNetwork| n["type"] == d.type_ && n["name"] == *d.name;
    for a in &request.add {
        let d = DeckhouseNetwork::parse(&a.name)?;
        if list.iter().any(|n| same(n, &d)) {
            return Err(refuse(format!(
                "is attached to {} {:?} already",
                d.type_, d.name
            )));
        }
        // New networks go last: the guide asks to keep the order of existing interfaces.
        list.push(json!({"type": d.type_, "name": d.name}));
    }
    for r in &request.remove {
        let d = DeckhouseNetwork::parse(r)?;
        // A bare name matches a Network or a ClusterNetwork of that name.
        let explicit = r.contains('/');
        let before = list.len();
        list.retain(|n| {
            !(n["name"] == *d.name && (n["type"] == d.type_ || (!explicit && n["type"] != "Main")))
        });
        if list.len() == before {
            return Err(refuse(format!(
                "is not attached to a network named {:?}",
                d.name
            )));
        }
    }
    spec.insert("networks".into(), Value::Array(list));
    Ok(())
}

/// Refuses what `request` asks that the platform cannot do, before any request.
pub(crate) fn check(flavor: Flavor, request: &Networks) -> Result<()> {
    match flavor {
        Flavor::KubeVirt => kubevirt_check(request),
        Flavor::Deckhouse => deckhouse_check(request),
    }
}

/// Applies `request` to the VM object `vm`.
pub(crate) fn edit(flavor: Flavor, request: &Networks, vm: &mut Value) -> Result<()> {
    match flavor {
        Flavor::KubeVirt => kubevirt_edit(request, vm),
        Flavor::Deckhouse => deckhouse_edit(request, vm),
    }
}

/// KubeVirt: the NetworkAttachmentDefinitions `request` attaches `vm` to.
pub(crate) fn kubevirt_objects(request: &Networks, vm: &Value) -> Result<Vec<NetworkObject>> {
    Ok(kubevirt_nads(request, vm)?
        .into_iter()
        .map(|(ns, name)| NetworkObject {
            kind: crate::api::NETWORK_ATTACHMENT_DEFINITION,
            namespace: Some(ns),
            name,
            needs: "Multus is not installed, and secondary networks need it",
        })
        .collect())
}

/// Deckhouse: the `sdn` module's Networks (in the VM's namespace) and ClusterNetworks
/// `request` attaches `vm` to.
pub(crate) fn deckhouse_objects(request: &Networks, vm: &Value) -> Result<Vec<NetworkObject>> {
    let vm_ns = vm
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    request
        .add
        .iter()
        .map(|a| {
            let d = DeckhouseNetwork::parse(&a.name)?;
            let (kind, namespace) = match d.type_ {
                "ClusterNetwork" => (crate::api::DECKHOUSE_CLUSTER_NETWORK, None),
                _ => (crate::api::DECKHOUSE_NETWORK, Some(vm_ns.to_owned())),
            };
            Ok(NetworkObject {
                kind,
                namespace,
                name: d.name,
                // The VirtualMachine CRD's `spec.networks`: "The `sdn` module is required only
                // when additional networks (`Network` or `ClusterNetwork`) are specified".
                needs: "additional networks (Network, ClusterNetwork) need Deckhouse's sdn module; enable it first",
            })
        })
        .collect()
}

/// The network objects `request` attaches `vm` to, which must exist first.
pub(crate) fn objects(
    flavor: Flavor,
    request: &Networks,
    vm: &Value,
) -> Result<Vec<NetworkObject>> {
    match flavor {
        Flavor::KubeVirt => kubevirt_objects(request, vm),
        Flavor::Deckhouse => deckhouse_objects(request, vm),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubevirt_adds_bridge_on_multus_and_unplugs_a_running_vms_interface() {
        let mut vm = json!({"metadata": {"name": "web", "namespace": "prod"},
            "spec": {"template": {"spec": {"domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
            "networks": [{"name": "default", "pod": {}}]}}}, "status": {"created": true}});
        let add = Networks::parse(&["blue".into(), "red=infra/red-net".into()], &[]).unwrap();
        kubevirt_edit(&add, &mut vm).unwrap();
        let t = &vm["spec"]["template"]["spec"];
        assert_eq!(
            t["domain"]["devices"]["interfaces"][1],
            json!({"name": "blue", "bridge": {}})
        );
        assert_eq!(
            t["networks"][2],
            json!({"name": "red", "multus": {"networkName": "infra/red-net"}})
        );
        assert_eq!(
            kubevirt_nads(&add, &vm).unwrap(),
            [
                ("prod".to_string(), "blue".to_string()),
                ("infra".into(), "red-net".into())
            ]
        );
        let remove = Networks::parse(&[], &["blue".into()]).unwrap();
        kubevirt_edit(&remove, &mut vm).unwrap();
        assert_eq!(
            vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][1]["state"],
            "absent"
        );
        vm["status"]["created"] = json!(false);
        kubevirt_edit(&Networks::parse(&[], &["red".into()]).unwrap(), &mut vm).unwrap();
        assert_eq!(
            vm["spec"]["template"]["spec"]["networks"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        let e = kubevirt_edit(&Networks::parse(&[], &["default".into()]).unwrap(), &mut vm)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pod network"), "{e}");
        assert!(
            kubevirt_edit(&add, &mut vm).is_err(),
            "blue exists (absent) already"
        );
    }

    #[test]
    fn deckhouse_keeps_main_first_and_appends() {
        let mut vm = json!({"metadata": {"name": "linux-vm"}, "spec": {}});
        let add =
            Networks::parse(&["user-net".into(), "clusternetwork/corp-net".into()], &[]).unwrap();
        deckhouse_check(&add).unwrap();
        deckhouse_edit(&add, &mut vm).unwrap();
        assert_eq!(
            vm["spec"]["networks"],
            json!([{"type": "Main"}, {"type": "Network", "name": "user-net"}, {"type": "ClusterNetwork", "name": "corp-net"}])
        );
        deckhouse_edit(
            &Networks::parse(&[], &["corp-net".into()]).unwrap(),
            &mut vm,
        )
        .unwrap();
        assert_eq!(vm["spec"]["networks"].as_array().unwrap().len(), 2);
        assert!(deckhouse_edit(&Networks::parse(&[], &["nope".into()]).unwrap(), &mut vm).is_err());
        assert!(deckhouse_check(&Networks::parse(&["a=b".into()], &[]).unwrap()).is_err());
        assert!(deckhouse_check(&Networks::parse(&[], &["Main".into()]).unwrap()).is_err());
        assert!(DeckhouseNetwork::parse("pod/x").is_err());
        let vm = json!({"metadata": {"name": "linux-vm", "namespace": "dev"}});
        let objects = deckhouse_objects(&add, &vm).unwrap();
        let seen: Vec<(&str, Option<&str>, &str)> = objects
            .iter()
            .map(|o| (o.kind.kind, o.namespace.as_deref(), o.name.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("Network", Some("dev"), "user-net"),
                ("ClusterNetwork", None, "corp-net")
            ]
        );
        assert!(objects[0].needs.contains("sdn module"));
    }

    #[test]
    fn bad_names_are_refused_before_any_request() {
        assert!(Networks::parse(&[], &[]).is_err());
        assert!(Networks::parse(&["=x".into()], &[]).is_err());
        assert!(kubevirt_check(&Networks::parse(&["Bad_Name".into()], &[]).unwrap()).is_err());
        assert!(kubevirt_check(&Networks::parse(&["ok=ns/Bad_NAD".into()], &[]).unwrap()).is_err());
        kubevirt_check(&Networks::parse(&["ok=ns/nad-1".into()], &["x".into()]).unwrap()).unwrap();
    }
}
