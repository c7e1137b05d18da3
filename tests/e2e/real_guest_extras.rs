//! The seed's VM settings on a real guest (qemu, Debian 12; see real_guest.rs): the SMBIOS
//! UUID, serial and manufacturer the guest's firmware tables show, the sockets × cores ×
//! threads its kernel sees, a key from a `--ssh-key-secret` Secret logging in, and user data
//! from a `--user-data-secret` Secret run next to the platform's trust, and an
//! `--access-credential` (guest agent) replacing root's authorized keys while the VM runs, and
//! a `reset` that reboots the machine with its agent stopped.
//!
//! The guest image has no dmidecode; the kernel's DMI driver exposes the same SMBIOS type 1
//! fields under /sys/class/dmi/id (`product_uuid`, `product_serial`, `sys_vendor`).
//!
//! `cargo test -p kubectl-vm --test e2e real_guest_extras -- --ignored`.

use std::time::{Duration, Instant};

use crate::common::{Env, ok, stderr, stdout};
use crate::real_guest::{keygen, qemu_guests, ssh, ssh_until_ok};

const UUID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";
const SERIAL: &str = "KUBEVM-SN-0042";

fn secret(env: &Env, name: &str, key: &str, value: &str) {
    let file = env.dir.path().join(format!("{name}.json"));
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name, "namespace": "default" },
        "stringData": { key: value },
    });
    std::fs::write(&file, object.to_string()).unwrap();
    ok(env.kubectl(&["apply", "-f", file.to_str().unwrap()]));
}

#[test]
#[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
fn real_guest_kubevirt_seed_settings() {
    let t0 = Instant::now();
    let env = Env::kubevirt();
    let vm = "guest2";
    let _tail = qemu_guests(&env, vm, true);
    let key = env.dir.path().join("id_secret");
    keygen(&key);
    let public = std::fs::read_to_string(format!("{}.pub", key.display())).unwrap();
    secret(&env, "team-keys", "ops", &public);
    secret(
        &env,
        "ud",
        "userdata",
        "#cloud-config\nruncmd:\n- [sh, -c, 'echo ran-from-secret > /var/lib/ud-secret-ran']\n",
    );
    let root_key = env.dir.path().join("id_root");
    keygen(&root_key);
    let root_public = std::fs::read_to_string(format!("{}.pub", root_key.display())).unwrap();
    secret(&env, "root-keys", "key", &root_public);
    let _signer = crate::signer::start_signer(&env, &[]);
    let out = ok(env.vm(&[
        "create",
        vm,
        "--image",
        "quay.io/containerdisks/debian:12",
        "--cpu",
        "4",
        "--sockets",
        "2",
        "--threads",
        "2",
        "--uuid",
        UUID,
        "--serial",
        SERIAL,
        "--user-data-secret",
        "ud",
        "--ssh-key-secret",
        "team-keys",
        "--guest-user",
        "ops",
        "--access-credential",
        "root-keys:root",
        "--wait",
        "--timeout",
        "120s",
    ]));
    eprintln!("create --wait: {out}");

    // The platform trust is there: the first login is by CA-signed certificate.
    let out = ssh_until_ok(
        &env,
        &[
            vm,
            "--",
            "sudo cat /sys/class/dmi/id/product_uuid /sys/class/dmi/id/product_serial /sys/class/dmi/id/sys_vendor; nproc; LC_ALL=C lscpu",
        ],
        Duration::from_secs(300),
    );
    eprintln!("boot to ssh: {:.1}s", t0.elapsed().as_secs_f64());
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..4], [UUID, SERIAL, "KubeVirt", "4"], "{text}");
    for (field, value) in [
        ("Socket(s):", "2"),
        ("Core(s) per socket:", "1"),
        ("Thread(s) per core:", "2"),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(field) && l.trim_start_matches(field).trim() == value),
            "{field} {value}:\n{text}"
        );
    }

    // The key from the Secret logs in as the guest user (no certificate).
    let out = ssh(
        &env,
        &[
            "-i",
            key.to_str().unwrap(),
            &format!("ops@{vm}"),
            "--",
            "id",
            "-un",
        ],
    );
    assert_eq!(stdout(&out), "ops\n", "{}", stderr(&out));

    // The Secret's user data ran.
    let out = ssh(
        &env,
        &[
            vm,
            "--",
            "cloud-init status --wait >/dev/null; cat /var/lib/ud-secret-ran",
        ],
    );
    assert_eq!(stdout(&out), "ran-from-secret\n", "{}", stderr(&out));

    // The guest agent wrote the credential: the VMI says so, and root's authorized_keys is
    // exactly the Secret's line (KubeVirt replaces the whole file).
    let deadline = Instant::now() + Duration::from_secs(120);
    let jsonpath =
        "jsonpath={.status.conditions[?(@.type==\"AccessCredentialsSynchronized\")].status}";
    loop {
        let out = env.kubectl(&["get", "vmi", vm, "-o", jsonpath]);
        if stdout(&out) == "True" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} {}",
            stdout(&out),
            stderr(&out)
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let out = ssh(
        &env,
        &[
            "-i",
            root_key.to_str().unwrap(),
            &format!("root@{vm}"),
            "--",
            "cat /root/.ssh/authorized_keys",
        ],
    );
    // qemu-ga writes the keys without a final newline.
    assert_eq!(
        stdout(&out).lines().collect::<Vec<_>>(),
        [root_public.trim_end()],
        "{}",
        stderr(&out)
    );

    // reset: the machine starts over at once (a new boot id) in the same instance (same VMI
    // uid, so not a restart), asking nothing of the guest: its agent is stopped first. A hard
    // reset flushes nothing, so what the guest wrote in the last ~30 s (ext4's delayed
    // allocation: on a fast run, cloud-init's sshd host keys) would be lost and sshd would not
    // start again: the guest syncs first, as an operator's guest would have long before.
    let out = ssh(
        &env,
        &[
            vm,
            "--",
            "sudo systemctl stop qemu-guest-agent; sync; cat /proc/sys/kernel/random/boot_id",
        ],
    );
    let before = stdout(&out).trim().to_string();
    assert_eq!(before.len(), 36, "{}", stderr(&out));
    let vmi_uid = || stdout(&env.kubectl(&["get", "vmi", vm, "-o", "jsonpath={.metadata.uid}"]));
    let uid = vmi_uid();
    let reset = Instant::now();
    assert_eq!(
        ok(env.vm(&["reset", vm])),
        format!("virtualmachine.kubevirt.io/{vm} reset\n")
    );
    let out = ssh_until_ok(
        &env,
        &[vm, "--", "cat /proc/sys/kernel/random/boot_id"],
        Duration::from_secs(300),
    );
    eprintln!("reset to ssh: {:.1}s", reset.elapsed().as_secs_f64());
    let after = stdout(&out).trim().to_string();
    assert_ne!(after, before, "the guest booted again");
    assert_eq!(vmi_uid(), uid, "the same instance");

    ok(env.vm(&["delete", vm]));
    eprintln!("whole scenario: {:.1}s", t0.elapsed().as_secs_f64());
}

/// Deckhouse has the user data and key Secrets but no accessCredentials: the credential's keys
/// are written at boot (with one warning line), and every key logs in.
#[test]
#[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
fn real_guest_deckhouse_seed_settings() {
    let t0 = Instant::now();
    let env = Env::deckhouse();
    let vm = "guest3";
    let _tail = qemu_guests(&env, vm, false);
    let key = env.dir.path().join("id_secret");
    keygen(&key);
    let public = std::fs::read_to_string(format!("{}.pub", key.display())).unwrap();
    secret(&env, "team-keys", "ops", &public);
    secret(
        &env,
        "ud",
        "userdata",
        "#cloud-config\nruncmd:\n- [sh, -c, 'echo ran-from-secret > /var/lib/ud-secret-ran']\n",
    );
    let root_key = env.dir.path().join("id_root");
    keygen(&root_key);
    let root_public = std::fs::read_to_string(format!("{}.pub", root_key.display())).unwrap();
    secret(&env, "root-keys", "key", &root_public);
    let _signer = crate::signer::start_signer(&env, &[]);
    let output = env.vm(&[
        "create",
        vm,
        "--image",
        "quay.io/containerdisks/debian:12",
        "--user-data-secret",
        "ud",
        "--ssh-key-secret",
        "team-keys",
        "--guest-user",
        "ops",
        "--access-credential",
        "root-keys:root",
        "--wait",
        "--timeout",
        "120s",
    ]);
    let log = stderr(&output);
    ok(output);
    assert!(
        log.contains("Warning: Deckhouse has no accessCredentials: the keys of Secret root-keys are written into the VM's cloud-init for root now"),
        "{log}"
    );
    let out = ssh_until_ok(
        &env,
        &[
            vm,
            "--",
            "cloud-init status --wait >/dev/null; cat /var/lib/ud-secret-ran",
        ],
        Duration::from_secs(300),
    );
    eprintln!("boot to ssh: {:.1}s", t0.elapsed().as_secs_f64());
    assert_eq!(stdout(&out), "ran-from-secret\n", "{}", stderr(&out));
    let out = ssh(
        &env,
        &[
            "-i",
            key.to_str().unwrap(),
            &format!("ops@{vm}"),
            "--",
            "id",
            "-un",
        ],
    );
    assert_eq!(stdout(&out), "ops\n", "{}", stderr(&out));
    let out = ssh(
        &env,
        &[
            "-i",
            root_key.to_str().unwrap(),
            &format!("root@{vm}"),
            "--",
            "id -un; grep -c 'real-guest-test' /root/.ssh/authorized_keys",
        ],
    );
    assert_eq!(stdout(&out), "root\n1\n", "{}", stderr(&out));
    ok(env.vm(&["delete", vm]));
    eprintln!("whole scenario: {:.1}s", t0.elapsed().as_secs_f64());
}
