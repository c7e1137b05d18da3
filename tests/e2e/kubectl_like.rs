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

/// The global `--cluster` and `--insecure-skip-tls-verify` pick the server and its TLS check
/// as they do for real kubectl, which is run the same way as the reference; `--request-timeout`
/// ends a request the server holds.
#[test]
fn cluster_insecure_skip_tls_verify_and_request_timeout_like_kubectl() {
    let env = Env::kubevirt();
    let text = std::fs::read_to_string(&env.kubeconfig).unwrap();
    let (head, rest) = text.split_once("clusters:\n").unwrap();
    let (entry, tail) = rest.split_once("users:\n").unwrap();
    let server = entry
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap();
    // The context's cluster points nowhere; "real" is the emulator; "noca" is the emulator
    // without its CA.
    let nowhere = entry.replace(server, "https://127.0.0.1:1");
    let real = entry.replace("- name: emulator", "- name: real");
    let noca: String = entry
        .replace("- name: emulator", "- name: noca")
        .lines()
        .filter(|l| !l.contains("certificate-authority-data"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(
        &env.kubeconfig,
        format!("{head}clusters:\n{nowhere}{real}{noca}users:\n{tail}"),
    )
    .unwrap();
    let cases: [(&[&str], bool); 4] = [
        (&[], false),
        (&["--cluster", "real"], true),
        (&["--cluster", "noca"], false),
        (&["--cluster", "noca", "--insecure-skip-tls-verify"], true),
    ];
    for (flags, works) in cases {
        let theirs = env.kubectl(&[&["get", "virtualmachines.kubevirt.io", "web"], flags].concat());
        assert_eq!(
            theirs.status.success(),
            works,
            "kubectl {flags:?}: {}",
            stderr(&theirs)
        );
        let ours = env.vm(&[&["list"], flags].concat());
        assert_eq!(ours.status.success(), works, "{flags:?}: {}", stderr(&ours));
        if works {
            assert!(
                stdout(&ours).lines().any(|l| l.starts_with("web ")),
                "{flags:?}: {}",
                stdout(&ours)
            );
        } else {
            assert_eq!(ours.status.code(), Some(1), "{flags:?}");
            assert_eq!(
                stderr(&ours).lines().count(),
                1,
                "{flags:?}: {}",
                stderr(&ours)
            );
        }
    }
    // A held list ends at --request-timeout, in one line.
    env.emulator.hold("list", "virtualmachines");
    let mut child = env.spawn(&["list", "--cluster", "real", "--request-timeout", "1s"]);
    // The server never answers: only the timeout can end it (60 s is the test's patience).
    let patience = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > patience {
            child.kill().unwrap();
            env.emulator.release_held();
            panic!("--request-timeout 1s did not end a request the server holds");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    env.emulator.release_held();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(": timed out"), "{err}");
    assert!(
        env.emulator
            .requests()
            .iter()
            .any(|r| r.path == "/apis/kubevirt.io/v1/namespaces/default/virtualmachines"),
        "the list reached the server and was held"
    );
}
