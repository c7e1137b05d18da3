//! Ctrl-C during `kubectl vm upload`: the run is stopped once its own output shows bytes
//! sent, then real kubectl shows what it created is gone (or kept with `--keep`), and it exits
//! 130 as kubectl does on SIGINT.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::common::{BIN, Env, stderr, stdout};
use crate::upload_deckhouse::trusted;

const GIB: u64 = 1 << 30;

/// Starts the upload of a sparse 1 GiB raw file, waits for a progress line with bytes sent,
/// sends SIGINT, and returns the exit code and everything it printed on stderr.
fn interrupt(env: &Env, target: &str, extra: &[&str]) -> (Option<i32>, String) {
    let file = env.dir.path().join("big.raw");
    let f = std::fs::File::create(&file).unwrap();
    f.set_len(GIB).unwrap();
    drop(f);
    let mut child = env
        .command(BIN)
        .env("SSL_CERT_FILE", trusted(env))
        .args([
            "upload",
            file.to_str().unwrap(),
            target,
            "--format",
            "raw",
            "--progress-every",
            "100ms",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push_str(&line);
        seen.push('\n');
        let ended = line.starts_with("uploaded ") && line.contains(" in ");
        assert!(!ended, "the upload ended first:\n{seen}");
        if line.starts_with("uploaded ") && !line.starts_with("uploaded 0 B") {
            break;
        }
    }
    assert!(seen.contains("uploaded "), "no progress line:\n{seen}");
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    for line in lines {
        seen.push_str(&line.unwrap());
        seen.push('\n');
    }
    (child.wait().unwrap().code(), seen)
}

fn names(env: &Env, kinds: &str) -> String {
    let out = env.kubectl(&["get", kinds, "-A", "-o", "name"]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn ctrl_c_removes_the_data_volume_unless_kept() {
    let env = Env::kubevirt();
    let (code, err) = interrupt(&env, "dv/big", &[]);
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("deleted DataVolume big"), "{err}");
    assert!(!names(&env, "datavolumes").contains("/big\n"), "{err}");

    let (code, err) = interrupt(&env, "dv/kept", &["--keep"]);
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("kept DataVolume kept (--keep)"), "{err}");
    assert!(names(&env, "datavolumes").contains("datavolume.cdi.kubevirt.io/kept\n"));
}

#[test]
fn ctrl_c_removes_the_virtual_disk_unless_kept() {
    let env = Env::deckhouse();
    let (code, err) = interrupt(&env, "vd/big", &[]);
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("deleted VirtualDisk big"), "{err}");
    assert!(!names(&env, "virtualdisks").contains("/big\n"), "{err}");

    let (code, err) = interrupt(&env, "vi/kept", &["--keep"]);
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("kept VirtualImage kept (--keep)"), "{err}");
    assert!(
        names(&env, "virtualimages").contains("virtualimage.virtualization.deckhouse.io/kept\n")
    );
}
