//! `kubectl vm upload` against the emulator's CDI upload proxy, checked by exporting the
//! volume again with `kubectl vm export`. Expected digests come from `qemu-img convert -O raw`
//! and `sha256sum`, never from the tool. The fixture's default storage class binds on first
//! consumer, so every upload here also shows that no consumer is needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use kubevm_emulator::kubevirt::upload::UploadFaults;

use crate::common::{Env, fails, stderr, stdout};
use crate::export::sha256_of;

const MIB: u64 = 1 << 20;

pub(crate) fn sh(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

/// A raw file of `size` bytes of pseudo-random data (no partition table: unknown format).
pub(crate) fn noise(path: &Path, size: u64) {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ size;
    let mut data = Vec::with_capacity(size as usize);
    while (data.len() as u64) < size {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.extend_from_slice(&state.to_le_bytes());
    }
    data.truncate(size as usize);
    std::fs::write(path, data).unwrap();
}

/// A qcow2 of `size` made by qemu-img from random data (holes left where qemu-img finds zeros).
pub(crate) fn qcow2(dir: &Path, size: u64) -> PathBuf {
    let raw = dir.join("src.raw");
    noise(&raw, size);
    let qcow2 = dir.join("disk.qcow2");
    sh(Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2));
    // A zeroed stretch, so the image is sparse.
    sh(Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", "write -z 2M 3M"])
        .arg(&qcow2));
    std::fs::remove_file(raw).unwrap();
    qcow2
}

/// A qcow2 of 1 GiB virtual size made by qemu-img: random data at the start, the middle and
/// the end of a sparse raw disk, holes elsewhere (the "1 GiB qcow2").
pub(crate) fn qcow2_gib(dir: &Path) -> PathBuf {
    use std::io::{Seek, SeekFrom, Write};
    let chunk = dir.join("chunk.raw");
    noise(&chunk, 4 * MIB);
    let data = std::fs::read(&chunk).unwrap();
    std::fs::remove_file(&chunk).unwrap();
    let raw = dir.join("gib.raw");
    let mut f = std::fs::File::create(&raw).unwrap();
    f.set_len(1 << 30).unwrap();
    for at in [0, 500 * MIB + 4321, (1 << 30) - 4 * MIB] {
        f.seek(SeekFrom::Start(at)).unwrap();
        f.write_all(&data).unwrap();
    }
    drop(f);
    let qcow2 = dir.join("gib.qcow2");
    sh(Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2));
    std::fs::remove_file(raw).unwrap();
    qcow2
}

/// sha256 of `qemu-img convert -O raw` of `image` (to a file, then sha256sum).
pub(crate) fn reference(image: &Path, dir: &Path) -> String {
    let out = dir.join("reference.raw");
    sh(Command::new("qemu-img")
        .args(["convert", "-q", "-O", "raw"])
        .arg(image)
        .arg(&out));
    let sum = sha256_of(&out);
    std::fs::remove_file(out).unwrap();
    sum
}

/// Uploads, then exports the PVC and returns (upload stderr, sha256 of the export).
fn upload_and_export(env: &Env, file: &Path, target: &str, extra: &[&str]) -> (String, String) {
    let mut args = vec!["upload", file.to_str().unwrap(), target];
    args.extend_from_slice(extra);
    let out = env.vm(&args);
    let err = stderr(&out);
    assert!(out.status.success(), "upload: {err}");
    let name = target.rsplit('/').next().unwrap();
    let exported = env.dir.path().join(format!("{name}.img"));
    let pvc = format!("pvc/{name}");
    let out = env.vm(&["export", &pvc, "-o", exported.to_str().unwrap()]);
    assert!(out.status.success(), "export: {}", stderr(&out));
    (err, sha256_of(&exported))
}

fn data_volumes(env: &Env) -> String {
    let out = env.kubectl(&["get", "datavolumes", "-A", "-o", "name"]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn a_qcow2_uploaded_exports_as_qemu_img_converts_it() {
    let env = Env::kubevirt();
    let image = qcow2_gib(env.dir.path());
    let want = reference(&image, env.dir.path());
    let (err, got) = upload_and_export(&env, &image, "dv/up-qcow2", &["-o", "name"]);
    assert_eq!(got, want);
    // The digest printed is the one of the file sent.
    assert!(
        err.contains(&format!("sha256:{}", sha256_of(&image))),
        "{err}"
    );
    assert!(err.contains("image: qcow2"), "{err}");
    // Labelled as ours, with CDI's immediate binding (WaitForFirstConsumer class).
    let out = env.kubectl(&["get", "dv", "up-qcow2", "-o", "json"]);
    let dv: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        dv["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kubectl-vm"
    );
    assert_eq!(
        dv["metadata"]["annotations"]["cdi.kubevirt.io/storage.bind.immediate.requested"],
        "true"
    );
    assert_eq!(dv["status"]["phase"], "Succeeded");
}

#[test]
fn an_iso_and_an_xz_raw_upload_byte_for_byte() {
    let env = Env::kubevirt();
    let dir = env.dir.path();
    let content = dir.join("iso-content");
    std::fs::create_dir(&content).unwrap();
    noise(&content.join("payload.bin"), 5 * MIB);
    let iso = dir.join("install.iso");
    sh(Command::new("genisoimage")
        .args(["-quiet", "-o"])
        .arg(&iso)
        .arg(&content));
    let (err, got) = upload_and_export(&env, &iso, "dv/up-iso", &[]);
    assert_eq!(got, sha256_of(&iso));
    assert!(err.contains("image: iso"), "{err}");

    let raw = dir.join("disk.raw");
    noise(&raw, 12 * MIB);
    let want = sha256_of(&raw);
    sh(Command::new("xz").args(["-0", "-T1"]).arg(&raw));
    let (err, got) = upload_and_export(&env, &dir.join("disk.raw.xz"), "dv/up-xz", &[]);
    assert_eq!(got, want);
    assert!(err.contains("image: xz"), "{err}");
}

#[test]
fn bad_inputs_are_one_line_and_leave_nothing() {
    let env = Env::kubevirt();
    let dir = env.dir.path();
    let image = qcow2(dir, 8 * MIB);
    let image = image.to_str().unwrap();
    let blob = dir.join("blob.bin");
    noise(&blob, 2 * MIB);
    let blob = blob.to_str().unwrap();
    let missing = dir.join("missing.qcow2");
    let before = data_volumes(&env);
    for (args, want) in [
        (
            vec!["upload", missing.to_str().unwrap(), "dv/a"],
            "cannot read",
        ),
        (vec!["upload", blob, "dv/b"], "unknown image format"),
        (
            vec!["upload", image, "dv/c", "--size", "4Mi"],
            "smaller than the image's virtual size",
        ),
        (
            vec!["upload", image, "vi/d"],
            "needs Deckhouse virtualization",
        ),
        (
            vec!["upload", image, "dv/Bad_Name"],
            "invalid upload target",
        ),
        (
            vec!["upload", image, "dv/e", "--uploadproxy-url", "http://x"],
            "must be https",
        ),
    ] {
        let err = fails(&env, &args, 2);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert_eq!(data_volumes(&env), before);
    // `--format raw` takes the blob.
    let out = env.vm(&["upload", blob, "dv/blob", "--format", "raw"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_cut_connection_is_retried_from_the_beginning() {
    let env = Env::kubevirt();
    let image = qcow2(env.dir.path(), 24 * MIB);
    let want = reference(&image, env.dir.path());
    env.emulator.set_upload_faults(UploadFaults {
        cut_after: vec![3 * MIB],
        ..Default::default()
    });
    let (err, got) = upload_and_export(&env, &image, "dv/cut", &[]);
    assert!(err.contains("retry 1/5 from the beginning"), "{err}");
    assert_eq!(got, want);
    assert!(
        err.contains(&format!("sha256:{}", sha256_of(&image))),
        "{err}"
    );
    let size = std::fs::metadata(&image).unwrap().len();
    assert!(env.emulator.upload_bytes_received() > size);
}

#[test]
fn an_unreachable_proxy_is_reached_through_the_api_server() {
    let env = Env::kubevirt();
    // An address nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    env.emulator
        .set_upload_proxy_url(&format!("127.0.0.1:{port}"));
    let image = qcow2(env.dir.path(), 8 * MIB);
    let want = reference(&image, env.dir.path());
    let (err, got) = upload_and_export(&env, &image, "dv/via-api", &[]);
    assert!(err.contains("is not reachable"), "{err}");
    assert!(
        err.contains("port-forward to the upload proxy pod cdi/"),
        "{err}"
    );
    assert_eq!(got, want);
}

#[test]
fn a_name_taken_is_refused_and_kept() {
    let env = Env::kubevirt();
    let image = qcow2(env.dir.path(), 8 * MIB);
    let image = image.to_str().unwrap();
    env.emulator.put_object(serde_json::json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "theirs", "namespace": "default"},
        "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}},
        "status": {"phase": "Succeeded"}}));
    let out = env.vm(&["upload", image, "dv/theirs"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("already exists"), "{}", stderr(&out));
    assert!(data_volumes(&env).contains("datavolume.cdi.kubevirt.io/theirs"));
    // --no-create into a DataVolume that takes no upload: refused, not deleted.
    let out = env.vm(&[
        "upload",
        image,
        "dv/theirs",
        "--no-create",
        "--timeout",
        "3s",
    ]);
    assert!(!out.status.success());
    assert!(data_volumes(&env).contains("datavolume.cdi.kubevirt.io/theirs"));
}

/// The upload's result boots: `create --disk` of the uploaded DataVolume's PVC runs.
#[test]
fn a_vm_boots_from_the_uploaded_disk() {
    let env = Env::kubevirt();
    let image = qcow2(env.dir.path(), 8 * MIB);
    let out = env.vm(&["upload", image.to_str().unwrap(), "dv/boot-disk"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.vm(&[
        "create",
        "from-disk",
        "--disk",
        "boot-disk",
        "--wait",
        "--timeout",
        "2m",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.kubectl(&["get", "vmi", "from-disk", "-o", "json"]);
    let vmi: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(vmi["status"]["phase"], "Running", "{vmi}");
    assert!(
        vmi["spec"]["volumes"]
            .to_string()
            .contains("\"claimName\":\"boot-disk\""),
        "{vmi}"
    );
}

/// `--uploadproxy-url https://…`: the proxy's certificate is verified against the CA CDI
/// publishes (ConfigMap `cdi/cdi-uploadproxy-signer-bundle`, key `ca-bundle.crt`, besides the
/// system's roots); with another CA there the upload is refused in one line naming the proxy,
/// and `--insecure` skips the verification. CDIConfig's published address points nowhere, so
/// only the flag's address reaches the proxy directly.
#[test]
fn a_given_https_upload_proxy_is_verified_against_cdis_ca() {
    let env = Env::kubevirt();
    let url = env.emulator.upload_proxy_url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    env.emulator
        .set_upload_proxy_url(&format!("127.0.0.1:{dead}"));
    let image = env.dir.path().join("disk.raw");
    noise(&image, 2 * MIB);
    let want = sha256_of(&image);

    let (err, got) = upload_and_export(
        &env,
        &image,
        "dv/given",
        &["--uploadproxy-url", &url, "--format", "raw"],
    );
    assert!(
        err.contains(&format!("uploading to the upload proxy at {url}")),
        "{err}"
    );
    assert_eq!(got, want);

    // Another CA in CDI's bundle (made by openssl): the proxy's certificate is refused.
    let key = env.dir.path().join("other.key");
    let cert = env.dir.path().join("other.crt");
    sh(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=other-ca", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert));
    let pem = std::fs::read_to_string(&cert).unwrap();
    let patch = serde_json::json!({"data": {"ca-bundle.crt": pem}}).to_string();
    let out = env.kubectl(&[
        "patch",
        "configmap",
        "cdi-uploadproxy-signer-bundle",
        "-n",
        "cdi",
        "--type=merge",
        "-p",
        &patch,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = env.vm(&[
        "upload",
        image.to_str().unwrap(),
        "dv/wrong-ca",
        "--uploadproxy-url",
        &url,
        "--format",
        "raw",
    ]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let err = stderr(&out);
    let refusal: Vec<&str> = err.lines().filter(|l| l.starts_with("Error:")).collect();
    assert_eq!(refusal.len(), 1, "{err}");
    assert!(
        refusal[0].starts_with(&format!(
            "Error: the upload proxy at {url}: the upload proxy's certificate is not trusted: "
        )) && refusal[0].ends_with("(--insecure skips verification)"),
        "{err}"
    );
    assert_eq!(err.lines().last(), Some(refusal[0]), "{err}");

    // --insecure: not verified, uploaded.
    let (_, got) = upload_and_export(
        &env,
        &image,
        "dv/insecure",
        &["--uploadproxy-url", &url, "--insecure", "--format", "raw"],
    );
    assert_eq!(got, want);
}
