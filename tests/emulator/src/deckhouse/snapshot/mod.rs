//! Deckhouse's VM snapshots (deckhouse/virtualization @ cf3a9e6c): the VirtualMachineSnapshot
//! controller, the Secret a snapshot keeps its VM in, VirtualDisks made from a
//! VirtualDiskSnapshot, and the VirtualMachineOperation `Restore`.
//!
//! - [`take`]: taking a snapshot (`pkg/controller/vmsnapshot`), and a disk snapshot that
//!   storage cannot take (`pkg/controller/vdsnapshot`).
//! - [`kept`]: what the snapshot's Secret holds (`secret_restorer.go`).
//! - [`disk_source`]: a VirtualDisk whose `dataSource` is a VirtualDiskSnapshot
//!   (`pkg/controller/vd/internal/source/step/create_pvc_from_vdsnapshot_step.go`).
//! - [`restore`]: the VirtualMachineOperation `Restore` (`pkg/controller/vmop/snapshot`).
//!
//! Data: a VirtualDiskSnapshot keeps its disk's bytes through [`crate::kubevirt::vm_snapshot::capture`];
//! a disk made from it gets them through [`crate::kubevirt::vm_snapshot::materialize`] ([`disk_data`]).

use serde_json::Value;

pub mod disk_source;
pub mod kept;
pub mod restore;
pub mod take;
#[cfg(test)]
mod testing;

pub use disk_source::{disk_data, from_snapshot};
pub use kept::{kept_provisioner, kept_vm, provisioning_secret};
pub use restore::{RESTORE_POWER_STATE, RestoreStep, restore_step};
pub use take::{live_data_ids, vm_snapshot};

const DH: &str = "virtualization.deckhouse.io";
/// Plural of VirtualMachineSnapshot.
pub const VM_SNAPSHOTS: &str = "virtualmachinesnapshots";
/// Plural of VirtualDiskSnapshot.
pub const VD_SNAPSHOTS: &str = "virtualdisksnapshots";
/// Which kept data a VirtualDiskSnapshot (made here) holds (see [`crate::kubevirt::vm_snapshot::capture`]).
const DATA_ID: &str = "emulator.kubevm.io/data-id";
/// The size of the disk a VirtualDiskSnapshot (made here) was taken of.
const SIZE: &str = "emulator.kubevm.io/size";
/// The StorageClass of the disk a VirtualDiskSnapshot (made here) was taken of (upstream keeps
/// it on the VolumeSnapshot, `annotations.AnnStorageClassName`).
const CLASS: &str = "emulator.kubevm.io/storage-class";
const READY: &str = "VirtualMachineSnapshotReady";

fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn condition_true(obj: &Value, type_: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == type_ && c["status"] == "True")
        })
}

/// The VirtualDisks among a VM's block devices (`fillStatusVirtualDiskSnapshotNames`).
fn disks(vm: &Value) -> Vec<String> {
    vm.pointer("/spec/blockDeviceRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == "VirtualDisk")
        .filter_map(|r| r["name"].as_str().map(String::from))
        .collect()
}
