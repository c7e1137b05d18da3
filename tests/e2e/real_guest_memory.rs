//! The real guest's memory in a memory dump (KubeVirt): a string the test writes into the
//! guest's RAM (a tmpfs file, over ssh: never on the console, whose output the emulator also
//! knows) is in the ELF core `memory-dump get -o` downloads, which qemu wrote with QMP
//! `dump-guest-memory` as virt-launcher has libvirt do. Rides on the scenario's first boot.

use std::path::Path;
use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::common::{Env, ok, stderr, stdout};
use crate::real_guest::ssh;

fn run(program: &str, args: &[&str], file: &Path) -> String {
    let out = Command::new(program).args(args).arg(file).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn dump_holds_what_the_guest_wrote(env: &Env, flavor: &str, vm: &str, ram_mib: u32) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let marker = format!("kubevm-dump-marker-{}-{nanos}", std::process::id());
    let out = ssh(
        env,
        &[
            vm,
            "--",
            &format!(
                "printf '%s\\n' {marker} > /dev/shm/dump-marker && df --output=fstype /dev/shm | tail -1"
            ),
        ],
    );
    assert_eq!(stdout(&out).trim(), "tmpfs", "{}", stderr(&out));

    let t = Instant::now();
    let core = env.dir.path().join("guest.core");
    ok(env.vm(&[
        "memory-dump",
        "get",
        vm,
        "--claim-name",
        "guest-dump",
        "--create-claim",
        "-o",
        core.to_str().unwrap(),
    ]));
    let took = t.elapsed();
    let size = std::fs::metadata(&core).unwrap().len();
    // ELF magic read by od, and file's verdict: an ELF core.
    assert_eq!(
        run("od", &["-An", "-c", "-N4"], &core)
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["177", "E", "L", "F"]
    );
    assert!(
        run("file", &["-b"], &core).starts_with("ELF 64-bit LSB core file, x86-64"),
        "{}",
        run("file", &["-b"], &core)
    );
    // The whole RAM qemu was given (-m), plus the ELF headers and notes.
    assert!(size > u64::from(ram_mib) << 20, "{size}");
    let found = run("grep", &["-c", "-a", "-F", &marker], &core);
    assert!(
        found.trim().parse::<u32>().unwrap_or(0) >= 1,
        "{marker} not in the dump: grep -c says {found:?}"
    );
    eprintln!(
        "[{flavor}] memory-dump get -o: {:.1}s for {} MiB, the marker {} times",
        took.as_secs_f64(),
        size >> 20,
        found.trim()
    );
    std::fs::remove_file(&core).unwrap();
    ok(env.vm(&["memory-dump", "remove", vm]));
}
