//! `kubectl vm scp [-r] [-p] SRC DST`: SFTP over the same certificate-authenticated SSH
//! session `ssh` uses.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use kubevm::ca::store::DEFAULT_CA_NAMESPACE;
use kubevm::scp::{self, ScpEvent};
use kubevm::ssh::vm::{self as sshvm, SshOptions};

use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

use super::ssh::{connect_error, print_event, terminal_prompt};

/// Arguments of `scp`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  kubectl vm scp ./app.tar.gz web:/tmp/\n  kubectl vm scp -r admin@web.prod:/var/log/app ./logs"
)]
pub struct ScpArgs {
    /// Source: a local path or [USER@]VM:PATH
    #[arg(value_name = "SRC")]
    pub src: String,

    /// Destination: a local path or [USER@]VM:PATH
    #[arg(value_name = "DST")]
    pub dst: String,

    /// Copy directories recursively
    #[arg(short = 'r')]
    pub recursive: bool,

    /// Keep modification times and modes (modes from a VM lose setuid, setgid and sticky and go through the umask)
    #[arg(short = 'p')]
    pub preserve: bool,

    /// Log in with this private key instead of a platform certificate
    #[arg(short = 'i', long = "identity", value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub identity: Option<PathBuf>,

    /// Lifetime of the certificate (at most 1h)
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = kubevm::cluster::parse_duration)]
    pub ttl: Duration,

    /// Guest port of sshd
    #[arg(short = 'P', long, default_value_t = 22)]
    pub port: u16,

    /// What to do with an unknown host key: ask, yes (refuse), accept-new or no
    #[arg(long, value_name = "MODE", default_value = "ask", value_parser = ["ask", "yes", "accept-new", "no"])]
    pub strict_host_key_checking: String,

    /// Namespace holding the platform SSH CA
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_CA_NAMESPACE)]
    pub ca_namespace: String,
}

pub async fn cmd_scp(global: &GlobalArgs, args: ScpArgs) -> CommandResult {
    crate::connect::check_ca_namespace(&args.ca_namespace)?;
    let plan = scp::plan(&args.src, &args.dst, args.recursive, args.preserve)?;
    kubevm::ssh::cert::check_ttl(args.ttl).map_err(CommandError::usage)?;
    let strict = args
        .strict_host_key_checking
        .parse()
        .map_err(CommandError::usage)?;
    let known_hosts = sshvm::known_hosts_path().map_err(|e| CommandError::usage(e.to_string()))?;
    let (cluster, platform, namespace) = super::ssh::resolve(global, &plan.target).await?;
    let user = match &plan.target.user {
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
        strict,
        known_hosts,
        ca_namespace: args.ca_namespace.clone(),
        pty: false,
        port_forwarding: false,
        mode: kubevm::signer::client::mode(&cluster, Some(&platform)).await?,
    };
    let connection = sshvm::connect(&cluster, &options, Some(terminal_prompt()), &print_event)
        .await
        .map_err(connect_error)?;
    let sftp = connection
        .sftp()
        .await
        .map_err(|e| CommandError::Connection(e.to_string()))?;
    let bar: Arc<Mutex<Option<indicatif::ProgressBar>>> = Arc::default();
    let show = std::io::stderr().is_terminal();
    let events = {
        let bar = bar.clone();
        move |event: ScpEvent| {
            if !show {
                return;
            }
            let mut bar = bar.lock().unwrap_or_else(|e| e.into_inner());
            match event {
                ScpEvent::File { path, size } => {
                    if let Some(old) = bar.take() {
                        old.finish();
                    }
                    let b = indicatif::ProgressBar::new(size);
                    b.set_style(
                        indicatif::ProgressStyle::with_template(
                            "{msg} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {eta}",
                        )
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                    );
                    b.set_message(path);
                    *bar = Some(b);
                }
                ScpEvent::Progress { done } => {
                    if let Some(b) = bar.as_ref() {
                        b.set_position(done);
                    }
                }
            }
        }
    };
    let result = scp::execute(&sftp, &plan, &events).await;
    if let Some(b) = bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
        b.finish();
    }
    let _ = sftp.close().await;
    connection.close().await;
    match result {
        Ok(_) => Ok(()),
        Err(kubevm::ssh::SshError::Usage(m)) => Err(CommandError::Usage(m)),
        Err(e) => Err(CommandError::Failed(e.to_string())),
    }
}
