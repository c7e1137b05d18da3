//! The emulated DataImportCron controller (CDI `pkg/controller/dataimportcron-controller.go`):
//! on creation it imports at once into a DataVolume named from the source digest, points the
//! managed DataSource at its PVC, reports `lastImportedPVC`, `lastExecutionTimestamp` and the
//! `UpToDate` / `Progressing` conditions, and keeps `importsToKeep` of the cron's PVCs. The
//! digest expected is computed with `sha256sum` (the emulator's stand-in for the registry's).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};

use crate::common;

const URL: &str = "docker://quay.io/containerdisks/fedora:41";

fn api(
    client: &kube::Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(client.clone(), "default", &ar)
}

async fn until(api: &Api<DynamicObject>, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(o) = api.get_opt(name).await.unwrap() {
            let o = serde_json::to_value(o).unwrap();
            if done(&o) {
                return o;
            }
            assert!(Instant::now() < deadline, "never reached: {o}");
        }
        assert!(Instant::now() < deadline, "{name} never appeared");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// `printf %s TEXT | sha256sum`.
fn sha256sum(text: &str) -> String {
    use std::io::Write;
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

#[tokio::test]
async fn a_cron_imports_at_once_points_its_data_source_and_keeps_imports_to_keep() {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![common::fixture("kubevirt.yaml")],
        flavor: ServeFlavor::KubeVirt,
        import_step: Duration::from_millis(20),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = common::client(&emu).await;
    let pvcs = api(
        &client,
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
    );
    // Two older imports of this cron, the older one used first.
    for (name, used) in [
        ("fedora-old1", "2026-01-01T00:00:00Z"),
        ("fedora-old2", "2026-02-01T00:00:00Z"),
    ] {
        common::create(
            &pvcs,
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, "namespace": "default",
                    "labels": {"cdi.kubevirt.io/dataImportCron": "fedora-cron"},
                    "annotations": {"cdi.kubevirt.io/storage.import.lastUseTime": used}},
                "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .await;
    }
    let crons = api(
        &client,
        "cdi.kubevirt.io",
        "v1beta1",
        "DataImportCron",
        "dataimportcrons",
    );
    common::create(
        &crons,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
            "metadata": {"name": "fedora-cron", "namespace": "default"},
            "spec": {"schedule": "0 3 * * *", "managedDataSource": "fedora",
                "importsToKeep": 2, "garbageCollect": "Outdated",
                "template": {"spec": {"source": {"registry": {"url": URL}},
                    "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}}}),
    )
    .await;
    let digest = sha256sum(URL);
    let dv_name = format!("fedora-{}", &digest[..12]);
    let cron = until(&crons, "fedora-cron", |c| {
        condition(c, "UpToDate").is_some_and(|u| u["status"] == "True")
    })
    .await;
    assert_eq!(
        cron["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.sourceDesiredDigest"],
        format!("sha256:{digest}")
    );
    assert_eq!(
        cron["status"]["lastImportedPVC"],
        json!({"namespace": "default", "name": dv_name})
    );
    assert_eq!(
        cron["status"]["currentImports"],
        json!([{"DataVolumeName": dv_name, "Digest": format!("sha256:{digest}")}])
    );
    assert_eq!(cron["status"]["sourceFormat"], "pvc");
    assert_eq!(
        cron["status"]["lastExecutionTimestamp"],
        cron["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.lastCronTime"]
    );
    let up = condition(&cron, "UpToDate").unwrap();
    assert_eq!(up["reason"], "UpToDate");
    let progressing = condition(&cron, "Progressing").unwrap();
    assert_eq!(
        (
            progressing["status"].as_str(),
            progressing["reason"].as_str()
        ),
        (Some("False"), Some("NoImport"))
    );
    // The DataVolume: the template, its registry URL pinned to the digest without the tag.
    let dvs = api(
        &client,
        "cdi.kubevirt.io",
        "v1beta1",
        "DataVolume",
        "datavolumes",
    );
    let dv = until(&dvs, &dv_name, |_| true).await;
    assert_eq!(
        dv["spec"]["source"]["registry"]["url"],
        format!("docker://quay.io/containerdisks/fedora@sha256:{digest}")
    );
    assert_eq!(
        dv["metadata"]["labels"]["cdi.kubevirt.io/dataImportCron"],
        "fedora-cron"
    );
    // The managed DataSource, made by the cron, names the new PVC and is Ready.
    let sources = api(
        &client,
        "cdi.kubevirt.io",
        "v1beta1",
        "DataSource",
        "datasources",
    );
    let ds = until(&sources, "fedora", |d| {
        condition(d, "Ready").is_some_and(|r| r["status"] == "True")
    })
    .await;
    assert_eq!(
        ds["spec"]["source"]["pvc"],
        json!({"namespace": "default", "name": dv_name})
    );
    assert_eq!(
        ds["metadata"]["labels"]["cdi.kubevirt.io/dataImportCron"],
        "fedora-cron"
    );
    // importsToKeep 2: the new import and the most recently used old one stay.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut names: Vec<String> = pvcs
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|p| {
                p.metadata.labels.as_ref().is_some_and(|l| {
                    l.get("cdi.kubevirt.io/dataImportCron").map(String::as_str)
                        == Some("fedora-cron")
                })
            })
            .map(|p| p.metadata.name.unwrap())
            .collect();
        names.sort();
        if names == [dv_name.clone(), "fedora-old2".to_owned()] {
            break;
        }
        assert!(Instant::now() < deadline, "{names:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The schedule fires on the emulator's cron clock (moved by the test, no waiting): a poll
/// that finds the same digest imports nothing; a new digest is a new DataVolume, the
/// DataSource repointed at it, and with `importsToKeep: 1` the older import collected, as
/// CDI's poller and `garbageCollectOldImports` do. Before the schedule fires a new digest
/// changes nothing.
#[tokio::test]
async fn the_schedule_firing_reimports_a_new_digest_and_collects_the_old_import() {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![common::fixture("kubevirt.yaml")],
        flavor: ServeFlavor::KubeVirt,
        import_step: Duration::from_millis(20),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = common::client(&emu).await;
    let crons = api(
        &client,
        "cdi.kubevirt.io",
        "v1beta1",
        "DataImportCron",
        "dataimportcrons",
    );
    let sources = api(
        &client,
        "cdi.kubevirt.io",
        "v1beta1",
        "DataSource",
        "datasources",
    );
    let dvs = api(
        &client,
        "cdi.kubevirt.io",
        "v1beta1",
        "DataVolume",
        "datavolumes",
    );
    common::create(
        &crons,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
            "metadata": {"name": "fedora-cron", "namespace": "default"},
            "spec": {"schedule": "0 3 * * *", "managedDataSource": "fedora",
                "importsToKeep": 1, "garbageCollect": "Outdated",
                "template": {"spec": {"source": {"registry": {"url": URL}},
                    "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}}}),
    )
    .await;
    let first = format!("fedora-{}", &sha256sum(URL)[..12]);
    let cron = until(&crons, "fedora-cron", |c| {
        condition(c, "UpToDate").is_some_and(|u| u["status"] == "True")
    })
    .await;
    let polled = |c: &Value| {
        c["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.lastCronTime"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    let t0 = polled(&cron);
    let dv_names = || async {
        let mine =
            kube::api::ListParams::default().labels("cdi.kubevirt.io/dataImportCron=fedora-cron");
        let mut names: Vec<String> = dvs
            .list(&mine)
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|d| d.metadata.name)
            .collect();
        names.sort();
        names
    };

    // A new digest, but the schedule has not fired: nothing changes.
    let new = sha256sum("quay.io/containerdisks/fedora:41 rebuilt");
    emu.set_registry_digest(URL, &format!("sha256:{new}"));
    let cron = until(&crons, "fedora-cron", |_| true).await;
    assert_eq!(polled(&cron), t0);
    assert_eq!(dv_names().await, vec![first.clone()]);

    // A day later the 03:00 run has happened: the new digest is imported and the DataSource
    // follows it; the first import goes (importsToKeep 1).
    emu.advance_cron_clock(86_400);
    let second = format!("fedora-{}", &new[..12]);
    let ds = until(&sources, "fedora", |d| {
        d["spec"]["source"]["pvc"]["name"] == second.as_str()
    })
    .await;
    assert_eq!(
        condition(&ds, "Ready").map(|r| r["status"].clone()),
        Some(json!("True"))
    );
    let cron = until(&crons, "fedora-cron", |c| {
        c["status"]["lastImportedPVC"]["name"] == second.as_str()
            && condition(c, "UpToDate").is_some_and(|u| u["status"] == "True")
    })
    .await;
    assert!(polled(&cron).ends_with("T03:00:00Z"), "{}", polled(&cron));
    assert_eq!(
        cron["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.sourceDesiredDigest"],
        format!("sha256:{new}")
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while dv_names().await != vec![second.clone()] {
        assert!(Instant::now() < deadline, "{:?}", dv_names().await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // The next day's run finds the same digest: nothing new is imported.
    emu.advance_cron_clock(86_400);
    let before = polled(&cron);
    let cron = until(&crons, "fedora-cron", |c| polled(c) != before).await;
    assert_eq!(cron["status"]["lastImportedPVC"]["name"], second.as_str());
    assert_eq!(dv_names().await, vec![second]);
}
