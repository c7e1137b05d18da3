//! `kubectl vm credentials` end to end against the emulator's sshd guests, which propagate
//! accessCredentials like virt-launcher through the agent (tests/emulator/src/kubevirt/sshd_agent.rs):
//! a key added logs in with `ssh -i`, a second one without a restart, a removed one is refused,
//! and a password set from a file or a terminal prompt logs in to the guest's sshd (password
//! authentication through PAM).

use std::time::{Duration, Instant};

use crate::common::{BIN, Env, exit_code, fails, ok, on_tty, stderr, stdout};

fn vm_yaml(name: &str) -> String {
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
        devices: {{}}
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
              sudo: ALL=(ALL) NOPASSWD:ALL
"#
    )
}

fn keygen(env: &Env, name: &str) -> (String, String) {
    let path = env.dir.path().join(name);
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
    let public = std::fs::read_to_string(format!("{}.pub", path.display())).unwrap();
    (path.to_str().unwrap().to_owned(), public.trim().to_owned())
}

fn ssh_i(env: &Env, key: &str, command: &str) -> std::process::Output {
    env.command(BIN)
        .args(["ssh", "--strict-host-key-checking", "accept-new", "-i", key])
        .args(["debian@keys", "--", command])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[track_caller]
fn until(what: &str, mut f: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match f() {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// `password` logs `debian` in to the guest's sshd (password authentication through PAM,
/// which checks the guest's /etc/shadow): real OpenSSH, the password given by SSH_ASKPASS.
fn password_is(env: &Env, _key: &str, password: &str) -> Result<(), String> {
    let askpass = env.dir.path().join("askpass");
    std::fs::write(
        &askpass,
        "#!/bin/sh\ncat \"$(dirname \"$0\")/askpass.txt\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &askpass,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    std::fs::write(env.dir.path().join("askpass.txt"), format!("{password}\n")).unwrap();
    let kubeconfig = env.kubeconfig.to_str().unwrap();
    let out = env
        .command("ssh")
        .env("SSH_ASKPASS", &askpass)
        .env("SSH_ASKPASS_REQUIRE", "force")
        .args(["-F", "/dev/null", "-o", "StrictHostKeyChecking=no"])
        .args([
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "PubkeyAuthentication=no",
        ])
        .args([
            "-o",
            "PreferredAuthentications=password",
            "-o",
            "NumberOfPasswordPrompts=1",
        ])
        .arg("-o")
        .arg(format!(
            "ProxyCommand={BIN} --kubeconfig {kubeconfig} port-forward --stdio keys.default 22"
        ))
        .args(["debian@keys", "id", "-un"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    (stdout(&out) == "debian\n")
        .then_some(())
        .ok_or_else(|| stderr(&out))
}

#[test]
fn kubevirt_credentials_keys_and_password() {
    let env = Env::kubevirt();
    let file = env.dir.path().join("vm.yaml");
    std::fs::write(&file, vm_yaml("keys")).unwrap();
    ok(env.kubectl(&["apply", "-f", file.to_str().unwrap()]));
    ok(env.kubectl(&["wait", "vm/keys", "--for=condition=Ready", "--timeout=60s"]));
    let (one, one_pub) = keygen(&env, "one");
    let (two, two_pub) = keygen(&env, "two");
    let one_file = format!("{one}.pub");

    let text = ok(env.vm(&[
        "credentials",
        "add-ssh-key",
        "keys",
        "-u",
        "debian",
        "-f",
        &one_file,
    ]));
    assert_eq!(
        text,
        "secret/keys-kubevm-keys-debian created\nvirtualmachine.kubevirt.io updated\nOn keys.default: debian has 1 key(s) from kubectl vm; the VM runs without the new accessCredentials entry, KubeVirt applies it at its next start (RestartRequired): kubectl vm restart keys.default\n"
    );
    ok(env.vm(&["restart", "keys"]));
    let out = ssh_i(&env, &one, "id -un");
    assert_eq!(stdout(&out), "debian\n", "{}", stderr(&out));

    // The entry exists now: a second key is live, no restart.
    let text = ok(env.vm(&[
        "credentials",
        "add-ssh-key",
        "keys",
        "-u",
        "debian",
        "--value",
        &two_pub,
    ]));
    assert!(
        text.ends_with("debian has 2 key(s) from kubectl vm; live in the running guest.\n"),
        "{text}"
    );
    until("the second key logs in", || {
        let out = ssh_i(&env, &two, "id -un");
        (stdout(&out) == "debian\n")
            .then_some(())
            .ok_or(stderr(&out))
    });
    // The same key again (another comment) changes nothing.
    let same = one_pub.replace(" one", " renamed");
    let text = ok(env.vm(&[
        "credentials",
        "add-ssh-key",
        "keys",
        "-u",
        "debian",
        "--value",
        &same,
    ]));
    assert!(
        text.starts_with("secret/keys-kubevm-keys-debian unchanged\n"),
        "{text}"
    );

    // Removing the first key is live: it is refused, the second still logs in.
    ok(env.vm(&[
        "credentials",
        "remove-ssh-key",
        "keys",
        "-u",
        "debian",
        "-f",
        &one_file,
    ]));
    until("the removed key is refused", || {
        let out = ssh_i(&env, &one, "true");
        (out.status.code() == Some(255))
            .then_some(())
            .ok_or(stdout(&out))
    });
    let out = ssh_i(&env, &two, "cat .ssh/authorized_keys");
    assert_eq!(stdout(&out), format!("{two_pub}\n"), "{}", stderr(&out));
    assert_eq!(
        fails(
            &env,
            &[
                "credentials",
                "remove-ssh-key",
                "keys",
                "-u",
                "debian",
                "-f",
                &one_file
            ],
            1
        ),
        "Error: debian on keys.default has no such key from kubectl vm (secret \"keys-kubevm-keys-debian\"); nothing was changed"
    );

    // A password from a file: a new entry, so a restart; then it is the guest's.
    let pw = env.dir.path().join("pw");
    std::fs::write(&pw, "c0rrect horse\n").unwrap();
    let text = ok(env.vm(&[
        "credentials",
        "set-password",
        "keys",
        "-u",
        "debian",
        "--password-file",
        pw.to_str().unwrap(),
    ]));
    assert!(
        text.starts_with(
            "secret/keys-kubevm-password-debian created\nvirtualmachine.kubevirt.io updated\n"
        ),
        "{text}"
    );
    assert!(!text.contains("c0rrect"), "{text}");
    ok(env.vm(&["restart", "keys"]));
    // The emulator's sshd guest makes a new host key at every boot (a real cloud-init keeps
    // the instance's): forget the one recorded.
    std::fs::remove_file(env.dir.path().join(".kube/kubectl-vm/vm_known_hosts")).unwrap();
    until("the password is set", || {
        password_is(&env, &two, "c0rrect horse")
    });

    // From the terminal, asked twice without echo; live this time.
    let mut p = on_tty(
        &env,
        &["credentials", "set-password", "keys", "-u", "debian"],
    );
    p.exp_string("New password for debian: ").unwrap();
    p.send_line("tty-Secret-9").unwrap();
    p.exp_string("Retype the new password: ").unwrap();
    p.send_line("tty-Secret-9").unwrap();
    let rest = p.exp_eof().unwrap();
    assert!(!rest.contains("tty-Secret-9"), "echoed: {rest}");
    assert!(rest.contains("live in the running guest"), "{rest}");
    assert_eq!(exit_code(&p), 0);
    until("the new password is set", || {
        password_is(&env, &two, "tty-Secret-9")
    });
    // Typed differently twice: nothing is changed.
    let mut p = on_tty(
        &env,
        &["credentials", "set-password", "keys", "-u", "debian"],
    );
    p.exp_string("New password for debian: ").unwrap();
    p.send_line("a").unwrap();
    p.exp_string("Retype the new password: ").unwrap();
    p.send_line("b").unwrap();
    p.exp_string("Error: the passwords do not match").unwrap();
    p.exp_eof().unwrap();
    assert_eq!(exit_code(&p), 2);
    password_is(&env, &two, "tty-Secret-9").unwrap();
}

#[test]
fn credentials_input_is_checked_and_strangers_left_alone() {
    let env = Env::kubevirt();
    let file = env.dir.path().join("vm.yaml");
    std::fs::write(&file, vm_yaml("keys")).unwrap();
    ok(env.kubectl(&["apply", "-f", file.to_str().unwrap()]));
    for (args, message) in [
        (
            &[
                "credentials",
                "add-ssh-key",
                "keys",
                "-u",
                "debian",
                "--value",
                "ssh-ed25519 nope",
            ][..],
            "Error: ",
        ),
        (
            &["credentials", "set-password", "keys", "-u", "debian"],
            "Error: no terminal to ask for the password on: give --password-file FILE",
        ),
        (
            &[
                "credentials",
                "set-password",
                "keys",
                "-u",
                "Bad",
                "--password-file",
                "/dev/null",
            ],
            "Error: --guest-user \"Bad\" is not a login",
        ),
        (
            &[
                "credentials",
                "set-password",
                "keys",
                "-u",
                "debian",
                "--password-file",
                "/dev/null",
            ],
            "Error: the password is empty",
        ),
    ] {
        let line = fails(&env, args, 2);
        assert!(line.starts_with(message), "{args:?}: {line}");
    }
    ok(env.kubectl(&[
        "create",
        "secret",
        "generic",
        "keys-kubevm-keys-debian",
        "--from-literal=k=mine",
    ]));
    let (_, public) = keygen(&env, "k");
    assert_eq!(
        fails(
            &env,
            &[
                "credentials",
                "add-ssh-key",
                "keys",
                "-u",
                "debian",
                "--value",
                &public
            ],
            1
        ),
        "Error: secret \"keys-kubevm-keys-debian\" in namespace \"default\" exists and is not kubectl vm's key list of \"debian\" on this VM: it is left as it is; delete or rename it first"
    );
    let dh = Env::deckhouse();
    assert!(
        fails(
            &dh,
            &[
                "credentials",
                "add-ssh-key",
                "web",
                "-u",
                "debian",
                "--value",
                &public
            ],
            1
        )
        .starts_with(
            "Error: credentials need KubeVirt: Deckhouse virtualization has no accessCredentials"
        )
    );
}
