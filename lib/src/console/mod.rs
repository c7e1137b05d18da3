//! `kubectl vm console`: the serial console of a VM as a byte pipe between the caller's input
//! and output, that waits for the VM, follows reboots and migrations by reconnecting, and ends on
//! the escape byte, on end of input (after the output drained), or when another user takes the
//! console over.
//!
//! Terminal handling (raw mode, signals, messages) belongs to the caller; this module reports
//! what happens through [`ConsoleEvent`]s.

use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::platform::{self, SessionArbitration};
use crate::session::kubevirt::HeldLease;
use crate::stream::{self, PlatformStream, StreamKind, StreamTarget};
use crate::{Flavor, session};

/// Ctrl+], the escape byte of virtctl and d8 (0x1D).
pub const ESCAPE: u8 = 0x1d;

/// What a console session does.
#[derive(Debug, Clone)]
pub struct ConsolePlan {
    /// The VM's console.
    pub target: StreamTarget,
    /// How long to wait for the VM to become reachable, each time it is not (zero: no limit).
    pub timeout: Duration,
    /// The byte that ends the session (`Some(ESCAPE)` on a terminal, `None` for pipes).
    pub escape: Option<u8>,
    /// After end of input, how long the output must stay quiet before the session ends.
    pub drain_quiet: Duration,
    /// The user the cluster knows us as, to record in the KubeVirt Lease.
    pub me: Option<String>,
    /// Flips to `true` to end the session cleanly from outside (signals): the session ends
    /// with [`ConsoleEnd::Stopped`] after releasing what it holds.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
}

impl ConsolePlan {
    /// A plan for the console of `name` in `namespace`.
    pub fn new(flavor: Flavor, namespace: &str, name: &str, timeout: Duration) -> Self {
        ConsolePlan {
            target: StreamTarget::new(flavor, namespace, name, StreamKind::Console),
            timeout,
            escape: Some(ESCAPE),
            drain_quiet: Duration::from_millis(1500),
            me: None,
            stop: None,
        }
    }
}

/// Progress of a console session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsoleEvent {
    /// The VM cannot be reached yet; `phase` is its current phase.
    Waiting {
        /// VM phase or printable status.
        phase: String,
    },
    /// Connected (`again`: after a reboot, migration or network loss).
    Connected {
        /// Whether this is a reconnect.
        again: bool,
    },
    /// The stream ended for a reason that is worth reconnecting over.
    Reconnecting {
        /// Why it ended.
        reason: String,
    },
    /// Something the user should know that does not stop the session.
    Warning(String),
}

/// How a console session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsoleEnd {
    /// The escape byte was typed.
    Escaped,
    /// Input ended and the output drained.
    InputEnded,
    /// Another user connected to the console.
    Displaced,
    /// The stream was cut while the VM kept running, and nothing tells whether another user
    /// took over or the network failed (no Lease rights, no session probe).
    Disconnected,
    /// [`ConsolePlan::stop`] flipped.
    Stopped,
}

/// Resolves when the stop flag flips; never without one.
async fn stopped(stop: &mut Option<tokio::sync::watch::Receiver<bool>>) {
    match stop {
        Some(rx) => {
            if rx.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Runs the session: `input` is typed into the console, everything the guest prints goes to
/// `output` (and to `log`).
pub async fn run<R, W>(
    cluster: &Cluster,
    plan: &ConsolePlan,
    input: R,
    mut output: W,
    mut log: Option<tokio::fs::File>,
    on_event: &mut (dyn FnMut(ConsoleEvent) + Send),
) -> Result<ConsoleEnd>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin,
{
    let mut typed = spawn_reader(input);
    let mut pending: Vec<u8> = Vec::new();
    let mut input_open = true;
    let mut again = false;
    let mut lease_warned = false;
    let mut lease_warning = None;
    loop {
        // 1. Reach the console.
        let lease = hold_lease(cluster, plan, &mut lease_warned, &mut lease_warning).await;
        let connected = connect(
            cluster,
            plan,
            &mut typed,
            &mut pending,
            &mut input_open,
            on_event,
        )
        .await;
        let mut stream = match connected {
            Ok(Ok(stream)) => {
                // Said only once connected: a user refused the console itself gets that
                // refusal alone, not a warning about the Lease first.
                if let Some(warning) = lease_warning.take() {
                    on_event(ConsoleEvent::Warning(warning));
                }
                stream
            }
            Ok(Err(end)) => {
                release(lease).await;
                return Ok(end);
            }
            Err(e) => {
                release(lease).await;
                return Err(e);
            }
        };
        // Deckhouse: the start time the server recorded for this session tells it apart
        // from a successor's.
        let my_session =
            if platform::of(plan.target.flavor).sessions == SessionArbitration::ServerProbe {
                session::deckhouse::probe(cluster, &plan.target)
                    .await
                    .ok()
                    .flatten()
                    .map(|h| h.session)
            } else {
                None
            };
        let boot = boot_of(cluster, plan).await;
        on_event(ConsoleEvent::Connected { again });
        again = true;
        // A carriage return nudges the guest into printing a prompt.
        pending.insert(0, b'\r');
        // 2. Shuffle bytes.
        let ended = pump(
            plan,
            &mut stream,
            &mut typed,
            &mut pending,
            &mut input_open,
            &mut output,
            &mut log,
        )
        .await?;
        if let Some(end) = ended {
            release(lease).await;
            return Ok(end);
        }
        // 3. The stream ended under us: displaced, or reconnect.
        let end = stream.ended().await;
        let verdict = displaced(
            cluster,
            plan,
            end.code(),
            lease.as_ref(),
            my_session.as_ref(),
        )
        .await;
        match verdict {
            Some(true) => {
                drop(lease);
                return Ok(ConsoleEnd::Displaced);
            }
            // Nothing tells who cut us off: reconnect only when the VM restarted or stopped
            // (a new boot), so two users who cannot be told apart do not take the console
            // from each other forever; otherwise end like virtctl, naming the possible reasons.
            None if boot_of(cluster, plan).await == boot && boot.is_some() => {
                release(lease).await;
                return Ok(ConsoleEnd::Disconnected);
            }
            _ => {}
        }
        release(lease).await;
        on_event(ConsoleEvent::Reconnecting {
            reason: end.describe(),
        });
    }
}

/// Whether another client took the console when the stream ended with close `code`:
/// `Some(true)` displaced, `Some(false)` still ours, `None` when nothing tells. A 1001
/// ("going away") is a displacement on both platforms; otherwise the platform's arbitration
/// answers: our Lease (KubeVirt) or the server's record of the session (Deckhouse).
async fn displaced(
    cluster: &Cluster,
    plan: &ConsolePlan,
    code: u16,
    lease: Option<&HeldLease>,
    my_session: Option<&String>,
) -> Option<bool> {
    if code == 1001 {
        return Some(true);
    }
    match platform::of(plan.target.flavor).sessions {
        SessionArbitration::Lease => lease?.still_ours().await.map(|ours| !ours),
        SessionArbitration::ServerProbe => {
            let mine = my_session?;
            let holder = session::deckhouse::probe(cluster, &plan.target)
                .await
                .ok()?;
            Some(holder.is_some_and(|h| &h.session != mine))
        }
    }
}

/// Which boot of the VM runs now: the VMI uid (KubeVirt), the start time (Deckhouse);
/// `None` when it does not run or cannot be read.
async fn boot_of(cluster: &Cluster, plan: &ConsolePlan) -> Option<String> {
    match plan.target.flavor {
        Flavor::KubeVirt => {
            let kind = crate::api::Kind::of(&serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance"
            }))?;
            let vmi = kind
                .api(&cluster.client, Some(&plan.target.namespace))
                .get_opt(&plan.target.name)
                .await
                .ok()??;
            let running =
                vmi.data.pointer("/status/phase").and_then(|p| p.as_str()) == Some("Running");
            running.then(|| vmi.metadata.uid.clone()).flatten()
        }
        Flavor::Deckhouse => {
            let kind = crate::api::Kind::vm(Flavor::Deckhouse);
            let vm = kind
                .api(&cluster.client, Some(&plan.target.namespace))
                .get_opt(&plan.target.name)
                .await
                .ok()??;
            let phase = vm.data.pointer("/status/phase").and_then(|p| p.as_str());
            if !matches!(phase, Some("Running") | Some("Migrating")) {
                return None;
            }
            let started = vm
                .data
                .pointer("/status/stats/lastStartTime")
                .and_then(|p| p.as_str());
            Some(format!(
                "{}/{}",
                vm.metadata.uid.clone().unwrap_or_default(),
                started.unwrap_or("")
            ))
        }
    }
}

/// Copies bytes until the session ends (`Some`) or the stream does (`None`).
async fn pump<W: AsyncWrite + Unpin>(
    plan: &ConsolePlan,
    stream: &mut PlatformStream,
    typed: &mut mpsc::Receiver<Bytes>,
    pending: &mut Vec<u8>,
    input_open: &mut bool,
    output: &mut W,
    log: &mut Option<tokio::fs::File>,
) -> Result<Option<ConsoleEnd>> {
    let io_err = |e: std::io::Error| Error::Internal(format!("console: {e}"));
    if !pending.is_empty() {
        let bytes = std::mem::take(pending);
        if let Some(end) = send(plan, stream, &bytes).await {
            return Ok(Some(end));
        }
    }
    let mut buf = vec![0u8; 10240];
    let mut stop = plan.stop.clone();
    loop {
        let quiet = tokio::time::sleep(plan.drain_quiet);
        tokio::select! {
            _ = stopped(&mut stop) => {
                let _ = stream.io.shutdown().await;
                return Ok(Some(ConsoleEnd::Stopped));
            }
            chunk = typed.recv(), if *input_open => match chunk {
                Some(bytes) => {
                    if let Some(end) = send(plan, stream, &bytes).await {
                        return Ok(Some(end));
                    }
                }
                None => *input_open = false,
            },
            n = stream.io.read(&mut buf) => match n {
                Ok(0) | Err(_) => return Ok(None),
                Ok(n) => {
                    output.write_all(&buf[..n]).await.map_err(io_err)?;
                    output.flush().await.map_err(io_err)?;
                    if let Some(file) = log.as_mut() {
                        file.write_all(&buf[..n]).await.map_err(io_err)?;
                    }
                }
            },
            _ = quiet, if !*input_open => {
                let _ = stream.io.shutdown().await;
                return Ok(Some(ConsoleEnd::InputEnded));
            }
        }
    }
}

/// Sends typed bytes, stopping at the escape byte.
async fn send(plan: &ConsolePlan, stream: &mut PlatformStream, bytes: &[u8]) -> Option<ConsoleEnd> {
    let (bytes, escaped) = match plan.escape.and_then(|e| bytes.iter().position(|b| *b == e)) {
        Some(at) => (&bytes[..at], true),
        None => (bytes, false),
    };
    if !bytes.is_empty() {
        let _ = stream.io.write_all(bytes).await;
    }
    if escaped {
        let _ = stream.io.shutdown().await;
        return Some(ConsoleEnd::Escaped);
    }
    None
}

/// Opens the console, waiting while the VM is not running. `Err(end)`: the user escaped or the
/// session was stopped while waiting.
async fn connect(
    cluster: &Cluster,
    plan: &ConsolePlan,
    typed: &mut mpsc::Receiver<Bytes>,
    pending: &mut Vec<u8>,
    input_open: &mut bool,
    on_event: &mut (dyn FnMut(ConsoleEvent) + Send),
) -> Result<std::result::Result<PlatformStream, ConsoleEnd>> {
    let mut stop = plan.stop.clone();
    // A zero timeout waits without limit, like --timeout 0 elsewhere.
    let deadline = (!plan.timeout.is_zero()).then(|| tokio::time::Instant::now() + plan.timeout);
    loop {
        match stream::open(cluster, &plan.target).await {
            Ok(stream) => return Ok(Ok(stream)),
            Err(Error::NotRunning(_)) => {}
            // KubeVirt: no VMI yet (the VM is stopped or starting) is a 404 on the VMI.
            Err(Error::NotFound { .. }) if platform::of(plan.target.flavor).instance.is_some() => {}
            Err(e) => return Err(e),
        }
        // A missing VM ends the wait with its own NotFound.
        let phase = vm_phase(cluster, plan).await?;
        on_event(ConsoleEvent::Waiting { phase });
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return Err(Error::Timeout(format!(
                "VirtualMachine {:?} serial console (after {})",
                plan.target.name,
                human(plan.timeout)
            )));
        }
        // Retry every second (virtctl's SerialConsole), watching for the escape byte.
        let retry = tokio::time::sleep(Duration::from_secs(1));
        tokio::pin!(retry);
        loop {
            tokio::select! {
                _ = &mut retry => break,
                _ = stopped(&mut stop) => return Ok(Err(ConsoleEnd::Stopped)),
                chunk = typed.recv(), if *input_open => match chunk {
                    Some(bytes) => {
                        if plan.escape.is_some_and(|e| bytes.contains(&e)) {
                            return Ok(Err(ConsoleEnd::Escaped));
                        }
                        pending.extend_from_slice(&bytes);
                    }
                    None => *input_open = false,
                },
            }
        }
    }
}

/// The VM's phase for the waiting message; a missing VM is an error.
async fn vm_phase(cluster: &Cluster, plan: &ConsolePlan) -> Result<String> {
    let kind = crate::api::Kind::vm(plan.target.flavor);
    let api = kind.api(&cluster.client, Some(&plan.target.namespace));
    let vm = api.get(&plan.target.name).await.map_err(|e| {
        cluster.error(
            e,
            &kind
                .action("get", Some(&plan.target.namespace))
                .named(&plan.target.name),
        )
    })?;
    let field = platform::of(plan.target.flavor).vm_state_field;
    Ok(vm
        .data
        .pointer(&format!("/status/{field}"))
        .and_then(|p| p.as_str())
        .unwrap_or("Unknown")
        .to_owned())
}

/// KubeVirt: take our Lease before connecting, so a displaced session finds it changed.
/// When it cannot be taken, the first time puts the warning in `warning` for the caller to
/// say once the console is reached.
async fn hold_lease(
    cluster: &Cluster,
    plan: &ConsolePlan,
    warned: &mut bool,
    warning: &mut Option<String>,
) -> Option<HeldLease> {
    if platform::of(plan.target.flavor).sessions != SessionArbitration::Lease {
        return None;
    }
    let me = plan.me.as_deref().unwrap_or("unknown");
    match HeldLease::acquire(cluster, &plan.target, me).await {
        Ok(lease) => Some(lease),
        Err(e) => {
            if !*warned {
                *warned = true;
                *warning = Some(format!(
                    "cannot record this session, so others will not see you connected: {e}"
                ));
            }
            None
        }
    }
}

async fn release(lease: Option<HeldLease>) {
    if let Some(lease) = lease {
        lease.release().await;
    }
}

/// Reads the input on its own task, so a blocked read never holds up the session.
fn spawn_reader<R: AsyncRead + Unpin + Send + 'static>(mut input: R) -> mpsc::Receiver<Bytes> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut buf = vec![0u8; 1024];
        loop {
            match input.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// The message when the reason is unknown (virtctl's, `pkg/virtctl/console/console.go`).
pub fn disconnected_message(vm: &str) -> String {
    format!(
        "You were disconnected from the console of {vm}. This could be caused by one of the following:\n - another user connected to the console of {vm}\n - network issues"
    )
}

/// The reason shown to a displaced user.
pub fn displaced_message(vm: &str) -> String {
    format!("You were disconnected: another user connected to the console of {vm}.")
}

/// `5m`, `90s`: a duration as the user typed it.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 && secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests;
