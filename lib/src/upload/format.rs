//! What a local image file is, read from its magic bytes (never its name), and the virtual
//! size of the disk it holds where the header says it.
//!
//! Facts (the formats' own specifications, as qemu's block drivers read them):
//! - qcow2: `QFI\xfb` at 0, virtual size big-endian u64 at 24 (qemu `docs/interop/qcow2.txt`);
//! - VMDK sparse extent: `KDMV` at 0, capacity in 512-byte sectors little-endian u64 at 12
//!   (VMware "Virtual Disk Format 1.1", `SparseExtentHeader`);
//! - VHD: the 512-byte footer `conectix` at the end (fixed disks) and also at 0 (dynamic
//!   disks), current size big-endian u64 at 48 of the footer (Microsoft VHD specification);
//! - VHDX: `vhdxfile` at 0; the virtual size is the metadata item
//!   2FA54224-CD1B-4876-B211-5DBED83BF4B8 of the metadata region
//!   8B7CA206-4790-4B9A-B8FE-575F050F886E named by the region table at 192 KiB ([MS-VHDX] 2.2);
//! - ISO 9660: `CD001` at 0x8001 (the first volume descriptor at sector 16);
//! - gzip `1f 8b`; xz `fd 37 7a 58 5a 00`, whose index at the end lists every block's
//!   uncompressed size (xz file format 1.0.4, §4 and §5).
//! - raw: a disk with an MBR boot signature `55 aa` at 510 or a GPT header `EFI PART` at 512.
//!   Anything else is unknown, and uploaded only with `--format raw`.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::{Error, Result};

/// A detected image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// QEMU copy-on-write v2/v3.
    Qcow2,
    /// A raw disk (MBR/GPT found, or `--format raw`).
    Raw,
    /// An ISO 9660 image (uploaded as raw).
    Iso,
    /// VMware sparse extent.
    Vmdk,
    /// Microsoft Virtual Hard Disk.
    Vhd,
    /// Microsoft Virtual Hard Disk v2.
    Vhdx,
    /// gzip-compressed image.
    Gzip,
    /// xz-compressed image.
    Xz,
}

impl ImageFormat {
    /// The short name users see.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Qcow2 => "qcow2",
            ImageFormat::Raw => "raw",
            ImageFormat::Iso => "iso",
            ImageFormat::Vmdk => "vmdk",
            ImageFormat::Vhd => "vhd",
            ImageFormat::Vhdx => "vhdx",
            ImageFormat::Gzip => "gzip",
            ImageFormat::Xz => "xz",
        }
    }
}

/// What [`inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// The format.
    pub format: ImageFormat,
    /// Bytes in the file.
    pub file_size: u64,
    /// The disk's size once written to a volume: the header's virtual size, the file size for
    /// raw and ISO, the uncompressed size for xz; `None` where only decompressing would tell
    /// (gzip).
    pub virtual_size: Option<u64>,
}

/// Reads the format and virtual size of `path`. `force_raw` (`--format raw`) takes a file of
/// no known format as raw. Errors are one line ([`Error::Usage`]: exit 2).
pub fn inspect(path: &Path, force_raw: bool) -> Result<ImageInfo> {
    let shown = path.display();
    let mut file =
        File::open(path).map_err(|e| Error::Usage(format!("cannot read {shown}: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| Error::Usage(format!("cannot read {shown}: {e}")))?;
    if !meta.is_file() {
        return Err(Error::Usage(format!("{shown} is not a regular file")));
    }
    let file_size = meta.len();
    if file_size == 0 {
        return Err(Error::Usage(format!("{shown} is empty")));
    }
    let io = |e: std::io::Error| Error::Usage(format!("cannot read {shown}: {e}"));
    let head = read_at(&mut file, 0, 0x8006).map_err(io)?;
    let info = |format, virtual_size| ImageInfo {
        format,
        file_size,
        virtual_size,
    };
    let be64 = |b: &[u8], at: usize| {
        b.get(at..at + 8)
            .map(|s| u64::from_be_bytes(s.try_into().unwrap_or_default()))
    };
    let le64 = |b: &[u8], at: usize| {
        b.get(at..at + 8)
            .map(|s| u64::from_le_bytes(s.try_into().unwrap_or_default()))
    };
    let bad = |what: &str| Error::Usage(format!("{shown}: {what}"));
    if head.starts_with(b"QFI\xfb") {
        let size = be64(&head, 24).ok_or_else(|| bad("truncated qcow2 header"))?;
        return Ok(info(ImageFormat::Qcow2, Some(size)));
    }
    if head.starts_with(b"KDMV") {
        let sectors = le64(&head, 12).ok_or_else(|| bad("truncated VMDK header"))?;
        return Ok(info(ImageFormat::Vmdk, Some(sectors.saturating_mul(512))));
    }
    if head.starts_with(b"vhdxfile") {
        let size = vhdx_size(&mut file).map_err(io)?.ok_or_else(|| {
            bad("VHDX without a readable virtual size (region table or metadata damaged)")
        })?;
        return Ok(info(ImageFormat::Vhdx, Some(size)));
    }
    if head.starts_with(b"conectix") {
        let size = be64(&head, 48).ok_or_else(|| bad("truncated VHD footer"))?;
        return Ok(info(ImageFormat::Vhd, Some(size)));
    }
    if head.starts_with(&[0x1f, 0x8b]) {
        return Ok(info(ImageFormat::Gzip, None));
    }
    if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        let size = xz_uncompressed_size(&mut file, file_size)
            .map_err(io)?
            .ok_or_else(|| bad("xz file with an unreadable index (truncated?)"))?;
        return Ok(info(ImageFormat::Xz, Some(size)));
    }
    if head.get(0x8001..0x8006) == Some(b"CD001") {
        return Ok(info(ImageFormat::Iso, Some(file_size)));
    }
    if file_size >= 512 {
        let footer = read_at(&mut file, file_size - 512, 512).map_err(io)?;
        if footer.starts_with(b"conectix") {
            let size = be64(&footer, 48).ok_or_else(|| bad("truncated VHD footer"))?;
            // A fixed disk has no header, so qemu-img (and CDI, which probes with it) takes
            // the whole file, footer included, as a raw disk: that much space is needed.
            return Ok(info(ImageFormat::Vhd, Some(size.max(file_size))));
        }
    }
    let mbr = head.get(510..512) == Some(&[0x55, 0xaa]);
    let gpt = head.get(512..520) == Some(b"EFI PART");
    if mbr || gpt || force_raw {
        return Ok(info(ImageFormat::Raw, Some(file_size)));
    }
    Err(Error::Usage(format!(
        "{shown}: unknown image format (not qcow2, raw with a partition table, ISO, VMDK, VHD, VHDX, gzip or xz); use --format raw to upload it as a raw disk"
    )))
}

/// Up to `len` bytes at `offset` (fewer at the end of the file).
fn read_at(file: &mut File, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(len);
    file.by_ref().take(len as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// A GUID as stored on disk (mixed-endian) from its text form's fields.
const fn guid(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_le_bytes();
    let b = b.to_le_bytes();
    let c = c.to_le_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6],
        d[7],
    ]
}

const VHDX_METADATA_REGION: [u8; 16] = guid(
    0x8B7C_A206,
    0x4790,
    0x4B9A,
    [0xB8, 0xFE, 0x57, 0x5F, 0x05, 0x0F, 0x88, 0x6E],
);
const VHDX_VIRTUAL_DISK_SIZE: [u8; 16] = guid(
    0x2FA5_4224,
    0xCD1B,
    0x4876,
    [0xB2, 0x11, 0x5D, 0xBE, 0xD8, 0x3B, 0xF4, 0xB8],
);

/// The VHDX virtual size: region table (at 192 KiB, signature `regi`) → metadata region →
/// metadata table (signature `metadata`) → the Virtual Disk Size item.
fn vhdx_size(file: &mut File) -> std::io::Result<Option<u64>> {
    let le32 = |b: &[u8], at: usize| {
        b.get(at..at + 4)
            .map(|s| u32::from_le_bytes(s.try_into().unwrap_or_default()))
    };
    let le64 = |b: &[u8], at: usize| {
        b.get(at..at + 8)
            .map(|s| u64::from_le_bytes(s.try_into().unwrap_or_default()))
    };
    let regions = read_at(file, 192 * 1024, 64 * 1024)?;
    if !regions.starts_with(b"regi") {
        return Ok(None);
    }
    let count = le32(&regions, 8).unwrap_or(0).min(2047) as usize;
    let metadata = (0..count).find_map(|i| {
        let e = 16 + i * 32;
        (regions.get(e..e + 16)? == VHDX_METADATA_REGION).then(|| le64(&regions, e + 16))?
    });
    let Some(offset) = metadata else {
        return Ok(None);
    };
    let table = read_at(file, offset, 64 * 1024)?;
    if !table.starts_with(b"metadata") {
        return Ok(None);
    }
    let entries = usize::from(u16::from_le_bytes([table[10], table[11]])).min(2047);
    for i in 0..entries {
        let e = 32 + i * 32;
        if table.get(e..e + 16) != Some(&VHDX_VIRTUAL_DISK_SIZE[..]) {
            continue;
        }
        let Some(item) = le32(&table, e + 16) else {
            return Ok(None);
        };
        let value = read_at(file, offset + u64::from(item), 8)?;
        return Ok(le64(&value, 0));
    }
    Ok(None)
}

/// Reads an xz multibyte integer at `*pos` (7 bits a byte, least significant first).
fn xz_varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..9 {
        let byte = *b.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The total uncompressed size of the last stream of an xz file, from its index (the sum of
/// its records' uncompressed sizes). Stream padding and earlier concatenated streams are not
/// followed: `None` then.
fn xz_uncompressed_size(file: &mut File, size: u64) -> std::io::Result<Option<u64>> {
    if size < 24 {
        return Ok(None);
    }
    let footer = read_at(file, size - 12, 12)?;
    if &footer[10..12] != b"YZ" {
        return Ok(None);
    }
    let backward = u64::from(u32::from_le_bytes([
        footer[4], footer[5], footer[6], footer[7],
    ]));
    let index_size = (backward + 1) * 4;
    if index_size + 12 > size || index_size > 16 << 20 {
        return Ok(None);
    }
    let index = read_at(file, size - 12 - index_size, index_size as usize)?;
    if index.first() != Some(&0) {
        return Ok(None);
    }
    let mut pos = 1;
    let Some(records) = xz_varint(&index, &mut pos) else {
        return Ok(None);
    };
    let mut total = 0u64;
    for _ in 0..records {
        let (Some(_unpadded), Some(uncompressed)) =
            (xz_varint(&index, &mut pos), xz_varint(&index, &mut pos))
        else {
            return Ok(None);
        };
        total = total.saturating_add(uncompressed);
    }
    Ok(Some(total))
}

#[cfg(test)]
mod tests;
