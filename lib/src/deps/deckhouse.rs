//! Deckhouse: the VM's block devices (`spec.blockDeviceRefs` and the
//! VirtualMachineBlockDeviceAttachments naming it), each VirtualDisk with its PVC
//! (`status.target.persistentVolumeClaimName`), the provisioning Secret
//! (`spec.provisioning.userDataRef`), its class and IP address, its launcher pod
//! (`status.virtualMachinePods`); snapshots (`spec.virtualMachineName`) and Services that
//! point at it; no pool object (a pool is VMs labelled `kubevm.io/pool`).

use super::{Graph, Node, ObjectRef, get_json, list, names, services};
use crate::api::DECKHOUSE_VM;
use crate::cluster::Cluster;
use crate::error::{Action, Result};

const GROUP: &str = "virtualization.deckhouse.io";
const VERSION: &str = "v1alpha2";

/// The VM's graph: what it depends on (block devices, provisioning Secrets, class, address,
/// launcher pod) and what depends on it (snapshots, Services).
pub(super) async fn graph(cluster: &Cluster, ns: &str, name: &str) -> Result<Graph> {
    let vm = DECKHOUSE_VM
        .api(&cluster.client, Some(ns))
        .get(name)
        .await
        .map_err(|e| cluster.error(e, &DECKHOUSE_VM.action("get", Some(ns)).named(name)))?;
    let vm = serde_json::to_value(vm).unwrap_or_default();
    let (disks, images, vmbdas, snapshots, svcs, pods) = futures::try_join!(
        list(cluster, GROUP, VERSION, "virtualdisks", ns),
        list(cluster, GROUP, VERSION, "virtualimages", ns),
        list(
            cluster,
            GROUP,
            VERSION,
            "virtualmachineblockdeviceattachments",
            ns
        ),
        list(cluster, GROUP, VERSION, "virtualmachinesnapshots", ns),
        list(cluster, "", "v1", "services", ns),
        list(cluster, "", "v1", "pods", ns),
    )?;
    let mut depends = block_devices(&vm, ns, &disks, &images, &vmbdas);
    depends.extend(provisioning(cluster, &vm, ns).await);
    if let Some(class) = vm["spec"]["virtualMachineClassName"].as_str() {
        depends.push(Node::new(GROUP, "VirtualMachineClass", class, None).optional());
    }
    if let Some(ip) = vm["status"]["virtualMachineIPAddressName"]
        .as_str()
        .or(vm["spec"]["virtualMachineIPAddressName"].as_str())
    {
        depends.push(Node::new(GROUP, "VirtualMachineIPAddress", ip, Some(ns)));
    }
    let active = vm["status"]["virtualMachinePods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["active"] == true)
        .and_then(|p| p["name"].as_str());
    if let Some(p) = active {
        depends.push(Node::new("", "Pod", p, Some(ns)));
    }

    let mut dependents: Vec<Node> = snapshots
        .iter()
        .filter(|s| s["spec"]["virtualMachineName"] == name)
        .filter_map(|s| s["metadata"]["name"].as_str())
        .map(|s| Node::new(GROUP, "VirtualMachineSnapshot", s, Some(ns)))
        .collect();
    let pod_labels = active
        .and_then(|a| pods.iter().find(|p| p["metadata"]["name"] == a))
        .map(|p| p["metadata"]["labels"].clone());
    dependents.extend(services(&svcs, name, ns, pod_labels.as_ref()));
    Ok(Graph {
        object_reference: ObjectRef {
            api_group: GROUP.into(),
            kind: "VirtualMachine".into(),
            name: name.to_owned(),
            namespace: Some(ns.to_owned()),
        },
        depends_on: depends,
        dependents,
        owned_by: Vec::new(),
    })
}

/// The VM's block devices: those its spec names and those attached by
/// VirtualMachineBlockDeviceAttachments (each once), the attachments themselves, and each
/// VirtualDisk's PVC; a disk or image not among `disks`/`images` is shown missing.
fn block_devices(
    vm: &serde_json::Value,
    ns: &str,
    disks: &[serde_json::Value],
    images: &[serde_json::Value],
    vmbdas: &[serde_json::Value],
) -> Vec<Node> {
    let name = vm["metadata"]["name"].as_str().unwrap_or_default();
    let image_names = names(images);
    let disk_node = |d: &str| {
        let found = disks.iter().find(|o| o["metadata"]["name"] == d);
        let pvc = found
            .and_then(|o| o["status"]["target"]["persistentVolumeClaimName"].as_str())
            .map(|p| vec![Node::new("", "PersistentVolumeClaim", p, Some(ns))])
            .unwrap_or_default();
        Node::new(GROUP, "VirtualDisk", d, Some(ns))
            .missing_unless(found.is_some())
            .with_children(pvc)
    };
    let mut depends = Vec::new();
    let mut refs: Vec<(String, String)> = vm["spec"]["blockDeviceRefs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            Some((
                r["kind"].as_str()?.to_owned(),
                r["name"].as_str()?.to_owned(),
            ))
        })
        .collect();
    for a in vmbdas
        .iter()
        .filter(|a| a["spec"]["virtualMachineName"] == name)
    {
        let r = &a["spec"]["blockDeviceRef"];
        if let (Some(k), Some(n)) = (r["kind"].as_str(), r["name"].as_str()) {
            let pair = (k.to_owned(), n.to_owned());
            if !refs.contains(&pair) {
                refs.push(pair);
            }
        }
        if let Some(n) = a["metadata"]["name"].as_str() {
            depends.push(Node::new(
                GROUP,
                "VirtualMachineBlockDeviceAttachment",
                n,
                Some(ns),
            ));
        }
    }
    for (kind, n) in &refs {
        depends.push(match kind.as_str() {
            "VirtualDisk" => disk_node(n),
            "VirtualImage" => Node::new(GROUP, "VirtualImage", n, Some(ns))
                .missing_unless(image_names.contains(n)),
            other => Node::new(GROUP, other, n, None),
        });
    }
    depends
}

/// The Secrets the VM is provisioned from (`userDataRef`, `sysprepRef`), shown missing when a
/// get finds none.
async fn provisioning(cluster: &Cluster, vm: &serde_json::Value, ns: &str) -> Vec<Node> {
    let mut nodes = Vec::new();
    for field in ["userDataRef", "sysprepRef"] {
        let r = &vm["spec"]["provisioning"][field];
        if let Some(s) = r["name"].as_str() {
            let action = Action::new("get", "secrets", "secret");
            let path = format!("/api/v1/namespaces/{ns}/secrets/{s}");
            let ok = !matches!(get_json(cluster, &path, &action).await, Ok(None));
            nodes.push(
                Node::new("", r["kind"].as_str().unwrap_or("Secret"), s, Some(ns))
                    .missing_unless(ok),
            );
        }
    }
    nodes
}
