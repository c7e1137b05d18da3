//! `kubectl vm ssh [USER@]VM [-- COMMAND...]`: log in with a fresh short-lived certificate
//! signed by the platform CA, through the platform's portforward stream.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use clap_complete::engine::ArgValueCompleter;
use kubevm::ca::store::DEFAULT_CA_NAMESPACE;
use kubevm::cluster::Cluster;
use kubevm::ssh::escape::{ESCAPES, EscapeChar, EscapeEvent, EscapeFilter};
use kubevm::ssh::forward::{self, LocalForward};
use kubevm::ssh::hostkey::{Prompt, UnknownHost};
use kubevm::ssh::vm::{self as sshvm, ConnectError, SshEvent, SshOptions};
use kubevm::ssh::{PtyRequest, SessionIo, SessionRequest, SshError, StrictHostKeyChecking, cert};
use kubevm::target::Target;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::terminal;

/// Arguments of `ssh`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  kubectl vm ssh web\n  kubectl vm ssh web.prod -- uname -a\n  echo hi | kubectl vm ssh admin@web -- cat\n  kubectl vm ssh web -L 8080:localhost:80"
)]
pub struct SshArgs {
    /// The VM: [USER@]NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "[USER@]VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Command to run instead of a login shell
    #[arg(value_name = "COMMAND", last = true)]
    pub command: Vec<String>,

    /// Command to run (like the words after --)
    #[arg(
        short = 'c',
        long = "command",
        value_name = "COMMAND",
        conflicts_with = "command"
    )]
    pub command_flag: Option<String>,

    /// Login name (default: the platform user, kubevm)
    #[arg(short = 'l', long = "login", value_name = "USER")]
    pub login: Option<String>,

    /// Force a terminal, even for a command
    #[arg(short = 't', conflicts_with = "no_tty")]
    pub tty: bool,

    /// Never allocate a terminal
    #[arg(short = 'T')]
    pub no_tty: bool,

    /// Log in with this private key instead of a platform certificate
    #[arg(short = 'i', long = "identity", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub identity: Option<PathBuf>,

    /// Lifetime of the certificate (at most 1h)
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = kubevm::cluster::parse_duration)]
    pub ttl: Duration,

    /// Guest port of sshd
    #[arg(short = 'p', long, default_value_t = 22)]
    pub port: u16,

    /// What to do with an unknown host key: ask, yes (refuse), accept-new or no
    #[arg(long, value_name = "MODE", default_value = "ask", value_parser = ["ask", "yes", "accept-new", "no"])]
    pub strict_host_key_checking: String,

    /// Forward a local port through the VM: [ADDRESS:]LOCAL_PORT:HOST:REMOTE_PORT
    #[arg(short = 'L', value_name = "FORWARD")]
    pub forwards: Vec<String>,

    /// Namespace holding the platform SSH CA
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_CA_NAMESPACE)]
    pub ca_namespace: String,

    /// Escape character of a terminal session (~. disconnects, ~? lists the rest): a character, ^X or none
    #[arg(short = 'e', value_name = "CHAR", default_value = "~")]
    pub escape: String,
}

/// What the flags ask for, checked before any request.
pub struct Plan {
    pub target: Target,
    /// The login given (`-l`, `USER@`); none: the VM's default login.
    pub user: Option<String>,
    pub command: Option<String>,
    pub pty: bool,
    pub forwards: Vec<LocalForward>,
    pub strict: StrictHostKeyChecking,
    /// The escape character in effect: none without a terminal, as in OpenSSH.
    pub escape: EscapeChar,
}

pub fn plan(args: &SshArgs) -> CommandResult<Plan> {
    let target = Target::parse(&args.target, true)?;
    let escape: EscapeChar = args.escape.parse().map_err(CommandError::usage)?;
    cert::check_ttl(args.ttl).map_err(CommandError::usage)?;
    let forwards = args
        .forwards
        .iter()
        .map(|f| f.parse::<LocalForward>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(CommandError::usage)?;
    let command = match (&args.command_flag, args.command.is_empty()) {
        (Some(c), _) => Some(c.clone()),
        (None, false) => Some(args.command.join(" ")),
        (None, true) => None,
    };
    let pty = if args.no_tty {
        false
    } else {
        args.tty || (command.is_none() && std::io::stdin().is_terminal())
    };
    let user = args.login.clone().or_else(|| target.user.clone());
    Ok(Plan {
        target,
        user,
        command,
        pty,
        forwards,
        strict: args
            .strict_host_key_checking
            .parse()
            .map_err(CommandError::usage)?,
        escape: if pty { escape } else { EscapeChar::None },
    })
}

/// OpenSSH's question for an unknown host, on the terminal; `None` without one.
pub fn terminal_prompt() -> Prompt {
    Arc::new(|host: &UnknownHost| {
        if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
            return None;
        }
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "The authenticity of host '{}' can't be established.\n{} key fingerprint is {}.\nThis key is not known by any other names.\nAre you sure you want to continue connecting (yes/no)? ",
            host.host, host.algorithm, host.fingerprint
        );
        let _ = err.flush();
        loop {
            let mut line = String::new();
            if std::io::stdin().read_line(&mut line).ok()? == 0 {
                return Some(false);
            }
            match line.trim() {
                "yes" => return Some(true),
                "no" => return Some(false),
                _ => {
                    let _ = write!(err, "Please type 'yes' or 'no': ");
                    let _ = err.flush();
                }
            }
        }
    })
}

/// Print connection events on stderr, OpenSSH style.
pub fn print_event(event: SshEvent) {
    match event {
        SshEvent::Fallback(notice) | SshEvent::Notice(notice) => eprintln!("Notice: {notice}"),
        SshEvent::HostRecorded { host, file, .. } => eprintln!(
            "Warning: {host} has no host certificate of the platform (an enrolled or foreign VM): trusting its key on first use. Permanently added '{host}' (ED25519) to the list of known hosts ({}).",
            file.display()
        ),
    }
}

/// A connection failure: exit 255 with one line, like OpenSSH.
pub fn connect_error(e: ConnectError) -> CommandError {
    match e {
        ConnectError::Ssh(SshError::Usage(m)) => CommandError::Usage(m),
        ConnectError::Api(kubevm::Error::InvalidTarget(m)) => CommandError::Usage(m),
        other => CommandError::Connection(other.to_string()),
    }
}

/// Resolve the cluster side of a target: namespace and platform.
pub async fn resolve(
    global: &GlobalArgs,
    target: &Target,
) -> CommandResult<(Cluster, kubevm::flavor::Platform, String)> {
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    Ok((cluster, platform, namespace))
}

pub async fn cmd_ssh(global: &GlobalArgs, args: SshArgs) -> CommandResult {
    crate::connect::check_ca_namespace(&args.ca_namespace)?;
    let plan = plan(&args)?;
    let connection = Arc::new(connect_vm(global, &args, &plan).await?);
    let forwarders = start_forwards(&connection, &plan).await?;
    let request = SessionRequest {
        command: plan.command.clone(),
        pty: plan.pty.then(|| {
            let (cols, rows) = terminal::size();
            PtyRequest {
                term: std::env::var("TERM").unwrap_or_else(|_| "xterm".into()),
                cols,
                rows,
            }
        }),
    };
    // Signal handlers before raw mode, so SIGTERM or SIGHUP (a closed terminal window) end
    // the session through the code below, which restores the terminal, instead of killing us.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    let raw = if plan.pty {
        terminal::RawMode::enable()?
    } else {
        None
    };
    let (io, disconnect) = session_io(&plan);
    let disconnected = async {
        match disconnect {
            Some(rx) => {
                if rx.await.is_err() {
                    // Input ended without `~.`: the session goes on.
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    };
    let outcome = tokio::select! {
        outcome = connection.run(&request, io) => Ended::Outcome(outcome),
        _ = term.recv() => Ended::Signal,
        _ = hangup.recv() => Ended::Signal,
        () = disconnected => Ended::Escape,
    };
    drop(raw);
    let outcome = match outcome {
        Ended::Outcome(outcome) => outcome,
        Ended::Signal => {
            connection.close().await;
            return Err(CommandError::Interrupted);
        }
        Ended::Escape => {
            connection.close().await;
            // OpenSSH's words and status: no exit status came, so 255.
            eprintln!("Connection to {} closed.", plan.target.name);
            return Err(CommandError::Exit(255));
        }
    };
    for f in forwarders {
        f.abort();
    }
    connection.close().await;
    exit_status(outcome, &plan.target.name)
}

/// Resolves the target, picks the login and the certificate mode, and opens the SSH
/// connection through the API server (host identity checked).
async fn connect_vm(
    global: &GlobalArgs,
    args: &SshArgs,
    plan: &Plan,
) -> CommandResult<kubevm::ssh::Connection> {
    let known_hosts = sshvm::known_hosts_path().map_err(|e| CommandError::usage(e.to_string()))?;
    let (cluster, platform, namespace) = resolve(global, &plan.target).await?;
    let user = match &plan.user {
        Some(user) => user.clone(),
        None => {
            sshvm::default_login(&cluster, platform.flavor, &namespace, &plan.target.name).await
        }
    };
    let options = SshOptions {
        flavor: platform.flavor,
        namespace,
        vm: plan.target.name.clone(),
        user,
        port: args.port,
        ttl: args.ttl,
        identity_file: args.identity.clone(),
        strict: plan.strict,
        known_hosts,
        ca_namespace: args.ca_namespace.clone(),
        pty: plan.pty,
        port_forwarding: !plan.forwards.is_empty(),
        mode: kubevm::signer::client::mode(&cluster, Some(&platform)).await?,
    };
    sshvm::connect(&cluster, &options, Some(terminal_prompt()), &print_event)
        .await
        .map_err(connect_error)
}

/// Binds every `-L` listener and serves it over the connection.
async fn start_forwards(
    connection: &Arc<kubevm::ssh::Connection>,
    plan: &Plan,
) -> CommandResult<Vec<tokio::task::JoinHandle<()>>> {
    let mut forwarders = Vec::new();
    for f in &plan.forwards {
        let listener = forward::bind(f)
            .await
            .map_err(|e| CommandError::Connection(e.to_string()))?;
        forwarders.push(tokio::spawn(forward::serve(
            connection.clone(),
            listener,
            f.clone(),
            Arc::new(|e| eprintln!("Warning: {e}")),
        )));
    }
    Ok(forwarders)
}

/// The session's standard streams: stdin through the escape-character filter when one is
/// set (its receiver fires on `~.`), and window-size changes when a terminal is requested.
fn session_io(plan: &Plan) -> (SessionIo, Option<oneshot::Receiver<()>>) {
    let (resize, resized) = if plan.pty {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Ok(mut winch) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        {
            let tx = tx.clone();
            tokio::spawn(async move {
                while winch.recv().await.is_some() {
                    if tx.send(terminal::size()).is_err() {
                        break;
                    }
                }
            });
        }
        (Some(rx), Some(tx))
    } else {
        (None, None)
    };
    let (stdin, disconnect): (Box<dyn AsyncRead + Send + Unpin>, _) = match plan.escape {
        EscapeChar::None => (Box::new(tokio::io::stdin()), None),
        EscapeChar::Char(_) => {
            let (stdin, disconnect) = escaped_stdin(plan.escape, resized);
            (stdin, Some(disconnect))
        }
    };
    let io = SessionIo {
        stdin,
        stdout: Box::new(tokio::io::stdout()),
        stderr: Box::new(tokio::io::stderr()),
        resize,
    };
    (io, disconnect)
}

/// The remote command's exit status as ours; a connection lost before the channel closed is
/// an error, never a success after partial output.
fn exit_status(outcome: Result<kubevm::ssh::ExitOutcome, SshError>, vm: &str) -> CommandResult {
    let exit = outcome.map_err(|e| CommandError::Connection(e.to_string()))?;
    if let kubevm::ssh::ExitOutcome::Lost { status } = exit {
        // Said in one line, as OpenSSH does: the channel did not close, so output after the
        // exit status may be missing.
        return Err(CommandError::Connection(match status {
            None => format!("the connection to {vm} was lost before the remote command finished"),
            Some(s) => format!(
                "the connection to {vm} was lost before all output arrived (the remote command exited {s})"
            ),
        }));
    }
    match exit.code() {
        0 => Ok(()),
        code => Err(CommandError::Exit(code as u8)),
    }
}

/// How the session loop ended.
enum Ended {
    Outcome(Result<kubevm::ssh::ExitOutcome, SshError>),
    Signal,
    Escape,
}

/// The terminal read through the escape filter: data goes on to the session (the returned
/// reader), `~?` and `~^Z` act here, `~.` fires the returned receiver. Messages end in
/// `\r\n`, as the terminal is raw.
fn escaped_stdin(
    escape: EscapeChar,
    resized: Option<mpsc::UnboundedSender<(u32, u32)>>,
) -> (Box<dyn AsyncRead + Send + Unpin>, oneshot::Receiver<()>) {
    let (reader, mut writer) = tokio::io::duplex(64 * 1024);
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut filter = EscapeFilter::new(escape);
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            for event in filter.feed(&buf[..n]) {
                match event {
                    EscapeEvent::Data(data) => {
                        if writer.write_all(&data).await.is_err() {
                            return;
                        }
                    }
                    EscapeEvent::Disconnect => {
                        eprint!("{escape}.\r\n");
                        let _ = tx.send(());
                        return;
                    }
                    EscapeEvent::Help => eprint!("{}", escape_help(escape)),
                    EscapeEvent::Suspend => {
                        eprint!("{escape}^Z [suspend kubectl-vm]\r\n");
                        if let Err(e) = terminal::suspend() {
                            eprint!("Warning: cannot suspend: {e}\r\n");
                        }
                        // The window may have changed while suspended.
                        if let Some(resized) = &resized {
                            let _ = resized.send(terminal::size());
                        }
                    }
                }
            }
        }
    });
    (Box::new(reader), rx)
}

/// The `~?` answer.
fn escape_help(escape: EscapeChar) -> String {
    let mut text = format!("{escape}?\r\nEscape sequences (at the start of a line):\r\n");
    for (key, what) in ESCAPES {
        text.push_str(&format!(" {escape}{key:<3} {what}\r\n"));
    }
    text.push_str(&format!(" {escape}{escape}   send {escape} itself\r\n"));
    text
}
