//! `kubectl vm console VM`: the serial console, raw on a terminal, plain through pipes.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap_complete::engine::ArgValueCompleter;
use kubevm::console::{self, ConsoleEnd, ConsoleEvent, ConsolePlan};
use kubevm::target::Target;
use tokio::signal::unix::{SignalKind, signal};

use crate::commands::arbitrate::{self, SPINNER};
use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::terminal::RawMode;

/// Arguments of `console`.
#[derive(Debug, Args)]
#[command(
    after_help = "On a terminal the console is raw: keys go to the guest, Ctrl+] ends the session. Off a terminal\nstdin and stdout are plain pipes; end of input ends the session once the output is quiet.\nIt waits for a stopped or starting VM, reconnects after a reboot or migration, and asks before\ndisconnecting another user (--force does not ask).\n\nExamples:\n  kubectl vm console web\n  kubectl vm console web.prod --log web-console.log\n  printf 'cloud\\ncloud\\nuname -a\\n' | kubectl vm console web"
)]
pub struct ConsoleArgs {
    /// The VM: NAME, NAME.NAMESPACE, vm/NAME or vmi/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Connect without asking, even when somebody else is using the console
    #[arg(long)]
    pub force: bool,

    /// How long to wait for the VM to be reachable, e.g. 30s, 5m (0: no limit)
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = kubevm::cluster::parse_duration)]
    pub timeout: Duration,

    /// Also write everything the guest prints to FILE (created with mode 0600)
    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub log: Option<PathBuf>,
}

pub async fn cmd_console(global: &GlobalArgs, args: ConsoleArgs) -> CommandResult {
    let target = Target::parse(&args.target, false)?;
    let log = match &args.log {
        Some(path) => Some(open_log(path)?),
        None => None,
    };
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let mut plan = ConsolePlan::new(platform.flavor, &namespace, &target.name, args.timeout);
    plan.me = kubevm::session::whoami(&cluster).await;
    let terminal = std::io::stdin().is_terminal();
    if !terminal {
        plan.escape = None;
    }
    if !arbitrate::check(&cluster, &plan.target, plan.me.as_deref(), args.force).await? {
        return Ok(());
    }
    // Signal handlers first, so no signal can kill us while the terminal is raw.
    let mut term = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let raw = RawMode::enable()
        .map_err(|e| CommandError::Failed(format!("cannot set up the terminal: {e}")))?;
    let mut on_event = event_printer(target.name.clone(), terminal, raw.is_some());
    // SIGTERM, SIGHUP and SIGINT end the session cleanly: the KubeVirt Lease released (others
    // see the console free at once, not after its 30 s), then the terminal restored. In raw
    // mode Ctrl+C is a byte for the guest, so SIGINT only comes from outside (`kill -INT`).
    let (_ctrl_c, mut presses) = crate::interrupt::take_over();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    plan.stop = Some(stop_rx);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = hangup.recv() => {}
            _ = presses.changed() => {}
        }
        let _ = stop_tx.send(true);
    });
    let outcome = console::run(
        &cluster,
        &plan,
        tokio::io::stdin(),
        tokio::io::stdout(),
        log,
        &mut on_event,
    )
    .await;
    drop(raw);
    session_end(outcome, &target.name, terminal)
}

/// Prints the session's events on stderr as virtctl does (a spinner while waiting on a
/// terminal, one line per phase otherwise); `raw`: the terminal is in raw mode, so lines end
/// in CR LF.
fn event_printer(name: String, terminal: bool, raw: bool) -> impl FnMut(ConsoleEvent) + Send {
    let eol = if raw { "\r\n" } else { "\n" };
    let mut spinner = 0usize;
    let mut last_phase = String::new();
    move |event: ConsoleEvent| {
        let mut err = std::io::stderr().lock();
        let _ = match event {
            ConsoleEvent::Waiting { phase } => {
                let line = format!(
                    "Waiting for VirtualMachine {name:?} serial console. Current VM phase: {phase}. Press Ctrl+] to exit."
                );
                spinner += 1;
                if terminal {
                    write!(err, "\r\x1b[K{} {line}", SPINNER[spinner % SPINNER.len()])
                } else if phase != last_phase {
                    last_phase = phase;
                    write!(err, "{line}{eol}")
                } else {
                    Ok(())
                }
            }
            ConsoleEvent::Connected { again: false } => write!(
                err,
                "{}Successfully connected to {name}'s serial console. Press Ctrl+] to exit.{eol}",
                if spinner > 0 && terminal {
                    "\r\x1b[K"
                } else {
                    ""
                }
            ),
            ConsoleEvent::Connected { again: true } => write!(
                err,
                "{}Reconnected to {name}'s serial console.{eol}",
                if spinner > 0 && terminal {
                    "\r\x1b[K"
                } else {
                    ""
                }
            ),
            ConsoleEvent::Reconnecting { reason } => {
                spinner = 0;
                write!(
                    err,
                    "{eol}The console of {name} was interrupted ({reason}); reconnecting.{eol}"
                )
            }
            ConsoleEvent::Warning(message) => write!(err, "Warning: {message}{eol}"),
        };
        let _ = err.flush();
    }
}

/// How the session's end is said and what it exits with.
fn session_end(outcome: kubevm::Result<ConsoleEnd>, name: &str, terminal: bool) -> CommandResult {
    match outcome {
        Ok(ConsoleEnd::Stopped) => Err(CommandError::Interrupted),
        Ok(ConsoleEnd::Escaped) | Ok(ConsoleEnd::InputEnded) => {
            if terminal {
                eprintln!();
            }
            Ok(())
        }
        Ok(ConsoleEnd::Displaced) => {
            eprintln!("\n{}", console::displaced_message(name));
            Ok(())
        }
        Ok(ConsoleEnd::Disconnected) => {
            eprintln!("\n{}", console::disconnected_message(name));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Opens the log file for appending, mode 0600 even if it existed.
fn open_log(path: &std::path::Path) -> CommandResult<tokio::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| {
            CommandError::Failed(format!("cannot open log file {}: {e}", path.display()))
        })?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| {
            CommandError::Failed(format!("cannot protect log file {}: {e}", path.display()))
        })?;
    Ok(tokio::fs::File::from_std(file))
}
