//! `execute` against the in-memory SFTP server of `fake_sftp`: what a hostile guest can make
//! a download do.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::fake_sftp::FakeFs;
use super::*;

async fn download(
    fs: &FakeFs,
    remote: &str,
    local: &Path,
    preserve: bool,
) -> Result<u64, SshError> {
    let sftp = fs.session().await;
    let plan = plan(
        &format!("web:{remote}"),
        local.to_str().unwrap(),
        true,
        preserve,
    )
    .unwrap();
    execute(&sftp, &plan, &|_| {}).await
}

/// The umask as the shell reports it (an independent reading of the process's umask).
fn shell_umask() -> u32 {
    let out = std::process::Command::new("sh")
        .args(["-c", "umask"])
        .output()
        .unwrap();
    u32::from_str_radix(String::from_utf8(out.stdout).unwrap().trim(), 8).unwrap()
}

/// Names from a guest's directory listing that are not one normal path component are
/// refused (OpenSSH scp since CVE-2019-6111): nothing is written outside the destination, and
/// nothing of that directory is written at all.
#[tokio::test]
async fn recursive_download_refuses_names_that_are_not_one_component() {
    let root = tempfile::tempdir().unwrap();
    let outside = root.path().join("abs-target");
    let hostile = [
        "../escaped".to_string(),
        outside.to_str().unwrap().to_string(),
        "a/b".to_string(),
        "".to_string(),
    ];
    for name in hostile {
        let dest = root.path().join("dest");
        let fs = FakeFs::default();
        fs.dir("/d", 0o755, &["good", &name]);
        fs.file("/d/good", 0o644, b"good");
        fs.dir("/d/a", 0o755, &[]);
        fs.file(&join("/d", &name), 0o644, b"evil");
        std::fs::create_dir(&dest).unwrap();
        let err = download(&fs, "/d", &dest, false)
            .await
            .expect_err(&format!("{name:?} accepted"));
        assert!(
            err.to_string().contains(&format!("{name:?}"))
                && err.to_string().contains("not a single file name"),
            "{name:?}: {err}"
        );
        assert!(!root.path().join("escaped").exists(), "{name:?}");
        assert!(!outside.exists(), "{name:?}");
        assert!(!dest.join("d/a/b").exists(), "{name:?}");
        assert!(
            !dest.join("d/good").exists(),
            "{name:?}: written before the refusal"
        );
        std::fs::remove_dir_all(&dest).unwrap();
    }
}

/// Modes from the guest go through the local umask and lose setuid, setgid and sticky, with
/// `-p` as without it; `-p` keeps the times.
#[tokio::test]
async fn downloaded_modes_are_masked_by_the_umask() {
    let umask = shell_umask();
    let root = tempfile::tempdir().unwrap();
    for preserve in [false, true] {
        let fs = FakeFs::default();
        fs.dir("/d", 0o7777, &["f"]);
        fs.file("/d/f", 0o6777, b"data");
        let dest = root.path().join(format!("p-{preserve}"));
        std::fs::create_dir(&dest).unwrap();
        download(&fs, "/d", &dest, preserve).await.unwrap();
        let file = std::fs::metadata(dest.join("d/f")).unwrap();
        assert_eq!(
            file.permissions().mode() & 0o7777,
            0o777 & !umask,
            "file, -p {preserve}"
        );
        let dir = std::fs::metadata(dest.join("d")).unwrap();
        assert_eq!(dir.permissions().mode() & 0o7000, 0, "dir, -p {preserve}");
        assert_eq!(
            dir.permissions().mode() & 0o002 & umask,
            0,
            "dir, -p {preserve}"
        );
        if preserve {
            use std::os::unix::fs::MetadataExt;
            assert_eq!(file.mtime(), 1_000_000_000);
        }
    }
}

async fn upload(fs: &FakeFs, local: &Path, remote: &str) -> Result<u64, SshError> {
    let sftp = fs.session().await;
    let plan = plan(
        local.to_str().unwrap(),
        &format!("web:{remote}"),
        false,
        false,
    )
    .unwrap();
    execute(&sftp, &plan, &|_| {}).await
}

fn content(fs: &FakeFs, path: &str) -> Option<Vec<u8>> {
    match fs.get(path) {
        Some(fake_sftp::Node::File { data, .. }) => Some(data),
        _ => None,
    }
}

/// An upload over an existing file replaces it; when the server's renames fail the old file
/// stays (it used to be removed before the rename), and no temporary file is left behind.
#[tokio::test]
async fn upload_keeps_the_old_file_until_the_new_one_is_in_place() {
    let root = tempfile::tempdir().unwrap();
    let local = root.path().join("f");
    std::fs::write(&local, b"new").unwrap();

    let fs = FakeFs::default();
    fs.dir("/d", 0o755, &["f"]);
    fs.file("/d/f", 0o644, b"old");
    upload(&fs, &local, "/d/f").await.unwrap();
    assert_eq!(content(&fs, "/d/f").as_deref(), Some(&b"new"[..]));
    assert!(
        !fs.log().iter().any(|l| l == "remove /d/f"),
        "the old file was removed before the rename: {:?}",
        fs.log()
    );

    let fs = FakeFs::default();
    fs.dir("/d", 0o755, &["f"]);
    fs.file("/d/f", 0o644, b"old");
    fs.fail_renames();
    let err = upload(&fs, &local, "/d/f").await.unwrap_err();
    assert!(err.to_string().contains("/d/f"), "{err}");
    assert_eq!(
        content(&fs, "/d/f").as_deref(),
        Some(&b"old"[..]),
        "{:?}",
        fs.log()
    );
    let left: Vec<String> = fs
        .log()
        .into_iter()
        .filter(|l| l.contains("kubevm-tmp") && !l.starts_with("remove"))
        .collect();
    assert!(
        fs.get(&temp_name("/d/f")).is_none(),
        "temporary file left: {left:?}"
    );
}
