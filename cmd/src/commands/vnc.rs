//! `kubectl vm vnc VM`: a local VNC endpoint for the VM's display, opened in a viewer when one
//! is installed.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use clap_complete::engine::ArgValueCompleter;
use kubevm::target::Target;
use kubevm::vnc::{self, VncEvent, VncPlan, viewer};

use crate::commands::arbitrate;
use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// How long a launched viewer has to connect (virtctl's and d8's `LISTEN_TIMEOUT`).
const VIEWER_DEADLINE: Duration = Duration::from_secs(60);

/// [`VIEWER_DEADLINE`], or `KUBECTL_VM_VIEWER_TIMEOUT` (a duration such as `2s`; for tests,
/// which cannot wait a minute to see a session outlive it).
fn viewer_deadline() -> Duration {
    std::env::var("KUBECTL_VM_VIEWER_TIMEOUT")
        .ok()
        .and_then(|v| kubevm::cluster::parse_duration(&v).ok())
        .unwrap_or(VIEWER_DEADLINE)
}

/// Arguments of `vnc`.
#[derive(Debug, Args)]
#[command(
    after_help = "Opens the VM's VNC stream, listens on a local port and starts a viewer on it: --viewer, else\nremote-viewer or vncviewer (macOS: TigerVNC, Chicken, RealVNC apps first) when one is installed (otherwise it prints where to connect). With --proxy-only it prints\n{\"port\":N} on stdout and serves VNC clients until interrupted.\n\nExamples:\n  kubectl vm vnc web\n  kubectl vm vnc web.prod --proxy-only --port 5900\n  kubectl vm vnc web --preserve-session\n  kubectl vm vnc web --viewer vncviewer"
)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct VncArgs {
    #[command(subcommand)]
    pub action: Option<VncAction>,

    /// The VM: NAME, NAME.NAMESPACE, vm/NAME or vmi/NAME[/NAMESPACE]
    #[arg(value_name = "VM", required = true, add = ArgValueCompleter::new(complete::vm_names))]
    pub target: Option<String>,

    /// Only run the local proxy: print {"port":N} on stdout and serve until interrupted
    #[arg(long)]
    pub proxy_only: bool,

    /// Local port (0: a free one)
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub port: u16,

    /// Local address to listen on (only with --proxy-only; a viewer always uses 127.0.0.1)
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1")]
    pub address: IpAddr,

    /// Connect without asking, even when somebody else is using the display
    #[arg(long)]
    pub force: bool,

    /// KubeVirt: fail instead of taking over an active VNC session
    #[arg(long)]
    pub preserve_session: bool,

    /// The viewer to launch: a path, or a program name in PATH (default: the first of
    /// remote-viewer, vncviewer; on macOS TigerVNC, Chicken, RealVNC first)
    #[arg(long, value_name = "PATH|NAME", env = kubevm::vnc::viewer::VIEWER_ENV, conflicts_with = "proxy_only", value_hint = clap::ValueHint::CommandName)]
    pub viewer: Option<String>,
}

/// `vnc` subcommands.
#[derive(Debug, Subcommand)]
pub enum VncAction {
    /// Save a PNG of the VM's display (KubeVirt)
    Screenshot(ScreenshotArgs),
}

/// Arguments of `vnc screenshot`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  kubectl vm vnc screenshot web -o web.png")]
pub struct ScreenshotArgs {
    /// The VM: NAME, NAME.NAMESPACE, vm/NAME or vmi/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Where to write the PNG
    #[arg(short = 'o', long, value_name = "FILE.png", value_hint = clap::ValueHint::FilePath)]
    pub output: PathBuf,

    /// Move the pointer first (wakes a blanked screen)
    #[arg(long)]
    pub move_cursor: bool,
}

pub async fn cmd_vnc(global: &GlobalArgs, args: VncArgs) -> CommandResult {
    if let Some(VncAction::Screenshot(shot)) = args.action {
        return cmd_screenshot(global, shot).await;
    }
    let target = Target::parse(args.target.as_deref().unwrap_or_default(), false)?;
    // A viewer that was asked for but is not there is bad input: before any request.
    let places = viewer::SearchPlaces::of_this_process();
    let chosen = match (&args.viewer, args.proxy_only) {
        (_, true) => None,
        (Some(name), false) => {
            Some(viewer::named(name, &places).map_err(|e| CommandError::Usage(e.to_string()))?)
        }
        (None, false) => viewer::discover(&places),
    };
    let (cluster, platform) = crate::connect::connect(global).await?;
    crate::connect::require_subresources(&platform)?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let address = if args.proxy_only {
        args.address
    } else {
        IpAddr::from([127, 0, 0, 1])
    };
    let mut plan = VncPlan::new(
        platform.flavor,
        &namespace,
        &target.name,
        SocketAddr::new(address, args.port),
    );
    plan.target.preserve_session = args.preserve_session;
    plan.once = !args.proxy_only;
    plan.me = kubevm::session::whoami(&cluster).await;
    if !arbitrate::check(&cluster, &plan.target, plan.me.as_deref(), args.force).await? {
        return Ok(());
    }
    let name = target.name.clone();
    // Whether a client has connected: the viewer's deadline covers connecting only.
    let (connected_tx, connected) = tokio::sync::watch::channel(false);
    let mut on_event = move |event: VncEvent| match event {
        VncEvent::Listening(_) => {}
        VncEvent::ClientConnected(peer) => {
            connected_tx.send_replace(true);
            eprintln!("VNC client {peer} connected to {name}")
        }
        VncEvent::ClientDone(reason) => eprintln!("VNC session of {name} ended: {reason}"),
        VncEvent::Warning(message) => eprintln!("Warning: {message}"),
    };
    let proxy = vnc::open(&cluster, &plan, &mut on_event).await?;
    let port = proxy.local_addr()?.port();
    if args.proxy_only {
        return serve_proxy_only(&cluster, &plan, proxy, port, &mut on_event).await;
    }
    eprintln!("Connecting to {}'s VNC...", target.name);
    let Some(viewer) = chosen else {
        eprintln!(
            "No VNC viewer found (remote-viewer or vncviewer in PATH, or --viewer); connect one to 127.0.0.1:{port}"
        );
        return Ok(vnc::serve(&cluster, &plan, proxy, &mut on_event).await?);
    };
    serve_with_viewer(
        &cluster,
        &plan,
        proxy,
        port,
        &viewer,
        &connected,
        &mut on_event,
    )
    .await
}

/// `--proxy-only`: prints the port as JSON and serves until interrupted; on SIGTERM the
/// session Lease is released on the way out.
async fn serve_proxy_only(
    cluster: &kubevm::cluster::Cluster,
    plan: &VncPlan,
    mut proxy: vnc::VncProxy,
    port: u16,
    on_event: &mut (dyn FnMut(VncEvent) + Send),
) -> CommandResult {
    // Listen for SIGTERM before telling anyone the port.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{{\"port\":{port}}}")?;
        out.flush()?;
    }
    // Serves until interrupted; on SIGTERM the session Lease is released on the way out
    // (Ctrl-C is taken by the global handler; the Lease then expires after 30 s).
    let lease = proxy.take_lease();
    let outcome = tokio::select! {
        result = vnc::serve(cluster, plan, proxy, on_event) => result.map_err(CommandError::from),
        _ = term.recv() => Err(CommandError::Interrupted),
    };
    if let Some(lease) = lease {
        lease.release().await;
    }
    outcome
}

/// Starts the viewer on the local port and serves it; the viewer must connect within the
/// deadline, and the session then lasts as long as the viewer does.
async fn serve_with_viewer(
    cluster: &kubevm::cluster::Cluster,
    plan: &VncPlan,
    proxy: vnc::VncProxy,
    port: u16,
    viewer: &viewer::Viewer,
    connected: &tokio::sync::watch::Receiver<bool>,
    on_event: &mut (dyn FnMut(VncEvent) + Send),
) -> CommandResult {
    let mut child = tokio::process::Command::new(&viewer.program)
        .args(viewer.args(port))
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| {
            CommandError::Failed(format!("cannot start {}: {e}", viewer.program.display()))
        })?;
    let serving = vnc::serve(cluster, plan, proxy, on_event);
    tokio::pin!(serving);
    // The viewer must connect within the deadline; once it has, the session lasts as long as
    // the viewer does.
    let limit = viewer_deadline();
    let deadline = tokio::time::sleep(limit);
    tokio::pin!(deadline);
    let mut waiting_for_connect = true;
    let outcome = loop {
        tokio::select! {
            result = &mut serving => break Some(result),
            _ = child.wait() => break None,
            _ = &mut deadline, if waiting_for_connect => {
                if *connected.borrow() {
                    waiting_for_connect = false;
                    continue;
                }
                let _ = child.kill().await;
                return Err(CommandError::Failed(format!(
                    "{} did not connect within {} s",
                    viewer.program.display(),
                    limit.as_secs_f64()
                )));
            }
        }
    };
    let _ = child.kill().await;
    match outcome {
        Some(result) => Ok(result?),
        None => Ok(()),
    }
}

async fn cmd_screenshot(global: &GlobalArgs, args: ScreenshotArgs) -> CommandResult {
    use std::os::unix::fs::OpenOptionsExt;
    let target = Target::parse(&args.target, false)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    crate::connect::require_subresources(&platform)?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let png = vnc::screenshot(
        &cluster,
        platform.flavor,
        &namespace,
        &target.name,
        args.move_cursor,
    )
    .await?;
    // Written as FILE.partial and renamed once complete: a write that fails (a full disk, a
    // file size limit) leaves no partial PNG under the final name and keeps an older FILE.
    let partial = kubevm::export::download::partial_path(&args.output);
    let cannot = |e: std::io::Error| {
        CommandError::Failed(format!("cannot write {}: {e}", args.output.display()))
    };
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&partial)
        .and_then(|mut file| {
            file.write_all(&png)?;
            file.sync_all()
        })
        .and_then(|()| std::fs::rename(&partial, &args.output));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(cannot(e));
    }
    eprintln!(
        "Wrote a screenshot of {} to {}",
        target.name,
        args.output.display()
    );
    Ok(())
}
