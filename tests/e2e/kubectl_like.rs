//! Behaving like kubectl: the User-Agent of every request, `-v N` request logging with secrets
//! masked, managedFields hidden from `get -o yaml|json`, `get -o wide` refused, and a note when
//! both platforms are served.

use std::process::Command;

use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use serde_json::Value;

use crate::common::{Env, fails, ok, stderr, stdout};

/// `kubectl-vm/VERSION (OS/ARCH)` with Go's platform names, from `uname` (not from the code).
fn expected_user_agent() -> String {
    let uname = |flag: &str| {
        let out = Command::new("uname").arg(flag).output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_lowercase()
    };
    let arch = match uname("-m").as_str() {
        "x86_64" => "amd64".to_owned(),
        "aarch64" | "arm64" => "arm64".to_owned(),
        other => other.to_owned(),
    };
    format!(
        "kubectl-vm/{} ({}/{arch})",
        env!("CARGO_PKG_VERSION"),
        uname("-s")
    )
}

#[test]
fn every_request_carries_the_user_agent() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    ok(env.vm(&["list", "-A"]));
    ok(env.vm(&["get", "web"]));
    ok(env.vm(&["delete", "web", "--yes", "--dry-run=server"]));
    let requests = env.emulator.requests();
    assert!(requests.len() >= 5, "{requests:?}");
    let want = expected_user_agent();
    for r in &requests {
        assert_eq!(
            r.header("user-agent"),
            Some(want.as_str()),
            "{} {}",
            r.method,
            r.path
        );
    }
}

#[test]
fn verbosity_6_logs_every_request() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let output = env.vm(&["get", "web", "-v", "6"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let log = stderr(&output);
    let requests = env.emulator.requests();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), requests.len(), "{log}");
    let url = env.emulator.url();
    // Requests run concurrently, so compare as sets: each logged line is one recorded request,
    // `METHOD URL CODE REASON in N milliseconds`.
    let mut logged: Vec<(String, String, u16)> = lines
        .iter()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let n = words.len();
            assert!(n >= 6, "{line:?}");
            assert_eq!(words[n - 3..][0], "in", "{line:?}");
            assert_eq!(words[n - 1], "milliseconds", "{line:?}");
            assert!(words[n - 2].parse::<u64>().is_ok(), "{line:?}");
            (
                words[0].to_owned(),
                words[1].to_owned(),
                words[2].parse().unwrap(),
            )
        })
        .collect();
    let mut recorded: Vec<(String, String, u16)> = requests
        .iter()
        .map(|r| {
            let query = if r.query.is_empty() {
                String::new()
            } else {
                format!("?{}", r.query)
            };
            (
                r.method.clone(),
                format!("{url}{}{query}", r.path),
                r.status,
            )
        })
        .collect();
    logged.sort();
    recorded.sort();
    assert_eq!(logged, recorded);
    // Below 6 nothing is logged.
    let quiet = env.vm(&["get", "web", "-v", "5"]);
    assert_eq!(stderr(&quiet), "");
}

#[test]
fn verbosity_8_masks_secret_values() {
    let env = Env::kubevirt();
    let output = env.vm(&["ca", "init", "-v", "8"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let log = stderr(&output);
    assert!(log.contains("Request Body: "), "{log}");
    assert!(log.contains("Response Body: "), "{log}");
    assert!(log.contains("\"<masked>\""), "{log}");
    // The CA's private key, as stored, appears nowhere in the log.
    let secret = env
        .emulator
        .objects("", "secrets", Some("kubevm-system"))
        .into_iter()
        .find(|s| s["metadata"]["name"] == "kubevm-ssh-ca")
        .expect("the CA Secret");
    let data = secret["data"].as_object().expect("Secret data");
    assert!(!data.is_empty());
    for value in data.values() {
        let value = value.as_str().unwrap();
        assert!(!log.contains(value), "secret value leaked into:\n{log}");
        assert!(!log.contains(&value[..32.min(value.len())]), "{log}");
    }
    assert!(!log.contains("PRIVATE KEY"), "{log}");
}

/// The KubeVirt fixture with managedFields on VM `batch` in `dev`.
fn with_managed_fields() -> Env {
    let env = Env::kubevirt();
    let mut vm = env
        .emulator
        .objects("kubevirt.io", "virtualmachines", Some("dev"))
        .into_iter()
        .find(|v| v["metadata"]["name"] == "batch")
        .unwrap();
    vm["metadata"]["managedFields"] = serde_json::json!([{
        "manager": "kubectl-vm", "operation": "Apply", "apiVersion": "kubevirt.io/v1",
        "time": "2026-01-10T09:00:00Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:runStrategy": {}}}
    }]);
    vm["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    env.emulator.put_object(vm);
    env
}

#[test]
fn get_hides_managed_fields_like_kubectl() {
    let env = with_managed_fields();
    let ours: Value =
        serde_json::from_str(&ok(env.vm(&["get", "batch.dev", "-o", "json"]))).unwrap();
    assert!(ours["metadata"].get("managedFields").is_none(), "{ours}");
    // kubectl prints the same metadata for the same object.
    let theirs: Value = serde_json::from_str(&ok(
        env.kubectl(&["get", "vm", "batch", "-n", "dev", "-o", "json"])
    ))
    .unwrap();
    assert_eq!(ours["metadata"], theirs["metadata"]);
    let shown: Value = yaml_serde::from_str(&ok(env.vm(&[
        "get",
        "batch.dev",
        "-o",
        "yaml",
        "--show-managed-fields",
    ])))
    .unwrap();
    assert_eq!(
        shown["metadata"]["managedFields"][0]["manager"],
        "kubectl-vm"
    );
}

#[test]
fn list_hides_managed_fields_like_kubectl() {
    let env = with_managed_fields();
    let ours: Value =
        serde_json::from_str(&ok(env.vm(&["list", "-n", "dev", "-o", "json"]))).unwrap();
    let theirs: Value =
        serde_json::from_str(&ok(env.kubectl(&["get", "vm", "-n", "dev", "-o", "json"]))).unwrap();
    let metadata = |list: &Value| -> Vec<Value> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"].clone())
            .collect()
    };
    assert!(!metadata(&ours).is_empty());
    assert_eq!(metadata(&ours), metadata(&theirs));
    // --show-managed-fields keeps them, as in get.
    let shown: Value = serde_json::from_str(&ok(env.vm(&[
        "list",
        "-n",
        "dev",
        "-o",
        "json",
        "--show-managed-fields",
    ])))
    .unwrap();
    let batch = shown["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["metadata"]["name"] == "batch")
        .unwrap();
    assert_eq!(
        batch["metadata"]["managedFields"][0]["manager"],
        "kubectl-vm"
    );
}

#[test]
fn get_wide_is_refused_before_any_request() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    assert_eq!(
        fails(&env, &["get", "web", "-o", "wide"], 2),
        "Error: -o wide is a table format and get describes one VM; use `kubectl vm list -o wide` for the table, or -o yaml|json|name"
    );
    assert!(env.emulator.requests().is_empty());
}

#[test]
fn both_platforms_served_says_which_one_is_used() {
    let emulator = Emulator::start_blocking(EmulatorOptions {
        flavor: ServeFlavor::Both,
        ..Default::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    emulator.write_kubeconfig(&kubeconfig).unwrap();
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir(&bin_dir).unwrap();
    let env = Env {
        emulator,
        dir,
        kubeconfig,
        bin_dir,
    };
    let output = env.vm(&["list", "-A"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        "Note: this cluster serves both Deckhouse virtualization and KubeVirt; using Deckhouse virtualization (pass --flavor kubevirt for the other)\nNo virtual machines found.\n"
    );
    assert_eq!(stdout(&output), "");
    // An explicit choice needs no note.
    let output = env.vm(&["list", "-A", "--flavor", "kubevirt"]);
    assert_eq!(stderr(&output), "No virtual machines found.\n");
}
