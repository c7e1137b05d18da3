//! `kubectl vm upload` to Deckhouse VirtualDisks, VirtualImages and ClusterVirtualImages
//! against the emulator's uploader. Expected digests come from `qemu-img convert -O raw` and
//! `sha256sum`, never from the tool. A disk is checked by `kubectl vm export vd/NAME`; images
//! cannot be exported on Deckhouse (DataExport takes disks, snapshots and PVCs), so theirs are
//! read from where the emulator's DVCR keeps them.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::common::{BIN, Env, stderr, stdout};
use crate::export::sha256_of;
use crate::upload::{noise, qcow2, qcow2_gib, reference, sh};

const MIB: u64 = 1 << 20;

/// The emulator's ingress CA, trusted as a system CA (`SSL_CERT_FILE`), as curl would need it.
pub(crate) fn trusted(env: &Env) -> std::path::PathBuf {
    let ca = env.dir.path().join("ingress-ca.pem");
    std::fs::write(&ca, env.emulator.deckhouse_upload_ca_pem()).unwrap();
    ca
}

/// `kubectl-vm ARGS` trusting the emulator's ingress.
pub(crate) fn vm(env: &Env, args: &[&str]) -> Output {
    env.command(BIN)
        .env("SSL_CERT_FILE", trusted(env))
        .args(args)
        .output()
        .unwrap()
}

fn get(env: &Env, kind: &str, name: &str) -> Value {
    let out = env.kubectl(&["get", kind, name, "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn names(env: &Env, kinds: &str) -> String {
    let out = env.kubectl(&["get", kinds, "-A", "-o", "name"]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

/// Uploads `file` to `target` and returns the upload's stderr.
fn upload(env: &Env, file: &Path, target: &str, extra: &[&str]) -> String {
    let mut args = vec!["upload", file.to_str().unwrap(), target];
    args.extend_from_slice(extra);
    let out = vm(env, &args);
    let err = stderr(&out);
    assert!(out.status.success(), "upload: {err}");
    err
}

/// sha256 of `kubectl vm export vd/NAME`.
fn exported_disk(env: &Env, name: &str) -> String {
    let file = env.dir.path().join(format!("{name}.img"));
    let out = env.vm(&[
        "export",
        &format!("vd/{name}"),
        "-o",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "export: {}", stderr(&out));
    let sum = sha256_of(&file);
    std::fs::remove_file(file).unwrap();
    sum
}

/// sha256 of the image DVCR holds for `kind/name`.
fn stored_image(env: &Env, kind: &str, name: &str) -> String {
    let obj = get(env, kind, name);
    let uid = obj["metadata"]["uid"].as_str().unwrap();
    sha256_of(&env.emulator.uploaded_image(uid).expect("the image's data"))
}

#[test]
fn a_qcow2_to_a_disk_an_image_and_a_cluster_image() {
    let env = Env::deckhouse();
    let dir = env.dir.path();
    let image = qcow2_gib(dir);
    let want = reference(&image, dir);
    let file_sum = sha256_of(&image);

    let out = vm(
        &env,
        &[
            "upload",
            image.to_str().unwrap(),
            "vd/up-disk",
            "-o",
            "name",
        ],
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        stdout(&out).trim(),
        "virtualdisk.virtualization.deckhouse.io/up-disk"
    );
    assert!(err.contains("computing the sha256"), "{err}");
    assert!(
        err.contains(&format!("sha256 (checked by the platform): {file_sum}")),
        "{err}"
    );
    assert!(
        err.contains("uploading to the external upload URL"),
        "{err}"
    );
    // The secret path is never printed.
    assert!(err.contains("/upload/…"), "{err}");
    let vd = get(&env, "virtualdisk", "up-disk");
    assert_eq!(vd["status"]["phase"], "Ready");
    assert_eq!(
        vd["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kubectl-vm"
    );
    assert_eq!(
        vd["spec"]["dataSource"]["upload"]["checksum"]["sha256"],
        file_sum
    );
    assert_eq!(exported_disk(&env, "up-disk"), want);

    upload(&env, &image, "vi/up-image", &[]);
    assert_eq!(
        get(&env, "virtualimage", "up-image")["status"]["phase"],
        "Ready"
    );
    assert_eq!(stored_image(&env, "virtualimage", "up-image"), want);

    upload(&env, &image, "cvi/up-cluster-image", &[]);
    assert_eq!(
        get(&env, "clustervirtualimage", "up-cluster-image")["status"]["phase"],
        "Ready"
    );
    assert_eq!(
        stored_image(&env, "clustervirtualimage", "up-cluster-image"),
        want
    );
}

#[test]
fn an_xz_raw_and_an_iso() {
    let env = Env::deckhouse();
    let dir = env.dir.path();
    let raw = dir.join("disk.raw");
    noise(&raw, 12 * MIB);
    let want = sha256_of(&raw);
    sh(Command::new("xz").args(["-0", "-T1"]).arg(&raw));
    // No --size: the platform sizes the disk from the unpacked image.
    let err = upload(&env, &dir.join("disk.raw.xz"), "vd/up-xz", &[]);
    assert!(err.contains("image: xz"), "{err}");
    assert_eq!(exported_disk(&env, "up-xz"), want);

    let content = dir.join("iso-content");
    std::fs::create_dir(&content).unwrap();
    noise(&content.join("payload.bin"), 3 * MIB);
    let iso = dir.join("install.iso");
    sh(Command::new("genisoimage")
        .args(["-quiet", "-o"])
        .arg(&iso)
        .arg(&content));
    let err = upload(&env, &iso, "vi/up-iso", &[]);
    assert!(err.contains("image: iso"), "{err}");
    assert_eq!(
        stored_image(&env, "virtualimage", "up-iso"),
        sha256_of(&iso)
    );
}

#[test]
fn an_unreachable_ingress_goes_through_the_api_server() {
    let env = Env::deckhouse();
    // An address nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    env.emulator
        .set_deckhouse_upload_base(&format!("https://127.0.0.1:{port}"));
    let image = qcow2(env.dir.path(), 8 * MIB);
    let want = reference(&image, env.dir.path());
    let err = upload(&env, &image, "vd/via-api", &[]);
    assert!(err.contains("is not reachable"), "{err}");
    assert!(
        err.contains("by a port-forward to the uploader pod default/d8v-vd-uploader-"),
        "{err}"
    );
    assert_eq!(exported_disk(&env, "via-api"), want);
    // A ClusterVirtualImage's uploader runs in d8-virtualization.
    let err = upload(&env, &image, "cvi/via-api", &[]);
    assert!(
        err.contains("uploader pod d8-virtualization/d8v-cvi-uploader-"),
        "{err}"
    );
    assert_eq!(stored_image(&env, "clustervirtualimage", "via-api"), want);
}

#[test]
fn no_create_uploads_into_an_object_waiting_for_it_and_shows_the_platforms_failure() {
    let env = Env::deckhouse();
    let dir = env.dir.path();
    let qcow2_file = qcow2(dir, 8 * MIB);
    let want = reference(&qcow2_file, dir);
    let manifest = dir.join("objects.yaml");
    let wrong = "0".repeat(64);
    let disk = json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
        "metadata": {"name": "theirs", "namespace": "default"},
        "spec": {"dataSource": {"type": "Upload"}}});
    let image = json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualImage",
        "metadata": {"name": "wrong-sum", "namespace": "default"},
        "spec": {"storage": "ContainerRegistry",
                 "dataSource": {"type": "Upload", "upload": {"checksum": {"sha256": wrong}}}}});
    // JSON documents are YAML documents.
    std::fs::write(&manifest, format!("{disk}\n---\n{image}\n")).unwrap();
    let out = env.kubectl(&["create", "-f", manifest.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));

    upload(&env, &qcow2_file, "vd/theirs", &["--no-create"]);
    assert_eq!(exported_disk(&env, "theirs"), want);
    // Ready now: a second --no-create is refused in one line, and the disk stays.
    let out = vm(
        &env,
        &[
            "upload",
            qcow2_file.to_str().unwrap(),
            "vd/theirs",
            "--no-create",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    // One error line, after the line saying what the file is.
    assert!(
        err.trim()
            .lines()
            .last()
            .unwrap()
            .ends_with("vd/theirs is not waiting for an upload (phase Ready)"),
        "{err}"
    );
    // Without --no-create the name is taken.
    let out = vm(&env, &["upload", qcow2_file.to_str().unwrap(), "vd/theirs"]);
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    assert_eq!(
        get(&env, "virtualdisk", "theirs")["status"]["phase"],
        "Ready"
    );

    // The platform's checksum mismatch, in its words (the image is the user's: it stays).
    let out = vm(
        &env,
        &[
            "upload",
            qcow2_file.to_str().unwrap(),
            "vi/wrong-sum",
            "--no-create",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    let line = format!(
        "vi/wrong-sum failed: sha256 sum mismatch: {wrong} != {}",
        sha256_of(&qcow2_file)
    );
    assert!(err.lines().last().unwrap().ends_with(&line), "{err}");
    assert_eq!(
        get(&env, "virtualimage", "wrong-sum")["status"]["phase"],
        "Failed"
    );
}

#[test]
fn bad_inputs_are_one_line_and_leave_nothing() {
    let env = Env::deckhouse();
    let dir = env.dir.path();
    let image = qcow2(dir, 8 * MIB);
    let image = image.to_str().unwrap();
    let kinds = "virtualdisks,virtualimages,clustervirtualimages";
    let before = names(&env, kinds);
    for (args, want) in [
        (
            vec!["upload", image, "vi/a", "--size", "1Gi"],
            "applies to vd/ only",
        ),
        (
            vec!["upload", image, "vd/b", "--size", "4Mi"],
            "smaller than the image's virtual size",
        ),
        (
            vec!["upload", image, "vd/c", "--volume-mode", "Block"],
            "DataVolume settings",
        ),
        (vec!["upload", image, "dv/d"], "needs KubeVirt's CDI"),
        (vec!["upload", "/nonexistent.qcow2", "vd/e"], "cannot read"),
    ] {
        let out = vm(&env, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    assert_eq!(names(&env, kinds), before);
}

/// The uploads' results boot: a VM from the uploaded disk and one from the uploaded image.
#[test]
fn a_vm_boots_from_what_was_uploaded() {
    let env = Env::deckhouse();
    let image = qcow2(env.dir.path(), 8 * MIB);
    upload(&env, &image, "vd/boot-disk", &[]);
    upload(&env, &image, "vi/boot-image", &[]);
    for (vm_name, source) in [
        ("from-disk", ["--disk", "boot-disk"]),
        ("from-image", ["--image", "vi/boot-image"]),
    ] {
        let mut args = vec!["create", vm_name, "--wait", "--timeout", "2m"];
        args.extend(source);
        let out = env.vm(&args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let vm = get(&env, "virtualmachines.virtualization.deckhouse.io", vm_name);
        assert_eq!(vm["status"]["phase"], "Running", "{vm}");
    }
}

/// A cut connection is retried from the beginning and the disk holds the right bytes; the
/// platform checks the digest of what arrived against the one the run computed.
#[test]
fn a_cut_connection_is_retried_from_the_beginning() {
    let env = Env::deckhouse();
    let image = qcow2(env.dir.path(), 24 * MIB);
    let want = reference(&image, env.dir.path());
    env.emulator
        .set_upload_faults(kubevm_emulator::kubevirt::upload::UploadFaults {
            cut_after: vec![3 * MIB],
            ..Default::default()
        });
    let before = env.emulator.upload_bytes_received();
    let err = upload(&env, &image, "vd/cut", &[]);
    assert!(err.contains("retry 1/5 from the beginning"), "{err}");
    assert!(
        err.contains(&format!("sha256:{}", sha256_of(&image))),
        "{err}"
    );
    let size = std::fs::metadata(&image).unwrap().len();
    assert!(env.emulator.upload_bytes_received() - before > size);
    assert_eq!(
        get(&env, "virtualdisk", "cut")["spec"]["dataSource"]["upload"]["checksum"]["sha256"],
        sha256_of(&image)
    );
    assert_eq!(exported_disk(&env, "cut"), want);
}

/// Bytes damaged on the way fail the platform's checksum: the run says so in the platform's
/// words and removes the disk it created, leaving nothing behind.
#[test]
fn a_checksum_mismatch_removes_what_the_run_created() {
    let env = Env::deckhouse();
    let image = qcow2(env.dir.path(), 8 * MIB);
    // What the uploader will receive: the file with one byte inverted.
    let mut damaged = std::fs::read(&image).unwrap();
    damaged[100_000] = !damaged[100_000];
    let damaged_file = env.dir.path().join("damaged.qcow2");
    std::fs::write(&damaged_file, damaged).unwrap();
    let kinds = "virtualdisks,virtualimages,clustervirtualimages,pods,services,secrets";
    let before = names(&env, kinds);
    env.emulator
        .set_upload_faults(kubevm_emulator::kubevirt::upload::UploadFaults {
            flip_byte_at: Some(100_000),
            ..Default::default()
        });
    let out = vm(&env, &["upload", image.to_str().unwrap(), "vd/damaged"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    let line = format!(
        "vd/damaged failed: sha256 sum mismatch: {} != {}",
        sha256_of(&image),
        sha256_of(&damaged_file)
    );
    assert!(err.lines().any(|l| l.ends_with(&line)), "{err}");
    assert!(
        !err.contains("retry"),
        "a failed checksum is not retried: {err}"
    );
    let out = env.kubectl(&["get", "virtualdisk", "damaged"]);
    assert!(stderr(&out).contains("NotFound"), "{}", stderr(&out));
    assert_eq!(names(&env, kinds), before);
}
