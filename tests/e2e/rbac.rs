//! Issue 38: the README's one-VM grant, applied as printed with real kubectl, lets a user with
//! no other rights ssh, scp, console, vnc and port-forward to that VM, and each of them is
//! refused for another VM of the same namespace — on KubeVirt and on Deckhouse. The emulator
//! authorizes every subresource through RBAC as kube-apiserver does (its own test:
//! tests/emulator/tests/subresource_rbac.rs).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::common::{BIN, Env, ok, stderr, stdout};
use crate::signer::{ALICE, create_vm, one_line_255, ssh_as, start_signer};

/// The README's `web-access.yaml` for `platform` (`KubeVirt` or `Deckhouse`), as printed.
pub fn readme_manifest(platform: &str) -> String {
    let readme = include_str!("../../README.md");
    let marker = format!("# web-access.yaml ({platform})");
    let block = readme
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains(&marker))
        .unwrap_or_else(|| panic!("the README shows {marker}"));
    block
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Applies `manifest` with real kubectl as the administrator.
fn apply(env: &Env, manifest: &str) {
    let path = env.dir.path().join("web-access.yaml");
    std::fs::write(&path, manifest).unwrap();
    let out = ok(env.kubectl(&["apply", "-f", path.to_str().unwrap()]));
    assert!(
        out.contains("role.rbac.authorization.k8s.io/web-access created")
            && out.contains("rolebinding.rbac.authorization.k8s.io/alice-web-access created"),
        "{out}"
    );
}

fn alice(env: &Env, args: &[&str], input: &[u8]) -> Output {
    let mut child = env
        .command(BIN)
        .args(ALICE)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `port-forward VM -n dev PORT:22` as alice: the first bytes a local connection reads (the
/// guest's SSH banner when allowed) and what the command wrote to stderr.
fn port_forward(env: &Env, vm: &str) -> (Vec<u8>, String) {
    let port = free_port();
    let mut child = env
        .command(BIN)
        .args(ALICE)
        .args(["port-forward", vm, "-n", "dev", &format!("{port}:22")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("Forwarding from"), "{line}");
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8];
    while got.len() < 8 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    drop(s);
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    (got, stderr(&out))
}

/// `vnc VM -n dev --proxy-only` as alice, one RFB client: the server's first 12 bytes (the
/// RFB version when allowed) and the proxy's stderr.
fn vnc(env: &Env, vm: &str) -> (Vec<u8>, String) {
    let mut child = env
        .command(BIN)
        .args(ALICE)
        .args(["vnc", vm, "-n", "dev", "--proxy-only"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut got = Vec::new();
    if let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) {
        let port = json["port"].as_u64().unwrap() as u16;
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 12];
        while got.len() < 12 {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    (got, stderr(&out))
}

fn the_readme_grant_opens_one_vm(env: &Env, platform: &str) {
    let _signer = start_signer(env, &[]);
    create_vm(env, "web", "dev");
    create_vm(env, "db", "dev");
    // alice keeps no other right in dev: the emulator's reader binding goes.
    ok(env.kubectl(&[
        "delete",
        "rolebinding",
        "kubevm-emulator:alice-view",
        "-n",
        "dev",
    ]));
    apply(env, &readme_manifest(platform));

    // ssh and scp: certificate from the signer, connection through portforward.
    let out = ssh_as(env, ALICE, &["web.dev", "--", "id", "-un"]);
    assert_eq!(
        (out.status.code(), stdout(&out).as_str()),
        (Some(0), "kubevm\n"),
        "{platform}: {}",
        stderr(&out)
    );
    let file = env.dir.path().join("hello.txt");
    std::fs::write(&file, "hello\n").unwrap();
    let out = alice(
        env,
        &["scp", file.to_str().unwrap(), "web.dev:/tmp/hello.txt"],
        b"",
    );
    assert!(out.status.success(), "{platform}: {}", stderr(&out));
    let back = env.dir.path().join("back.txt");
    let out = alice(
        env,
        &["scp", "web.dev:/tmp/hello.txt", back.to_str().unwrap()],
        b"",
    );
    assert!(out.status.success(), "{platform}: {}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "hello\n");
    // console, off a terminal: connects, nothing to warn about.
    let out = alice(env, &["console", "web", "-n", "dev"], b"");
    assert!(out.status.success(), "{platform}: {}", stderr(&out));
    assert!(!stderr(&out).contains("Warning"), "{}", stderr(&out));
    // vnc: the RFB server's version through the proxy.
    let (got, err) = vnc(env, "web");
    assert_eq!(got, b"RFB 003.008\n", "{platform}: {err}");
    // port-forward: the guest's SSH banner.
    let (got, err) = port_forward(env, "web");
    assert_eq!(got, b"SSH-2.0-", "{platform}: {err}");

    // db, in the same namespace: every way in is refused by the API server.
    let err = one_line_255(&ssh_as(env, ALICE, &["db.dev", "--", "true"]));
    assert!(err.contains("User \"alice\" cannot"), "{platform}: {err}");
    let out = alice(
        env,
        &["scp", file.to_str().unwrap(), "db.dev:/tmp/hello.txt"],
        b"",
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("User \"alice\" cannot") || stderr(&out).contains("forbidden"),
        "{platform}: {}",
        stderr(&out)
    );
    let out = alice(env, &["console", "db", "-n", "dev"], b"");
    assert_eq!(out.status.code(), Some(1), "{platform}: {}", stderr(&out));
    assert!(
        stderr(&out).contains("forbidden: user \"alice\" cannot"),
        "{platform}: {}",
        stderr(&out)
    );
    let (got, err) = vnc(env, "db");
    assert!(got.is_empty(), "{platform}: {got:?}");
    assert!(
        err.contains("forbidden: user \"alice\" cannot"),
        "{platform}: {err}"
    );
    let (got, err) = port_forward(env, "db");
    assert!(got.is_empty(), "{platform}: {got:?}");
    assert!(
        err.contains("forbidden: user \"alice\" cannot"),
        "{platform}: {err}"
    );
}

#[test]
fn the_readme_grant_opens_one_vm_kubevirt() {
    the_readme_grant_opens_one_vm(&Env::kubevirt(), "KubeVirt");
}

#[test]
fn the_readme_grant_opens_one_vm_deckhouse() {
    the_readme_grant_opens_one_vm(&Env::deckhouse(), "Deckhouse");
}
