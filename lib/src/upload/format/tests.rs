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

/// Properties of format sniffing (issue 37): `PROPTEST_CASES=2000 cargo test -p kubevm --lib
/// upload::format::tests::properties` for a long run.
mod properties {
    use super::*;
    use proptest::prelude::*;

    fn cases(default: u32) -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default);
        ProptestConfig::with_cases(cases)
    }

    /// The magic numbers `inspect` reads and where they sit.
    const MAGICS: [(u64, &[u8]); 8] = [
        (0, b"QFI\xfb"),
        (0, b"KDMV"),
        (0, b"conectix"),
        (0, b"vhdxfile"),
        (0x8001, b"CD001"),
        (0, b"\x1f\x8b"),
        (0, b"\xfd7zXZ\x00"),
        (510, b"\x55\xaa"),
    ];

    proptest! {
        #![proptest_config(cases(12))]

        /// For any size, the format and virtual size read from a header are what `qemu-img
        /// info` reads from the image `qemu-img create` made.
        #[test]
        fn headers_read_as_qemu_reads_them(pick in 0usize..4, mib in 1u64..(1 << 20)) {
            let (format, expected) = [
                ("qcow2", ImageFormat::Qcow2),
                ("vmdk", ImageFormat::Vmdk),
                ("vhdx", ImageFormat::Vhdx),
                ("vpc", ImageFormat::Vhd),
            ][pick];
            let dir = tempfile::tempdir().unwrap();
            let path = qemu_img(dir.path(), format, &format!("{mib}M"));
            let info = inspect(&path, false).unwrap();
            prop_assert_eq!(info.format, expected);
            prop_assert_eq!(info.virtual_size, Some(qemu_img_info_size(&path)));
        }
    }

    proptest! {
        #![proptest_config(cases(128))]

        /// A file that starts like an image but holds anything after its magic (a truncated
        /// download, a hostile file) is read without a panic: a format, or one line of error.
        #[test]
        fn damaged_headers_never_panic(
            pick in 0usize..8,
            len in 0u64..300_000,
            patches in prop::collection::vec((0u64..300_000, prop::collection::vec(any::<u8>(), 1..64)), 0..12),
        ) {
            let (at, magic) = MAGICS[pick];
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("image");
            let file = std::fs::File::create(&path).unwrap();
            let len = len.max(at + magic.len() as u64);
            file.set_len(len).unwrap();
            use std::os::unix::fs::FileExt;
            for (offset, bytes) in patches.iter().filter(|(o, b)| o + (b.len() as u64) <= len) {
                file.write_all_at(bytes, *offset).unwrap();
            }
            file.write_all_at(magic, at).unwrap();
            drop(file);
            for force_raw in [false, true] {
                if let Err(e) = inspect(&path, force_raw) {
                    prop_assert!(!e.to_string().contains('\n'), "{}", e);
                }
            }
        }
    }
}
