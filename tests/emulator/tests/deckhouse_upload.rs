//! Deckhouse uploads behave like deckhouse/virtualization's uploader
//! (`images/dvcr-artifact/pkg/uploader/uploader.go`, `pkg/controller/uploader/`): an object with
//! `dataSource.type: Upload` waits in `WaitForUserUpload` with `status.imageUploadURLs`, the
//! external URL takes `PUT`/`POST` of the file (anything else 404), the checksum in the spec is
//! checked over the bytes received (`<algo> sum mismatch: <expected> != <actual>`, phase
//! Failed), and the disk holds the image converted to raw. Checked with curl, sha256sum and
//! qemu-img as independent references.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::kubectl::kubectl_path;

use kubevm_emulator::{BlockingEmulator, Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};

const DH: &str = "virtualization.deckhouse.io";

fn start() -> (BlockingEmulator, tempfile::TempDir) {
    let emu = Emulator::start_blocking(EmulatorOptions {
        flavor: ServeFlavor::Deckhouse,
        import_step: Duration::from_millis(50),
        ..Default::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ingress.pem"),
        emu.deckhouse_upload_ca_pem(),
    )
    .unwrap();
    std::fs::write(dir.path().join("api.pem"), emu.ca_pem()).unwrap();
    emu.write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap();
    (emu, dir)
}

/// Creates `obj` through the API server (so the controllers reconcile it), as curl would.
fn create(emu: &BlockingEmulator, dir: &tempfile::TempDir, plural: &str, obj: Value) {
    let yaml: Value = yaml_serde::from_str(&emu.kubeconfig_yaml()).unwrap();
    let token = yaml["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "admin")
        .unwrap()["user"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let out = Command::new("curl")
        .args(["-sSf", "--cacert"])
        .arg(dir.path().join("api.pem"))
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args([
            "-H",
            "Content-Type: application/json",
            "-d",
            &obj.to_string(),
        ])
        .arg(if plural == "clustervirtualimages" {
            format!("{}/apis/{DH}/v1alpha2/{plural}", emu.url())
        } else {
            format!(
                "{}/apis/{DH}/v1alpha2/namespaces/default/{plural}",
                emu.url()
            )
        })
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn object(emu: &BlockingEmulator, plural: &str, name: &str) -> Value {
    let ns = (plural != "clustervirtualimages").then_some("default");
    emu.objects(DH, plural, ns)
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
        .unwrap_or(Value::Null)
}

fn wait_phase(emu: &BlockingEmulator, plural: &str, name: &str, phase: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = object(emu, plural, name);
        if o["status"]["phase"] == phase {
            return o;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never became {phase}: {o}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `curl -X METHOD [-T file] URL`: (status, body).
fn curl(dir: &tempfile::TempDir, method: &str, file: Option<&std::path::Path>, url: &str) -> u16 {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "-m",
        "30",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        method,
    ])
    .arg("--cacert")
    .arg(dir.path().join("ingress.pem"));
    if let Some(f) = file {
        cmd.arg("-T").arg(f);
    }
    let out = cmd.arg(url).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn sha256(path: &std::path::Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

fn qcow2(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let image = dir.path().join("disk.qcow2");
    let raw = dir.path().join("pattern.raw");
    // Non-zero content so that the conversion is visible.
    std::fs::write(
        &raw,
        (0..4u32 << 20).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    let out = Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&image)
        .output()
        .unwrap();
    assert!(out.status.success());
    image
}

#[test]
fn a_virtual_disk_takes_an_upload_with_its_checksum_and_holds_the_raw_image() {
    let (emu, dir) = start();
    let image = qcow2(&dir);
    let sum = sha256(&image);
    create(
        &emu,
        &dir,
        "virtualdisks",
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
        "metadata": {"name": "up", "namespace": "default"},
        "spec": {"persistentVolumeClaim": {"size": "4Mi"},
            "dataSource": {"type": "Upload", "upload": {"checksum": {"sha256": sum}}}}}),
    );
    let vd = wait_phase(&emu, "virtualdisks", "up", "WaitForUserUpload");
    assert_eq!(vd["status"]["conditions"][0]["reason"], "WaitForUserUpload");
    let external = vd["status"]["imageUploadURLs"]["external"]
        .as_str()
        .unwrap();
    let in_cluster = vd["status"]["imageUploadURLs"]["inCluster"]
        .as_str()
        .unwrap();
    assert!(external.starts_with("https://127.0.0.1:") && external.contains("/upload/"));
    assert!(in_cluster.starts_with("http://") && in_cluster.ends_with("/upload"));
    // The path is the secret; only POST and PUT upload.
    let (base, _) = external.rsplit_once('/').unwrap();
    assert_eq!(
        curl(&dir, "PUT", Some(&image), &format!("{base}/wrong")),
        404
    );
    assert_eq!(curl(&dir, "GET", None, external), 404);
    let code = curl(&dir, "PUT", Some(&image), external);
    if code != 200 {
        let failed = wait_phase(&emu, "virtualdisks", "up", "Failed");
        panic!("upload answered {code}: {}", failed["status"]["conditions"]);
    }
    let vd = wait_phase(&emu, "virtualdisks", "up", "Ready");
    let pvc = vd["status"]["target"]["persistentVolumeClaimName"]
        .as_str()
        .unwrap();
    let data = emu.uploaded_data("default", pvc).expect("the disk's data");
    // The reference: qemu-img's own conversion of the same file.
    let reference = dir.path().join("reference.raw");
    let out = Command::new("qemu-img")
        .args(["convert", "-q", "-f", "qcow2", "-O", "raw"])
        .arg(&image)
        .arg(&reference)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(sha256(&data), sha256(&reference));
}

#[test]
fn a_wrong_checksum_fails_the_image_with_the_uploaders_message() {
    let (emu, dir) = start();
    let image = qcow2(&dir);
    let wrong = "0".repeat(64);
    create(
        &emu,
        &dir,
        "virtualimages",
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualImage",
        "metadata": {"name": "img", "namespace": "default"},
        "spec": {"storage": "ContainerRegistry",
            "dataSource": {"type": "Upload", "upload": {"checksum": {"sha256": wrong}}}}}),
    );
    let vi = wait_phase(&emu, "virtualimages", "img", "WaitForUserUpload");
    let external = vi["status"]["imageUploadURLs"]["external"]
        .as_str()
        .unwrap();
    assert_eq!(curl(&dir, "POST", Some(&image), external), 500);
    let vi = wait_phase(&emu, "virtualimages", "img", "Failed");
    let ready = vi["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(
        ready["message"],
        format!("sha256 sum mismatch: {wrong} != {}", sha256(&image))
    );
}

/// sha256 of `qemu-img convert -O raw` of `image`.
fn reference(dir: &tempfile::TempDir, image: &std::path::Path) -> String {
    let reference = dir.path().join("reference.raw");
    let out = Command::new("qemu-img")
        .args(["convert", "-q", "-O", "raw"])
        .arg(image)
        .arg(&reference)
        .output()
        .unwrap();
    assert!(out.status.success());
    sha256(&reference)
}

/// A ClusterVirtualImage's uploader runs in `d8-virtualization` (upstream
/// `images/virtualization-artifact/pkg/controller/cvi/internal/source/upload.go`:
/// `supplements.NewGenerator(CVIShortName, name, controllerNamespace, uid)`); the image lands
/// in DVCR under `cvi/NAME`.
#[test]
fn a_cluster_virtual_image_takes_an_upload_through_its_uploader_in_d8_virtualization() {
    let (emu, dir) = start();
    let image = qcow2(&dir);
    create(
        &emu,
        &dir,
        "clustervirtualimages",
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "ClusterVirtualImage",
        "metadata": {"name": "golden"},
        "spec": {"dataSource": {"type": "Upload", "upload": {"checksum": {"sha256": sha256(&image)}}}}}),
    );
    let cvi = wait_phase(&emu, "clustervirtualimages", "golden", "WaitForUserUpload");
    let uid = cvi["metadata"]["uid"].as_str().unwrap();
    let pods = emu.objects("", "pods", Some("d8-virtualization"));
    assert!(
        pods.iter().any(|p| p["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("d8v-cvi-uploader-")),
        "{pods:?}"
    );
    let external = cvi["status"]["imageUploadURLs"]["external"]
        .as_str()
        .unwrap();
    assert_eq!(curl(&dir, "PUT", Some(&image), external), 200);
    let cvi = wait_phase(&emu, "clustervirtualimages", "golden", "Ready");
    assert_eq!(
        cvi["status"]["target"]["registryURL"],
        "dvcr.d8-virtualization.svc/cvi/golden:latest"
    );
    let data = emu.uploaded_image(uid).expect("the image's data");
    assert_eq!(sha256(&data), reference(&dir, &image));
}

/// The in-cluster URL is plain HTTP to the uploader Service (port 80 → the pod's 8444,
/// upstream `pkg/controller/uploader/uploader_service.go`): real kubectl port-forwards to the
/// pod the Service selects and curl uploads through it without TLS.
#[test]
fn the_in_cluster_url_reaches_the_uploader_pod_through_kubectl_port_forward() {
    let (emu, dir) = start();
    let image = qcow2(&dir);
    create(
        &emu,
        &dir,
        "virtualimages",
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualImage",
        "metadata": {"name": "inside", "namespace": "default"},
        "spec": {"storage": "ContainerRegistry", "dataSource": {"type": "Upload"}}}),
    );
    let vi = wait_phase(&emu, "virtualimages", "inside", "WaitForUserUpload");
    let in_cluster = vi["status"]["imageUploadURLs"]["inCluster"]
        .as_str()
        .unwrap();
    let ip = in_cluster
        .strip_prefix("http://")
        .and_then(|r| r.strip_suffix("/upload"))
        .unwrap();
    let service = emu
        .objects("", "services", Some("default"))
        .into_iter()
        .find(|s| s["spec"]["clusterIP"] == ip)
        .expect("a Service with the in-cluster URL's IP");
    assert_eq!(service["spec"]["ports"][0]["port"], 80);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], 8444);
    let selector = service["spec"]["selector"].as_object().unwrap();
    let pod = emu
        .objects("", "pods", Some("default"))
        .into_iter()
        .find(|p| {
            selector
                .iter()
                .all(|(k, v)| p["metadata"]["labels"][k.as_str()] == *v)
        })
        .expect("the uploader pod");
    let pod = pod["metadata"]["name"].as_str().unwrap();
    let mut child = Command::new(kubectl_path())
        .arg("--kubeconfig")
        .arg(dir.path().join("kubeconfig"))
        .args(["port-forward", &format!("pod/{pod}"), ":8444"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // "Forwarding from 127.0.0.1:40123 -> 8444"
    let line = lines.next().expect("kubectl printed nothing").unwrap();
    let local: u16 = line
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|r| r.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected kubectl output: {line}"));
    std::thread::spawn(move || for _ in lines {});
    let out = Command::new("curl")
        .args([
            "-sS",
            "-m",
            "30",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-T",
        ])
        .arg(&image)
        .arg(format!("http://127.0.0.1:{local}/upload"))
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{out:?}");
    let vi = wait_phase(&emu, "virtualimages", "inside", "Ready");
    let uid = vi["metadata"]["uid"].as_str().unwrap();
    let data = emu.uploaded_image(uid).expect("the image's data");
    assert_eq!(sha256(&data), reference(&dir, &image));
}

/// The fault switches reach the Deckhouse uploader: a cut connection fails that try only
/// (the next one is taken, as upstream's controller starts a new uploader pod), and damaged
/// bytes fail the checksum with the digest of what arrived.
#[test]
fn a_cut_connection_is_retried_and_damaged_bytes_fail_the_checksum() {
    let (emu, dir) = start();
    let image = qcow2(&dir);
    let sum = sha256(&image);
    for name in ["cut", "damaged"] {
        create(
            &emu,
            &dir,
            "virtualdisks",
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"persistentVolumeClaim": {"size": "4Mi"},
                "dataSource": {"type": "Upload", "upload": {"checksum": {"sha256": sum}}}}}),
        );
    }
    let url = |name: &str| {
        wait_phase(&emu, "virtualdisks", name, "WaitForUserUpload")["status"]["imageUploadURLs"]
            ["external"]
            .as_str()
            .unwrap()
            .to_string()
    };

    emu.set_upload_faults(kubevm_emulator::kubevirt::upload::UploadFaults {
        cut_after: vec![256 << 10],
        ..Default::default()
    });
    let cut = Command::new("curl")
        .args(["-sS", "-m", "30", "-o", "/dev/null", "-T"])
        .arg(&image)
        .arg("--cacert")
        .arg(dir.path().join("ingress.pem"))
        .arg(url("cut"))
        .output()
        .unwrap();
    assert!(!cut.status.success(), "the cut try succeeded");
    // The controller may have seen the upload start (Provisioning) before the cut; the
    // uploader that takes the next try puts the disk back to waiting.
    wait_phase(&emu, "virtualdisks", "cut", "WaitForUserUpload");
    assert_eq!(curl(&dir, "PUT", Some(&image), &url("cut")), 200);
    wait_phase(&emu, "virtualdisks", "cut", "Ready");

    let mut damaged = std::fs::read(&image).unwrap();
    damaged[4096] = !damaged[4096];
    let damaged_file = dir.path().join("damaged.qcow2");
    std::fs::write(&damaged_file, damaged).unwrap();
    emu.set_upload_faults(kubevm_emulator::kubevirt::upload::UploadFaults {
        flip_byte_at: Some(4096),
        ..Default::default()
    });
    assert_eq!(curl(&dir, "PUT", Some(&image), &url("damaged")), 500);
    let vd = wait_phase(&emu, "virtualdisks", "damaged", "Failed");
    let ready = vd["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(
        ready["message"],
        format!("sha256 sum mismatch: {sum} != {}", sha256(&damaged_file))
    );

    // The uploader's pod and Service belong to the disk: deleting it takes them along.
    let uid = vd["metadata"]["uid"].as_str().unwrap().to_string();
    let uploader = |plural: &str| {
        emu.objects("", plural, Some("default"))
            .into_iter()
            .filter(|o| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r["uid"] == uid.as_str()))
            })
            .count()
    };
    assert_eq!((uploader("pods"), uploader("services")), (1, 1));
    let out = Command::new(kubectl_path())
        .arg("--kubeconfig")
        .arg(dir.path().join("kubeconfig"))
        .args(["delete", "virtualdisk", "damaged"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!((uploader("pods"), uploader("services")), (0, 0));
}
