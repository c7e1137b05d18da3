//! Disk directories (`kubevm-qemu-*` in the temporary directory) left behind by emulators that
//! did not stop cleanly (`kill -9`): each directory names its owner in [`OWNER`] (process id
//! and start time, so a reused process id is not mistaken for the owner), and an emulator
//! starting removes the directories whose owner is gone. A directory with no owner file (being
//! created, or made by an older emulator) is left alone.

use std::io;
use std::path::{Path, PathBuf};

/// The owner file in each directory: `PID START_TIME`.
pub const OWNER: &str = "owner";
/// The prefix of the directories.
pub const PREFIX: &str = "kubevm-qemu-";

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, clock ticks since boot).
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Writes the owner file of `dir`: this process.
pub fn claim(dir: &Path) -> io::Result<()> {
    let pid = std::process::id() as i32;
    let start = start_time(pid).unwrap_or(0);
    std::fs::write(dir.join(OWNER), format!("{pid} {start}\n"))
}

/// Whether the owner named by `owner` (an owner file's text) is alive.
fn owner_alive(owner: &str) -> bool {
    let mut it = owner.split_whitespace();
    let (Some(pid), Some(start)) = (
        it.next().and_then(|p| p.parse::<i32>().ok()),
        it.next().and_then(|s| s.parse::<u64>().ok()),
    ) else {
        // Unreadable: keep it.
        return true;
    };
    start_time(pid).is_some_and(|s| s == start)
}

/// The directories under `tmp` that belong to emulators that are gone.
pub fn stale_dirs(tmp: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return vec![];
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| std::fs::read_to_string(p.join(OWNER)).is_ok_and(|owner| !owner_alive(&owner)))
        .collect()
}

/// Removes [`stale_dirs`]; returns how many went.
pub fn remove_stale(tmp: &Path) -> usize {
    stale_dirs(tmp)
        .into_iter()
        .filter(|d| std::fs::remove_dir_all(d).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_only_the_directories_of_dead_owners() {
        let tmp = tempfile::tempdir().unwrap();
        let mk = |name: &str| {
            let d = tmp.path().join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("overlay.qcow2"), "x").unwrap();
            d
        };
        // A live emulator (this process).
        let live = mk("kubevm-qemu-live");
        claim(&live).unwrap();
        // A dead one: a process that has exited and been reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = child.id();
        child.wait().unwrap();
        let dead = mk("kubevm-qemu-dead");
        std::fs::write(dead.join(OWNER), format!("{dead_pid} 12345\n")).unwrap();
        // This process id but another start time: the id was reused, the owner is gone.
        let reused = mk("kubevm-qemu-reused");
        std::fs::write(reused.join(OWNER), format!("{} 1\n", std::process::id())).unwrap();
        // No owner file (being created, or an older emulator's): kept.
        let unowned = mk("kubevm-qemu-unowned");
        // Not ours at all.
        let other = tmp.path().join("something-else");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join(OWNER), format!("{dead_pid} 12345\n")).unwrap();

        let mut stale = stale_dirs(tmp.path());
        stale.sort();
        let mut want = vec![dead.clone(), reused.clone()];
        want.sort();
        assert_eq!(stale, want);
        assert_eq!(remove_stale(tmp.path()), 2);
        assert!(live.exists() && unowned.exists() && other.exists());
        assert!(!dead.exists() && !reused.exists());
    }
}
