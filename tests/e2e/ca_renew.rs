//! `ca rotate --renew-before`: only host certificates ending within the window are renewed;
//! the others are reported with their end and not written (issue 32). Validity is read back
//! with `ssh-keygen -L` (TZ=UTC), the independent reference. The VMs are a pair with one name
//! in two namespaces, one of them called `vm`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use serde_json::Value;

use crate::common::{BIN, Env, ok, stderr, stdout};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";
const CERT_PATH: &str = "/etc/ssh/kubevm_ssh_host_ed25519_key-cert.pub";

fn secret(env: &Env, ns: &str, name: &str) -> Value {
    env.emulator
        .objects("", "secrets", Some(ns))
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("secret {ns}/{name}"))
}

fn b64(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

/// (data key, user data) of VM `name`'s cloud-init Secret.
fn user_data(env: &Env, ns: &str, name: &str) -> (String, String) {
    let s = secret(env, ns, &format!("{name}-cloudinit"));
    let (key, value) = s["data"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(k, _)| *k == "userdata" || *k == "userData")
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .unwrap();
    (key, String::from_utf8(b64(&value)).unwrap())
}

fn resource_version(env: &Env, ns: &str, name: &str) -> String {
    secret(env, ns, &format!("{name}-cloudinit"))["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `ssh-keygen -L` of VM `name`'s host certificate: (key ID, valid-to as printed in UTC).
fn keygen_validity(env: &Env, ns: &str, name: &str) -> (String, String) {
    let (_, text) = user_data(env, ns, name);
    let cert = kubevm::ca::propagate::heredoc_content(&text, CERT_PATH).unwrap();
    let path = env.dir.path().join(format!("{name}.{ns}-cert.pub"));
    std::fs::write(&path, format!("{}\n", cert[0])).unwrap();
    let out = Command::new("ssh-keygen")
        .env("TZ", "UTC")
        .arg("-L")
        .arg("-f")
        .arg(&path)
        .output()
        .unwrap();
    let text = stdout(&out);
    let id = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Key ID: "))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    let to = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Valid: from "))
        .and_then(|l| l.split(" to ").nth(1))
        .unwrap()
        .to_owned();
    (id, to)
}

/// Give VM `name` a host certificate for its own host key, made as the signer makes them but
/// by ssh-keygen with the CA key, valid for `validity` (ssh-keygen `-V`).
fn certify_for(env: &Env, ca: &Path, ns: &str, name: &str, validity: &str) {
    let (key, text) = user_data(env, ns, name);
    let host_pub = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("ed25519_public:"))
        .unwrap()
        .trim()
        .to_owned();
    let dir = env.dir.path().join(format!("{name}.{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("host.pub"), format!("{host_pub}\n")).unwrap();
    let principal = kubevm::signer::host_principals(name, ns).join(",");
    let out = Command::new("ssh-keygen")
        .arg("-q")
        .arg("-s")
        .arg(ca)
        .args([
            "-h",
            "-I",
            &format!("kubevm-host:{ns}/{name}"),
            "-V",
            validity,
            "-n",
            &principal,
        ])
        .arg(dir.join("host.pub"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let cert = std::fs::read_to_string(dir.join("host-cert.pub")).unwrap();
    let text = kubevm::ca::propagate::replace_heredoc(&text, CERT_PATH, &[cert.trim().to_owned()])
        .unwrap();
    let mut s = secret(env, ns, &format!("{name}-cloudinit"));
    s["data"][&key] = base64::engine::general_purpose::STANDARD
        .encode(text)
        .into();
    env.emulator.put_object(s);
}

fn ca_key(env: &Env) -> PathBuf {
    let s = secret(env, "kubevm-system", "kubevm-ssh-ca");
    let path = env.dir.path().join("ca");
    std::fs::write(&path, b64(s["data"]["ca.keys"].as_str().unwrap())).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// `2026-12-15T12:26:00` (ssh-keygen, UTC) as our `2026-12-15T12:26:00Z`.
fn z(keygen_time: &str) -> String {
    format!("{keygen_time}Z")
}

fn renews_only_what_ends_soon(env: &Env) {
    env.emulator.put_object(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "vm"}
    }));
    ok(env.vm(&["ca", "init"]));
    // One running (its renewed certificate is then used), two created stopped.
    ok(env.vm(&[
        "create",
        "db-primary",
        "-n",
        "vm",
        "--image",
        IMAGE,
        "--wait",
        "--timeout",
        "60s",
    ]));
    for (name, ns) in [("db-primary", "prod"), ("web", "vm")] {
        ok(env.vm(&["create", name, "-n", ns, "--image", IMAGE, "--stopped"]));
    }
    let ca = ca_key(env);
    certify_for(env, &ca, "vm", "db-primary", "-1d:+10d");
    certify_for(env, &ca, "prod", "db-primary", "-1d:+100d");
    let (_, soon) = keygen_validity(env, "vm", "db-primary");
    let (_, later) = keygen_validity(env, "prod", "db-primary");
    let (web_id, web_end) = keygen_validity(env, "vm", "web");
    assert_eq!(web_id, "kubevm-host:vm/web");
    let rv = |ns, name| resource_version(env, ns, name);
    let (prod_rv, web_rv) = (rv("prod", "db-primary"), rv("vm", "web"));

    let out = ok(env.vm(&["ca", "rotate", "--renew-before", "30d"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    // 100 days from when ssh-keygen signed, whole days left counted down (99 once a second
    // has passed).
    let kept = format!("db-primary.prod: kept: valid until {} (", z(&later));
    assert!(
        [
            format!("{kept}100 days left)"),
            format!("{kept}99 days left)")
        ]
        .contains(&lines[0].to_owned()),
        "{out}"
    );
    let (renewed_id, renewed_end) = keygen_validity(env, "vm", "db-primary");
    assert_eq!(renewed_id, "kubevm-host:vm/db-primary");
    assert_eq!(
        lines[1],
        format!(
            "db-primary.vm: renewed: valid until {} (was until {})",
            z(&renewed_end),
            z(&soon)
        )
    );
    assert!(
        lines[2].starts_with(&format!("web.vm: kept: valid until {} (", z(&web_end))),
        "{out}"
    );
    assert_eq!(
        lines[3],
        "Renewed 1 host certificates ending within 30d, kept 2; each guest reads its new certificate at its next boot"
    );
    // A year from now, as ssh-keygen reads it: later than the 100-day one.
    assert!(renewed_end > later, "{renewed_end} vs {later}");
    // The kept ones were not written.
    assert_eq!(rv("prod", "db-primary"), prod_rv);
    assert_eq!(rv("vm", "web"), web_rv);
    // The CA keys were not rotated.
    assert_eq!(
        ok(env.vm(&["ca", "show", "-o", "json"]))
            .matches("\"fingerprint\"")
            .count(),
        1
    );
    // The renewed certificate, after a boot, is what the guest presents and ssh accepts.
    ok(env.vm(&["restart", "db-primary", "-n", "vm"]));
    let out = env
        .command(BIN)
        .args(["ssh", "db-primary", "-n", "vm", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    // The default window (60d) renews nothing now; 120d renews the 100-day one only.
    let out = ok(env.vm(&["ca", "rotate", "--renew-before"]));
    assert!(
        out.ends_with("Renewed 0 host certificates ending within 60d, kept 3\n"),
        "{out}"
    );
    let out = ok(env.vm(&["ca", "rotate", "--renew-before", "120d"]));
    assert!(out.contains("db-primary.prod: renewed: "), "{out}");
    assert!(out.contains("db-primary.vm: kept: "), "{out}");
    assert_ne!(rv("prod", "db-primary"), prod_rv);
    assert_eq!(rv("vm", "web"), web_rv);
}

#[test]
fn kubevirt_rotate_renew_before_renews_only_what_ends_soon() {
    renews_only_what_ends_soon(&Env::kubevirt());
}

#[test]
fn deckhouse_rotate_renew_before_renews_only_what_ends_soon() {
    renews_only_what_ends_soon(&Env::deckhouse());
}

#[test]
fn renew_before_refuses_bad_input_locally() {
    let env = Env::kubevirt();
    for args in [
        &["ca", "rotate", "--renew-before", "0"][..],
        &["ca", "rotate", "--renew-before", "soon"][..],
        &["ca", "rotate", "--renew-before", "30d", "--finish"][..],
    ] {
        let out = env.vm(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    assert!(env.emulator.requests().is_empty());
}
