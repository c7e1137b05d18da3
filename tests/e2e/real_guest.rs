//! The product on a real guest OS: the emulator boots each running VM as a qemu TCG guest
//! (Debian 12, systemd, sshd, real cloud-init and qemu-guest-agent; tests/guest/build-image.sh)
//! with the cloud-init `create` generated, byte for byte.
//!
//! `ca init` → `create` with a user cloud-config, `--env`, `--guest-user` and `--ssh-key` →
//! `console` (log in as root, run a command) → `ssh` verified by the host certificate (no
//! known_hosts entry) → `ssh -i` as the guest user → a disk hotplugged and unplugged → the
//! trust files broken from inside, a file written → `snapshot create`, the file changed,
//! `snapshot restore --stop` (the second boot), the file as it was → CA-signed ssh again → `cloud-init status --long` done without errors → `stop --wait` (qemu has exited) →
//! a copy (`clone` on KubeVirt, `snapshot restore --new-vm` on Deckhouse) boots with an SSH
//! identity of its own (the third boot; real_guest_copy.rs) → `delete`. KubeVirt runs with the guest's network
//! restricted (no package mirror), Deckhouse with user-mode networking open. On KubeVirt a
//! memory dump of the first boot holds a string written into the guest's RAM
//! (real_guest_memory.rs). The VM has a secondary network, a second card in the guest with the
//! MAC the platform reports (real_guest_network.rs); `set resources` adds a vCPU and 512 MiB,
//! counted by the guest at once on KubeVirt (hotplug) and after the second boot on both
//! (real_guest_resources.rs).
//!
//! `cargo test -p kubectl-vm --test e2e real_guest -- --ignored` (both flavors = 2 guests).

use std::path::Path;
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubevm_emulator::core::qemu_guest::{QemuConfig, QemuGuests};

use crate::common::{BIN, Env, ok, stderr, stdout};

const MARKER_FILE: &str = "/var/lib/real-guest/written-by-user-config";
const RUNCMD_FILE: &str = "/var/lib/real-guest/runcmd-ran";
/// The static address of the KubeVirt guest's secondary network.
const STORAGE_ADDRESS: &str = "192.168.50.10/24";

/// Prints the guest's serial log tail when the scenario fails.
pub(crate) struct SerialTail {
    pub(crate) guests: Arc<QemuGuests>,
    pub(crate) vm: String,
}

/// Runs `env`'s VMs as qemu guests, with the guests' network restricted or not; the
/// returned tail shows `vm`'s serial log if the test fails.
pub(crate) fn qemu_guests(env: &Env, vm: &str, restricted: bool) -> SerialTail {
    let mut config = QemuConfig::from_dir(&QemuConfig::default_dir()).expect("the guest image");
    config.restrict_network = restricted;
    SerialTail {
        guests: env.emulator.use_qemu_guests(config).unwrap(),
        vm: vm.into(),
    }
}

impl Drop for SerialTail {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- serial log of default/{} (last 6000 bytes) ----\n{}\n---- end of serial log ----",
                self.vm,
                self.guests.serial_log_tail("default", &self.vm, 6000)
            );
        }
    }
}

fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

pub(crate) fn ssh(env: &Env, args: &[&str]) -> Output {
    env.command(BIN)
        .arg("ssh")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Retries `ssh ARGS` until it succeeds (the guest is still booting); returns its output.
#[track_caller]
pub(crate) fn ssh_until_ok(env: &Env, args: &[&str], limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        let out = ssh(env, args);
        if out.status.success() {
            return out;
        }
        assert!(
            Instant::now() < deadline,
            "ssh {args:?} kept failing: {}",
            stderr(&out)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

pub(crate) fn keygen(path: &Path) {
    let status = std::process::Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "real-guest-test",
            "-f",
        ])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

fn known_hosts_entries(env: &Env) -> usize {
    let path = env.dir.path().join(".kube/kubectl-vm/vm_known_hosts");
    std::fs::read_to_string(path)
        .map(|t| t.lines().filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0)
}

/// `cloud-init status --long` says `done` and reports no errors (cloud-init 22.4 prints an
/// `errors:` list only when there are some; later versions print `errors: []`); exit 0.
#[track_caller]
fn cloud_init_done(flavor: &str, boot: &str, out: &Output) {
    let status = stdout(out);
    eprintln!(
        "[{flavor}] {boot}: cloud-init status --long:\n{}",
        status.trim_start_matches('.')
    );
    assert!(status.contains("status: done"), "{status}\n{}", stderr(out));
    assert!(
        !status
            .lines()
            .any(|l| l.trim_start().starts_with("errors:") && l.trim() != "errors: []"),
        "{status}"
    );
    assert_eq!(out.status.code(), Some(0), "{status}\n{}", stderr(out));
}

fn scenario(env: Env, restricted: bool) {
    let t0 = Instant::now();
    let vm = "guest1";
    let tail = qemu_guests(&env, vm, restricted);
    let guests = tail.guests.clone();
    let flavor = if restricted {
        "kubevirt (restricted network)"
    } else {
        "deckhouse (open network)"
    };
    let dir = env.dir.path();
    let key = dir.join("id_ops");
    keygen(&key);
    let user_config = dir.join("user-config.yaml");
    std::fs::write(
        &user_config,
        format!(
            "#cloud-config\nwrite_files:\n- path: {MARKER_FILE}\n  content: |\n    hello from the user's cloud-config\nruncmd:\n- [sh, -c, 'echo \"runcmd as $(id -un)\" > {RUNCMD_FILE}']\n"
        ),
    )
    .unwrap();

    // Through the signer, as a platform team deploys it: certificates and the host
    // certificate come from it, scoped to this VM.
    let signer = crate::signer::start_signer(&env, &[]);
    // A secondary network: KubeVirt's on a Multus NetworkAttachmentDefinition made here,
    // Deckhouse's on the fixture's Network `user-net`. KubeVirt's hotplug headroom for memory
    // as a platform team caps it (the virtio-mem region, and so the memory dump, stays small).
    let network = if restricted {
        crate::network::nad(&env, "storage");
        let out = env.kubectl(&[
            "patch",
            "kubevirt",
            "kubevirt",
            "-n",
            "kubevirt",
            "--type=merge",
            "-p",
            r#"{"spec":{"configuration":{"liveUpdateConfiguration":{"maxGuest":"2Gi"}}}}"#,
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        "storage"
    } else {
        "user-net"
    };
    // KubeVirt: a static address on the secondary network, through cloud-init network data.
    let ip = format!("storage={STORAGE_ADDRESS}");
    let static_ip: &[&str] = if restricted { &["--ip", &ip] } else { &[] };
    let out = ok(env.vm(&[
        &["create", vm, "--network", network][..],
        static_ip,
        &[
            "--image",
            "quay.io/containerdisks/debian:12",
            "--cloud-init",
            user_config.to_str().unwrap(),
            "--env",
            "GREETING=hello-real-guest",
            "--guest-user",
            "ops",
            "--ssh-key",
            &format!("{}.pub", key.display()),
            "--wait",
            "--timeout",
            "120s",
        ],
    ]
    .concat()));
    eprintln!("[{flavor}] create --wait: {out}");
    let running = Instant::now();
    // The guest boots when the VM runs (the emulator looks every second).
    while guests.pids().is_empty() && running.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let pids = guests.pids();
    assert_eq!(pids.len(), 1, "one qemu for the VM: {pids:?}");
    let first_pid = pids[0];

    // The serial console: the getty's prompt, root/root, a command.
    {
        let mut command = env.command(BIN);
        command.args(["console", vm]).env("TERM", "xterm");
        // The login prompt came 54–126 s after the VM ran in this stop's runs (two TCG guests
        // beside the other tests on two cores): the deadline, 5 minutes like the suite's
        // others, is for hangs, not for speed.
        let mut p = rexpect::session::spawn_command(command, Some(300_000)).unwrap();
        p.exp_string(&format!("Successfully connected to {vm}'s serial console"))
            .unwrap();
        p.send("\r").unwrap();
        p.flush().unwrap();
        p.exp_string(&format!("{vm} login: ")).unwrap();
        eprintln!(
            "[{flavor}] login prompt {:.1}s after the VM ran",
            running.elapsed().as_secs_f64()
        );
        p.send("root\r").unwrap();
        p.flush().unwrap();
        p.exp_string("Password: ").unwrap();
        p.send("root\r").unwrap();
        p.flush().unwrap();
        p.exp_regex(&format!(r"root@{vm}:~# ")).unwrap();
        p.send("echo console-$((40+2)) $(hostname)\r").unwrap();
        p.flush().unwrap();
        p.exp_string(&format!("console-42 {vm}")).unwrap();
        p.send("exit\r").unwrap();
        p.send("\x1d").unwrap();
        p.flush().unwrap();
        p.exp_eof().unwrap();
    }

    // ssh with the platform CA: the host is verified by its certificate, nothing is recorded.
    let out = ssh_until_ok(
        &env,
        &[vm, "--", "cat", "/etc/kubevm/environment"],
        Duration::from_secs(300),
    );
    let boot_to_ssh = running.elapsed();
    eprintln!(
        "[{flavor}] boot to ssh: {:.1}s after the VM ran",
        boot_to_ssh.as_secs_f64()
    );
    assert!(
        stdout(&out)
            .lines()
            .any(|l| l == "GREETING=hello-real-guest"),
        "{}",
        stdout(&out)
    );
    assert!(!stderr(&out).contains("authenticity"), "{}", stderr(&out));
    assert_eq!(known_hosts_entries(&env), 0, "no known_hosts entry");

    // The guest agent answers: its condition and the guest's own OS, as kubectl shows them.
    let (resource, condition) = if restricted {
        ("virtualmachineinstances.kubevirt.io", "AgentConnected")
    } else {
        ("virtualmachines.virtualization.deckhouse.io", "AgentReady")
    };
    let jsonpath = format!(
        "jsonpath={{.status.conditions[?(@.type==\"{condition}\")].status}} {{.status.guestOSInfo.prettyName}}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = env.kubectl(&["get", resource, vm, "-o", &jsonpath]);
        if stdout(&out) == "True Debian GNU/Linux 12 (bookworm)" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{condition}: {} {}",
            stdout(&out),
            stderr(&out)
        );
        std::thread::sleep(Duration::from_secs(1));
    }

    // The --guest-user with the --ssh-key's private key (no certificate).
    let ident = key.to_str().unwrap();
    let out = ssh(
        &env,
        &["-i", ident, &format!("ops@{vm}"), "--", "id", "-un"],
    );
    assert_eq!(stdout(&out), "ops\n", "{}", stderr(&out));

    // The user's cloud-config: its file and its command (runcmd runs in cloud-init's last
    // stage, after sshd started).
    let out = ssh(
        &env,
        &[vm, "--", "cloud-init", "status", "--long", "--wait"],
    );
    eprintln!(
        "[{flavor}] first boot: cloud-init finished {:.1}s after the VM ran",
        running.elapsed().as_secs_f64()
    );
    cloud_init_done(flavor, "first boot", &out);
    let out = ssh(&env, &[vm, "--", "cat", MARKER_FILE, RUNCMD_FILE]);
    assert_eq!(
        stdout(&out),
        "hello from the user's cloud-config\nruncmd as root\n",
        "{}",
        stderr(&out)
    );

    // The secondary network is a second card in the guest, with the reported MAC.
    crate::real_guest_network::second_card_is_seen(&env, flavor, vm, restricted);
    if restricted {
        crate::real_guest_network::static_address_is_on_its_card(&env, vm, STORAGE_ADDRESS);
    }
    crate::real_guest_network::plug_and_unplug(&env, flavor, vm, restricted);

    // A disk hotplugged into the running guest, and unplugged.
    crate::real_guest_disks::hotplug_a_new_disk(&env, flavor, vm, restricted);

    // KubeVirt: a memory dump of the running guest holds what it wrote (Deckhouse has none).
    if restricted {
        let ram = guests.config().memory_mib;
        crate::real_guest_memory::dump_holds_what_the_guest_wrote(&env, flavor, vm, ram);
    }

    // set resources: KubeVirt hot-plugs a vCPU and 512 MiB into the running guest; Deckhouse
    // takes them at the next boot (the snapshot restore's below).
    let sized = crate::real_guest_resources::grow(&env, flavor, vm, 1024, restricted);

    // A file for the snapshot to keep (written while ssh still trusts the host).
    let login = ["-i", ident, &format!("ops@{vm}")].map(String::from);
    let login: Vec<&str> = login.iter().map(String::as_str).collect();
    crate::real_guest_snapshot::write_original(&env, &login);

    // Break the platform's trust from inside, then restart: bootcmd writes it again.
    let out = ssh(
        &env,
        &[
            "-i",
            ident,
            &format!("ops@{vm}"),
            "--",
            "sudo sh -c ': > /etc/ssh/kubevm_trusted_user_ca_keys; rm -rf /etc/ssh/kubevm_principals; rm -f /etc/ssh/sshd_config.d/50-kubevm.conf; systemctl reload ssh' && ls /etc/ssh/sshd_config.d/ && wc -c < /etc/ssh/kubevm_trusted_user_ca_keys",
        ],
    );
    assert_eq!(stdout(&out).trim(), "0", "{}", stderr(&out));

    let restart = Instant::now();
    // The second boot is a snapshot restore's (stop, roll the disk back, start), and the trust
    // broken above is in the snapshot too, so bootcmd must write it again as on a restart.
    // `restart` on a real guest stays covered by real_guest_enroll (KubeVirt); its API path
    // on both flavors by the lifecycle tests.
    let restored = crate::real_guest_snapshot::snapshot_change_restore(&env, flavor, vm);
    assert!(!pid_alive(first_pid), "the first boot's qemu has exited");
    crate::real_guest_snapshot::check_restored(&env, flavor, &login, restored);
    let out = ssh_until_ok(&env, &[vm, "--", "id", "-un"], Duration::from_secs(300));
    eprintln!(
        "[{flavor}] second boot to ssh: {:.1}s from snapshot create",
        restart.elapsed().as_secs_f64()
    );
    assert_eq!(stdout(&out), "kubevm\n");
    assert_eq!(known_hosts_entries(&env), 0, "no known_hosts entry");
    // The second boot has the CPUs and memory set above, on both platforms.
    crate::real_guest_resources::check_grown(&env, flavor, vm, sized);
    crate::real_guest_resources::shrink_for_next_boot(&env, vm, sized, 1024);
    // The guest user by certificate too (the VM lists it), its principal file back after the
    // reboot; the signer recorded each issuance.
    let out = ssh(
        &env,
        &[
            &format!("ops@{vm}"),
            "--",
            "cat /etc/ssh/kubevm_principals/ops",
        ],
    );
    assert_eq!(
        stdout(&out),
        format!("ops@{vm}.default\n"),
        "{}",
        stderr(&out)
    );
    let issued = signer
        .audit()
        .into_iter()
        .filter(|r| r["event"] == "issued" && r["kind"] == "user")
        .count();
    assert!(issued >= 4, "{:?}", signer.audit());
    let out = ssh(
        &env,
        &[
            vm,
            "--",
            "wc",
            "-l",
            "/etc/ssh/sshd_config.d/50-kubevm.conf",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));

    // cloud-init finished without errors after the reboot too, and its log of both boots has
    // no warning about the platform user (bootcmd and the users module agree).
    let out = ssh(
        &env,
        &[vm, "--", "cloud-init", "status", "--long", "--wait"],
    );
    cloud_init_done(flavor, "second boot", &out);
    let out = ssh(
        &env,
        &[
            vm,
            "--",
            "grep -c 'already exists' /var/log/cloud-init.log || true",
        ],
    );
    assert_eq!(stdout(&out).trim(), "0", "{}", stderr(&out));
    let out = ssh(
        &env,
        &[vm, "--", "grep -c 'Running module' /var/log/cloud-init.log"],
    );
    assert!(
        stdout(&out).trim().parse::<u32>().unwrap_or(0) > 0,
        "the log is the one cloud-init writes: {}",
        stdout(&out)
    );

    // Stop: finished only when the guest has powered off.
    let pid = guests.pids()[0];
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    eprintln!("[{flavor}] qemu RSS after two boots (tb-size=256): {rss}");
    let stop = Instant::now();
    ok(env.vm(&["stop", vm, "--wait", "--timeout", "120s"]));
    assert!(!pid_alive(pid), "qemu exited before stop --wait returned");
    assert!(guests.pids().is_empty());
    eprintln!(
        "[{flavor}] stop --wait: {:.1}s",
        stop.elapsed().as_secs_f64()
    );
    // A copy of the stopped guest boots with an SSH identity of its own (the third boot).
    crate::real_guest_copy::copy_has_its_own_identity(&env, flavor, vm, restricted);
    ok(env.vm(&["delete", vm]));
    eprintln!(
        "[{flavor}] whole scenario: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}

#[test]
#[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
fn real_guest_kubevirt_restricted_network() {
    scenario(Env::kubevirt(), true);
}

#[test]
#[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
fn real_guest_deckhouse_open_network() {
    scenario(Env::deckhouse(), false);
}
