//! The file a memory dump writes into its claim, and the claim's `tar.gz` archive.
//!
//! KubeVirt dumps a guest with libvirt's `virDomainCoreDumpWithFormat(path,
//! VIR_DOMAIN_CORE_DUMP_FORMAT_RAW, VIR_DUMP_MEMORY_ONLY)` (kubevirt
//! `pkg/virt-launcher/virtwrap/storage/memoryDump.go`), which libvirt runs as qemu's
//! `dump-guest-memory` without paging: an ELF64 core file (qemu `dump/dump.c`
//! `write_elf64_header`, `write_elf64_notes`, `write_elf64_load`): the ELF header (`ET_CORE`,
//! `EM_X86_64`), one `PT_NOTE` program header for the notes and one `PT_LOAD` per guest RAM
//! block (physical address, no page alignment), the notes (`NT_PRSTATUS` named `CORE` per
//! vCPU, `target/i386/arch_dump.c` `x86_64_write_elf64_note`, 336-byte `x86_64_elf_prstatus`),
//! then the RAM. The dump replaces any earlier `*.memory.dump` in the claim
//! (`removePreviousMemoryDump`).
//!
//! The emulator's fake guests have no RAM to copy: theirs is generated ([`crate::kubevirt::export::fill`])
//! with what the guest holds in its tty buffers, its serial console transcript since boot,
//! written at [`MARKER_OFFSET`] into it (a real guest's memory holds what it printed), so a test
//! finds a string it typed into the guest in the dump.
//!
//! The export server serves a claim holding files as KubeVirt's does a filesystem claim: its
//! `tar.gz` is `tar Scv --exclude=lost+found .` run in the mount point, gzipped
//! (`pkg/storage/export/virt-exportserver/exportserver.go` `newTarReader`, `pipeToGzip`): GNU
//! tar's entries `./` and `./FILE`, the archive padded to GNU tar's 10240-byte records.

use std::sync::Arc;

/// Where the guest's console transcript sits in its RAM.
pub const MARKER_OFFSET: u64 = 1 << 20;
/// RAM of a fake guest whose VMI names no memory.
pub const DEFAULT_RAM: u64 = 8 << 20;
/// The most RAM a fake guest's dump carries (a 2 GiB VM's dump would make every test slow);
/// `KUBEVM_EMULATOR_DUMP_RAM_CAP` (bytes) raises it, for benchmarks.
pub const RAM_CAP: u64 = 8 << 20;

/// The RAM a fake guest of `memory` bytes puts into its dump.
pub fn dumped_ram(memory: u64) -> u64 {
    let cap = std::env::var("KUBEVM_EMULATOR_DUMP_RAM_CAP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(RAM_CAP);
    memory.min(cap)
}
/// At most this much of the transcript (the newest part) is in RAM.
const MAX_MARKER: usize = 256 << 10;

const EHDR: usize = 64;
const PHDR: usize = 56;
/// `sizeof(x86_64_elf_prstatus)`.
const PRSTATUS: usize = 336;

/// An ELF core file of a guest: generated headers and notes, then its RAM.
#[derive(Debug)]
pub struct Core {
    head: Vec<u8>,
    ram: u64,
    key: u64,
    marker: Vec<u8>,
    marker_at: u64,
}

fn note(out: &mut Vec<u8>, name: &[u8], kind: u32, desc: &[u8]) {
    let pad = |out: &mut Vec<u8>| out.resize(out.len().next_multiple_of(4), 0);
    out.extend_from_slice(&(name.len() as u32 + 1).to_le_bytes());
    out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(name);
    out.push(0);
    pad(out);
    out.extend_from_slice(desc);
    pad(out);
}

impl Core {
    /// The dump of a guest with `ram` bytes of RAM generated from `key`, `vcpus` vCPUs, and
    /// `transcript` (its console output) in its RAM.
    pub fn new(key: u64, ram: u64, vcpus: u32, transcript: &[u8]) -> Core {
        let mut notes = Vec::new();
        for cpu in 0..vcpus.max(1) {
            // x86_64_elf_prstatus: pr_pid at offset 32 is the vCPU's id + 1.
            let mut prstatus = vec![0u8; PRSTATUS];
            prstatus[32..36].copy_from_slice(&(cpu + 1).to_le_bytes());
            note(&mut notes, b"CORE", 1, &prstatus);
        }
        let note_off = (EHDR + 2 * PHDR) as u64;
        let load_off = note_off + notes.len() as u64;
        let mut head = Vec::with_capacity(load_off as usize);
        // e_ident: ELFMAG, ELFCLASS64, ELFDATA2LSB, EV_CURRENT, ELFOSABI_NONE.
        head.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
        head.extend_from_slice(&[0; 8]);
        head.extend_from_slice(&4u16.to_le_bytes()); // e_type ET_CORE
        head.extend_from_slice(&62u16.to_le_bytes()); // e_machine EM_X86_64
        head.extend_from_slice(&1u32.to_le_bytes()); // e_version
        head.extend_from_slice(&0u64.to_le_bytes()); // e_entry
        head.extend_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
        head.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
        head.extend_from_slice(&0u32.to_le_bytes()); // e_flags
        head.extend_from_slice(&(EHDR as u16).to_le_bytes()); // e_ehsize
        head.extend_from_slice(&(PHDR as u16).to_le_bytes()); // e_phentsize
        head.extend_from_slice(&2u16.to_le_bytes()); // e_phnum
        head.extend_from_slice(&[0; 6]); // e_shentsize, e_shnum, e_shstrndx
        let phdr = |head: &mut Vec<u8>, kind: u32, off: u64, paddr: u64, size: u64| {
            head.extend_from_slice(&kind.to_le_bytes());
            head.extend_from_slice(&0u32.to_le_bytes()); // p_flags
            head.extend_from_slice(&off.to_le_bytes());
            head.extend_from_slice(&0u64.to_le_bytes()); // p_vaddr
            head.extend_from_slice(&paddr.to_le_bytes());
            head.extend_from_slice(&size.to_le_bytes()); // p_filesz
            head.extend_from_slice(&size.to_le_bytes()); // p_memsz
            head.extend_from_slice(&0u64.to_le_bytes()); // p_align
        };
        phdr(&mut head, 4, note_off, 0, notes.len() as u64); // PT_NOTE
        phdr(&mut head, 1, load_off, 0, ram); // PT_LOAD: RAM from physical address 0
        head.extend_from_slice(&notes);
        let keep = transcript.len().min(MAX_MARKER);
        let mut marker = transcript[transcript.len() - keep..].to_vec();
        let marker_at = if ram >= MARKER_OFFSET + marker.len() as u64 {
            MARKER_OFFSET
        } else {
            0
        };
        marker.truncate(ram.saturating_sub(marker_at) as usize);
        Core {
            head,
            ram,
            key,
            marker,
            marker_at,
        }
    }

    /// The file's size.
    pub fn len(&self) -> u64 {
        self.head.len() as u64 + self.ram
    }

    /// Whether the file is empty (never: it has headers).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Fills `buf` with the file's bytes from `pos` (zeros past its end).
    pub fn read(&self, pos: u64, buf: &mut [u8]) {
        buf.fill(0);
        let head = self.head.len() as u64;
        let mut done = 0usize;
        if pos < head {
            let n = ((head - pos) as usize).min(buf.len());
            buf[..n].copy_from_slice(&self.head[pos as usize..pos as usize + n]);
            done = n;
        }
        if done == buf.len() {
            return;
        }
        let ram_pos = pos + done as u64 - head;
        if ram_pos >= self.ram {
            return;
        }
        let n = ((self.ram - ram_pos) as usize).min(buf.len() - done);
        let out = &mut buf[done..done + n];
        crate::kubevirt::export::fill(self.key, ram_pos, out);
        // The transcript where it overlaps this window.
        let (m0, m1) = (self.marker_at, self.marker_at + self.marker.len() as u64);
        let (w0, w1) = (ram_pos, ram_pos + n as u64);
        let (a, b) = (m0.max(w0), m1.min(w1));
        if a < b {
            out[(a - w0) as usize..(b - w0) as usize]
                .copy_from_slice(&self.marker[(a - m0) as usize..(b - m0) as usize]);
        }
    }
}

/// GNU tar's record: archives are padded to a multiple of it.
const RECORD: u64 = 10240;

/// `tar Scv .` of a directory holding one file: `./`, `./NAME` with the file's bytes.
#[derive(Debug)]
pub struct TarImage {
    head: Vec<u8>,
    file: Arc<Core>,
    len: u64,
}

impl TarImage {
    /// The archive of a claim holding `file` as `name`, modified at `mtime` (Unix seconds).
    pub fn new(name: &str, file: Arc<Core>, mtime: u64) -> std::io::Result<TarImage> {
        let mut head = Vec::with_capacity(1024);
        for (path, dir) in [("./", true), (&*format!("./{name}"), false)] {
            let mut h = tar::Header::new_gnu();
            // GNU tar names them `./` and `./NAME` (set_path would drop the `./`).
            let field = &mut h.as_old_mut().name;
            if path.len() >= field.len() {
                return Err(std::io::Error::other("name too long for a tar header"));
            }
            field[..path.len()].copy_from_slice(path.as_bytes());
            if dir {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
            } else {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(file.len());
            }
            h.set_uid(107); // qemu, as virt-launcher writes the dump
            h.set_gid(107);
            h.set_mtime(mtime);
            h.set_cksum();
            head.extend_from_slice(h.as_bytes());
        }
        // The file padded to 512 bytes, two zero blocks, then padding to the record.
        let body = file.len().next_multiple_of(512);
        let len = (head.len() as u64 + body + 1024).next_multiple_of(RECORD);
        Ok(TarImage { head, file, len })
    }

    /// The archive's size.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the archive is empty (never).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Fills `buf` with the archive's bytes from `pos`.
    pub fn read(&self, pos: u64, buf: &mut [u8]) {
        buf.fill(0);
        let head = self.head.len() as u64;
        let mut done = 0usize;
        if pos < head {
            let n = ((head - pos) as usize).min(buf.len());
            buf[..n].copy_from_slice(&self.head[pos as usize..pos as usize + n]);
            done = n;
        }
        let at = pos + done as u64;
        if done < buf.len() && at < head + self.file.len() {
            let n = ((head + self.file.len() - at) as usize).min(buf.len() - done);
            self.file.read(at - head, &mut buf[done..done + n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_agree_at_every_split() {
        let core = Core::new(7, 4 << 20, 2, b"hello marker");
        let mut whole = vec![0u8; core.len() as usize];
        core.read(0, &mut whole);
        assert_eq!(&whole[..4], b"\x7fELF");
        let at = core.head.len() + MARKER_OFFSET as usize;
        assert_eq!(&whole[at..at + 12], b"hello marker");
        for split in [1, 63, 700, at - 3, at + 5, whole.len() - 1] {
            let mut part = vec![0u8; whole.len() - split];
            core.read(split as u64, &mut part);
            assert_eq!(part, whole[split..], "split {split}");
        }
    }
}
