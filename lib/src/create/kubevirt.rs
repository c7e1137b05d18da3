//! KubeVirt objects for a plan: a `kubevirt.io/v1` VirtualMachine whose disks are imported by
//! CDI `dataVolumeTemplates`, and a Secret when the user data cannot be inline.

use serde_json::{Map, Value, json};

use super::cloudinit::UserData;
use super::plan::{BootSource, DeliveryMethod, Firmware, ImageRef, OsType, VmPlan};
use super::{PlannedObject, labels, user_data_secret, vm_metadata};
use crate::validate::{ChecksumAlgo, DataDisk, DiskBus};

/// Name of the boot disk and its volume in the VM.
const BOOT_VOLUME: &str = "rootdisk";
/// Name of the cloud-init disk and its volume.
const CLOUDINIT_VOLUME: &str = "cloudinitdisk";
/// Name of the pod network interface.
const NETWORK: &str = "default";
/// Secret key KubeVirt reads user data from.
pub const SECRET_KEY: &str = "userdata";
/// Secret key KubeVirt reads network data from, in the Secret the cloud-init volume's
/// `networkDataSecretRef` names (virt-launcher reads `networkdata`, else `networkData`:
/// pkg/cloud-init/cloud-init.go `resolveNoCloudSecrets`).
pub const NETWORK_DATA_KEY: &str = "networkdata";

/// Whether the boot disk is imported with a checksum. KubeVirt's VirtualMachine schema
/// embeds an older DataVolume spec without `checksum`, so such a disk is a standalone
/// DataVolume created before the VM (and found by `kubectl vm delete` through its labels).
fn standalone_boot_volume(plan: &VmPlan) -> bool {
    matches!(&plan.boot, BootSource::Url { checksums, .. } if !checksums.is_empty())
}

/// The objects to create, in order: a standalone boot DataVolume if a checksum is given, the
/// VirtualMachine, then the user-data Secret if needed (always with network data, which it
/// carries too).
pub(super) fn objects(plan: &VmPlan, user_data: Option<&UserData>) -> Vec<PlannedObject> {
    let network = super::networks::network_data(plan, NETWORK);
    let mut objects = Vec::new();
    if standalone_boot_volume(plan)
        && let Some(Value::Object(mut dv)) = boot_template(plan)
    {
        dv.insert("apiVersion".into(), json!("cdi.kubevirt.io/v1beta1"));
        dv.insert("kind".into(), json!("DataVolume"));
        dv["metadata"]["namespace"] = json!(plan.namespace);
        objects.push(PlannedObject::new(Value::Object(dv)));
    }
    let mut vm = virtual_machine_with(plan, user_data, network.is_some());
    if let Some(network) = &network {
        super::networks::set_macs(&mut vm, &network.macs);
    }
    objects.push(PlannedObject::new(vm));
    if let Some(network) = &network {
        let empty = UserData {
            text: String::new(),
            contains_secrets: false,
        };
        let mut secret = user_data_secret(plan, "Opaque", SECRET_KEY, user_data.unwrap_or(&empty));
        let mut data = serde_json::Map::new();
        if let Some(user_data) = user_data {
            data.insert(SECRET_KEY.into(), json!(user_data.text));
        }
        data.insert(NETWORK_DATA_KEY.into(), json!(network.text));
        secret.object["stringData"] = Value::Object(data);
        objects.push(secret);
    } else if let Some(data) = user_data.filter(|d| d.needs_secret()) {
        objects.push(user_data_secret(plan, "Opaque", SECRET_KEY, data));
    }
    objects
}

/// The VirtualMachine: its storage, its domain (the machine), the pod-level settings of its
/// template, and the VM-level ones (run strategy, disk templates, instancetype and
/// preference), then its placement and networks.
pub(super) fn virtual_machine(plan: &VmPlan, user_data: Option<&UserData>) -> Value {
    virtual_machine_with(plan, user_data, false)
}

/// [`virtual_machine`], its cloud-init volume also naming network data in the Secret when
/// `network_data`.
fn virtual_machine_with(plan: &VmPlan, user_data: Option<&UserData>, network_data: bool) -> Value {
    let Storage {
        disks,
        volumes,
        templates,
    } = storage(plan, user_data, network_data);
    let mut pod_spec = json!({
        "domain": domain(plan, disks),
        "networks": [{ "name": NETWORK, "pod": {} }],
        "volumes": volumes,
    });
    if let Some(hostname) = &plan.hostname {
        pod_spec["hostname"] = json!(hostname);
    }
    if let Some(subdomain) = &plan.extras.subdomain {
        pod_spec["subdomain"] = json!(subdomain);
    }
    let credentials = access_credentials(plan);
    if !credentials.is_empty() {
        pod_spec["accessCredentials"] = Value::Array(credentials);
    }
    let mut spec = json!({
        "runStrategy": plan.run_strategy().kubevirt(),
        "template": {
            "metadata": { "labels": labels(plan) },
            "spec": pod_spec,
        },
    });
    if !templates.is_empty() {
        spec["dataVolumeTemplates"] = Value::Array(templates);
    }
    if let Some(it) = &plan.instancetype {
        spec["instancetype"] = json!({ "kind": it.kind, "name": it.name });
    }
    if let Some(pref) = &plan.preference {
        spec["preference"] = json!({ "kind": pref.kind, "name": pref.name });
    }
    if plan.infer_from_image {
        // virt-api's mutator replaces these with what the labels of the boot volume's
        // DataSource name (kubevirt pkg/instancetype/infer): the instancetype must be found;
        // a DataSource without a preference label leaves the VM without one.
        spec["instancetype"] = json!({ "inferFromVolume": BOOT_VOLUME });
        if plan.preference.is_none() {
            spec["preference"] = json!({
                "inferFromVolume": BOOT_VOLUME,
                "inferFromVolumeFailurePolicy": "Ignore",
            });
        }
    }
    let mut vm = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": vm_metadata(plan),
        "spec": spec,
    });
    super::place(plan, &mut vm);
    super::networks::apply(plan, &mut vm);
    vm
}

/// A VM's storage in KubeVirt's three lists: the domain's disks, the template's volumes
/// behind them, and the DataVolume templates the VM creates with it.
struct Storage {
    disks: Vec<Value>,
    volumes: Vec<Value>,
    templates: Vec<Value>,
}

/// The boot disk, the data disks (blank DataVolumes) and the cloud-init disk, in that order
/// (the boot disk first, with boot order 1).
fn storage(plan: &VmPlan, user_data: Option<&UserData>, network_data: bool) -> Storage {
    let mut disks = Vec::new();
    let mut volumes = Vec::new();
    let mut templates = Vec::new();

    disks.push(disk(BOOT_VOLUME, plan.boot_disk_bus(), Some(1), None));
    volumes.push(boot_volume(plan));
    if let Some(template) = boot_template(plan).filter(|_| !standalone_boot_volume(plan)) {
        templates.push(template);
    }
    for data in &plan.data_disks {
        let name = plan.data_disk_name(data);
        disks.push(disk(
            &data.name,
            data.bus.unwrap_or_default(),
            None,
            Some(&data.name),
        ));
        volumes.push(json!({ "name": data.name, "dataVolume": { "name": name } }));
        templates.push(data_volume(
            plan,
            &name,
            json!({ "blank": {} }),
            Some(data.size.to_string()),
            data_disk_class(plan, data),
        ));
    }
    if user_data.is_some() || network_data {
        disks.push(disk(CLOUDINIT_VOLUME, DiskBus::Virtio, None, None));
        let secret = json!({ "name": plan.cloudinit_secret_name() });
        let mut source = match user_data {
            Some(data) if data.needs_secret() || network_data => json!({ "secretRef": secret }),
            Some(data) => json!({ "userData": data.text }),
            None => json!({}),
        };
        if network_data {
            // KubeVirt mounts the Secret `networkDataSecretRef` names and reads its
            // `networkdata` key (virt-controller services/rendervolumes.go
            // `handleCloudInitNoCloud`, virt-launcher pkg/cloud-init/cloud-init.go).
            source["networkDataSecretRef"] = secret;
        }
        volumes.push(json!({ "name": CLOUDINIT_VOLUME, "cloudInitNoCloud": source }));
    }
    Storage {
        disks,
        volumes,
        templates,
    }
}

/// `template.spec.domain`: the devices (`disks`, one masqueraded interface, an RNG), CPU and
/// memory unless an instancetype sizes the VM, firmware, clock, and what Windows and Secure
/// Boot need.
fn domain(plan: &VmPlan, disks: Vec<Value>) -> Value {
    let mut interface = json!({ "name": NETWORK, "masquerade": {} });
    if plan.os == OsType::Windows {
        // Stock Windows has no virtio-net driver.
        interface["model"] = json!("e1000e");
    }
    let mut domain = json!({
        "devices": { "disks": disks, "interfaces": [interface], "rng": {} },
    });
    if plan.instancetype.is_none() && !plan.infer_from_image {
        domain["cpu"] = match plan.topology() {
            Some(t) => json!({ "sockets": t.sockets, "cores": t.cores, "threads": t.threads }),
            None => json!({ "cores": plan.cores() }),
        };
        domain["memory"] = json!({ "guest": plan.memory_size().to_string() });
    }
    if let Some(firmware) = firmware(plan) {
        domain["firmware"] = firmware;
    }
    if let Some(clock) = clock(plan) {
        domain["clock"] = clock;
    }
    if plan.os == OsType::Windows {
        domain["features"] = json!({
            "acpi": {}, "apic": {},
            "hyperv": { "relaxed": {}, "vapic": {}, "spinlocks": { "spinlocks": 8191 } },
        });
    }
    if plan.extras.console_log {
        // The `guest-console-log` sidecar whatever the cluster default (kubevirt
        // `pkg/virt-controller/services/serialconsolelog.go` `isSerialConsoleLogEnabled`).
        domain["devices"]["logSerialConsole"] = json!(true);
    }
    if plan.extras.secure_boot {
        // KubeVirt's webhook: "SMM must be enabled when EFI SecureBoot is enabled"
        // (pkg/virt-api/webhooks/validating-webhook/admitters/vmi-create-admitter.go).
        domain["features"]["smm"] = json!({ "enabled": true });
    }
    domain
}

/// `--access-credential SECRET:USER…:qemuGuestAgent`: keys the guest agent keeps in the users'
/// authorized_keys (KubeVirt `accessCredentials`).
fn access_credentials(plan: &VmPlan) -> Vec<Value> {
    plan.extras
        .access_credentials
        .iter()
        .filter(|c| c.method == DeliveryMethod::QemuGuestAgent)
        .map(|c| {
            json!({ "sshPublicKey": {
                "source": { "secret": { "secretName": c.secret } },
                "propagationMethod": { "qemuGuestAgent": { "users": c.users } },
            } })
        })
        .collect()
}

/// `domain.firmware`: the bootloader (`--firmware`, `--secure-boot`, `--persistent-efi`) and
/// the SMBIOS system UUID and serial.
fn firmware(plan: &VmPlan) -> Option<Value> {
    let x = &plan.extras;
    let mut firmware = Map::new();
    let efi = x.secure_boot || x.persistent_efi || plan.firmware == Some(Firmware::Efi);
    if efi {
        let mut efi = json!({ "secureBoot": x.secure_boot });
        if x.persistent_efi {
            efi["persistent"] = json!(true);
        }
        firmware.insert("bootloader".into(), json!({ "efi": efi }));
    } else if plan.firmware == Some(Firmware::Bios) {
        firmware.insert("bootloader".into(), json!({ "bios": {} }));
    }
    if let Some(uuid) = &x.uuid {
        firmware.insert("uuid".into(), json!(uuid.to_ascii_lowercase()));
    }
    if let Some(serial) = &x.serial {
        firmware.insert("serial".into(), json!(serial));
    }
    (!firmware.is_empty()).then_some(Value::Object(firmware))
}

/// A disk device; data disks carry their name as serial so the guest finds them under
/// `/dev/disk/by-id/*NAME`.
fn disk(name: &str, bus: DiskBus, boot_order: Option<u32>, serial: Option<&str>) -> Value {
    let mut disk = json!({ "name": name, "disk": { "bus": bus.as_str() } });
    if let Some(order) = boot_order {
        disk["bootOrder"] = json!(order);
    }
    if let Some(serial) = serial {
        disk["serial"] = json!(serial);
    }
    disk
}

fn boot_volume(plan: &VmPlan) -> Value {
    match &plan.boot {
        BootSource::ContainerDisk {
            image,
            ephemeral: true,
        } => {
            json!({ "name": BOOT_VOLUME, "containerDisk": { "image": image } })
        }
        BootSource::ExistingDisk { name } => {
            json!({ "name": BOOT_VOLUME, "persistentVolumeClaim": { "claimName": name } })
        }
        _ => json!({ "name": BOOT_VOLUME, "dataVolume": { "name": plan.boot_disk_name() } }),
    }
}

/// The DataVolume template that fills the boot disk, if one is created.
fn boot_template(plan: &VmPlan) -> Option<Value> {
    let size = || {
        Some(
            plan.disk_size
                .unwrap_or(super::plan::DEFAULT_DISK_SIZE)
                .to_string(),
        )
    };
    let (source, size) = match &plan.boot {
        BootSource::ContainerDisk {
            ephemeral: true, ..
        }
        | BootSource::ExistingDisk { .. } => {
            return None;
        }
        BootSource::ContainerDisk { image, .. } => {
            if let ImageRef::DataSource { namespace, name } = ImageRef::parse(image) {
                // CDI clones what the DataSource names (`spec.sourceRef`), as large as its
                // source unless --disk-size says otherwise.
                let mut dv = data_volume(
                    plan,
                    &plan.boot_disk_name(),
                    Value::Null,
                    plan.disk_size.map(|s| s.to_string()),
                    plan.storage_class.as_deref(),
                );
                let spec = dv["spec"].as_object_mut().expect("spec");
                spec.remove("source");
                spec.insert(
                    "sourceRef".into(),
                    json!({"kind": "DataSource", "name": name,
                           "namespace": namespace.unwrap_or(&plan.namespace)}),
                );
                return Some(dv);
            }
            (
                json!({ "registry": { "url": format!("docker://{image}") } }),
                size(),
            )
        }
        BootSource::Url { url, checksums } => {
            let mut http = json!({ "url": url });
            // CDI takes one checksum: the strongest it supports.
            let best = ChecksumAlgo::ALL.iter().find_map(|algo| {
                checksums
                    .iter()
                    .find(|c| c.algo == *algo && algo.supported_by_cdi())
            });
            if let Some(checksum) = best {
                http["checksum"] = json!(checksum.to_string());
            }
            (json!({ "http": http }), size())
        }
        BootSource::ClonePvc { name } => {
            let (namespace, pvc) = name.split_once('/').unwrap_or((&plan.namespace, name));
            // Without a size CDI makes the clone as large as its source.
            (
                json!({ "pvc": { "namespace": namespace, "name": pvc } }),
                plan.disk_size.map(|s| s.to_string()),
            )
        }
        BootSource::Blank { size } => (json!({ "blank": {} }), Some(size.to_string())),
    };
    Some(data_volume(
        plan,
        &plan.boot_disk_name(),
        source,
        size,
        plan.storage_class.as_deref(),
    ))
}

fn data_disk_class<'a>(plan: &'a VmPlan, disk: &'a DataDisk) -> Option<&'a str> {
    disk.storage_class
        .as_deref()
        .or(plan.storage_class.as_deref())
}

fn data_volume(
    plan: &VmPlan,
    name: &str,
    source: Value,
    size: Option<String>,
    class: Option<&str>,
) -> Value {
    let mut storage = Map::new();
    if let Some(size) = size {
        storage.insert(
            "resources".into(),
            json!({ "requests": { "storage": size } }),
        );
    }
    if let Some(class) = class {
        storage.insert("storageClassName".into(), json!(class));
    }
    json!({
        "metadata": { "name": name, "labels": labels(plan) },
        "spec": { "source": source, "storage": storage },
    })
}

/// Linux keeps the hardware clock in UTC and gets its zone from cloud-init; Windows expects
/// the hardware clock in local time, so `--timezone` sets the clock there.
fn clock(plan: &VmPlan) -> Option<Value> {
    match (plan.os, &plan.timezone) {
        (OsType::Windows, tz) => Some(json!({
            "timezone": tz.as_deref().unwrap_or("UTC"),
            "timer": { "hpet": { "present": false }, "pit": { "tickPolicy": "delay" },
                       "rtc": { "tickPolicy": "catchup" }, "hyperv": {} },
        })),
        (OsType::Linux, Some(_)) => Some(json!({ "utc": {} })),
        (OsType::Linux, None) => None,
    }
}

#[cfg(test)]
mod tests;
