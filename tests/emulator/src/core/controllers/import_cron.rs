//! CDI DataImportCron, after CDI `pkg/controller/dataimportcron-controller.go` (`Reconcile`,
//! `initCron`, `update`, `createImportDataVolume`, `updateDataSource`,
//! `garbageCollectOldImports`) and `dataimportcron-conditions.go` (the reasons).
//!
//! - A registry-URL cron's first poll runs at once (CDI creates the initial Job with the
//!   CronJob); it writes the source's digest as `cdi.kubevirt.io/storage.import.sourceDesiredDigest`
//!   and the poll time as `…/storage.import.lastCronTime`. The emulator has no registry, so the
//!   digest stands in as the sha256 of the image reference.
//! - A new digest is imported into a DataVolume named `MANAGED-DATASOURCE-` + the digest's first
//!   12 hex digits (`createDvName`), from the template with the registry URL pinned to the digest
//!   (`NAME@sha256:…`, tag dropped: `untagDigestedDockerURL`), labelled
//!   `cdi.kubevirt.io/dataImportCron: CRON`, with immediate binding; `status.currentImports`
//!   names it (`[{DataVolumeName, Digest}]`: capitalised in CDI's `ImportStatus`).
//! - Conditions: `Progressing` (`ImportScheduled`, `ImportProgressing` True, `NoImport`, or the
//!   DataVolume's phase) and `UpToDate` (`Outdated`, `ImportProgressing`, `NoDigest`,
//!   `UpToDate` True with `status.sourceFormat: pvc`); `status.lastExecutionTimestamp` is the
//!   last poll.
//! - Once imported: `status.lastImportedPVC` and `lastImportTimestamp`; the PVC is labelled for
//!   the cron and stamped `…/storage.import.lastUseTime` (once here: the emulator reconciles on
//!   every change, CDI on events); the managed DataSource (created with the cron's label when
//!   missing, left alone when it has none) is pointed at the PVC; with `garbageCollect`
//!   `Outdated` (the default) the cron's PVCs beyond `importsToKeep` (default 3), least recently
//!   used first, are deleted with their DataVolumes.
//! - A DataSource already managed by another cron stops the reconcile (`shouldReconcileCron`).

use super::{key_of, set_condition};
use crate::core::app::App;
use crate::core::store::{Key, Propagation};
use crate::core::util::{meta_str, now_rfc3339};
use serde_json::{Value, json};

const GROUP: &str = "cdi.kubevirt.io";
/// `common.DataImportCronLabel`.
pub const CRON_LABEL: &str = "cdi.kubevirt.io/dataImportCron";
const ANN_DESIRED_DIGEST: &str = "cdi.kubevirt.io/storage.import.sourceDesiredDigest";
const ANN_LAST_CRON_TIME: &str = "cdi.kubevirt.io/storage.import.lastCronTime";
const ANN_LAST_USE_TIME: &str = "cdi.kubevirt.io/storage.import.lastUseTime";
const ANN_IMMEDIATE: &str = "cdi.kubevirt.io/storage.bind.immediate.requested";
/// `defaultImportsToKeepPerCron`.
const DEFAULT_IMPORTS_TO_KEEP: usize = 3;
/// `digestDvNameSuffixLength`.
const DIGEST_SUFFIX: usize = 12;

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn annotation<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj.pointer(&format!("/metadata/annotations/{}", escape(key)))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn label<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj.pointer(&format!("/metadata/labels/{}", escape(key)))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The stand-in digest of a registry reference (see the module comment).
pub fn digest_of(url: &str) -> String {
    use sha2::Digest;
    let hex: String = sha2::Sha256::digest(url.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// `untagDigestedDockerURL(url + "@" + digest)`: the reference pinned to the digest, its tag
/// dropped.
fn pinned(url: &str, digest: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("docker", url));
    let rest = rest.split('@').next().unwrap_or(rest);
    // A tag is a `:` after the last `/` (a `:` before it is a registry port).
    let untagged = match rest.rfind('/') {
        Some(slash) => match rest[slash..].find(':') {
            Some(colon) => &rest[..slash + colon],
            None => rest,
        },
        None => rest.split(':').next().unwrap_or(rest),
    };
    format!("{scheme}://{untagged}@{digest}")
}

pub(super) fn data_import_cron(app: &App, cron: &Value, _tick: bool) {
    let ns = meta_str(cron, "namespace");
    let name = meta_str(cron, "name");
    let Some(ds_name) = cron
        .pointer("/spec/managedDataSource")
        .and_then(Value::as_str)
    else {
        return;
    };
    let ds_key = Key::new(GROUP, "datasources", ns, ds_name);
    // shouldReconcileCron: a DataSource another (existing) cron manages is left to it.
    if let Some(ds) = app.store.get(&ds_key) {
        let other = label(&ds, CRON_LABEL);
        if !other.is_empty()
            && other != name
            && app
                .store
                .get(&Key::new(GROUP, "dataimportcrons", ns, other))
                .is_some_and(|o| o.pointer("/spec/managedDataSource") == Some(&json!(ds_name)))
        {
            return;
        }
    }
    let mut next = cron.clone();
    // initCron + the initial poller Job: the digest of the registry source, polled now.
    let url = cron
        .pointer("/spec/template/spec/source/registry/url")
        .and_then(Value::as_str);
    if let Some(url) = url
        && annotation(cron, ANN_DESIRED_DIGEST).is_empty()
    {
        let anns = &mut next["metadata"]["annotations"];
        if !anns.is_object() {
            *anns = json!({});
        }
        anns[ANN_DESIRED_DIGEST] = json!(digest_of(url));
        anns[ANN_LAST_CRON_TIME] = json!(now_rfc3339());
    }
    update(app, &mut next, ns, name, ds_name);
    if next != *cron {
        app.store
            .modify(&key_of(GROUP, "dataimportcrons", cron), |o| {
                o["metadata"]["annotations"] = next["metadata"]["annotations"].clone();
                o["status"] = next["status"].clone();
            });
    }
}

/// CDI `update`.
fn update(app: &App, cron: &mut Value, ns: &str, name: &str, ds_name: &str) {
    if !cron["status"].is_object() {
        cron["status"] = json!({});
    }
    let imports: Vec<Value> = cron
        .pointer("/status/currentImports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let current = imports
        .first()
        .and_then(|i| i["DataVolumeName"].as_str())
        .map(str::to_owned);
    let dv = current
        .as_deref()
        .and_then(|n| app.store.get(&Key::new(GROUP, "datavolumes", ns, n)));
    let pvc_key = current
        .as_deref()
        .map(|n| Key::new("", "persistentvolumeclaims", ns, n));
    let pvc = pvc_key.as_ref().and_then(|k| app.store.get(k));
    let mut succeeded = false;
    let phase = dv
        .as_ref()
        .and_then(|d| d.pointer("/status/phase"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let st = &mut cron["status"];
    match (&dv, &pvc) {
        (Some(_), _) if phase == "Succeeded" => succeeded = true,
        (Some(_), _) if phase == "ImportScheduled" => set_condition(
            st,
            "Progressing",
            false,
            "ImportScheduled",
            "Import is scheduled",
        ),
        (Some(_), _) if phase == "ImportInProgress" => set_condition(
            st,
            "Progressing",
            true,
            "ImportProgressing",
            "Import is progressing",
        ),
        (Some(_), _) => set_condition(
            st,
            "Progressing",
            false,
            phase,
            &format!("Import DataVolume phase {phase}"),
        ),
        (None, Some(_)) => succeeded = true,
        (None, None) => {
            if !imports.is_empty() {
                st["currentImports"] = json!(imports[1..]);
            }
            set_condition(st, "Progressing", false, "NoImport", "No current import");
        }
    }
    if succeeded {
        // updateSource: the PVC is the cron's, and used now.
        if let Some(k) = &pvc_key {
            app.store.modify(k, |p| {
                let meta = &mut p["metadata"];
                if !meta["labels"].is_object() {
                    meta["labels"] = json!({});
                }
                meta["labels"][CRON_LABEL] = json!(name);
                if !meta["annotations"].is_object() {
                    meta["annotations"] = json!({});
                }
                if meta["annotations"].get(ANN_LAST_USE_TIME).is_none() {
                    meta["annotations"][ANN_LAST_USE_TIME] = json!(now_rfc3339());
                }
            });
        }
        // updateDataImportCronOnSuccess.
        let source = json!({"namespace": ns, "name": current});
        if st.get("lastImportedPVC") != Some(&source) {
            st["lastImportedPVC"] = source;
            st["lastImportTimestamp"] = json!(now_rfc3339());
        }
        set_condition(st, "Progressing", false, "NoImport", "No current import");
        garbage_collect(app, cron, ns, name);
    }
    update_data_source(app, cron, ns, name, ds_name);
    let desired = annotation(cron, ANN_DESIRED_DIGEST).to_owned();
    let st = &mut cron["status"];
    let digest_updated = !desired.is_empty()
        && imports
            .first()
            .is_none_or(|i| i["Digest"].as_str() != Some(desired.as_str()));
    if digest_updated {
        set_condition(
            st,
            "UpToDate",
            false,
            "Outdated",
            "Source digest updated since last import",
        );
        if succeeded || imports.is_empty() {
            create_import(app, cron, ns, name, ds_name, &desired);
        }
    } else if succeeded {
        st["sourceFormat"] = json!("pvc");
        set_condition(
            st,
            "UpToDate",
            true,
            "UpToDate",
            "Latest import is up to date",
        );
    } else if !imports.is_empty() {
        set_condition(
            st,
            "UpToDate",
            false,
            "ImportProgressing",
            "Import is progressing",
        );
    } else {
        set_condition(st, "UpToDate", false, "NoDigest", "No source digest");
    }
    // updateLastExecutionTimestamp.
    let last = annotation(cron, ANN_LAST_CRON_TIME).to_owned();
    if !last.is_empty() {
        cron["status"]["lastExecutionTimestamp"] = json!(last);
    }
}

/// `createImportDataVolume`.
fn create_import(app: &App, cron: &mut Value, ns: &str, name: &str, ds_name: &str, digest: &str) {
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return;
    };
    let Some(suffix) = hex.get(..DIGEST_SUFFIX) else {
        return;
    };
    let dv_name = format!("{ds_name}-{suffix}");
    cron["status"]["currentImports"] = json!([{"DataVolumeName": dv_name, "Digest": digest}]);
    if app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, &dv_name))
        .is_some()
    {
        return;
    }
    let mut spec = cron
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or(json!({}));
    if let Some(url) = spec
        .pointer("/source/registry/url")
        .and_then(Value::as_str)
        .map(str::to_owned)
    {
        spec["source"]["registry"]["url"] = json!(pinned(&url, digest));
    }
    let dv = json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": dv_name, "namespace": ns,
            "labels": {CRON_LABEL: name},
            "annotations": {ANN_IMMEDIATE: "true"}},
        "spec": spec,
    });
    let _ = app.store.create(GROUP, "datavolumes", dv);
}

/// `updateDataSource`.
fn update_data_source(app: &App, cron: &Value, ns: &str, name: &str, ds_name: &str) {
    let key = Key::new(GROUP, "datasources", ns, ds_name);
    let ds = match app.store.get(&key) {
        Some(ds) => ds,
        None => {
            let ds = json!({
                "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
                "metadata": {"name": ds_name, "namespace": ns, "labels": {CRON_LABEL: name}},
                "spec": {"source": {}},
            });
            match app.store.create(GROUP, "datasources", ds) {
                Ok(ds) => ds,
                Err(_) => return,
            }
        }
    };
    if label(&ds, CRON_LABEL).is_empty() {
        return;
    }
    let Some(pvc) = cron.pointer("/status/lastImportedPVC").cloned() else {
        return;
    };
    if ds.pointer("/spec/source/pvc") != Some(&pvc) || label(&ds, CRON_LABEL) != name {
        app.store.modify(&key, |o| {
            o["metadata"]["labels"][CRON_LABEL] = json!(name);
            o["spec"]["source"] = json!({"pvc": pvc});
        });
    }
}

/// `garbageCollectOldImports` / `garbageCollectPVCs`.
fn garbage_collect(app: &App, cron: &Value, ns: &str, name: &str) {
    let policy = cron
        .pointer("/spec/garbageCollect")
        .and_then(Value::as_str)
        .unwrap_or("Outdated");
    if policy != "Outdated" {
        return;
    }
    let keep = cron
        .pointer("/spec/importsToKeep")
        .and_then(Value::as_i64)
        .filter(|n| *n >= 0)
        .map_or(DEFAULT_IMPORTS_TO_KEEP, |n| n as usize);
    let (pvcs, _) = app.store.list("", "persistentvolumeclaims", Some(ns));
    let mut ours: Vec<Value> = pvcs
        .into_iter()
        .filter(|p| label(p, CRON_LABEL) == name)
        .collect();
    if ours.len() <= keep {
        return;
    }
    ours.sort_by(|a, b| annotation(b, ANN_LAST_USE_TIME).cmp(annotation(a, ANN_LAST_USE_TIME)));
    for pvc in &ours[keep..] {
        let pvc_name = meta_str(pvc, "name");
        // deleteDvPvc: the DataVolume (its PVC goes with it), else the PVC.
        let dv = Key::new(GROUP, "datavolumes", ns, pvc_name);
        if app.store.delete(&dv, Propagation::Cascade).is_none() {
            app.store.delete(
                &Key::new("", "persistentvolumeclaims", ns, pvc_name),
                Propagation::Cascade,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tagged_reference_is_pinned_to_the_digest_without_its_tag() {
        let d = "sha256:0123";
        assert_eq!(
            pinned("docker://quay.io/containerdisks/fedora:41", d),
            "docker://quay.io/containerdisks/fedora@sha256:0123"
        );
        assert_eq!(
            pinned("docker://registry.local:5000/os/debian", d),
            "docker://registry.local:5000/os/debian@sha256:0123"
        );
    }

    #[test]
    fn the_stand_in_digest_is_the_sha256_of_the_reference() {
        // `printf %s docker://quay.io/containerdisks/fedora:41 | sha256sum`
        assert_eq!(
            digest_of("docker://quay.io/containerdisks/fedora:41"),
            format!(
                "sha256:{}",
                "69fa4dfa9f6dd9bf51597fbfb98c2784fe19401d3fd44772f79782ba7b3484a9"
            )
        );
    }
}
