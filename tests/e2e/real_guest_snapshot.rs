//! Snapshot and restore on a real guest: a file written (and synced) in the running guest,
//! `snapshot create`, the file changed, `snapshot restore --stop` (the VM stops, its disk is
//! rolled back and it boots again), and the guest's file has the original content again: its
//! `sha256sum` in the guest equals the host's `sha256sum` of the content written.
//!
//! The restore's boot is one of the scenario's boots (it stands in for `restart`), so the step
//! adds no boot. The file is changed on the serial console as root: the scenario breaks the
//! platform's ssh trust before the snapshot, so the restored boot must mend it as a reboot
//! does. The commands are the same on both flavors.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::real_guest::{ssh, ssh_until_ok};

/// In `/var/tmp`, which survives boots (systemd-tmpfiles empties `/tmp`).
const FILE: &str = "/var/tmp/kubevm-snapshot-check.txt";
const ORIGINAL: &str = "written before the snapshot";
const CHANGED: &str = "changed after the snapshot";

/// The host's `sha256sum` of `content` and a newline (what `printf '%s\n'` writes).
fn sha256(content: &str) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{content}").unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

/// The `sha256sum` of the file in the guest, logged in as `login` (`[-i KEY] USER@VM`).
#[track_caller]
fn guest_sha(env: &Env, login: &[&str]) -> String {
    let mut args = login.to_vec();
    args.extend(["--", "sha256sum", FILE]);
    let out = ssh(env, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_owned()
}

/// Writes the original content as `login`'s user and syncs it to the disk.
#[track_caller]
pub(crate) fn write_original(env: &Env, login: &[&str]) {
    let mut args = login.to_vec();
    let script = format!("printf '%s\\n' '{ORIGINAL}' > {FILE} && sync");
    args.extend(["--", &script]);
    let out = ssh(env, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(guest_sha(env, login), sha256(ORIGINAL));
}

/// `snapshot create`, the file changed as root on the serial console, `restore --stop`;
/// returns when the restore has returned (the VM started again from the restored disk).
pub(crate) fn snapshot_change_restore(env: &Env, flavor: &str, vm: &str) -> Instant {
    let t0 = Instant::now();
    let out = ok(env.vm(&["snapshot", "create", vm, "before-change"]));
    eprintln!(
        "[{flavor}] snapshot create: {:.1}s: {out}",
        t0.elapsed().as_secs_f64()
    );
    assert!(!out.contains("crash-consistent"), "the agent froze: {out}");

    let changed = sha256(CHANGED);
    assert_ne!(changed, sha256(ORIGINAL));
    {
        let mut command = env.command(BIN);
        command.args(["console", vm]).env("TERM", "xterm");
        let mut p = rexpect::session::spawn_command(command, Some(120_000)).unwrap();
        p.exp_string(&format!("Successfully connected to {vm}'s serial console"))
            .unwrap();
        p.send("\r").unwrap();
        p.flush().unwrap();
        // The scenario's console step may have left root logged in on the serial line.
        let (_, seen) = p
            .exp_regex(&format!(r"({vm} login: |root@{vm}:~# )"))
            .unwrap();
        if seen.ends_with("login: ") {
            p.send("root\r").unwrap();
            p.flush().unwrap();
            p.exp_string("Password: ").unwrap();
            p.send("root\r").unwrap();
            p.flush().unwrap();
            p.exp_regex(&format!(r"root@{vm}:~# ")).unwrap();
        }
        p.send(&format!(
            // The file is ops's in a sticky directory: root may not open it for writing
            // (fs.protected_regular), so it is replaced.
            "rm -f {FILE} && printf '%s\\n' '{CHANGED}' > {FILE} && sync && sha256sum {FILE}\r"
        ))
        .unwrap();
        p.flush().unwrap();
        p.exp_string(&format!("{changed}  {FILE}")).unwrap();
        p.send("exit\r").unwrap();
        p.send("\x1d").unwrap();
        p.flush().unwrap();
        p.exp_eof().unwrap();
    }

    let t1 = Instant::now();
    let out = ok(env.vm(&[
        "snapshot",
        "restore",
        "before-change",
        "--stop",
        "--timeout",
        "300s",
    ]));
    eprintln!(
        "[{flavor}] snapshot restore --stop: {:.1}s: {out}",
        t1.elapsed().as_secs_f64()
    );
    Instant::now()
}

/// Once the restored VM answers: the file as it was at the snapshot; the snapshot deleted.
#[track_caller]
pub(crate) fn check_restored(env: &Env, flavor: &str, login: &[&str], restored: Instant) {
    let mut args = login.to_vec();
    args.extend(["--", "true"]);
    ssh_until_ok(env, &args, Duration::from_secs(300));
    eprintln!(
        "[{flavor}] restored VM: boot to ssh {:.1}s after the restore returned",
        restored.elapsed().as_secs_f64()
    );
    assert_eq!(
        guest_sha(env, login),
        sha256(ORIGINAL),
        "the file as it was at the snapshot"
    );
    ok(env.vm(&["snapshot", "delete", "before-change"]));
}
