//! Disk hotplug on a real guest: `disk attach` of a new 1 GiB disk to the running VM shows up
//! in the guest as `/dev/disk/by-id/*SERIAL*` of 1 GiB without a reboot, and `disk detach`
//! takes it away again. The serial is the one asked for (KubeVirt) or Deckhouse's md5 of the
//! VirtualDisk's uid, computed here with `md5sum` (the guest's SCSI by-id name holds its first
//! 20 characters); the size is what the guest's `lsblk` reads.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::real_guest::ssh;

/// The guest's `/dev/disk/by-id` names containing `serial`, with each device's size in bytes.
fn by_id(env: &Env, vm: &str, serial: &str) -> Option<Vec<String>> {
    let script = format!(
        "for d in /dev/disk/by-id/*{serial}*; do [ -e \"$d\" ] && echo \"${{d##*/}} $(lsblk -bndo SIZE \"$d\")\"; done; true"
    );
    let out = ssh(env, &[vm, "--", &script]);
    out.status
        .success()
        .then(|| stdout(&out).lines().map(str::to_owned).collect())
}

/// Waits until the guest's by-id names for `serial` satisfy `done`.
#[track_caller]
fn wait_in_guest(
    env: &Env,
    vm: &str,
    serial: &str,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(names) = by_id(env, vm, serial)
            && done(&names)
        {
            return names;
        }
        assert!(
            Instant::now() < deadline,
            "/dev/disk/by-id/*{serial}* in {vm}: {:?}",
            by_id(env, vm, serial)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Attach a new 1 GiB disk to the running `vm`, see it in the guest, detach it, see it gone.
pub(crate) fn hotplug_a_new_disk(env: &Env, flavor: &str, vm: &str, kubevirt: bool) {
    let t0 = Instant::now();
    let mut attach = vec!["disk", "attach", vm, "hotdata", "--size", "1Gi"];
    if kubevirt {
        attach.extend(["--serial", "HOTDATA1"]);
    }
    ok(env.vm(&attach));
    let serial = if kubevirt {
        "HOTDATA1".to_owned()
    } else {
        let uid = env.kubectl(&[
            "get",
            "virtualdisks",
            "hotdata",
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        let uid = stdout(&uid);
        let md5 = Command::new("sh")
            .args(["-c", "printf %s \"$1\" | md5sum", "sh", uid.trim()])
            .output()
            .unwrap();
        // QEMU's SCSI disk puts 20 characters of the serial into the device identification
        // page (VPD 0x83, `scsi_disk_emulate_vpd_page`), which udev's by-id name comes from.
        String::from_utf8(md5.stdout).unwrap()[..20].to_owned()
    };
    let names = wait_in_guest(env, vm, &serial, |n| !n.is_empty());
    eprintln!(
        "[{flavor}] hotplug: {names:?} in the guest {:.1}s after attach",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        names.iter().all(|n| n.ends_with(" 1073741824")),
        "a 1 GiB disk: {names:?}"
    );
    let t1 = Instant::now();
    ok(env.vm(&["disk", "detach", vm, "hotdata"]));
    wait_in_guest(env, vm, &serial, |n| n.is_empty());
    eprintln!(
        "[{flavor}] unplug: gone from the guest {:.1}s after detach",
        t1.elapsed().as_secs_f64()
    );
}
