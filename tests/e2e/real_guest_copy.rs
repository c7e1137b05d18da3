//! A copy of a real guest has an SSH identity of its own (issue 32): its disk is a copy of the
//! source's, host keys included, and cloud-init, seeing a new instance, replaces them with the
//! copy's own; the copy's host certificate names the copy; a certificate for the source does
//! not open it. KubeVirt copies with `clone` (the emulator copies the guest's disk through the
//! clone's volume snapshot), Deckhouse with `snapshot restore --new-vm` (its disks are made from
//! the VirtualDiskSnapshots, copies of the guest's disk; the emulator's Deckhouse `clone` gives
//! views of the source's claims instead, which a qemu guest cannot boot as a copy).
//!
//! Rides on the real-guest scenario's VM once it is stopped: one boot, the copy's.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Env, ok, stderr, stdout};
use crate::real_guest::{ssh, ssh_until_ok};

/// The ed25519 host public key (type and base64, no comment) in VM `vm`'s cloud-init Secret.
fn host_key_of(env: &Env, vm: &str) -> String {
    let (text, _) = crate::clone::cloudinit_secret(env, &format!("{vm}-cloudinit"));
    let doc: Value = yaml_serde::from_str(&text).unwrap();
    key_words(doc["ssh_keys"]["ed25519_public"].as_str().unwrap())
}

fn key_words(line: &str) -> String {
    line.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Copies the stopped VM `src` to `SRC-copy`, boots the copy and checks its identity; deletes
/// the copy (and the snapshot it came from) afterwards.
pub(crate) fn copy_has_its_own_identity(env: &Env, flavor: &str, src: &str, kubevirt: bool) {
    let t0 = Instant::now();
    let copy = format!("{src}-copy");
    // A user certificate for the source (which the source accepted while it ran).
    ok(env.vm(&["ssh-cert", &format!("{src}.default.vm")]));
    let src_cert = env.dir.path().join(format!(
        ".kube/kubectl-vm/ssh/certs/kubevm@{src}.default.vm-cert.pub"
    ));
    assert!(src_cert.exists(), "{}", src_cert.display());
    if kubevirt {
        ok(env.vm(&["clone", src, &copy, "--start", "--timeout", "300s"]));
    } else {
        ok(env.vm(&["snapshot", "create", src, "for-copy"]));
        ok(env.vm(&["snapshot", "restore", "for-copy", "--new-vm", &copy]));
        // The new VM has the source's runPolicy: under AlwaysOn (what `create` sets by
        // default) the platform starts it, and a Start operation would be refused for a VM
        // that is Running by then.
        let vm: Value = serde_json::from_str(&ok(env.vm(&["get", &copy, "-o", "json"]))).unwrap();
        let policy = vm["spec"]["runPolicy"].as_str().unwrap_or_default();
        if !policy.starts_with("AlwaysOn") {
            ok(env.vm(&["start", &copy]));
        }
    }
    eprintln!(
        "[{flavor}] copy of {src} made and started: {:.1}s",
        t0.elapsed().as_secs_f64()
    );

    // Reached with the copy's host certificate as the only host trust; the host key it serves
    // is the one certified for the copy, not the source's that its disk came with (cloud-init
    // writes the .pub file 0600 too, hence sudo).
    ssh_until_ok(
        env,
        &["--strict-host-key-checking", "yes", &copy, "--", "true"],
        Duration::from_secs(300),
    );
    eprintln!(
        "[{flavor}] copy: boot to ssh {:.1}s after the copy was asked for",
        t0.elapsed().as_secs_f64()
    );
    let served = ssh(
        env,
        &[
            "--strict-host-key-checking",
            "yes",
            &copy,
            "--",
            "sudo",
            "-n",
            "cat",
            "/etc/ssh/ssh_host_ed25519_key.pub",
        ],
    );
    assert!(served.status.success(), "{}", stderr(&served));
    let served = key_words(&stdout(&served));
    assert_eq!(served, host_key_of(env, &copy), "the copy's own host key");
    assert_ne!(served, host_key_of(env, src), "not the source's host key");
    // Its principals name the copy only.
    let out = ssh(
        env,
        &[&copy, "--", "cat", "/etc/ssh/kubevm_principals/kubevm"],
    );
    assert_eq!(
        stdout(&out),
        format!("kubevm@{copy}.default\n"),
        "{}",
        stderr(&out)
    );
    // Real OpenSSH with the source's certificate: the copy's sshd refuses it.
    let out = crate::clone::ssh_with_cert(env, &copy, &src_cert);
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));

    ok(env.vm(&["stop", &copy, "--wait", "--timeout", "120s"]));
    ok(env.vm(&["delete", &copy]));
    if !kubevirt {
        ok(env.vm(&["snapshot", "delete", "for-copy"]));
    }
    eprintln!(
        "[{flavor}] copy checked and deleted: {:.1}s",
        t0.elapsed().as_secs_f64()
    );
}
