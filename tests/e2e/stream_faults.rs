//! Seeded network faults in every stream (issue 37 item 2): the emulator cuts, truncates
//! mid-frame, stalls or slows the connections of ssh (through port-forward), the serial
//! console and export downloads at offsets drawn from a fixed seed per connection
//! (`kubevm_emulator::core::faults`). Whatever the fault, each command either completes with the
//! right result (stalls and slow links are not errors; export resumes) or fails with one line
//! and a non-zero exit, leaving no file under its final name. Each failure names the seed that
//! made it, so a run repeats.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use kubevm_emulator::core::faults::{Fault, FaultSource};

use crate::common::{BIN, Env, stderr, stdout};
use crate::export::{MIB, kubevirt, reference_sha256, sha256_of};
use crate::ssh::vm_with_ca;

/// The seeds of a run: fixed, so a failure repeats; a long run by hand sets
/// `KUBEVM_FAULT_SEEDS=1-500`.
fn seeds() -> Vec<u64> {
    let spec = std::env::var("KUBEVM_FAULT_SEEDS").unwrap_or_else(|_| "1-8".into());
    let (a, b) = spec.split_once('-').unwrap_or((&spec, &spec));
    (a.parse().unwrap()..=b.parse().unwrap()).collect()
}

/// The one-line failure the contract allows: a non-zero exit, and an error of one line.
#[track_caller]
fn failed_cleanly(out: &Output, what: &str) {
    let err = stderr(out);
    // Notices about the cluster (no signer) are not part of the failure.
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("Notice:") && !l.starts_with("Warning:"))
        .collect();
    assert!(
        out.status.code().is_some_and(|c| c != 0),
        "{what}: exit {:?}, not a failure\n{err}",
        out.status
    );
    assert_eq!(lines.len(), 1, "{what}: the error is not one line:\n{err}");
}

/// `seq 1 N` as the guest prints it, checked against the local `seq`.
fn reference_seq(n: u32) -> String {
    let out = Command::new("seq")
        .arg("1")
        .arg(n.to_string())
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn ssh_completes_or_fails_in_one_line_under_seeded_faults() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "fw", &[]);
    let want = reference_seq(40_000);
    let ssh = || env.vm(&["ssh", "fw", "--", "seq", "1", "40000"]);
    // A stall and a slow link are not errors.
    for fault in [
        Fault::Stall {
            after: 3000,
            pause: Duration::from_millis(1500),
        },
        Fault::Delay {
            each: Duration::from_millis(5),
        },
    ] {
        env.emulator
            .set_stream_faults(Some(FaultSource::Fixed(fault)));
        let out = ssh();
        assert_eq!(
            (out.status.code(), stdout(&out) == want),
            (Some(0), true),
            "{fault:?}: {}",
            stderr(&out)
        );
    }
    // A link cut in the key exchange, in the session and mid-frame ends the command.
    for fault in [
        Fault::Cut { after: 100 },
        Fault::Truncate { after: 5000 },
        Fault::Truncate { after: 120_000 },
    ] {
        env.emulator
            .set_stream_faults(Some(FaultSource::Fixed(fault)));
        let out = ssh();
        assert_ne!(stdout(&out), want, "{fault:?} carried everything?");
        failed_cleanly(&out, &format!("{fault:?}"));
    }
    for seed in seeds() {
        env.emulator
            .set_stream_faults(Some(FaultSource::Seeded(seed)));
        let out = ssh();
        let applied = env.emulator.stream_faults_applied();
        let fault = applied.last().map(|(_, f)| *f);
        if out.status.success() {
            assert_eq!(
                stdout(&out),
                want,
                "seed {seed} ({fault:?}): wrong data, exit 0"
            );
        } else {
            failed_cleanly(&out, &format!("seed {seed} ({fault:?})"));
        }
    }
    env.emulator.set_stream_faults(None);
    assert_eq!(stdout(&ssh()), want);
}

/// Reads the console's output until `marker` or its end: what came before the marker, or
/// `None` when the output ended without it.
fn read_until(
    out: impl std::io::Read + Send + 'static,
    marker: &'static str,
) -> std::sync::mpsc::Receiver<Option<String>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out);
        let mut line = Vec::new();
        let mut before = String::new();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    return;
                }
                Ok(_) if String::from_utf8_lossy(&line).contains(marker) => {
                    let _ = tx.send(Some(before));
                    // Drain the rest so the console never blocks on a full pipe.
                    let _ = std::io::copy(&mut lines, &mut std::io::sink());
                    return;
                }
                Ok(_) => before.push_str(&String::from_utf8_lossy(&line)),
            }
        }
    });
    rx
}

/// Whether `text` holds `seq 1 n`'s output whole, in order (the first number may follow the
/// prompt on its line: the command was typed ahead).
fn holds_seq(text: &str, n: u32) -> bool {
    let want: String = (1..=n).map(|i| format!("{i}\n")).collect();
    text.replace('\r', "").contains(&want)
}

#[test]
fn console_completes_or_fails_in_one_line_under_seeded_faults() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "fw", &[]);
    let mut held_back = 0;
    for seed in seeds() {
        env.emulator
            .set_stream_faults(Some(FaultSource::Seeded(seed)));
        let mut child = env
            .command(BIN)
            .args(["console", "fw", "--timeout", "20s"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let seen = read_until(child.stdout.take().unwrap(), "MARK-42");
        let mut stdin = child.stdin.take().unwrap();
        // The guest's shell computes the marker, so the echo of the typed line does not match;
        // enough output (169 KB) that most cuts and stalls fall inside it.
        // The emulator's serial guest asks for a login (cloud/cloud, its guest.rs).
        let _ = stdin.write_all(b"\ncloud\ncloud\nseq 1 30000; echo MARK-$((6*7))\n");
        let before = seen.recv_timeout(Duration::from_secs(30)).ok().flatten();
        let marked = before.is_some();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let fault = env.emulator.stream_faults_applied().last().map(|(_, f)| *f);
        // Serial output while the link is down is gone (a serial console keeps no history):
        // a session that reconnected and said so has done what it can.
        let reconnected = stderr(&out).contains("reconnecting");
        // A stall or a slow link holds the guest back (a serial line loses nothing while its
        // reader waits): every line of the output arrives, in order.
        if !reconnected && matches!(fault, Some(Fault::Stall { .. } | Fault::Delay { .. })) {
            let before = before.unwrap_or_else(|| {
                panic!(
                    "seed {seed} ({fault:?}): no marker; stderr: {}",
                    stderr(&out)
                )
            });
            assert!(
                holds_seq(&before, 30000),
                "seed {seed} ({fault:?}): output lost under a stall or slow link"
            );
            held_back += 1;
        }
        if (!marked && !reconnected) || !out.status.success() {
            failed_cleanly(
                &out,
                &format!("seed {seed} ({fault:?}), marker seen: {marked}"),
            );
        }
    }
    eprintln!("{held_back} of {} seeds held the guest back", seeds().len());
    // Seeds 1-8 (CI's) include stalls and slow links that the console rides out.
    assert!(held_back > 0 || seeds().len() < 8);
}

#[test]
fn export_resumes_or_fails_without_a_final_file_under_seeded_faults() {
    let size = MIB;
    let env = kubevirt(size, MIB);
    let want = reference_sha256("exp-root", size);
    for seed in seeds() {
        env.emulator
            .set_stream_faults(Some(FaultSource::Seeded(seed)));
        let file = env.dir.path().join(format!("disk-{seed}.img"));
        let out = crate::export::export(
            &env,
            &[
                "vm/exp",
                "--volume",
                "exp-root",
                "-o",
                file.to_str().unwrap(),
            ],
        );
        let faults = env.emulator.stream_faults_applied();
        if out.status.success() {
            assert_eq!(sha256_of(&file), want, "seed {seed} ({faults:?})");
        } else {
            failed_cleanly(&out, &format!("seed {seed} ({faults:?})"));
            assert!(
                !file.exists(),
                "seed {seed}: a failed export left {}",
                file.display()
            );
        }
    }
}

/// A link cut after the command's exit status came but before the channel closed: the tool
/// exited 0 with the output cut short (sshd may send the exit status before the last output).
/// Found by the seeded run above (seed 5 of 150, then seed 30 of 40); swept here over the end of
/// the transfer, where it happens.
#[test]
fn a_cut_after_the_exit_status_is_not_a_success() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "fw", &[]);
    let want = reference_seq(40_000);
    for after in (180_000u64..250_000).step_by(5000) {
        for fault in [Fault::Cut { after }, Fault::Truncate { after }] {
            env.emulator
                .set_stream_faults(Some(FaultSource::Fixed(fault)));
            let out = env.vm(&["ssh", "fw", "--", "seq", "1", "40000"]);
            let got = stdout(&out);
            if out.status.success() {
                assert!(
                    got == want,
                    "{fault:?}: exit 0 with {} of {} bytes",
                    got.len(),
                    want.len()
                );
            } else {
                failed_cleanly(&out, &format!("{fault:?}"));
            }
        }
    }
}

const SCREENSHOT: &str = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/web/vnc/screenshot";

/// The faults every stream test runs besides the seeds: a cut in the first bytes, a truncation
/// mid-data, a stall and a slow link.
fn fixed_faults() -> [Fault; 4] {
    [
        Fault::Cut { after: 100 },
        Fault::Truncate { after: 70_000 },
        Fault::Stall {
            after: 5000,
            pause: Duration::from_millis(1500),
        },
        Fault::Delay {
            each: Duration::from_millis(1),
        },
    ]
}

/// `vnc screenshot` with its answer cut, truncated, stalled or slowed: the PNG the server sends
/// (as real kubectl reads it) under the final name, or one line, a non-zero exit, the older file
/// under that name untouched and no `.partial` left.
#[test]
fn vnc_screenshot_completes_or_fails_without_a_partial_png() {
    let env = Env::kubevirt();
    let raw = env.kubectl(&["get", "--raw", SCREENSHOT]);
    assert!(raw.status.success(), "{}", stderr(&raw));
    let want = raw.stdout;
    let png = env.dir.path().join("shot.png");
    let partial = env.dir.path().join("shot.png.partial");
    let mut last_good = b"an older screenshot".to_vec();
    std::fs::write(&png, &last_good).unwrap();
    let sources = fixed_faults()
        .into_iter()
        .map(FaultSource::Fixed)
        .chain(seeds().into_iter().map(FaultSource::Seeded));
    for source in sources {
        env.emulator.set_stream_faults(Some(source));
        let out = env.vm(&["vnc", "screenshot", "web", "-o", png.to_str().unwrap()]);
        let fault = env.emulator.stream_faults_applied().last().map(|(_, f)| *f);
        let what = format!("{source:?} ({fault:?})");
        if out.status.success() {
            assert!(std::fs::read(&png).unwrap() == want, "{what}: wrong PNG");
            last_good = want.clone();
        } else {
            failed_cleanly(&out, &what);
            assert!(
                std::fs::read(&png).unwrap() == last_good,
                "{what}: the file under the final name changed"
            );
        }
        assert!(!partial.exists(), "{what}: {} left", partial.display());
    }
}

/// The defect the screenshot test above looks for, forced: a screenshot whose write fails
/// half-way (a file size limit) wrote straight to FILE, leaving a cut PNG there in place of the
/// older one. It is written as FILE.partial and renamed when complete.
#[test]
fn a_screenshot_that_cannot_be_written_keeps_the_older_file() {
    let env = Env::kubevirt();
    let png = env.dir.path().join("shot.png");
    std::fs::write(&png, b"an older screenshot").unwrap();
    // A file size limit far below the PNG's size; EFBIG instead of SIGXFSZ.
    let out = env
        .command("sh")
        .args(["-c", "trap '' XFSZ; ulimit -f 128; exec \"$0\" \"$@\""])
        .args([BIN, "vnc", "screenshot", "web", "-o", png.to_str().unwrap()])
        .output()
        .unwrap();
    failed_cleanly(&out, "a write over the file size limit");
    assert!(stderr(&out).contains("cannot write"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&png).unwrap(), b"an older screenshot");
    assert!(!env.dir.path().join("shot.png.partial").exists());
}

/// An RFB 3.8 viewer through the proxy at `port`: handshake with security None, then one
/// full framebuffer update read to its end. Err says where the session ended.
fn rfb_session(port: u16) -> Result<(), String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(15)))
        .map_err(|e| e.to_string())?;
    let mut read = |n: usize, what: &str| {
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf)
            .map(|()| buf)
            .map_err(|e| format!("{what}: {e}"))
    };
    let version = read(12, "version")?;
    if version != b"RFB 003.008\n" {
        return Err(format!("version {version:?}"));
    }
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let mut write = |b: &[u8]| w.write_all(b).map_err(|e| e.to_string());
    write(b"RFB 003.008\n")?;
    let mut read = |n: usize, what: &str| {
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf)
            .map(|()| buf)
            .map_err(|e| format!("{what}: {e}"))
    };
    let count = read(1, "security types")?[0] as usize;
    read(count, "security types")?;
    write(&[1])?;
    read(4, "security result")?;
    write(&[1])?;
    let init = read(24, "server init")?;
    let u16_at = |b: &[u8], at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
    let (width, height) = (u16_at(&init, 0), u16_at(&init, 2));
    let bpp = init[4] as usize / 8;
    let name_len = u32::from_be_bytes([init[20], init[21], init[22], init[23]]) as usize;
    read(name_len, "desktop name")?;
    let mut request = vec![3, 0, 0, 0, 0, 0];
    request.extend_from_slice(&width.to_be_bytes());
    request.extend_from_slice(&height.to_be_bytes());
    write(&request)?;
    let head = read(4, "update")?;
    let mut covered = 0usize;
    for _ in 0..u16_at(&head, 2) {
        let rect = read(12, "rectangle")?;
        let (rw, rh) = (u16_at(&rect, 4) as usize, u16_at(&rect, 6) as usize);
        read(rw * rh * bpp, "pixels")?;
        covered += rw * rh;
    }
    if covered != width as usize * height as usize {
        return Err(format!("{covered} pixels of {width}x{height}"));
    }
    Ok(())
}

/// `vnc --proxy-only` with its VM stream cut, truncated, stalled or slowed: each viewer session
/// either carries a whole frame or ends (the viewer sees the connection close, never a hang),
/// the proxy says in one line why it ended, and it serves the next viewer with a working
/// session.
#[test]
fn vnc_proxy_sessions_complete_or_end_in_one_line_under_faults() {
    let env = Env::kubevirt();
    let sources = fixed_faults()
        .into_iter()
        .map(FaultSource::Fixed)
        .chain(seeds().into_iter().map(FaultSource::Seeded));
    for source in sources {
        env.emulator.set_stream_faults(Some(source));
        let mut child = env
            .command(BIN)
            .args(["vnc", "web", "--proxy-only"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = serde_json::from_str::<serde_json::Value>(&line)
            .unwrap_or_else(|e| panic!("{source:?}: {line:?}: {e}"))["port"]
            .as_u64()
            .unwrap() as u16;
        let faulted = rfb_session(port);
        let fault = env.emulator.stream_faults_applied().last().map(|(_, f)| *f);
        let what = format!("{source:?} ({fault:?})");
        if let Err(e) = &faulted {
            assert!(
                !e.contains("timed out") && !e.contains("would block"),
                "{what}: hung: {e}"
            );
        }
        // The next viewer, on a sound link, gets a working session from the same proxy.
        env.emulator.set_stream_faults(None);
        let next = rfb_session(port);
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert_eq!(next, Ok(()), "{what}: the next session: {err}");
        let ended: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("VNC session of web ended: "))
            .collect();
        assert!(
            !ended.is_empty(),
            "{what}: no line on the session's end: {err}"
        );
        if faulted.is_err() {
            let unexplained: Vec<&str> = err
                .lines()
                .filter(|l| !l.starts_with("VNC session of web ended: "))
                .filter(|l| !l.trim().is_empty() && !l.starts_with("VNC client "))
                .collect();
            assert!(unexplained.is_empty(), "{what}: {err}");
        }
    }
}

/// `upload` with the upload server's connections cut, truncated, stalled or slowed: it retries
/// from the beginning (CDI's upload server cannot resume) and the DataVolume holds the file
/// byte for byte (`sha256sum` of the file against that of the exported PVC), or it fails in one
/// line with a non-zero exit and deletes the DataVolume it created.
#[test]
fn upload_completes_or_fails_in_one_line_under_seeded_faults() {
    let env = Env::kubevirt();
    let file = env.dir.path().join("noise.raw");
    crate::upload::noise(&file, 768 * 1024);
    let want = sha256_of(&file);
    let sources = fixed_faults()
        .into_iter()
        .map(FaultSource::Fixed)
        .chain(seeds().into_iter().map(FaultSource::Seeded));
    for (i, source) in sources.enumerate() {
        let name = format!("up-{i}");
        env.emulator.set_stream_faults(Some(source));
        let out = env.vm(&[
            "upload",
            file.to_str().unwrap(),
            &format!("dv/{name}"),
            "--format",
            "raw",
            "--retry-delay",
            "10ms",
        ]);
        let faults = env.emulator.stream_faults_applied();
        env.emulator.set_stream_faults(None);
        let what = format!("{source:?} ({faults:?})");
        let dvs = env.kubectl(&["get", "datavolumes", "-o", "name"]);
        let listed = stdout(&dvs).contains(&format!("datavolume.cdi.kubevirt.io/{name}\n"));
        if out.status.success() {
            let exported = env.dir.path().join(format!("{name}.img"));
            let pvc = format!("pvc/{name}");
            let got = env.vm(&["export", &pvc, "-o", exported.to_str().unwrap()]);
            assert!(got.status.success(), "{what}: export: {}", stderr(&got));
            // The PVC is the disk's size; the file is its start.
            let head = env.dir.path().join(format!("{name}.head"));
            let bytes = std::fs::read(&exported).unwrap();
            std::fs::write(&head, &bytes[..768 * 1024]).unwrap();
            assert_eq!(sha256_of(&head), want, "{what}: wrong data, exit 0");
            assert!(listed, "{what}: uploaded but no DataVolume");
        } else {
            // Progress lines come first (stderr is not a terminal); the failure is one line, the
            // last.
            let err = stderr(&out);
            assert!(out.status.code().is_some_and(|c| c != 0), "{what}: {err}");
            let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("Error:")).collect();
            assert_eq!(errors.len(), 1, "{what}: {err}");
            assert_eq!(
                err.trim_end().lines().last(),
                Some(errors[0]),
                "{what}: {err}"
            );
            assert!(!listed, "{what}: a failed upload left DataVolume {name}");
        }
    }
}
