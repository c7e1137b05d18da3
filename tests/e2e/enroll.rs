//! `kubectl vm enroll` end to end: a VM made from plain YAML with a stock cloud-init (no
//! kubectl-vm injection) trusts the platform CA after enrollment and a restart, certificates
//! for another VM are refused by its real sshd, removal is live, and `ca rotate` rewrites the
//! enrollment. The emulator's sshd guests propagate accessCredentials like virt-launcher
//! (tests/emulator/src/kubevirt/sshd_agent.rs).

use std::time::{Duration, Instant};

use crate::common::{BIN, Env, fails, ok, stderr, stdout};

/// A VM as a user writes it: a container disk and a cloud-config that creates `debian`.
pub(crate) fn plain_vm(name: &str) -> String {
    format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
  namespace: default
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        devices:
          disks:
          - name: root
            disk: {{bus: virtio}}
          - name: cloudinit
            disk: {{bus: virtio}}
        resources:
          requests:
            memory: 1Gi
      volumes:
      - name: root
        containerDisk:
          image: quay.io/containerdisks/debian:12
      - name: cloudinit
        cloudInitNoCloud:
          userData: |
            #cloud-config
            users:
            - name: debian
              shell: /bin/bash
"#
    )
}

pub(crate) fn apply(env: &Env, name: &str, yaml: &str) {
    let file = env.dir.path().join(format!("{name}.yaml"));
    std::fs::write(&file, yaml).unwrap();
    ok(env.kubectl(&["apply", "-f", file.to_str().unwrap()]));
}

fn running_vm(env: &Env, name: &str) {
    apply(env, name, &plain_vm(name));
    ok(env.kubectl(&[
        "wait",
        &format!("vm/{name}"),
        "--for=condition=Ready",
        "--timeout=60s",
    ]));
}

fn ssh(env: &Env, args: &[&str]) -> std::process::Output {
    env.command(BIN)
        .args(["ssh", "--strict-host-key-checking", "accept-new"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

fn jsonpath(env: &Env, object: &str, path: &str) -> String {
    stdout(&env.kubectl(&["get", object, "-o", &format!("jsonpath={path}")]))
}

/// Real OpenSSH to `vm` as `debian`, with a fresh key and certificate from `ssh-cert` for
/// `host`.
fn openssh_with_cert_of(env: &Env, vm: &str, host: &str) -> std::process::Output {
    ok(env.vm(&["ssh-cert", host, "-l", "debian"]));
    openssh_with_cert_file(env, vm, host)
}

/// Real OpenSSH to `vm` as `debian`, with the certificate `ssh-cert` last wrote for `host`.
fn openssh_with_cert_file(env: &Env, vm: &str, host: &str) -> std::process::Output {
    let dir = env.dir.path().join(".kube/kubectl-vm/ssh");
    let kubeconfig = env.kubeconfig.to_str().unwrap();
    crate::common::openssh_via_vm(
        env,
        &format!("--kubeconfig {kubeconfig}"),
        &format!("{vm}.default"),
        &dir.join("id_ed25519"),
        &dir.join(format!("certs/debian@{host}-cert.pub")),
    )
    .args([&format!("debian@{vm}"), "id", "-un"])
    .output()
    .unwrap()
}

#[test]
fn kubevirt_enroll_a_yaml_vm() {
    let env = Env::kubevirt();
    let _signer = crate::signer::start_signer(&env, &[]);
    running_vm(&env, "plain");
    running_vm(&env, "other");
    // Nothing trusts the CA yet: the signer refuses a login the VM does not allow.
    let out = ssh(&env, &["debian@plain", "--", "id", "-un"]);
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));

    let text = ok(env.vm(&["enroll", "plain", "--guest-user", "debian"]));
    assert!(
        text.starts_with(
            "secret/plain-kubevm-trust-debian created\nvirtualmachine.kubevirt.io updated\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("(RestartRequired): kubectl vm restart plain.default"),
        "{text}"
    );
    // KubeVirt's condition on the VM, as virt-controller words it.
    assert_eq!(
        jsonpath(
            &env,
            "vm/plain",
            "{.status.conditions[?(@.type=='RestartRequired')].message}"
        ),
        "a non-live-updatable field was changed in the template spec"
    );
    // The Secret: one line per CA key, the principal naming this login on this VM only.
    let ca = ok(env.kubectl(&[
        "get",
        "configmap",
        "kubevm-ssh-ca",
        "-n",
        "kubevm-system",
        "-o",
        "jsonpath={.data.ca\\.pub}",
    ]))
    .trim()
    .to_owned();
    let secret = ok(env.kubectl(&[
        "get",
        "secret",
        "plain-kubevm-trust-debian",
        "-o",
        "jsonpath={.data.authorized_keys}",
    ]));
    let lines = String::from_utf8(
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, secret.trim()).unwrap(),
    )
    .unwrap();
    assert_eq!(
        lines,
        format!("cert-authority,principals=\"debian@plain.default\" {ca}\n")
    );
    assert_eq!(
        jsonpath(
            &env,
            "secret/plain-kubevm-trust-debian",
            "{.metadata.ownerReferences[0].name}"
        ),
        "plain"
    );
    // Again: nothing changes.
    let again = ok(env.vm(&["enroll", "plain", "-u", "debian"]));
    assert!(
        again.starts_with(
            "secret/plain-kubevm-trust-debian unchanged\nvirtualmachine.kubevirt.io unchanged\n"
        ),
        "{again}"
    );

    ok(env.vm(&["restart", "plain"]));
    assert_eq!(
        jsonpath(
            &env,
            "vm/plain",
            "{.status.conditions[?(@.type=='RestartRequired')].status}"
        ),
        ""
    );
    // Without USER@: the VM has no platform user, so the enrolled login is its default.
    let out = ssh(&env, &["plain", "--", "id", "-un"]);
    assert_eq!(stdout(&out), "debian\n", "{}", stderr(&out));
    let out = ssh(&env, &["debian@plain", "--", "cat", ".ssh/authorized_keys"]);
    assert_eq!(stdout(&out), lines, "{}", stderr(&out));
    // scp, and plain OpenSSH through ssh-config (the host key `ssh` recorded is its trust:
    // an enrolled VM has no host certificate).
    let local = env.dir.path().join("up.txt");
    std::fs::write(&local, "enrolled\n").unwrap();
    let out = env
        .command(BIN)
        .args(["scp", local.to_str().unwrap(), "debian@plain:up.txt"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ssh(&env, &["debian@plain", "--", "cat", "up.txt"]);
    assert_eq!(stdout(&out), "enrolled\n", "{}", stderr(&out));
    let config = env.dir.path().join("ssh_config");
    std::fs::write(
        &config,
        ok(env.vm(&[
            "--kubeconfig",
            env.kubeconfig.to_str().unwrap(),
            "ssh-config",
            "-l",
            "debian",
        ])),
    )
    .unwrap();
    let out = env
        .command("ssh")
        .args([
            "-F",
            config.to_str().unwrap(),
            "-o",
            "BatchMode=yes",
            "plain.default.vm",
            "id",
            "-un",
        ])
        .output()
        .unwrap();
    assert_eq!(stdout(&out), "debian\n", "{}", stderr(&out));

    // A certificate for another VM (enrolled too, so the signer issues it) is refused by
    // plain's sshd; one for plain logs in. Real OpenSSH on both ends.
    ok(env.vm(&["enroll", "other", "-u", "debian"]));
    let refused = openssh_with_cert_of(&env, "plain", "other.default.vm");
    assert_ne!(refused.status.code(), Some(0));
    assert!(
        stderr(&refused).contains("Permission denied"),
        "{}",
        stderr(&refused)
    );
    let accepted = openssh_with_cert_of(&env, "plain", "plain.default.vm");
    assert_eq!(stdout(&accepted), "debian\n", "{}", stderr(&accepted));

    // CA rotation rewrites the enrollment, live.
    let rotated = ok(env.vm(&["ca", "rotate"]));
    assert!(
        rotated.contains("Updated the SSH trust of 2 enrolled VM users (live in running guests): "),
        "{rotated}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = ssh(&env, &["debian@plain", "--", "cat", ".ssh/authorized_keys"]);
        let text = stdout(&out);
        if text.lines().count() == 2 {
            assert!(
                text.lines().all(|l| l.starts_with(
                    "cert-authority,principals=\"debian@plain.default\" ssh-ed25519 "
                )),
                "{text}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not rotated in the guest: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Removal is live: the guest's authorized_keys loses the lines, so even a certificate
    // issued before is refused.
    let issued = openssh_with_cert_of(&env, "plain", "plain.default.vm");
    assert_eq!(stdout(&issued), "debian\n", "{}", stderr(&issued));
    let removed = ok(env.vm(&["enroll", "plain", "-u", "debian", "--remove"]));
    assert!(
        removed.starts_with(
            "secret/plain-kubevm-trust-debian emptied\nvirtualmachine.kubevirt.io updated\n"
        ),
        "{removed}"
    );
    assert_eq!(
        jsonpath(&env, "vm/plain", "{.spec.template.spec.accessCredentials}"),
        ""
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = openssh_with_cert_file(&env, "plain", "plain.default.vm");
        if out.status.code() != Some(0) {
            assert!(
                stderr(&out).contains("Permission denied"),
                "{}",
                stderr(&out)
            );
            break;
        }
        assert!(Instant::now() < deadline, "still trusted: {}", stdout(&out));
        std::thread::sleep(Duration::from_millis(200));
    }
    // The signer no longer issues for debian on plain.
    let line = stderr(&ssh(&env, &["debian@plain", "--", "true"]));
    assert!(line.contains("login \"debian\" is not allowed"), "{line}");
    // After a restart the emptied Secret is not read any more: removing again deletes it.
    ok(env.vm(&["restart", "plain"]));
    let gone = ok(env.vm(&["enroll", "plain", "-u", "debian", "--remove"]));
    assert!(
        gone.starts_with("secret/plain-kubevm-trust-debian deleted\n"),
        "{gone}"
    );
}

#[test]
fn kubevirt_enroll_refuses_what_is_not_ours_and_bad_input() {
    let env = Env::kubevirt();
    ok(env.vm(&["ca", "init"]));
    apply(&env, "plain", &plain_vm("plain"));
    // A Secret of that name that someone else made is left alone.
    ok(env.kubectl(&[
        "create",
        "secret",
        "generic",
        "plain-kubevm-trust-ops",
        "--from-literal=k=ssh-ed25519 AAAA mine",
    ]));
    let line = fails(&env, &["enroll", "plain", "-u", "ops"], 1);
    assert_eq!(
        line,
        "Error: secret \"plain-kubevm-trust-ops\" in namespace \"default\" exists and is not kubectl vm's enrollment of \"ops\" on this VM: it is left as it is; delete or rename it first"
    );
    assert_eq!(
        jsonpath(&env, "secret/plain-kubevm-trust-ops", "{.data.k}"),
        "c3NoLWVkMjU1MTkgQUFBQSBtaW5l"
    );
    assert_eq!(
        jsonpath(&env, "vm/plain", "{.spec.template.spec.accessCredentials}"),
        ""
    );
    for (args, message) in [
        (
            &["enroll", "plain", "-u", "Bad_User"][..],
            "Error: --guest-user \"Bad_User\" is not a login that can be enrolled: use 1 to 32 lowercase letters, digits and '-', starting with a letter",
        ),
        (
            &["enroll", "plain", "-u", "a,a"],
            "Error: --guest-user \"a\" is given twice",
        ),
        (
            &["enroll", "vmi/plain", "-u", "a"],
            "Error: target vmi/plain: enroll changes virtual machines; use vm/plain",
        ),
    ] {
        assert_eq!(fails(&env, args, 2), message);
    }
    let out = env.vm(&["enroll", "plain"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        fails(&env, &["enroll", "nope", "-u", "debian"], 1),
        "Error: virtualmachine \"nope\" not found in namespace \"default\""
    );
}

#[test]
fn deckhouse_enroll_says_what_works_there() {
    let env = Env::deckhouse();
    assert_eq!(
        fails(&env, &["enroll", "web", "-u", "debian"], 1),
        "Error: enrolling needs KubeVirt: Deckhouse virtualization has no accessCredentials to put the CA trust into the guest; VMs made with `kubectl vm create` trust the CA through cloud-init, others take `kubectl vm ssh -i KEY`"
    );
}
