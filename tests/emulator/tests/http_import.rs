//! The importers download URLs on this machine for real (`http_import.rs`): a DataVolume or a
//! Deckhouse image from a local HTTP server shows the bytes read as progress, holds the
//! converted data when done, and fails as each platform's importer and controller do on a 404,
//! a bad checksum or data that is not an image. Checksums and the converted data are computed
//! here with coreutils and qemu-img, not by the emulator's code.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kubevm_emulator::ServeFlavor;
use kubevm_emulator::core::file_server::FileServer;
use serde_json::{Value, json};

use crate::common;

fn api(
    client: &kube::Client,
    group: &str,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let version = if group == "cdi.kubevirt.io" {
        "v1beta1"
    } else {
        "v1alpha2"
    };
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

async fn create(api: &Api<DynamicObject>, object: Value) -> Value {
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    serde_json::to_value(api.create(&PostParams::default(), &object).await.unwrap()).unwrap()
}

/// Polls `name` until `done` holds (20 s at most); the last state.
async fn until(api: &Api<DynamicObject>, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let object = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
        if done(&object) {
            return object;
        }
        assert!(Instant::now() < deadline, "never reached: {object}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn condition<'a>(obj: &'a Value, type_: &str) -> &'a Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A small qcow2 (4 MiB virtual) with a recognisable pattern written into it.
fn test_image(dir: &Path) -> PathBuf {
    let raw = dir.join("src.raw");
    let mut data = vec![0u8; 4 << 20];
    for (i, b) in data.iter_mut().enumerate().take(1 << 20) {
        *b = (i % 251) as u8;
    }
    std::fs::write(&raw, &data).unwrap();
    let qcow2 = dir.join("image.qcow2");
    run(Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2));
    qcow2
}

fn digest(tool: &str, path: &Path) -> String {
    run(Command::new(tool).arg(path))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Whether `a`'s first `n` bytes equal `b`'s (cmp).
fn same_prefix(a: &Path, b: &Path, n: u64) -> bool {
    Command::new("cmp")
        .arg("-n")
        .arg(n.to_string())
        .arg(a)
        .arg(b)
        .status()
        .unwrap()
        .success()
}

#[tokio::test]
async fn a_data_volume_downloads_its_url_with_progress_and_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let image = test_image(dir.path());
    let size = std::fs::metadata(&image).unwrap().len();
    let server = FileServer::start();
    server.add("fedora.qcow2", &image);
    server.hold_after("fedora.qcow2", size / 2);
    let (emu, client) = common::start_importing(ServeFlavor::KubeVirt, "kubevirt.yaml").await;
    let dvs = api(
        &client,
        "cdi.kubevirt.io",
        "DataVolume",
        "datavolumes",
        Some("default"),
    );
    let dv = |name: &str, url: String, checksum: Option<String>| {
        let mut http = json!({"url": url});
        if let Some(c) = checksum {
            http["checksum"] = json!(c);
        }
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name, "namespace": "default",
                "annotations": {"cdi.kubevirt.io/storage.bind.immediate.requested": "true"}},
            "spec": {"source": {"http": http},
                     "storage": {"resources": {"requests": {"storage": "16Mi"}}}}})
    };
    let sha = digest("sha256sum", &image);
    common::create(
        &dvs,
        dv(
            "fedora",
            server.url("fedora.qcow2"),
            Some(format!("sha256:{sha}")),
        ),
    )
    .await;
    // Half the body read: progress between 0 and 100, as CDI's importer reports it.
    let mid = until(&dvs, "fedora", |o| {
        o["status"]["phase"] == "ImportInProgress"
            && o["status"]["progress"].as_str().is_some_and(|p| {
                let p: f64 = p.trim_end_matches('%').parse().unwrap_or(0.0);
                p > 0.0 && p < 100.0
            })
    })
    .await;
    assert_eq!(mid["status"]["progress"], "50.0%", "{mid}");
    server.release("fedora.qcow2");
    let done = until(&dvs, "fedora", |o| o["status"]["phase"] == "Succeeded").await;
    assert_eq!(done["status"]["progress"], "100.0%");
    assert_eq!(condition(&done, "Ready")["status"], "True");
    // The PVC holds the image converted to raw (qemu-img's conversion), filled to the volume.
    let expected = dir.path().join("expected.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-q", "-O", "raw"])
        .arg(&image)
        .arg(&expected));
    let data = emu
        .uploaded_data("default", "fedora")
        .expect("the PVC's data");
    assert!(same_prefix(&data, &expected, 4 << 20));
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 16 << 20);

    // A 404: the importer exits, is restarted again and again with its message.
    create(&dvs, dv("gone", server.url("gone.qcow2"), None)).await;
    let failing = until(&dvs, "gone", |o| {
        o["status"]["restartCount"].as_i64().unwrap_or(0) >= 2
    })
    .await;
    assert_eq!(failing["status"]["phase"], "ImportInProgress");
    let running = condition(&failing, "Running");
    assert_eq!(
        (running["status"].as_str(), running["reason"].as_str()),
        (Some("False"), Some("Error"))
    );
    assert_eq!(
        running["message"],
        "Unable to connect to http data source: expected status code 200, got 404. Status: 404 Not Found"
    );
    assert!(server.hits("gone.qcow2") >= 2);

    // A bad checksum is fatal: Failed, ChecksumError, once.
    let wrong = "0".repeat(64);
    common::create(
        &dvs,
        dv(
            "tampered",
            server.url("fedora.qcow2"),
            Some(format!("sha256:{wrong}")),
        ),
    )
    .await;
    let failed = until(&dvs, "tampered", |o| o["status"]["phase"] == "Failed").await;
    let running = condition(&failed, "Running");
    assert_eq!(running["reason"], "ChecksumError");
    assert_eq!(
        running["message"].as_str().unwrap(),
        format!(
            "Unable to process data: checksum validation failed: checksum mismatch: expected sha256:{wrong}, calculated sha256:{sha}"
        )
    );
    assert!(emu.uploaded_data("default", "tampered").is_none());
}

#[tokio::test]
async fn deckhouse_images_download_their_url_and_fail_with_the_importers_message() {
    let dir = tempfile::tempdir().unwrap();
    let image = test_image(dir.path());
    let size = std::fs::metadata(&image).unwrap().len();
    // Not an image: a qcow2 header with nothing valid after it.
    let broken = dir.path().join("broken.qcow2");
    let mut bytes = b"QFI\xfb".to_vec();
    bytes.extend(std::iter::repeat_n(0xffu8, 4096));
    std::fs::write(&broken, bytes).unwrap();
    let server = FileServer::start();
    server.add("ubuntu.qcow2", &image);
    server.add("broken.qcow2", &broken);
    server.hold_after("ubuntu.qcow2", size / 4);
    let (emu, client) = common::start_importing(ServeFlavor::Deckhouse, "deckhouse.yaml").await;
    let dh = "virtualization.deckhouse.io";
    let vis = api(
        &client,
        dh,
        "VirtualImage",
        "virtualimages",
        Some("default"),
    );
    let cvis = api(
        &client,
        dh,
        "ClusterVirtualImage",
        "clustervirtualimages",
        None,
    );
    let vi = |name: &str, http: Value| {
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualImage",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"storage": "ContainerRegistry", "dataSource": {"type": "HTTP", "http": http}}})
    };
    let md5 = digest("md5sum", &image);
    common::create(
        &vis,
        vi(
            "ubuntu",
            json!({"url": server.url("ubuntu.qcow2"), "checksum": {"md5": md5}}),
        ),
    )
    .await;
    let mid = until(&vis, "ubuntu", |o| o["status"]["progress"] == "25%").await;
    assert_eq!(mid["status"]["phase"], "Provisioning");
    assert_eq!(condition(&mid, "Ready")["reason"], "Provisioning");
    server.release("ubuntu.qcow2");
    let ready = until(&vis, "ubuntu", |o| o["status"]["phase"] == "Ready").await;
    assert_eq!(ready["status"]["format"], "qcow2");
    assert_eq!(ready["status"]["size"]["storedBytes"], size.to_string());
    assert_eq!(
        ready["status"]["size"]["unpackedBytes"],
        (4u64 << 20).to_string()
    );
    let uid = ready["metadata"]["uid"].as_str().unwrap();
    let expected = dir.path().join("expected.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-q", "-O", "raw"])
        .arg(&image)
        .arg(&expected));
    let data = emu.uploaded_image(uid).expect("DVCR's copy");
    assert!(same_prefix(&data, &expected, 4 << 20));

    // A bad checksum: Failed, ProvisioningFailed, the stat service's wording of the
    // importer's report.
    let wrong = "0".repeat(64);
    let made = create(
        &vis,
        vi(
            "tampered",
            json!({"url": server.url("ubuntu.qcow2"), "checksum": {"sha256": wrong}}),
        ),
    )
    .await;
    let failed = until(&vis, "tampered", |o| o["status"]["phase"] == "Failed").await;
    let sha = digest("sha256sum", &image);
    let cond = condition(&failed, "Ready");
    assert_eq!(cond["reason"], "ProvisioningFailed");
    assert_eq!(
        cond["message"].as_str().unwrap(),
        format!(
            "Provisioning failed: Pod default/d8v-vi-importer-{} reported: sha256 sum mismatch: {wrong} != {sha}.",
            made["metadata"]["uid"].as_str().unwrap()
        )
    );

    // A 404 on a ClusterVirtualImage (its importer runs in the module's namespace).
    let made = create(
        &cvis,
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "ClusterVirtualImage",
        "metadata": {"name": "gone"},
        "spec": {"dataSource": {"type": "HTTP", "http": {"url": server.url("nothing.img")}}}}),
    )
    .await;
    let failed = until(&cvis, "gone", |o| o["status"]["phase"] == "Failed").await;
    assert_eq!(
        condition(&failed, "Ready")["message"].as_str().unwrap(),
        format!(
            "Provisioning failed: Pod d8-virtualization/d8v-cvi-importer-{} reported: error creating data source: error creating HTTP data source: expected status code 200, got 404. Status: 404 Not Found.",
            made["metadata"]["uid"].as_str().unwrap()
        )
    );
    // That pod is there, failing with the same error, in the module's namespace.
    let pod_name = format!(
        "d8v-cvi-importer-{}",
        made["metadata"]["uid"].as_str().unwrap()
    );
    let pod = emu
        .objects("", "pods", Some("d8-virtualization"))
        .into_iter()
        .find(|p| p["metadata"]["name"] == pod_name.as_str())
        .expect("the cluster image's importer pod");
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["kind"],
        "ClusterVirtualImage"
    );
    assert!(
        pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["message"]
            .as_str()
            .unwrap()
            .contains("404 Not Found"),
        "{pod}"
    );

    // Not an image: qemu-img's refusal, and the importer pod's log says it.
    common::create(
        &vis,
        vi("broken", json!({"url": server.url("broken.qcow2")})),
    )
    .await;
    let failed = until(&vis, "broken", |o| o["status"]["phase"] == "Failed").await;
    let message = condition(&failed, "Ready")["message"]
        .as_str()
        .unwrap()
        .to_string();
    let qemu = Command::new("qemu-img")
        .args(["info"])
        .arg(&broken)
        .output()
        .unwrap();
    assert!(!qemu.status.success());
    assert!(
        message.starts_with("Provisioning failed: Pod default/d8v-vi-importer-"),
        "{message}"
    );
    assert!(message.contains("qcow2"), "{message}");
}
