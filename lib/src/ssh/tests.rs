//! The client against a real OpenSSH sshd (openssh-server, installed by
//! tests/tools/install-test-deps.sh), configured like `create`'s cloud-init drop-in:
//! `TrustedUserCAKeys` with the CA keys and `HostCertificate` with a CA-signed host key.
//! It logs in as the user running the tests (sshd run by a user can only log that user in;
//! run by root, root is allowed with keys only), so no account has to be created.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use russh::keys::ssh_key::HashAlg;
use tokio::net::TcpStream;

use super::cert::{self, CertRequest, UserIdentity};
use super::*;
use crate::ca::{CaBundle, HostKeys};

struct Sshd {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn current_user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Sshd {
    /// Start sshd with `host` as its host key and certificate (`None`: a plain key only).
    fn start(ca: &CaBundle, host: &HostKeys, with_cert: bool) -> Sshd {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let write = |name: &str, text: &str, mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            let p = d.join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let ca_keys = write(
            "trusted_user_ca_keys",
            &(ca.public_keys_openssh().unwrap().join("\n") + "\n"),
            0o644,
        );
        let key = write("ssh_host_ed25519_key", &host.private_key, 0o600);
        let cert = write("host-cert.pub", &host.certificate, 0o644);
        let port = free_port();
        let mut config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nTrustedUserCAKeys {}\n\
             AuthorizedKeysFile none\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nPermitRootLogin prohibit-password\n\
             PidFile {}/sshd.pid\nLogLevel VERBOSE\nStrictModes no\n",
            key.display(),
            ca_keys.display(),
            d.display()
        );
        if with_cert {
            config.push_str(&format!("HostCertificate {}\n", cert.display()));
        }
        let config_path = write("sshd_config", &config, 0o644);
        let _ = std::fs::create_dir_all("/run/sshd");
        let child = Command::new("/usr/sbin/sshd")
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("sshd.log")).unwrap())
            .spawn()
            .expect(
                "/usr/sbin/sshd (openssh-server) is installed by tests/tools/install-test-deps.sh",
            );
        let mut sshd = Sshd { child, port, dir };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return sshd;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = sshd.child.kill();
        let _ = sshd.child.wait();
        let d = sshd.dir.path();
        panic!(
            "sshd did not start: {}",
            std::fs::read_to_string(d.join("sshd.log")).unwrap_or_default()
        );
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sshd.log")).unwrap_or_default()
    }

    async fn stream(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        s.set_nodelay(true).unwrap();
        s
    }
}

fn verifier(ca: &CaBundle, known_hosts: &Path, strict: StrictHostKeyChecking) -> HostVerifier {
    HostVerifier {
        vm: "web".into(),
        namespace: "prod".into(),
        ca_keys: ca.public_keys(),
        known_hosts: known_hosts.to_path_buf(),
        strict,
        prompt: None,
        certificate_required: false,
        revoked: Default::default(),
    }
}

fn request(user: &str) -> CertRequest {
    CertRequest {
        principal: user.into(),
        key_id: cert::key_id("alice", "prod", "web"),
        ttl: cert::DEFAULT_TTL,
        pty: true,
        port_forwarding: true,
        interactive_all: false,
    }
}

struct Setup {
    ca: CaBundle,
    sshd: Sshd,
    user: String,
    known_hosts: PathBuf,
    _tmp: tempfile::TempDir,
}

fn setup(with_cert: bool) -> Setup {
    let ca = CaBundle::generate().unwrap();
    let host = HostKeys::issue(&ca, "web", "prod", Duration::from_secs(3600)).unwrap();
    let sshd = Sshd::start(&ca, &host, with_cert);
    let tmp = tempfile::tempdir().unwrap();
    Setup {
        ca,
        sshd,
        user: current_user(),
        known_hosts: tmp.path().join("known_hosts"),
        _tmp: tmp,
    }
}

impl Setup {
    /// A certificate from this setup's CA for the test user, with the default permissions.
    async fn user_identity(&self) -> Auth {
        identity(&self.ca, &request(&self.user)).await
    }

    /// Connects to this setup's sshd as the test user, trusting its CA and known_hosts.
    async fn connect(
        &self,
        strict: StrictHostKeyChecking,
        auth: &Auth,
    ) -> Result<Connection, SshError> {
        Connection::connect(
            self.sshd.stream().await,
            verifier(&self.ca, &self.known_hosts, strict),
            &self.user,
            auth,
        )
        .await
    }
}

async fn identity(ca: &CaBundle, req: &CertRequest) -> Auth {
    Auth::Certificate(Box::new(
        UserIdentity::issue(&CaSigner::new(ca.clone()), req)
            .await
            .unwrap(),
    ))
}

fn io(stdin: &'static [u8]) -> (SessionIo, tokio::io::DuplexStream, tokio::io::DuplexStream) {
    let (out_w, out_r) = tokio::io::duplex(1 << 20);
    let (err_w, err_r) = tokio::io::duplex(1 << 20);
    (
        SessionIo {
            stdin: Box::new(stdin),
            stdout: Box::new(out_w),
            stderr: Box::new(err_w),
            resize: None,
        },
        out_r,
        err_r,
    )
}

async fn read_all(mut r: tokio::io::DuplexStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut s = String::new();
    r.read_to_string(&mut s).await.unwrap();
    s
}

async fn exec(
    conn: &Connection,
    command: &str,
    stdin: &'static [u8],
) -> (ExitOutcome, String, String) {
    let (io, out, err) = io(stdin);
    let exit = conn
        .run(
            &SessionRequest {
                command: Some(command.into()),
                pty: None,
            },
            io,
        )
        .await
        .unwrap();
    (exit, read_all(out).await, read_all(err).await)
}

#[tokio::test]
async fn certificate_login_exec_and_streams() {
    let s = setup(true);
    let auth = s.user_identity().await;
    let conn = s
        .connect(StrictHostKeyChecking::Yes, &auth)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", s.sshd.log()));
    assert!(matches!(conn.trust, HostTrust::Certificate { .. }));
    let (exit, out, _) = exec(&conn, "id -un", b"").await;
    assert_eq!(
        (exit, out.trim()),
        (ExitOutcome::Status(0), s.user.as_str())
    );
    let (exit, _, _) = exec(&conn, "exit 7", b"").await;
    assert_eq!(exit.code(), 7);
    let (_, out, err) = exec(&conn, "cat; echo oops >&2", b"hi\n").await;
    assert_eq!((out.as_str(), err.as_str()), ("hi\n", "oops\n"));
    conn.close().await;
    // sshd's log names the person through the key ID.
    assert!(
        s.sshd.log().contains("ID kubectl-vm:alice:prod/web"),
        "{}",
        s.sshd.log()
    );
    assert!(
        !s.known_hosts.exists(),
        "a certificate-trusted host is not recorded"
    );
}

async fn refused(s: &Setup, auth: &Auth) -> SshError {
    s.connect(StrictHostKeyChecking::Yes, auth)
        .await
        .unwrap_err()
}

#[tokio::test]
async fn sshd_refuses_bad_certificates() {
    let s = setup(true);
    let key = cert::fresh_key().unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Expired.
    let expired = cert::sign_window(
        s.ca.signing_key(),
        key.public_key(),
        &request(&s.user),
        now - 600,
        now - 300,
    )
    .unwrap();
    let auth = Auth::Certificate(Box::new(UserIdentity {
        key: Arc::new(key.clone()),
        certificate: expired,
    }));
    assert!(matches!(refused(&s, &auth).await, SshError::AuthRefused(_)));
    // Another CA.
    let other = CaBundle::generate().unwrap();
    let auth = identity(&other, &request(&s.user)).await;
    assert!(matches!(refused(&s, &auth).await, SshError::AuthRefused(_)));
    // Wrong principal.
    let auth = identity(&s.ca, &request("nobody-else")).await;
    assert!(matches!(refused(&s, &auth).await, SshError::AuthRefused(_)));
    let log = s.sshd.log();
    assert!(log.contains("Certificate invalid: expired"), "{log}");
    assert!(
        log.contains("Certificate invalid: name is not a listed principal"),
        "{log}"
    );
    let other_fp = other
        .signing_key()
        .public_key()
        .fingerprint(HashAlg::Sha256)
        .to_string();
    assert!(log.contains(&other_fp), "{log}");
}

#[tokio::test]
async fn host_certificate_from_another_ca_refuses() {
    let s = setup(true);
    let other = CaBundle::generate().unwrap();
    let auth = s.user_identity().await;
    // The client trusts only `other`: the host's certificate is not from it.
    let err = Connection::connect(
        s.sshd.stream().await,
        verifier(&other, &s.known_hosts, StrictHostKeyChecking::AcceptNew),
        &s.user,
        &auth,
    )
    .await
    .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, SshError::Host(HostRejection::BadCertificate { .. })),
        "{text}"
    );
    assert!(text.contains("not the platform SSH CA"), "{text}");
    // For another VM name.
    let mut v = verifier(&s.ca, &s.known_hosts, StrictHostKeyChecking::AcceptNew);
    v.vm = "db".into();
    let err = Connection::connect(s.sshd.stream().await, v, &s.user, &auth)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not db.prod"), "{err}");
}

#[tokio::test]
async fn known_hosts_accept_new_then_changed_key() {
    let s = setup(false);
    let auth = s.user_identity().await;
    let conn = s
        .connect(StrictHostKeyChecking::AcceptNew, &auth)
        .await
        .unwrap();
    assert!(matches!(conn.trust, HostTrust::Recorded { .. }));
    let recorded = std::fs::read_to_string(&s.known_hosts).unwrap();
    assert!(
        recorded.starts_with("web.prod.vm ssh-ed25519 "),
        "{recorded}"
    );
    conn.close().await;
    // The same host again: known.
    let conn = s.connect(StrictHostKeyChecking::Yes, &auth).await.unwrap();
    assert_eq!(conn.trust, HostTrust::Known);
    // Another sshd (another host key) under the same name: refused with both fingerprints.
    let host2 = HostKeys::issue(&s.ca, "web", "prod", Duration::from_secs(3600)).unwrap();
    let sshd2 = Sshd::start(&s.ca, &host2, false);
    let err = Connection::connect(
        sshd2.stream().await,
        verifier(&s.ca, &s.known_hosts, StrictHostKeyChecking::AcceptNew),
        &s.user,
        &auth,
    )
    .await
    .unwrap_err();
    let fp = |k: &str| {
        russh::keys::PublicKey::from_openssh(k)
            .unwrap()
            .fingerprint(HashAlg::Sha256)
            .to_string()
    };
    let text = err.to_string();
    let recorded_key = recorded.split_once(' ').unwrap().1.trim();
    assert!(text.contains(&fp(recorded_key)), "{text}");
    assert!(text.contains(&fp(&host2.public_key)), "{text}");
    assert!(text.contains("CHANGED"), "{text}");
}

#[tokio::test]
async fn pty_shell_with_resize() {
    use tokio::io::AsyncWriteExt;
    let s = setup(true);
    let auth = s.user_identity().await;
    let conn = s.connect(StrictHostKeyChecking::Yes, &auth).await.unwrap();
    let (mut stdin_w, stdin_r) = tokio::io::duplex(4096);
    let (out_w, out_r) = tokio::io::duplex(1 << 20);
    let (resize_tx, resize_rx) = tokio::sync::mpsc::unbounded_channel();
    let io = SessionIo {
        stdin: Box::new(stdin_r),
        stdout: Box::new(out_w),
        stderr: Box::new(tokio::io::sink()),
        resize: Some(resize_rx),
    };
    let req = SessionRequest {
        command: None,
        pty: Some(PtyRequest {
            term: "xterm-256color".into(),
            cols: 80,
            rows: 24,
        }),
    };
    let run = tokio::spawn(async move { conn.run(&req, io).await });
    let mut out_r = out_r;
    let mut seen = String::new();
    stdin_w
        .write_all(b"echo T=$TERM; stty size\n")
        .await
        .unwrap();
    wait_for(&mut out_r, &mut seen, "24 80\r\n").await;
    resize_tx.send((100, 40)).unwrap();
    stdin_w
        // The window change reaches the guest's pty asynchronously: the guest polls for it
        // (bounded by the timeout below) instead of sleeping and hoping.
        .write_all(b"while [ \"$(stty size)\" != \"40 100\" ]; do sleep 0.05; done; stty size; tty; exit 3\n")
        .await
        .unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(exit, ExitOutcome::Status(3));
    let out = seen + &read_all(out_r).await;
    assert!(out.contains("T=xterm-256color"), "{out}");
    assert!(out.contains("24 80\r\n"), "{out}");
    assert!(out.contains("40 100\r\n"), "{out}");
    assert!(out.contains("/dev/pts/"), "{out}");
}

#[tokio::test]
async fn local_forward_through_the_guest() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = setup(true);
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_port = echo.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut c, _) = echo.accept().await.unwrap();
            tokio::spawn(async move {
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let auth = s.user_identity().await;
    let conn = s.connect(StrictHostKeyChecking::Yes, &auth).await.unwrap();
    let mut stream = conn
        .open_tcp("127.0.0.1", echo_port, "127.0.0.1:5555".parse().unwrap())
        .await
        .unwrap();
    stream.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    // Without permit-port-forwarding the guest refuses.
    let mut req = request(&s.user);
    req.port_forwarding = false;
    let auth = identity(&s.ca, &req).await;
    let conn = s.connect(StrictHostKeyChecking::Yes, &auth).await.unwrap();
    assert!(
        conn.open_tcp("127.0.0.1", echo_port, "127.0.0.1:5555".parse().unwrap())
            .await
            .is_err()
    );
}

async fn wait_for(r: &mut tokio::io::DuplexStream, seen: &mut String, what: &str) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 4096];
    while !seen.contains(what) {
        let n = tokio::time::timeout(Duration::from_secs(10), r.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {what:?} in {seen}"))
            .unwrap();
        assert!(n > 0, "no {what:?} in {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
}

/// A peer that accepts and never speaks SSH (before: the command hung for ever).
#[tokio::test(start_paused = true)]
async fn a_peer_that_never_speaks_times_out() {
    let ca = CaBundle::generate().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (ours, _silent) = tokio::io::duplex(1 << 16);
    let auth = identity(&ca, &request("u")).await;
    let started = tokio::time::Instant::now();
    let Err(err) = Connection::connect(
        ours,
        verifier(
            &ca,
            &tmp.path().join("known_hosts"),
            StrictHostKeyChecking::Yes,
        ),
        "u",
        &auth,
    )
    .await
    else {
        panic!("no connection without a peer");
    };
    assert!(
        err.to_string().contains("no SSH handshake within 30s"),
        "{err}"
    );
    assert_eq!(started.elapsed(), super::client::HANDSHAKE_TIMEOUT);
}
