//! `kubectl vm logs` end to end: the guest's serial console history from KubeVirt's
//! `guest-console-log` container (the emulator's guests write it), compared with real kubectl
//! reading the same container; follow, tail, since, timestamps; the one line that says which
//! setting keeps it; Deckhouse, which keeps none; `--launcher` on both.

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{Env, fails, ok, on_tty};

/// The login guests' boot banner (tests/emulator/src/core/guest.rs LOGIN_SCRIPT).
const BANNER: &str = "Emulated Linux guest (kubevm-emulator) ttyS0";

/// The launcher pod of VM `name` (by the label KubeVirt gives it).
fn launcher(env: &Env, name: &str) -> String {
    ok(env.kubectl(&[
        "get",
        "pods",
        "-l",
        &format!("kubevirt.io=virt-launcher,vm.kubevirt.io/name={name}"),
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]))
}

/// Lines of a running `kubectl-vm` child's stdout, read in the background.
fn lines_of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn send(session: &mut rexpect::session::PtySession, text: &str) {
    session.send(text).unwrap();
    session.flush().unwrap();
}

/// Waits (on output) for a line containing `needle`.
#[track_caller]
fn wait_line(rx: &mpsc::Receiver<String>, needle: &str) {
    loop {
        match rx.recv_timeout(Duration::from_secs(15)) {
            Ok(line) if line.contains(needle) => return,
            Ok(_) => {}
            Err(e) => panic!("no line with {needle:?}: {e}"),
        }
    }
}

#[test]
fn kubevirt_console_history_follow_tail_since() {
    let env = Env::kubevirt();
    ok(env.vm(&[
        "create",
        "demo",
        "--blank",
        "64Mi",
        "--no-platform-ssh",
        "--console-log",
        "--wait",
        "--timeout",
        "60s",
    ]));
    let set = ok(env.kubectl(&[
        "get",
        "vm",
        "demo",
        "-o",
        "jsonpath={.spec.template.spec.domain.devices.logSerialConsole}",
    ]));
    assert_eq!(set, "true");
    let pod = launcher(&env, "demo");

    // The boot messages, exactly what kubectl reads from the same container.
    let history = ok(env.vm(&["logs", "demo"]));
    assert!(history.contains(&format!("{BANNER}\n")), "{history:?}");
    let reference = ok(env.kubectl(&["logs", &pod, "-c", "guest-console-log"]));
    assert_eq!(history, reference);

    // Follow, then a line the guest writes after the console has been left.
    let mut follow = env.spawn(&["logs", "demo", "-f"]);
    let rx = lines_of(&mut follow);
    wait_line(&rx, BANNER);
    let mut console = on_tty(&env, &["console", "demo"]);
    console
        .exp_string("Successfully connected to demo's serial console")
        .unwrap();
    send(&mut console, "\r");
    console.exp_string("demo login: ").unwrap();
    send(&mut console, "cloud\r");
    console.exp_string("Password: ").unwrap();
    send(&mut console, "cloud\r");
    console.exp_string("cloud@demo:~$ ").unwrap();
    // Written by the guest once the console is gone: `read` waits for a file the test
    // creates after leaving.
    let flag = env.dir.path().join("go");
    send(
        &mut console,
        &format!(
            "(while [ ! -e {f} ]; do sleep 0.1; done; echo after-$((40+2))) &\r",
            f = flag.display()
        ),
    );
    console.exp_string("cloud@demo:~$ ").unwrap();
    send(&mut console, "\x1d");
    console.exp_eof().unwrap();
    std::fs::write(&flag, "").unwrap();
    wait_line(&rx, "after-42");
    let _ = follow.kill();
    let _ = follow.wait();
    let later = ok(env.vm(&["logs", "demo"]));
    assert!(later.contains("after-42\n"), "{later}");

    // --tail and --timestamps as kubectl gives them.
    assert_eq!(
        ok(env.vm(&["logs", "demo", "--tail", "2"])),
        ok(env.kubectl(&["logs", &pod, "-c", "guest-console-log", "--tail", "2"]))
    );
    let stamped = ok(env.vm(&["logs", "demo", "--tail", "1", "--timestamps"]));
    assert!(stamped.trim_end().ends_with("after-42"), "{stamped}");
    assert_eq!(
        stamped,
        ok(env.kubectl(&[
            "logs",
            &pod,
            "-c",
            "guest-console-log",
            "--tail",
            "1",
            "--timestamps"
        ]))
    );

    // --since filters on the kubelet's timestamps: only the recent line of a log with an old one.
    ok(env.kubectl(&[
        "annotate", "pod", &pod, "--overwrite",
        "emulator.kubevm.io/log.guest-console-log=2020-01-01T00:00:00Z old boot\n2999-01-01T00:00:00Z current\n",
    ]));
    assert_eq!(ok(env.vm(&["logs", "demo", "--since", "1h"])), "current\n");
    assert_eq!(
        ok(env.kubectl(&["logs", &pod, "-c", "guest-console-log", "--since=1h"])),
        "current\n"
    );

    // No earlier run left: said in one line.
    let err = fails(&env, &["logs", "demo", "--previous"], 1);
    assert!(
        err.contains("no virt-launcher pod of an earlier run of demo.default is left"),
        "{err}"
    );
}

#[test]
fn kubevirt_not_kept_says_the_setting_and_launcher_reads_compute() {
    let env = Env::kubevirt();
    // The fixture's launcher pod of web has no guest-console-log container.
    let err = fails(&env, &["logs", "web"], 2);
    assert_eq!(
        err,
        "Error: web.default does not keep its serial console log (its virt-launcher pod virt-launcher-web-x7k2p has no guest-console-log container): set spec.template.spec.domain.devices.logSerialConsole: true on the VM (`kubectl vm create --console-log` does) and restart it, or remove spec.configuration.virtualMachineOptions.disableSerialConsoleLog from the KubeVirt CR (then every VM that does not set logSerialConsole: false keeps it from its next start)"
    );
    assert_eq!(
        ok(env.vm(&["logs", "web", "--launcher"])),
        ok(env.kubectl(&["logs", "virt-launcher-web-x7k2p", "-c", "compute"]))
    );
    assert_eq!(
        ok(env.vm(&["logs", "web", "--launcher", "--tail", "1"])),
        "{\"component\":\"virt-launcher\",\"level\":\"info\",\"msg\":\"Synced vmi\",\"name\":\"web\"}\n"
    );
    // A VM that is not running has no launcher.
    let err = fails(&env, &["logs", "batch", "-n", "dev", "--launcher"], 1);
    assert_eq!(
        err,
        "Error: batch.dev is not running: it has no virt-launcher pod"
    );
    // A VM that does not exist is not found, as kubectl says it.
    let err = fails(&env, &["logs", "nosuch"], 1);
    assert!(err.contains("not found"), "{err}");
}

#[test]
fn deckhouse_keeps_no_console_history() {
    let env = Env::deckhouse();
    let err = fails(&env, &["logs", "linux-vm"], 2);
    assert!(
        err.starts_with("Error: Deckhouse virtualization keeps no serial console history"),
        "{err}"
    );
    let err = fails(
        &env,
        &[
            "create",
            "demo",
            "--blank",
            "64Mi",
            "--no-platform-ssh",
            "--console-log",
        ],
        2,
    );
    assert!(
        err.contains(
            "--console-log is refused: Deckhouse virtualization keeps no serial console history"
        ),
        "{err}"
    );
    assert_eq!(
        ok(env.vm(&["logs", "linux-vm", "--launcher"])),
        ok(env.kubectl(&["logs", "virt-launcher-linux-vm-g5xvz", "-c", "compute"]))
    );
}

#[test]
fn debug_bundle_carries_the_console_history_masked() {
    let env = Env::kubevirt();
    ok(env.vm(&[
        "create",
        "demo",
        "--blank",
        "64Mi",
        "--no-platform-ssh",
        "--console-log",
        "--wait",
        "--timeout",
        "60s",
    ]));
    // A secret typed at the login prompt is echoed onto the serial console, into its log.
    let mut console = on_tty(&env, &["console", "demo"]);
    console
        .exp_string("Successfully connected to demo's serial console")
        .unwrap();
    send(&mut console, "password=Typed-Secret-7731\r");
    console.exp_string("Password: ").unwrap();
    send(&mut console, "\x1d");
    console.exp_eof().unwrap();
    let history = ok(env.vm(&["logs", "demo"]));
    assert!(history.contains("password=Typed-Secret-7731"), "{history}");

    let archive = env.dir.path().join("bundle.tar.gz");
    ok(env.vm(&[
        "collect-debug-info",
        "demo",
        "-o",
        archive.to_str().unwrap(),
    ]));
    let pod = launcher(&env, "demo");
    let out = env
        .command("tar")
        .args(["xzf", archive.to_str().unwrap(), "-O", "--wildcards"])
        .arg(format!("*/log/{pod}/guest-console-log.log"))
        .output()
        .unwrap();
    let kept = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(kept.contains(BANNER), "{kept}");
    assert!(kept.contains("demo login: password="), "{kept}");
    assert!(!kept.contains("Typed-Secret-7731"), "{kept}");
}
