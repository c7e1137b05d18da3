//! CDI DataVolume imports.

use super::{STEP_PERCENT, ensure_pvc, key_of, percent, set_condition};
use crate::core::app::App;
use crate::core::util::meta_str;
use serde_json::{Value, json};

/// CDI DataVolume: ImportScheduled → ImportInProgress (a clone: CloneScheduled → CloneInProgress;
/// progress in steps) → Succeeded, with a
/// bound PVC of the same name. A blank source is Succeeded at once.
pub(super) fn data_volume(app: &App, dv: &Value, tick: bool) {
    let phase = dv
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if dv.pointer("/spec/source/upload").is_some() {
        crate::kubevirt::upload::data_volume(app, dv, tick, &dv_size(dv), dv_storage_class(dv));
        return;
    }
    // A pre-populated DataVolume (a VM restore made its PVC, kubevirt restore.go
    // `createDataVolume`) adopts that PVC and is done (CDI `datavolume/controller-base.go`,
    // AnnPrePopulated).
    if phase != "Succeeded"
        && dv
            .pointer("/metadata/annotations/cdi.kubevirt.io~1storage.prePopulated")
            .is_some()
    {
        let ns = meta_str(dv, "namespace");
        let pvc_key =
            crate::core::store::Key::new("", "persistentvolumeclaims", ns, meta_str(dv, "name"));
        if app.store.get(&pvc_key).is_some() {
            app.store.modify(&pvc_key, |o| {
                o["metadata"]["ownerReferences"] = json!([super::owner_ref(dv)]);
            });
            app.store
                .modify(&key_of("cdi.kubevirt.io", "datavolumes", dv), |o| {
                    let mut st = o.get("status").cloned().unwrap_or(json!({}));
                    st["phase"] = json!("Succeeded");
                    st["progress"] = json!("N/A");
                    st["claimName"] = o["metadata"]["name"].clone();
                    set_condition(&mut st, "Bound", true, "Bound", "PVC bound");
                    set_condition(&mut st, "Ready", true, "", "");
                    o["status"] = st;
                });
        }
        return;
    }
    let blank = dv.pointer("/spec/source/blank").is_some();
    // Unbound WaitForFirstConsumer storage: CDI waits in PendingPopulation for a consumer.
    // `cdi.kubevirt.io/storage.bind.immediate.requested: "true"` binds at once whatever the
    // class (CDI `pkg/controller/common/util.go` AnnImmediateBinding; DataImportCron sets it on
    // the golden images it imports, which no VM consumes).
    let immediate = dv
        .pointer("/metadata/annotations/cdi.kubevirt.io~1storage.bind.immediate.requested")
        .and_then(Value::as_str)
        == Some("true");
    let waiting = matches!(phase, "" | "PendingPopulation")
        && !immediate
        && crate::core::storage::waits_for_first_consumer(app, dv_storage_class(dv).as_deref())
        && !crate::core::storage::kubevirt_consumer(app, dv);
    if waiting {
        if phase.is_empty() {
            app.store
                .modify(&key_of("cdi.kubevirt.io", "datavolumes", dv), |o| {
                    let mut st = o.get("status").cloned().unwrap_or(json!({}));
                    st["phase"] = json!("PendingPopulation");
                    st["progress"] = json!("N/A");
                    set_condition(&mut st, "Bound", false, "Pending", "PVC is pending");
                    set_condition(&mut st, "Ready", false, "PendingPopulation", "");
                    o["status"] = st;
                });
        }
        return;
    }
    if let Some(url) = dv
        .pointer("/spec/source/http/url")
        .and_then(Value::as_str)
        .filter(|u| crate::core::http_import::fetched(u))
        && crate::core::storage::import_error(dv).is_none()
    {
        return fetched_http(app, dv, phase, tick, url);
    }
    if phase == "ImportInProgress"
        && tick
        && let Some(message) = crate::core::storage::import_error(dv)
    {
        // The importer pod fails and is restarted, again and again.
        app.store
            .modify(&key_of("cdi.kubevirt.io", "datavolumes", dv), |o| {
                let mut st = o.get("status").cloned().unwrap_or(json!({}));
                let restarts = st["restartCount"].as_i64().unwrap_or(0) + 1;
                st["restartCount"] = json!(restarts);
                set_condition(&mut st, "Running", false, "Error", &message);
                o["status"] = st;
            });
        super::importer::ensure_cdi(app, dv, Some(&message));
        return;
    }
    // A clone (of a PVC, or of what a DataSource names) is host-assisted on storage without
    // CSI clone or snapshots: `CloneScheduled` → `CloneInProgress` → `Succeeded` (CDI
    // `pkg/controller/datavolume/pvc-clone-controller.go`, the phases of `types.go`).
    let clone = dv.pointer("/spec/source/pvc").is_some() || dv.pointer("/spec/sourceRef").is_some();
    let (scheduled, in_progress) = if clone {
        ("CloneScheduled", "CloneInProgress")
    } else {
        ("ImportScheduled", "ImportInProgress")
    };
    let (next_phase, progress) = match phase {
        "" if blank => ("Succeeded", "100.0%".to_string()),
        "" | "PendingPopulation" => (scheduled, "N/A".to_string()),
        "ImportScheduled" | "CloneScheduled" if tick => (in_progress, "0.0%".to_string()),
        "ImportInProgress" | "CloneInProgress" if tick => {
            let p = (percent(&dv["status"]["progress"]) + STEP_PERCENT).min(100.0);
            if p >= 100.0 {
                ("Succeeded", "100.0%".to_string())
            } else {
                (in_progress, format!("{p:.1}%"))
            }
        }
        _ => return,
    };
    ensure_pvc(
        app,
        dv,
        meta_str(dv, "name"),
        &dv_size(dv),
        dv_storage_class(dv),
    );
    app.store
        .modify(&key_of("cdi.kubevirt.io", "datavolumes", dv), |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["phase"] = json!(next_phase);
            st["progress"] = json!(progress);
            st["claimName"] = o["metadata"]["name"].clone();
            let done = next_phase == "Succeeded";
            set_condition(&mut st, "Bound", true, "Bound", "PVC bound");
            set_condition(
                &mut st,
                "Running",
                next_phase == in_progress,
                if done { "Completed" } else { "Pending" },
                "",
            );
            set_condition(
                &mut st,
                "Ready",
                done,
                if done { "" } else { "TransferRunning" },
                "",
            );
            o["status"] = st;
        });
    if !clone && next_phase == in_progress {
        super::importer::ensure_cdi(app, dv, None);
    } else if !clone && next_phase == "Succeeded" {
        super::importer::remove_cdi(app, dv);
    }
}

/// A DataVolume importing from a URL on this machine: the importer really downloads it
/// ([`crate::core::http_import`]). `ImportScheduled` → (importer started) `ImportInProgress` with
/// the bytes read as progress → `Succeeded` with the converted data in the PVC; an importer
/// that fails is restarted (`status.restartCount`, condition `Running` `False`, reason
/// `Error`, its termination message: CDI `import-controller.go` `updatePvcFromPod`), except
/// for a checksum mismatch, which CDI marks fatal: phase `Failed`, reason `ChecksumError`.
fn fetched_http(app: &App, dv: &Value, phase: &str, tick: bool, url: &str) {
    let uid = meta_str(dv, "uid").to_string();
    let dv_key = key_of("cdi.kubevirt.io", "datavolumes", dv);
    let start = || {
        let checksums = dv
            .pointer("/spec/source/http/checksum")
            .and_then(Value::as_str)
            .and_then(|c| c.split_once(':'))
            .map(|(a, h)| vec![(a.to_string(), h.to_string())])
            .unwrap_or_default();
        let capacity = crate::kubevirt::export::parse_bytes(&dv_size(dv)).unwrap_or(u64::MAX);
        crate::core::http_import::start(
            app,
            &uid,
            crate::core::http_import::Request {
                url: url.to_string(),
                checksums,
                capacity,
            },
        );
    };
    let set = |phase: &str, progress: &str, running: (bool, &str, &str), ready: bool| {
        app.store.modify(&dv_key, |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["phase"] = json!(phase);
            st["progress"] = json!(progress);
            st["claimName"] = o["metadata"]["name"].clone();
            set_condition(&mut st, "Bound", true, "Bound", "PVC bound");
            set_condition(&mut st, "Running", running.0, running.1, running.2);
            set_condition(
                &mut st,
                "Ready",
                ready,
                if ready { "" } else { "TransferRunning" },
                "",
            );
            o["status"] = st;
        });
    };
    match phase {
        "" | "PendingPopulation" => {
            ensure_pvc(
                app,
                dv,
                meta_str(dv, "name"),
                &dv_size(dv),
                dv_storage_class(dv),
            );
            set("ImportScheduled", "N/A", (false, "Pending", ""), false);
        }
        "ImportScheduled" if tick => {
            start();
            set("ImportInProgress", "0.0%", (true, "Pending", ""), false);
            super::importer::ensure_cdi(app, dv, None);
        }
        "ImportInProgress" if tick => {
            let Some(job) = app.imports.job(&uid) else {
                // The importer pod was restarted: it downloads again.
                return start();
            };
            match job.outcome {
                None => {
                    let progress = format!("{:.1}%", job.percent());
                    if dv.pointer("/status/progress").and_then(Value::as_str) != Some(&progress) {
                        app.store
                            .modify(&dv_key, |o| o["status"]["progress"] = json!(progress));
                    }
                }
                Some(Ok(imported)) => {
                    let pvc = app.store.get(&crate::core::store::Key::new(
                        "",
                        "persistentvolumeclaims",
                        meta_str(dv, "namespace"),
                        meta_str(dv, "name"),
                    ));
                    if let Some(pvc) = pvc {
                        let pvc_uid = meta_str(&pvc, "uid");
                        if std::fs::rename(&imported.path, app.uploads.data_path(pvc_uid)).is_ok() {
                            app.uploads.finish(pvc_uid, Ok(()));
                        }
                    }
                    app.imports.forget(&uid);
                    set("Succeeded", "100.0%", (false, "Completed", ""), true);
                    super::importer::remove_cdi(app, dv);
                }
                Some(Err(failure)) if failure.permanent() => {
                    let message = failure.cdi_message();
                    set(
                        "Failed",
                        dv.pointer("/status/progress")
                            .and_then(Value::as_str)
                            .unwrap_or("N/A"),
                        (false, "ChecksumError", &message),
                        false,
                    );
                    super::importer::ensure_cdi(app, dv, Some(&message));
                }
                Some(Err(failure)) => {
                    let message = failure.cdi_message();
                    app.imports.forget(&uid);
                    app.store.modify(&dv_key, |o| {
                        let mut st = o.get("status").cloned().unwrap_or(json!({}));
                        let restarts = st["restartCount"].as_i64().unwrap_or(0) + 1;
                        st["restartCount"] = json!(restarts);
                        set_condition(&mut st, "Running", false, "Error", &message);
                        o["status"] = st;
                    });
                    super::importer::ensure_cdi(app, dv, Some(&message));
                }
            }
        }
        _ => {}
    }
}

fn dv_size(dv: &Value) -> String {
    [
        "/spec/storage/resources/requests/storage",
        "/spec/pvc/resources/requests/storage",
    ]
    .iter()
    .find_map(|p| dv.pointer(p))
    .map(|v| {
        v.as_str()
            .map(String::from)
            .unwrap_or_else(|| v.to_string())
    })
    .unwrap_or_else(|| "1Gi".into())
}

fn dv_storage_class(dv: &Value) -> Option<String> {
    [
        "/spec/storage/storageClassName",
        "/spec/pvc/storageClassName",
    ]
    .iter()
    .find_map(|p| dv.pointer(p).and_then(Value::as_str))
    .map(String::from)
}

/// CDI DataSource: its condition `Ready` follows what `spec.source` names (CDI
/// `pkg/controller/datasource-controller.go`, `update`): `status.source` mirrors the spec; a
/// PVC source whose DataVolume is `Succeeded` (or, without a DataVolume, whose PVC exists) is
/// `True`, reason `Ready`, "DataSource is ready to be consumed"; a DataVolume in another phase
/// gives `False` with that phase as the reason ("Import DataVolume phase P"); nothing found is
/// `False`, `NotFound` ("PVC not found"); no source is `False`, `NoSource`.
pub(super) fn data_source(app: &App, ds: &Value, _tick: bool) {
    let ns = meta_str(ds, "namespace");
    let (ready, reason, message) = match ds.pointer("/spec/source/pvc") {
        Some(pvc) => {
            let pns = pvc["namespace"]
                .as_str()
                .filter(|s| !s.is_empty())
                .unwrap_or(ns);
            let name = pvc["name"].as_str().unwrap_or("");
            let dv = app.store.get(&crate::core::store::Key::new(
                "cdi.kubevirt.io",
                "datavolumes",
                pns,
                name,
            ));
            match dv {
                Some(dv) => {
                    let phase = dv
                        .pointer("/status/phase")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned();
                    if phase == "Succeeded" {
                        (
                            true,
                            "Ready".to_owned(),
                            "DataSource is ready to be consumed".to_owned(),
                        )
                    } else {
                        (
                            false,
                            phase.clone(),
                            format!("Import DataVolume phase {phase}"),
                        )
                    }
                }
                None if app
                    .store
                    .get(&crate::core::store::Key::new(
                        "",
                        "persistentvolumeclaims",
                        pns,
                        name,
                    ))
                    .is_some() =>
                {
                    (
                        true,
                        "Ready".to_owned(),
                        "DataSource is ready to be consumed".to_owned(),
                    )
                }
                None => (false, "NotFound".to_owned(), "PVC not found".to_owned()),
            }
        }
        None if ds.pointer("/spec/source/snapshot").is_some() => (
            false,
            "SnapshotNotReady".to_owned(),
            "Snapshot phase is not ready".to_owned(),
        ),
        None => (false, "NoSource".to_owned(), "No source set".to_owned()),
    };
    let current = ds
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    let state = if ready { "True" } else { "False" };
    if current.is_some_and(|c| c["status"] == state && c["reason"] == reason.as_str())
        && ds.pointer("/status/source") == ds.pointer("/spec/source")
    {
        return;
    }
    app.store
        .modify(&key_of("cdi.kubevirt.io", "datasources", ds), |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["source"] = o["spec"]["source"].clone();
            set_condition(&mut st, "Ready", ready, &reason, &message);
            o["status"] = st;
        });
}
