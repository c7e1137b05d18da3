//! A Deckhouse VirtualMachineSnapshot over a disk whose storage cannot snapshot (see
//! `src/dh_snapshot.rs`): Deckhouse makes the disk's VolumeSnapshot without a class, the
//! snapshot-controller finds no default VolumeSnapshotClass for the claim's provisioner
//! (external-snapshotter `SetDefaultSnapshotClass`), the VirtualDiskSnapshot fails
//! (`vdsnapshot/internal/life_cycle.go`) and so does the VM snapshot
//! (`vmsnapshot/internal/life_cycle.go` `ensureVirtualDiskSnapshots`).

use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};

use crate::common;

fn dh(client: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("virtualization.deckhouse.io", "v1alpha2", kind),
        plural,
    );
    Api::namespaced_with(client.clone(), "default", &ar)
}

async fn until(api: &Api<DynamicObject>, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let object = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
        if done(&object) {
            return object;
        }
        assert!(Instant::now() < deadline, "never reached: {object:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn condition<'a>(o: &'a Value, type_: &str) -> &'a Value {
    o["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
}

fn snapshot(name: &str, vm: &str) -> Value {
    json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachineSnapshot",
        "metadata": {"name": name},
        "spec": {"virtualMachineName": vm, "requiredConsistency": false, "keepIPAddress": "Never"}})
}

#[tokio::test]
async fn a_disk_without_a_default_volume_snapshot_class_fails_the_vm_snapshot() {
    let (emu, client) = common::start(kubevm_emulator::ServeFlavor::Deckhouse).await;
    let vds = dh(&client, "VirtualDisk", "virtualdisks");
    // The fixture's `nfs` class: no VolumeSnapshotClass has its driver.
    common::create(
        &vds,
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
            "metadata": {"name": "scratch"},
            "spec": {"persistentVolumeClaim": {"size": "1Gi", "storageClassName": "nfs"}}}),
    )
    .await;
    until(&vds, "scratch", |v| v["status"]["phase"] == "Ready").await;
    let vms = dh(&client, "VirtualMachine", "virtualmachines");
    common::create(
        &vms,
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
            "metadata": {"name": "vm"},
            "spec": {"runPolicy": "AlwaysOff", "virtualMachineClassName": "generic",
                "cpu": {"cores": 1}, "memory": {"size": "1Gi"},
                "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "scratch"}]}}),
    )
    .await;
    until(&vms, "vm", |v| v["status"]["phase"] == "Stopped").await;
    let snaps = dh(&client, "VirtualMachineSnapshot", "virtualmachinesnapshots");
    common::create(&snaps, snapshot("s1", "vm")).await;
    let failed = until(&snaps, "s1", |s| s["status"]["phase"] == "Failed").await;
    let uid = failed["metadata"]["uid"].as_str().unwrap();
    let vds_name = format!("scratch-{uid}");
    assert_eq!(
        failed["status"]["virtualDiskSnapshotNames"],
        json!([vds_name])
    );
    let ready = condition(&failed, "VirtualMachineSnapshotReady");
    assert_eq!(
        (ready["status"].as_str(), ready["reason"].as_str()),
        (Some("False"), Some("VirtualMachineSnapshotFailed"))
    );
    let vs_error = format!(
        "VolumeSnapshot \"vs-{vds_name}\" has an error: Failed to set default snapshot class with error cannot find default snapshot class."
    );
    assert_eq!(
        ready["message"],
        format!(
            "The virtual disk snapshot \"{vds_name}\" is failed: cannot take snapshot. {vs_error}"
        )
    );
    let disk_snaps = dh(&client, "VirtualDiskSnapshot", "virtualdisksnapshots");
    let disk_snap = until(&disk_snaps, &vds_name, |_| true).await;
    assert_eq!(disk_snap["status"]["phase"], "Failed");
    assert_eq!(disk_snap["spec"]["virtualDiskName"], "scratch");
    let c = condition(&disk_snap, "VirtualDiskSnapshotReady");
    assert_eq!(
        (c["reason"].as_str(), c["message"].as_str()),
        (Some("VirtualDiskSnapshotFailed"), Some(vs_error.as_str()))
    );

    // The default class has a default VolumeSnapshotClass for its driver: that VM's snapshot
    // is taken.
    common::create(&snaps, snapshot("s2", "linux-vm")).await;
    until(&snaps, "s2", |s| s["status"]["phase"] == "Ready").await;
    emu.shutdown().await;
}
