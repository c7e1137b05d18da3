//! `kubectl vm vnc`: the proxy prints its port and a VNC client completes the RFB handshake
//! (RFC 6143) through it; a found viewer is launched on the port; `--preserve-session`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};

use crate::common::{BIN, Env, fails, stderr};

/// Starts `kubectl-vm vnc … --proxy-only` and returns it with the port it printed.
fn proxy(env: &Env, args: &[&str]) -> (Child, u16) {
    let mut child = env
        .command(BIN)
        .arg("vnc")
        .args(args)
        .arg("--proxy-only")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    assert_eq!(json.as_object().unwrap().len(), 1, "{line}");
    (child, json["port"].as_u64().unwrap() as u16)
}

fn read_n(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    stream.read_exact(&mut buf).unwrap();
    buf
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// An RFB 3.8 client (RFC 6143 §7): handshake with security None, then one full
/// FramebufferUpdateRequest, reading every rectangle. Returns (width, height, desktop name).
fn rfb_client(port: u16) -> (u16, u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    assert_eq!(read_n(&mut s, 12), b"RFB 003.008\n");
    s.write_all(b"RFB 003.008\n").unwrap();
    let count = read_n(&mut s, 1)[0] as usize;
    let types = read_n(&mut s, count);
    assert!(types.contains(&1), "security None offered: {types:?}");
    s.write_all(&[1]).unwrap();
    assert_eq!(read_n(&mut s, 4), [0, 0, 0, 0], "SecurityResult OK");
    s.write_all(&[1]).unwrap(); // ClientInit, shared
    let init = read_n(&mut s, 24);
    let (width, height) = (u16_at(&init, 0), u16_at(&init, 2));
    let bits_per_pixel = init[4] as usize;
    let name_len = u32::from_be_bytes([init[20], init[21], init[22], init[23]]) as usize;
    let name = String::from_utf8(read_n(&mut s, name_len)).unwrap();
    let mut request = vec![3, 0, 0, 0, 0, 0];
    request.extend_from_slice(&width.to_be_bytes());
    request.extend_from_slice(&height.to_be_bytes());
    s.write_all(&request).unwrap();
    let head = read_n(&mut s, 4);
    assert_eq!(head[0], 0, "FramebufferUpdate");
    let mut covered = 0usize;
    for _ in 0..u16_at(&head, 2) {
        let rect = read_n(&mut s, 12);
        let (w, h) = (u16_at(&rect, 4) as usize, u16_at(&rect, 6) as usize);
        assert_eq!(&rect[8..12], &[0, 0, 0, 0], "Raw encoding");
        read_n(&mut s, w * h * bits_per_pixel / 8);
        covered += w * h;
    }
    assert_eq!(covered, width as usize * height as usize, "one full frame");
    (width, height, name)
}

fn stop(mut child: Child) -> String {
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    stderr(&output)
}

fn proxy_handshake(env: &Env, vm: &str, path: &str, protocol: &str) {
    let (child, port) = proxy(env, &[vm]);
    let (width, height, name) = rfb_client(port);
    assert!(width > 0 && height > 0);
    assert_eq!(name, format!("default/{vm}"));
    // A second client after the first left gets a fresh stream.
    rfb_client(port);
    stop(child);
    let requests: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.path == path && r.header("upgrade").is_some())
        .collect();
    assert_eq!(requests.len(), 2, "one stream per client");
    for r in requests {
        assert_eq!(
            (r.method.as_str(), r.query.as_str(), r.status),
            ("GET", "", 101)
        );
        assert_eq!(r.header("sec-websocket-protocol"), Some(protocol));
    }
}

#[test]
fn vnc_proxy_only_kubevirt_rfb_handshake() {
    let env = Env::kubevirt();
    proxy_handshake(
        &env,
        "web",
        "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/web/vnc",
        "plain.kubevirt.io",
    );
}

#[test]
fn vnc_proxy_only_deckhouse_rfb_handshake() {
    let env = Env::deckhouse();
    proxy_handshake(
        &env,
        "linux-vm",
        "/apis/subresources.virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualmachines/linux-vm/vnc",
        "plain.virtualization.deckhouse.io",
    );
}

#[test]
fn preserve_session_refuses_an_active_session() {
    let env = Env::kubevirt();
    let (first, _port) = proxy(&env, &["web"]);
    let output = env.vm(&[
        "vnc",
        "web",
        "--proxy-only",
        "--preserve-session",
        "--force",
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(
        stderr(&output).trim_end(),
        "Error: conflict: another VNC session is active on web (--preserve-session refuses to take it over)"
    );
    let refused = env
        .emulator
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/web/vnc") && r.status == 500)
        .expect("the refused request");
    assert_eq!(refused.query, "preserveSession=true");
    stop(first);
}

#[test]
fn a_found_viewer_is_launched_on_the_port() {
    let env = Env::kubevirt();
    // A stand-in remote-viewer: records its argument and reads the server's RFB version.
    let record = env.dir.path().join("viewer.txt");
    let script = format!(
        "#!/bin/bash\nurl=\"$1\"\nport=\"${{url##*:}}\"\nexec 3<>/dev/tcp/127.0.0.1/$port\nversion=$(head -c 12 <&3)\nprintf '%s\\n%s' \"$url\" \"$version\" > {}\n",
        record.display()
    );
    let viewer = env.bin_dir.join("remote-viewer");
    std::fs::write(&viewer, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&viewer, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = env.vm(&["vnc", "web"]);
    assert!(output.status.success(), "{output:?}");
    let recorded = std::fs::read_to_string(&record).unwrap();
    let (url, version) = recorded.split_once('\n').unwrap();
    assert!(url.starts_with("vnc://127.0.0.1:"), "{url}");
    assert_eq!(version, "RFB 003.008");
}

#[test]
fn screenshot_writes_a_png_on_kubevirt_and_is_refused_on_deckhouse() {
    let env = Env::kubevirt();
    let png = env.dir.path().join("web.png");
    let png_arg = png.display().to_string();
    let output = env.vm(&["vnc", "screenshot", "web", "-o", &png_arg]);
    assert!(output.status.success(), "{output:?}");
    let request = env
        .emulator
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/vnc/screenshot"))
        .unwrap();
    const SCREENSHOT: &str = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/web/vnc/screenshot";
    assert_eq!(request.path, SCREENSHOT);
    // The file holds exactly what the server sends, as real kubectl reads it.
    let raw = env.kubectl(&["get", "--raw", SCREENSHOT]);
    assert!(raw.status.success(), "{}", stderr(&raw));
    let saved = std::fs::read(&png).unwrap();
    assert!(
        saved == raw.stdout,
        "saved {} bytes, the server sends {}",
        saved.len(),
        raw.stdout.len()
    );
    // `file` (libmagic) is the independent judge that it is an image at all.
    let described = std::process::Command::new("file")
        .arg("-b")
        .arg(&png)
        .output()
        .expect("file is installed (tests/tools/install-test-deps.sh)");
    let described = String::from_utf8_lossy(&described.stdout);
    assert!(
        described.starts_with("PNG image data, 320 x 200, 8-bit/color RGB"),
        "{described}"
    );
    // A server answering 200 with something else (here a JSON Status, as a misrouted proxy
    // might): refused, and no file is written.
    env.emulator.inject_failure(kubevm_emulator::FailureRule {
        verb: "vnc".into(),
        plural: "virtualmachineinstances".into(),
        name: Some("web".into()),
        code: 200,
        message: "not an image".into(),
        times: Some(1),
    });
    let other = env.dir.path().join("other.png");
    let err = fails(
        &env,
        &["vnc", "screenshot", "web", "-o", other.to_str().unwrap()],
        1,
    );
    assert_eq!(err, "Error: the screenshot is not a PNG image");
    assert!(!other.exists(), "nothing written for a refused screenshot");
    // Deckhouse has no screenshot.
    let env = Env::deckhouse();
    let output = env.vm(&["vnc", "screenshot", "linux-vm", "-o", &png_arg]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr(&output).trim_end(),
        "Error: vnc screenshot needs KubeVirt: Deckhouse virtualization has no screenshot subresource"
    );
}

#[test]
fn vnc_asks_before_taking_over_on_both_flavors() {
    for (env, vm) in [(Env::kubevirt(), "web"), (Env::deckhouse(), "linux-vm")] {
        let (first, _port) = proxy(&env, &[vm]);
        let mut second = crate::common::on_tty(
            &env,
            &[
                "vnc",
                vm,
                "--proxy-only",
                "--as",
                "bob",
                "--as-group",
                "system:masters",
            ],
        );
        second
            .exp_string(&format!("The VNC of {vm} is in use:"))
            .unwrap();
        second.exp_string("user       admin").unwrap();
        second.exp_string("wait until free: ").unwrap();
        second.send_line("").unwrap();
        second.exp_eof().unwrap();
        assert_eq!(crate::common::exit_code(&second), 0, "Enter means no");
        stop(first);
    }
}

#[test]
fn sigterm_ends_the_proxy_and_releases_the_kubevirt_lease() {
    let env = Env::kubevirt();
    let (child, _port) = proxy(&env, &["web"]);
    let lease = |env: &Env| {
        env.emulator
            .objects("coordination.k8s.io", "leases", Some("default"))
            .into_iter()
            .find(|l| l["metadata"]["name"] == "kubectl-vm-vnc-web")
    };
    let held = lease(&env).expect("the session Lease while serving");
    assert_eq!(held["spec"]["holderIdentity"], "admin");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130));
    assert!(lease(&env).is_none(), "released");
}

/// The viewer's deadline covers connecting only: a session held past it goes on, and ends
/// (exit 0) when the viewer quits. The deadline is cut to 1 s for the test.
#[test]
fn a_viewer_session_outlives_the_connect_deadline() {
    let env = Env::kubevirt();
    let ready = env.dir.path().join("ready");
    let quit = env.dir.path().join("quit");
    for fifo in [&ready, &quit] {
        let made = std::process::Command::new("mkfifo")
            .arg(fifo)
            .status()
            .unwrap();
        assert!(made.success());
    }
    // A stand-in viewer: connects, reads the RFB version, says so, and stays connected until
    // told to quit.
    let script = format!(
        "#!/bin/bash\nurl=\"$1\"\nport=\"${{url##*:}}\"\nexec 3<>/dev/tcp/127.0.0.1/$port\nversion=$(head -c 12 <&3)\necho \"$version\" > {}\nread -r line < {}\n",
        ready.display(),
        quit.display()
    );
    let viewer = env.bin_dir.join("remote-viewer");
    std::fs::write(&viewer, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&viewer, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = env
        .command(crate::common::BIN)
        .args(["vnc", "web"])
        .env("KUBECTL_VM_VIEWER_TIMEOUT", "1s")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Blocks until the viewer has connected.
    let version = std::fs::read_to_string(&ready).unwrap();
    assert_eq!(version.trim(), "RFB 003.008");
    // Three times the deadline later the session is still there.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < until {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the session ended at the connect deadline: {}",
            {
                let mut err = String::new();
                use std::io::Read;
                child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                err
            }
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::fs::write(&quit, "quit\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("did not connect"), "{err}");
}

/// `--viewer PATH` launches that program (TigerVNC's `HOST:PORT` form for an unknown name),
/// and the `KUBECTL_VM_VNC_VIEWER` variable does the same; a viewer that does not exist is
/// refused before any request.
#[test]
fn a_named_viewer_is_launched_and_a_missing_one_refused_up_front() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::kubevirt();
    let record = env.dir.path().join("viewer.txt");
    let viewer = env.dir.path().join("my viewer");
    let script = format!(
        "#!/bin/bash\naddress=\"$1\"\nexec 3<>/dev/tcp/127.0.0.1/${{address##*:}}\nversion=$(head -c 12 <&3)\nprintf '%s\\n%s' \"$address\" \"$version\" > '{}'\n",
        record.display()
    );
    std::fs::write(&viewer, script).unwrap();
    std::fs::set_permissions(&viewer, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A remote-viewer in PATH that must not be the one started.
    let decoy = env.bin_dir.join("remote-viewer");
    std::fs::write(&decoy, "#!/bin/sh\nexit 3\n").unwrap();
    std::fs::set_permissions(&decoy, std::fs::Permissions::from_mode(0o755)).unwrap();

    let output = env.vm(&["vnc", "web", "--viewer", viewer.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    let recorded = std::fs::read_to_string(&record).unwrap();
    let (address, version) = recorded.split_once('\n').unwrap();
    assert!(address.starts_with("127.0.0.1:"), "{address}");
    assert_eq!(version, "RFB 003.008");

    std::fs::remove_file(&record).unwrap();
    let output = env
        .command(BIN)
        .args(["vnc", "web"])
        .env("KUBECTL_VM_VNC_VIEWER", &viewer)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    assert!(record.exists(), "the viewer from the environment ran");

    let before = env.emulator.requests().len();
    let err = fails(&env, &["vnc", "web", "--viewer", "no-such-viewer"], 2);
    assert_eq!(
        err,
        "Error: VNC viewer \"no-such-viewer\" not found (give a path, or a program name in PATH)"
    );
    assert_eq!(env.emulator.requests().len(), before, "no request was made");
}
