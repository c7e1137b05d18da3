//! A guest's boot disk belongs to its claim, so snapshots of that claim hold the guest's data.
//!
//! - The qcow2 overlay a guest boots from is the boot claim's ([`super::disk::boot_claim`]):
//!   `claims/<n>.qcow2`, one per PVC uid, kept while the PVC exists (so boot, reboot and
//!   stop/start keep it, and a VM booting from another claim — a restored one — gets that
//!   claim's data).
//! - A volume snapshot of such a claim ([`crate::kubevirt::vm_snapshot::capture`]) keeps a point-in-time
//!   copy, `snapshots/<n>.qcow2` over the same base image: of a running guest through QMP
//!   `drive-backup` `sync=top` (copy-before-write, so the copy is the disk as it was when the
//!   job started) with the guest's filesystems frozen by its agent until the job has started;
//!   of a stopped one by copying the file.
//! - A PVC restored from that snapshot ([`crate::kubevirt::vm_snapshot::materialize`]) gets a copy of it
//!   as its overlay.
//! - Files are 0600 and named by counters (nothing from the API goes into a path); an overlay
//!   goes when its PVC does (and no qemu uses it), a copy when the snapshot that referenced it
//!   ([`crate::kubevirt::vm_snapshot::live_data_ids`]) is gone.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The id of the boot drive on the qemu command line (for the backup job).
pub(super) const BOOT_DRIVE: &str = "rootdisk";
/// The backup job's id.
const JOB: &str = "kubevm-snapshot";
/// How long a backup may take.
pub(super) const BACKUP_TIMEOUT: Duration = Duration::from_secs(300);

/// A kept snapshot copy.
#[derive(Debug)]
struct Copy {
    path: PathBuf,
    /// Whether a snapshot has referenced it yet (until then housekeeping keeps it: the content
    /// that will name it is written after the capture).
    referenced: bool,
}

/// The overlays of claims and the copies of snapshots, under one directory.
#[derive(Debug)]
pub struct ClaimDisks {
    root: PathBuf,
    next: u64,
    /// `(namespace, PVC uid)` → overlay.
    overlays: HashMap<(String, String), PathBuf>,
    /// Snapshot data id → copy.
    copies: HashMap<String, Copy>,
}

/// Makes `path` readable and writable by its owner only.
pub(super) fn owner_only(path: &Path) -> io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

impl ClaimDisks {
    /// Bookkeeping under `root` (created as needed).
    pub fn new(root: &Path) -> ClaimDisks {
        ClaimDisks {
            root: root.to_owned(),
            next: 0,
            overlays: HashMap::new(),
            copies: HashMap::new(),
        }
    }

    fn fresh(&mut self, dir: &str) -> io::Result<PathBuf> {
        let dir = self.root.join(dir);
        std::fs::create_dir_all(&dir)?;
        self.next += 1;
        Ok(dir.join(format!("{}.qcow2", self.next)))
    }

    /// The overlay of claim `ns`/`uid`, if it has one.
    pub fn overlay(&self, ns: &str, uid: &str) -> Option<&Path> {
        self.overlays
            .get(&(ns.to_owned(), uid.to_owned()))
            .map(PathBuf::as_path)
    }

    /// The path for a new overlay of claim `ns`/`uid`; `create` writes it (0600 afterwards).
    pub fn new_overlay(
        &mut self,
        ns: &str,
        uid: &str,
        create: impl FnOnce(&Path) -> io::Result<()>,
    ) -> io::Result<PathBuf> {
        let path = self.fresh("claims")?;
        if let Err(e) = create(&path).and_then(|()| owner_only(&path)) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        self.overlays
            .insert((ns.to_owned(), uid.to_owned()), path.clone());
        Ok(path)
    }

    /// The path for the copy kept under snapshot data `id`; `copy` writes it (0600 afterwards).
    /// A copy already kept under `id` is replaced.
    pub fn new_copy(
        &mut self,
        id: &str,
        copy: impl FnOnce(&Path) -> io::Result<()>,
    ) -> io::Result<PathBuf> {
        let path = self.fresh("snapshots")?;
        if let Err(e) = copy(&path).and_then(|()| owner_only(&path)) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        if let Some(old) = self.copies.insert(
            id.to_owned(),
            Copy {
                path: path.clone(),
                referenced: false,
            },
        ) {
            let _ = std::fs::remove_file(old.path);
        }
        Ok(path)
    }

    /// Gives claim `ns`/`uid` a copy of the snapshot data `id` as its overlay; false when no
    /// copy is kept under `id` (the snapshot was not of a guest's boot disk).
    pub fn restore(&mut self, id: &str, ns: &str, uid: &str) -> io::Result<bool> {
        let Some(source) = self.copies.get(id).map(|c| c.path.clone()) else {
            return Ok(false);
        };
        if let Some(old) = self.overlays.remove(&(ns.to_owned(), uid.to_owned())) {
            let _ = std::fs::remove_file(old);
        }
        self.new_overlay(ns, uid, |path| std::fs::copy(&source, path).map(|_| ()))?;
        Ok(true)
    }

    /// Removes the overlays of claims that are gone (`exists` false) unless in `busy`, and the
    /// copies no live snapshot references any more (`live`, the data ids of existing snapshot
    /// contents); returns how many files went.
    pub fn forget(
        &mut self,
        exists: impl Fn(&str, &str) -> bool,
        busy: &[PathBuf],
        live: &HashSet<String>,
    ) -> usize {
        let mut removed = 0;
        self.overlays.retain(|(ns, uid), path| {
            let keep = exists(ns, uid) || busy.contains(path);
            if !keep {
                let _ = std::fs::remove_file(&*path);
                removed += 1;
            }
            keep
        });
        self.copies.retain(|id, copy| {
            if live.contains(id) {
                copy.referenced = true;
                return true;
            }
            if !copy.referenced {
                return true;
            }
            let _ = std::fs::remove_file(&copy.path);
            removed += 1;
            false
        });
        removed
    }
}

/// A block job named [`JOB`] qemu has accepted, on its own QMP connection.
pub(super) struct Job {
    reader: BufReader<UnixStream>,
    /// Events read before the command's answer.
    early: Vec<Value>,
}

fn read_json(reader: &mut BufReader<UnixStream>) -> io::Result<Value> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::Error::other("QMP connection closed"));
    }
    serde_json::from_str(&line).map_err(io::Error::other)
}

/// Reads up to the answer (greeting or `return`); the events before it go to `events`.
fn reply(reader: &mut BufReader<UnixStream>, events: &mut Vec<Value>) -> io::Result<()> {
    loop {
        let v = read_json(reader)?;
        if let Some(e) = v.get("error") {
            return Err(io::Error::other(format!("QMP: {e}")));
        }
        if v.get("return").is_some() || v.get("QMP").is_some() {
            return Ok(());
        }
        events.push(v);
    }
}

impl Job {
    /// Sends `command` (a block job named [`JOB`]) on QMP socket `path`; returns once qemu has
    /// accepted it (for a backup: the point in time the copy is of).
    pub(super) fn start(path: &Path, command: &Value) -> io::Result<Job> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut writer = stream.try_clone()?;
        let mut reader = BufReader::new(stream);
        let mut early = vec![];
        reply(&mut reader, &mut early)?;
        writeln!(writer, "{}", json!({"execute": "qmp_capabilities"}))?;
        reply(&mut reader, &mut early)?;
        writeln!(writer, "{command}")?;
        early.clear();
        reply(&mut reader, &mut early)?;
        Ok(Job { reader, early })
    }

    /// Waits for the job's `BLOCK_JOB_COMPLETED` (an error in it is returned).
    pub(super) fn wait(mut self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut early = std::mem::take(&mut self.early).into_iter();
        loop {
            let next = match early.next() {
                Some(v) => Ok(v),
                None => read_json(&mut self.reader),
            };
            let v = match next {
                Ok(v) => v,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) && Instant::now() < deadline =>
                {
                    continue;
                }
                Err(e) => return Err(e),
            };
            let event = v["event"].as_str().unwrap_or_default();
            if v["data"]["device"] != JOB {
                continue;
            }
            match (event, v["data"]["error"].as_str()) {
                ("BLOCK_JOB_COMPLETED", None) => return Ok(()),
                ("BLOCK_JOB_COMPLETED", Some(e)) => {
                    return Err(io::Error::other(format!("backup: {e}")));
                }
                ("BLOCK_JOB_CANCELLED", _) => return Err(io::Error::other("backup cancelled")),
                _ => {}
            }
        }
    }
}

/// The QMP command copying the boot drive's top layer to `target` (a new qcow2 over the same
/// backing file: `mode=absolute-paths`), as of the moment the job starts.
pub(super) fn backup_command(target: &Path) -> Value {
    json!({"execute": "drive-backup", "arguments": {
        "job-id": JOB, "device": BOOT_DRIVE, "target": target.display().to_string(),
        "format": "qcow2", "sync": "top", "mode": "absolute-paths"}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn overlays_and_copies_are_private_and_follow_their_claims_and_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        let mut disks = ClaimDisks::new(dir.path());
        let overlay = disks
            .new_overlay("ns", "pvc-1", |p| std::fs::write(p, b"boot data"))
            .unwrap();
        assert_eq!(disks.overlay("ns", "pvc-1"), Some(overlay.as_path()));
        assert_eq!(disks.overlay("other", "pvc-1"), None);
        assert_eq!(mode(&overlay), 0o600);

        // A snapshot copy, then the original changes.
        let copy = disks
            .new_copy("vs-1", |p| std::fs::copy(&overlay, p).map(|_| ()))
            .unwrap();
        assert_eq!(mode(&copy), 0o600);
        std::fs::write(&overlay, b"changed").unwrap();

        // A restored claim gets the snapshot-time data, in a file of its own.
        assert!(disks.restore("vs-1", "ns", "pvc-2").unwrap());
        let restored = disks.overlay("ns", "pvc-2").unwrap().to_owned();
        assert_ne!(restored, copy);
        assert_eq!(std::fs::read(&restored).unwrap(), b"boot data");
        assert_eq!(mode(&restored), 0o600);
        // Unknown data: nothing to restore.
        assert!(!disks.restore("vs-unknown", "ns", "pvc-3").unwrap());
        assert_eq!(disks.overlay("ns", "pvc-3"), None);

        // Before any snapshot references the copy it stays; all claims exist: nothing goes.
        let none = HashSet::new();
        let live: HashSet<String> = ["vs-1".to_owned()].into();
        assert_eq!(disks.forget(|_, _| true, &[], &none), 0);
        assert_eq!(disks.forget(|_, _| true, &[], &live), 0);
        // pvc-1 is deleted but a qemu still uses its overlay: kept; then it goes.
        let gone = |_: &str, uid: &str| uid != "pvc-1";
        assert_eq!(disks.forget(gone, std::slice::from_ref(&overlay), &live), 0);
        assert!(overlay.exists());
        assert_eq!(disks.forget(gone, &[], &live), 1);
        assert!(!overlay.exists());
        assert_eq!(disks.overlay("ns", "pvc-1"), None);
        // The snapshot is deleted: its copy goes, the restored claim keeps its data.
        assert_eq!(disks.forget(gone, &[], &none), 1);
        assert!(!copy.exists());
        assert_eq!(std::fs::read(&restored).unwrap(), b"boot data");
        // Once everything is gone, the directories are empty.
        assert_eq!(disks.forget(|_, _| false, &[], &none), 1);
        for sub in ["claims", "snapshots"] {
            let left: Vec<_> = std::fs::read_dir(dir.path().join(sub)).unwrap().collect();
            assert!(left.is_empty(), "{sub}: {left:?}");
        }
    }

    #[test]
    fn a_failed_copy_leaves_no_file_and_keeps_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut disks = ClaimDisks::new(dir.path());
        let first = disks
            .new_copy("vs-1", |p| std::fs::write(p, b"one"))
            .unwrap();
        let e = disks
            .new_copy("vs-1", |p| {
                std::fs::write(p, b"partial")?;
                Err(io::Error::other("qemu said no"))
            })
            .unwrap_err();
        assert_eq!(e.to_string(), "qemu said no");
        let files: Vec<_> = std::fs::read_dir(dir.path().join("snapshots"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files, [first]);
        assert!(disks.restore("vs-1", "ns", "pvc").unwrap());
        assert_eq!(
            std::fs::read(disks.overlay("ns", "pvc").unwrap()).unwrap(),
            b"one"
        );
    }

    /// The backup job against a real (paused) qemu: the copy holds what the overlay held when
    /// the job started, over the same backing file (`qemu-io`, `qemu-img compare` judge).
    #[test]
    #[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
    fn drive_backup_copies_the_overlay_over_the_same_base() {
        use std::process::Command;
        let config = super::super::QemuConfig::from_dir(&super::super::QemuConfig::default_dir())
            .expect("the guest image");
        let dir = tempfile::tempdir().unwrap();
        let overlay = dir.path().join("overlay.qcow2");
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap();
            assert!(
                out.status.success(),
                "{cmd:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        run(Command::new(&config.qemu_img)
            .args(["create", "-q", "-f", "qcow2", "-b"])
            .arg(&config.base_image)
            .args(["-F", "raw"])
            .arg(&overlay));
        run(Command::new("qemu-io")
            .args(["-c", "write -P 0xab 1M 64k"])
            .arg(&overlay));
        let qmp = dir.path().join("qmp.sock");
        let mut qemu = Command::new(&config.qemu)
            .arg("-L")
            .arg(&config.firmware)
            .args([
                "-S",
                "-nodefaults",
                "-display",
                "none",
                "-monitor",
                "none",
                "-drive",
            ])
            .arg(format!(
                "file={},if=virtio,format=qcow2,id={BOOT_DRIVE}",
                overlay.display()
            ))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=on", qmp.display()))
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !qmp.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let copy = dir.path().join("copy.qcow2");
        let result = Job::start(&qmp, &backup_command(&copy)).and_then(|j| j.wait(BACKUP_TIMEOUT));
        let _ = qemu.kill();
        let _ = qemu.wait();
        result.unwrap();
        let info = run(Command::new(&config.qemu_img)
            .args(["info", "--output=json"])
            .arg(&copy));
        let info: Value = serde_json::from_str(&info).unwrap();
        assert_eq!(info["format"], "qcow2");
        assert_eq!(
            info["full-backing-filename"].as_str().map(Path::new),
            Some(config.base_image.as_path())
        );
        run(Command::new("qemu-io")
            .args(["-c", "read -P 0xab 1M 64k"])
            .arg(&copy));
        run(Command::new(&config.qemu_img)
            .arg("compare")
            .arg(&overlay)
            .arg(&copy));
    }
}
