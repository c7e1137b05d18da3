//! VirtualImage / ClusterVirtualImage: importing an image into DVCR or a claim, and where a
//! Ready image is kept.

use super::DH;
use crate::core::app::App;
use crate::core::controllers::importer;
use crate::core::controllers::{STEP_PERCENT, key_of, percent, set_condition};
use crate::core::store::Key;
use crate::core::util::meta_str;
use serde_json::{Value, json};

/// VirtualImage / ClusterVirtualImage, stored in DVCR (or a VirtualImage's PVC with `storage:
/// PersistentVolumeClaim`). One made from a URL or a container image imports as the
/// controllers do: `Pending` → `Provisioning` (`status.progress` "NN%", an importer pod for a
/// VirtualImage, condition `Ready` `False` reason `Provisioning`) → `Ready` (`format`, `size`,
/// `target`; condition `Ready` reason `Ready`), or `Failed` with condition `Ready` `False`,
/// reason `ProvisioningFailed` and the importer's error (deckhouse/virtualization
/// `api/core/v1alpha2/vicondition/condition.go`; phases from the CRD). Other sources are
/// Ready at once.
pub(in crate::core::controllers) fn virtual_image(app: &App, img: &Value, tick: bool) {
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
