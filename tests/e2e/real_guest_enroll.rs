//! `enroll` on a real guest (qemu, Debian 12, real qemu-guest-agent and sshd; see
//! real_guest.rs): a VM made from plain YAML with a stock cloud-config (no kubectl-vm
//! injection) is enrolled, restarted as KubeVirt requires, and then `kubectl vm ssh` logs in
//! with a CA certificate; a certificate for another VM is refused by the guest's sshd; the
//! removal reaches the running guest through the agent.
//!
//! `cargo test --workspace --test e2e real_guest_enroll -- --ignored`.

use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::{BIN, Env, ok, stderr, stdout};
use crate::real_guest::{keygen, qemu_guests};

fn ssh(env: &Env, args: &[&str]) -> Output {
    env.command(BIN)
        .args(["ssh", "--strict-host-key-checking", "accept-new"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[track_caller]
fn until(what: &str, limit: Duration, mut f: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + limit;
    loop {
        match f() {
            Ok(()) => return,
            Err(e) if Instant::now() >= deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_secs(1)),
        }
    }
}

fn condition(env: &Env, object: &str, kind: &str) -> String {
    stdout(&env.kubectl(&[
        "get",
        object,
        "-o",
        &format!("jsonpath={{.status.conditions[?(@.type==\"{kind}\")].status}}"),
    ]))
}

/// OpenSSH as `debian` on `vm` with the certificate `ssh-cert` last wrote for `host`.
fn openssh(env: &Env, vm: &str, host: &str) -> Output {
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

/// VM `vm` as a user writes it in plain YAML: a stock cloud-config with user `debian`
/// (authorized key `public`, when given) and no kubectl-vm injection.
fn plain_vm_yaml(vm: &str, public: Option<&str>) -> String {
    let mut yaml = format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {vm}
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
"#
    );
    if let Some(public) = public {
        yaml.push_str(&format!(
            "              ssh_authorized_keys:\n              - {}\n",
            public.trim()
        ));
    }
    yaml
}

#[test]
#[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
fn real_guest_enroll_a_yaml_vm() {
    let t0 = Instant::now();
    let vm = "yamlvm";
    let env = Env::kubevirt();
    let _tail = qemu_guests(&env, vm, true);
    let key = env.dir.path().join("id_user");
    keygen(&key);
    let public = std::fs::read_to_string(format!("{}.pub", key.display())).unwrap();
    let _signer = crate::signer::start_signer(&env, &[]);
    let yaml = format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {vm}
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
              ssh_authorized_keys:
              - {public}
"#,
        public = public.trim()
    );
    // The other VM exists (stopped) and is enrolled, so the signer issues for it.
    let other = yaml
        .replace(&format!("name: {vm}\n"), "name: othervm\n")
        .replace("runStrategy: Always", "runStrategy: Halted");
    let file = env.dir.path().join("vms.yaml");
    std::fs::write(&file, format!("{yaml}---\n{other}")).unwrap();
    ok(env.kubectl(&["apply", "-f", file.to_str().unwrap()]));
    let key_arg = key.to_str().unwrap().to_owned();
    until(
        "the guest's own key logs in",
        Duration::from_secs(300),
        || {
            let out = ssh(
                &env,
                &["-i", &key_arg, &format!("debian@{vm}"), "--", "id", "-un"],
            );
            (stdout(&out) == "debian\n")
                .then_some(())
                .ok_or(stderr(&out))
        },
    );
    eprintln!("boot to ssh: {:.1}s", t0.elapsed().as_secs_f64());
    until("AgentConnected", Duration::from_secs(120), || {
        let c = condition(&env, &format!("vmi/{vm}"), "AgentConnected");
        (c == "True").then_some(()).ok_or(c)
    });

    let text = ok(env.vm(&["enroll", vm, "-u", "debian"]));
    eprintln!("{text}");
    assert!(text.contains("(RestartRequired)"), "{text}");
    assert_eq!(
        condition(&env, &format!("vm/{vm}"), "RestartRequired"),
        "True"
    );
    ok(env.vm(&["enroll", "othervm", "-u", "debian"]));
    let t1 = Instant::now();
    ok(env.vm(&["restart", vm, "--timeout", "300s"]));
    until(
        "CA-signed ssh after the restart",
        Duration::from_secs(300),
        || {
            let out = ssh(&env, &[&format!("debian@{vm}"), "--", "id", "-un"]);
            (stdout(&out) == "debian\n")
                .then_some(())
                .ok_or(stderr(&out))
        },
    );
    eprintln!(
        "restart to certificate login: {:.1}s",
        t1.elapsed().as_secs_f64()
    );
    assert_eq!(
        condition(&env, &format!("vmi/{vm}"), "AccessCredentialsSynchronized"),
        "True"
    );
    let out = ssh(
        &env,
        &[&format!("debian@{vm}"), "--", "cat .ssh/authorized_keys"],
    );
    let lines = stdout(&out);
    assert!(
        lines.lines().count() == 1
            && lines.starts_with(&format!(
                "cert-authority,principals=\"debian@{vm}.default\" ssh-ed25519 "
            )),
        "{lines}"
    );
    // KubeVirt replaced the whole file: the key cloud-init wrote is gone.
    let out = ssh(
        &env,
        &["-i", &key_arg, &format!("debian@{vm}"), "--", "true"],
    );
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));

    // Real OpenSSH: a certificate for othervm is refused, one for this VM accepted.
    ok(env.vm(&["ssh-cert", "othervm.default.vm", "-l", "debian"]));
    let out = openssh(&env, vm, "othervm.default.vm");
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    ok(env.vm(&["ssh-cert", &format!("{vm}.default.vm"), "-l", "debian"]));
    let out = openssh(&env, vm, &format!("{vm}.default.vm"));
    assert_eq!(stdout(&out), "debian\n", "{}", stderr(&out));

    // Removal is live: the agent rewrites authorized_keys from the emptied Secret, so the
    // certificate issued before is refused without a reboot.
    let t2 = Instant::now();
    let removed = ok(env.vm(&["enroll", vm, "-u", "debian", "--remove"]));
    assert!(removed.contains("emptied"), "{removed}");
    until("the guest drops the trust", Duration::from_secs(60), || {
        let out = openssh(&env, vm, &format!("{vm}.default.vm"));
        (out.status.code() != Some(0) && stderr(&out).contains("Permission denied"))
            .then_some(())
            .ok_or(stdout(&out) + &stderr(&out))
    });
    eprintln!("removal to refusal: {:.1}s", t2.elapsed().as_secs_f64());
    ok(env.vm(&["delete", vm]));
    eprintln!("whole scenario: {:.1}s", t0.elapsed().as_secs_f64());
}

/// `credentials` on a real guest: a key and a password set (one restart for the new entries),
/// then a second key live, the first removed live, a new password live; the password logs in on
/// the serial console.
///
/// The same boot checks `guestosinfo`, `fslist` and `userlist` against the guest itself:
/// `/etc/os-release`, `uname`, `df` and `who` run over ssh, with the console login held open so
/// there is someone in `who` (one boot for both: each TCG boot costs minutes in CI).
#[test]
#[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
fn real_guest_credentials_and_facts() {
    let t0 = Instant::now();
    let vm = "credvm";
    let env = Env::kubevirt();
    let _tail = qemu_guests(&env, vm, true);
    let yaml = plain_vm_yaml(vm, None);
    let file = env.dir.path().join("vm.yaml");
    std::fs::write(&file, yaml).unwrap();
    ok(env.kubectl(&["apply", "-f", file.to_str().unwrap()]));
    let one = env.dir.path().join("one");
    let two = env.dir.path().join("two");
    keygen(&one);
    keygen(&two);
    let (one, two) = (one.to_str().unwrap(), two.to_str().unwrap());
    let pw = env.dir.path().join("pw");
    std::fs::write(&pw, "Fir5t-pass\n").unwrap();
    ok(env.vm(&[
        "credentials",
        "add-ssh-key",
        vm,
        "-u",
        "debian",
        "-f",
        &format!("{one}.pub"),
    ]));
    ok(env.vm(&[
        "credentials",
        "set-password",
        vm,
        "-u",
        "debian",
        "--password-file",
        pw.to_str().unwrap(),
    ]));
    until("AgentConnected", Duration::from_secs(300), || {
        let c = condition(&env, &format!("vmi/{vm}"), "AgentConnected");
        (c == "True").then_some(()).ok_or(c)
    });
    eprintln!("boot to agent: {:.1}s", t0.elapsed().as_secs_f64());
    ok(env.vm(&["restart", vm, "--timeout", "300s"]));
    let ssh_i = |key: &str| {
        ssh(
            &env,
            &["-i", key, &format!("debian@{vm}"), "--", "id", "-un"],
        )
    };
    until(
        "the first key after the restart",
        Duration::from_secs(300),
        || {
            let out = ssh_i(one);
            (stdout(&out) == "debian\n")
                .then_some(())
                .ok_or(stderr(&out))
        },
    );
    eprintln!("restart to key login: {:.1}s", t0.elapsed().as_secs_f64());
    let out = ssh_i(two);
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    // Live from here: no restart.
    let t1 = Instant::now();
    let text = ok(env.vm(&[
        "credentials",
        "add-ssh-key",
        vm,
        "-u",
        "debian",
        "-f",
        &format!("{two}.pub"),
    ]));
    assert!(text.contains("live in the running guest"), "{text}");
    until("the second key, live", Duration::from_secs(60), || {
        let out = ssh_i(two);
        (stdout(&out) == "debian\n")
            .then_some(())
            .ok_or(stderr(&out))
    });
    eprintln!("add-ssh-key to login: {:.1}s", t1.elapsed().as_secs_f64());
    ok(env.vm(&[
        "credentials",
        "remove-ssh-key",
        vm,
        "-u",
        "debian",
        "-f",
        &format!("{one}.pub"),
    ]));
    until(
        "the first key refused, live",
        Duration::from_secs(60),
        || {
            let out = ssh_i(one);
            (out.status.code() == Some(255))
                .then_some(())
                .ok_or(stdout(&out))
        },
    );
    std::fs::write(&pw, "Sec0nd-pass\n").unwrap();
    ok(env.vm(&[
        "credentials",
        "set-password",
        vm,
        "-u",
        "debian",
        "--password-file",
        pw.to_str().unwrap(),
    ]));
    // Facts: the agent's answers agree with the guest's own (over ssh with the second key).
    let guest = |command: &str| {
        let out = ssh(&env, &["-i", two, &format!("debian@{vm}"), "--", command]);
        assert!(out.status.success(), "{command}: {}", stderr(&out));
        stdout(&out)
    };
    let info: serde_json::Value =
        serde_json::from_str(&ok(env.vm(&["guestosinfo", vm, "-o", "json"]))).unwrap();
    let release = guest(
        ". /etc/os-release; printf '%s\\n%s\\n%s\\n' \"$PRETTY_NAME\" \"$VERSION_ID\" \"$ID\"; uname -r; uname -m; hostname",
    );
    let facts: Vec<&str> = release.lines().collect();
    assert_eq!(info["os"]["prettyName"], facts[0], "{info}");
    assert_eq!(info["os"]["versionId"], facts[1], "{info}");
    assert_eq!(info["os"]["id"], facts[2], "{info}");
    assert_eq!(info["os"]["kernelRelease"], facts[3], "{info}");
    assert_eq!(info["os"]["machine"], facts[4], "{info}");
    let table = ok(env.vm(&["guestosinfo", vm]));
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains(facts[0]) && l.contains(facts[3])),
        "{table}"
    );

    let fs: serde_json::Value =
        serde_json::from_str(&ok(env.vm(&["fslist", vm, "-o", "json"]))).unwrap();
    let root = fs["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["mountPoint"] == "/")
        .unwrap_or_else(|| panic!("no / in {fs}"))
        .clone();
    let df = guest("df -B1 --output=used,avail / | tail -1; findmnt -no FSTYPE /");
    let mut words = df.split_whitespace();
    let (used, avail, fstype) = (
        words.next().unwrap().parse::<u64>().unwrap(),
        words.next().unwrap().parse::<u64>().unwrap(),
        words.next().unwrap(),
    );
    // qemu-guest-agent's total is what non-root users can fill: used + available, the blocks
    // reserved for root left out (qga `commands-linux.c`), which is constant, unlike df's
    // used and available themselves.
    assert_eq!(
        root["totalBytes"].as_u64(),
        Some(used + avail),
        "{root} vs df {df}"
    );
    assert_eq!(root["fileSystemType"], fstype, "{root}");
    // Used space moves (logs): the agent's reading was taken up to a few seconds before df's.
    let agent_used = root["usedBytes"].as_u64().unwrap();
    assert!(
        agent_used.abs_diff(used) < (used + avail) / 50,
        "{root} vs df {df}"
    );
    eprintln!("fslist /: {root}; df: {df}");

    // The console: the new password logs in (retried until the agent has set it).
    let mut command = env.command(BIN);
    command.args(["console", vm]).env("TERM", "xterm");
    let mut p = rexpect::session::spawn_command(command, Some(60_000)).unwrap();
    p.exp_string(&format!("Successfully connected to {vm}'s serial console"))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        p.send("\r").unwrap();
        p.flush().unwrap();
        p.exp_string(&format!("{vm} login: ")).unwrap();
        p.send("debian\r").unwrap();
        p.flush().unwrap();
        p.exp_string("Password: ").unwrap();
        p.send("Sec0nd-pass\r").unwrap();
        p.flush().unwrap();
        match p.exp_any(vec![
            rexpect::ReadUntil::String(format!("debian@{vm}:~$ ")),
            rexpect::ReadUntil::String("Login incorrect".into()),
        ]) {
            Ok((_, m)) if m.starts_with("debian@") => break,
            other => assert!(Instant::now() < deadline, "console login: {other:?}"),
        }
    }
    p.send("echo who=$(id -un)\r").unwrap();
    p.flush().unwrap();
    p.exp_string("who=debian").unwrap();
    // Someone on the console: the agent and `who` both list the console's login.
    let who = guest("who | cut -d' ' -f1 | sort -u");
    assert_eq!(who, "debian\n");
    until(
        "userlist shows the console login",
        Duration::from_secs(30),
        || {
            let list: serde_json::Value =
                serde_json::from_str(&ok(env.vm(&["userlist", vm, "-o", "json"]))).unwrap();
            let mut names: Vec<String> = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|u| u["userName"].as_str().map(str::to_owned))
                .collect();
            names.sort();
            names.dedup();
            (names.join("\n") + "\n" == who)
                .then_some(())
                .ok_or(list.to_string())
        },
    );
    let table = ok(env.vm(&["userlist", vm]));
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("debian ")),
        "{table}"
    );
    p.send("exit\r").unwrap();
    p.send("\x1d").unwrap();
    p.flush().unwrap();
    p.exp_eof().unwrap();
    ok(env.vm(&["delete", vm]));
    eprintln!("whole scenario: {:.1}s", t0.elapsed().as_secs_f64());
}
