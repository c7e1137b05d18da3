//! Images made by the tools that define them (`qemu-img create`, `genisoimage`, `xz`,
//! `gzip`); the expected sizes are the ones given to those tools.

use super::*;
use std::process::Command;

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} (is it installed?): {e}"));
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

fn qemu_img(dir: &Path, format: &str, size: &str) -> std::path::PathBuf {
    let path = dir.join(format!("disk.{format}"));
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", format])
        .arg(&path)
        .arg(size));
    path
}

#[test]
fn qemu_img_formats_and_their_virtual_sizes() {
    let dir = tempfile::tempdir().unwrap();
    for (format, expected) in [
        ("qcow2", ImageFormat::Qcow2),
        ("vmdk", ImageFormat::Vmdk),
        ("vhdx", ImageFormat::Vhdx),
        ("vpc", ImageFormat::Vhd),
    ] {
        let path = qemu_img(dir.path(), format, "3G");
        let info = inspect(&path, false).unwrap();
        assert_eq!(info.format, expected, "{format}");
        // VHD sizes are rounded to a CHS geometry: what `qemu-img info` reports.
        let want = if format == "vpc" {
            qemu_img_info_size(&path)
        } else {
            3 << 30
        };
        assert_eq!(info.virtual_size, Some(want), "{format}");
    }
    // A fixed VHD has its footer only at the end; qemu-img's vpc rounds the size to its CHS
    // geometry, so the expected value is what `qemu-img info` reports.
    let fixed = dir.path().join("fixed.vhd");
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", "vpc", "-o", "subformat=fixed"])
        .arg(&fixed)
        .arg("64M"));
    let info = inspect(&fixed, false).unwrap();
    assert_eq!(info.format, ImageFormat::Vhd);
    assert_eq!(info.virtual_size, Some(qemu_img_info_size(&fixed)));
}

fn qemu_img_info_size(path: &Path) -> u64 {
    let out = Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(path)
        .output()
        .unwrap();
    let reported: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    reported["virtual-size"].as_u64().unwrap()
}

#[test]
fn iso_compressed_raw_and_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let content = dir.path().join("content");
    std::fs::create_dir(&content).unwrap();
    std::fs::write(content.join("hello.txt"), b"hello").unwrap();
    let iso = dir.path().join("x.iso");
    run(Command::new("genisoimage")
        .args(["-quiet", "-o"])
        .arg(&iso)
        .arg(&content));
    let info = inspect(&iso, false).unwrap();
    assert_eq!(info.format, ImageFormat::Iso);
    assert_eq!(
        info.virtual_size,
        Some(std::fs::metadata(&iso).unwrap().len())
    );

    // Random bytes: no known format; only `--format raw` takes them.
    let noise = dir.path().join("noise.img");
    let bytes: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&noise, &bytes).unwrap();
    let err = inspect(&noise, false).unwrap_err().to_string();
    assert!(err.contains("unknown image format"), "{err}");
    assert!(!err.contains('\n'));
    let raw = inspect(&noise, true).unwrap();
    assert_eq!(raw.format, ImageFormat::Raw);
    assert_eq!(raw.virtual_size, Some(3_000_000));

    // xz: the size from its index equals the input's; gzip: detected, size unknown.
    run(Command::new("xz").args(["-k", "-T1", "-0"]).arg(&noise));
    let xz = inspect(&dir.path().join("noise.img.xz"), false).unwrap();
    assert_eq!(xz.format, ImageFormat::Xz);
    assert_eq!(xz.virtual_size, Some(3_000_000));
    // Several blocks: the sizes of all index records add up.
    let blocks = dir.path().join("blocks.xz");
    let out = Command::new("xz")
        .args(["-c", "-0", "--block-size=1000000"])
        .arg(&noise)
        .output()
        .unwrap();
    std::fs::write(&blocks, out.stdout).unwrap();
    assert_eq!(
        inspect(&blocks, false).unwrap().virtual_size,
        Some(3_000_000)
    );
    run(Command::new("gzip").args(["-k", "-1"]).arg(&noise));
    let gz = inspect(&dir.path().join("noise.img.gz"), false).unwrap();
    assert_eq!(gz.format, ImageFormat::Gzip);
    assert_eq!(gz.virtual_size, None);

    // A raw disk with an MBR signature is raw without asking.
    let mut mbr = vec![0u8; 1 << 20];
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    let disk = dir.path().join("mbr.img");
    std::fs::write(&disk, &mbr).unwrap();
    assert_eq!(inspect(&disk, false).unwrap().format, ImageFormat::Raw);
}

#[test]
fn missing_empty_and_directories_are_one_line_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    for (path, want) in [
        (dir.path().join("nope.qcow2"), "cannot read"),
        (dir.path().to_path_buf(), "not a regular file"),
    ] {
        let err = inspect(&path, false).unwrap_err();
        assert!(matches!(err, Error::Usage(_)));
        assert!(err.to_string().contains(want), "{err}");
    }
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert!(
        inspect(&empty, true)
            .unwrap_err()
            .to_string()
            .contains("empty")
    );
    // A qcow2 name does not make a qcow2.
    let fake = dir.path().join("fake.qcow2");
    std::fs::write(&fake, vec![7u8; 4096]).unwrap();
    assert!(inspect(&fake, false).is_err());
}
