//! A real guest's memory dump, as virt-launcher takes it.
//!
//! virt-launcher (`pkg/virt-launcher/virtwrap/storage/memoryDump.go` `memoryDump`) calls
//! `dom.CoreDumpWithFormat(dumpPath, DOMAIN_CORE_DUMP_FORMAT_RAW, DUMP_MEMORY_ONLY)`; libvirt's
//! qemu driver (`src/qemu/qemu_driver.c` `qemuDumpToFd`) turns a memory-only dump into QMP
//! `dump-guest-memory` with `paging: false`, format `elf` (what RAW means there), `detach: true`,
//! and waits for the job to end (`query-dump` / the `DUMP_COMPLETED` event). The same here:
//! the dump is started detached and polled, so the VM's request stays `InProgress` while qemu
//! writes it, and a failed job is the request's failure.

use std::io;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::process::qmp;

/// Where qemu writes the dump: beside its QMP socket, in the guest's own directory (removed
/// with it).
fn dump_path(qmp_path: &Path) -> PathBuf {
    qmp_path.with_file_name("memory.dump")
}

/// Starts `dump-guest-memory` (detached) on the qemu behind `qmp_path`.
pub(super) fn start(qmp_path: &Path) -> io::Result<()> {
    let path = dump_path(qmp_path);
    // virt-launcher removes earlier dumps first (`removePreviousMemoryDump`).
    let _ = std::fs::remove_file(&path);
    qmp(
        qmp_path,
        &json!({"execute": "dump-guest-memory", "arguments": {
            "paging": false,
            "protocol": format!("file:{}", path.display()),
            "format": "elf",
            "detach": true,
        }}),
    )
    .map(|_| ())
}

/// The dump [`start`] began: `None` while qemu writes it; once `completed`, the file, open,
/// its path removed; a `failed` job is an error.
pub(super) fn finish(qmp_path: &Path) -> io::Result<Option<std::fs::File>> {
    let reply = qmp(qmp_path, &json!({"execute": "query-dump"}))?;
    match reply["return"]["status"].as_str() {
        Some("completed") => {
            let path = dump_path(qmp_path);
            let file = std::fs::File::open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(Some(file))
        }
        Some("failed") => Err(io::Error::other(format!(
            "dump-guest-memory failed ({} of {} bytes written)",
            reply["return"]["completed"], reply["return"]["total"]
        ))),
        // "active" (or "none" just after the command).
        _ => Ok(None),
    }
}
