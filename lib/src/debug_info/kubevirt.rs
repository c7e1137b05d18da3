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

/// Collects everything of one KubeVirt VM: first what the VM names (its instance,
/// migrations, disks) beside every pod of the namespace, then what hangs off those (the pods
/// that are the VM's, their nodes and storage, the domain XML, the guest agent's view). The
/// steps run concurrently where they do not depend on each other.
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
        migrations(c, &name),
        disks(c, vm),
        c.list_raw(&POD, None),
    );
    related(c, &name).await;
    let pvcs = claims(vm, vmi.as_ref());
    let (launchers, pods) = vm_pods(&all_pods, vm, vmi.as_ref(), &pvcs);
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
                guest_agent(c, &name).await;
            }
        },
    );
    let mut facts = c.facts.lock().expect("facts lock");
    facts.instance = vmi;
    facts.migrations = migrations;
    facts.disks = dvs;
}

/// The VM's migrations (matched by `spec.vmiName`, since they outlive their instance) and
/// their events: a stuck or failed migration is a common reason to collect.
async fn migrations(c: &Collector, name: &str) -> Vec<Value> {
    let migrations = c.list(&VMIM, None, |m| m["spec"]["vmiName"] == name).await;
    futures::future::join_all(migrations.iter().map(|m| {
        c.events(
            "VirtualMachineInstanceMigration",
            m["metadata"]["name"].as_str().unwrap_or_default(),
        )
    }))
    .await;
    migrations
}

/// The VM's DataVolumes (named by its volumes and its `dataVolumeTemplates`) with their
/// events, and the golden images its disks are cloned from: an import or clone that never
/// finished is what keeps a VM from starting. Returns the DataVolumes found.
async fn disks(c: &Collector, vm: &Value) -> Vec<Value> {
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
    // CDI DataSources named by `sourceRef` (in the VM's namespace unless the reference names
    // another).
    let sources: Vec<(String, String)> = vm["spec"]["dataVolumeTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| &t["spec"]["sourceRef"])
        .filter(|r| r["kind"] == "DataSource")
        .filter_map(|r| {
            let ds_ns = r["namespace"].as_str().unwrap_or(&c.ns);
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
    .collect()
}

/// Its snapshots and the restores into it (kept when the VM is deleted), and the clones made
/// from it or into it: they explain a VM that changed or appeared.
async fn related(c: &Collector, name: &str) {
    futures::join!(
        c.list(&crate::snapshot::kubevirt::VM_SNAPSHOT, None, |s| {
            s["spec"]["source"]["name"] == name
        }),
        c.list(&crate::snapshot::kubevirt::VM_RESTORE, None, |r| {
            r["spec"]["target"]["name"] == name
        }),
        c.list(&crate::clone::kubevirt::CLONE, None, |r| {
            r["spec"]["source"]["name"] == name || r["spec"]["target"]["name"] == name
        }),
    );
}

/// The PVCs of the VM, plus hotplugged ones only its instance reports.
fn claims(vm: &Value, vmi: Option<&Value>) -> Vec<String> {
    let (_, mut pvcs) = volume_claims(&vm["spec"]["template"]["spec"]);
    if let Some(vmi) = vmi {
        pvcs.extend(volume_claims(&vmi["spec"]).1);
        pvcs.extend(strings(
            vmi["status"]["volumeStatus"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| &v["persistentVolumeClaimInfo"]["claimName"]),
        ));
    }
    pvcs
}

/// Which of the namespace's pods are the VM's: `(launchers, all of its pods)`. Launchers are
/// owned by the VMI (or labelled with its uid); the host-name label is the fallback for pods
/// whose owner is gone, and may be shared with a VM of another name. Hotplug pods are owned by
/// a launcher, importer/uploader/clone pods are named after one of its claims (CDI names them
/// `importer-<pvc>`).
fn vm_pods(
    all_pods: &[Value],
    vm: &Value,
    vmi: Option<&Value>,
    pvcs: &[String],
) -> (Vec<Value>, Vec<Value>) {
    let name = vm["metadata"]["name"].as_str().unwrap_or_default();
    let vmi_uid = vmi.map(|v| v["metadata"]["uid"].clone());
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
                .any(|o| o["kind"] == "VirtualMachineInstance" && o["name"] == name);
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
    pods.extend(owned_pods(all_pods, &launchers));
    for pod in all_pods {
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let cdi = ["importer-", "cdi-upload-", "cdi-clone-"]
            .iter()
            .any(|p| pvcs.iter().any(|claim| pod_name == format!("{p}{claim}")));
        if cdi && !pods.iter().any(|p| p["metadata"]["name"] == pod_name) {
            pods.push(pod.clone());
        }
    }
    (launchers, pods)
}

/// The guest agent's view (OS, users, filesystems), asked only while it is connected: it says
/// what the guest itself sees.
async fn guest_agent(c: &Collector, name: &str) {
    let ns = &c.ns;
    let base =
        format!("/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}");
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
