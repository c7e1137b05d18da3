//! What belongs to a KubeVirt VM: its VMI, migrations, DataVolumes and PVCs, the
//! DataSources its disks are cloned from, the virt-launcher, hotplug and importer pods, its snapshots, restores and clones, the domain XML
//! (`virsh dumpxml` in `compute`) and the guest agent's view (`guestosinfo`, `userlist`,
//! `filesystemlist`).

use serde_json::Value;

use super::{Collector, POD, kind, node_names, owned_pods};
use crate::api::{DATA_VOLUME, KUBEVIRT_VMI, Kind};

const DATA_SOURCE: Kind = kind(
    "cdi.kubevirt.io",
    "v1beta1",
    "DataSource",
    "datasources",
    true,
);

const VMIM: Kind = kind(
    "kubevirt.io",
    "v1",
    "VirtualMachineInstanceMigration",
    "virtualmachineinstancemigrations",
    true,
);

/// The libvirt connection of a non-root virt-launcher (KubeVirt user guide, "virsh commands").
const VIRSH_URI: &str = "qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock";

fn strings<'a>(values: impl Iterator<Item = &'a Value>) -> Vec<String> {
    values
        .filter_map(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// DataVolume and PVC names a VM (or VMI) spec refers to.
pub fn volume_claims(spec: &Value) -> (Vec<String>, Vec<String>) {
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    let mut dvs = strings(volumes.iter().map(|v| &v["dataVolume"]["name"]));
    let mut pvcs = strings(
        volumes
            .iter()
            .map(|v| &v["persistentVolumeClaim"]["claimName"]),
    );
    pvcs.extend(strings(
        volumes.iter().map(|v| &v["memoryDump"]["claimName"]),
    ));
    dvs.sort();
    dvs.dedup();
    // A DataVolume's PVC has its name.
    pvcs.extend(dvs.iter().cloned());
    (dvs, pvcs)
}

fn has_condition(object: &Value, kind: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

pub(crate) async fn collect(c: &Collector, vm: &Value) {
    let name = vm["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let ns = c.ns.clone();
    let wants_vmi = vm["status"]["created"].as_bool() == Some(true)
        || !matches!(
            vm["status"]["printableStatus"].as_str(),
            Some("Stopped") | None
        );
    let (_, vmi, migrations, dvs, all_pods) = futures::join!(
        c.events("VirtualMachine", &name),
        async {
            if wants_vmi {
                let vmi = c.get(&KUBEVIRT_VMI, &name).await;
                c.events("VirtualMachineInstance", &name).await;
                vmi
            } else {
                None
            }
        },
        async {
            let migrations = c
                .list(&VMIM, None, |m| m["spec"]["vmiName"] == name.as_str())
                .await;
            futures::future::join_all(migrations.iter().map(|m| {
                c.events(
                    "VirtualMachineInstanceMigration",
                    m["metadata"]["name"].as_str().unwrap_or_default(),
                )
            }))
            .await;
            migrations
        },
        async {
            let (mut dvs, _) = volume_claims(&vm["spec"]["template"]["spec"]);
            dvs.extend(strings(
                vm["spec"]["dataVolumeTemplates"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| &t["metadata"]["name"]),
            ));
            dvs.sort();
            dvs.dedup();
            // The golden images its disks are cloned from: CDI DataSources named by
            // `sourceRef` (in the VM's namespace unless the reference names another).
            let sources: Vec<(String, String)> = vm["spec"]["dataVolumeTemplates"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| &t["spec"]["sourceRef"])
                .filter(|r| r["kind"] == "DataSource")
                .filter_map(|r| {
                    let ds_ns = r["namespace"].as_str().unwrap_or(&ns);
                    Some((ds_ns.to_owned(), r["name"].as_str()?.to_owned()))
                })
                .collect();
            futures::future::join_all(
                sources
                    .iter()
                    .map(|(ds_ns, ds)| c.get_in(&DATA_SOURCE, ds_ns, ds)),
            )
            .await;
            futures::future::join_all(dvs.iter().map(|dv| async move {
                let got = c.get(&DATA_VOLUME, dv).await;
                c.events("DataVolume", dv).await;
                got
            }))
            .await
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
        },
        c.list_raw(&POD, None),
    );
    // Its snapshots and the restores into it (kept when the VM is deleted), and the clones
    // made from it or into it.
    futures::join!(
        c.list(&crate::snapshot::kubevirt::VM_SNAPSHOT, None, |s| {
            s["spec"]["source"]["name"] == name.as_str()
        }),
        c.list(&crate::snapshot::kubevirt::VM_RESTORE, None, |r| {
            r["spec"]["target"]["name"] == name.as_str()
        }),
        c.list(&crate::clone::kubevirt::CLONE, None, |r| {
            r["spec"]["source"]["name"] == name.as_str()
                || r["spec"]["target"]["name"] == name.as_str()
        }),
    );
    // Claims of the VM, plus hotplugged ones the VMI reports.
    let (_, mut pvcs) = volume_claims(&vm["spec"]["template"]["spec"]);
    if let Some(vmi) = &vmi {
        pvcs.extend(volume_claims(&vmi["spec"]).1);
        pvcs.extend(strings(
            vmi["status"]["volumeStatus"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| &v["persistentVolumeClaimInfo"]["claimName"]),
        ));
    }
    // The VM's pods: launchers by label, hotplug pods owned by a launcher, importer/uploader
    // pods owned by one of its claims' DataVolumes or PVCs (CDI names them `importer-<pvc>`).
    // Launchers are owned by the VMI (or labelled with its uid); the host-name label is the
    // fallback for pods whose owner is gone, and may be shared with a VM of another name.
    let vmi_uid = vmi.as_ref().map(|v| v["metadata"]["uid"].clone());
    let host_label = crate::vm::kubevirt_launcher_host_label(vm);
    let is_launcher = |p: &&Value| p["metadata"]["labels"]["kubevirt.io"] == "virt-launcher";
    let mut launchers: Vec<Value> = all_pods
        .iter()
        .filter(is_launcher)
        .filter(|p| {
            let owned = p["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|o| o["kind"] == "VirtualMachineInstance" && o["name"] == name.as_str());
            owned
                || vmi_uid
                    .as_ref()
                    .is_some_and(|uid| p["metadata"]["labels"]["kubevirt.io/created-by"] == *uid)
        })
        .cloned()
        .collect();
    if launchers.is_empty() {
        launchers = all_pods
            .iter()
            .filter(is_launcher)
            .filter(|p| p["metadata"]["labels"]["vm.kubevirt.io/name"] == host_label.as_str())
            .cloned()
            .collect();
    }
    let mut pods = launchers.clone();
    pods.extend(owned_pods(&all_pods, &launchers));
    for pod in &all_pods {
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let cdi = ["importer-", "cdi-upload-", "cdi-clone-"]
            .iter()
            .any(|p| pvcs.iter().any(|claim| pod_name == format!("{p}{claim}")));
        if cdi && !pods.iter().any(|p| p["metadata"]["name"] == pod_name) {
            pods.push(pod.clone());
        }
    }
    for pod in &pods {
        c.put_object(&POD, pod).await;
    }
    let running_launchers: Vec<String> = launchers
        .iter()
        .filter(|p| p["status"]["phase"] == "Running")
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let mut nodes = node_names(&pods);
    if let Some(node) = vmi.as_ref().and_then(|v| v["status"]["nodeName"].as_str()) {
        nodes.push(node.to_owned());
    }
    let agent = vmi
        .as_ref()
        .is_some_and(|v| has_condition(v, "AgentConnected"));
    let base =
        format!("/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}");
    futures::join!(
        c.pods(&pods),
        c.storage(pvcs),
        c.nodes(nodes),
        futures::future::join_all(running_launchers.iter().map(|pod| {
            c.domain_xml(
                pod,
                vec![
                    "virsh".into(),
                    "-c".into(),
                    VIRSH_URI.into(),
                    "dumpxml".into(),
                    format!("{ns}_{name}"),
                ],
            )
        })),
        async {
            if agent {
                let (os, users, fs) = (
                    format!("{base}/guestosinfo"),
                    format!("{base}/userlist"),
                    format!("{base}/filesystemlist"),
                );
                futures::join!(
                    c.raw_json(
                        &os,
                        "guest/guestosinfo.json",
                        "guest agent: OS, hostname, time zone"
                    ),
                    c.raw_json(
                        &users,
                        "guest/userlist.json",
                        "guest agent: logged-in users"
                    ),
                    c.raw_json(&fs, "guest/filesystemlist.json", "guest agent: filesystems"),
                );
            }
        },
    );
    let mut facts = c.facts.lock().expect("facts lock");
    facts.instance = vmi;
    facts.migrations = migrations;
    facts.disks = dvs;
}
