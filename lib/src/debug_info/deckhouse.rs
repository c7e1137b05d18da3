//! What belongs to a Deckhouse VM: its internal KubeVirt objects
//! (`internal.virtualization.deckhouse.io`), operations (VMOPs, migrations among them), block
//! devices (VirtualDisks, VirtualImages, ClusterVirtualImages, VMBDAs) and their PVCs, the
//! virt-launcher and hotplug pods, the importer pods of disks and images still importing (a
//! cluster image's in the module's namespace, `d8-virtualization`), and the domain
//! XML (`vlctl domain -o xml` in `compute`).

use serde_json::Value;

use super::{Collector, POD, kind, node_names, owned_pods};
use crate::api::{Kind, VIRTUAL_DISK};

const GROUP: &str = "virtualization.deckhouse.io";
/// The virtualization module's namespace, where ClusterVirtualImages' importers run.
const CVI_IMPORTER_NAMESPACE: &str = "d8-virtualization";
const INTERNAL: &str = "internal.virtualization.deckhouse.io";
const VMOP: Kind = kind(
    GROUP,
    "v1alpha2",
    "VirtualMachineOperation",
    "virtualmachineoperations",
    true,
);
const VMBDA: Kind = kind(
    GROUP,
    "v1alpha2",
    "VirtualMachineBlockDeviceAttachment",
    "virtualmachineblockdeviceattachments",
    true,
);
const VIRTUAL_IMAGE: Kind = kind(GROUP, "v1alpha2", "VirtualImage", "virtualimages", true);
const CLUSTER_VIRTUAL_IMAGE: Kind = kind(
    GROUP,
    "v1alpha2",
    "ClusterVirtualImage",
    "clustervirtualimages",
    false,
);
const INTERNAL_VM: Kind = kind(
    INTERNAL,
    "v1",
    "InternalVirtualizationVirtualMachine",
    "internalvirtualizationvirtualmachines",
    true,
);
const INTERNAL_VMI: Kind = kind(
    INTERNAL,
    "v1",
    "InternalVirtualizationVirtualMachineInstance",
    "internalvirtualizationvirtualmachineinstances",
    true,
);
const INTERNAL_VMIM: Kind = kind(
    INTERNAL,
    "v1",
    "InternalVirtualizationVirtualMachineInstanceMigration",
    "internalvirtualizationvirtualmachineinstancemigrations",
    true,
);

/// One block device (kind, name), its object, and its PVC if it has one.
async fn block_device(c: &Collector, kind: &str, name: &str) -> (Option<Value>, Option<String>) {
    let k = match kind {
        "VirtualDisk" => VIRTUAL_DISK,
        "VirtualImage" => VIRTUAL_IMAGE,
        "ClusterVirtualImage" => CLUSTER_VIRTUAL_IMAGE,
        other => {
            c.error(format!("block device {other}/{name}: unknown kind"));
            return (None, None);
        }
    };
    let object = c.get(&k, name).await;
    if k.namespaced {
        c.events(kind, name).await;
    }
    let pvc = object.as_ref().and_then(|o| {
        o["status"]["target"]["persistentVolumeClaimName"]
            .as_str()
            .filter(|_| k.namespaced)
            .map(str::to_owned)
    });
    (object, pvc)
}

/// Collects everything of one Deckhouse VM: first what the VM names (its internal KubeVirt
/// objects, operations, attachments, block devices) beside every pod of the namespace, then
/// its snapshots, the devices only attachments and disk sources name, and what hangs off all
/// of them (the VM's pods, their nodes and storage, the domain XML, the guest's view).
pub(crate) async fn collect(c: &Collector, vm: &Value) {
    let name = vm["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let spec_refs = vm["spec"]["blockDeviceRefs"].as_array();
    let refs = device_refs(spec_refs.map(Vec::as_slice).unwrap_or_default(), "");
    let (_, _, operations, vmbdas, mut devices, all_pods) = futures::join!(
        c.events("VirtualMachine", &name),
        internal_objects(c, &name),
        operations(c, vm),
        c.list(&VMBDA, None, |b| b["spec"]["virtualMachineName"]
            == name.as_str()),
        futures::future::join_all(refs.iter().map(|(k, n)| block_device(c, k, n))),
        c.list_raw(&POD, None),
    );
    snapshots(c, &name).await;
    let (attached, more) = attached_devices(c, &vmbdas, &refs).await;
    devices.extend(more);
    let images = disk_sources(c, &devices, &[refs, attached].concat()).await;
    let cvi_importers = cvi_importers(c, &images).await;
    devices.extend(images);
    let pvcs: Vec<String> = devices.iter().filter_map(|(_, p)| p.clone()).collect();
    let devices_found: Vec<Value> = devices.iter().filter_map(|(d, _)| d.clone()).collect();
    let (launchers, mut pods) = vm_pods(&all_pods, &name, &devices_found);
    pods.extend(cvi_importers);
    for pod in &pods {
        c.put_object(&POD, pod).await;
    }
    let running: Vec<String> = launchers
        .iter()
        .filter(|p| p["status"]["phase"] == "Running")
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let mut nodes = node_names(&pods);
    if let Some(node) = vm["status"]["nodeName"].as_str() {
        nodes.push(node.to_owned());
    }
    futures::join!(
        c.pods(&pods),
        c.storage(pvcs),
        c.nodes(nodes),
        futures::future::join_all(running.iter().map(|pod| {
            c.domain_xml(
                pod,
                vec!["vlctl".into(), "domain".into(), "-o".into(), "xml".into()],
            )
        })),
        guest_info(c, vm),
    );
    let mut facts = c.facts.lock().expect("facts lock");
    facts.migrations = operations;
    facts.disks = devices.into_iter().filter_map(|(d, _)| d).collect();
}

/// `(kind, name)` of each block device reference in `items` (at `pointer` inside each item,
/// `""` for the item itself).
fn device_refs(items: &[Value], pointer: &str) -> Vec<(String, String)> {
    items
        .iter()
        .filter_map(|r| {
            let r = r.pointer(pointer)?;
            Some((
                r["kind"].as_str()?.to_owned(),
                r["name"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// The internal KubeVirt VM, VMI and migrations the platform runs the VM with: where the
/// launcher's own state and errors are.
async fn internal_objects(c: &Collector, name: &str) {
    futures::join!(
        c.get(&INTERNAL_VM, name),
        c.get(&INTERNAL_VMI, name),
        c.list(&INTERNAL_VMIM, None, |m| m["spec"]["vmiName"] == name),
    );
}

/// Its operations (migrations, restarts, restores among them) with their events, and the
/// clone operation that made it (owned by it).
async fn operations(c: &Collector, vm: &Value) -> Vec<Value> {
    let name = vm["metadata"]["name"].as_str().unwrap_or_default();
    let ops = c
        .list(&VMOP, None, |o| {
            o["spec"]["virtualMachineName"] == name
                || o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == vm["metadata"]["uid"]))
        })
        .await;
    futures::future::join_all(ops.iter().map(|o| {
        c.events(
            "VirtualMachineOperation",
            o["metadata"]["name"].as_str().unwrap_or_default(),
        )
    }))
    .await;
    ops
}

/// Its snapshots and their disk snapshots (restores are among its operations).
async fn snapshots(c: &Collector, name: &str) {
    let snapshots = c
        .list(&crate::snapshot::deckhouse::VM_SNAPSHOT, None, |s| {
            s["spec"]["virtualMachineName"] == name
        })
        .await;
    let disk_snapshots: Vec<String> = snapshots
        .iter()
        .flat_map(|s| {
            s["status"]["virtualDiskSnapshotNames"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(str::to_owned))
        })
        .collect();
    c.list(&crate::snapshot::deckhouse::VD_SNAPSHOT, None, |d| {
        d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| disk_snapshots.iter().any(|x| x == n))
    })
    .await;
}

/// The attachments' events and the devices attached through them (hotplug) that the VM's
/// spec does not name, each once: `(their refs, what was found of each)`.
async fn attached_devices(
    c: &Collector,
    vmbdas: &[Value],
    refs: &[(String, String)],
) -> (Vec<(String, String)>, Vec<(Option<Value>, Option<String>)>) {
    let attached: Vec<(String, String)> = device_refs(vmbdas, "/spec/blockDeviceRef")
        .into_iter()
        .filter(|r| !refs.contains(r))
        .collect();
    let (_, found) = futures::join!(
        futures::future::join_all(vmbdas.iter().map(|b| {
            c.events(
                "VirtualMachineBlockDeviceAttachment",
                b["metadata"]["name"].as_str().unwrap_or_default(),
            )
        })),
        futures::future::join_all(attached.iter().map(|(k, n)| block_device(c, k, n))),
    );
    (attached, found)
}

/// The images its disks are made from (`spec.dataSource.objectRef`) and not already among
/// `seen`, with their importers: a VM being created from an image still importing waits on
/// that image's import (`d8v-vi-importer-<uid>`, owned by the VirtualImage, in the VM's
/// namespace).
async fn disk_sources(
    c: &Collector,
    devices: &[(Option<Value>, Option<String>)],
    seen: &[(String, String)],
) -> Vec<(Option<Value>, Option<String>)> {
    let sources: Vec<(String, String)> = devices
        .iter()
        .filter_map(|(d, _)| d.as_ref())
        .filter(|d| d["kind"] == "VirtualDisk")
        .filter_map(|d| {
            let r = &d["spec"]["dataSource"]["objectRef"];
            Some((
                r["kind"].as_str()?.to_owned(),
                r["name"].as_str()?.to_owned(),
            ))
        })
        .filter(|(k, _)| k == "VirtualImage" || k == "ClusterVirtualImage")
        .filter(|r| !seen.contains(r))
        .collect();
    futures::future::join_all(sources.iter().map(|(k, n)| block_device(c, k, n))).await
}

/// The importers of the cluster images among `images` still importing: they run in the
/// module's namespace (`d8v-cvi-importer-<uid>`), readable to those allowed there.
async fn cvi_importers(c: &Collector, images: &[(Option<Value>, Option<String>)]) -> Vec<Value> {
    futures::future::join_all(
        images
            .iter()
            .filter_map(|(i, _)| i.as_ref())
            .filter(|i| i["kind"] == "ClusterVirtualImage" && i["status"]["phase"] != "Ready")
            .filter_map(|i| i["metadata"]["uid"].as_str())
            .map(|uid| {
                let pod = format!("d8v-cvi-importer-{uid}");
                async move { c.find_in(&POD, CVI_IMPORTER_NAMESPACE, &pod).await }
            }),
    )
    .await
    .into_iter()
    .flatten()
    .collect()
}

/// Which of the namespace's pods are the VM's: `(launchers, all of its pods)`. Launchers by
/// the platform's VM label, then hotplug pods they own, then the importer pods of its disks
/// and images (`d8v-vd-importer-<uid>`, formerly `vd-importer-<name>`): owned by the disk,
/// so other VMs' imports stay out.
fn vm_pods(all_pods: &[Value], name: &str, devices: &[Value]) -> (Vec<Value>, Vec<Value>) {
    let launchers: Vec<Value> = all_pods
        .iter()
        .filter(|p| {
            p["metadata"]["labels"]["vm.kubevirt.internal.virtualization.deckhouse.io/name"] == name
        })
        .cloned()
        .collect();
    let mut pods = launchers.clone();
    pods.extend(owned_pods(all_pods, &launchers));
    pods.extend(owned_pods(all_pods, devices));
    (launchers, pods)
}

/// The guest agent's view, which Deckhouse reports in the VM status.
async fn guest_info(c: &Collector, vm: &Value) {
    if let Some(info) = vm["status"]["guestOSInfo"].as_object() {
        let text = serde_json::to_string_pretty(info).unwrap_or_default();
        c.put(
            "guest/guestosinfo.json".into(),
            "guest agent: OS (from the VM status)".into(),
            super::archive::Content::Bytes(c.redactor.text(&text).into_bytes()),
        )
        .await;
    }
}
