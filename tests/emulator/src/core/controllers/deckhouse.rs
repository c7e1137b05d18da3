//! Deckhouse virtualization: VirtualDisk, VirtualImage / ClusterVirtualImage,
//! VirtualMachineClass and VirtualMachine.

use super::importer;
use super::{STEP_PERCENT, ensure_pvc, key_of, percent, set_condition, uid_bytes};
use crate::core::app::App;
use crate::core::store::Key;
use crate::core::util::{meta_str, now_rfc3339};
use serde_json::{Value, json};

const DH: &str = "virtualization.deckhouse.io";

/// VirtualDisk: Pending → Provisioning (progress "NN%") → Ready with a PVC
/// `vd-<name>-<uid8>`; a disk without dataSource is Ready at the first tick.
pub(super) fn virtual_disk(app: &App, vd: &Value, tick: bool) {
    if crate::deckhouse::upload::is_upload(vd) {
        return crate::deckhouse::upload::reconcile(app, vd, "virtualdisks", tick);
    }
    let phase = vd
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if matches!(phase, "Ready" | "Resizing") {
        // Growing a disk (expansion.rs).
        crate::core::expansion::virtual_disk(app, vd);
        return;
    }
    let has_source = vd.pointer("/spec/dataSource").is_some_and(|s| !s.is_null());
    // From a VirtualDiskSnapshot: Pending until it is Ready; its size and class when the disk
    // asks for none (deckhouse/snapshot.rs `from_snapshot`).
    let snapshot = crate::deckhouse::snapshot::from_snapshot(app, vd);
    // (Once its claim exists the snapshot is not needed any more.)
    if let Some(Err(message)) = &snapshot
        && matches!(phase, "" | "Pending")
    {
        let said = vd
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["message"] == message.as_str());
        if phase != "Pending" || !said {
            app.store.modify(&key_of(DH, "virtualdisks", vd), |o| {
                let mut st = o.get("status").cloned().unwrap_or(json!({}));
                st["phase"] = json!("Pending");
                st["progress"] = json!("");
                set_condition(&mut st, "Ready", false, "ProvisioningNotStarted", message);
                st["observedGeneration"] = o["metadata"]["generation"].clone();
                o["status"] = st;
            });
        }
        return;
    }
    let from_snapshot = snapshot.and_then(Result::ok);
    let class_name = vd
        .pointer("/spec/persistentVolumeClaim/storageClassName")
        .and_then(Value::as_str)
        .or(from_snapshot.as_ref().and_then(|(_, c)| c.as_deref()));
    let waiting = matches!(phase, "" | "Pending" | "WaitForFirstConsumer")
        && crate::core::storage::waits_for_first_consumer(app, class_name)
        && !crate::core::storage::deckhouse_consumer(app, vd);
    if waiting
        || (phase == "Provisioning" && tick && crate::core::storage::import_error(vd).is_some())
    {
        let failure = crate::core::storage::import_error(vd).filter(|_| !waiting);
        if phase == "WaitForFirstConsumer" && failure.is_none() {
            return;
        }
        if let Some(message) = &failure {
            importer::ensure(app, "vd", vd, Some(message));
        }
        app.store.modify(&key_of(DH, "virtualdisks", vd), |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            match &failure {
                Some(message) => {
                    st["phase"] = json!("Failed");
                    set_condition(&mut st, "Ready", false, "ProvisioningFailed", message);
                }
                None => {
                    st["phase"] = json!("WaitForFirstConsumer");
                    st["progress"] = json!("0%");
                    set_condition(&mut st, "Ready", false, "WaitingForFirstConsumer", "");
                }
            }
            st["observedGeneration"] = o["metadata"]["generation"].clone();
            o["status"] = st;
        });
        return;
    }
    let (next, progress) = match phase {
        "" | "WaitForFirstConsumer" => ("Pending", "0%".to_string()),
        "Pending" if tick && !has_source => ("Ready", "100%".to_string()),
        "Pending" if tick => ("Provisioning", "0%".to_string()),
        "Provisioning" if tick => {
            let p = (percent(&vd["status"]["progress"]) + STEP_PERCENT).min(100.0);
            if p >= 100.0 {
                ("Ready", "100%".to_string())
            } else {
                ("Provisioning", format!("{p:.0}%"))
            }
        }
        _ => return,
    };
    let name = meta_str(vd, "name");
    let pvc_name = format!(
        "vd-{name}-{}",
        meta_str(vd, "uid").get(..8).unwrap_or("00000000")
    );
    let size = match &from_snapshot {
        Some((size, _)) => size.clone(),
        None => vd
            .pointer("/spec/persistentVolumeClaim/size")
            .map(|v| {
                v.as_str()
                    .map(String::from)
                    .unwrap_or_else(|| v.to_string())
            })
            .unwrap_or_else(|| "10Gi".into()),
    };
    let class = class_name.map(String::from);
    if next != "Pending" {
        ensure_pvc(app, vd, &pvc_name, &size, class.clone());
        // A disk made from a VirtualDiskSnapshot holds its data (dh_snapshot.rs).
        crate::deckhouse::snapshot::disk_data(app, vd, &pvc_name);
        // A clone's disk: its claim holds the source disk's bytes (clone.rs).
        if let Some(source) = crate::kubevirt::clone::content_of_disk(vd) {
            app.store.modify(
                &crate::core::store::Key::new(
                    "",
                    "persistentvolumeclaims",
                    meta_str(vd, "namespace"),
                    &pvc_name,
                ),
                |o| {
                    o["metadata"]["annotations"][crate::kubevirt::export_snapshot::CONTENT_OF] =
                        serde_json::json!(source)
                },
            );
        }
    }
    match next {
        "Provisioning" => importer::ensure(app, "vd", vd, None),
        "Ready" => importer::remove(app, "vd", vd),
        _ => {}
    }
    app.store.modify(&key_of(DH, "virtualdisks", vd), |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!(next);
        st["progress"] = json!(progress);
        st["target"] = json!({"persistentVolumeClaimName": pvc_name});
        st["storageClassName"] = json!(class.unwrap_or_else(|| "local-path".into()));
        let ready = next == "Ready";
        if ready {
            st["capacity"] = json!(size);
        }
        set_condition(&mut st, "DatasourceReady", true, "DatasourceReady", "");
        set_condition(
            &mut st,
            "Ready",
            ready,
            if ready { "Ready" } else { "Provisioning" },
            "",
        );
        st["observedGeneration"] = o["metadata"]["generation"].clone();
        o["status"] = st;
    });
}

/// VirtualImage / ClusterVirtualImage, stored in DVCR (or a VirtualImage's PVC with `storage:
/// PersistentVolumeClaim`). One made from a URL or a container image imports as the
/// controllers do: `Pending` → `Provisioning` (`status.progress` "NN%", an importer pod for a
/// VirtualImage, condition `Ready` `False` reason `Provisioning`) → `Ready` (`format`, `size`,
/// `target`; condition `Ready` reason `Ready`), or `Failed` with condition `Ready` `False`,
/// reason `ProvisioningFailed` and the importer's error (deckhouse/virtualization
/// `api/core/v1alpha2/vicondition/condition.go`; phases from the CRD). Other sources are
/// Ready at once.
pub(super) fn virtual_image(app: &App, img: &Value, tick: bool) {
    let cluster = img["kind"] == "ClusterVirtualImage";
    let plural = if cluster {
        "clustervirtualimages"
    } else {
        "virtualimages"
    };
    if crate::deckhouse::upload::is_upload(img) {
        return crate::deckhouse::upload::reconcile(app, img, plural, tick);
    }
    let phase = img
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if matches!(phase, "Ready" | "Failed") {
        return;
    }
    let imports = matches!(
        img.pointer("/spec/dataSource/type").and_then(Value::as_str),
        Some("HTTP" | "ContainerImage")
    );
    let name = meta_str(img, "name");
    let ns = meta_str(img, "namespace");
    let on_pvc =
        img.pointer("/spec/storage").and_then(Value::as_str) == Some("PersistentVolumeClaim");
    // The importer pod of a ClusterVirtualImage runs in the module's namespace.
    let prefix = if cluster { "cvi" } else { "vi" };
    let pod = |failure: Option<&str>| importer::ensure(app, prefix, img, failure);
    if let Some(url) = img
        .pointer("/spec/dataSource/http/url")
        .and_then(Value::as_str)
        .filter(|u| crate::core::http_import::fetched(u))
        && crate::core::storage::import_error(img).is_none()
        && phase == "Provisioning"
    {
        return fetched_http(app, img, plural, tick, url);
    }
    // An image from a VirtualDiskSnapshot waits for the snapshot to be Ready
    // (virtualization-artifact vi/internal/source/object_ref_vdsnapshot_cr.go
    // `validateVirtualDiskSnapshot`; datasource_ready.go: condition `DatasourceReady` `False`,
    // reason `VirtualDiskSnapshotNotReady`, "VirtualDiskSnapshot NAME not ready.").
    if img
        .pointer("/spec/dataSource/objectRef/kind")
        .and_then(Value::as_str)
        == Some("VirtualDiskSnapshot")
    {
        let vds_name = img
            .pointer("/spec/dataSource/objectRef/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let vds_ns = img
            .pointer("/spec/dataSource/objectRef/namespace")
            .and_then(Value::as_str)
            .unwrap_or(ns);
        let vds_ready = app
            .store
            .get(&Key::new(DH, "virtualdisksnapshots", vds_ns, vds_name))
            .is_some_and(|v| v.pointer("/status/phase").and_then(Value::as_str) == Some("Ready"));
        let message = format!("VirtualDiskSnapshot {vds_name} not ready.");
        let current = img
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| c["type"] == "DatasourceReady"));
        if !vds_ready {
            if phase != "Pending"
                || current.and_then(|c| c["message"].as_str()) != Some(message.as_str())
            {
                app.store.modify(&key_of(DH, plural, img), |o| {
                    let mut st = o.get("status").cloned().unwrap_or(json!({}));
                    st["phase"] = json!("Pending");
                    set_condition(
                        &mut st,
                        "DatasourceReady",
                        false,
                        "VirtualDiskSnapshotNotReady",
                        &message,
                    );
                    set_condition(&mut st, "Ready", false, "ProvisioningNotStarted", "");
                    st["observedGeneration"] = o["metadata"]["generation"].clone();
                    o["status"] = st;
                });
            }
            return;
        }
        if current.is_none_or(|c| c["status"] != "True") {
            app.store.modify(&key_of(DH, plural, img), |o| {
                let mut st = o.get("status").cloned().unwrap_or(json!({}));
                set_condition(&mut st, "DatasourceReady", true, "DatasourceReady", "");
                o["status"] = st;
            });
            return;
        }
    }
    let (next, progress) = if !imports {
        ("Ready", "100%".to_string())
    } else {
        match phase {
            "" => ("Pending", String::new()),
            "Pending" if tick => ("Provisioning", "0%".to_string()),
            "Provisioning" if tick => {
                if let Some(message) = crate::core::storage::import_error(img) {
                    pod(Some(&message));
                    app.store.modify(&key_of(DH, plural, img), |o| {
                        let mut st = o.get("status").cloned().unwrap_or(json!({}));
                        st["phase"] = json!("Failed");
                        set_condition(&mut st, "Ready", false, "ProvisioningFailed", &message);
                        st["observedGeneration"] = o["metadata"]["generation"].clone();
                        o["status"] = st;
                    });
                    return;
                }
                let p = (percent(&img["status"]["progress"]) + STEP_PERCENT).min(100.0);
                if p >= 100.0 {
                    ("Ready", "100%".to_string())
                } else {
                    ("Provisioning", format!("{p:.0}%"))
                }
            }
            _ => return,
        }
    };
    match next {
        "Provisioning" => pod(None),
        "Ready" => importer::remove(app, prefix, img),
        _ => {}
    }
    let url = if cluster {
        format!("dvcr.d8-virtualization.svc/cvi/{name}:latest")
    } else {
        format!("dvcr.d8-virtualization.svc/vi/{ns}/{name}:latest")
    };
    let iso = img
        .pointer("/spec/dataSource/http/url")
        .and_then(Value::as_str)
        .is_some_and(|u| u.to_ascii_lowercase().ends_with(".iso"));
    app.store.modify(&key_of(DH, plural, img), |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!(next);
        if !progress.is_empty() {
            st["progress"] = json!(progress);
        }
        if next == "Ready" {
            st["format"] = json!(if iso { "iso" } else { "qcow2" });
            st["cdrom"] = json!(iso);
            st["size"] = json!({"stored": "256Mi", "storedBytes": "268435456", "unpacked": "2Gi", "unpackedBytes": "2147483648"});
            st["target"] = if on_pvc {
                json!({"persistentVolumeClaimName": format!("vi-{name}-{}", meta_str(o, "uid").get(..8).unwrap_or("00000000"))})
            } else {
                json!({"registryURL": url})
            };
            set_condition(&mut st, "Ready", true, "Ready", "");
        } else {
            set_condition(
                &mut st,
                "Ready",
                false,
                if next == "Pending" { "ProvisioningNotStarted" } else { "Provisioning" },
                if next == "Pending" { "" } else { "Import is in the process of provisioning to DVCR." },
            );
        }
        st["observedGeneration"] = o["metadata"]["generation"].clone();
        o["status"] = st;
    });
}

/// A VirtualImage / ClusterVirtualImage importing from a URL on this machine, once
/// `Provisioning`: the dvcr-importer really downloads it ([`crate::core::http_import`]);
/// `status.progress` is the bytes read (below 100% until done, upstream
/// `CapProgressBelow`), then `Ready` with the format and sizes of what was downloaded, or
/// `Failed` with condition `Ready` reason `ProvisioningFailed` and the stat service's message
/// `Provisioning failed: Pod NS/POD reported: <the importer's error>.`
/// (virtualization-artifact `controller/vi/internal/source/http.go`,
/// `service/stat/stat.go` `CheckPod`; the importer retries a failing source itself before
/// reporting, which the emulator does not wait for).
fn fetched_http(app: &App, img: &Value, plural: &str, tick: bool, url: &str) {
    if !tick {
        return;
    }
    let cluster = plural == "clustervirtualimages";
    let prefix = if cluster { "cvi" } else { "vi" };
    let uid = meta_str(img, "uid").to_string();
    let Some(job) = app.imports.job(&uid) else {
        let checksums = img
            .pointer("/spec/dataSource/http/checksum")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(a, h)| Some((a.clone(), h.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        crate::core::http_import::start(
            app,
            &uid,
            crate::core::http_import::Request {
                url: url.to_string(),
                checksums,
                capacity: u64::MAX,
            },
        );
        importer::ensure(app, prefix, img, None);
        return;
    };
    let key = key_of(DH, plural, img);
    match job.outcome {
        None => {
            let progress = format!("{:.0}%", job.percent().min(99.0));
            if img.pointer("/status/progress").and_then(Value::as_str) != Some(&progress) {
                app.store.modify(&key, |o| {
                    o["status"]["progress"] = json!(progress);
                    set_condition(
                        &mut o["status"],
                        "Ready",
                        false,
                        "Provisioning",
                        "The image is being imported.",
                    );
                });
            }
        }
        Some(Err(failure)) => {
            let (pod_ns, pod) = if cluster {
                (
                    importer::CVI_NAMESPACE.to_string(),
                    importer::pod_name("cvi", img),
                )
            } else {
                (
                    meta_str(img, "namespace").to_string(),
                    importer::pod_name("vi", img),
                )
            };
            let error = failure.deckhouse_message();
            importer::ensure(app, prefix, img, Some(&error));
            let message = format!("Provisioning failed: Pod {pod_ns}/{pod} reported: {error}.");
            app.store.modify(&key, |o| {
                let mut st = o.get("status").cloned().unwrap_or(json!({}));
                st["phase"] = json!("Failed");
                set_condition(&mut st, "Ready", false, "ProvisioningFailed", &message);
                st["observedGeneration"] = o["metadata"]["generation"].clone();
                o["status"] = st;
            });
        }
        Some(Ok(imported)) => {
            let _ = std::fs::rename(&imported.path, app.uploads.data_path(&uid));
            app.imports.forget(&uid);
            importer::remove(app, prefix, img);
            let target = image_target(img);
            let iso = imported.format == "iso" || url.to_ascii_lowercase().ends_with(".iso");
            app.store.modify(&key, |o| {
                let mut st = o.get("status").cloned().unwrap_or(json!({}));
                st["phase"] = json!("Ready");
                st["progress"] = json!("100%");
                st["format"] = json!(if iso { "iso" } else { imported.format.as_str() });
                st["cdrom"] = json!(iso);
                st["size"] = json!({
                    "stored": imported.received.to_string(), "storedBytes": imported.received.to_string(),
                    "unpacked": imported.size.to_string(), "unpackedBytes": imported.size.to_string()});
                st["target"] = target.clone();
                set_condition(&mut st, "Ready", true, "Ready", "");
                st["observedGeneration"] = o["metadata"]["generation"].clone();
                o["status"] = st;
            });
        }
    }
}

/// Where a Ready image is kept (`status.target`): its PVC when `spec.storage` is
/// `PersistentVolumeClaim`, else its DVCR location.
pub(crate) fn image_target(img: &Value) -> Value {
    let name = meta_str(img, "name");
    let uid = meta_str(img, "uid");
    let on_pvc =
        img.pointer("/spec/storage").and_then(Value::as_str) == Some("PersistentVolumeClaim");
    if on_pvc {
        json!({"persistentVolumeClaimName": format!("vi-{name}-{}", uid.get(..8).unwrap_or("00000000"))})
    } else if img["kind"] == "ClusterVirtualImage" {
        json!({"registryURL": format!("dvcr.d8-virtualization.svc/cvi/{name}:latest")})
    } else {
        json!({"registryURL": format!("dvcr.d8-virtualization.svc/vi/{}/{name}:latest", meta_str(img, "namespace"))})
    }
}

/// VirtualMachineClass: Ready.
pub(super) fn vm_class(app: &App, class: &Value, _tick: bool) {
    if class.pointer("/status/phase").is_none() {
        app.store
            .modify(&key_of(DH, "virtualmachineclasses", class), |o| {
                o["status"] = json!({"phase": "Ready"});
            });
    }
}

/// Deckhouse VM: Pending until every referenced disk/image exists and is Ready, then Running
/// (runPolicy AlwaysOn / AlwaysOnUnlessStoppedManually, the default) or Stopped (Manual /
/// AlwaysOff).
pub(super) fn deckhouse_vm(app: &App, vm: &Value, _tick: bool) {
    let ns = meta_str(vm, "namespace").to_string();
    let refs: Vec<Value> = vm
        .pointer("/spec/blockDeviceRefs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut devices_ready = true;
    let mut ref_status = vec![];
    for (i, r) in refs.iter().enumerate() {
        let kind = r["kind"].as_str().unwrap_or("");
        let name = r["name"].as_str().unwrap_or("");
        let key = match kind {
            "VirtualDisk" => Key::new(DH, "virtualdisks", &ns, name),
            "VirtualImage" => Key::new(DH, "virtualimages", &ns, name),
            "ClusterVirtualImage" => Key::new(DH, "clustervirtualimages", "", name),
            _ => continue,
        };
        let dev = app.store.get(&key);
        let ready = dev
            .as_ref()
            .and_then(|d| d.pointer("/status/phase").and_then(Value::as_str))
            == Some("Ready");
        devices_ready &= ready;
        let size = dev
            .as_ref()
            .and_then(|d| {
                d.pointer("/status/capacity")
                    .or_else(|| d.pointer("/status/size/unpacked"))
                    .cloned()
            })
            .unwrap_or(json!(""));
        ref_status.push(json!({"kind": kind, "name": name, "size": size, "target": format!("vd{}", (b'a' + i as u8) as char), "attached": ready}));
    }
    ref_status.extend(hotplugged_refs(app, vm));
    // Power state from runPolicy and operations: lifecycle/.
    let (power_phase, node) = crate::core::lifecycle::deckhouse_power(vm);
    // A VM naming a VirtualMachineIPAddress waits for its address (kubevirt/network.rs).
    let named_ip = crate::kubevirt::network::deckhouse_vm_address(app, vm);
    let mut phase = if !devices_ready || named_ip.is_err() {
        "Pending"
    } else {
        power_phase
    };
    let mut unschedulable = (phase == "Starting"
        && vm
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(crate::core::lifecycle::UNSCHEDULABLE))
            == Some(&json!("true")))
    .then(|| crate::core::lifecycle::UNSCHEDULABLE_MESSAGE.to_string());
    // Where it runs, and the workload updater's migration after a placement change
    // (deckhouse/placement.rs); a VM no node fits stays Starting with the scheduler's message.
    let node = match crate::deckhouse::placement::deckhouse_place(app, vm, phase, &node) {
        Ok(node) => node,
        Err(message) => {
            phase = "Starting";
            unschedulable = Some(message);
            node
        }
    };
    let [a, b, ..] = uid_bytes(vm);
    let ip = match &named_ip {
        Ok(Some((_, address))) => address.clone(),
        _ => format!("10.66.{}.{}", a, b % 254 + 1),
    };
    let name = meta_str(vm, "name").to_string();
    let uid5 = meta_str(vm, "uid").get(..5).unwrap_or("00000").to_string();
    let real_agent = app.guests.real_agent();
    // What runs and what waits for a restart: live_update.rs.
    let (applied, awaiting) = crate::kubevirt::live_update::deckhouse_sync(
        app,
        vm,
        matches!(phase, "Running" | "Migrating" | "Stopping"),
    );
    app.store.modify(&key_of(DH, "virtualmachines", vm), |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!(phase);
        st["blockDeviceRefs"] = json!(ref_status);
        st["observedGeneration"] = o["metadata"]["generation"].clone();
        st["resources"] = json!({
            "cpu": {"cores": applied.pointer("/cpu/cores").cloned().unwrap_or(json!(1)),
                    "coreFraction": applied.pointer("/cpu/coreFraction").cloned().unwrap_or(json!("100%"))},
            "memory": {"size": applied.pointer("/memory/size").cloned().unwrap_or(json!("1Gi"))}
        });
        match &named_ip {
            Ok(Some((name, _))) => st["virtualMachineIPAddressName"] = json!(name),
            _ => {
                st.as_object_mut().map(|m| m.remove("virtualMachineIPAddressName"));
            }
        }
        if o.pointer("/spec/virtualMachineIPAddressName").is_some() {
            let ready = named_ip.is_ok();
            set_condition(&mut st, "VirtualMachineIPAddressReady", ready,
                if ready { "VirtualMachineIPAddressReady" } else { "VirtualMachineIPAddressNotFound" },
                if ready { "" } else { "the VirtualMachineIPAddress has no address yet" });
        }
        // The networks the machine runs with (network.rs).
        st["networks"] = crate::kubevirt::network::deckhouse_status_networks(o, &applied, uid_bytes(o));
        match &awaiting {
            Some((changes, message)) => {
                st["restartAwaitingChanges"] = changes.clone();
                set_condition(&mut st, "AwaitingRestartToApplyConfiguration", true, "ChangesPendingRestart", message);
            }
            None => {
                st.as_object_mut().map(|m| m.remove("restartAwaitingChanges"));
                if let Some(c) = st["conditions"].as_array_mut() {
                    c.retain(|c| c["type"] != "AwaitingRestartToApplyConfiguration");
                }
            }
        }
        let running = matches!(phase, "Running" | "Migrating" | "Stopping");
        let m = st.as_object_mut().expect("object");
        if running {
            m.insert("nodeName".into(), json!(node));
            m.insert("ipAddress".into(), json!(ip));
            m.insert("virtualMachinePods".into(), json!([{"name": format!("virt-launcher-{name}-{uid5}"), "active": true}]));
            m.insert("versions".into(), json!({"qemu": "9.2.0", "libvirt": "10.9.0"}));
            if m.get("stats").and_then(|s| s.get("lastStartTime")).is_none() {
                m.insert("stats".into(), json!({"lastStartTime": now_rfc3339(), "phasesTransitions": [{"phase": "Running", "timestamp": now_rfc3339()}]}));
            }
        } else {
            for f in ["nodeName", "ipAddress", "virtualMachinePods", "stats"] {
                m.remove(f);
            }
        }
        set_condition(&mut st, "BlockDevicesReady", devices_ready, if devices_ready { "BlockDevicesReady" } else { "BlockDevicesNotReady" }, "");
        if let Some(message) = &unschedulable {
            set_condition(&mut st, "Running", false, "PodNotStarted", message);
        } else {
            set_condition(&mut st, "Running", running, if running { "Running" } else { "NotRunning" }, "");
        }
        // With real guests the agent reports itself (qemu_guest.rs); it is gone once the VM stops.
        let agent = running && (!real_agent || crate::core::table::eval_first(&st, ".conditions[?(@.type=='AgentReady')].status") == Some(&json!("True")));
        set_condition(&mut st, "AgentReady", agent, if agent { "AgentReady" } else { "AgentNotReady" }, "");
        set_condition(&mut st, "Migratable", running, if running { "VirtualMachineMigratable" } else { "NotRunning" }, "");
        o["status"] = st;
    });
    sync_launcher_pod(
        app,
        vm,
        matches!(phase, "Running" | "Migrating" | "Stopping"),
        &ip,
        &node,
    );
}

/// The running VM's virt-launcher pod, named as `status.virtualMachinePods` says. Deckhouse
/// runs a renamed KubeVirt: the pod carries `kubevirt.internal.virtualization.deckhouse.io:
/// virt-launcher` and `vm.kubevirt.internal.virtualization.deckhouse.io/name: <VM>` (what
/// `d8 v collect-debug-info` selects on, FACTS §8) and the VM's own labels, which the user
/// guide's Service examples select on. Upstream the pod's owner is the internal VMI; the
/// emulator has none, so the VM owns it (deleting the VM collects it all the same).
fn sync_launcher_pod(app: &App, vm: &Value, running: bool, ip: &str, node: &str) {
    let ns = meta_str(vm, "namespace");
    let name = meta_str(vm, "name");
    let uid5 = meta_str(vm, "uid").get(..5).unwrap_or("00000");
    let pod_name = format!("virt-launcher-{name}-{uid5}");
    let key = Key::new("", "pods", ns, &pod_name);
    let existing = app.store.get(&key);
    if !running {
        if existing.is_some() {
            app.store
                .delete(&key, crate::core::store::Propagation::Cascade);
        }
        return;
    }
    if let Some(pod) = existing {
        // A migration moved the VM: the new pod runs on the target node.
        if pod.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
            app.store
                .modify(&key, |o| o["spec"]["nodeName"] = json!(node));
        }
        return;
    }
    let mut labels = vm
        .pointer("/metadata/labels")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or(json!({}));
    labels["kubevirt.internal.virtualization.deckhouse.io"] = json!("virt-launcher");
    labels["vm.kubevirt.internal.virtualization.deckhouse.io/name"] = json!(name);
    let image = "dev-registry.deckhouse.io/virtualization/virt-launcher:v1.5.0";
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": ns, "labels": labels,
                     "ownerReferences": [super::owner_ref(vm)]},
        "spec": {"nodeName": node, "containers": [{"name": "compute", "image": image}]},
        "status": {"phase": "Running", "podIP": ip, "hostIP": "192.168.0.11",
                   "containerStatuses": [{"name": "compute", "ready": true, "restartCount": 0, "image": image}]},
    });
    let vm_key = Key::of("virtualization.deckhouse.io", "virtualmachines", vm);
    crate::core::gc::create_dependent(app, &vm_key, vm, "", "pods", pod);
}

/// The store key of a Deckhouse block device reference `{kind, name}` in `ns`.
fn block_device_key(ns: &str, r: &Value) -> Option<Key> {
    let name = r["name"].as_str().unwrap_or("");
    match r["kind"].as_str()? {
        "VirtualDisk" => Some(Key::new(DH, "virtualdisks", ns, name)),
        "VirtualImage" => Some(Key::new(DH, "virtualimages", ns, name)),
        "ClusterVirtualImage" => Some(Key::new(DH, "clustervirtualimages", "", name)),
        _ => None,
    }
}

/// The VMBDAs of VM `vm` in `ns`, oldest first.
pub(crate) fn attachments_of(app: &App, ns: &str, vm: &str) -> Vec<Value> {
    let (mut all, _) = app
        .store
        .list(DH, "virtualmachineblockdeviceattachments", Some(ns));
    all.retain(|a| {
        a.pointer("/spec/virtualMachineName")
            .and_then(Value::as_str)
            == Some(vm)
    });
    all.sort_by(|a, b| {
        meta_str(a, "creationTimestamp")
            .cmp(meta_str(b, "creationTimestamp"))
            .then(meta_str(a, "name").cmp(meta_str(b, "name")))
    });
    all
}

/// Who else holds VirtualDisk `disk` in `ns`: a VM's spec.blockDeviceRefs, or another live
/// VMBDA. A VirtualDisk is attached to one VM at a time (images are read-only and shared).
fn disk_holder(app: &App, ns: &str, disk: &str, this: &Value) -> Option<String> {
    let (vms, _) = app.store.list(DH, "virtualmachines", Some(ns));
    for vm in &vms {
        let refs = vm
            .pointer("/spec/blockDeviceRefs")
            .and_then(Value::as_array);
        if refs
            .into_iter()
            .flatten()
            .any(|r| r["kind"] == "VirtualDisk" && r["name"] == disk)
        {
            return Some(format!("virtual machine {}", meta_str(vm, "name")));
        }
    }
    let (bdas, _) = app
        .store
        .list(DH, "virtualmachineblockdeviceattachments", Some(ns));
    bdas.iter()
        .filter(|b| meta_str(b, "uid") != meta_str(this, "uid"))
        .filter(|b| b.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|b| {
            b.pointer("/spec/blockDeviceRef/kind") == Some(&json!("VirtualDisk"))
                && b.pointer("/spec/blockDeviceRef/name") == Some(&json!(disk))
        })
        .find(|b| {
            // Only an attachment that came first holds the disk.
            (meta_str(b, "creationTimestamp"), meta_str(b, "name"))
                < (meta_str(this, "creationTimestamp"), meta_str(this, "name"))
        })
        .map(|b| format!("attachment {}", meta_str(b, "name")))
}

/// VirtualMachineBlockDeviceAttachment (hotplug): `Pending` while the VM is not running or
/// the block device is not Ready, `InProgress` for one tick, then `Attached`; `Failed` when the
/// VirtualDisk is held by another VM or attachment, or the device is already in the VM's
/// `spec.blockDeviceRefs`. Phases and condition types from the CRD
/// (`virtualmachineblockdeviceattachments.yaml`, `BlockDeviceReady`, `VirtualMachineReady`,
/// `Attached`); the reasons and messages are the emulator's wording. The VM's
/// `status.blockDeviceRefs` lists the device (`hotplugged: true`) from `InProgress` on.
pub(super) fn vmbda(app: &App, bda: &Value, tick: bool) {
    if bda.pointer("/metadata/deletionTimestamp").is_some() {
        return;
    }
    let ns = meta_str(bda, "namespace");
    let vm_name = bda
        .pointer("/spec/virtualMachineName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let r = bda["spec"]["blockDeviceRef"].clone();
    let dev_name = r["name"].as_str().unwrap_or("").to_owned();
    let kind = r["kind"].as_str().unwrap_or("").to_owned();
    let phase = bda
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let vm = app.store.get(&Key::new(DH, "virtualmachines", ns, vm_name));
    let dev = block_device_key(ns, &r).and_then(|k| app.store.get(&k));
    let dev_ready = dev.as_ref().and_then(|d| d.pointer("/status/phase")) == Some(&json!("Ready"));
    let vm_running =
        vm.as_ref().and_then(|v| v.pointer("/status/phase")) == Some(&json!("Running"));
    let in_spec = vm.as_ref().is_some_and(|v| {
        v.pointer("/spec/blockDeviceRefs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|x| x["kind"] == r["kind"] && x["name"] == r["name"])
    });
    let holder = (kind == "VirtualDisk")
        .then(|| disk_holder(app, ns, &dev_name, bda))
        .flatten()
        .filter(|h| h != &format!("virtual machine {vm_name}"));
    // (phase, [BlockDeviceReady, VirtualMachineReady, Attached] as (ok, reason, message))
    let (next, conds): (&str, [(bool, &str, String); 3]) = if phase == "Failed" {
        return;
    } else if in_spec {
        (
            "Failed",
            [
                (dev_ready, "BlockDeviceReady", String::new()),
                (true, "VirtualMachineReady", String::new()),
                (
                    false,
                    "Conflict",
                    format!(
                        "{kind} {dev_name} is already attached to the virtual machine by its spec.blockDeviceRefs"
                    ),
                ),
            ],
        )
    } else if let Some(h) = holder {
        (
            "Failed",
            [
                (dev_ready, "BlockDeviceReady", String::new()),
                (vm.is_some(), "VirtualMachineReady", String::new()),
                (
                    false,
                    "Conflict",
                    format!("VirtualDisk {dev_name} is already in use by {h}"),
                ),
            ],
        )
    } else if vm.is_none() {
        (
            "Pending",
            [
                (dev_ready, "BlockDeviceReady", String::new()),
                (
                    false,
                    "VirtualMachineNotFound",
                    format!("VirtualMachine {vm_name} not found"),
                ),
                (false, "NotAttached", String::new()),
            ],
        )
    } else if !vm_running {
        (
            "Pending",
            [
                (dev_ready, "BlockDeviceReady", String::new()),
                (
                    false,
                    "NotReady",
                    format!("VirtualMachine {vm_name} is not running"),
                ),
                (false, "NotAttached", String::new()),
            ],
        )
    } else if !dev_ready {
        (
            "Pending",
            [
                (
                    false,
                    if dev.is_none() {
                        "BlockDeviceNotFound"
                    } else {
                        "NotReady"
                    },
                    if dev.is_none() {
                        format!("{kind} {dev_name} not found")
                    } else {
                        format!("{kind} {dev_name} is not ready")
                    },
                ),
                (true, "VirtualMachineReady", String::new()),
                (false, "NotAttached", String::new()),
            ],
        )
    } else {
        let next = match phase.as_str() {
            "Attached" => "Attached",
            "InProgress" if tick => "Attached",
            _ => "InProgress",
        };
        let attached = next == "Attached";
        (
            next,
            [
                (true, "BlockDeviceReady", String::new()),
                (true, "VirtualMachineReady", String::new()),
                (
                    attached,
                    if attached {
                        "Attached"
                    } else {
                        "AttachmentRequestSent"
                    },
                    if attached {
                        String::new()
                    } else {
                        format!("attaching {kind} {dev_name} to the virtual machine")
                    },
                ),
            ],
        )
    };
    let key = key_of(DH, "virtualmachineblockdeviceattachments", bda);
    let before = bda.get("status").cloned();
    let changed = app.store.modify(&key, |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!(next);
        st["virtualMachineName"] = json!(vm_name);
        for (t, (ok, reason, message)) in ["BlockDeviceReady", "VirtualMachineReady", "Attached"]
            .iter()
            .zip(conds.iter())
        {
            set_condition(&mut st, t, *ok, reason, message);
        }
        st["observedGeneration"] = o["metadata"]["generation"].clone();
        o["status"] = st;
    });
    let now = changed.and_then(|o| o.get("status").cloned());
    if now != before
        && let Some(vm) = vm
    {
        app.settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(meta_str(&vm, "uid"));
    }
}

/// The VM's `status.blockDeviceRefs` entries of its hotplugged devices (VMBDAs in progress or
/// attached).
fn hotplugged_refs(app: &App, vm: &Value) -> Vec<Value> {
    let ns = meta_str(vm, "namespace");
    let mut out = vec![];
    for (i, b) in attachments_of(app, ns, meta_str(vm, "name"))
        .iter()
        .filter(|b| {
            matches!(
                b.pointer("/status/phase").and_then(Value::as_str),
                Some("InProgress" | "Attached")
            )
        })
        .enumerate()
    {
        let r = &b["spec"]["blockDeviceRef"];
        let dev = block_device_key(ns, r).and_then(|k| app.store.get(&k));
        let size = dev
            .as_ref()
            .and_then(|d| {
                d.pointer("/status/capacity")
                    .or_else(|| d.pointer("/status/size/unpacked"))
                    .cloned()
            })
            .unwrap_or(json!(""));
        out.push(json!({
            "kind": r["kind"], "name": r["name"], "size": size,
            // Hotplugged devices are SCSI disks (the CRD's description).
            "target": format!("sd{}", (b'a' + i as u8) as char),
            "attached": b.pointer("/status/phase") == Some(&json!("Attached")),
            "hotplugged": true,
            "virtualMachineBlockDeviceAttachmentName": b["metadata"]["name"],
        }));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::reconcile_all;
    use super::*;
    use crate::ServeFlavor;
    use crate::core::registry::Registry;
    use std::time::Duration;

    fn get(app: &App, plural: &str, name: &str) -> Value {
        app.store
            .get(&Key::new(DH, plural, "default", name))
            .unwrap_or_else(|| panic!("{plural}/{name}"))
    }

    fn bda(name: &str, vm: &str, disk: &str) -> Value {
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachineBlockDeviceAttachment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"virtualMachineName": vm, "blockDeviceRef": {"kind": "VirtualDisk", "name": disk}}})
    }

    #[test]
    fn vmbda_goes_pending_in_progress_attached_and_one_disk_has_one_vm() {
        let app = App::new(
            Registry::new(ServeFlavor::Deckhouse),
            Duration::from_secs(1),
        );
        for vm in ["a", "b"] {
            app.store
                .create(
                    DH,
                    "virtualmachines",
                    json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                    "kind": "VirtualMachine", "metadata": {"name": vm, "namespace": "default"},
                    "spec": {"runPolicy": "AlwaysOn", "blockDeviceRefs": []}}),
                )
                .unwrap();
        }
        app.store
            .create(
                DH,
                "virtualdisks",
                json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                "kind": "VirtualDisk", "metadata": {"name": "data", "namespace": "default"},
                "spec": {"persistentVolumeClaim": {"size": "1Gi"}}}),
            )
            .unwrap();
        // The VM is not running yet on the first pass: Pending with VirtualMachineReady False.
        app.store
            .create(
                DH,
                "virtualmachineblockdeviceattachments",
                bda("a-data", "a", "data"),
            )
            .unwrap();
        reconcile_all(&app, false);
        let first = get(&app, "virtualmachineblockdeviceattachments", "a-data");
        assert_eq!(first["status"]["phase"], "Pending");
        let mut phases = vec![];
        for _ in 0..8 {
            reconcile_all(&app, true);
            let p = get(&app, "virtualmachineblockdeviceattachments", "a-data")["status"]["phase"]
                .clone();
            if phases.last() != Some(&p) {
                phases.push(p);
            }
        }
        assert_eq!(phases.last(), Some(&json!("Attached")), "{phases:?}");
        assert!(phases.contains(&json!("InProgress")), "{phases:?}");
        let vm = get(&app, "virtualmachines", "a");
        let r = &vm["status"]["blockDeviceRefs"][0];
        assert_eq!(
            (&r["name"], &r["hotplugged"], &r["attached"]),
            (&json!("data"), &json!(true), &json!(true))
        );
        assert_eq!(r["virtualMachineBlockDeviceAttachmentName"], "a-data");
        // A second VM asking for the same disk fails with Conflict.
        app.store
            .create(
                DH,
                "virtualmachineblockdeviceattachments",
                bda("b-data", "b", "data"),
            )
            .unwrap();
        for _ in 0..3 {
            reconcile_all(&app, true);
        }
        let second = get(&app, "virtualmachineblockdeviceattachments", "b-data");
        assert_eq!(second["status"]["phase"], "Failed");
        let attached =
            crate::core::table::eval_first(&second, ".status.conditions[?(@.type=='Attached')]")
                .cloned()
                .unwrap();
        assert_eq!(attached["reason"], "Conflict");
        assert_eq!(
            attached["message"],
            "VirtualDisk data is already in use by attachment a-data"
        );
        // Deleting the attachment drops the device from the VM's status.
        app.store.delete(
            &Key::new(
                DH,
                "virtualmachineblockdeviceattachments",
                "default",
                "a-data",
            ),
            crate::core::store::Propagation::Cascade,
        );
        reconcile_all(&app, true);
        let vm = get(&app, "virtualmachines", "a");
        assert_eq!(vm["status"]["blockDeviceRefs"], json!([]));
    }
}
