//! `kubectl vm console` through a pseudo-terminal and through pipes, against the emulator's
//! guests: log in, run a command, leave, and the terminal modes are exactly as before.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use rexpect::session::PtySession;
use serde_json::Value;

use crate::common::{BIN, Env, exit_code, on_tty};

const LOGIN: &str = "cloud";
const CONNECTED: &str = "Successfully connected to web's serial console. Press Ctrl+] to exit.";

/// `kubectl-vm ARGS` on a pseudo-terminal inside a shell that records `stty -g` before and after.
fn wrapped(env: &Env, args: &[&str]) -> PtySession {
    let dir = env.dir.path();
    let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
    let script = format!(
        "stty -g > {d}/stty.before; {BIN} {}; echo \"EXIT=$?\"; stty -g > {d}/stty.after; echo WRAPPER-DONE",
        quoted.join(" "),
        d = dir.display()
    );
    let mut command = env.command("sh");
    command.args(["-c", &script]).env("TERM", "xterm");
    rexpect::session::spawn_command(command, Some(30_000)).unwrap()
}

/// Waits for the wrapper to finish; returns the exit code of kubectl-vm and checks the
/// terminal modes are exactly those from before.
#[track_caller]
fn finish(env: &Env, session: &mut PtySession) -> i32 {
    let (_, exit) = session.exp_regex(r"EXIT=\d+").unwrap();
    session.exp_string("WRAPPER-DONE").unwrap();
    let code: i32 = exit.trim_start_matches("EXIT=").parse().unwrap();
    let read = |name: &str| std::fs::read_to_string(env.dir.path().join(name)).unwrap();
    assert_eq!(
        read("stty.before"),
        read("stty.after"),
        "terminal modes changed"
    );
    code
}

fn send(session: &mut PtySession, text: &str) {
    session.send(text).unwrap();
    session.flush().unwrap();
}

/// Logs into the guest and checks a command's output.
fn login_and_run(session: &mut PtySession, host: &str, marker: &str) {
    session.exp_string(&format!("{host} login: ")).unwrap();
    send(session, &format!("{LOGIN}\r"));
    session.exp_string("Password: ").unwrap();
    send(session, &format!("{LOGIN}\r"));
    session.exp_string(&format!("{LOGIN}@{host}:~$ ")).unwrap();
    run(session, marker);
}

/// Runs `echo MARKER-$((40+2))` and waits for `MARKER-42` (only the shell computes it).
fn run(session: &mut PtySession, marker: &str) {
    send(session, &format!("echo {marker}-$((40+2))\r"));
    session.exp_string(&format!("{marker}-42")).unwrap();
}

/// The pid of the process whose command line contains `needle`.
fn pid_with(needle: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.starts_with(BIN) && cmdline.contains(needle) {
                return pid;
            }
        }
        assert!(Instant::now() < deadline, "kubectl-vm did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn terminal_session_logs_in_runs_a_command_and_leaves_with_ctrl_bracket() {
    let env = Env::kubevirt();
    let log = env.dir.path().join("console.log");
    let log_arg = log.display().to_string();
    let mut session = wrapped(&env, &["console", "web", "--log", &log_arg]);
    session.exp_string(CONNECTED).unwrap();
    login_and_run(&mut session, "web", "tty");
    send(&mut session, "\x1d");
    assert_eq!(finish(&env, &mut session), 0);
    assert_eq!(mode(&log), 0o600);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("tty-42"), "{logged}");

    // The request as virtctl sends it (KubeVirt FACTS §2.2).
    let request = env
        .emulator
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/console"))
        .unwrap();
    assert_eq!(
        request.path,
        "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/web/console"
    );
    assert_eq!(
        (
            request.method.as_str(),
            request.query.as_str(),
            request.status
        ),
        ("GET", "", 101)
    );
    assert_eq!(
        request.header("sec-websocket-protocol"),
        Some("plain.kubevirt.io")
    );
    assert_eq!(request.header("upgrade"), Some("websocket"));
}

#[test]
fn dropped_connection_reconnects_and_a_lost_vm_ends_with_the_terminal_restored() {
    let env = Env::kubevirt();
    let mut session = wrapped(&env, &["console", "web"]);
    session.exp_string(CONNECTED).unwrap();
    login_and_run(&mut session, "web", "before");
    // The network drops (no close frame): the client reconnects to the same guest.
    env.emulator.drop_streams("default", "web");
    session
        .exp_string("Reconnected to web's serial console.")
        .unwrap();
    run(&mut session, "after");
    // The VM goes away: the session ends with an error, the terminal as it was.
    let output = env.vm(&["delete", "web", "-y"]);
    assert!(output.status.success(), "{output:?}");
    session
        .exp_string("virtualmachine \"web\" not found")
        .unwrap();
    assert_eq!(finish(&env, &mut session), 1);
}

/// The console Lease of `web` in `default` is gone (released by a session that ended cleanly).
fn assert_no_console_lease(env: &Env, when: &str) {
    let leases = env
        .emulator
        .objects("coordination.k8s.io", "leases", Some("default"));
    assert!(
        leases
            .iter()
            .all(|l| l["metadata"]["name"] != "kubectl-vm-console-web"),
        "{when}: {leases:?}"
    );
}

#[test]
fn signals_restore_the_terminal() {
    let env = Env::kubevirt();
    for signal in ["TERM", "HUP", "INT"] {
        // The log path is unique to this run: it finds the process.
        let log = env
            .dir
            .path()
            .join(format!("{signal}.log"))
            .display()
            .to_string();
        let mut session = wrapped(&env, &["console", "web", "--log", &log]);
        session.exp_string(CONNECTED).unwrap();
        session.exp_string("web login: ").unwrap();
        let pid = pid_with(&log);
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(finish(&env, &mut session), 130, "SIG{signal}");
        // Ended cleanly: the session Lease is released.
        assert_no_console_lease(&env, &format!("SIG{signal}"));
    }
}

#[test]
fn missing_vm_is_one_line_and_a_stopped_vm_is_waited_for() {
    let env = Env::kubevirt();
    let output = env.vm(&["console", "nope"]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        crate::common::stderr(&output).trim_end(),
        "Error: virtualmachine \"nope\" not found in namespace \"default\""
    );
    // `batch` in dev is Halted: it waits, showing the phase, until --timeout.
    let output = env.vm(&["console", "batch", "-n", "dev", "--timeout", "2s"]);
    let err = crate::common::stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.contains("Waiting for VirtualMachine \"batch\" serial console. Current VM phase: Stopped. Press Ctrl+] to exit."),
        "{err}"
    );
    assert!(
        err.trim_end().ends_with(
            "Error: timed out waiting for VirtualMachine \"batch\" serial console (after 2s)"
        ),
        "{err}"
    );
    // virtctl retries the console request while the VMI is missing or not running.
    let tries = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| {
            r.path
                .ends_with("/namespaces/dev/virtualmachineinstances/batch/console")
        })
        .count();
    assert!(tries >= 2, "{tries}");
}

/// `kubectl-vm ARGS` off a terminal: `input` on stdin, then end of input; the output once it
/// ends.
fn piped(env: &Env, args: &[&str], input: &[u8]) -> Output {
    let mut child = env
        .command(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn piped_session_runs_a_command_and_exits_zero() {
    let env = Env::kubevirt();
    let output = piped(
        &env,
        &["console", "web"],
        b"cloud\ncloud\necho piped-$((40+2))\n",
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(stdout.contains("piped-42"), "{stdout}");
}

#[test]
fn vm_restart_during_a_session_reconnects_kubevirt() {
    let env = Env::kubevirt();
    let mut session = on_tty(&env, &["console", "web"]);
    session.exp_string(CONNECTED).unwrap();
    login_and_run(&mut session, "web", "first-boot");
    // The VM restarts: its VMI is replaced by a new one (a new uid), which boots first.
    let vmi = |phase: &str| {
        let mut vmi = env
            .emulator
            .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
            .into_iter()
            .find(|v| v["metadata"]["name"] == "web")
            .unwrap();
        vmi["metadata"]["uid"] = Value::from("7b000000-0000-4000-8000-0000000000aa");
        vmi["status"]["phase"] = Value::from(phase);
        vmi
    };
    env.emulator.put_object(vmi("Scheduling"));
    // The console saw its stream end and the VMI not running: only then the new boot runs.
    session
        .exp_string("The console of web was interrupted")
        .unwrap();
    env.emulator.put_object(vmi("Running"));
    session
        .exp_string("Reconnected to web's serial console.")
        .unwrap();
    // A fresh boot: a login prompt again, and the session goes on.
    login_and_run(&mut session, "web", "second-boot");
    send(&mut session, "\x1d");
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 0);
}

#[test]
fn vm_restart_during_a_session_reconnects_deckhouse() {
    let env = Env::deckhouse();
    let mut session = on_tty(&env, &["console", "linux-vm"]);
    session
        .exp_string("Successfully connected to linux-vm's serial console.")
        .unwrap();
    login_and_run(&mut session, "linux-vm", "first-boot");
    // Stopped, then started again (a new start time): a new boot.
    let vm = |phase: &str, started: &str| {
        let mut vm = env
            .emulator
            .objects(
                "virtualization.deckhouse.io",
                "virtualmachines",
                Some("default"),
            )
            .into_iter()
            .find(|v| v["metadata"]["name"] == "linux-vm")
            .unwrap();
        vm["status"]["phase"] = Value::from(phase);
        vm["status"]["stats"]["lastStartTime"] = Value::from(started);
        vm
    };
    env.emulator
        .put_object(vm("Stopped", "2026-01-10T09:03:00Z"));
    session.exp_string("Current VM phase: Stopped").unwrap();
    env.emulator
        .put_object(vm("Running", "2026-11-30T10:00:00Z"));
    session
        .exp_string("Reconnected to linux-vm's serial console.")
        .unwrap();
    login_and_run(&mut session, "linux-vm", "second-boot");
    send(&mut session, "\x1d");
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 0);
}

/// Two users on one console: the second is asked (naming the first), `N` leaves the first
/// alone, `w` connects once the first leaves, `--force` displaces and the displaced client
/// says why and exits 0.
fn two_consoles(env: &Env, vm: &str) {
    let connected =
        format!("Successfully connected to {vm}'s serial console. Press Ctrl+] to exit.");
    let as_user = |user: &'static str| -> Vec<&'static str> {
        vec!["--as", user, "--as-group", "system:masters"]
    };
    let mut first = on_tty(env, &["console", vm]);
    first.exp_string(&connected).unwrap();
    login_and_run(&mut first, vm, "first");

    let with = |user: &'static str, extra: &[&str]| {
        let mut args = vec!["console", vm];
        args.extend_from_slice(extra);
        args.extend(as_user(user));
        on_tty(env, &args)
    };
    let mut second = with("bob", &[]);
    second
        .exp_string(&format!("The serial console of {vm} is in use:"))
        .unwrap();
    second.exp_string("user       admin").unwrap();
    second
        .exp_string("from the kubectl vm command line")
        .unwrap();
    second
        .exp_string("Connect and disconnect them? [y] yes  [N] no  [w] wait until free: ")
        .unwrap();
    second.send_line("n").unwrap();
    second.exp_eof().unwrap();
    assert_eq!(exit_code(&second), 0);
    run(&mut first, "untouched");

    let mut waiting = with("bob", &[]);
    waiting.exp_string("wait until free: ").unwrap();
    waiting.send_line("w").unwrap();
    waiting
        .exp_string(&format!(
            "Waiting for the serial console of {vm} to be released."
        ))
        .unwrap();
    send(&mut first, "\x1d");
    first.exp_eof().unwrap();
    assert_eq!(exit_code(&first), 0);
    waiting.exp_string(&connected).unwrap();
    // The guest kept running: still logged in.
    waiting.exp_string(&format!("{LOGIN}@{vm}:~$ ")).unwrap();
    run(&mut waiting, "second");

    let mut forced = with("carol", &["--force"]);
    forced.exp_string(&connected).unwrap();
    waiting
        .exp_string(&format!("another user connected to the console of {vm}"))
        .unwrap();
    waiting.exp_eof().unwrap();
    assert_eq!(exit_code(&waiting), 0);
    run(&mut forced, "third");
    send(&mut forced, "\x1d");
    forced.exp_eof().unwrap();
    assert_eq!(exit_code(&forced), 0);
}

#[test]
fn two_consoles_kubevirt() {
    let env = Env::kubevirt();
    two_consoles(&env, "web");
    // The holder was recorded in our Lease and released on exit.
    assert_no_console_lease(&env, "after two consoles");
    let lease_writes: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| {
            r.path
                == "/apis/coordination.k8s.io/v1/namespaces/default/leases/kubectl-vm-console-web"
                && r.method == "PUT"
        })
        .collect();
    assert!(!lease_writes.is_empty());
}

#[test]
fn two_consoles_deckhouse() {
    let env = Env::deckhouse();
    two_consoles(&env, "linux-vm");
    // The probe and the stream as d8 sends them (Deckhouse FACTS §2.1, §9).
    let requests = env.emulator.requests();
    let path = "/apis/subresources.virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualmachines/linux-vm/console";
    let probe = requests
        .iter()
        .find(|r| r.path == path && r.query == "probe=true")
        .expect("a session probe");
    assert_eq!((probe.method.as_str(), probe.status), ("GET", 200));
    assert_eq!(probe.header("upgrade"), None);
    let stream = requests
        .iter()
        .find(|r| r.path == path && r.query.is_empty())
        .expect("a console stream");
    assert_eq!(stream.status, 101);
    assert_eq!(
        stream.header("sec-websocket-protocol"),
        Some("plain.virtualization.deckhouse.io")
    );
    let events = env.emulator.objects("", "events", Some("default"));
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "ConsoleSessionPreempted")
    );
}

/// alice's console of `api` in `dev`: `get` on `virtualmachineinstances/console`, as KubeVirt's
/// `kubevirt.io:edit` grants it (pkg/virt-operator/resource/generate/rbac/cluster.go), and no
/// right on Leases (she reads `dev` through the emulator's reader RoleBinding, no writes).
fn grant_alice_console_of_api(env: &Env) {
    let rbac = "rbac.authorization.k8s.io";
    env.emulator.put_object(serde_json::json!({
        "apiVersion": format!("{rbac}/v1"), "kind": "Role",
        "metadata": {"name": "api-console", "namespace": "dev"},
        "rules": [{"apiGroups": ["subresources.kubevirt.io"],
            "resources": ["virtualmachineinstances/console"], "resourceNames": ["api"], "verbs": ["get"]}]}));
    env.emulator.put_object(serde_json::json!({
        "apiVersion": format!("{rbac}/v1"), "kind": "RoleBinding",
        "metadata": {"name": "alice-api-console", "namespace": "dev"},
        "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "api-console"},
        "subjects": [{"apiGroup": rbac, "kind": "User", "name": "alice"}]}));
}

#[test]
fn a_user_without_the_console_grant_is_refused_in_one_line() {
    let env = Env::kubevirt();
    // Reading the VM is not enough: the API server authorizes the subresource.
    let output = piped(
        &env,
        &["console", "api", "--context", "emulator-restricted"],
        b"",
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let err = String::from_utf8_lossy(&output.stderr);
    // One line: the session Lease alice cannot write either is not warned about for a
    // console she never reached.
    assert_eq!(
        err.trim_end(),
        "Error: forbidden: user \"alice\" cannot get virtualmachineinstances/console.subresources.kubevirt.io \"api\" in namespace \"dev\"",
        "{err}"
    );
    assert!(String::from_utf8_lossy(&output.stdout).is_empty());
}

#[test]
fn a_user_without_lease_rights_still_connects_and_is_warned_once() {
    let env = Env::kubevirt();
    grant_alice_console_of_api(&env);
    let output = piped(
        &env,
        &["console", "api", "--context", "emulator-restricted"],
        b"cloud\ncloud\necho alice-$((40+2))\n",
    );
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("alice-42"));
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        err.matches("Warning: cannot record this session, so others will not see you connected: forbidden: user \"alice\" cannot update leases.coordination.k8s.io").count(),
        1,
        "{err}"
    );
}

#[test]
fn without_lease_rights_a_cut_stream_ends_like_virtctl_instead_of_fighting() {
    let env = Env::kubevirt();
    grant_alice_console_of_api(&env);
    let mut session = on_tty(
        &env,
        &["console", "api", "--context", "emulator-restricted"],
    );
    session
        .exp_string("Successfully connected to api's serial console.")
        .unwrap();
    session.exp_string("api login: ").unwrap();
    // Cut while the VM keeps running: nothing tells a takeover from a network failure.
    env.emulator.drop_streams("dev", "api");
    session
        .exp_string("You were disconnected from the console of api. This could be caused by one of the following:")
        .unwrap();
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 0);
}

#[test]
fn off_a_terminal_the_holder_is_disconnected_with_a_warning() {
    let env = Env::kubevirt();
    let mut first = on_tty(&env, &["console", "web"]);
    first.exp_string(CONNECTED).unwrap();
    first.exp_string("web login: ").unwrap();
    let output = piped(
        &env,
        &[
            "console",
            "web",
            "--as",
            "bob",
            "--as-group",
            "system:masters",
        ],
        b"",
    );
    assert!(output.status.success(), "{output:?}");
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        err.starts_with("Warning: disconnecting admin from the serial console of web, connected "),
        "{err}"
    );
    first
        .exp_string("another user connected to the console of web")
        .unwrap();
    first.exp_eof().unwrap();
    assert_eq!(exit_code(&first), 0);
}
