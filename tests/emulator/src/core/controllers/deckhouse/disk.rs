//! VirtualDisk: provisioning a disk's claim, from nothing, an image, a URL, an upload or a
//! VirtualDiskSnapshot ([`crate::deckhouse::snapshot::from_snapshot`]).

use super::DH;
use crate::core::app::App;
use crate::core::controllers::importer;
use crate::core::controllers::{STEP_PERCENT, ensure_pvc, key_of, percent, set_condition};
use crate::core::util::meta_str;
use serde_json::{Value, json};

/// VirtualDisk: Pending → Provisioning (progress "NN%") → Ready with a PVC
/// `vd-<name>-<uid8>`; a disk without dataSource is Ready at the first tick.
pub(in crate::core::controllers) fn virtual_disk(app: &App, vd: &Value, tick: bool) {
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
    // asks for none (deckhouse/snapshot/disk_source.rs `from_snapshot`).
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
