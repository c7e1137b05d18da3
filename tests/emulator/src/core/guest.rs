//! The guests of running VMs: what sits behind a VM's serial console and TCP ports.
//!
//! One seam, [`Guest`] (serial console, TCP port dial, lifecycle), booted by a [`GuestFactory`].
//! The default factory boots a [`LoginGuest`]: a real process on a pseudo-terminal that behaves
//! like a small Linux login (`web login:`, `Password:` without echo, a shell after login, echo
//! by the terminal's line discipline). Another factory can put a real sshd behind the ports or
//! a real qemu guest behind the console.
//!
//! [`Guests`] keeps one guest per running VM: booted on first use (a console connection or a
//! port dial), alive across reconnects, stopped when the VM stops and replaced when the VM
//! restarts (a new VMI on KubeVirt, a new start time on Deckhouse), which is what a reboot looks
//! like from outside.

use std::collections::HashMap;
use std::future::Future;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{broadcast, mpsc, watch};

use crate::core::app::App;
use crate::core::store::Key;
use crate::core::util::meta_str;

/// A byte connection to a guest port.
pub trait GuestIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> GuestIo for T {}

/// A connection to a guest TCP port.
pub type GuestConn = Box<dyn GuestIo>;
/// What [`Guest::dial`] returns.
pub type DialFuture = Pin<Box<dyn Future<Output = io::Result<GuestConn>> + Send>>;
/// What [`Guest::udp_addr`] returns.
pub type UdpFuture = Pin<Box<dyn Future<Output = io::Result<std::net::SocketAddr>> + Send>>;

/// Which VM a guest runs for, and which boot of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestSpec {
    /// VM namespace.
    pub namespace: String,
    /// VM name, also the guest's hostname.
    pub name: String,
    /// Identity of this boot: a new value means the VM restarted.
    pub boot_id: String,
}

/// The serial port of a guest: bytes in, bytes out.
#[derive(Debug, Clone)]
pub struct Serial {
    /// Bytes typed into the serial port.
    pub input: mpsc::UnboundedSender<Bytes>,
    /// Bytes the guest writes to the serial port, for observers inside the emulator (boot
    /// scripts, tests): a lagging observer misses bytes. Console connections use `consoles`.
    pub output: broadcast::Sender<Bytes>,
    /// The console connections attached to the port: they get every byte, and hold the guest
    /// back while they do not read.
    pub consoles: ConsoleTaps,
    /// Everything written to `output` since boot, as lines (libvirt's serial log file, which
    /// KubeVirt's `guest-console-log` container shows: [`crate::kubevirt::console_log`]).
    pub transcript: Arc<crate::kubevirt::console_log::Transcript>,
}

/// How many chunks (of up to 4 KiB) an attached console may have queued before the guest's
/// writes wait for it.
const CONSOLE_QUEUE: usize = 16;

/// The console connections attached to a guest's serial port. A serial line has nowhere to drop
/// bytes: KubeVirt's virt-handler copies between the websocket and the launcher's serial socket
/// with blocking copies (pkg/virt-handler/rest/console.go, `io.Copy` both ways), so a client
/// that does not read stops the copy, QEMU's socket chardev stops taking bytes and the guest's
/// UART writes wait. Output while no console is attached is lost, as on the real port.
#[derive(Debug, Clone, Default)]
pub struct ConsoleTaps(Arc<std::sync::Mutex<Vec<mpsc::Sender<Bytes>>>>);

impl ConsoleTaps {
    /// Attaches a console: it receives every byte written from now on until it drops the receiver.
    pub fn attach(&self) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(CONSOLE_QUEUE);
        self.0.lock().unwrap().push(tx);
        rx
    }

    /// Hands `bytes` to every attached console, waiting while one has a full queue. Called from
    /// the thread that reads the guest's port, never from the async runtime.
    pub fn deliver(&self, bytes: &Bytes) {
        let taps: Vec<_> = self.0.lock().unwrap().clone();
        let mut detached = false;
        for tap in &taps {
            detached |= tap.blocking_send(bytes.clone()).is_err();
        }
        if detached {
            self.0.lock().unwrap().retain(|tap| !tap.is_closed());
        }
    }
}

/// A running guest.
pub trait Guest: Send + Sync {
    /// The spec it booted with.
    fn spec(&self) -> &GuestSpec;
    /// Its first serial console.
    fn serial(&self) -> Serial;
    /// Opens a TCP connection to `port` inside the guest.
    fn dial(&self, port: u16) -> DialFuture;
    /// The local address that stands for UDP `port` inside the guest (datagrams sent there
    /// reach the guest's service). Refused unless a guest has UDP services.
    fn udp_addr(&self, port: u16) -> UdpFuture {
        Box::pin(async move {
            Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("dial udp :{port}: connect: connection refused"),
            ))
        })
    }
    /// Powers the guest off (idempotent).
    fn stop(&self);
    /// Powers the guest off, ending it at once if it has not stopped after `grace` (the
    /// platform's termination grace period); by default the same as [`Guest::stop`].
    fn stop_within(&self, grace: std::time::Duration) {
        let _ = grace;
        self.stop();
    }
    /// How the guest ended by itself (a power-off or a crash from inside), once it has; `None`
    /// while it runs or when it ended because it was told to.
    fn exit(&self) -> Option<GuestExit> {
        None
    }
    /// Resets the machine like its reset button (KubeVirt's VMI `reset`, libvirt
    /// `virDomainReset`): the guest OS starts over at once, without ACPI or the agent. Guests
    /// that cannot be reset say so.
    fn reset(&self) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this emulator guest has no reset (only qemu guests do)",
        ))
    }
    /// Ends the guest at once (emulator shutdown); by default the same as [`Guest::stop`].
    fn kill(&self) {
        self.stop();
    }
    /// Whether [`Guest::stop`] only begins a power-off that ends later (a real OS shutting
    /// down): the VM's stop then completes once [`Guest::stopped`] says so.
    fn graceful(&self) -> bool {
        false
    }
    /// Becomes `true` when the guest has stopped, for whatever reason.
    fn stopped(&self) -> watch::Receiver<bool>;
    /// The guest's sshd log so far (its `-e` output: accepted and refused logins with the
    /// certificate's key ID and serial), for guests that run a real sshd.
    fn sshd_log(&self) -> Option<String> {
        None
    }
}

/// How a guest ended by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestExit {
    /// The guest OS powered the machine off (`poweroff`, shutdown from inside).
    PoweredOff,
    /// The machine ended otherwise (qemu failed or was killed by someone else).
    Crashed,
}

/// Boots guests.
pub trait GuestFactory: Send + Sync {
    /// Boots a guest for `spec`.
    fn boot(&self, spec: &GuestSpec) -> io::Result<Arc<dyn Guest>>;
    /// Whether guests boot as soon as their VM runs (a real boot takes a while), rather than
    /// on first use.
    fn eager(&self) -> bool {
        false
    }
    /// Whether the guests report their agent themselves (`AgentConnected`/`AgentReady` and
    /// `guestOSInfo` then come from them instead of the fixed values of the controllers).
    fn real_agent(&self) -> bool {
        false
    }
    /// Called about once a second while an eager factory is in use (e.g. to remove the
    /// disks of deleted VMs).
    fn housekeeping(&self, _app: &App) {}
    /// Keeps, under volume snapshot data `id`, a point-in-time copy of what claim `ns/pvc`
    /// holds when it is a guest's disk that the factory keeps itself; false when it is not.
    fn capture_claim(&self, _app: &App, _ns: &str, _pvc: &str, _id: &str) -> io::Result<bool> {
        Ok(false)
    }
    /// Gives (new) claim `ns/pvc` the guest disk kept under `id` by
    /// [`GuestFactory::capture_claim`]; false when none was kept.
    fn restore_claim(&self, _app: &App, _ns: &str, _pvc: &str, _id: &str) -> io::Result<bool> {
        Ok(false)
    }
}

/// The login every [`LoginGuest`] accepts (the Deckhouse user guide's example user).
pub const LOGIN_USER: &str = "cloud";
/// Its password.
pub const LOGIN_PASSWORD: &str = "cloud";

/// A getty-like loop: prompt, password without echo, then an interactive shell; back to the
/// prompt when the shell exits. `$1` is the hostname.
const LOGIN_SCRIPT: &str = r#"
host="$1"
# In its own UTS namespace (see uts_namespace) the guest's host name is the VM's, as cloud-init
# sets it on a real guest, so `uname -n` and `hostname` answer with it.
[ -n "$OWN_UTS" ] && hostname -- "$host" 2>/dev/null
printf '\n%s\n\n' "Emulated Linux guest (kubevm-emulator) ttyS0"
while :; do
  printf '%s login: ' "$host"
  IFS= read -r user || exit 0
  [ -z "$user" ] && continue
  stty -echo
  printf 'Password: '
  IFS= read -r pass
  stty echo
  printf '\n'
  if [ "$user" = "$LOGIN_USER" ] && [ "$pass" = "$LOGIN_PASSWORD" ]; then
    printf 'Welcome to %s\n' "$host"
    env PS1="$user@$host:~\$ " HOSTNAME="$host" ENV= /bin/sh -i
    printf '\n'
  else
    sleep 1
    printf 'Login incorrect\n\n'
  fi
done
"#;

/// How login guests get a UTS namespace of their own, so that their host name can be the VM's
/// without touching the machine's: `unshare --uts` as root; otherwise in a user namespace of
/// their own as its root (`--user --map-root-user`), where the kernel allows that. `None` when
/// neither works: `uname -n` in a login guest then names the machine.
fn uts_namespace() -> Option<&'static [&'static str]> {
    static HOW: std::sync::OnceLock<Option<&'static [&'static str]>> = std::sync::OnceLock::new();
    const AS_ROOT: &[&str] = &["--uts"];
    const UNPRIVILEGED: &[&str] = &["--user", "--map-root-user", "--uts"];
    *HOW.get_or_init(|| {
        let candidates = if nix::unistd::geteuid().is_root() {
            [AS_ROOT, UNPRIVILEGED]
        } else {
            [UNPRIVILEGED, UNPRIVILEGED]
        };
        candidates.into_iter().find(|args| {
            Command::new("unshare")
                .args(*args)
                .args(["hostname", "--", "kubevm-probe"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
    })
}

/// The default guest: [`LOGIN_SCRIPT`] on a pseudo-terminal, in its own session with the
/// terminal as controlling terminal (`setsid --ctty`), so Ctrl+C reaches the foreground job.
/// No TCP ports are open (dial is refused).
pub struct LoginGuest {
    spec: GuestSpec,
    serial: Serial,
    pid: i32,
    stopped: watch::Receiver<bool>,
}

impl LoginGuest {
    /// Starts the login process.
    pub fn boot(spec: &GuestSpec) -> io::Result<LoginGuest> {
        let pty = nix::pty::openpty(None, None).map_err(io::Error::from)?;
        let slave = std::fs::File::from(pty.slave);
        let mut command = Command::new("setsid");
        command.arg("--ctty");
        let own_uts = uts_namespace();
        if let Some(args) = own_uts {
            command.arg("unshare").args(args);
        }
        let mut child = command
            .args(["/bin/sh", "-c", LOGIN_SCRIPT, "guest-login"])
            .arg(&spec.name)
            .env_clear()
            .env("OWN_UTS", if own_uts.is_some() { "1" } else { "" })
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("TERM", "vt100")
            .env("HOME", std::env::temp_dir())
            .env("LOGIN_USER", LOGIN_USER)
            .env("LOGIN_PASSWORD", LOGIN_PASSWORD)
            .stdin(Stdio::from(slave.try_clone()?))
            .stdout(Stdio::from(slave.try_clone()?))
            .stderr(Stdio::from(slave))
            .spawn()?;
        let pid = child.id() as i32;
        let mut reader = std::fs::File::from(pty.master);
        let mut writer = reader.try_clone()?;
        let (output, _) = broadcast::channel::<Bytes>(256);
        let (input, mut input_rx) = mpsc::unbounded_channel::<Bytes>();
        let (stopped_tx, stopped) = watch::channel(false);
        let out = output.clone();
        let consoles = ConsoleTaps::default();
        let attached = consoles.clone();
        let transcript = Arc::new(crate::kubevirt::console_log::Transcript::default());
        let record = transcript.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with EIO once every process holding the terminal has exited.
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
        std::thread::spawn(move || {
            let _ = child.wait();
            let _ = stopped_tx.send(true);
        });
        Ok(LoginGuest {
            spec: spec.clone(),
            serial: Serial {
                input,
                output,
                consoles,
                transcript,
            },
            pid,
            stopped,
        })
    }
}

impl Guest for LoginGuest {
    fn spec(&self) -> &GuestSpec {
        &self.spec
    }

    fn serial(&self) -> Serial {
        self.serial.clone()
    }

    fn dial(&self, port: u16) -> DialFuture {
        Box::pin(async move {
            Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("dial tcp :{port}: connect: connection refused"),
            ))
        })
    }

    fn stop(&self) {
        // The whole session: the login loop, the shell and whatever it started.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    fn stopped(&self) -> watch::Receiver<bool> {
        self.stopped.clone()
    }
}

impl Drop for LoginGuest {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The default factory: [`LoginGuest`]s.
pub struct LoginGuests;

impl GuestFactory for LoginGuests {
    fn boot(&self, spec: &GuestSpec) -> io::Result<Arc<dyn Guest>> {
        Ok(Arc::new(LoginGuest::boot(spec)?))
    }
}

/// A VM's namespace and name.
type VmKey = (String, String);

/// The guests of one emulator, by VM namespace and name.
pub struct Guests {
    factory: Mutex<Arc<dyn GuestFactory>>,
    running: Mutex<HashMap<(String, String), Arc<dyn Guest>>>,
    /// Graceful guests told to stop that may not have stopped yet.
    stopping: Mutex<Vec<(VmKey, Arc<dyn Guest>)>>,
    /// The last boot failure of each VM (reported once).
    boot_errors: Mutex<HashMap<VmKey, String>>,
    /// The serial transcripts of recent boots, by boot id (newest last): a launcher pod's
    /// `guest-console-log` container outlives its guest until the pod is deleted.
    transcripts:
        Mutex<std::collections::VecDeque<(String, Arc<crate::kubevirt::console_log::Transcript>)>>,
}

/// How many boots' transcripts [`Guests`] keeps.
const KEPT_TRANSCRIPTS: usize = 64;

impl Default for Guests {
    fn default() -> Self {
        Guests {
            factory: Mutex::new(Arc::new(LoginGuests)),
            running: Mutex::new(HashMap::new()),
            stopping: Mutex::new(Vec::new()),
            boot_errors: Mutex::new(HashMap::new()),
            transcripts: Mutex::new(std::collections::VecDeque::new()),
        }
    }
}

impl Guests {
    /// Replaces the factory used for guests booted from now on.
    pub fn set_factory(&self, factory: Arc<dyn GuestFactory>) {
        *self.factory.lock().unwrap_or_else(|e| e.into_inner()) = factory;
    }

    fn factory(&self) -> Arc<dyn GuestFactory> {
        self.factory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// See [`GuestFactory::capture_claim`].
    pub fn capture_claim(&self, app: &App, ns: &str, pvc: &str, id: &str) -> io::Result<bool> {
        self.factory().capture_claim(app, ns, pvc, id)
    }

    /// See [`GuestFactory::restore_claim`].
    pub fn restore_claim(&self, app: &App, ns: &str, pvc: &str, id: &str) -> io::Result<bool> {
        self.factory().restore_claim(app, ns, pvc, id)
    }

    /// Whether guests report their agent themselves (see [`GuestFactory::real_agent`]).
    pub fn real_agent(&self) -> bool {
        self.factory().real_agent()
    }

    /// Tells a guest to stop (within `grace` when the platform's grace period is known); a
    /// graceful one is remembered until it has stopped.
    fn retire(
        &self,
        key: (String, String),
        guest: Arc<dyn Guest>,
        grace: Option<std::time::Duration>,
    ) {
        match grace {
            Some(g) => guest.stop_within(g),
            None => guest.stop(),
        }
        if guest.graceful() && !*guest.stopped().borrow() {
            let mut stopping = self.stopping.lock().unwrap_or_else(|e| e.into_inner());
            stopping.retain(|(_, g)| !*g.stopped().borrow());
            stopping.push((key, guest));
        }
    }

    /// Powers off the guest of VM `namespace/name` (if one runs, killing it once `grace` has
    /// passed; `force`: at once, as a forced stop or an ended grace period does) and tells
    /// whether a guest of that VM is still shutting down: the platform's stop is not complete
    /// until it is not.
    pub fn power_off(
        &self,
        namespace: &str,
        name: &str,
        force: bool,
        grace: std::time::Duration,
    ) -> bool {
        let key = (namespace.to_owned(), name.to_owned());
        let guest = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        if let Some(guest) = guest {
            self.retire(key.clone(), guest, Some(grace));
        }
        let mut stopping = self.stopping.lock().unwrap_or_else(|e| e.into_inner());
        stopping.retain(|(_, g)| !*g.stopped().borrow());
        if force {
            for (_, g) in stopping.iter().filter(|(k, _)| *k == key) {
                g.kill();
            }
        }
        stopping.iter().any(|(k, _)| *k == key)
    }

    /// Boots the guests of running VMs that have none (eager factories only); a boot that
    /// fails (e.g. too many guests) is tried again next time.
    pub fn boot_missing(&self, app: &App) {
        let factory = self.factory();
        if !factory.eager() {
            return;
        }
        factory.housekeeping(app);
        let mut vms = vec![];
        for (group, plural) in [
            ("kubevirt.io", "virtualmachineinstances"),
            ("virtualization.deckhouse.io", "virtualmachines"),
        ] {
            if app.registry.find_plural(group, plural).is_some() {
                let (items, _) = app.store.list(group, plural, None);
                // Fixture objects (settled) are pictures of a cluster: nobody started them, so
                // their guests boot only on use.
                vms.extend(items.iter().filter(|o| !app.is_settled(o)).map(|o| {
                    (
                        meta_str(o, "namespace").to_owned(),
                        meta_str(o, "name").to_owned(),
                    )
                }));
            }
        }
        for (ns, name) in vms {
            let error = match self.get_or_boot(app, &ns, &name) {
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => Some(e.to_string()),
                _ => None,
            };
            // Each failure once, not every second.
            let mut errors = self.boot_errors.lock().unwrap_or_else(|e| e.into_inner());
            let key = (ns, name);
            if let Some(e) = &error
                && errors.get(&key) != Some(e)
            {
                eprintln!("kubevm-emulator: guest {}/{}: {e}", key.0, key.1);
            }
            match error {
                Some(e) => errors.insert(key, e),
                None => errors.remove(&key),
            };
        }
    }

    /// The guest of a running VM, booting it if needed. `None` when the VM is not running.
    pub fn get_or_boot(
        &self,
        app: &App,
        namespace: &str,
        name: &str,
    ) -> io::Result<Option<Arc<dyn Guest>>> {
        let Some(boot_id) = boot_id(app, namespace, name) else {
            return Ok(None);
        };
        let key = (namespace.to_owned(), name.to_owned());
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(guest) = running.get(&key)
            && guest.spec().boot_id == boot_id
        {
            if !*guest.stopped().borrow() {
                return Ok(Some(guest.clone()));
            }
            // The guest ended by itself: the platform sees that (the VMI ends), it is not
            // booted again here.
            if let Some(exit) = guest.exit() {
                let spec = guest.spec().clone();
                running.remove(&key);
                drop(running);
                crate::core::lifecycle::guest_exited(app, &spec, exit);
                return Ok(None);
            }
        }
        if let Some(old) = running.remove(&key) {
            self.retire(key.clone(), old, None);
        }
        let spec = GuestSpec {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            boot_id,
        };
        let guest = self.factory().boot(&spec)?;
        let mut transcripts = self.transcripts.lock().unwrap_or_else(|e| e.into_inner());
        transcripts.retain(|(id, _)| *id != spec.boot_id);
        transcripts.push_back((spec.boot_id.clone(), guest.serial().transcript));
        while transcripts.len() > KEPT_TRANSCRIPTS {
            transcripts.pop_front();
        }
        drop(transcripts);
        running.insert(key, guest.clone());
        Ok(Some(guest))
    }

    /// The serial transcript of boot `boot_id` (a KubeVirt VMI uid), if that boot happened.
    pub fn transcript(
        &self,
        boot_id: &str,
    ) -> Option<Arc<crate::kubevirt::console_log::Transcript>> {
        self.transcripts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(id, _)| id == boot_id)
            .map(|(_, t)| t.clone())
    }

    /// Stops guests whose VM stopped or restarted (within the VM's grace period), and tells
    /// the platform about guests that ended by themselves.
    pub fn sync(&self, app: &App) {
        let mut gone = vec![];
        let mut exited = vec![];
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(ns, name), guest| {
                if *guest.stopped().borrow()
                    && let Some(exit) = guest.exit()
                {
                    exited.push((guest.spec().clone(), exit));
                    return false;
                }
                let keep = boot_id(app, ns, name).as_deref() == Some(guest.spec().boot_id.as_str());
                if !keep {
                    gone.push(((ns.clone(), name.clone()), guest.clone()));
                }
                keep
            });
        for (spec, exit) in exited {
            crate::core::lifecycle::guest_exited(app, &spec, exit);
        }
        for (key, guest) in gone {
            let grace = crate::core::lifecycle::grace_period(app, &key.0, &key.1);
            self.retire(key, guest, grace);
        }
    }

    /// Resets the running guest of one VM: `Ok(false)` when none has booted yet (guests that
    /// boot on first use: nothing has run that a reset could change).
    pub fn reset_one(&self, namespace: &str, name: &str) -> io::Result<bool> {
        let key = (namespace.to_owned(), name.to_owned());
        let guest = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        match guest {
            Some(guest) => guest.reset().map(|()| true),
            None => Ok(false),
        }
    }

    /// Stops the guest of one VM (it boots again on next use if the VM still runs).
    pub fn stop_one(&self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(guest) = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
        {
            self.retire(key, guest, None);
        }
    }

    /// Ends every guest at once (emulator shutdown).
    pub fn stop_all(&self) {
        for (_, guest) in self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
        {
            guest.kill();
        }
        for (_, guest) in self
            .stopping
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            guest.kill();
        }
    }
}

/// The boot identity of a VM that runs now, `None` if it does not. KubeVirt: the uid of a
/// VMI in phase Running (a restart makes a new VMI). Deckhouse: the VM uid and its
/// `status.stats.lastStartTime`, in phase Running or Migrating.
pub fn boot_id(app: &App, namespace: &str, name: &str) -> Option<String> {
    let vmi = Key::new("kubevirt.io", "virtualmachineinstances", namespace, name);
    if app
        .registry
        .find_plural("kubevirt.io", "virtualmachineinstances")
        .is_some()
        && let Some(vmi) = app.store.get(&vmi)
    {
        let phase = vmi.pointer("/status/phase").and_then(Value::as_str);
        // A VMI being shut down (lifecycle's `stopping` annotation) no longer runs its guest.
        let stopping = vmi
            .pointer("/metadata/annotations/emulator.kubevm.io~1stopping")
            .is_some();
        return (phase == Some("Running") && !stopping).then(|| meta_str(&vmi, "uid").to_owned());
    }
    let dh = "virtualization.deckhouse.io";
    if app.registry.find_plural(dh, "virtualmachines").is_some()
        && let Some(vm) = app
            .store
            .get(&Key::new(dh, "virtualmachines", namespace, name))
    {
        let phase = vm.pointer("/status/phase").and_then(Value::as_str);
        if matches!(phase, Some("Running") | Some("Migrating")) {
            let start = vm
                .pointer("/status/stats/lastStartTime")
                .and_then(Value::as_str)
                .unwrap_or("");
            return Some(format!("{}/{start}", meta_str(&vm, "uid")));
        }
    }
    None
}

/// Keeps guests in step with their VMs until shutdown.
pub async fn run(app: Arc<App>, mut shutdown: watch::Receiver<bool>) {
    let mut rx = app.store.subscribe();
    let mut second = tokio::time::interval(std::time::Duration::from_secs(1));
    second.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = second.tick() => {
                // Eager guests boot when their VM runs (qemu takes a moment to start).
                if app.guests.factory().eager() {
                    let app = app.clone();
                    let _ = tokio::task::spawn_blocking(move || {
                        app.guests.sync(&app);
                        app.guests.boot_missing(&app);
                    })
                    .await;
                }
            }
            ev = rx.recv() => {
                if matches!(ev, Err(broadcast::error::RecvError::Closed)) {
                    break;
                }
                while rx.try_recv().is_ok() {}
                app.guests.sync(&app);
            }
        }
    }
    app.guests.stop_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn expect(out: &mut crate::core::expect::SerialReader, text: &str) -> String {
        out.expect(text, Duration::from_secs(10)).await
    }

    /// A console that stops reading holds the guest back instead of losing its output, as a
    /// serial line behind virt-handler's blocking copies does: the writer waits once the queue
    /// is full, and every byte arrives in order once the console reads again. A console that
    /// goes away releases the writer.
    #[test]
    fn a_console_that_does_not_read_holds_the_guest_back_and_loses_nothing() {
        let taps = ConsoleTaps::default();
        let mut console = taps.attach();
        let chunks = CONSOLE_QUEUE * 4;
        let (written_tx, written) = std::sync::mpsc::channel();
        let writer = {
            let taps = taps.clone();
            std::thread::spawn(move || {
                for i in 0..chunks {
                    taps.deliver(&Bytes::from(format!("line {i}\n")));
                    written_tx.send(i).unwrap();
                }
            })
        };
        // The writer gets exactly as far as the queue holds, then waits for the reader.
        for i in 0..CONSOLE_QUEUE {
            assert_eq!(written.recv_timeout(Duration::from_secs(10)), Ok(i));
        }
        assert!(written.recv_timeout(Duration::from_millis(300)).is_err());
        let mut read = String::new();
        for _ in 0..chunks {
            let bytes = console.blocking_recv().expect("every chunk");
            read.push_str(std::str::from_utf8(&bytes).unwrap());
        }
        writer.join().unwrap();
        let expected: String = (0..chunks).map(|i| format!("line {i}\n")).collect();
        assert_eq!(read, expected);
        // Detached: the writer no longer waits for it.
        drop(console);
        for _ in 0..CONSOLE_QUEUE * 2 {
            taps.deliver(&Bytes::from_static(b"x"));
        }
        assert!(taps.0.lock().unwrap().is_empty());
    }

    /// A loaded machine delivers the echo and the next prompt in one chunk: the second expect
    /// must find the prompt in what the first one read past its match.
    #[tokio::test]
    async fn expect_keeps_what_it_read_past_the_match() {
        let (tx, rx) = broadcast::channel(8);
        let mut out = crate::core::expect::SerialReader::new(rx);
        tx.send(Bytes::from_static(b"cloud\r\nPassword: ")).unwrap();
        expect(&mut out, "cloud").await;
        expect(&mut out, "Password: ").await;
    }

    #[tokio::test]
    async fn login_guest_logs_in_runs_a_shell_and_stops() {
        let spec = GuestSpec {
            namespace: "default".into(),
            name: "web".into(),
            boot_id: "1".into(),
        };
        let guest = LoginGuest::boot(&spec).unwrap();
        let serial = guest.serial();
        let mut out = crate::core::expect::SerialReader::new(serial.output.subscribe());
        serial.input.send(Bytes::from_static(b"\r")).unwrap();
        expect(&mut out, "web login: ").await;
        serial.input.send(Bytes::from_static(b"cloud\r")).unwrap();
        // The terminal echoes the user name but not the password.
        expect(&mut out, "cloud").await;
        expect(&mut out, "Password: ").await;
        serial.input.send(Bytes::from_static(b"cloud\r")).unwrap();
        let after_password = expect(&mut out, "cloud@web:~$ ").await;
        // Only the prompt's "cloud": the password was not echoed.
        assert_eq!(
            after_password.matches("cloud").count(),
            1,
            "{after_password:?}"
        );
        serial
            .input
            .send(Bytes::from_static(b"echo sum=$((6*7))\r"))
            .unwrap();
        expect(&mut out, "sum=42").await;
        if uts_namespace().is_some() {
            // The guest's host name is the VM's (the machine's stays as it was).
            serial
                .input
                .send(Bytes::from_static(b"echo n=$(uname -n)\r"))
                .unwrap();
            expect(&mut out, "n=web\r").await;
            let machine = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
            assert_ne!(machine.trim(), "web");
        }
        let mut stopped = guest.stopped();
        guest.stop();
        tokio::time::timeout(Duration::from_secs(5), stopped.wait_for(|s| *s))
            .await
            .expect("stops")
            .unwrap();
        assert!(guest.dial(22).await.is_err());
    }
}
