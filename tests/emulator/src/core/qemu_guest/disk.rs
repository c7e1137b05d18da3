//! The size of a VM's qcow2 overlay: the size of the VM's boot disk as the platform knows it
//! (the PVC, the DataVolume or VirtualDisk asking for it), never smaller than the base image.

use serde_json::Value;

use super::{DH, KV};
use crate::core::app::App;
use crate::core::store::Key;
use crate::kubevirt::export::{parse_bytes, pvc_size};

/// The virtual size of an overlay over a base image of `base` bytes for a boot disk of `disk`
/// bytes (unknown: the base image's size). A disk smaller than the image could not hold it.
pub fn overlay_size(disk: Option<u64>, base: u64) -> u64 {
    disk.unwrap_or(base).max(base)
}

fn quantity(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::String(s) => parse_bytes(s),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// The claims behind KubeVirt VM `vm`'s disks in boot order (lowest `bootOrder`, else the order
/// of the disks): those backed by a PVC or DataVolume.
fn kubevirt_claims_in_boot_order(vm: &Value) -> Vec<String> {
    let Some(spec) = vm.pointer("/spec/template/spec") else {
        return vec![];
    };
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    let mut disks: Vec<(u64, usize, String)> = spec
        .pointer("/domain/devices/disks")
        .and_then(Value::as_array)
        .map(|d| {
            d.iter()
                .enumerate()
                .map(|(i, d)| {
                    (
                        d["bootOrder"].as_u64().unwrap_or(u64::MAX),
                        i,
                        d["name"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    disks.sort();
    disks
        .iter()
        .filter_map(|(_, _, disk)| {
            let vol = volumes.iter().find(|v| v["name"] == disk.as_str())?;
            // A hotplugged volume persisted into the VM is never the boot disk.
            let hot = |src: &str| vol[src]["hotpluggable"].as_bool().unwrap_or(false);
            if hot("persistentVolumeClaim") || hot("dataVolume") {
                return None;
            }
            vol.pointer("/persistentVolumeClaim/claimName")
                .or_else(|| vol.pointer("/dataVolume/name"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

/// The size of KubeVirt VM `vm`'s boot disk (the disk with the lowest `bootOrder`, else the
/// first, among those backed by a PVC or DataVolume): the PVC's capacity or request, else what
/// the DataVolume (template or object) asks for.
pub fn kubevirt_disk_size(app: &App, vm: &Value) -> Option<u64> {
    let ns = crate::core::util::meta_str(vm, "namespace");
    let templates = vm
        .pointer("/spec/dataVolumeTemplates")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for claim in kubevirt_claims_in_boot_order(vm) {
        let claim = claim.as_str();
        if let Some(size) = pvc_size(app, ns, claim) {
            return Some(size);
        }
        let dv = templates
            .iter()
            .find(|t| t.pointer("/metadata/name").and_then(Value::as_str) == Some(claim))
            .cloned()
            .or_else(|| {
                app.store
                    .get(&Key::new("cdi.kubevirt.io", "datavolumes", ns, claim))
            });
        if let Some(dv) = dv {
            let size = quantity(
                dv.pointer("/spec/storage/resources/requests/storage")
                    .or_else(|| dv.pointer("/spec/pvc/resources/requests/storage")),
            );
            if size.is_some() {
                return size;
            }
        }
    }
    None
}

/// Deckhouse VM `vm`'s boot VirtualDisk: its first by `bootOrder` (else in order).
fn deckhouse_boot_disk(app: &App, vm: &Value) -> Option<Value> {
    let ns = crate::core::util::meta_str(vm, "namespace");
    let mut refs: Vec<(u64, usize, String)> = vm
        .pointer("/spec/blockDeviceRefs")
        .and_then(Value::as_array)?
        .iter()
        .enumerate()
        .filter(|(_, r)| r["kind"] == "VirtualDisk")
        .map(|(i, r)| {
            (
                r["bootOrder"].as_u64().unwrap_or(u64::MAX),
                i,
                r["name"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    refs.sort();
    let (_, _, name) = refs.first()?;
    app.store.get(&Key::new(DH, "virtualdisks", ns, name))
}

/// The size of Deckhouse VM `vm`'s boot disk: its boot VirtualDisk's `status.capacity` or
/// `spec.persistentVolumeClaim.size`.
pub fn deckhouse_disk_size(app: &App, vm: &Value) -> Option<u64> {
    let vd = deckhouse_boot_disk(app, vm)?;
    quantity(
        vd.pointer("/status/capacity")
            .or_else(|| vd.pointer("/spec/persistentVolumeClaim/size")),
    )
}

/// The boot disk size of VM `ns/name` on whichever platform has it.
pub fn vm_disk_size(app: &App, ns: &str, name: &str) -> Option<u64> {
    if let Some(vm) = app.store.get(&Key::new(KV, "virtualmachines", ns, name)) {
        return kubevirt_disk_size(app, &vm);
    }
    let vm = app.store.get(&Key::new(DH, "virtualmachines", ns, name))?;
    deckhouse_disk_size(app, &vm)
}

/// The claim holding VM `ns/name`'s boot disk, as `(name, uid)`: KubeVirt's first PVC or
/// DataVolume disk in boot order, Deckhouse's boot VirtualDisk's
/// `status.target.persistentVolumeClaimName`; `None` until that PVC exists.
pub fn boot_claim(app: &App, ns: &str, name: &str) -> Option<(String, String)> {
    let claim = match app.store.get(&Key::new(KV, "virtualmachines", ns, name)) {
        Some(vm) => kubevirt_claims_in_boot_order(&vm).into_iter().next()?,
        None => {
            let vm = app.store.get(&Key::new(DH, "virtualmachines", ns, name))?;
            deckhouse_boot_disk(app, &vm)?
                .pointer("/status/target/persistentVolumeClaimName")
                .and_then(Value::as_str)?
                .to_owned()
        }
    };
    let pvc = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, &claim))?;
    let uid = crate::core::util::meta_str(&pvc, "uid");
    (!uid.is_empty()).then(|| (claim, uid.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::registry::Registry;
    use serde_json::json;
    use std::time::Duration;

    const GI: u64 = 1 << 30;

    #[test]
    fn overlay_is_the_disk_size_but_never_smaller_than_the_image() {
        assert_eq!(overlay_size(Some(10 * GI), 2 * GI), 10 * GI);
        assert_eq!(overlay_size(Some(GI), 2 * GI), 2 * GI);
        assert_eq!(overlay_size(None, 2 * GI), 2 * GI);
    }

    #[test]
    fn kubevirt_boot_disk_from_pvc_or_datavolume_template() {
        let app = App::new(
            Registry::new(crate::ServeFlavor::KubeVirt),
            Duration::from_secs(1),
        );
        app.store
            .create(
                "",
                "persistentvolumeclaims",
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data", "namespace": "default"},
                    "spec": {"resources": {"requests": {"storage": "3Gi"}}}}),
            )
            .unwrap();
        let vm = |disks: Value| {
            json!({"metadata": {"name": "web", "namespace": "default"},
                "spec": {"dataVolumeTemplates": [{"metadata": {"name": "root"},
                    "spec": {"storage": {"resources": {"requests": {"storage": "12Gi"}}}}}],
                "template": {"spec": {"domain": {"devices": {"disks": disks}},
                    "volumes": [
                        {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config"}},
                        {"name": "rootdisk", "dataVolume": {"name": "root"}},
                        {"name": "datadisk", "persistentVolumeClaim": {"claimName": "data"}}]}}}})
        };
        // The first PVC-backed disk: the DataVolume template (no PVC yet) asks for 12Gi.
        let first = vm(json!([{"name": "cloudinit"}, {"name": "rootdisk"}, {"name": "datadisk"}]));
        assert_eq!(kubevirt_disk_size(&app, &first), Some(12 * GI));
        // bootOrder picks the disk.
        let ordered = vm(json!([{"name": "rootdisk", "bootOrder": 2},
            {"name": "datadisk", "bootOrder": 1}]));
        assert_eq!(kubevirt_disk_size(&app, &ordered), Some(3 * GI));
        // No PVC-backed disk: unknown.
        assert_eq!(
            kubevirt_disk_size(&app, &vm(json!([{"name": "cloudinit"}]))),
            None
        );
    }

    #[test]
    fn deckhouse_boot_disk_from_virtual_disk() {
        let app = App::new(
            Registry::new(crate::ServeFlavor::Deckhouse),
            Duration::from_secs(1),
        );
        app.store
            .create(
                DH,
                "virtualdisks",
                json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
                    "metadata": {"name": "root", "namespace": "default"},
                    "spec": {"persistentVolumeClaim": {"size": "15Gi"}}}),
            )
            .unwrap();
        let vm = json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"blockDeviceRefs": [
                {"kind": "ClusterVirtualImage", "name": "iso", "bootOrder": 1},
                {"kind": "VirtualDisk", "name": "root", "bootOrder": 2}]}});
        assert_eq!(deckhouse_disk_size(&app, &vm), Some(15 * GI));
    }

    fn pvc(app: &App, name: &str) -> String {
        let p = app
            .store
            .create(
                "",
                "persistentvolumeclaims",
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"resources": {"requests": {"storage": "3Gi"}}}}),
            )
            .unwrap();
        crate::core::util::meta_str(&p, "uid").to_owned()
    }

    #[test]
    fn boot_claim_is_the_first_claim_in_boot_order_never_a_hotplugged_one() {
        let app = App::new(
            Registry::new(crate::ServeFlavor::KubeVirt),
            Duration::from_secs(1),
        );
        let hot = pvc(&app, "hot");
        let root = pvc(&app, "restore-1-rootdisk");
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"template": {"spec": {
                "domain": {"devices": {"disks": [
                    {"name": "hot"}, {"name": "cloudinit"}, {"name": "rootdisk", "bootOrder": 1}]}},
                "volumes": [
                    {"name": "hot", "persistentVolumeClaim": {"claimName": "hot", "hotpluggable": true}},
                    {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config"}},
                    {"name": "rootdisk", "dataVolume": {"name": "restore-1-rootdisk"}}]}}}});
        app.store.create(KV, "virtualmachines", vm).unwrap();
        assert_eq!(
            boot_claim(&app, "default", "web"),
            Some(("restore-1-rootdisk".to_owned(), root))
        );
        // Only the hotplugged claim: no boot claim (the VM boots from a disk of its own).
        app.store
            .modify(&Key::new(KV, "virtualmachines", "default", "web"), |o| {
                o["spec"]["template"]["spec"]["volumes"][2] =
                    json!({"name": "rootdisk", "containerDisk": {"image": "debian"}});
            });
        assert_eq!(boot_claim(&app, "default", "web"), None);
        assert_ne!(hot, "");
        assert_eq!(boot_claim(&app, "default", "nothing"), None);
    }

    #[test]
    fn deckhouse_boot_claim_is_the_boot_disk_target_once_it_exists() {
        let app = App::new(
            Registry::new(crate::ServeFlavor::Deckhouse),
            Duration::from_secs(1),
        );
        app.store
            .create(
                DH,
                "virtualdisks",
                json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
                    "metadata": {"name": "root", "namespace": "default"},
                    "spec": {"persistentVolumeClaim": {"size": "15Gi"}},
                    "status": {"target": {"persistentVolumeClaimName": "vd-root-abc"}}}),
            )
            .unwrap();
        app.store
            .create(
                DH,
                "virtualmachines",
                json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
                    "metadata": {"name": "web", "namespace": "default"},
                    "spec": {"blockDeviceRefs": [{"kind": "VirtualDisk", "name": "root"}]}}),
            )
            .unwrap();
        // The PVC is not there yet.
        assert_eq!(boot_claim(&app, "default", "web"), None);
        let uid = pvc(&app, "vd-root-abc");
        assert_eq!(
            boot_claim(&app, "default", "web"),
            Some(("vd-root-abc".to_owned(), uid))
        );
    }
}
