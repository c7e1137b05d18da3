//! `scp`, `port-forward` and `ssh-config` end to end against the emulator's sshd guests;
//! checksums from sha256sum, OpenSSH's own ssh/scp as the other client.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{Env, ok, stderr, stdout};
use crate::ssh::vm_with_ca;

fn sha256(path: &std::path::Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    stdout(&out).split_whitespace().next().unwrap().to_owned()
}

fn remote_sha256(env: &Env, path: &str) -> String {
    let out = ok(env.vm(&["ssh", "sshvm", "--", "sha256sum", path]));
    out.split_whitespace().next().unwrap().to_owned()
}

fn scp_both_ways(env: &Env) {
    vm_with_ca(env, "sshvm", &[]);
    let dir = env.dir.path();
    let big = dir.join("big.bin");
    let mut f = std::fs::File::create(&big).unwrap();
    let mut rng = std::fs::File::open("/dev/urandom").unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..100 {
        rng.read_exact(&mut buf).unwrap();
        f.write_all(&buf).unwrap();
    }
    drop(f);
    let want = sha256(&big);
    ok(env.vm(&["scp", big.to_str().unwrap(), "sshvm:/tmp/big.bin"]));
    assert_eq!(remote_sha256(env, "/tmp/big.bin"), want);
    let back = dir.join("back.bin");
    ok(env.vm(&["scp", "sshvm:/tmp/big.bin", back.to_str().unwrap()]));
    assert_eq!(sha256(&back), want);
    // A tree with -r -p.
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::write(tree.join("a/x"), "one\n").unwrap();
    std::fs::write(tree.join("a/b/y"), "two\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tree.join("a/x"), std::fs::Permissions::from_mode(0o640)).unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    std::fs::File::options()
        .write(true)
        .open(tree.join("a/x"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    ok(env.vm(&["scp", "-r", "-p", tree.to_str().unwrap(), "sshvm:/tmp/"]));
    let stat = ok(env.vm(&["ssh", "sshvm", "--", "stat -c '%a %Y' /tmp/tree/a/x"]));
    assert_eq!(stat.trim(), "640 1600000000");
    let copy = dir.join("copy");
    ok(env.vm(&["scp", "-r", "-p", "sshvm:/tmp/tree", copy.to_str().unwrap()]));
    for rel in ["a/x", "a/b/y"] {
        assert_eq!(sha256(&copy.join(rel)), sha256(&tree.join(rel)), "{rel}");
    }
    let meta = std::fs::metadata(copy.join("a/x")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o640);
    assert_eq!(
        meta.modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs(),
        1_600_000_000
    );
    // No temporary names left behind.
    let left = ok(env.vm(&["ssh", "sshvm", "--", "ls", "-a", "/tmp"]));
    assert!(!left.contains("kubevm-tmp"), "{left}");
}

#[test]
fn kubevirt_scp() {
    scp_both_ways(&Env::kubevirt());
}

#[test]
fn deckhouse_scp() {
    scp_both_ways(&Env::deckhouse());
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn port_forward_two_ports_and_udp() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "sshvm", &[]);
    let (ssh_port, echo_port, udp_port) = (free_port(), free_port(), free_port());
    let mut child = env
        .command(crate::common::BIN)
        .args([
            "port-forward",
            "sshvm",
            &format!("{ssh_port}:22"),
            &format!("{echo_port}:7"),
            &format!("udp/{udp_port}:7"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut seen = String::new();
    let mut b = [0u8; 256];
    while seen.matches("Forwarding from").count() < 3 {
        let n = out.read(&mut b).unwrap();
        assert!(n > 0, "{seen}");
        seen.push_str(&String::from_utf8_lossy(&b[..n]));
    }
    assert!(
        seen.contains(&format!("Forwarding from 127.0.0.1:{ssh_port} -> 22")),
        "{seen}"
    );
    // Port 22: the guest's OpenSSH banner.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", ssh_port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut banner = [0u8; 8];
    s.read_exact(&mut banner).unwrap();
    assert_eq!(&banner, b"SSH-2.0-");
    // Port 7 at the same time, two connections: echo.
    for word in ["first", "second"] {
        let mut e = std::net::TcpStream::connect(("127.0.0.1", echo_port)).unwrap();
        e.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        e.write_all(word.as_bytes()).unwrap();
        let mut got = vec![0u8; word.len()];
        e.read_exact(&mut got).unwrap();
        assert_eq!(got, word.as_bytes());
    }
    // UDP echo.
    let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    u.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    u.send_to(b"ping", ("127.0.0.1", udp_port)).unwrap();
    let mut got = [0u8; 16];
    let (n, _) = u.recv_from(&mut got).unwrap();
    assert_eq!(&got[..n], b"ping");
    drop(s);
    child.kill().unwrap();
    let _ = child.wait();
}

#[test]
fn openssh_through_ssh_config_and_stdio() {
    let env = Env::deckhouse();
    vm_with_ca(&env, "sshvm", &[]);
    let kubeconfig = env.kubeconfig.to_str().unwrap().to_owned();
    // The flags given are carried into the config (KUBECONFIG is not set for ssh below).
    let installed = ok(env.vm(&["--kubeconfig", &kubeconfig, "ssh-config", "--install"]));
    assert!(installed.contains("added `Include"), "{installed}");
    let again = ok(env.vm(&["--kubeconfig", &kubeconfig, "ssh-config", "--install"]));
    assert!(again.contains("already includes it"), "{again}");
    let ssh_config = env.dir.path().join(".ssh/config");
    let run = |program: &str, args: &[&str]| {
        env.command(program)
            .env_remove("KUBECONFIG")
            .args(["-F", ssh_config.to_str().unwrap(), "-o", "BatchMode=yes"])
            .args(args)
            .output()
            .unwrap()
    };
    let out = run("ssh", &["sshvm.default.vm", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run("ssh", &["sshvm.default.vm", "id", "-un"]);
    assert_eq!(stdout(&out), "kubevm\n", "{}", stderr(&out));
    let file = env.dir.path().join("f.txt");
    std::fs::write(&file, "via openssh\n").unwrap();
    let out = run(
        "scp",
        &[file.to_str().unwrap(), "sshvm.default.vm:/tmp/f.txt"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let back = env.dir.path().join("g.txt");
    let out = run(
        "scp",
        &["sshvm.default.vm:/tmp/f.txt", back.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "via openssh\n");
    use std::os::unix::fs::PermissionsExt;
    for f in [
        "ssh/id_ed25519",
        "ssh/certs/kubevm@sshvm.default.vm-cert.pub",
        "ssh_config",
    ] {
        let p = env.dir.path().join(".kube/kubectl-vm").join(f);
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600,
            "{f}"
        );
    }
    // The config as printed works alone, for a VM created after it was generated, and for
    // parallel connections (one stable key, certificates replaced atomically).
    let printed = env.dir.path().join("printed_config");
    std::fs::write(
        &printed,
        ok(env.vm(&["--kubeconfig", &kubeconfig, "ssh-config"])),
    )
    .unwrap();
    vm_with_ca(&env, "later", &[]);
    let children: Vec<_> = (0..4)
        .map(|i| {
            env.command("ssh")
                .env_remove("KUBECONFIG")
                .args(["-F", printed.to_str().unwrap(), "-o", "BatchMode=yes"])
                .args([
                    if i % 2 == 0 {
                        "later.default.vm"
                    } else {
                        "sshvm.default.vm"
                    },
                    "echo",
                    "parallel",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert_eq!(stdout(&out), "parallel\n", "{}", stderr(&out));
    }
    // A hostile host name is never run by a shell.
    let witness = env.dir.path().join("pwned");
    let hostile = format!("x$(touch {}).default.vm", witness.display());
    let out = env
        .command("ssh")
        .env_remove("KUBECONFIG")
        .args([
            "-F",
            printed.to_str().unwrap(),
            "-o",
            "BatchMode=yes",
            &hostile,
            "true",
        ])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(!witness.exists(), "the host name was run by a shell");
    // --stdio as a hand-written ProxyCommand, with the CA as the only host trust.
    let out = env
        .command("ssh")
        .args([
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            &format!(
                "ProxyCommand={} --kubeconfig {kubeconfig} port-forward --stdio sshvm.default 22",
                crate::common::BIN
            ),
            "-o",
            "HostKeyAlias=sshvm.default.vm",
            "-o",
            &format!(
                "KnownHostsCommand={} --kubeconfig {kubeconfig} ssh-known-hosts",
                crate::common::BIN
            ),
            "-o",
            "StrictHostKeyChecking=yes",
            "-i",
            env.dir
                .path()
                .join(".kube/kubectl-vm/ssh/id_ed25519")
                .to_str()
                .unwrap(),
            "-o",
            &format!(
                "CertificateFile={}",
                env.dir
                    .path()
                    .join(".kube/kubectl-vm/ssh/certs/kubevm@sshvm.default.vm-cert.pub")
                    .display()
            ),
            "kubevm@sshvm",
            "echo",
            "proxied",
        ])
        .output()
        .unwrap();
    assert_eq!(stdout(&out), "proxied\n", "{}", stderr(&out));
}

/// `printf req | kubectl vm port-forward --stdio VM PORT` gets the reply: the end of stdin
/// does not end the stream before the answer arrives (half-close as with `nc -N` or OpenSSH).
#[test]
fn stdio_gets_the_reply_after_stdin_ends() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "sshvm", &[]);
    let mut child = env
        .command(crate::common::BIN)
        .args(["port-forward", "--stdio", "sshvm", "7"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The request, then end of input.
    child.stdin.take().unwrap().write_all(b"req-4711").unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut got = vec![0u8; 8];
    let read = out.read_exact(&mut got);
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    assert!(read.is_ok(), "no reply: {read:?}; {}", stderr(&output));
    assert_eq!(got, b"req-4711");
}

/// `--stdio` ends on SIGHUP, as OpenSSH sends it to its ProxyCommand when it exits, even when
/// whoever started it ignores SIGHUP (nohup): the tunnel must not outlive ssh (before, it held
/// the guest's connection, and ssh's inherited output pipes, until the guest gave up).
#[test]
fn stdio_ends_on_sighup_even_when_ignored() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "sshvm", &[]);
    let mut child = env
        .command("sh")
        .arg("-c")
        .arg(format!(
            "trap '' HUP; exec {} port-forward --stdio sshvm 7",
            crate::common::BIN
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The tunnel is up once the echo answers.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"ping").unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut got = [0u8; 4];
    out.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"ping");
    let kill = std::process::Command::new("kill")
        .args(["-HUP", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    // A bound, not a wait: if SIGHUP is not handled the tunnel lives on (the echo never
    // closes), and this ends it so that the test fails instead of hanging.
    let pid = child.id().to_string();
    let (ended, watchdog) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if watchdog.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status();
        }
    });
    // Ends by itself: its stdout reaches EOF and it exits (stdin is still open).
    let mut rest = Vec::new();
    out.read_to_end(&mut rest).unwrap();
    let status = child.wait().unwrap();
    let _ = ended.send(());
    drop(stdin);
    assert!(rest.is_empty(), "{rest:?}");
    assert!(status.success(), "{status:?}");
}

/// `port-forward --address` listens on that address only: the guest's echo answers there,
/// and the default 127.0.0.1 refuses the same port.
#[test]
fn port_forward_listens_on_the_given_address_only() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "sshvm", &[]);
    let port = free_port();
    let mut child = env
        .command(crate::common::BIN)
        .args(["port-forward", "sshvm", &format!("{port}:7")])
        .args(["--address", "127.0.0.2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut seen = String::new();
    let mut b = [0u8; 256];
    while !seen.contains('\n') {
        let n = out.read(&mut b).unwrap();
        assert!(n > 0, "{seen}");
        seen.push_str(&String::from_utf8_lossy(&b[..n]));
    }
    assert_eq!(seen, format!("Forwarding from 127.0.0.2:{port} -> 7\n"));
    let mut e = std::net::TcpStream::connect(("127.0.0.2", port)).unwrap();
    e.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    e.write_all(b"there").unwrap();
    let mut got = [0u8; 5];
    e.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"there");
    let refused = std::net::TcpStream::connect(("127.0.0.1", port));
    assert_eq!(
        refused.map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );
    child.kill().unwrap();
    let _ = child.wait();
}
