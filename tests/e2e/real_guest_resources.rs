//! `set resources` seen from inside a real guest: the vCPUs (`nproc`) and memory
//! (`/proc/meminfo`'s MemTotal) the guest's kernel counts, before and after. KubeVirt
//! hot-plugs both into the running guest under LiveUpdate; Deckhouse (hotplug gates off) takes
//! them at the next boot.

use std::time::{Duration, Instant};

use crate::common::*;
use crate::real_guest::ssh;

/// What the guest's kernel counts: online vCPUs and MemTotal in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub cpus: u32,
    pub mem_kib: u64,
}

/// The memory `grow` adds, MiB.
const ADDED_MIB: u64 = 512;

pub(crate) fn seen(env: &Env, vm: &str) -> Seen {
    let out = ssh(
        env,
        &[
            vm,
            "--",
            "nproc; awk '/^MemTotal:/ {print $2}' /proc/meminfo",
        ],
    );
    let text = stdout(&out);
    let mut lines = text.lines();
    let mut next = || lines.next().unwrap_or("").trim().parse::<u64>().ok();
    match (next(), next()) {
        (Some(cpus), Some(mem_kib)) => Seen {
            cpus: cpus as u32,
            mem_kib,
        },
        _ => panic!("nproc and MemTotal: {text:?} {}", stderr(&out)),
    }
}

/// Whether `after` is `before` with one more vCPU and [`ADDED_MIB`] more memory. After a boot
/// MemTotal grows by a little less than the memory added: the kernel keeps the page
/// descriptors (64 bytes per 4 KiB page, 1/64) and hash tables sized by memory out of it.
fn grown(before: Seen, after: Seen) -> bool {
    let added = after.mem_kib.saturating_sub(before.mem_kib);
    let plugged = ADDED_MIB * 1024;
    after.cpus == before.cpus + 1 && added <= plugged && added >= plugged - plugged / 16
}

/// `set resources VM --cpu N+1 --memory M+512Mi` on a running guest booted with `boot_mib`
/// of memory. KubeVirt (`live`): reported applied live, and the guest counts both within a
/// minute. Deckhouse: reported waiting for a restart, the guest unchanged. Returns what the
/// guest counted before.
pub(crate) fn grow(env: &Env, flavor: &str, vm: &str, boot_mib: u64, live: bool) -> Seen {
    let before = seen(env, vm);
    let memory = format!("{}Mi", boot_mib + ADDED_MIB);
    let cpus = (before.cpus + 1).to_string();
    let t = Instant::now();
    let out = ok(env.vm(&["set", "resources", vm, "--cpu", &cpus, "--memory", &memory]));
    if live {
        assert!(
            out.ends_with("applied live: the platform reports no restart needed\n"),
            "{out}"
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let now = seen(env, vm);
            if grown(before, now) {
                eprintln!(
                    "[{flavor}] set resources live: {before:?} → {now:?} in {:.1}s",
                    t.elapsed().as_secs_f64()
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the guest still counts {now:?} (before {before:?})"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    } else {
        assert!(out.contains("applies at the next restart:"), "{out}");
        assert_eq!(seen(env, vm), before, "nothing changes before the restart");
    }
    before
}

/// After a restart: the guest counts what `grow` asked for.
pub(crate) fn check_grown(env: &Env, flavor: &str, vm: &str, before: Seen) {
    let now = seen(env, vm);
    assert!(
        grown(before, now),
        "after the restart: {now:?} (before {before:?})"
    );
    eprintln!("[{flavor}] after the restart the guest counts {now:?} (before {before:?})");
}

/// Back to `before`'s vCPUs and `boot_mib` of memory for the next boot (the copy's): a running
/// guest does not shrink, on KubeVirt (fewer sockets and less memory need a restart) as on
/// Deckhouse. Copies then boot with one vCPU, which under TCG on a busy 2-core machine boots
/// markedly faster than two.
pub(crate) fn shrink_for_next_boot(env: &Env, vm: &str, before: Seen, boot_mib: u64) {
    let out = ok(env.vm(&[
        "set",
        "resources",
        vm,
        "--cpu",
        &before.cpus.to_string(),
        "--memory",
        &format!("{boot_mib}Mi"),
    ]));
    assert!(out.contains("applies at the next restart:"), "{out}");
}
