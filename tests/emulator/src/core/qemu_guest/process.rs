//! The qemu processes: started tied to this process, powered off over QMP, killed.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;

type SpawnRequest = (Command, std::sync::mpsc::Sender<io::Result<Child>>);

/// A command that runs `program` with the parent-death signal set to SIGKILL
/// (`setpriv --pdeathsig KILL`, which keeps it across the exec).
pub(super) fn tied_command(program: &Path) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL", "--"]).arg(program);
    cmd
}

/// Spawns a [`tied_command`] from a thread that lives as long as the process: the kernel kills
/// the child when that thread (so the process) ends, even on an abort.
pub(super) fn spawn_tied(cmd: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<std::sync::mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let tx = SPAWNER
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
            std::thread::Builder::new()
                .name("kubevm-qemu-spawner".into())
                .spawn(move || {
                    while let Ok((mut cmd, reply)) = rx.recv() {
                        let _ = reply.send(cmd.spawn());
                    }
                })
                .expect("spawner thread");
            Mutex::new(tx)
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let (reply_tx, reply_rx) = std::sync::mpsc::channel();
    tx.send((cmd, reply_tx))
        .map_err(|_| io::Error::other("spawner thread gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("spawner thread gone"))?
}

/// One qemu process.
pub(super) struct Proc {
    pub(super) key: (String, String),
    pub(super) pid: i32,
    pub(super) exited: watch::Receiver<bool>,
    pub(super) stop_requested: AtomicBool,
    pub(super) qmp: PathBuf,
    /// How qemu exited (set before [`Proc::exited`] turns true).
    pub(super) status: Arc<Mutex<Option<std::process::ExitStatus>>>,
}

// libvirt's default shutdown (what virt-launcher asks for) uses the guest agent when one is
// connected (`guest-shutdown`), else the ACPI power button: both are sent here, whichever the
// guest acts on.

impl Proc {
    pub(super) fn running(&self) -> bool {
        !*self.exited.borrow()
    }

    /// Ends qemu at once (counts as a requested stop: not a guest exit).
    pub(super) fn kill(&self) {
        self.stop_requested.store(true, Ordering::SeqCst);
        if self.running() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// How the guest ended by itself, once qemu has exited without being told to: exit status
    /// 0 is a power-off from inside (qemu exits so when the guest turns the machine off; a
    /// reboot stays in the same qemu), anything else a crash.
    pub(super) fn guest_exit(&self) -> Option<crate::core::guest::GuestExit> {
        if self.running() || self.stop_requested.load(Ordering::SeqCst) {
            return None;
        }
        let status = *self.status.lock().unwrap_or_else(|e| e.into_inner());
        Some(match status {
            Some(s) if s.success() => crate::core::guest::GuestExit::PoweredOff,
            _ => crate::core::guest::GuestExit::Crashed,
        })
    }

    /// ACPI power button (and `guest-shutdown` through the agent thread), then SIGKILL once
    /// `grace` has passed (once).
    pub(super) fn power_off(self: &Arc<Self>, grace: Duration) {
        if self.stop_requested.swap(true, Ordering::SeqCst) || !self.running() {
            return;
        }
        let me = self.clone();
        std::thread::spawn(move || {
            let _ = qmp(&me.qmp, &json!({"execute": "system_powerdown"}));
            let mut exited = me.exited.clone();
            let deadline = Instant::now() + grace;
            while !*exited.borrow_and_update() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            me.kill();
        });
    }
}

/// One QMP command on a fresh connection (greeting, `qmp_capabilities`, the command).
pub(super) fn qmp(path: &Path, command: &Value) -> io::Result<Value> {
    let stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let read_reply = |reader: &mut BufReader<UnixStream>| -> io::Result<Value> {
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Err(io::Error::other("QMP connection closed"));
            }
            let v: Value = serde_json::from_str(&line).map_err(io::Error::other)?;
            if v.get("return").is_some() || v.get("QMP").is_some() {
                return Ok(v);
            }
            if let Some(e) = v.get("error") {
                return Err(io::Error::other(format!("QMP: {e}")));
            }
            // Events are skipped.
        }
    };
    read_reply(&mut reader)?;
    writeln!(writer, "{}", json!({"execute": "qmp_capabilities"}))?;
    read_reply(&mut reader)?;
    writeln!(writer, "{command}")?;
    read_reply(&mut reader)
}
