//! `kubectl vm port-forward VM [tcp/|udp/]LOCAL[:REMOTE]...` and `--stdio VM PORT`.

use std::sync::Arc;

use clap::Args;
use clap_complete::engine::ArgValueCompleter;
use kubevm::port_forward::{self, ForwardEvent, ForwardTarget, PortSpec};
use kubevm::target::Target;

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// Arguments of `port-forward`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  kubectl vm port-forward web 8080:80\n  kubectl vm port-forward web.prod 2222:22 udp/5353:53\n  ssh -o ProxyCommand='kubectl vm port-forward --stdio web.prod 22' kubevm@web.prod"
)]
pub struct PortForwardArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Ports: [tcp/|udp/]LOCAL[:REMOTE] (with --stdio: one VM port)
    #[arg(value_name = "PORT", required = true)]
    pub ports: Vec<String>,

    /// Local address to listen on
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1")]
    pub address: String,

    /// Forward one TCP port over stdin/stdout (for ssh's ProxyCommand)
    #[arg(long)]
    pub stdio: bool,

    /// The VM is given as an ssh-config host name, NAME.NAMESPACE.vm (ssh-config's ProxyCommand)
    #[arg(long, requires = "stdio")]
    pub ssh_host: bool,
}

pub async fn cmd_port_forward(global: &GlobalArgs, args: PortForwardArgs) -> CommandResult {
    let target = if args.ssh_host {
        kubevm::ssh::config::vm_of_host(&args.target)?
    } else {
        Target::parse(&args.target, false)?
    };
    let specs = args
        .ports
        .iter()
        .map(|p| p.parse::<PortSpec>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(CommandError::usage)?;
    if args.stdio && (specs.len() != 1 || specs[0].protocol != port_forward::Protocol::Tcp) {
        return Err(CommandError::usage(
            "--stdio forwards exactly one TCP port: kubectl vm port-forward --stdio VM PORT",
        ));
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    crate::connect::require_subresources(&platform)?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let forward = ForwardTarget {
        flavor: platform.flavor,
        namespace,
        vm: target.name.clone(),
    };
    if args.stdio {
        // OpenSSH ends its ProxyCommand with SIGHUP when it exits (sshconnect.c,
        // ssh_kill_proxy_command). A handler of our own, rather than the default action, so
        // that a SIGHUP ignored by whoever started ssh (nohup, some CI runners) cannot keep
        // the tunnel, and the guest's sshd waiting on it, alive after ssh is gone.
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangup = signal(SignalKind::hangup())?;
        let mut term = signal(SignalKind::terminate())?;
        return tokio::select! {
            done = port_forward::stdio(&cluster, &forward, specs[0].remote) => {
                done.map_err(|e| CommandError::Failed(e.to_string()))
            }
            _ = hangup.recv() => Ok(()),
            _ = term.recv() => Ok(()),
        };
    }
    let events: port_forward::Events = Arc::new(|event| match event {
        ForwardEvent::Listening { local, spec } => {
            let proto = match spec.protocol {
                port_forward::Protocol::Tcp => "",
                port_forward::Protocol::Udp => "udp/",
            };
            println!("Forwarding from {local} -> {proto}{}", spec.remote);
        }
        ForwardEvent::ConnectionFailed { spec, reason } => {
            eprintln!("Error: port {}: {reason}", spec.remote)
        }
    });
    port_forward::run(&cluster, &forward, &args.address, &specs, events)
        .await
        .map_err(|e| CommandError::Failed(e.to_string()))
}
