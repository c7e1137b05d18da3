//! Deckhouse objects for a plan (`virtualization.deckhouse.io/v1alpha2`): VirtualDisks for
//! the boot and data disks, the VirtualMachine, and a provisioning Secret when the user data
//! cannot be inline.

use serde_json::{Map, Value, json};

use super::cloudinit::UserData;
use super::plan::{BootSource, DEFAULT_DISK_SIZE, Firmware, ImageRef, OsType, VmPlan};
use super::{PlannedObject, metadata, user_data_secret, vm_metadata};
use crate::flavor::DECKHOUSE_VERSION;

/// Secret type Deckhouse requires for `provisioning.userDataRef`.
pub const SECRET_TYPE: &str = "provisioning.virtualization.deckhouse.io/cloud-init";
/// Secret key Deckhouse reads user data from.
pub const SECRET_KEY: &str = "userData";

fn api_version() -> String {
    format!("{}/{DECKHOUSE_VERSION}", crate::flavor::DECKHOUSE_GROUP)
}

/// The objects to create, in order: VirtualDisks, the VirtualMachine, then the Secret.
pub(super) fn objects(plan: &VmPlan, user_data: Option<&UserData>) -> Vec<PlannedObject> {
    let mut objects = Vec::new();
    if let Some(disk) = boot_disk(plan) {
        objects.push(PlannedObject::new(disk));
    }
    for data in &plan.data_disks {
        let class = data
            .storage_class
            .as_deref()
            .or(plan.storage_class.as_deref());
        objects.push(PlannedObject::new(virtual_disk(
            plan,
            &plan.data_disk_name(data),
            None,
            Some(data.size.to_string()),
            class,
        )));
    }
    if let Some(ip) = super::networks::ip_address(plan) {
        objects.push(ip);
    }
    let mut vm = virtual_machine(plan, user_data);
    super::networks::apply(plan, &mut vm);
    objects.push(PlannedObject::new(vm));
    if let Some(data) = user_data.filter(|d| d.needs_secret()) {
        objects.push(user_data_secret(plan, SECRET_TYPE, SECRET_KEY, data));
    }
    objects
}

/// The VirtualDisk holding the boot disk, unless an existing disk is used.
fn boot_disk(plan: &VmPlan) -> Option<Value> {
    let size = plan.disk_size.unwrap_or(DEFAULT_DISK_SIZE).to_string();
    let (source, size) = match &plan.boot {
        BootSource::ExistingDisk { .. } => return None,
        BootSource::ContainerDisk { image, .. } => {
            let source = match ImageRef::parse(image) {
                ImageRef::Registry(image) => {
                    json!({ "type": "ContainerImage", "containerImage": { "image": image } })
                }
                ImageRef::VirtualImage(name) => {
                    json!({ "type": "ObjectRef", "objectRef": { "kind": "VirtualImage", "name": name } })
                }
                ImageRef::ClusterVirtualImage(name) => {
                    json!({ "type": "ObjectRef", "objectRef": { "kind": "ClusterVirtualImage", "name": name } })
                }
                // Refused by the plan's validation (a KubeVirt kind); as written otherwise.
                ImageRef::DataSource { .. } => {
                    json!({ "type": "ContainerImage", "containerImage": { "image": image } })
                }
            };
            (Some(source), size)
        }
        BootSource::Url { url, checksums } => {
            let mut http = json!({ "url": url });
            if !checksums.is_empty() {
                let sums: Map<String, Value> = checksums
                    .iter()
                    .map(|c| (c.algo.as_str().to_string(), json!(c.hex)))
                    .collect();
                http["checksum"] = Value::Object(sums);
            }
            (Some(json!({ "type": "HTTP", "http": http })), size)
        }
        BootSource::Blank { size } => (None, size.to_string()),
        BootSource::ClonePvc { .. } => {
            unreachable!("VmPlan::validate rejects --clone-pvc on Deckhouse")
        }
    };
    Some(virtual_disk(
        plan,
        &plan.boot_disk_name(),
        source,
        Some(size),
        plan.storage_class.as_deref(),
    ))
}

fn virtual_disk(
    plan: &VmPlan,
    name: &str,
    source: Option<Value>,
    size: Option<String>,
    class: Option<&str>,
) -> Value {
    let mut pvc = Map::new();
    if let Some(size) = size {
        pvc.insert("size".into(), json!(size));
    }
    if let Some(class) = class {
        pvc.insert("storageClassName".into(), json!(class));
    }
    let mut spec = json!({ "persistentVolumeClaim": pvc });
    if let Some(source) = source {
        spec["dataSource"] = source;
    }
    json!({
        "apiVersion": api_version(),
        "kind": "VirtualDisk",
        "metadata": metadata(plan, name),
        "spec": spec,
    })
}

fn virtual_machine(plan: &VmPlan, user_data: Option<&UserData>) -> Value {
    let boot_name = match &plan.boot {
        BootSource::ExistingDisk { name } => name.clone(),
        _ => plan.boot_disk_name(),
    };
    let mut devices = vec![json!({ "kind": "VirtualDisk", "name": boot_name, "bootOrder": 1 })];
    for data in &plan.data_disks {
        devices.push(json!({ "kind": "VirtualDisk", "name": plan.data_disk_name(data) }));
    }
    let mut cpu = json!({ "cores": plan.cores() });
    if let Some(fraction) = plan.core_fraction {
        cpu["coreFraction"] = json!(fraction.to_string());
    }
    let mut spec = json!({
        "virtualMachineClassName": plan.class_name(),
        "cpu": cpu,
        "memory": { "size": plan.memory_size().to_string() },
        "blockDeviceRefs": devices,
        "runPolicy": plan.run_strategy().deckhouse(),
        "osType": match plan.os { OsType::Linux => "Generic", OsType::Windows => "Windows" },
    });
    match plan.firmware {
        Some(Firmware::Efi) => spec["bootloader"] = json!("EFI"),
        Some(Firmware::Bios) => spec["bootloader"] = json!("BIOS"),
        None => {}
    }
    if let Some(data) = user_data {
        spec["provisioning"] = if data.needs_secret() {
            json!({ "type": "UserDataRef",
                    "userDataRef": { "kind": "Secret", "name": plan.cloudinit_secret_name() } })
        } else {
            json!({ "type": "UserData", "userData": data.text })
        };
    }
    let mut vm = json!({
        "apiVersion": api_version(),
        "kind": "VirtualMachine",
        "metadata": vm_metadata(plan),
        "spec": spec,
    });
    super::place(plan, &mut vm);
    vm
}

#[cfg(test)]
mod tests;
