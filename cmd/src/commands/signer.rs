//! `kubectl vm signer serve`: the in-cluster SSH certificate signer (an aggregated API server
//! behind APIService v1alpha1.ssh.kubevm.io). `ca init --signer` deploys it; it runs as the
//! Deployment's container, with its ServiceAccount (or `--kubeconfig` when run by hand).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use kubevm::ca::store::DEFAULT_CA_NAMESPACE;
use kubevm::signer::policy::Limits;
use kubevm::signer::server::{self, ConnectionLimits, RequestHeaderConfig, ServeOptions, Signer};

use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// How often the signer re-reads ConfigMap kube-system/extension-apiserver-authentication.
const REQUESTHEADER_RESYNC: Duration = Duration::from_secs(5);

/// Arguments of `signer`.
#[derive(Debug, Args)]
#[command(
    after_help = "The signer is the only holder of the SSH CA's private key. Install it with\n`kubectl vm ca init --signer --image IMAGE`; it writes one JSON audit line per issuance on stdout.\n\nExamples:\n  kubectl-vm signer serve --tls-cert-file tls.crt --tls-private-key-file tls.key"
)]
pub struct SignerArgs {
    #[command(subcommand)]
    pub command: SignerCommand,
}

/// The `signer` subcommands.
#[derive(Debug, Subcommand)]
pub enum SignerCommand {
    /// Serve ssh.kubevm.io/v1alpha1 until SIGTERM or Ctrl-C
    Serve(ServeArgs),
}

/// Arguments of `signer serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address and port to listen on
    #[arg(long, value_name = "ADDRESS:PORT", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,

    /// PEM serving certificate (the APIService's caBundle must sign it)
    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub tls_cert_file: PathBuf,

    /// PEM private key of the serving certificate
    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub tls_private_key_file: PathBuf,

    /// Namespace of the CA Secret
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_CA_NAMESPACE)]
    pub ca_namespace: String,

    /// Lifetime of a user certificate when the request names none
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = kubevm::cluster::parse_duration)]
    pub default_ttl: Duration,

    /// Longest user certificate lifetime issued; longer requests are refused
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = kubevm::cluster::parse_duration)]
    pub max_ttl: Duration,

    /// Smallest RSA key certified, in bits (ed25519, ECDSA and sk-* keys are always accepted)
    #[arg(long, value_name = "BITS", default_value_t = kubevm::signer::sign::DEFAULT_MIN_RSA_BITS,
        value_parser = clap::value_parser!(u32).range(2048..=16384))]
    pub min_rsa_bits: u32,
}

pub async fn cmd_signer(global: &GlobalArgs, args: SignerArgs) -> CommandResult {
    let SignerCommand::Serve(args) = args.command;
    kubevm::target::validate_namespace(&args.ca_namespace)
        .map_err(|e| CommandError::usage(format!("--ca-namespace: {e}")))?;
    if args.default_ttl.is_zero() || args.default_ttl > args.max_ttl {
        return Err(CommandError::usage(
            "--default-ttl must be more than 0 and at most --max-ttl",
        ));
    }
    for file in [&args.tls_cert_file, &args.tls_private_key_file] {
        if !file.is_file() {
            return Err(CommandError::usage(format!(
                "{}: no such file",
                file.display()
            )));
        }
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    // Unusable front-proxy settings stop the signer here (fail closed); later changes are
    // picked up while it runs.
    let (requestheader, version) = RequestHeaderConfig::load(&cluster)
        .await
        .map_err(|e| CommandError::Failed(format!("front-proxy settings: {e}")))?;
    let options = ServeOptions {
        listen: args.listen,
        tls_cert_file: args.tls_cert_file,
        tls_key_file: args.tls_private_key_file,
        ca_namespace: args.ca_namespace,
        limits: Limits {
            default_ttl: args.default_ttl,
            max_ttl: args.max_ttl,
            ..Default::default()
        },
        connections: ConnectionLimits::default(),
        min_rsa_bits: args.min_rsa_bits,
        requestheader_resync: REQUESTHEADER_RESYNC,
    };
    let listener = server::bind(&options)
        .await
        .map_err(|e| CommandError::Failed(e.to_string()))?;
    let address = listener.local_addr()?;
    let ca_namespace = options.ca_namespace.clone();
    let signer = Signer::new(
        cluster,
        platform.flavor,
        requestheader,
        version,
        options,
        // One JSON line per record; stdout is the container log.
        Arc::new(|record| println!("{record}")),
    )
    .map_err(|e| CommandError::Failed(e.to_string()))?;
    println!(
        "{}",
        serde_json::json!({"event": "listening", "address": address.to_string(),
            "flavor": platform.flavor.as_str(), "caNamespace": ca_namespace})
    );
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        served = Arc::new(signer).serve(listener) => served.map_err(|e| CommandError::Failed(e.to_string())),
        _ = terminate.recv() => Ok(()),
    }
}
