//! Guests with a real OpenSSH sshd, configured by the VM's own cloud-init.
//!
//! A guest is a private mount namespace (`unshare --mount`) in which `/etc` and `/home` are
//! copy-on-write overlays of the host's: there the VM's actual `#cloud-config` is applied as
//! cloud-init would, in cloud-init's module order and unmodified: `bootcmd` (as root: the CA
//! keys file, the host certificate, the sshd drop-in, `useradd` of the platform user, sudoers,
//! the unlock loop), `users` (`useradd -m`, password locked), `ssh_keys` (host keys written,
//! all other host keys deleted), `runcmd`. Then Debian's sshd (`/usr/sbin/sshd -D`, the host's
//! stock `/etc/ssh/sshd_config` as the "image") runs in that namespace; the only change is
//! where it listens (`-o Port=… -o ListenAddress=127.0.0.1`). `/tmp` is a private tmpfs. So the accounts `create`
//! provisions exist inside the guest only, the host's `/etc` is never written, and
//! `systemctl` (no systemd in a guest here) is a no-op on the scripts' PATH, and the package
//! managers fail as they do without a mirror; `/var/log` is the guest's own tmpfs.
//!
//! This needs root (mount namespaces, overlayfs) and `/usr/sbin/sshd`; [`available`] tells.
//! Ports: 22 is sshd, 7 is an echo service over TCP and UDP (RFC 862); others refuse.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};

use base64::Engine;
use serde_json::Value;
use tokio::sync::{OnceCell, watch};

use crate::core::app::App;
use crate::core::guest::{DialFuture, Guest, GuestFactory, GuestSpec, LoginGuest, Serial};
use crate::core::store::Key;

/// The echo port (TCP and UDP).
pub const ECHO_PORT: u16 = 7;

/// Test switches: host key changes and paused VMs, by namespace and name.
#[derive(Default)]
pub struct Switches {
    rekeyed: Mutex<HashMap<(String, String), u32>>,
    paused: Mutex<HashSet<(String, String)>>,
}

fn key(ns: &str, name: &str) -> (String, String) {
    (ns.to_owned(), name.to_owned())
}

impl Switches {
    /// From the next boot on, the guest of this VM has a freshly generated host key and no
    /// host certificate (as if the VM had been reinstalled).
    pub fn change_host_key(&self, ns: &str, name: &str) {
        *self
            .rekeyed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key(ns, name))
            .or_default() += 1;
    }

    fn rekeyed(&self, ns: &str, name: &str) -> bool {
        self.rekeyed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&key(ns, name))
    }

    /// Pause or unpause a VM (the portforward subresource then answers 409).
    pub fn set_paused(&self, ns: &str, name: &str, paused: bool) {
        let mut set = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        if paused {
            set.insert(key(ns, name));
        } else {
            set.remove(&key(ns, name));
        }
    }

    /// Whether a VM was paused through [`Switches::set_paused`].
    pub fn paused(&self, ns: &str, name: &str) -> bool {
        self.paused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&key(ns, name))
    }
}

/// Whether sshd guests can run here: root, `unshare` and `/usr/sbin/sshd`.
pub fn available() -> bool {
    nix::unistd::geteuid().is_root()
        && std::path::Path::new("/usr/sbin/sshd").exists()
        && Command::new("unshare")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// The VM's cloud-init user data, wherever the VM keeps it: KubeVirt
/// `cloudInitNoCloud.userData|userDataBase64|secretRef` (Secret key `userdata` or `userData`),
/// Deckhouse `provisioning.userData|userDataRef` (Secret key `userData`).
pub fn user_data(app: &App, ns: &str, name: &str) -> Option<String> {
    let secret_text = |secret: &str| secret_key_text(app, ns, secret, &["userdata", "userData"]);
    if let Some(vm) = app
        .store
        .get(&Key::new("kubevirt.io", "virtualmachines", ns, name))
    {
        let volumes = vm.pointer("/spec/template/spec/volumes")?.as_array()?;
        for v in volumes {
            let Some(src) = v
                .get("cloudInitNoCloud")
                .or_else(|| v.get("cloudInitConfigDrive"))
            else {
                continue;
            };
            if let Some(t) = src.get("userData").and_then(Value::as_str) {
                return Some(t.to_owned());
            }
            if let Some(b) = src.get("userDataBase64").and_then(Value::as_str) {
                let bytes = base64::engine::general_purpose::STANDARD.decode(b).ok()?;
                return String::from_utf8(bytes).ok();
            }
            if let Some(s) = src.pointer("/secretRef/name").and_then(Value::as_str) {
                return secret_text(s);
            }
        }
        return None;
    }
    let vm = app.store.get(&Key::new(
        "virtualization.deckhouse.io",
        "virtualmachines",
        ns,
        name,
    ))?;
    let p = vm.pointer("/spec/provisioning")?;
    if let Some(t) = p.get("userData").and_then(Value::as_str) {
        return Some(t.to_owned());
    }
    p.pointer("/userDataRef/name")
        .and_then(Value::as_str)
        .and_then(secret_text)
}

/// The text of the first of `keys` Secret `ns/secret` holds (`stringData`, else `data`).
fn secret_key_text(app: &App, ns: &str, secret: &str, keys: &[&str]) -> Option<String> {
    let s = app.store.get(&Key::new("", "secrets", ns, secret))?;
    for k in keys {
        if let Some(t) = s
            .pointer(&format!("/stringData/{k}"))
            .and_then(Value::as_str)
        {
            return Some(t.to_owned());
        }
        if let Some(b) = s.pointer(&format!("/data/{k}")).and_then(Value::as_str) {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b).ok()?;
            return String::from_utf8(bytes).ok();
        }
    }
    None
}

/// The VM's cloud-init network data, as KubeVirt hands it to the guest: from the first
/// `cloudInitNoCloud` (or `cloudInitConfigDrive`) volume of the running VMI, else of the VM's
/// template, the `networkdata` (else `networkData`) key of the Secret its
/// `networkDataSecretRef` names, else its `networkData`, else its decoded `networkDataBase64`
/// (kubevirt pkg/cloud-init/cloud-init.go: `ReadCloudInitVolumeDataSource` takes the first
/// cloud-init volume, `resolveNoCloudSecrets` reads the Secret's keys in that order into
/// `NetworkData`, `readRawOrBase64Data` prefers the raw text to the base64 one). `None` without
/// any, and for Deckhouse VMs, whose `provisioning` carries user data only.
pub fn network_data(app: &App, ns: &str, name: &str) -> Option<String> {
    let vmi = app.store.get(&Key::new(
        "kubevirt.io",
        "virtualmachineinstances",
        ns,
        name,
    ));
    let volumes = match vmi {
        Some(vmi) => vmi.pointer("/spec/volumes").cloned(),
        None => app
            .store
            .get(&Key::new("kubevirt.io", "virtualmachines", ns, name))?
            .pointer("/spec/template/spec/volumes")
            .cloned(),
    }?;
    let src = volumes.as_array()?.iter().find_map(|v| {
        v.get("cloudInitNoCloud")
            .or_else(|| v.get("cloudInitConfigDrive"))
    })?;
    if let Some(secret) = src
        .pointer("/networkDataSecretRef/name")
        .and_then(Value::as_str)
        && let Some(text) = secret_key_text(app, ns, secret, &["networkdata", "networkData"])
            .filter(|t| !t.is_empty())
    {
        return Some(text);
    }
    if let Some(t) = src
        .get("networkData")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        return Some(t.to_owned());
    }
    let b = src.get("networkDataBase64").and_then(Value::as_str)?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b).ok()?;
    String::from_utf8(bytes).ok().filter(|t| !t.is_empty())
}

/// What of a `#cloud-config` the guest applies.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CloudConfig {
    /// `bootcmd` entries, as shell scripts.
    pub bootcmd: Vec<String>,
    /// `runcmd` entries, as shell scripts.
    pub runcmd: Vec<String>,
    /// Users to create (`default` is the image's user and skipped).
    pub users: Vec<CloudUser>,
    /// `ssh_keys.ed25519_private` / `ed25519_public`.
    pub ed25519: Option<(String, String)>,
}

/// One entry of `users`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CloudUser {
    /// Login name.
    pub name: String,
    /// Login shell.
    pub shell: Option<String>,
    /// GECOS.
    pub gecos: Option<String>,
    /// sudoers rule.
    pub sudo: Option<String>,
    /// `ssh_authorized_keys`.
    pub keys: Vec<String>,
}

fn command_entry(v: &yaml_serde::Value) -> Option<String> {
    match v {
        yaml_serde::Value::String(s) => Some(s.clone()),
        // The list form is an argv; quote each word for sh.
        yaml_serde::Value::Sequence(words) => Some(
            words
                .iter()
                .filter_map(|w| w.as_str())
                .map(|w| format!("'{}'", w.replace('\'', r"'\''")))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => None,
    }
}

impl CloudConfig {
    /// Parse a `#cloud-config`; `None` for anything else (scripts, MIME multipart).
    pub fn parse(text: &str) -> Option<CloudConfig> {
        if !text.trim_start().starts_with("#cloud-config") {
            return None;
        }
        let doc: yaml_serde::Value = yaml_serde::from_str(text).ok()?;
        let list = |k: &str| -> Vec<String> {
            doc.get(k)
                .and_then(|v| v.as_sequence())
                .map(|s| s.iter().filter_map(command_entry).collect())
                .unwrap_or_default()
        };
        let str_of =
            |v: &yaml_serde::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        let users = doc
            .get("users")
            .and_then(|v| v.as_sequence())
            .map(|s| {
                s.iter()
                    .filter_map(|u| {
                        let name = str_of(u, "name")?;
                        Some(CloudUser {
                            name,
                            shell: str_of(u, "shell"),
                            gecos: str_of(u, "gecos"),
                            sudo: str_of(u, "sudo"),
                            keys: u
                                .get("ssh_authorized_keys")
                                .and_then(|k| k.as_sequence())
                                .map(|k| {
                                    k.iter()
                                        .filter_map(|x| x.as_str().map(str::to_owned))
                                        .collect()
                                })
                                .unwrap_or_default(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let ed25519 = doc
            .get("ssh_keys")
            .and_then(|k| Some((str_of(k, "ed25519_private")?, str_of(k, "ed25519_public")?)));
        Some(CloudConfig {
            bootcmd: list("bootcmd"),
            runcmd: list("runcmd"),
            users,
            ed25519,
        })
    }
}

/// The script run as root inside the guest's mount namespace. `$G` is the guest directory.
const GUEST_SCRIPT: &str = r#"
set -e
# Its own UTS namespace: the host name is the VM's, as cloud-init sets it from the
# meta-data's local-hostname (a name longer than the kernel's 64 bytes keeps the machine's).
hostname -- "$GUEST_HOSTNAME" 2>/dev/null || true
mount -t tmpfs kubevm-guest "$G/overlay"
mkdir -p "$G/overlay/etc.u" "$G/overlay/etc.w" "$G/overlay/home.u" "$G/overlay/home.w"
mount -t overlay kubevm-guest -o "lowerdir=/etc,upperdir=$G/overlay/etc.u,workdir=$G/overlay/etc.w" /etc
mount -t overlay kubevm-guest -o "lowerdir=/home,upperdir=$G/overlay/home.u,workdir=$G/overlay/home.w" /home
# A fresh image: its stock sshd_config, no drop-ins or host keys of the machine running us.
rm -f /etc/ssh/sshd_config.d/*.conf /etc/ssh/ssh_host_*
# The guest's own logs.
mount -t tmpfs kubevm-guest-log /var/log
# Cloud images ship sudo, so /etc/sudoers.d exists.
mkdir -p /etc/sudoers.d
export PATH="$G/bin:$PATH"
# cloud-init, init stage: bootcmd, then users_groups, then ssh (host keys).
for f in "$G"/bootcmd.*; do [ -f "$f" ] && sh "$f"; done
set +e
. "$G/users.sh"
set -e
if [ -f "$G/host_key" ]; then
  cp "$G/host_key" /etc/ssh/ssh_host_ed25519_key
  cp "$G/host_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
  chmod 600 /etc/ssh/ssh_host_ed25519_key
else
  ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
fi
if [ -f "$G/rekeyed" ]; then
  # The test switch: a new host key, and the old certificate no longer matches it.
  rm -f /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub /etc/ssh/kubevm_ssh_host_ed25519_key-cert.pub
  ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key
  sed -i '/^HostCertificate/d' /etc/ssh/sshd_config.d/*.conf 2>/dev/null || true
fi
# final stage: runcmd.
for f in "$G"/runcmd.*; do [ -f "$f" ] && sh "$f"; done
mkdir -p /run/sshd
# The guest's own /tmp (this hides $G, which is no longer needed).
mount -t tmpfs kubevm-guest-tmp /tmp
chmod 1777 /tmp
exec /usr/sbin/sshd -D -e -o "Port=$SSHD_PORT" -o ListenAddress=127.0.0.1 -o PidFile=none
"#;

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// cloud-init's users_groups for one user: `useradd -m` unless it exists, password locked,
/// sudoers rule, authorized keys.
fn users_script(users: &[CloudUser]) -> String {
    let mut out = String::new();
    for u in users {
        let n = sh_quote(&u.name);
        let mut add = format!("useradd -m {n}");
        if let Some(s) = &u.shell {
            add.push_str(&format!(" -s {}", sh_quote(s)));
        }
        if let Some(g) = &u.gecos {
            add.push_str(&format!(" -c {}", sh_quote(g)));
        }
        out.push_str(&format!(
            "id -u {n} >/dev/null 2>&1 || {add}\npasswd -l {n} >/dev/null\n"
        ));
        if let Some(rule) = &u.sudo {
            out.push_str(&format!(
                "mkdir -p /etc/sudoers.d && echo {} >> /etc/sudoers.d/90-cloud-init-users\n",
                sh_quote(&format!("{} {rule}", u.name))
            ));
        }
        if !u.keys.is_empty() {
            let keys = u.keys.join("\n");
            out.push_str(&format!(
                "h=$(getent passwd {n} | cut -d: -f6); mkdir -p \"$h/.ssh\"; printf '%s\\n' {} > \"$h/.ssh/authorized_keys\"; chown -R {n} \"$h/.ssh\"; chmod 700 \"$h/.ssh\"; chmod 600 \"$h/.ssh/authorized_keys\"\n",
                sh_quote(&keys)
            ));
        }
    }
    out
}

/// A running sshd inside a guest namespace.
struct Sshd {
    child: Mutex<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        // sshd's listener is the exec'd script itself; its session children die with the
        // connection.
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Sshd {
    fn start(config: &CloudConfig, rekeyed: bool, hostname: &str) -> io::Result<Sshd> {
        let dir = tempfile::Builder::new().prefix("kubevm-guest-").tempdir()?;
        let g = dir.path();
        std::fs::create_dir_all(g.join("overlay"))?;
        std::fs::create_dir_all(g.join("bin"))?;
        use std::os::unix::fs::PermissionsExt;
        // No systemd here; and no package mirror: the package managers fail as apt-get does
        // offline (they must never touch the machine running us).
        let stubs = [
            ("systemctl", "exit 0"),
            (
                "apt-get",
                "echo 'E: Failed to fetch: no package mirror in this guest' >&2; exit 100",
            ),
            ("dnf", "exit 1"),
            ("yum", "exit 1"),
            ("zypper", "exit 1"),
            ("apk", "exit 1"),
        ];
        for (name, body) in stubs {
            let stub = g.join("bin").join(name);
            std::fs::write(&stub, format!("#!/bin/sh\n{body}\n"))?;
            std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755))?;
        }
        for (i, s) in config.bootcmd.iter().enumerate() {
            std::fs::write(g.join(format!("bootcmd.{i:03}")), s)?;
        }
        for (i, s) in config.runcmd.iter().enumerate() {
            std::fs::write(g.join(format!("runcmd.{i:03}")), s)?;
        }
        std::fs::write(g.join("users.sh"), users_script(&config.users))?;
        if let Some((private, public)) = &config.ed25519 {
            std::fs::write(g.join("host_key"), private)?;
            std::fs::write(g.join("host_key.pub"), public)?;
        }
        if rekeyed {
            std::fs::write(g.join("rekeyed"), "")?;
        }
        // The port is chosen before sshd binds it, so another process may take it first:
        // sshd then exits and the guest is started again on another port.
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port()?;
            let log_path = g.join("guest.log");
            let log = std::fs::File::create(&log_path)?;
            let child = Command::new("unshare")
                .args([
                    "--mount",
                    "--uts",
                    "--propagation",
                    "private",
                    "/bin/sh",
                    "-c",
                    GUEST_SCRIPT,
                ])
                .env("G", g)
                .env("SSHD_PORT", port.to_string())
                .env("GUEST_HOSTNAME", hostname)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?;
            let mut child = child;
            let ready = format!("Server listening on 127.0.0.1 port {port}.");
            for _ in 0..400 {
                if std::fs::read_to_string(&log_path).is_ok_and(|l| l.contains(&ready)) {
                    return Ok(Sshd {
                        child: Mutex::new(child),
                        port,
                        dir,
                    });
                }
                if let Ok(Some(status)) = child.try_wait() {
                    last = format!(
                        "the guest's sshd exited ({status}): {}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    );
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        Err(io::Error::other(if last.is_empty() {
            "the guest's sshd did not start listening".to_string()
        } else {
            last
        }))
    }
}

/// Access credentials (KubeVirt `accessCredentials` with `qemuGuestAgent`) written into the
/// guest now and again whenever they change, while its sshd runs (see [`crate::kubevirt::sshd_agent`]).
/// virt-launcher watches the Secrets; here the store is polled, every 200 ms.
fn watch_credentials(app: Weak<App>, spec: crate::core::guest::GuestSpec, sshd: &Arc<Sshd>) {
    let pid = sshd.child.lock().unwrap_or_else(|e| e.into_inner()).id();
    let mut synced: crate::kubevirt::sshd_agent::Synced = None;
    if let Some(app) = app.upgrade() {
        crate::kubevirt::sshd_agent::sync(&app, &spec, pid, &mut synced);
    }
    let sshd = Arc::downgrade(sshd);
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let (Some(sshd), Some(app)) = (sshd.upgrade(), app.upgrade()) else {
                return;
            };
            if !matches!(
                sshd.child
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .try_wait(),
                Ok(None)
            ) {
                return;
            }
            crate::kubevirt::sshd_agent::sync(&app, &spec, pid, &mut synced);
        }
    });
}

/// A guest with the login console of [`LoginGuest`] and, from the first dial on, an sshd
/// configured by the VM's cloud-init, plus the echo service.
pub struct SshdGuest {
    app: Weak<App>,
    login: LoginGuest,
    config: CloudConfig,
    rekeyed: bool,
    sshd: Arc<OnceCell<Arc<Sshd>>>,
    echo: Arc<OnceCell<(u16, u16)>>,
}

async fn echo_service() -> io::Result<(u16, u16)> {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    let ports = (tcp.local_addr()?.port(), udp.local_addr()?.port());
    tokio::spawn(async move {
        while let Ok((mut c, _)) = tcp.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        while let Ok((n, from)) = udp.recv_from(&mut buf).await {
            let _ = udp.send_to(&buf[..n], from).await;
        }
    });
    Ok(ports)
}

fn refused(port: u16, proto: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionRefused,
        format!("dial {proto} 10.0.2.2:{port}: connect: connection refused"),
    )
}

impl Guest for SshdGuest {
    fn spec(&self) -> &GuestSpec {
        self.login.spec()
    }

    fn sshd_log(&self) -> Option<String> {
        let sshd = self.sshd.get()?;
        std::fs::read_to_string(sshd.dir.path().join("guest.log")).ok()
    }

    fn serial(&self) -> Serial {
        self.login.serial()
    }

    fn dial(&self, port: u16) -> DialFuture {
        let sshd = self.sshd.clone();
        let echo = self.echo.clone();
        let config = self.config.clone();
        let rekeyed = self.rekeyed;
        let app = self.app.clone();
        let spec = self.login.spec().clone();
        Box::pin(async move {
            let local = match port {
                22 => {
                    let sshd = sshd
                        .get_or_try_init(|| async move {
                            tokio::task::spawn_blocking(move || {
                                let sshd = Arc::new(Sshd::start(&config, rekeyed, &spec.name)?);
                                // The agent's first round runs before the first login.
                                watch_credentials(app, spec, &sshd);
                                Ok::<_, io::Error>(sshd)
                            })
                            .await
                            .map_err(io::Error::other)?
                        })
                        .await?;
                    sshd.port
                }
                ECHO_PORT => echo.get_or_try_init(echo_service).await?.0,
                other => return Err(refused(other, "tcp")),
            };
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", local)).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as crate::core::guest::GuestConn)
        })
    }

    fn udp_addr(&self, port: u16) -> crate::core::guest::UdpFuture {
        let echo = self.echo.clone();
        Box::pin(async move {
            if port != ECHO_PORT {
                return Err(refused(port, "udp"));
            }
            let (_, udp) = *echo.get_or_try_init(echo_service).await?;
            Ok(SocketAddr::from(([127, 0, 0, 1], udp)))
        })
    }

    fn stop(&self) {
        self.login.stop();
        // Dropping the sshd kills it; the OnceCell is shared with running dials, so take the
        // process down now.
        if let Some(sshd) = self.sshd.get() {
            let _ = sshd.child.lock().unwrap_or_else(|e| e.into_inner()).kill();
        }
    }

    fn stopped(&self) -> watch::Receiver<bool> {
        self.login.stopped()
    }
}

/// Boots [`SshdGuest`]s from the VMs' cloud-init.
pub struct SshdGuests {
    app: Weak<App>,
}

impl SshdGuests {
    /// A factory reading VMs from `app`.
    pub fn new(app: Weak<App>) -> SshdGuests {
        SshdGuests { app }
    }
}

impl GuestFactory for SshdGuests {
    fn boot(&self, spec: &GuestSpec) -> io::Result<Arc<dyn Guest>> {
        let app = self
            .app
            .upgrade()
            .ok_or_else(|| io::Error::other("the emulator is shutting down"))?;
        let config = user_data(&app, &spec.namespace, &spec.name)
            .and_then(|t| CloudConfig::parse(&t))
            .unwrap_or_default();
        let rekeyed = app.ssh_switches.rekeyed(&spec.namespace, &spec.name);
        Ok(Arc::new(SshdGuest {
            app: self.app.clone(),
            login: LoginGuest::boot(spec)?,
            config,
            rekeyed,
            sshd: Arc::default(),
            echo: Arc::default(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cloud_config() {
        let text = "#cloud-config\nusers:\n- default\n- name: kubevm\n  shell: /bin/bash\n  sudo: ALL=(ALL) NOPASSWD:ALL\nssh_keys:\n  ed25519_private: |\n    KEY\n  ed25519_public: ssh-ed25519 AAAA\nbootcmd:\n- |\n  echo one\n- [sh, -c, \"echo it's\"]\nruncmd:\n- echo two\n";
        let c = CloudConfig::parse(text).unwrap();
        assert_eq!(c.users.len(), 1);
        assert_eq!(c.users[0].name, "kubevm");
        assert_eq!(c.bootcmd, ["echo one\n", r"'sh' '-c' 'echo it'\''s'"]);
        assert_eq!(c.runcmd, ["echo two"]);
        assert_eq!(c.ed25519, Some(("KEY\n".into(), "ssh-ed25519 AAAA".into())));
        assert!(CloudConfig::parse("#!/bin/sh\necho").is_none());
    }

    /// Network data comes from the Secret `networkDataSecretRef` names (key `networkdata`, else
    /// `networkData`), else inline or base64 on the volume; the VMI's volumes win over the VM's.
    #[test]
    fn network_data_is_read_where_kubevirt_reads_it() {
        use crate::ServeFlavor;
        use crate::core::registry::Registry;
        use serde_json::json;
        let app = App::new(
            Registry::new(ServeFlavor::KubeVirt),
            std::time::Duration::from_secs(1),
        );
        let vm = |name: &str, source: Value| {
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"template": {"spec": {"volumes": [
                    {"name": "rootdisk", "containerDisk": {"image": "x"}},
                    {"name": "cloudinitdisk", "cloudInitNoCloud": source}]}}}})
        };
        let secret = |name: &str, data: Value| {
            json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": "default"}, "data": data})
        };
        let b64 = |t: &str| base64::engine::general_purpose::STANDARD.encode(t);
        let put = |group: &str, plural: &str, o: Value| {
            app.store.create(group, plural, o).unwrap();
        };
        put(
            "",
            "secrets",
            secret(
                "s1",
                json!({"userdata": b64("#cloud-config\n"), "networkdata": b64("version: 2\n")}),
            ),
        );
        put(
            "",
            "secrets",
            secret("s2", json!({"networkData": b64("camel: 1\n")})),
        );
        put(
            "kubevirt.io",
            "virtualmachines",
            vm(
                "a",
                json!({"secretRef": {"name": "s1"}, "networkDataSecretRef": {"name": "s1"}}),
            ),
        );
        put(
            "kubevirt.io",
            "virtualmachines",
            vm(
                "b",
                json!({"userData": "#cloud-config\n", "networkDataSecretRef": {"name": "s2"}}),
            ),
        );
        put(
            "kubevirt.io",
            "virtualmachines",
            vm("c", json!({"networkData": "inline: 1\n"})),
        );
        put(
            "kubevirt.io",
            "virtualmachines",
            vm("d", json!({"networkDataBase64": b64("b64: 1\n")})),
        );
        put(
            "kubevirt.io",
            "virtualmachines",
            vm("e", json!({"userData": "#cloud-config\n"})),
        );
        let nd = |n: &str| network_data(&app, "default", n);
        assert_eq!(nd("a").as_deref(), Some("version: 2\n"));
        assert_eq!(
            user_data(&app, "default", "a").as_deref(),
            Some("#cloud-config\n")
        );
        assert_eq!(nd("b").as_deref(), Some("camel: 1\n"));
        assert_eq!(nd("c").as_deref(), Some("inline: 1\n"));
        assert_eq!(nd("d").as_deref(), Some("b64: 1\n"));
        assert_eq!(nd("e"), None);
        assert_eq!(nd("missing"), None);
        // A running VMI's own volumes are what virt-launcher reads.
        put(
            "kubevirt.io",
            "virtualmachineinstances",
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "e", "namespace": "default"},
                "spec": {"volumes": [{"name": "cloudinitdisk",
                    "cloudInitNoCloud": {"networkData": "from-vmi: 1\n"}}]}}),
        );
        assert_eq!(nd("e").as_deref(), Some("from-vmi: 1\n"));
    }
}
