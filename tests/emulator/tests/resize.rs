//! Growing a claim as Kubernetes does it (see `src/expansion.rs` for the upstream sources):
//! the external-resizer expands the volume (`Resizing`, `allocatedResources`,
//! `ControllerResizeInProgress`), a filesystem volume then waits for the kubelet
//! (`FileSystemResizePending`, "Waiting for user to (re-)start a pod to finish file system
//! resize of volume on node.", `NodeResizePending`) with its old `status.capacity` until a
//! running pod mounts it; a block volume is done at once. A Deckhouse VirtualDisk shows its
//! claim's capacity: `Ready` at the old size while the claim waits for its VM to start.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, WatchEvent, WatchParams,
};
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};

use crate::common;

const PENDING: &str =
    "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";

async fn start(flavor: ServeFlavor, fixture: &str) -> (Emulator, kube::Client) {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![common::fixture(fixture)],
        flavor,
        import_step: Duration::from_millis(30),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = common::client(&emu).await;
    (emu, client)
}

fn api(client: &kube::Client, gvk: (&str, &str, &str), plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(gvk.0, gvk.1, gvk.2), plural);
    if plural == "storageclasses" {
        Api::all_with(client.clone(), &ar)
    } else {
        Api::namespaced_with(client.clone(), "default", &ar)
    }
}

fn pvcs(client: &kube::Client) -> Api<DynamicObject> {
    api(
        client,
        ("", "v1", "PersistentVolumeClaim"),
        "persistentvolumeclaims",
    )
}

async fn merge(api: &Api<DynamicObject>, name: &str, patch: Value) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

async fn get(api: &Api<DynamicObject>, name: &str) -> Value {
    serde_json::to_value(api.get(name).await.unwrap()).unwrap()
}

/// Poll `name` until `done` holds (10 s at most).
async fn until(api: &Api<DynamicObject>, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let object = get(api, name).await;
        if done(&object) {
            return object;
        }
        assert!(Instant::now() < deadline, "never reached: {object:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every state of `name` from now until `done` holds for one (10 s at most), by a watch.
async fn states_until(
    api: &Api<DynamicObject>,
    name: &str,
    change: impl std::future::Future<Output = ()>,
    done: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let rv = api
        .get(name)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut stream = api.watch(&params, &rv).await.unwrap().boxed();
    change.await;
    let mut seen = vec![];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let event = tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .unwrap_or_else(|_| panic!("never reached; saw {seen:#?}"))
            .unwrap()
            .expect("watch ended");
        if let WatchEvent::Modified(o) = event {
            let o = serde_json::to_value(o).unwrap();
            let end = done(&o);
            seen.push(o);
            if end {
                return seen;
            }
        }
    }
}

fn condition<'a>(o: &'a Value, type_: &str) -> Option<&'a Value> {
    o.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn resize_status(o: &Value) -> &str {
    o.pointer("/status/allocatedResourceStatuses/storage")
        .and_then(Value::as_str)
        .unwrap_or("")
}

async fn expandable_class(client: &kube::Client) {
    common::create(
        &api(
            client,
            ("storage.k8s.io", "v1", "StorageClass"),
            "storageclasses",
        ),
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "expandable"}, "provisioner": "example.org/csi",
            "volumeBindingMode": "Immediate", "allowVolumeExpansion": true}),
    )
    .await;
}

/// A claim of `mode`, bound at 1Gi (its status written as the PV controller would).
async fn bound_claim(client: &kube::Client, name: &str, mode: &str) {
    let claims = pvcs(client);
    common::create(
        &claims,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "expandable",
                "volumeMode": mode, "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    claims
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}})),
        )
        .await
        .unwrap();
}

fn grow(size: &str) -> Value {
    json!({"spec": {"resources": {"requests": {"storage": size}}}})
}

#[tokio::test]
async fn a_filesystem_claim_waits_for_a_running_pod_and_a_block_claim_does_not() {
    let (emu, client) = start(ServeFlavor::KubeVirt, "kubevirt.yaml").await;
    expandable_class(&client).await;
    bound_claim(&client, "fs", "Filesystem").await;
    bound_claim(&client, "blk", "Block").await;
    let claims = pvcs(&client);

    // The resizer's steps, in order, as a watch sees them.
    let seen = states_until(&claims, "fs", merge(&claims, "fs", grow("2Gi")), |o| {
        resize_status(o) == "NodeResizePending"
    })
    .await;
    let started = seen
        .iter()
        .find(|o| resize_status(o) == "ControllerResizeInProgress")
        .unwrap_or_else(|| panic!("no ControllerResizeInProgress in {seen:#?}"));
    assert_eq!(condition(started, "Resizing").unwrap()["status"], "True");
    assert_eq!(started["status"]["allocatedResources"]["storage"], "2Gi");
    assert_eq!(started["status"]["capacity"]["storage"], "1Gi");
    let pending = seen.last().unwrap();
    assert!(condition(pending, "Resizing").is_none(), "{pending:#}");
    let fs = condition(pending, "FileSystemResizePending").unwrap();
    assert_eq!(
        (fs["status"].as_str(), fs["message"].as_str()),
        (Some("True"), Some(PENDING))
    );
    assert_eq!(pending["status"]["capacity"]["storage"], "1Gi");

    // A block claim grown afterwards is done over the next ticks, without a node step ...
    let seen = states_until(&claims, "blk", merge(&claims, "blk", grow("3Gi")), |o| {
        o["status"]["capacity"]["storage"] == "3Gi"
    })
    .await;
    assert!(
        seen.iter()
            .all(|o| condition(o, "FileSystemResizePending").is_none()),
        "{seen:#?}"
    );
    let done = seen.last().unwrap();
    assert!(
        done["status"].get("allocatedResourceStatuses").is_none(),
        "{done:#}"
    );
    assert!(condition(done, "Resizing").is_none(), "{done:#}");
    // ... and all that time nothing mounted the filesystem claim: it still waits.
    let fs_claim = get(&claims, "fs").await;
    assert_eq!(resize_status(&fs_claim), "NodeResizePending");
    assert_eq!(fs_claim["status"]["capacity"]["storage"], "1Gi");

    // A running pod that mounts it: the kubelet finishes the resize.
    let pods = api(&client, ("", "v1", "Pod"), "pods");
    common::create(
        &pods,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "user"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "fs"}}]}}),
    )
    .await;
    pods.patch_status(
        "user",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    let done = until(&claims, "fs", |o| {
        o["status"]["capacity"]["storage"] == "2Gi"
    })
    .await;
    assert!(
        done["status"].get("allocatedResourceStatuses").is_none(),
        "{done:#}"
    );
    assert!(
        condition(&done, "FileSystemResizePending").is_none(),
        "{done:#}"
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn a_stopped_kubevirt_vm_keeps_its_claim_pending_until_it_starts() {
    let (emu, client) = start(ServeFlavor::KubeVirt, "kubevirt.yaml").await;
    expandable_class(&client).await;
    let dvs = api(
        &client,
        ("cdi.kubevirt.io", "v1beta1", "DataVolume"),
        "datavolumes",
    );
    common::create(
        &dvs,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "disk"},
            "spec": {"source": {"blank": {}}, "storage": {"storageClassName": "expandable",
                "resources": {"requests": {"storage": "1Gi"}}}}}),
    )
    .await;
    until(&dvs, "disk", |v| v["status"]["phase"] == "Succeeded").await;
    let vms = api(
        &client,
        ("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    );
    common::create(
        &vms,
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "vm"},
            "spec": {"runStrategy": "Halted", "template": {"spec": {
                "domain": {"devices": {"disks": [{"name": "d", "disk": {"bus": "virtio"}}]}},
                "volumes": [{"name": "d", "dataVolume": {"name": "disk"}}]}}}}),
    )
    .await;
    let claims = pvcs(&client);
    merge(&claims, "disk", grow("2Gi")).await;
    let pending = until(&claims, "disk", |o| resize_status(o) == "NodeResizePending").await;
    assert_eq!(pending["status"]["capacity"]["storage"], "1Gi");
    assert!(condition(&pending, "FileSystemResizePending").is_some());
    // Starting the VM: its virt-launcher pod mounts the claim and the kubelet grows it.
    merge(&vms, "vm", json!({"spec": {"runStrategy": "Always"}})).await;
    let done = until(&claims, "disk", |o| {
        o["status"]["capacity"]["storage"] == "2Gi"
    })
    .await;
    assert!(
        condition(&done, "FileSystemResizePending").is_none(),
        "{done:#}"
    );
    let vmi = api(
        &client,
        ("kubevirt.io", "v1", "VirtualMachineInstance"),
        "virtualmachineinstances",
    );
    assert_eq!(get(&vmi, "vm").await["status"]["phase"], "Running");
    emu.shutdown().await;
}

#[tokio::test]
async fn a_deckhouse_disk_of_a_stopped_vm_stays_ready_at_its_old_capacity() {
    let (emu, client) = start(ServeFlavor::Deckhouse, "deckhouse.yaml").await;
    expandable_class(&client).await;
    let dh = |kind, plural| {
        api(
            &client,
            ("virtualization.deckhouse.io", "v1alpha2", kind),
            plural,
        )
    };
    let vds = dh("VirtualDisk", "virtualdisks");
    common::create(
        &vds,
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
            "metadata": {"name": "data"},
            "spec": {"persistentVolumeClaim": {"size": "1Gi", "storageClassName": "expandable"}}}),
    )
    .await;
    until(&vds, "data", |v| v["status"]["phase"] == "Ready").await;
    let vms = dh("VirtualMachine", "virtualmachines");
    common::create(
        &vms,
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
            "metadata": {"name": "vm"},
            "spec": {"runPolicy": "AlwaysOff", "virtualMachineClassName": "generic",
                "cpu": {"cores": 1}, "memory": {"size": "1Gi"},
                "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "data"}]}}),
    )
    .await;
    until(&vms, "vm", |v| v["status"]["phase"] == "Stopped").await;
    let seen = states_until(
        &vds,
        "data",
        merge(
            &vds,
            "data",
            json!({"spec": {"persistentVolumeClaim": {"size": "2Gi"}}}),
        ),
        |v| {
            v["status"]["phase"] == "Ready"
                && condition(v, "Resizing").is_none()
                && v["status"]["observedGeneration"] == v["metadata"]["generation"]
        },
    )
    .await;
    let resizing = seen
        .iter()
        .find(|v| v["status"]["phase"] == "Resizing")
        .unwrap_or_else(|| panic!("never Resizing: {seen:#?}"));
    let c = condition(resizing, "Resizing").unwrap();
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("True"), Some("InProgress"))
    );
    // Ready again, at the claim's capacity: the old size, the claim waiting for the node.
    let ready = seen.last().unwrap();
    assert_eq!(ready["status"]["capacity"], "1Gi", "{ready:#}");
    let claim_name = ready["status"]["target"]["persistentVolumeClaimName"]
        .as_str()
        .unwrap()
        .to_owned();
    let claims = pvcs(&client);
    let claim = get(&claims, &claim_name).await;
    assert_eq!(resize_status(&claim), "NodeResizePending", "{claim:#}");
    assert_eq!(
        condition(&claim, "FileSystemResizePending").unwrap()["message"],
        PENDING
    );
    // The VM starts: the disk gets its new capacity.
    merge(&vms, "vm", json!({"spec": {"runPolicy": "AlwaysOn"}})).await;
    let grown = until(&vds, "data", |v| v["status"]["capacity"] == "2Gi").await;
    assert_eq!(grown["status"]["phase"], "Ready");
    emu.shutdown().await;
}
