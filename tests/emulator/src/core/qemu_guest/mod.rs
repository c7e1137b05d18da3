//! Real Linux guests: a qemu TCG process per running VM (tests/guest/FACTS-style image built by
//! `tests/guest/build-image.sh`).
//!
//! A VM that runs boots qemu (`-accel tcg,tb-size=256 -cpu max`, the image's kernel and busybox
//! initramfs) from its own qcow2 overlay of the base image, kept across restarts of the same
//! VM and removed when the VM is deleted or the emulator stops, with a NoCloud seed (iso9660
//! `cidata`, `cloud-localds`) holding the VM's cloud-init user data byte for byte
//! ([`crate::core::sshd_guest::user_data`]: inline, base64 or the Secret) and meta-data with the VM
//! uid as `instance-id` (stable across restarts, so per-instance modules run once, as on
//! KubeVirt) and the VM's hostname as `local-hostname`.
//!
//! - Serial console: qemu's serial socket (`logfile=` keeps everything, for failure reports).
//! - Ports: user-mode networking; [`Guest::dial`] adds a `hostfwd` on the QMP socket the first
//!   time a port is dialled, so the guest sees a real TCP connection from 10.0.2.2. With
//!   [`QemuConfig::restrict_network`] the guest reaches neither the host nor the internet
//!   (`-netdev user,restrict=on`: no package mirror), forwards still work.
//! - Guest agent: the channel KubeVirt gives every VM (`org.qemu.guest_agent.0` on a
//!   virtio-serial port); the emulator speaks QGA JSON (`guest-sync`, `guest-get-osinfo`,
//!   `guest-get-users`, `guest-get-fsinfo`, `guest-ping`) and reports `AgentConnected` (VMI) /
//!   `AgentReady` (Deckhouse VM), `status.guestOSInfo` and the users and filesystems the
//!   guest-agent subresources serve from the real agent.
//! - Stop: ACPI power button (`system_powerdown` on QMP), then SIGKILL once the platform's
//!   grace period has passed (KubeVirt: the VMI's `spec.terminationGracePeriodSeconds`;
//!   Deckhouse: the VM's; see `lifecycle/guest_exit.rs`); the VM's stop completes only once
//!   qemu has exited ([`crate::core::guest::Guests::power_off`]).
//! - From inside: a guest `reboot` resets the machine in the same qemu (the same VMI, as under
//!   libvirt's default `on_reboot=restart`); a `poweroff` ends qemu with status 0, which the
//!   platform sees as a guest shutdown (VMI `Succeeded`, then the run strategy decides).
//! - Disk: the overlay's virtual size is the VM's boot disk size ([`disk`]); the directory of
//!   an emulator that died is removed by the next one ([`stale`]).
//!
//! Every qemu is started by one long-lived thread with `PR_SET_PDEATHSIG=SIGKILL`, so none
//! outlives the process that started it, and is killed when the emulator shuts down.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

mod agent;
pub(crate) mod credentials;
pub mod disk;
pub mod hotplug;
mod machine;
mod memory;
mod nics;
mod process;
mod running;
mod sizing;
mod snapshot;
pub mod stale;

pub use agent::{AgentInfo, report_agent};
use agent::{SharedAgent, freeze_during, watch_agent};
use process::{Proc, qmp, spawn_tied, tied_command};

use crate::core::app::App;
use crate::core::guest::{DialFuture, Guest, GuestConn, GuestFactory, GuestSpec, Serial};
use crate::core::store::Key;
use crate::core::util::meta_str;

const KV: &str = "kubevirt.io";
const DH: &str = "virtualization.deckhouse.io";
/// The user-mode network's id on the qemu command line (for `hostfwd_add`).
const NETDEV: &str = "n0";

/// Where the image is and how guests run.
#[derive(Debug, Clone)]
pub struct QemuConfig {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// Firmware directory (`-L`).
    pub firmware: PathBuf,
    /// `qemu-img` (for the overlays).
    pub qemu_img: PathBuf,
    /// The guest kernel.
    pub kernel: PathBuf,
    /// The initramfs that loads the virtio modules and switches to `/dev/vda`.
    pub initrd: PathBuf,
    /// The raw ext4 base image.
    pub base_image: PathBuf,
    /// `cloud-localds`.
    pub cloud_localds: PathBuf,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// Virtual CPUs.
    pub cpus: u32,
    /// `-netdev user,restrict=on`: no route to the host or the internet (the default for
    /// guests whose VM has no per-VM setting, see [`QemuGuests::set_restricted`]).
    pub restrict_network: bool,
    /// At most this many qemu processes at once (booting more fails until one exits).
    pub max_guests: usize,
    /// How long a guest may take to power off after the ACPI button before it is killed, when
    /// the platform names no grace period (the VMI's or VM's `terminationGracePeriodSeconds`).
    pub stop_timeout: Duration,
}

impl QemuConfig {
    /// The image directory: `$KUBEVM_GUEST_DIR`, else `<repo>/.cache/guest`.
    pub fn default_dir() -> PathBuf {
        match std::env::var_os("KUBEVM_GUEST_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/guest"),
        }
    }

    /// Reads `DIR/env` (`KEY=VALUE` lines written by `tests/guest/build-image.sh`: `QEMU`,
    /// `QEMU_FW`, `KERNEL`, `INITRD`, `BASE_IMAGE`, `CLOUD_LOCALDS`, optionally `QEMU_IMG`).
    pub fn from_dir(dir: &Path) -> io::Result<QemuConfig> {
        let env_path = dir.join("env");
        let text = std::fs::read_to_string(&env_path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "{}: {e} (build the guest image: tests/guest/build-image.sh)",
                    env_path.display()
                ),
            )
        })?;
        let mut vars = HashMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some((k, v)) = line.split_once('=') {
                let v = v.trim().trim_matches('"').trim_matches('\'');
                vars.insert(k.trim().to_owned(), PathBuf::from(v));
            }
        }
        let get = |k: &str| -> io::Result<PathBuf> {
            let p = vars.get(k).cloned().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{}: no {k}", env_path.display()),
                )
            })?;
            if !p.exists() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{}: {k}={} does not exist", env_path.display(), p.display()),
                ));
            }
            Ok(p)
        };
        let qemu = get("QEMU")?;
        let qemu_img = match vars.get("QEMU_IMG") {
            Some(p) => p.clone(),
            None => {
                let sibling = qemu.with_file_name("qemu-img");
                if sibling.exists() {
                    sibling
                } else {
                    PathBuf::from("qemu-img")
                }
            }
        };
        Ok(QemuConfig {
            firmware: get("QEMU_FW")?,
            kernel: get("KERNEL")?,
            initrd: get("INITRD")?,
            base_image: get("BASE_IMAGE")?,
            cloud_localds: get("CLOUD_LOCALDS")?,
            qemu,
            qemu_img,
            memory_mib: 1024,
            cpus: 1,
            restrict_network: false,
            max_guests: 2,
            stop_timeout: Duration::from_secs(60),
        })
    }
}

// ---- the guest ---------------------------------------------------------------------------

/// A running qemu guest.
pub struct QemuGuest {
    spec: GuestSpec,
    serial: Serial,
    proc_: Arc<Proc>,
    forwards: Arc<tokio::sync::Mutex<HashMap<u16, u16>>>,
    /// The grace period of a stop that does not name one.
    stop_timeout: Duration,
}

fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Guest for QemuGuest {
    fn spec(&self) -> &GuestSpec {
        &self.spec
    }

    fn serial(&self) -> Serial {
        self.serial.clone()
    }

    fn dial(&self, port: u16) -> DialFuture {
        let forwards = self.forwards.clone();
        let proc_ = self.proc_.clone();
        Box::pin(async move {
            if !proc_.running() {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("dial tcp :{port}: the guest is not running"),
                ));
            }
            let mut fwd = forwards.lock().await;
            let host_port = match fwd.get(&port) {
                Some(p) => *p,
                None => {
                    // The port is chosen before slirp binds it; another process may take it
                    // first, so a few tries.
                    let qmp_path = proc_.qmp.clone();
                    let host_port = tokio::task::spawn_blocking(move || {
                        let mut last = io::Error::other("no free port");
                        for _ in 0..5 {
                            let hp = free_port()?;
                            let cmd = format!("hostfwd_add {NETDEV} tcp:127.0.0.1:{hp}-:{port}");
                            match qmp(
                                &qmp_path,
                                &json!({"execute": "human-monitor-command",
                                        "arguments": {"command-line": cmd}}),
                            ) {
                                Ok(v)
                                    if v["return"]
                                        .as_str()
                                        .is_some_and(|s| s.trim().is_empty()) =>
                                {
                                    return Ok(hp);
                                }
                                Ok(v) => {
                                    last = io::Error::other(format!("hostfwd_add: {}", v["return"]))
                                }
                                Err(e) => last = e,
                            }
                        }
                        Err(last)
                    })
                    .await
                    .map_err(io::Error::other)??;
                    fwd.insert(port, host_port);
                    host_port
                }
            };
            drop(fwd);
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", host_port)).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream) as GuestConn)
        })
    }

    fn stop(&self) {
        self.proc_.power_off(self.stop_timeout);
    }

    fn stop_within(&self, grace: Duration) {
        self.proc_.power_off(grace);
    }

    fn exit(&self) -> Option<crate::core::guest::GuestExit> {
        self.proc_.guest_exit()
    }

    fn kill(&self) {
        self.proc_.kill();
    }

    fn reset(&self) -> io::Result<()> {
        // What virt-handler's reset does through libvirt (virDomainReset = QMP system_reset).
        qmp(&self.proc_.qmp, &json!({"execute": "system_reset"})).map(|_| ())
    }

    fn graceful(&self) -> bool {
        true
    }

    fn start_memory_dump(&self) -> Option<io::Result<()>> {
        Some(memory::start(&self.proc_.qmp))
    }

    fn finish_memory_dump(&self) -> io::Result<Option<std::fs::File>> {
        memory::finish(&self.proc_.qmp)
    }

    fn stopped(&self) -> watch::Receiver<bool> {
        self.proc_.exited.clone()
    }
}

impl Drop for QemuGuest {
    fn drop(&mut self) {
        // Dropped without a stop (a failure somewhere): no qemu left behind. A guest being
        // powered off is left to its power-off thread.
        if !self.proc_.stop_requested.load(Ordering::SeqCst) {
            self.proc_.kill();
        }
    }
}

/// Connects the serial socket to [`Serial`] channels.
fn bridge_serial(path: &Path, exited: watch::Receiver<bool>) -> io::Result<Serial> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let stream = loop {
        match UnixStream::connect(path) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline || *exited.borrow() => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let mut reader = stream.try_clone()?;
    let mut writer = stream;
    let (output, _) = broadcast::channel::<Bytes>(1024);
    let (input, mut input_rx) = mpsc::unbounded_channel::<Bytes>();
    let out = output.clone();
    let consoles = crate::core::guest::ConsoleTaps::default();
    let attached = consoles.clone();
    let transcript = Arc::new(crate::kubevirt::console_log::Transcript::default());
    let record = transcript.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            record.write(&buf[..n]);
            let bytes = Bytes::copy_from_slice(&buf[..n]);
            let _ = out.send(bytes.clone());
            attached.deliver(&bytes);
        }
    });
    std::thread::spawn(move || {
        while let Some(bytes) = input_rx.blocking_recv() {
            if writer.write_all(&bytes).is_err() {
                break;
            }
        }
    });
    Ok(Serial {
        input,
        output,
        consoles,
        transcript,
    })
}

// ---- the factory -------------------------------------------------------------------------

/// A VM's disk: its directory (seed, sockets, serial log, and the overlay of a VM without a
/// boot claim), for one VM uid, and the overlay it boots from.
struct Disk {
    uid: String,
    dir: PathBuf,
    overlay: PathBuf,
}

/// Boots [`QemuGuest`]s for the VMs of one emulator.
pub struct QemuGuests {
    app: Weak<App>,
    config: QemuConfig,
    root: tempfile::TempDir,
    disks: Mutex<HashMap<(String, String), Disk>>,
    procs: Mutex<Vec<Arc<Proc>>>,
    restricted: Mutex<HashMap<(String, String), bool>>,
    /// Per qemu pid: the hotplugged disks it was last brought to hold.
    hotplugged: Mutex<HashMap<i32, Vec<hotplug::HotDisk>>>,
    /// The boot claims' overlays and the snapshots' copies ([`snapshot`]).
    claims: Mutex<snapshot::ClaimDisks>,
    /// Per qemu pid: its agent connection.
    agents: Mutex<HashMap<i32, SharedAgent>>,
    /// Per qemu pid: the machine it booted as and what was last hot-plugged into it
    /// ([`sizing`]).
    sized: Mutex<HashMap<i32, (sizing::Sizing, sizing::Wanted)>>,
    /// Per qemu pid: the network cards it was last brought to hold ([`nics`]).
    nics_plugged: Mutex<HashMap<i32, Vec<nics::Nic>>>,
}

fn key(ns: &str, name: &str) -> (String, String) {
    (ns.to_owned(), name.to_owned())
}

impl QemuGuests {
    /// A factory reading VMs from `app`; disks live in a fresh temporary directory, owned by
    /// this process. The directories of emulators that died without removing theirs go first.
    pub fn new(app: Weak<App>, config: QemuConfig) -> io::Result<QemuGuests> {
        let removed = stale::remove_stale(&std::env::temp_dir());
        if removed > 0 {
            eprintln!("kubevm-emulator: removed {removed} disk directories of dead emulators");
        }
        let root = tempfile::Builder::new().prefix(stale::PREFIX).tempdir()?;
        stale::claim(root.path())?;
        let claims = snapshot::ClaimDisks::new(root.path());
        Ok(QemuGuests {
            claims: Mutex::new(claims),
            agents: Mutex::default(),
            sized: Mutex::default(),
            nics_plugged: Mutex::default(),
            app,
            config,
            root,
            disks: Mutex::default(),
            procs: Mutex::default(),
            restricted: Mutex::default(),
            hotplugged: Mutex::default(),
        })
    }

    /// The configuration guests boot with.
    pub fn config(&self) -> &QemuConfig {
        &self.config
    }

    /// From its next boot on, VM `ns/name` gets a restricted network (`true`) or full
    /// user-mode networking (`false`), whatever [`QemuConfig::restrict_network`] says.
    pub fn set_restricted(&self, ns: &str, name: &str, restricted: bool) {
        self.restricted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(ns, name), restricted);
    }

    /// The process ids of the qemu processes that run now.
    pub fn pids(&self) -> Vec<i32> {
        self.live().iter().map(|p| p.pid).collect()
    }

    fn live(&self) -> Vec<Arc<Proc>> {
        let mut procs = self.procs.lock().unwrap_or_else(|e| e.into_inner());
        procs.retain(|p| p.running());
        procs.clone()
    }

    /// The last `max` bytes of VM `ns/name`'s serial output (every boot, appended).
    pub fn serial_log_tail(&self, ns: &str, name: &str, max: usize) -> String {
        let disks = self.disks.lock().unwrap_or_else(|e| e.into_inner());
        let Some(disk) = disks.get(&key(ns, name)) else {
            return String::new();
        };
        let bytes = std::fs::read(disk.dir.join("serial.log")).unwrap_or_default();
        let start = bytes.len().saturating_sub(max);
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }

    /// Kills every qemu now.
    pub fn kill_all(&self) {
        for p in self.procs.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            p.kill();
        }
    }

    /// The VM's uid and hostname (KubeVirt `spec.template.spec.hostname`, else its name).
    fn vm_identity(app: &App, ns: &str, name: &str) -> Option<(String, String)> {
        if let Some(vm) = app.store.get(&Key::new(KV, "virtualmachines", ns, name)) {
            let host = vm
                .pointer("/spec/template/spec/hostname")
                .and_then(Value::as_str)
                .unwrap_or(name)
                .to_owned();
            return Some((meta_str(&vm, "uid").to_owned(), host));
        }
        let vm = app.store.get(&Key::new(DH, "virtualmachines", ns, name))?;
        Some((meta_str(&vm, "uid").to_owned(), name.to_owned()))
    }

    /// The VM's directory and the overlay it boots from: its boot claim's (made on first use,
    /// see [`snapshot`]), else one of the VM's own.
    fn prepare_disk(
        &self,
        app: &App,
        ns: &str,
        name: &str,
        uid: &str,
    ) -> io::Result<(PathBuf, PathBuf)> {
        let mut disks = self.disks.lock().unwrap_or_else(|e| e.into_inner());
        let k = key(ns, name);
        if let Some(d) = disks.get(&k)
            && d.uid != uid
        {
            let _ = std::fs::remove_dir_all(&d.dir);
            disks.remove(&k);
        }
        let short = uid.get(..8).unwrap_or(uid);
        let dir = self.root.path().join(format!("{ns}--{name}--{short}"));
        std::fs::create_dir_all(&dir)?;
        let overlay = match disk::boot_claim(app, ns, name) {
            Some((_, claim_uid)) => {
                let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
                match claims.overlay(ns, &claim_uid) {
                    Some(p) => p.to_owned(),
                    None => claims
                        .new_overlay(ns, &claim_uid, |p| self.create_overlay(app, ns, name, p))?,
                }
            }
            None => {
                let p = dir.join("overlay.qcow2");
                if !p.exists() {
                    self.create_overlay(app, ns, name, &p)?;
                    snapshot::owner_only(&p)?;
                }
                p
            }
        };
        disks.insert(
            k,
            Disk {
                uid: uid.to_owned(),
                dir: dir.clone(),
                overlay: overlay.clone(),
            },
        );
        Ok((dir, overlay))
    }

    /// A new qcow2 overlay of the base image at `path`, as large as VM `ns/name`'s boot disk.
    fn create_overlay(&self, app: &App, ns: &str, name: &str, path: &Path) -> io::Result<()> {
        // The guest sees a disk of the VM's disk size (the raw base image's size is its
        // file's length).
        let base = std::fs::metadata(&self.config.base_image)?.len();
        let size = disk::overlay_size(disk::vm_disk_size(app, ns, name), base);
        let out = Command::new(&self.config.qemu_img)
            .args(["create", "-q", "-f", "qcow2", "-b"])
            .arg(&self.config.base_image)
            .args(["-F", "raw"])
            .arg(path)
            .arg(size.to_string())
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "qemu-img create: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Keeps a point-in-time copy of claim `ns/pvc`'s overlay under snapshot data `id` (see
    /// [`snapshot`]); false when the claim is no guest's boot disk.
    fn capture(&self, app: &App, ns: &str, pvc: &str, id: &str) -> io::Result<bool> {
        let Some(obj) = app
            .store
            .get(&Key::new("", "persistentvolumeclaims", ns, pvc))
        else {
            return Ok(false);
        };
        let claim_uid = meta_str(&obj, "uid");
        let overlay = {
            let claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
            match claims.overlay(ns, claim_uid) {
                Some(p) => p.to_owned(),
                None => return Ok(false),
            }
        };
        let user = self
            .disks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(_, d)| d.overlay == overlay)
            .map(|(k, _)| k.clone());
        let running = user.and_then(|k| self.live().into_iter().find(|p| p.key == k));
        let agent = running.as_ref().and_then(|p| {
            self.agents
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&p.pid)
                .cloned()
        });
        let mut claims = self.claims.lock().unwrap_or_else(|e| e.into_inner());
        claims.new_copy(id, |target| match (&running, &agent) {
            (Some(p), agent) => {
                let start = || snapshot::Job::start(&p.qmp, &snapshot::backup_command(target));
                // Frozen until qemu has accepted the job: the copy is the disk at that point.
                let job = match agent {
                    Some(agent) => freeze_during(agent, start)?.0,
                    None => start()?,
                };
                job.wait(snapshot::BACKUP_TIMEOUT)
            }
            _ => std::fs::copy(&overlay, target).map(|_| ()),
        })?;
        Ok(true)
    }

    /// Removes the disks of VMs that are gone (deleted, or recreated with a new uid), the
    /// overlays of deleted claims and the copies of deleted snapshots.
    fn forget_gone(&self, app: &App) {
        let live = self.live();
        self.agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|pid, _| live.iter().any(|p| p.pid == *pid));
        let mut disks = self.disks.lock().unwrap_or_else(|e| e.into_inner());
        disks.retain(|(ns, name), d| {
            let current = Self::vm_identity(app, ns, name).map(|(uid, _)| uid);
            let busy = live.iter().any(|p| p.key == (ns.clone(), name.clone()));
            let keep = busy || current.as_deref() == Some(d.uid.as_str());
            if !keep {
                let _ = std::fs::remove_dir_all(&d.dir);
            }
            keep
        });
        let busy: Vec<PathBuf> = disks
            .iter()
            .filter(|(k, _)| live.iter().any(|p| &p.key == *k))
            .map(|(_, d)| d.overlay.clone())
            .collect();
        drop(disks);
        let claim_exists = |ns: &str, uid: &str| {
            let (pvcs, _) = app.store.list("", "persistentvolumeclaims", Some(ns));
            pvcs.iter().any(|p| meta_str(p, "uid") == uid)
        };
        let live_ids = crate::kubevirt::vm_snapshot::live_data_ids(app);
        self.claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(claim_exists, &busy, &live_ids);
    }

    fn boot_guest(&self, app: &App, spec: &GuestSpec) -> io::Result<QemuGuest> {
        let (ns, name) = (spec.namespace.as_str(), spec.name.as_str());
        let live = self.live();
        if live.iter().any(|p| p.key == key(ns, name)) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("the previous boot of {ns}/{name} is still shutting down"),
            ));
        }
        if live.len() >= self.config.max_guests {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{} qemu guests run already (at most {})",
                    live.len(),
                    self.config.max_guests
                ),
            ));
        }
        let (uid, hostname) = Self::vm_identity(app, ns, name)
            .ok_or_else(|| io::Error::other(format!("VM {ns}/{name} not found")))?;
        let (dir, overlay) = self.prepare_disk(app, ns, name, &uid)?;
        let c = &self.config;
        let sizing = self.sizing(app, ns, name);
        let cards = Self::nics(app, ns, name);
        let mut cmd = tied_command(&c.qemu);
        cmd.arg("-L")
            .arg(&c.firmware)
            // TCG's `max` CPU reports AMD family 15, whose topology Linux reads without
            // threads (no TopologyExtensions); with Intel's vendor string the guest reads the
            // sockets × cores × threads of `-smp` from CPUID leaf 0xB, as on a real host.
            .args([
                "-accel",
                "tcg,tb-size=256",
                "-cpu",
                "max,vendor=GenuineIntel",
            ])
            .args(sizing.args())
            .args(Self::machine(app, ns, name))
            .args([
                "-nographic",
                "-nodefaults",
                "-monitor",
                "none",
                "-display",
                "none",
            ])
            .arg("-kernel")
            .arg(&c.kernel)
            .arg("-initrd")
            .arg(&c.initrd)
            // mitigations=off: under TCG the CPU-vulnerability mitigations only cost time (page
            // table isolation switches CR3 on every syscall, and TCG flushes its soft TLB each
            // time): boot to systemd's "Startup finished" took 42 s instead of 58 s (two guests
            // side by side on the 2-core machine; tests/guest/README.md).
            .args([
                "-append",
                "console=ttyS0 root=/dev/vda rw panic=-1 mitigations=off",
            ])
            .arg("-drive")
            .arg(format!(
                "file={},if=virtio,format=qcow2,id={}",
                overlay.display(),
                snapshot::BOOT_DRIVE
            ))
            // The SCSI controller hotplugged disks go on (virt-launcher's domain has one).
            .args(["-device", "virtio-scsi-pci,id=scsi0"]);
        // KubeVirt builds the cloud-init disk afresh for every start from the VM's volume.
        let seed = dir.join("seed.iso");
        let _ = std::fs::remove_file(&seed);
        if let Some(user_data) = crate::core::sshd_guest::user_data(app, ns, name) {
            std::fs::write(dir.join("user-data"), user_data.as_bytes())?;
            std::fs::write(
                dir.join("meta-data"),
                format!("instance-id: {uid}\nlocal-hostname: {hostname}\n"),
            )?;
            let mut localds = Command::new(&c.cloud_localds);
            // The volume's network data becomes the seed's `network-config` (KubeVirt writes it
            // beside user-data and meta-data: pkg/cloud-init/cloud-init.go
            // `GenerateLocalData`); cloud-localds takes it with `--network-config FILE`.
            let network_config = dir.join("network-config");
            let _ = std::fs::remove_file(&network_config);
            if let Some(network_data) = crate::core::sshd_guest::network_data(app, ns, name) {
                std::fs::write(&network_config, network_data.as_bytes())?;
                localds.arg("--network-config").arg(&network_config);
            }
            let out = localds
                .arg(&seed)
                .arg(dir.join("user-data"))
                .arg(dir.join("meta-data"))
                .output()?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "cloud-localds: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            cmd.arg("-drive").arg(format!(
                "file={},if=virtio,format=raw,readonly=on",
                seed.display()
            ));
        }
        let restricted = self
            .restricted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key(ns, name))
            .copied()
            .unwrap_or(c.restrict_network);
        let serial_sock = dir.join("serial.sock");
        let qmp_sock = dir.join("qmp.sock");
        let qga_sock = dir.join("qga.sock");
        for s in [&serial_sock, &qmp_sock, &qga_sock] {
            let _ = std::fs::remove_file(s);
        }
        cmd.arg("-netdev")
            .arg(format!(
                "user,id={NETDEV}{}",
                if restricted { ",restrict=on" } else { "" }
            ))
            .args(nics::args(&cards, NETDEV))
            .args(["-device", "virtio-rng-pci"])
            .arg("-chardev")
            .arg(format!(
                "socket,id=ser0,path={},server=on,wait=off,logfile={},logappend=on",
                serial_sock.display(),
                dir.join("serial.log").display()
            ))
            .args(["-serial", "chardev:ser0"])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp_sock.display()))
            .args(["-device", "virtio-serial"])
            .arg("-chardev")
            .arg(format!(
                "socket,id=qga0,path={},server=on,wait=off",
                qga_sock.display()
            ))
            .args([
                "-device",
                "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0",
            ]);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("qemu.log"))?;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut child = spawn_tied(cmd)?;
        let pid = child.id() as i32;
        let (exited_tx, exited) = watch::channel(false);
        let status = Arc::new(Mutex::new(None));
        let status2 = status.clone();
        std::thread::spawn(move || {
            let s = child.wait().ok();
            *status2.lock().unwrap_or_else(|e| e.into_inner()) = s;
            let _ = exited_tx.send(true);
        });
        let proc_ = Arc::new(Proc {
            key: key(ns, name),
            pid,
            exited: exited.clone(),
            stop_requested: AtomicBool::new(false),
            qmp: qmp_sock,
            status,
        });
        self.procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(proc_.clone());
        let booted = sizing::Wanted {
            sockets: sizing.topology.as_ref().map(|t| t.sockets),
            memory_mib: Some(sizing.memory_mib),
        };
        self.sized
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, (sizing, booted));
        self.nics_plugged
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, cards);
        let serial = match bridge_serial(&serial_sock, exited.clone()) {
            Ok(s) => s,
            Err(e) => {
                proc_.kill();
                let qemu_log = std::fs::read_to_string(dir.join("qemu.log")).unwrap_or_default();
                return Err(io::Error::other(format!(
                    "qemu did not start ({e}): {}",
                    qemu_log.trim()
                )));
            }
        };
        let (weak, spec2, proc2) = (self.app.clone(), spec.clone(), proc_.clone());
        let agent = SharedAgent::default();
        self.agents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, agent.clone());
        std::thread::spawn(move || watch_agent(weak, spec2, qga_sock, proc2, agent));
        Ok(QemuGuest {
            spec: spec.clone(),
            serial,
            proc_,
            forwards: Arc::default(),
            stop_timeout: c.stop_timeout,
        })
    }
}

impl GuestFactory for QemuGuests {
    fn boot(&self, spec: &GuestSpec) -> io::Result<Arc<dyn Guest>> {
        let app = self
            .app
            .upgrade()
            .ok_or_else(|| io::Error::other("the emulator is shutting down"))?;
        Ok(Arc::new(self.boot_guest(&app, spec)?))
    }

    fn eager(&self) -> bool {
        true
    }

    fn real_agent(&self) -> bool {
        true
    }

    fn housekeeping(&self, app: &App) {
        self.forget_gone(app);
        self.sync_hotplug(app);
        self.sync_sizes(app);
        self.sync_nics(app);
    }

    fn capture_claim(&self, app: &App, ns: &str, pvc: &str, id: &str) -> io::Result<bool> {
        self.capture(app, ns, pvc, id)
    }

    fn restore_claim(&self, app: &App, ns: &str, pvc: &str, id: &str) -> io::Result<bool> {
        let Some(obj) = app
            .store
            .get(&Key::new("", "persistentvolumeclaims", ns, pvc))
        else {
            return Ok(false);
        };
        self.claims
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .restore(id, ns, meta_str(&obj, "uid"))
    }
}

impl Drop for QemuGuests {
    fn drop(&mut self) {
        self.kill_all();
        // The disks go with `root`; wait briefly so qemu has closed them.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self
            .procs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|p| p.running())
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_image_env_file() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for f in [
            "qemu-system-x86_64",
            "vmlinuz",
            "initrd.gz",
            "base.img",
            "cloud-localds",
        ] {
            std::fs::write(d.join(f), "").unwrap();
        }
        std::fs::create_dir(d.join("fw")).unwrap();
        let p = |f: &str| d.join(f).display().to_string();
        std::fs::write(
            d.join("env"),
            format!(
                "# written by build-image.sh\nQEMU={}\nQEMU_FW={}\nKERNEL=\"{}\"\nINITRD={}\nBASE_IMAGE={}\nCLOUD_LOCALDS={}\n",
                p("qemu-system-x86_64"),
                p("fw"),
                p("vmlinuz"),
                p("initrd.gz"),
                p("base.img"),
                p("cloud-localds")
            ),
        )
        .unwrap();
        let c = QemuConfig::from_dir(d).unwrap();
        assert_eq!(c.kernel, d.join("vmlinuz"));
        assert_eq!(c.firmware, d.join("fw"));
        // No qemu-img next to qemu: the one on PATH.
        assert_eq!(c.qemu_img, PathBuf::from("qemu-img"));
        assert_eq!((c.max_guests, c.restrict_network), (2, false));
        // A path that is gone is named.
        std::fs::remove_file(d.join("base.img")).unwrap();
        let e = QemuConfig::from_dir(d).unwrap_err().to_string();
        assert!(
            e.contains("BASE_IMAGE=") && e.contains("does not exist"),
            "{e}"
        );
        // No image at all points at the builder.
        let e = QemuConfig::from_dir(&d.join("nothing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tests/guest/build-image.sh"), "{e}");
    }
}
