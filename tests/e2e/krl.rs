//! Revocation by certificate serial and key ID (issue 32): `ca revoke --serial | --key-id`
//! publishes an OpenSSH KRL with the CA keys; the emulator's guests run a real OpenSSH sshd
//! that reads it (`RevokedKeys`) at boot, and `kubectl vm ssh` and OpenSSH through ssh-config
//! refuse revoked host certificates. Every VM here is one of a pair with one name in two
//! namespaces, one of them called `vm`: `db-primary` in `vm` and in `prod`, whose revocations
//! must not catch each other. (`create` refuses VM names with dots, so the dotted pair
//! `db.primary.prod` in `vm` / `db.primary` in `prod` is checked where certificates are made
//! by hand: `kubevm::ca::krl` and `ssh::hostkey` unit tests, against `ssh-keygen -Q`.)

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine;
use serde_json::Value;

use crate::common::{BIN, Env, fails, ok, stderr, stdout};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";

/// The hostile pair: (name, namespace).
const PAIR: [(&str, &str); 2] = [("db-primary", "vm"), ("db-primary", "prod")];

fn create_pair(env: &Env) {
    env.emulator.put_object(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "vm"}
    }));
    ok(env.vm(&["ca", "init"]));
    for (name, ns) in PAIR {
        ok(env.vm(&[
            "create",
            name,
            "-n",
            ns,
            "--image",
            IMAGE,
            "--wait",
            "--timeout",
            "60s",
        ]));
    }
}

fn object(env: &Env, ns: &str, plural: &str, name: &str) -> Value {
    env.emulator
        .objects("", plural, Some(ns))
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{plural}/{ns}/{name}"))
}

fn b64(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

/// The user data of VM `name` in `ns` (Secret `NAME-cloudinit`).
fn user_data(env: &Env, ns: &str, name: &str) -> String {
    let secret = object(env, ns, "secrets", &format!("{name}-cloudinit"));
    let data = secret["data"].as_object().unwrap();
    let value = data
        .iter()
        .find(|(k, _)| *k == "userdata" || *k == "userData")
        .unwrap()
        .1;
    String::from_utf8(b64(value.as_str().unwrap())).unwrap()
}

/// The published KRL, written to a file.
fn published_krl(env: &Env) -> PathBuf {
    let cm = object(env, "kubevm-system", "configmaps", "kubevm-ssh-ca");
    let path = env.dir.path().join("published.krl");
    std::fs::write(
        &path,
        b64(cm["binaryData"]["revoked.krl"]
            .as_str()
            .expect("revoked.krl")),
    )
    .unwrap();
    path
}

/// `ssh-keygen -Q -f KRL FILE`: true for REVOKED, false for ok (the independent reference).
fn keygen_says_revoked(krl: &Path, file: &Path) -> bool {
    let out = Command::new("ssh-keygen")
        .arg("-Q")
        .arg("-f")
        .arg(krl)
        .arg(file)
        .output()
        .expect("ssh-keygen");
    match out.status.code() {
        Some(0) => false,
        Some(1) => true,
        _ => panic!("{}", stderr(&out)),
    }
}

/// `Serial:` of a certificate as `ssh-keygen -L` prints it.
fn keygen_serial(cert: &Path) -> u64 {
    let out = Command::new("ssh-keygen")
        .arg("-L")
        .arg("-f")
        .arg(cert)
        .output()
        .unwrap();
    stdout(&out)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Serial: "))
        .expect("Serial:")
        .parse()
        .unwrap()
}

/// The CA private key from its Secret, as a file ssh-keygen signs with.
fn ca_key_file(env: &Env, dir: &Path) -> PathBuf {
    let secret = object(env, "kubevm-system", "secrets", "kubevm-ssh-ca");
    let path = dir.join("ca");
    std::fs::write(&path, b64(secret["data"]["ca.keys"].as_str().unwrap())).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A user key and a certificate signed by ssh-keygen with the CA: key ID `id`, `serial`,
/// principal `principal`.
fn user_cert(dir: &Path, ca: &Path, name: &str, id: &str, serial: u64, principal: &str) -> PathBuf {
    let key = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = Command::new("ssh-keygen")
        .arg("-q")
        .arg("-s")
        .arg(ca)
        .args([
            "-I",
            id,
            "-z",
            &serial.to_string(),
            "-V",
            "-5m:+1h",
            "-n",
            principal,
        ])
        .arg(key.with_extension("pub"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    key
}

/// OpenSSH logs in as `kubevm` to the VM with host name `host` (`NAME.NAMESPACE.vm`) with
/// key `key` and its certificate; host keys are not what this checks.
fn login(env: &Env, host: &str, key: &Path) -> Output {
    let kubeconfig = env.kubeconfig.to_str().unwrap().to_owned();
    env.command("ssh")
        .args([
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
        ])
        .arg("-o")
        .arg(format!(
            "ProxyCommand={BIN} --kubeconfig {kubeconfig} port-forward --stdio --ssh-host %n %p"
        ))
        .args([
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=no",
            "-i",
        ])
        .arg(key)
        .arg("-o")
        .arg(format!(
            "CertificateFile={}",
            key.with_file_name(format!(
                "{}-cert.pub",
                key.file_name().unwrap().to_str().unwrap()
            ))
            .display()
        ))
        .args(["-l", "kubevm", host, "id", "-un"])
        .output()
        .unwrap()
}

#[track_caller]
fn logged_in(out: &Output) {
    assert_eq!(stdout(out), "kubevm\n", "{}", stderr(out));
}

#[track_caller]
fn refused(out: &Output) {
    assert_eq!(out.status.code(), Some(255), "{}", stderr(out));
    assert!(stderr(out).contains("Permission denied"), "{}", stderr(out));
}

fn user_certificates_revoked_in_the_guest(env: &Env) {
    create_pair(env);
    let dir = env.dir.path().join("users");
    std::fs::create_dir_all(&dir).unwrap();
    let ca = ca_key_file(env, &dir);
    // Two certificates for VM db-primary in vm, one for db-primary in prod, whose principal
    // `kubevm@db-primary.prod` differs from `kubevm@db-primary.vm` only by the namespace.
    let by_serial = user_cert(
        &dir,
        &ca,
        "a",
        "kubectl-vm:mallory:vm/db-primary",
        4242,
        "kubevm@db-primary.vm",
    );
    let by_id = user_cert(
        &dir,
        &ca,
        "b",
        "kubectl-vm:eve:vm/db-primary",
        4343,
        "kubevm@db-primary.vm",
    );
    let other = user_cert(
        &dir,
        &ca,
        "c",
        "kubectl-vm:eve:prod/db-primary",
        4242,
        "kubevm@db-primary.prod",
    );
    let (vm_host, prod_host) = ("db-primary.vm.vm", "db-primary.prod.vm");
    logged_in(&login(env, vm_host, &by_serial));
    logged_in(&login(env, vm_host, &by_id));
    logged_in(&login(env, prod_host, &other));

    let out = ok(env.vm(&["ca", "revoke", "--serial", "4242"]));
    assert!(
        out.starts_with("revoked certificates with serial 4242 (1 serials revoked in configmap/kubevm-ssh-ca in \"kubevm-system\", KRL revoked.krl)"),
        "{out}"
    );
    assert!(
        out.contains(
            "Updated the revocation list of 2 VMs (their sshd refuses it from their next boot): "
        ),
        "{out}"
    );
    let krl = published_krl(env);
    let cert = |key: &Path| {
        key.with_file_name(format!(
            "{}-cert.pub",
            key.file_name().unwrap().to_str().unwrap()
        ))
    };
    assert!(keygen_says_revoked(&krl, &cert(&by_serial)));
    assert!(!keygen_says_revoked(&krl, &cert(&by_id)));
    // Until the guest boots again it has the old list.
    logged_in(&login(env, vm_host, &by_serial));
    ok(env.vm(&["restart", "db-primary", "-n", "vm"]));
    refused(&login(env, vm_host, &by_serial));
    logged_in(&login(env, vm_host, &by_id));

    let out = ok(env.vm(&["ca", "revoke", "--key-id", "kubectl-vm:eve:vm/db-primary"]));
    assert!(out.contains("(1 key IDs revoked"), "{out}");
    let again = ok(env.vm(&["ca", "revoke", "--key-id", "kubectl-vm:eve:vm/db-primary"]));
    assert_eq!(
        again,
        "certificates with key ID \"kubectl-vm:eve:vm/db-primary\": already revoked\n"
    );
    let krl = published_krl(env);
    assert!(keygen_says_revoked(&krl, &cert(&by_id)));
    ok(env.vm(&["restart", "db-primary", "-n", "vm"]));
    refused(&login(env, vm_host, &by_id));
    // The other VM of the pair, restarted too: its own user's certificate shares serial 4242
    // (serials apply to every certificate of the CA), so it is refused as well, as OpenSSH says.
    assert!(keygen_says_revoked(&krl, &cert(&other)));
    ok(env.vm(&["restart", "db-primary", "-n", "prod"]));
    refused(&login(env, prod_host, &other));
    // A certificate with neither the serial nor the key ID still logs in: the refusals are
    // the KRL's, not a broken guest.
    let fresh = user_cert(
        &dir,
        &ca,
        "d",
        "kubectl-vm:eve:prod/db-primary",
        77,
        "kubevm@db-primary.prod",
    );
    assert!(!keygen_says_revoked(&krl, &cert(&fresh)));
    logged_in(&login(env, prod_host, &fresh));
}

#[test]
fn kubevirt_a_revoked_user_certificate_is_refused_by_the_guests_sshd() {
    user_certificates_revoked_in_the_guest(&Env::kubevirt());
}

#[test]
fn deckhouse_a_revoked_user_certificate_is_refused_by_the_guests_sshd() {
    user_certificates_revoked_in_the_guest(&Env::deckhouse());
}

/// The host certificate in VM `name`'s user data, written to a file.
fn host_cert_file(env: &Env, ns: &str, name: &str) -> PathBuf {
    let text = user_data(env, ns, name);
    let cert = kubevm::ca::propagate::heredoc_content(
        &text,
        "/etc/ssh/kubevm_ssh_host_ed25519_key-cert.pub",
    )
    .unwrap();
    let path = env.dir.path().join(format!("{name}.{ns}-cert.pub"));
    std::fs::write(&path, format!("{}\n", cert[0])).unwrap();
    path
}

fn one_line(out: &Output) -> String {
    let err: String = stderr(out)
        .lines()
        .filter(|l| !l.starts_with("Notice: "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err
}

fn host_certificates_revoked_for_clients(env: &Env) {
    create_pair(env);
    let kubeconfig = env.kubeconfig.to_str().unwrap().to_owned();
    let config = env.dir.path().join("printed_config");
    std::fs::write(
        &config,
        ok(env.vm(&["--kubeconfig", &kubeconfig, "ssh-config"])),
    )
    .unwrap();
    let openssh = |host: &str| {
        env.command("ssh")
            .env_remove("KUBECONFIG")
            .args(["-F", config.to_str().unwrap(), "-o", "BatchMode=yes"])
            .args([host, "true"])
            .output()
            .unwrap()
    };
    let ssh = |name: &str, ns: &str| {
        env.command(BIN)
            .args(["ssh", name, "-n", ns, "--", "true"])
            .output()
            .unwrap()
    };
    for host in ["db-primary.vm.vm", "db-primary.prod.vm"] {
        let out = openssh(host);
        assert!(out.status.success(), "{host}: {}", stderr(&out));
    }
    // db-primary in prod, by the serial ssh-keygen reads from its host certificate.
    let cert = host_cert_file(env, "prod", "db-primary");
    let serial = keygen_serial(&cert).to_string();
    ok(env.vm(&["ca", "revoke", "--serial", &serial]));
    assert!(keygen_says_revoked(&published_krl(env), &cert));
    let err = one_line(&ssh("db-primary", "prod"));
    assert!(
        err.contains(&format!(
            "host key verification failed: the host certificate (serial {serial}) is revoked by the platform"
        )),
        "{err}"
    );
    let out = openssh("db-primary.prod.vm");
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    assert!(stderr(&out).contains("REVOKED"), "{}", stderr(&out));
    // The other of the pair is not caught.
    assert!(ssh("db-primary", "vm").status.success());
    assert!(openssh("db-primary.vm.vm").status.success());
    // db-primary in vm, by the key ID ssh-keygen reads from its host certificate.
    let cert = host_cert_file(env, "vm", "db-primary");
    let listed = stdout(
        &Command::new("ssh-keygen")
            .arg("-L")
            .arg("-f")
            .arg(&cert)
            .output()
            .unwrap(),
    );
    let key_id = listed
        .lines()
        .find_map(|l| l.trim().strip_prefix("Key ID: "))
        .unwrap()
        .trim_matches('"')
        .to_owned();
    assert_eq!(key_id, "kubevm-host:vm/db-primary");
    ok(env.vm(&["ca", "revoke", "--key-id", &key_id]));
    let err = one_line(&ssh("db-primary", "vm"));
    assert!(
        err.contains("the host certificate (key ID \"kubevm-host:vm/db-primary\") is revoked"),
        "{err}"
    );
    let out = openssh("db-primary.vm.vm");
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    assert!(stderr(&out).contains("REVOKED"), "{}", stderr(&out));
    // The lists outlive a rotation.
    ok(env.vm(&["ca", "rotate"]));
    let err = one_line(&ssh("db-primary", "vm"));
    assert!(err.contains("is revoked"), "{err}");
}

#[test]
fn kubevirt_a_revoked_host_certificate_is_refused_by_ssh_and_openssh() {
    host_certificates_revoked_for_clients(&Env::kubevirt());
}

#[test]
fn deckhouse_a_revoked_host_certificate_is_refused_by_ssh_and_openssh() {
    host_certificates_revoked_for_clients(&Env::deckhouse());
}

/// Bad input: one line, exit 2, before any request.
#[test]
fn revoke_refuses_bad_input_locally() {
    let env = Env::kubevirt();
    for (args, says) in [
        (&["ca", "revoke", "--serial", "0"][..], "OpenSSH ignores it"),
        (&["ca", "revoke", "--key-id", ""][..], "cannot be empty"),
        (
            &["ca", "revoke", "--key-id", "a\nserial: 1"][..],
            "control characters",
        ),
    ] {
        let err = fails(&env, args, 2);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    for args in [
        &["ca", "revoke"][..],
        &["ca", "revoke", "--serial", "1", "--key-id", "x"][..],
        &["ca", "revoke", "--serial", "-1"][..],
    ] {
        let out = env.vm(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    assert!(
        env.emulator.requests().is_empty(),
        "no request for bad input"
    );
}
