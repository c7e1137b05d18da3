//! The signer facing a hostile network (issue 32 items 5, 7, 8 and 10): slow and oversized
//! clients with and without the front-proxy certificate are dropped within the deadlines, the
//! front-proxy settings fail closed and are re-read while it runs, its own access review
//! refuses what RBAC does not allow even when the proxy lets it through, and the README's
//! `kubectl create role` grant works with the real kubectl.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;

use crate::common::{BIN, Env, find_object, ok, stderr, stdout};
use crate::signer::{
    ALICE, SignerProcess, create_vm, grant_alice_web, one_line_255, ssh_as, start_signer,
};

const CA_NS: &str = "kubevm-system";
/// The signer's deadlines (`ConnectionLimits::default()`): handshake, headers, body.
const DEADLINE: Duration = Duration::from_secs(5);
/// Slack over a deadline for a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(3);

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS client of the signer, verifying its serving certificate, optionally presenting the
/// emulator's front-proxy client certificate (what the API server presents).
struct Dialer {
    address: String,
    config: Arc<rustls::ClientConfig>,
}

impl Dialer {
    fn new(env: &Env, signer: &SignerProcess, front_proxy_cert: bool) -> Dialer {
        let secret = find_object(env, "", "secrets", Some(CA_NS), "kubevm-ssh-signer-tls").unwrap();
        let ca = base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["ca.crt"].as_str().unwrap())
            .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&ca) {
            roots.add(cert.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
        let config = if front_proxy_cert {
            let fp = env.emulator.front_proxy();
            builder
                .with_client_auth_cert(
                    vec![fp.client_cert_der.clone()],
                    PrivateKeyDer::Pkcs8(fp.client_key_der.clone().into()),
                )
                .unwrap()
        } else {
            builder.with_no_client_auth()
        };
        Dialer {
            address: signer.address.clone(),
            config: Arc::new(config),
        }
    }

    /// A connection with the handshake done.
    fn connect(&self) -> Tls {
        let sock = TcpStream::connect(&self.address).unwrap();
        let name = ServerName::try_from("kubevm-ssh-signer.kubevm-system.svc").unwrap();
        let conn = rustls::ClientConnection::new(self.config.clone(), name).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock).unwrap();
        }
        tls
    }
}

/// Writes `head` at once, then `trickle` one byte each `every`, reading all the while, until
/// the signer closes the connection. What it answered and how long it took from the end of
/// `head`. Panics if the connection is still open after a minute.
fn until_closed(mut tls: Tls, head: &[u8], trickle: &[u8], every: Duration) -> (Duration, String) {
    tls.sock.set_read_timeout(Some(every)).unwrap();
    let _ = tls.write_all(head).and_then(|_| tls.flush());
    let start = Instant::now();
    let mut answer = Vec::new();
    let mut pending = trickle.iter();
    loop {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "still open after a minute; answered {:?}",
            String::from_utf8_lossy(&answer)
        );
        if let Some(b) = pending.next() {
            let _ = tls.write_all(&[*b]).and_then(|_| tls.flush());
        }
        let mut buf = [0u8; 4096];
        match tls.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    (
        start.elapsed(),
        String::from_utf8_lossy(&answer).into_owned(),
    )
}

/// The same, for a plain TCP connection that never starts TLS.
fn tcp_until_closed(address: &str) -> Duration {
    let mut sock = TcpStream::connect(address).unwrap();
    let start = Instant::now();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let _ = sock.read(&mut [0u8; 16]);
    start.elapsed()
}

const PATH: &str =
    "/apis/ssh.kubevm.io/v1alpha1/namespaces/default/virtualmachines/www/sshcertificate";

fn post_head(identity: bool, extra: &str) -> Vec<u8> {
    let who = if identity {
        "X-Remote-User: admin\r\nX-Remote-Group: system:masters\r\n"
    } else {
        ""
    };
    format!(
        "POST {PATH} HTTP/1.1\r\nHost: signer\r\nContent-Type: application/json\r\n{who}{extra}\r\n"
    )
    .into_bytes()
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn slow_and_oversized_clients_are_dropped_within_the_deadlines() {
    let env = Env::kubevirt();
    let signer = start_signer(&env, &[]);
    let anonymous = Arc::new(Dialer::new(&env, &signer, false));
    let proxy = Arc::new(Dialer::new(&env, &signer, true));
    let slow = Duration::from_millis(100);
    let pad = vec![b'a'; 100_000];
    type Case = Box<dyn FnOnce() -> (Duration, String) + Send>;
    let cases: Vec<(&str, Duration, Option<&str>, Case)> = vec![
        (
            "TCP without a TLS handshake",
            DEADLINE,
            None,
            Box::new({
                let address = signer.address.clone();
                move || (tcp_until_closed(&address), String::new())
            }),
        ),
        (
            "no client certificate, headers trickled",
            DEADLINE,
            None,
            Box::new({
                let (d, pad) = (anonymous.clone(), pad.clone());
                move || {
                    let head = format!("POST {PATH} HTTP/1.1\r\nHost: signer\r\nX-Pad: ");
                    until_closed(d.connect(), head.as_bytes(), &pad, slow)
                }
            }),
        ),
        (
            "no client certificate, a 1 MB body announced and trickled",
            Duration::ZERO,
            Some("HTTP/1.1 401"),
            Box::new({
                let (d, pad) = (anonymous.clone(), pad.clone());
                move || {
                    let head = post_head(true, "Content-Length: 1048576\r\n");
                    until_closed(d.connect(), &head, &pad, slow)
                }
            }),
        ),
        (
            "no client certificate, a body announced and never sent",
            Duration::ZERO,
            Some("HTTP/1.1 401"),
            Box::new({
                let d = anonymous.clone();
                move || {
                    until_closed(
                        d.connect(),
                        &post_head(true, "Content-Length: 100\r\n"),
                        &[],
                        slow,
                    )
                }
            }),
        ),
        (
            "front-proxy certificate, Content-Length over 64 KiB",
            Duration::ZERO,
            Some("HTTP/1.1 413"),
            Box::new({
                let d = proxy.clone();
                move || {
                    until_closed(
                        d.connect(),
                        &post_head(true, "Content-Length: 70000\r\n"),
                        &[],
                        slow,
                    )
                }
            }),
        ),
        (
            "front-proxy certificate, a chunked body over 64 KiB sent at once",
            Duration::ZERO,
            Some("HTTP/1.1 413"),
            Box::new({
                let d = proxy.clone();
                move || {
                    let mut head = post_head(true, "Transfer-Encoding: chunked\r\n");
                    for _ in 0..70 {
                        head.extend_from_slice(b"400\r\n");
                        head.extend_from_slice(&[b'a'; 0x400]);
                        head.extend_from_slice(b"\r\n");
                    }
                    until_closed(d.connect(), &head, &[], slow)
                }
            }),
        ),
        (
            "front-proxy certificate, body trickled",
            DEADLINE,
            Some("HTTP/1.1 408"),
            Box::new({
                let (d, pad) = (proxy.clone(), pad.clone());
                move || {
                    until_closed(
                        d.connect(),
                        &post_head(true, "Content-Length: 5000\r\n"),
                        &pad,
                        slow,
                    )
                }
            }),
        ),
        (
            "front-proxy certificate, idle after the handshake",
            DEADLINE,
            None,
            Box::new({
                let d = proxy.clone();
                move || until_closed(d.connect(), b"", &[], slow)
            }),
        ),
        (
            "front-proxy certificate, idle after a complete request",
            DEADLINE,
            Some("HTTP/1.1 200"),
            Box::new({
                let d = proxy.clone();
                move || {
                    let head = "GET /apis/ssh.kubevm.io/v1alpha1 HTTP/1.1\r\nHost: signer\r\nX-Remote-User: admin\r\n\r\n";
                    until_closed(d.connect(), head.as_bytes(), &[], slow)
                }
            }),
        ),
    ];
    let running: Vec<_> = cases
        .into_iter()
        .map(|(what, deadline, answer, case)| (what, deadline, answer, std::thread::spawn(case)))
        .collect();
    for (what, deadline, answer, thread) in running {
        let (took, said) = thread.join().unwrap();
        eprintln!("{what}: closed after {took:.2?}");
        // Closed by the deadline, not before it (a deadline of 0: answered at once).
        assert!(
            took >= deadline.saturating_sub(Duration::from_millis(500)),
            "{what}: {took:?}"
        );
        assert!(took <= deadline + SLACK, "{what}: {took:?}; {said}");
        match answer {
            Some(status) => assert!(said.starts_with(status), "{what}: {said}"),
            None => assert!(!said.contains(" 201 "), "{what}: {said}"),
        }
    }
    // Nothing was issued, and every unauthenticated request was audited as such.
    let audit = signer.audit();
    assert!(!audit.iter().any(|r| r["event"] == "issued"), "{audit:?}");
    assert_eq!(
        audit
            .iter()
            .filter(|r| r["event"] == "unauthenticated")
            .count(),
        2,
        "{audit:?}"
    );
}

/// 200 connections with the front-proxy certificate trickling their bodies at once: the
/// signer's memory stays far under the pod's 128 Mi limit, it keeps issuing, and each slow
/// connection is closed by the body deadline.
#[test]
fn two_hundred_slow_connections_cost_little_and_do_not_stop_issuance() {
    let env = Env::kubevirt();
    let signer = start_signer(&env, &[]);
    create_vm(&env, "www", "default");
    let pid = signer.pid();
    let (idle_rss, hwm_before) = (rss_kib(pid, "VmRSS"), rss_kib(pid, "VmHWM"));
    let proxy = Arc::new(Dialer::new(&env, &signer, true));
    let open = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..200)
        .map(|_| {
            let (proxy, open, most, ready) =
                (proxy.clone(), open.clone(), most.clone(), ready_tx.clone());
            std::thread::spawn(move || {
                let tls = proxy.connect();
                let now = open.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                ready.send(()).unwrap();
                let result = until_closed(
                    tls,
                    &post_head(true, "Content-Length: 5000\r\n"),
                    &[b'a'; 5000],
                    Duration::from_millis(200),
                );
                open.fetch_sub(1, Ordering::SeqCst);
                result
            })
        })
        .collect();
    for _ in 0..200 {
        ready_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    }
    let rss_under_attack = rss_kib(pid, "VmRSS");
    // Issuance goes on meanwhile.
    let out = ssh_as(&env, &[], &["www", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut worst = Duration::ZERO;
    for thread in threads {
        let (took, said) = thread.join().unwrap();
        assert!(said.starts_with("HTTP/1.1 408"), "{said}");
        worst = worst.max(took);
    }
    let hwm = rss_kib(pid, "VmHWM");
    eprintln!(
        "signer RSS: idle {idle_rss} KiB, with 200 slow connections open {rss_under_attack} KiB, \
         peak {hwm} KiB (peak before {hwm_before} KiB); most open at once {}; slowest closed after {worst:.2?}",
        most.load(Ordering::SeqCst)
    );
    assert!(worst <= DEADLINE + SLACK, "{worst:?}");
    assert!(hwm < 128 * 1024, "peak RSS {hwm} KiB");
}

fn wait_audit(signer: &SignerProcess, event: &str, after: usize) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Some(r) = signer
            .audit()
            .into_iter()
            .skip(after)
            .find(|r| r["event"] == event)
        {
            return r;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no {event} record"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn set_authentication_data(env: &Env, key: &str, value: &str) {
    let mut cm = find_object(
        env,
        "",
        "configmaps",
        Some("kube-system"),
        "extension-apiserver-authentication",
    )
    .unwrap();
    cm["data"][key] = json!(value);
    cm["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    env.emulator.put_object(cm);
}

/// Issue 32 item 7: a change of the ConfigMap applies while the signer runs; malformed
/// settings make it refuse every request (fail closed), at start too.
#[test]
fn front_proxy_settings_are_reloaded_and_fail_closed() {
    let env = Env::kubevirt();
    let signer = start_signer(&env, &[]);
    create_vm(&env, "www", "default");
    let key = "requestheader-allowed-names";
    // Another allowed name: the API server's certificate (CN front-proxy-client) no longer counts.
    let seen = signer.audit().len();
    set_authentication_data(&env, key, r#"["another-proxy"]"#);
    wait_audit(&signer, "requestheader-reloaded", seen);
    let err = one_line_255(&ssh_as(&env, &[], &["www", "--", "true"]));
    assert!(
        err.contains("is not one of the API server's requestheader-allowed-names"),
        "{err}"
    );
    set_authentication_data(&env, key, r#"["front-proxy-client"]"#);
    // Another CA: the API server's certificate no longer chains to it. A certificate that is
    // presented and does not verify fails the TLS handshake (as Go's VerifyClientCertIfGiven
    // does), which the API server reports as the signer unavailable.
    let ca_key = "requestheader-client-ca-file";
    let original_ca = find_object(
        &env,
        "",
        "configmaps",
        Some("kube-system"),
        "extension-apiserver-authentication",
    )
    .unwrap()["data"][ca_key]
        .as_str()
        .unwrap()
        .to_owned();
    let other_ca = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args([
            "-nodes",
            "-subj",
            "/CN=another-front-proxy-ca",
            "-days",
            "1",
        ])
        .args(["-keyout", "/dev/null", "-out", "-"])
        .output()
        .unwrap();
    assert!(other_ca.status.success(), "{}", stderr(&other_ca));
    let seen = signer.audit().len();
    set_authentication_data(&env, ca_key, &stdout(&other_ca));
    wait_audit(&signer, "requestheader-reloaded", seen);
    let issued = |signer: &SignerProcess| {
        signer
            .audit()
            .iter()
            .filter(|r| r["event"] == "issued")
            .count()
    };
    let before = issued(&signer);
    let err = one_line_255(&ssh_as(&env, &[], &["www", "--", "true"]));
    assert!(err.contains("is unavailable"), "{err}");
    assert_eq!(issued(&signer), before);
    let seen = signer.audit().len();
    set_authentication_data(&env, ca_key, &original_ca);
    wait_audit(&signer, "requestheader-reloaded", seen);
    let out = ssh_as(&env, &[], &["www", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Malformed: refused, where it used to mean "any name".
    let seen = signer.audit().len();
    set_authentication_data(&env, key, "front-proxy-client");
    let record = wait_audit(&signer, "requestheader-invalid", seen);
    assert!(
        record["error"]
            .as_str()
            .unwrap()
            .contains("requestheader-allowed-names is not a JSON list"),
        "{record}"
    );
    let err = one_line_255(&ssh_as(&env, &[], &["www", "--", "true"]));
    assert!(err.contains("the signer refuses to serve"), "{err}");
    // A signer started now does not start.
    let started = crate::signer::start_signer_process(&env, &[]);
    let out = started.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("front-proxy settings: requestheader-allowed-names is not a JSON list"),
        "{}",
        stderr(&out)
    );
    // Fixed: served again, without a restart.
    let seen = signer.audit().len();
    set_authentication_data(&env, key, r#"["front-proxy-client"]"#);
    wait_audit(&signer, "requestheader-reloaded", seen);
    let out = ssh_as(&env, &[], &["www", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// POST a certificate request straight to the signer with the front-proxy certificate and
/// the identity headers for `user`: what a proxy that skipped authorization would send.
fn proxied_as(dialer: &Dialer, user: &str, vm: &str, login: Option<&str>) -> String {
    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHcP1uPBmPUxGj6S+v8Wgfc1ckRtXQ4dx2ri8DPz8GLy";
    proxied_with_key(dialer, user, vm, login, key)
}

fn proxied_with_key(
    dialer: &Dialer,
    user: &str,
    vm: &str,
    login: Option<&str>,
    key: &str,
) -> String {
    let mut spec = json!({"publicKey": key});
    if let Some(login) = login {
        spec["login"] = json!(login);
    }
    let body = json!({"apiVersion": "ssh.kubevm.io/v1alpha1", "kind": "SSHCertificateRequest", "spec": spec})
        .to_string();
    let head = format!(
        "POST /apis/ssh.kubevm.io/v1alpha1/namespaces/dev/virtualmachines/{vm}/sshcertificate HTTP/1.1\r\n\
         Host: signer\r\nContent-Type: application/json\r\nConnection: close\r\n\
         X-Remote-User: {user}\r\nX-Remote-Group: system:authenticated\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    until_closed(
        dialer.connect(),
        head.as_bytes(),
        &[],
        Duration::from_millis(100),
    )
    .1
}

/// Issue 32 items 8 and 1: the signer asks the API server itself (SubjectAccessReview), so a
/// request the proxy let through for a user RBAC does not allow is refused; a login other than
/// the platform user needs `use` on `logins/LOGIN`, besides the VM listing it.
#[test]
fn the_signer_authorizes_for_itself_and_logins_are_an_rbac_decision() {
    let env = Env::kubevirt();
    let signer = start_signer(&env, &[]);
    create_vm(&env, "web", "dev");
    create_vm(&env, "db", "dev");
    grant_alice_web(&env);
    ok(env.kubectl(&[
        "annotate",
        "vm",
        "web",
        "-n",
        "dev",
        "ssh.kubevm.io/logins=ops",
    ]));
    let proxy = Dialer::new(&env, &signer, true);
    // bob has no binding at all, alice none for db.
    for (user, vm) in [("bob", "web"), ("alice", "db")] {
        let answer = proxied_as(&proxy, user, vm, None);
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        assert!(
            answer.contains(&format!(
                "User \\\"{user}\\\" cannot create resource \\\"virtualmachines/sshcertificate\\\" in API group \\\"ssh.kubevm.io\\\" in the namespace \\\"dev\\\" (the signer's own access review)"
            )),
            "{answer}"
        );
    }
    assert!(proxied_as(&proxy, "alice", "web", None).starts_with("HTTP/1.1 201"));
    // Issue 32 item 6: a 2048-bit RSA key from ssh-keygen is refused in one line (422).
    let rsa = env.dir.path().join("rsa2048");
    let out = std::process::Command::new("ssh-keygen")
        .args(["-q", "-N", "", "-t", "rsa", "-b", "2048", "-f"])
        .arg(&rsa)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let public = std::fs::read_to_string(rsa.with_extension("pub")).unwrap();
    let answer = proxied_with_key(&proxy, "alice", "web", None, public.trim());
    assert!(answer.starts_with("HTTP/1.1 422"), "{answer}");
    assert!(
        answer.contains("spec.publicKey: an RSA key of 2048 bits is too short: at least 3072 bits"),
        "{answer}"
    );
    // kubectl resolves the resource (the signer's discovery lists it) and asks the same.
    let can = env.kubectl(&[
        "auth",
        "can-i",
        "use",
        "logins.ssh.kubevm.io/ops",
        "-n",
        "dev",
        "--as",
        "alice",
    ]);
    assert!(
        !stderr(&can).contains("doesn't have a resource type"),
        "{}",
        stderr(&can)
    );
    // ops: listed by the VM, but alice may not use it.
    let answer = proxied_as(&proxy, "alice", "web", Some("ops"));
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains("login \\\"ops\\\" needs permission to use resource \\\"logins\\\" named \\\"ops\\\" in API group \\\"ssh.kubevm.io\\\" in the namespace \\\"dev\\\""),
        "{answer}"
    );
    // An admin grants it with a Role manifest (`kubectl create role --verb use` refuses every
    // resource but podsecuritypolicies: kubectl's create_role.go specialVerbs); the cached
    // denial expires within 10 s.
    let manifest = env.dir.path().join("ops-login.yaml");
    std::fs::write(&manifest, readme_logins_role()).unwrap();
    ok(env.kubectl(&["apply", "-f", manifest.to_str().unwrap()]));
    ok(env.kubectl(&[
        "create",
        "rolebinding",
        "alice-ops-login",
        "-n",
        "dev",
        "--role",
        "ops-login",
        "--user",
        "alice",
    ]));
    let rbac = "rbac.authorization.k8s.io";
    let start = Instant::now();
    let answer = loop {
        let answer = proxied_as(&proxy, "alice", "web", Some("ops"));
        if !answer.starts_with("HTTP/1.1 403") || start.elapsed() > Duration::from_secs(15) {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(answer.contains("ops@web.dev"), "{answer}");
    // Both are needed: a login the VM does not list is refused even with `use` on it.
    env.emulator.put_object(json!({
        "apiVersion": format!("{rbac}/v1"), "kind": "Role",
        "metadata": {"name": "ops-login", "namespace": "dev"},
        "rules": [{"apiGroups": ["ssh.kubevm.io"], "resources": ["logins"],
            "verbs": ["use"]}]}));
    let answer = proxied_as(&proxy, "alice", "web", Some("root"));
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains("login \\\"root\\\" is not allowed"),
        "{answer}"
    );
    // The signer's ServiceAccount may create the reviews (system:auth-delegator) and nothing
    // was issued to bob.
    assert!(
        !signer
            .audit()
            .iter()
            .any(|r| r["event"] == "issued" && r["user"] == "bob")
    );
}

/// Issue 32 item 10: the README's certificate grant, run as printed with the real kubectl
/// against the API server (discovery of ssh.kubevm.io/v1alpha1 is proxied to the signer),
/// certifies for web and nothing else; the connection needs the platform's portforward too
/// (issue 38: the README's whole one-VM grant is tested in rbac.rs).
#[test]
fn the_readme_grant_works_with_real_kubectl() {
    let env = Env::kubevirt();
    let _signer = start_signer(&env, &[]);
    create_vm(&env, "web", "dev");
    create_vm(&env, "db", "dev");
    let readme = include_str!("../../README.md");
    let commands: Vec<&str> = readme
        .lines()
        .map(str::trim)
        .filter(|l| {
            l.starts_with("kubectl create role web-ssh ")
                || l.starts_with("kubectl create rolebinding alice-web ")
        })
        .map(|l| l.split("  #").next().unwrap().trim())
        .collect();
    assert_eq!(commands.len(), 2, "{commands:?}");
    for command in commands {
        let words = shell_words(command);
        let out = env.kubectl(&words.iter().map(String::as_str).collect::<Vec<_>>()[1..]);
        assert_eq!(out.status.code(), Some(0), "{command}: {}", stderr(&out));
        assert!(stdout(&out).contains("created"), "{}", stdout(&out));
    }
    // The certificate of web, not the connection: that is the platform's portforward, which
    // these commands do not grant (the README says so and shows the whole grant, tested in
    // rbac.rs).
    ok(env
        .command(BIN)
        .args(ALICE)
        .args(["ssh-cert", "web.dev.vm"])
        .output()
        .unwrap());
    let cert = env
        .dir
        .path()
        .join(".kube/kubectl-vm/ssh/certs/kubevm@web.dev.vm-cert.pub");
    assert!(cert.exists(), "{}", cert.display());
    let err = one_line_255(&ssh_as(&env, ALICE, &["web.dev", "--", "true"]));
    assert!(
        err.contains("alice") && err.contains("virtualmachines/portforward"),
        "{err}"
    );
    let err = one_line_255(&ssh_as(&env, ALICE, &["db.dev", "--", "true"]));
    assert!(
        err.contains("cannot create resource \"virtualmachines/sshcertificate\""),
        "{err}"
    );
    // The parents kubectl resolved are in the signer's discovery; `kubectl api-resources`
    // leaves them out as it does every resource without verbs.
    let out = ok(env.kubectl(&["get", "--raw", "/apis/ssh.kubevm.io/v1alpha1"]));
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let names: Vec<_> = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "virtualmachines",
            "virtualmachines/sshcertificate",
            "virtualmachines/hostcertificate",
            "logins"
        ]
    );
    let out = ok(env.kubectl(&[
        "api-resources",
        "--api-group",
        "ssh.kubevm.io",
        "-o",
        "name",
    ]));
    assert_eq!(out, "", "{out}");
}

/// The README's logins Role, as printed (the yaml block naming `ops-login`).
fn readme_logins_role() -> String {
    let readme = include_str!("../../README.md");
    let block = readme
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("name: ops-login"))
        .expect("the README shows the logins Role");
    let role: String = block
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(role.contains("verbs: [use]"), "{role}");
    role
}

/// Whitespace-separated words (the README's commands have no quoting).
fn shell_words(command: &str) -> Vec<String> {
    assert!(!command.contains(['\'', '"', '\\']), "{command}");
    command.split_whitespace().map(str::to_owned).collect()
}

/// `signer serve --default-ttl 2m`: a request that names no lifetime (as `kubectl create
/// --raw` sends it) gets a certificate that ends two minutes from now, read back with
/// `ssh-keygen -L` and `date`; a zero or over-the-maximum `--default-ttl` and a malformed
/// `--ca-namespace` are refused (exit 2, one line) before the signer starts.
#[test]
fn default_ttl_is_the_lifetime_of_requests_that_name_none() {
    let env = Env::kubevirt();
    for (flags, message) in [
        (
            &["--default-ttl", "0s"][..],
            "Error: --default-ttl must be more than 0 and at most --max-ttl",
        ),
        (
            &["--default-ttl", "2h"],
            "Error: --default-ttl must be more than 0 and at most --max-ttl",
        ),
    ] {
        let mut args = vec![
            "signer",
            "serve",
            "--tls-cert-file",
            "x",
            "--tls-private-key-file",
            "y",
        ];
        args.extend_from_slice(flags);
        let out = env.vm(&args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert_eq!(stderr(&out).trim_end(), message);
    }
    let out = env.vm(&[
        "signer",
        "serve",
        "--tls-cert-file",
        "x",
        "--tls-private-key-file",
        "y",
        "--ca-namespace",
        "Bad_NS",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1);
    assert!(
        stderr(&out).starts_with("Error: --ca-namespace: "),
        "{}",
        stderr(&out)
    );

    let _signer = start_signer(&env, &["--default-ttl", "2m"]);
    create_vm(&env, "ttl", "default");
    let key = env.dir.path().join("id_ttl");
    let keygen = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "ttl", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(keygen.success());
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let request = json!({"apiVersion": "ssh.kubevm.io/v1alpha1", "kind": "SSHCertificateRequest",
        "spec": {"publicKey": public.trim_end()}});
    let request_file = env.dir.path().join("request.json");
    std::fs::write(&request_file, request.to_string()).unwrap();
    let answer = ok(env.kubectl(&[
        "create",
        "--raw",
        "/apis/ssh.kubevm.io/v1alpha1/namespaces/default/virtualmachines/ttl/sshcertificate",
        "-f",
        request_file.to_str().unwrap(),
    ]));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let certificate = answer["status"]["certificate"]
        .as_str()
        .or_else(|| answer["certificate"].as_str())
        .unwrap_or_else(|| panic!("no certificate in {answer}"));
    let cert_file = env.dir.path().join("id_ttl-cert.pub");
    std::fs::write(&cert_file, format!("{certificate}\n")).unwrap();
    let listing = std::process::Command::new("ssh-keygen")
        .args(["-L", "-f"])
        .arg(&cert_file)
        .env("TZ", "UTC")
        .output()
        .unwrap();
    let listing = String::from_utf8(listing.stdout).unwrap();
    let until = listing
        .lines()
        .find_map(|l| l.trim().strip_prefix("Valid: from "))
        .and_then(|l| l.split(" to ").nth(1))
        .unwrap_or_else(|| panic!("no validity in {listing}"));
    let date = std::process::Command::new("date")
        .args(["-u", "-d", until, "+%s"])
        .output()
        .unwrap();
    let until: i64 = String::from_utf8(date.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let left = until - now;
    assert!(
        (110..=121).contains(&left),
        "valid for {left} s more: {listing}"
    );
}
