//! Images imported from a web server the test runs (the emulator's importers download
//! `http://127.0.0.1` URLs for real): the list shows the importer's real progress, the image
//! is Ready with the bytes the server sent (converted as qemu-img converts them) and boots a
//! VM; a bad checksum and a 404 end `image create` with the platform's own reason, as kubectl
//! reads it from the object. Checksums come from coreutils, never from the code under test.

use std::path::{Path, PathBuf};
use std::process::Command;

use kubevm_emulator::core::file_server::FileServer;
use serde_json::Value;

use crate::common::{Env, ok, stderr, table};
use crate::lifecycle::eventually;

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

fn row(list: &str, name: &str) -> Option<Vec<String>> {
    table(list)
        .into_iter()
        .find(|r| r.first().map(String::as_str) == Some(name))
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

fn digest(tool: &str, path: &Path) -> String {
    run(Command::new(tool).arg(path))
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// A small qcow2 (4 MiB virtual, 1 MiB of pattern) and its raw conversion by qemu-img.
fn test_image(dir: &Path) -> (PathBuf, PathBuf) {
    let raw = dir.join("src.raw");
    let mut data = vec![0u8; 4 << 20];
    for (i, b) in data.iter_mut().enumerate().take(1 << 20) {
        *b = (i % 253) as u8;
    }
    std::fs::write(&raw, &data).unwrap();
    let qcow2 = dir.join("image.qcow2");
    run(Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2));
    let expected = dir.join("expected.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-q", "-O", "raw"])
        .arg(&qcow2)
        .arg(&expected));
    (qcow2, expected)
}

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

fn ready_condition(obj: &Value, type_: &str) -> Value {
    obj["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
        .clone()
}

#[test]
fn kubevirt_image_from_a_local_server_shows_real_progress_then_boots_a_vm() {
    let dir = tempfile::tempdir().unwrap();
    let (image, expected) = test_image(dir.path());
    let size = std::fs::metadata(&image).unwrap().len();
    let server = FileServer::start();
    server.add("fedora.qcow2", &image);
    server.hold_after("fedora.qcow2", size / 2);
    let env = Env::kubevirt();
    let url = server.url("fedora.qcow2");
    let sha = digest("sha256sum", &image);
    let out = env.vm(&[
        "image",
        "create",
        "fedora",
        "--url",
        &url,
        "--checksum",
        &format!("sha256:{sha}"),
        "--size",
        "16Mi",
        "--no-wait",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The server holds the second half back: the importer has read half of it.
    eventually("half the body in the list", || {
        row(&ok(env.vm(&["image", "list"])), "fedora").is_some_and(|r| {
            r.get(5).map(String::as_str) == Some("ImportInProgress")
                && r.get(6).map(String::as_str) == Some("50.0%")
        })
    });
    server.release("fedora.qcow2");
    eventually("ready", || {
        row(&ok(env.vm(&["image", "list"])), "fedora")
            .is_some_and(|r| r.get(5).map(String::as_str) == Some("Ready"))
    });
    let r = row(&ok(env.vm(&["image", "list"])), "fedora").unwrap();
    assert_eq!(r[1..5], ["ds", url.as_str(), "raw", "16Mi"]);
    assert_eq!(server.hits("fedora.qcow2"), 1);
    // The PVC holds what the server sent, converted to raw.
    let data = env
        .emulator
        .uploaded_data("default", "fedora")
        .expect("the PVC's data");
    assert!(same_prefix(&data, &expected, 4 << 20));
    // A VM boots from it.
    let out = env.vm(&["create", "web2", "--image", "ds/fedora", "--timeout", "60s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    eventually("web2 runs", || {
        env.emulator
            .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
            .iter()
            .any(|o| o["metadata"]["name"] == "web2" && o["status"]["phase"] == "Running")
    });
}

#[test]
fn deckhouse_image_from_a_local_server_shows_real_progress_then_boots_a_vm() {
    let dir = tempfile::tempdir().unwrap();
    let (image, expected) = test_image(dir.path());
    let size = std::fs::metadata(&image).unwrap().len();
    let server = FileServer::start();
    server.add("debian.qcow2", &image);
    server.hold_after("debian.qcow2", size / 4);
    let env = Env::deckhouse();
    let url = server.url("debian.qcow2");
    let md5 = digest("md5sum", &image);
    let out = env.vm(&[
        "-n",
        "dev",
        "image",
        "create",
        "debian",
        "--url",
        &url,
        "--checksum",
        &format!("md5:{md5}"),
        "--no-wait",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    eventually("a quarter of the body in the list", || {
        row(&ok(env.vm(&["-n", "dev", "image", "list"])), "debian").is_some_and(|r| {
            r.get(5).map(String::as_str) == Some("Provisioning")
                && r.get(6).map(String::as_str) == Some("25%")
        })
    });
    server.release("debian.qcow2");
    // `image get --wait` ... waits with the platform's progress; here the row turns Ready.
    eventually("ready", || {
        row(&ok(env.vm(&["-n", "dev", "image", "list"])), "debian")
            .is_some_and(|r| r.get(5).map(String::as_str) == Some("Ready"))
    });
    let vi = kubectl_json(&env, &["-n", "dev", "get", "virtualimage", "debian"]);
    assert_eq!(vi["status"]["format"], "qcow2");
    assert_eq!(vi["status"]["size"]["storedBytes"], size.to_string());
    let r = row(&ok(env.vm(&["-n", "dev", "image", "list"])), "debian").unwrap();
    assert_eq!(r[1..4], ["vi", url.as_str(), "qcow2"]);
    let data = env
        .emulator
        .uploaded_image(vi["metadata"]["uid"].as_str().unwrap())
        .expect("DVCR's copy");
    assert!(same_prefix(&data, &expected, 4 << 20));
    let out = env.vm(&[
        "-n",
        "dev",
        "create",
        "deb1",
        "--image",
        "vi/debian",
        "--timeout",
        "60s",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    eventually("deb1 runs", || {
        kubectl_json(&env, &["-n", "dev", "get", "virtualmachine", "deb1"])["status"]["phase"]
            == "Running"
    });
}

#[test]
fn a_bad_checksum_and_a_404_end_with_the_platforms_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (image, _) = test_image(dir.path());
    let server = FileServer::start();
    server.add("f.qcow2", &image);
    let sha = digest("sha256sum", &image);
    let wrong = "0".repeat(64);

    let env = Env::kubevirt();
    let out = env.vm(&[
        "image",
        "create",
        "tampered",
        "--url",
        &server.url("f.qcow2"),
        "--checksum",
        &format!("sha256:{wrong}"),
        "--size",
        "16Mi",
        "--timeout",
        "30s",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // CDI's account, read with kubectl: the DataVolume Failed, Running reason ChecksumError.
    let dv = kubectl_json(&env, &["get", "datavolume", "tampered"]);
    assert_eq!(dv["status"]["phase"], "Failed");
    let running = ready_condition(&dv, "Running");
    assert_eq!(running["reason"], "ChecksumError");
    let message = running["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("expected sha256:{wrong}, calculated sha256:{sha}")),
        "{message}"
    );
    assert!(
        stderr(&out).contains(&format!("the import of image tampered failed: {message}")),
        "{}",
        stderr(&out)
    );
    let out = env.vm(&[
        "image",
        "create",
        "gone",
        "--url",
        &server.url("gone.qcow2"),
        "--timeout",
        "30s",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let dv = kubectl_json(&env, &["get", "datavolume", "gone"]);
    let running = ready_condition(&dv, "Running");
    assert_eq!(running["reason"], "Error");
    let message = running["message"].as_str().unwrap();
    assert!(
        message.ends_with("expected status code 200, got 404. Status: 404 Not Found"),
        "{message}"
    );
    assert!(
        stderr(&out).contains(&format!("the import of image gone fails: {message}")),
        "{}",
        stderr(&out)
    );
    assert!(server.hits("gone.qcow2") >= 1);

    let env = Env::deckhouse();
    for (name, url, checksum, says) in [
        (
            "tampered",
            server.url("f.qcow2"),
            Some(format!("sha256:{wrong}")),
            format!("sha256 sum mismatch: {wrong} != {sha}."),
        ),
        (
            "gone",
            server.url("gone.qcow2"),
            None,
            "expected status code 200, got 404. Status: 404 Not Found.".to_string(),
        ),
    ] {
        let mut args = vec!["image", "create", name, "--url", &url, "--timeout", "30s"];
        if let Some(c) = &checksum {
            args.extend(["--checksum", c]);
        }
        let out = env.vm(&args);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let vi = kubectl_json(&env, &["get", "virtualimage", name]);
        assert_eq!(vi["status"]["phase"], "Failed");
        let ready = ready_condition(&vi, "Ready");
        assert_eq!(ready["reason"], "ProvisioningFailed");
        let message = ready["message"].as_str().unwrap();
        assert!(message.ends_with(&says), "{message}");
        assert!(
            stderr(&out).contains(&format!("image vi/{name} Failed: {message}")),
            "{}",
            stderr(&out)
        );
    }
}
