//! `kubectl vm ssh` end to end: `ca init` → `create` → ssh into the emulator's guest, whose
//! real sshd is configured by the VM's own cloud-init (the emulator's sshd guests, which need
//! root: see tests/emulator/src/core/sshd_guest.rs).

use std::process::Stdio;
use std::time::Duration;

use crate::common::{BIN, Env, ok, stderr, stdout};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";

/// `ca init` and a running VM `NAME` in `default`, created with the platform SSH setup.
pub fn vm_with_ca(env: &Env, name: &str, extra: &[&str]) {
    if !env.dir.path().join(".ca-done").exists() {
        ok(env.vm(&["ca", "init"]));
        std::fs::write(env.dir.path().join(".ca-done"), "").unwrap();
    }
    let mut args = vec!["create", name, "--wait", "--timeout", "60s"];
    args.extend_from_slice(extra);
    if !extra.contains(&"--image") {
        args.extend(["--image", IMAGE]);
    }
    ok(env.vm(&args));
}

fn ssh(env: &Env, args: &[&str], stdin: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = env
        .command(BIN)
        .arg("ssh")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn basics(env: &Env) {
    // Through the signer: the mode a platform team deploys.
    let _signer = crate::signer::start_signer(env, &[]);
    vm_with_ca(env, "sshvm", &[]);
    let out = ssh(env, &["sshvm", "--", "id", "-un"], b"");
    assert_eq!(
        (out.status.code(), stdout(&out).as_str()),
        (Some(0), "kubevm\n"),
        "{}",
        stderr(&out)
    );
    let out = ssh(env, &["sshvm", "--", "exit", "7"], b"");
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let out = ssh(env, &["sshvm", "--", "cat"], b"hi\n");
    assert_eq!(stdout(&out), "hi\n", "{}", stderr(&out));
    let out = ssh(env, &["-c", "echo err >&2; echo out", "sshvm"], b"");
    assert_eq!(
        (stdout(&out).as_str(), stderr(&out).as_str()),
        ("out\n", "err\n")
    );
    // The login used a certificate issued to the Kubernetes user for this VM.
    let out = ssh(env, &["sshvm", "--", "whoami"], b"");
    assert_eq!(stdout(&out), "kubevm\n");
    // The guest's host name is the VM's, as cloud-init sets it (the demo prints it).
    let out = ssh(env, &["sshvm", "--", "uname", "-n"], b"");
    assert_eq!(stdout(&out), "sshvm\n", "{}", stderr(&out));
}

#[test]
fn kubevirt_ssh_runs_commands() {
    basics(&Env::kubevirt());
}

#[test]
fn deckhouse_ssh_runs_commands() {
    basics(&Env::deckhouse());
}

fn interactive(env: &Env) {
    vm_with_ca(env, "sshvm", &[]);
    // A shell on the pty records the terminal modes before and after kubectl-vm.
    let before = env.dir.path().join("modes.before");
    let after = env.dir.path().join("modes.after");
    let script = format!(
        "stty -g > {b}; {bin} ssh sshvm; rc=$?; stty -g > {a}; exit $rc",
        b = before.display(),
        a = after.display(),
        bin = BIN
    );
    let mut command = env.command("sh");
    command.args(["-c", &script]).env("TERM", "xterm");
    let mut p = rexpect::session::spawn_command(command, Some(30_000)).unwrap();
    let pty = p.process().get_file_handle().unwrap();
    rustix::termios::tcsetwinsize(
        &pty,
        rustix::termios::Winsize {
            ws_row: 30,
            ws_col: 90,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .unwrap();
    p.send_line("echo T=$TERM; stty size").unwrap();
    p.exp_string("T=xterm").unwrap();
    p.exp_string("30 90").unwrap();
    // Resized while connected: SIGWINCH → window-change → the guest's pty.
    rustix::termios::tcsetwinsize(
        &pty,
        rustix::termios::Winsize {
            ws_row: 40,
            ws_col: 120,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )
    .unwrap();
    // SIGWINCH → window-change reaches the guest's pty asynchronously, with nothing to wait
    // on here: ask the guest until it has the new size (each question is a round trip).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        p.send_line("echo S=$(stty size)=").unwrap();
        let (_, size) = p.exp_regex(r"S=\d+ \d+=").unwrap();
        if size == "S=40 120=" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {size}");
    }
    p.send_line("tty").unwrap();
    p.exp_string("/dev/pts/").unwrap();
    p.send_line("exit 3").unwrap();
    p.exp_eof().unwrap();
    assert_eq!(crate::common::exit_code(&p), 3);
    let (b, a) = (
        std::fs::read_to_string(&before).unwrap(),
        std::fs::read_to_string(&after).unwrap(),
    );
    assert!(!b.is_empty());
    assert_eq!(b, a, "terminal modes restored");
}

/// SIGTERM while the terminal is raw (before: the process died and left it raw).
#[test]
fn sigterm_restores_the_terminal() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "sshvm", &[]);
    let before = env.dir.path().join("modes.before");
    let after = env.dir.path().join("modes.after");
    let shell_pid = env.dir.path().join("shell.pid");
    let script = format!(
        "echo $$ > {s}; stty -g > {b}; {bin} ssh sshvm; rc=$?; stty -g > {a}; echo rc=$rc",
        s = shell_pid.display(),
        b = before.display(),
        a = after.display(),
        bin = BIN
    );
    let mut command = env.command("sh");
    command.args(["-c", &script]).env("TERM", "xterm");
    let mut p = rexpect::session::spawn_command(command, Some(30_000)).unwrap();
    // The remote shell answers: kubectl-vm is connected, with the terminal raw.
    p.send_line("echo READY-$((6*7))").unwrap();
    p.exp_string("READY-42").unwrap();
    let shell = std::fs::read_to_string(&shell_pid)
        .unwrap()
        .trim()
        .to_owned();
    let children = std::process::Command::new("pgrep")
        .args(["-P", &shell])
        .output()
        .unwrap();
    let pid = stdout(&children).trim().to_owned();
    assert!(!pid.is_empty(), "kubectl-vm runs under the shell");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    p.exp_string("rc=").unwrap();
    p.exp_eof().unwrap();
    let (b, a) = (
        std::fs::read_to_string(&before).unwrap(),
        std::fs::read_to_string(&after).unwrap(),
    );
    assert_eq!(b, a, "terminal modes restored after SIGTERM");
}

/// `ssh` run by `sh` on a pseudo-terminal, which records the terminal modes before and after
/// in `modes.before` / `modes.after` and prints `rc=STATUS`.
fn ssh_on_tty(env: &Env, args: &str) -> rexpect::session::PtySession {
    let script = format!(
        "stty -g > {b}; {bin} ssh {args}; rc=$?; stty -g > {a}; echo rc=$rc",
        b = env.dir.path().join("modes.before").display(),
        a = env.dir.path().join("modes.after").display(),
        bin = BIN
    );
    let mut command = env.command("sh");
    command.args(["-c", &script]).env("TERM", "xterm");
    rexpect::session::spawn_command(command, Some(30_000)).unwrap()
}

fn assert_modes_restored(env: &Env) {
    let read = |f: &str| std::fs::read_to_string(env.dir.path().join(f)).unwrap();
    let (b, a) = (read("modes.before"), read("modes.after"));
    assert!(!b.is_empty());
    assert_eq!(b, a, "terminal modes restored");
}

/// `~.` ends a session whose remote side is busy (before: only killing kubectl-vm did),
/// with OpenSSH's status 255 and message, and the terminal back as it was.
#[test]
fn tilde_dot_disconnects_a_busy_session() {
    let env = Env::kubevirt();
    // -e is checked before any request, with OpenSSH's words.
    let out = ssh(&env, &["-e", "ab", "sshvm"], b"");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("Bad escape character 'ab'."),
        "{}",
        stderr(&out)
    );
    vm_with_ca(&env, "sshvm", &[]);
    let mut p = ssh_on_tty(&env, "sshvm");
    p.send_line("echo BUSY-$((6*7)); sleep 600").unwrap();
    p.exp_string("BUSY-42").unwrap();
    // The line above ended in a newline, so `~` starts an escape.
    p.send("~.").unwrap();
    p.flush().unwrap();
    p.exp_string("Connection to sshvm closed.").unwrap();
    p.exp_string("rc=255").unwrap();
    p.exp_eof().unwrap();
    assert_modes_restored(&env);
}

/// `~~` sends one `~`, a `~` inside a line is text, `~?` lists the escapes locally, `-e`
/// picks another escape character.
#[test]
fn escapes_of_an_interactive_session() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "sshvm", &[]);
    let mut p = ssh_on_tty(&env, "-e ^] sshvm");
    session_up(&mut p);
    start_cat(&mut p);
    // With ^] as the escape character, `~.` at a line start is text.
    p.send("~~A\n~.B\nc~.d\n").unwrap();
    p.flush().unwrap();
    let seen = p.exp_string("c~.d").unwrap();
    assert!(seen.contains("~~A") && seen.contains("~.B"), "{seen:?}");
    p.send("\x1d?").unwrap();
    p.flush().unwrap();
    p.exp_string("^]?").unwrap();
    p.exp_string("^].").unwrap();
    p.send("\x1d.").unwrap();
    p.flush().unwrap();
    p.exp_string("rc=255").unwrap();
    p.exp_eof().unwrap();
    assert_modes_restored(&env);

    let mut p = ssh_on_tty(&env, "sshvm");
    session_up(&mut p);
    start_cat(&mut p);
    p.send("~~A\nb~.c\n").unwrap();
    p.flush().unwrap();
    let seen = p.exp_string("b~.c").unwrap();
    assert!(seen.contains("~A") && !seen.contains("~~A"), "{seen:?}");
    p.send("~?").unwrap();
    p.flush().unwrap();
    p.exp_string("Escape sequences").unwrap();
    p.exp_string("~.").unwrap();
    // `~?` leaves the line start as it was: `~.` right after it still disconnects.
    p.send("~.").unwrap();
    p.flush().unwrap();
    p.exp_string("rc=255").unwrap();
    p.exp_eof().unwrap();
    assert_modes_restored(&env);
}

/// `~^Z` stops kubectl-vm with the terminal back in its own modes; `fg` makes it raw again
/// and the session goes on.
#[test]
fn tilde_ctrl_z_suspends_and_resumes() {
    use rustix::termios::LocalModes;
    let env = Env::kubevirt();
    vm_with_ca(&env, "sshvm", &[]);
    // Job control (set -m), as in an interactive shell: the stop is reported, `fg` continues.
    let file = |f: &str| env.dir.path().join(f).display().to_string();
    let script = format!(
        "set -m; stty -g > {b}; {bin} ssh sshvm; echo stopped-rc=$?; stty -g > {d}; fg; rc=$?; stty -g > {a}; echo rc=$rc",
        b = file("modes.before"),
        d = file("modes.during"),
        a = file("modes.after"),
        bin = BIN
    );
    let mut command = env.command("sh");
    command.args(["-c", &script]).env("TERM", "xterm");
    let mut p = rexpect::session::spawn_command(command, Some(30_000)).unwrap();
    session_up(&mut p);
    let pty = p.process().get_file_handle().unwrap();
    let canonical = || {
        rustix::termios::tcgetattr(&pty)
            .unwrap()
            .local_modes
            .contains(LocalModes::ICANON)
    };
    assert!(!canonical(), "raw while connected");
    p.send("~\x1a").unwrap();
    p.flush().unwrap();
    p.exp_string("[suspend kubectl-vm]").unwrap();
    // 128 + SIGTSTP: the shell saw kubectl-vm stop.
    p.exp_string("stopped-rc=148").unwrap();
    p.send_line("echo BACK-$((6*7))").unwrap();
    p.exp_string("BACK-42").unwrap();
    assert!(!canonical(), "raw again once continued");
    p.send("~.").unwrap();
    p.flush().unwrap();
    p.exp_string("rc=255").unwrap();
    p.exp_eof().unwrap();
    let read = |f: &str| std::fs::read_to_string(env.dir.path().join(f)).unwrap();
    assert_eq!(
        read("modes.before"),
        read("modes.during"),
        "modes while suspended"
    );
    assert_modes_restored(&env);
}

/// Run `cat` on the guest, and wait until its terminal echoes what is typed next (bash puts
/// the terminal back in canonical mode before it runs the line, so before the echo's output).
fn start_cat(p: &mut rexpect::session::PtySession) {
    p.send_line("echo CAT-$((6*7)); cat").unwrap();
    p.exp_string("CAT-42").unwrap();
}

/// Wait until the remote shell answers, so what is typed next goes through kubectl-vm (and
/// not the local terminal's echo before raw mode).
fn session_up(p: &mut rexpect::session::PtySession) {
    p.send_line("echo UP-$((6*7))").unwrap();
    p.exp_string("UP-42").unwrap();
}

#[test]
fn kubevirt_interactive_session() {
    interactive(&Env::kubevirt());
}

#[test]
fn deckhouse_interactive_session() {
    interactive(&Env::deckhouse());
}

fn fingerprint_of(line: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("k");
    std::fs::write(&f, line).unwrap();
    let out = std::process::Command::new("ssh-keygen")
        .arg("-l")
        .arg("-f")
        .arg(&f)
        .output()
        .unwrap();
    stdout(&out).split_whitespace().nth(1).unwrap().to_owned()
}

#[test]
fn host_key_changes_and_strict_checking() {
    let env = Env::kubevirt();
    ok(env.vm(&["ca", "init"]));
    std::fs::write(env.dir.path().join(".ca-done"), "").unwrap();
    // A guest without the platform setup: no host certificate, so known_hosts applies.
    vm_with_ca(&env, "plain", &["--no-platform-ssh"]);
    let known = env.dir.path().join(".kube/kubectl-vm/vm_known_hosts");
    let out = ssh(
        &env,
        &["--strict-host-key-checking", "yes", "plain", "--", "true"],
        b"",
    );
    assert_eq!(out.status.code(), Some(255));
    assert!(
        stderr(&out).contains("no host key known for plain.default"),
        "{}",
        stderr(&out)
    );
    assert!(!known.exists());
    let accept_new = [
        "--strict-host-key-checking",
        "accept-new",
        "plain",
        "--",
        "true",
    ];
    let out = ssh(&env, &accept_new, b"");
    // The host is recorded; the login itself fails (the guest does not trust the CA).
    assert_eq!(out.status.code(), Some(255));
    let err = stderr(&out);
    assert!(
        err.contains("Permanently added 'plain.default.vm'"),
        "{err}"
    );
    assert!(err.contains("kubectl vm get plain.default"), "{err}");
    let recorded = std::fs::read_to_string(&known).unwrap();
    assert!(
        recorded.starts_with("plain.default.vm ssh-ed25519 "),
        "{recorded}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&known).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let old = fingerprint_of(recorded.split_once(' ').unwrap().1);
    env.emulator.change_guest_host_key("default", "plain");
    let out = ssh(&env, &accept_new, b"");
    assert_eq!(out.status.code(), Some(255));
    // One error line (after the direct mode's notice, tested in signer.rs).
    let err: String = stderr(&out)
        .lines()
        .filter(|l| !l.starts_with("Notice: this cluster has no SSH signer"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("CHANGED") && err.contains(&old), "{err}");
    let fps: Vec<_> = err.match_indices("SHA256:").collect();
    assert_eq!(fps.len(), 2, "both fingerprints: {err}");
    assert_eq!(
        std::fs::read_to_string(&known).unwrap(),
        recorded,
        "not overwritten"
    );
}

#[test]
fn host_certificate_from_another_ca_refuses() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "sshvm", &[]);
    // Replace the platform CA: the VM's host certificate is now from another CA.
    ok(env.kubectl(&[
        "delete",
        "-n",
        "kubevm-system",
        "secret,configmap",
        "kubevm-ssh-ca",
    ]));
    ok(env.vm(&["ca", "init"]));
    let out = ssh(&env, &["sshvm", "--", "true"], b"");
    assert_eq!(out.status.code(), Some(255));
    let err = stderr(&out);
    assert!(
        err.contains("host certificate refused") && err.contains("not the platform SSH CA"),
        "{err}"
    );
}

#[test]
fn paused_and_stopped_vms_exit_255() {
    let env = Env::deckhouse();
    vm_with_ca(&env, "sshvm", &[]);
    env.emulator.set_guest_paused("default", "sshvm", true);
    let out = ssh(&env, &["sshvm", "--", "true"], b"");
    assert_eq!(out.status.code(), Some(255));
    assert!(stderr(&out).contains("is paused"), "{}", stderr(&out));
    env.emulator.set_guest_paused("default", "sshvm", false);
    let out = ssh(&env, &["-p", "2222", "sshvm", "--", "true"], b"");
    assert_eq!(out.status.code(), Some(255));
    assert!(
        stderr(&out).contains("nothing accepts connections on port 2222"),
        "{}",
        stderr(&out)
    );
    let out = ssh(&env, &["--ttl", "2h", "sshvm"], b"");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn identity_file_logs_in_as_a_cloud_init_user() {
    let env = Env::kubevirt();
    let key = env.dir.path().join("id_ed25519");
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(status.success());
    // (create's own --user flag is shadowed by the global kubeconfig --user, so the user comes
    // from the user's cloud-config, which create merges with the platform's.)
    let public = std::fs::read_to_string(format!("{}.pub", key.display())).unwrap();
    let user_data = env.dir.path().join("user-data.yaml");
    std::fs::write(
        &user_data,
        format!(
            "#cloud-config\nusers:\n- name: ops\n  shell: /bin/bash\n  ssh_authorized_keys:\n  - {}\n",
            public.trim()
        ),
    )
    .unwrap();
    vm_with_ca(
        &env,
        "sshvm",
        &["--cloud-init", user_data.to_str().unwrap()],
    );
    // -i: the key from the VM's cloud-init authorized_keys, no certificate.
    let out = ssh(
        &env,
        &["-i", key.to_str().unwrap(), "ops@sshvm", "--", "id", "-un"],
        b"",
    );
    assert_eq!(stdout(&out), "ops\n", "{}", stderr(&out));
    // Without -i no certificate is issued for "ops": only the platform user and the logins the
    // VM lists (create --guest-user) get one (before VM-scoped trust, any login did).
    let out = ssh(&env, &["ops@sshvm", "--", "id", "-un"], b"");
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "login \"ops\" is not allowed on virtual machine sshvm.default (allowed: kubevm)"
        ),
        "{}",
        stderr(&out)
    );
    // A key the guest does not know: refused, exit 255.
    let other = env.dir.path().join("other");
    std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .status()
        .unwrap();
    let out = ssh(
        &env,
        &["-i", other.to_str().unwrap(), "ops@sshvm", "--", "true"],
        b"",
    );
    assert_eq!(out.status.code(), Some(255));
    assert!(stderr(&out).contains("refused the key"), "{}", stderr(&out));
}

#[test]
fn without_the_ca_key_the_agent_is_used() {
    let env = Env::kubevirt();
    let key = env.dir.path().join("id_ed25519");
    assert!(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .status()
            .unwrap()
            .success()
    );
    let public = std::fs::read_to_string(format!("{}.pub", key.display())).unwrap();
    let user_data = env.dir.path().join("user-data.yaml");
    std::fs::write(
        &user_data,
        format!(
            "#cloud-config\nusers:\n- name: ops\n  shell: /bin/bash\n  ssh_authorized_keys:\n  - {}\n",
            public.trim()
        ),
    )
    .unwrap();
    vm_with_ca(
        &env,
        "sshvm",
        &["-n", "dev", "--cloud-init", user_data.to_str().unwrap()],
    );
    // alice may read the CA's public keys, not its private keys, and open sshvm's
    // port-forward (`get` on `virtualmachines/portforward`, as KubeVirt's `kubevirt.io:edit`
    // grants it: pkg/virt-operator/resource/generate/rbac/cluster.go).
    let rbac = "rbac.authorization.k8s.io";
    env.emulator.put_object(serde_json::json!({
        "apiVersion": format!("{rbac}/v1"), "kind": "Role",
        "metadata": {"name": "sshvm-portforward", "namespace": "dev"},
        "rules": [{"apiGroups": ["subresources.kubevirt.io"],
            "resources": ["virtualmachines/portforward"], "resourceNames": ["sshvm"], "verbs": ["get"]}]}));
    env.emulator.put_object(serde_json::json!({
        "apiVersion": format!("{rbac}/v1"), "kind": "RoleBinding",
        "metadata": {"name": "alice-sshvm-portforward", "namespace": "dev"},
        "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "sshvm-portforward"},
        "subjects": [{"apiGroup": rbac, "kind": "User", "name": "alice"}]}));
    let alice = [
        "--context",
        "emulator-restricted",
        "ops@sshvm.dev",
        "--",
        "id",
        "-un",
    ];
    let mut command = env.command(BIN);
    command.arg("ssh").args(alice).env_remove("SSH_AUTH_SOCK");
    let out = command.output().unwrap();
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot read the SSH CA"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("-i FILE"), "{}", stderr(&out));
    // With an agent holding the key: a one-line notice, then the login works.
    let sock = env.dir.path().join("agent.sock");
    let mut agent = std::process::Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&sock)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // ssh-agent prints its environment once the socket listens (ssh-agent.c).
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(agent.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert!(line.starts_with("SSH_AUTH_SOCK="), "{line}");
    let added = std::process::Command::new("ssh-add")
        .arg(&key)
        .env("SSH_AUTH_SOCK", &sock)
        .output()
        .unwrap();
    assert!(added.status.success(), "{}", stderr(&added));
    let out = env
        .command(BIN)
        .arg("ssh")
        .args(alice)
        .env("SSH_AUTH_SOCK", &sock)
        .output()
        .unwrap();
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(stdout(&out), "ops\n", "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("Notice: cannot read the SSH CA") && err.contains("ssh-agent"),
        "{err}"
    );
}

/// `-L LPORT:HOST:RPORT` carries a local connection through the VM to HOST:RPORT as the
/// guest sees it (the emulator's guests share this machine's network, so a server of the
/// test's own on 127.0.0.1 stands for a service next to the VM), both ways, while the
/// session runs a command.
#[test]
fn local_forward_reaches_a_service_through_the_vm() {
    use std::io::{BufRead, BufReader, Write};
    let env = Env::kubevirt();
    let _signer = crate::signer::start_signer(&env, &[]);
    vm_with_ca(&env, "fwd", &[]);
    let service = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let service_port = service.local_addr().unwrap().port();
    let served = std::thread::spawn(move || {
        let (conn, _) = service.accept().unwrap();
        let mut line = String::new();
        BufReader::new(&conn).read_line(&mut line).unwrap();
        (&conn)
            .write_all(format!("echo:{line}").as_bytes())
            .unwrap();
        line
    });
    let local_port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let forward = format!("{local_port}:127.0.0.1:{service_port}");
    let mut session = env
        .command(BIN)
        .args(["ssh", "fwd", "-L", &forward, "--", "sleep", "120"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The listener exists once the session is up: wait for it, not for a time.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let conn = loop {
        match std::net::TcpStream::connect(("127.0.0.1", local_port)) {
            Ok(conn) => break conn,
            Err(_) if std::time::Instant::now() < deadline => {
                if let Some(status) = session.try_wait().unwrap() {
                    let out = session.wait_with_output().unwrap();
                    panic!("ssh ended ({status}) before forwarding: {}", stderr(&out));
                }
                std::thread::park_timeout(Duration::from_millis(50));
            }
            Err(e) => panic!("the forward never listened: {e}"),
        }
    };
    (&conn).write_all(b"through the vm\n").unwrap();
    let mut answer = String::new();
    BufReader::new(&conn).read_line(&mut answer).unwrap();
    assert_eq!(answer, "echo:through the vm\n");
    assert_eq!(served.join().unwrap(), "through the vm\n");
    session.kill().unwrap();
    session.wait().unwrap();
}

/// `-T` gives no pseudo-terminal even when kubectl-vm has one (OpenSSH's `-T`): the remote
/// command sees no tty, and the local terminal is left as it was.
#[test]
fn no_tty_flag_runs_without_a_pseudo_terminal() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "notty", &[]);
    let mut p = ssh_on_tty(&env, "-T notty -- tty");
    p.exp_string("not a tty").unwrap();
    p.exp_string("rc=1").unwrap();
    assert_modes_restored(&env);
    // Without -T, the same command on a terminal gets one.
    let mut p = ssh_on_tty(&env, "-t notty -- tty");
    p.exp_regex("/dev/pts/[0-9]+").unwrap();
    p.exp_string("rc=0").unwrap();
}
