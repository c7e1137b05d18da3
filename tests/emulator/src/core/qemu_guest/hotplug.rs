//! Hotplugged disks in real guests: what the platform reports attached is attached to the
//! running qemu over QMP, and what it no longer lists is unplugged, so the guest sees the disk
//! come and go without a reboot.
//!
//! - KubeVirt: virt-handler hotplugs a volume into the domain once its attachment pod has
//!   mounted it, and the VMI's `status.volumeStatus[].phase` turns `Ready` only then
//!   (`pkg/virt-handler/vm.go`, `hotplugVolumeMounted`/`Ready`); the disk keeps the bus and
//!   `serial` of the VMI's disk. Here a disk is plugged when its volume status is `Ready`.
//! - Deckhouse: a VMBDA in phase `Attached` is a KubeVirt hotplug underneath; the disk is on
//!   the SCSI bus and its serial is the md5 (hex) of the block device's uid
//!   (`pkg/controller/service/attachment_service.go` with
//!   `kvbuilder.GenerateSerialFromObject`).
//! - The bus: a `scsi` disk becomes a `scsi-hd` (`scsi-cd` for a cdrom) on the virtio-scsi
//!   controller every guest boots with (`scsi0`, as virt-launcher's domain always has one for
//!   hotplug), a `virtio` disk a `virtio-blk-pci` (ACPI PCI hotplug of the i440fx machine).
//! - Data: a claim that received an upload is plugged from the upload's file (the PVC's
//!   data); any other claim gets a sparse raw file of its capacity, kept for as long as the
//!   claim (by uid) and this emulator live, so a disk detached and attached again keeps what
//!   the guest wrote.
//!
//! Unplugging a PCI disk needs the guest to acknowledge the ACPI eject; a block node whose
//! device is gone is deleted on a later pass (`blockdev-del` fails while the device holds it).

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use md5::{Digest, Md5};
use serde_json::{Value, json};

use super::process::qmp;
use super::{DH, KV};
use crate::core::app::App;
use crate::core::store::Key;
use crate::core::util::meta_str;
use crate::kubevirt::export::pvc_size;

/// Prefix of the qemu ids of hotplugged devices (`hp…`) and their block nodes (`hn…`).
const DEVICE_PREFIX: &str = "hp";
const NODE_PREFIX: &str = "hn";

/// The bus a hotplugged disk is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Bus {
    Scsi,
    Virtio,
}

/// A disk the platform says is attached to a running VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HotDisk {
    /// The VMI's disk (volume) name.
    pub volume: String,
    /// The serial the guest reads.
    pub serial: Option<String>,
    pub bus: Bus,
    pub read_only: bool,
    pub cdrom: bool,
    /// Namespace and name of the claim holding the data.
    pub claim: (String, String),
}

impl HotDisk {
    /// The qemu device id: short (block node names are at most 31 bytes) and derived from the
    /// volume name, so a pass finds what an earlier one plugged.
    fn id(&self) -> String {
        let digest = Md5::digest(self.volume.as_bytes());
        let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
        format!("{DEVICE_PREFIX}{hex}")
    }
}

fn node_of(device_id: &str) -> String {
    format!("{NODE_PREFIX}{}", &device_id[DEVICE_PREFIX.len()..])
}

/// Deckhouse's disk serial: the hex md5 of the object's uid.
pub fn deckhouse_serial(uid: &str) -> String {
    Md5::digest(uid.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The hotplugged disks of VM `ns/name` that the platform reports attached.
pub(super) fn attached(app: &App, ns: &str, name: &str) -> Vec<HotDisk> {
    if let Some(vmi) = app
        .store
        .get(&Key::new(KV, "virtualmachineinstances", ns, name))
    {
        return kubevirt(&vmi);
    }
    if app
        .store
        .get(&Key::new(DH, "virtualmachines", ns, name))
        .is_some()
    {
        return deckhouse(app, ns, name);
    }
    vec![]
}

fn kubevirt(vmi: &Value) -> Vec<HotDisk> {
    let ns = meta_str(vmi, "namespace");
    let list = |p: &str| {
        vmi.pointer(p)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (statuses, volumes, disks) = (
        list("/status/volumeStatus"),
        list("/spec/volumes"),
        list("/spec/domain/devices/disks"),
    );
    let mut out = vec![];
    for st in statuses {
        if st.get("hotplugVolume").is_none() || st["phase"] != "Ready" {
            continue;
        }
        let Some(volume) = st["name"].as_str() else {
            continue;
        };
        let Some(vol) = volumes.iter().find(|v| v["name"] == volume) else {
            continue;
        };
        let Some(claim) = vol
            .pointer("/persistentVolumeClaim/claimName")
            .or_else(|| vol.pointer("/dataVolume/name"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let disk = disks
            .iter()
            .find(|d| d["name"] == volume)
            .cloned()
            .unwrap_or(Value::Null);
        let cdrom = disk.get("cdrom").is_some();
        let bus = ["/disk/bus", "/cdrom/bus", "/lun/bus"]
            .iter()
            .find_map(|p| disk.pointer(p).and_then(Value::as_str))
            .unwrap_or("scsi");
        out.push(HotDisk {
            volume: volume.to_owned(),
            serial: disk["serial"].as_str().map(str::to_owned),
            bus: if bus == "virtio" {
                Bus::Virtio
            } else {
                Bus::Scsi
            },
            read_only: cdrom
                || disk.pointer("/disk/readonly") == Some(&json!(true))
                || vol.pointer("/persistentVolumeClaim/readOnly") == Some(&json!(true)),
            cdrom,
            claim: (ns.to_owned(), claim.to_owned()),
        });
    }
    out
}

fn deckhouse(app: &App, ns: &str, name: &str) -> Vec<HotDisk> {
    let mut out = vec![];
    for bda in crate::core::controllers::deckhouse::attachments_of(app, ns, name) {
        if bda.pointer("/status/phase").and_then(Value::as_str) != Some("Attached") {
            continue;
        }
        let kind = bda
            .pointer("/spec/blockDeviceRef/kind")
            .and_then(Value::as_str)
            .unwrap_or("");
        let dev = bda
            .pointer("/spec/blockDeviceRef/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let (key, read_only) = match kind {
            "VirtualDisk" => (Key::new(DH, "virtualdisks", ns, dev), false),
            "VirtualImage" => (Key::new(DH, "virtualimages", ns, dev), true),
            "ClusterVirtualImage" => (Key::new(DH, "clustervirtualimages", "", dev), true),
            _ => continue,
        };
        let Some(obj) = app.store.get(&key) else {
            continue;
        };
        let Some(claim) = obj
            .pointer("/status/target/persistentVolumeClaimName")
            .and_then(Value::as_str)
        else {
            continue;
        };
        let claim_ns = if kind == "ClusterVirtualImage" {
            obj.pointer("/spec/dataSource/objectRef/namespace")
                .and_then(Value::as_str)
                .unwrap_or(ns)
        } else {
            ns
        };
        out.push(HotDisk {
            volume: format!("{}-{dev}", kind.to_lowercase()),
            serial: Some(deckhouse_serial(meta_str(&obj, "uid"))),
            bus: Bus::Scsi,
            read_only,
            cdrom: false,
            claim: (claim_ns.to_owned(), claim.to_owned()),
        });
    }
    out
}

/// The file holding claim `ns/pvc`'s data for a guest: the upload's data, else a sparse raw
/// file of the claim's size in `dir` (made on first use).
fn backing_file(app: &App, dir: &Path, ns: &str, pvc: &str) -> io::Result<PathBuf> {
    if let Some(p) = crate::kubevirt::upload::uploaded_file(app, ns, pvc) {
        return Ok(p);
    }
    let obj = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, pvc))
        .ok_or_else(|| io::Error::other(format!("claim {ns}/{pvc} not found")))?;
    let size = pvc_size(app, ns, pvc)
        .ok_or_else(|| io::Error::other(format!("claim {ns}/{pvc} has no size")))?;
    let path = dir.join(format!("claim-{}.raw", meta_str(&obj, "uid")));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)?;
    if file.metadata()?.len() < size {
        file.set_len(size)?;
    }
    Ok(path)
}

/// The ids of the devices plugged by an earlier pass, and the block nodes left behind.
fn plugged(qmp_path: &Path) -> io::Result<(BTreeSet<String>, BTreeSet<String>)> {
    let devices = qmp(
        qmp_path,
        &json!({"execute": "qom-list", "arguments": {"path": "/machine/peripheral"}}),
    )?;
    let devices = devices["return"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str())
        .filter(|n| n.starts_with(DEVICE_PREFIX))
        .map(str::to_owned)
        .collect();
    let nodes = qmp(qmp_path, &json!({"execute": "query-named-block-nodes"}))?;
    let nodes = nodes["return"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["node-name"].as_str())
        .filter(|n| n.starts_with(NODE_PREFIX))
        .map(str::to_owned)
        .collect();
    Ok((devices, nodes))
}

/// Makes the qemu behind `qmp_path` hold exactly `want` (hotplugged disks; the boot disks are
/// not touched): `Ok(true)` when it does, `Ok(false)` when an unplug still waits for the guest.
/// Errors of one disk do not stop the others; the first is returned.
pub(super) fn sync(app: &App, qmp_path: &Path, dir: &Path, want: &[HotDisk]) -> io::Result<bool> {
    let (devices, nodes) = plugged(qmp_path)?;
    let mut settled = true;
    let wanted: BTreeSet<String> = want.iter().map(HotDisk::id).collect();
    let mut first_error = None;
    let mut note = |r: io::Result<Value>| {
        if let Err(e) = r
            && first_error.is_none()
        {
            first_error = Some(e);
        }
    };
    for id in devices.difference(&wanted) {
        settled = false;
        note(qmp(
            qmp_path,
            &json!({"execute": "device_del", "arguments": {"id": id}}),
        ));
    }
    // Nodes whose device is gone (unplugged now or earlier, once the guest let go).
    for node in &nodes {
        let device = format!("{DEVICE_PREFIX}{}", &node[NODE_PREFIX.len()..]);
        if !devices.contains(&device) && !wanted.contains(&device) {
            settled = false;
            let _ = qmp(
                qmp_path,
                &json!({"execute": "blockdev-del", "arguments": {"node-name": node}}),
            );
        }
    }
    for disk in want {
        let id = disk.id();
        if devices.contains(&id) {
            continue;
        }
        let node = node_of(&id);
        if !nodes.contains(&node) {
            let file = match backing_file(app, dir, &disk.claim.0, &disk.claim.1) {
                Ok(f) => f,
                Err(e) => {
                    note(Err(e));
                    continue;
                }
            };
            let r = qmp(
                qmp_path,
                &json!({"execute": "blockdev-add", "arguments": {
                    "driver": "raw", "node-name": node, "read-only": disk.read_only,
                    "file": {"driver": "file", "filename": file.display().to_string()},
                }}),
            );
            if r.is_err() {
                note(r);
                continue;
            }
        }
        let mut args = match disk.bus {
            Bus::Scsi => json!({
                "driver": if disk.cdrom { "scsi-cd" } else { "scsi-hd" },
                "bus": "scsi0.0",
            }),
            Bus::Virtio => json!({"driver": "virtio-blk-pci"}),
        };
        args["id"] = json!(id);
        args["drive"] = json!(node);
        if let Some(serial) = &disk.serial {
            args["serial"] = json!(serial);
        }
        note(qmp(
            qmp_path,
            &json!({"execute": "device_add", "arguments": args}),
        ));
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(settled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deckhouse_serial_is_the_md5_of_the_uid() {
        // `printf %s 5f1c2d1e-7a37-4c57-9d6c-1b1f1b0a4d2e | md5sum`
        assert_eq!(
            deckhouse_serial("5f1c2d1e-7a37-4c57-9d6c-1b1f1b0a4d2e"),
            "5aafc6b5db4deb7083696ae97f6e56c3"
        );
    }

    #[test]
    fn device_ids_fit_qemu_node_names() {
        let disk = HotDisk {
            volume: "a".repeat(63),
            serial: None,
            bus: Bus::Scsi,
            read_only: false,
            cdrom: false,
            claim: ("ns".into(), "c".into()),
        };
        let id = disk.id();
        // `printf %s data | md5sum`: 8d777f385d3d...
        let data = HotDisk {
            volume: "data".into(),
            ..disk.clone()
        };
        assert_eq!(data.id(), "hp8d777f385d3d");
        assert_eq!(node_of(&data.id()), "hn8d777f385d3d");
        assert!(id.len() < 32 && node_of(&id).len() < 32);
    }
}
