//! CDI's processing against qemu-img's own conversion, and the DataVolume upload phases.

use super::*;
use crate::ServeFlavor;
use crate::core::registry::Registry;
use std::time::Duration;

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

#[test]
fn qcow2_and_xz_become_what_qemu_img_convert_makes() {
    let dir = tempfile::tempdir().unwrap();
    let qcow2 = dir.path().join("d.qcow2");
    sh(Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&qcow2)
        .arg("8M"));
    sh(Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", "write -P 0x5a 1M 2M"])
        .arg(&qcow2));
    let reference = dir.path().join("ref.raw");
    sh(Command::new("qemu-img")
        .args(["convert", "-O", "raw"])
        .arg(&qcow2)
        .arg(&reference));
    let out = dir.path().join("out.img");
    process(&qcow2, &out, 8 << 20).unwrap();
    assert_eq!(sha256(&out), sha256(&reference));

    // xz of the raw: decompressed, same bytes.
    sh(Command::new("xz").args(["-k", "-0"]).arg(&reference));
    let out2 = dir.path().join("out2.img");
    process(&dir.path().join("ref.raw.xz"), &out2, 8 << 20).unwrap();
    assert_eq!(sha256(&out2), sha256(&reference));

    // A larger volume: resized to fill it (zeros after the image).
    let out3 = dir.path().join("out3.img");
    process(&qcow2, &out3, 9 << 20).unwrap();
    assert_eq!(std::fs::metadata(&out3).unwrap().len(), 9 << 20);

    // Too small: CDI's message.
    let err = process(&qcow2, &dir.path().join("out4.img"), 4 << 20).unwrap_err();
    assert!(
        err.contains(
            "Virtual image size 8388608 is larger than the reported available storage 4194304"
        ),
        "{err}"
    );
}

#[test]
fn upload_data_volume_phases_and_immediate_binding() {
    let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
    app.ensure_namespace("default");
    // WaitForFirstConsumer default class.
    app.put(json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "local-path", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer"}))
        .unwrap();
    let dv = |name: &str, immediate: bool| {
        let mut dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"source": {"upload": {}}, "storage": {"resources": {"requests": {"storage": "8Mi"}}}}});
        if immediate {
            dv["metadata"]["annotations"] = json!({IMMEDIATE_BIND: "true"});
        }
        app.store
            .create("cdi.kubevirt.io", "datavolumes", dv)
            .unwrap();
    };
    dv("waits", false);
    dv("now", true);
    let phase = |name: &str| {
        app.store
            .get(&Key::new("cdi.kubevirt.io", "datavolumes", "default", name))
            .unwrap()["status"]["phase"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    crate::core::controllers::reconcile_all(&app, false);
    assert_eq!(phase("waits"), "PendingPopulation");
    assert_eq!(phase("now"), "UploadScheduled");
    assert!(
        app.store
            .get(&Key::new("", "pods", "default", "cdi-upload-now"))
            .is_some()
    );
    assert_eq!(not_ready(&app, "default", "now").unwrap().0, 503);
    crate::core::controllers::reconcile_all(&app, true);
    assert_eq!(phase("now"), "UploadReady");
    assert_eq!(not_ready(&app, "default", "now"), None);
    // A token names its PVC; a PVC that is no upload target refuses.
    let token = app.uploads.issue("default", "waits");
    let (ns, pvc) = app.uploads.token_target(&token).unwrap();
    assert_eq!(not_ready(&app, &ns, &pvc).unwrap().0, 400);
    let (uid, _) = pvc_target(&app, "default", "now").unwrap();
    app.uploads.finish(&uid, Ok(()));
    crate::core::controllers::reconcile_all(&app, false);
    assert_eq!(phase("now"), "Succeeded");
    assert!(
        app.store
            .get(&Key::new("", "pods", "default", "cdi-upload-now"))
            .is_none()
    );
}
