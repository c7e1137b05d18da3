//! `kubectl vm ca init|show|rotate`: the platform SSH certificate authority.

use std::io::Write;

use clap::{Args, Subcommand, ValueEnum};
use clap_complete::engine::ArgValueCompleter;
use kubevm::ca::store::{self, DEFAULT_CA_NAMESPACE, InitOutcome, PublishedKey, RotateOutcome};
use kubevm::ca::{CONFIGMAP_NAME, CaBundle, SECRET_NAME, fingerprint, objects::READER_NAME};
use kubevm::cluster::Cluster;
use serde_json::json;

use crate::cli::GlobalArgs;
use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::render::{self, OutputFormat};

/// Arguments of `ca`.
#[derive(Debug, Args)]
#[command(
    after_help = "The CA's private keys live in Secret kubevm-ssh-ca (administrators only), its public keys in\nConfigMap kubevm-ssh-ca, readable by every authenticated user.\n\nExamples:\n  kubectl vm ca init\n  kubectl vm ca show -o yaml\n  kubectl vm ca rotate\n  kubectl vm ca rotate --finish"
)]
pub struct CaArgs {
    /// Namespace holding the CA
    #[arg(long, global = true, value_name = "NAMESPACE", default_value = DEFAULT_CA_NAMESPACE, add = ArgValueCompleter::new(complete::namespaces))]
    pub ca_namespace: String,

    #[command(subcommand)]
    pub command: CaCommand,
}

/// The `ca` subcommands.
#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Create the CA: an Ed25519 key in a Secret, its public key in a ConfigMap everyone may read
    Init,
    /// Print the trusted public keys with their fingerprints (needs only read access)
    Show(ShowArgs),
    /// Start a key rotation (the old key stays trusted), or finish one with --finish
    Rotate(RotateArgs),
}

/// Arguments of `ca show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Output format (default: a description)
    #[arg(short, long, value_enum)]
    pub output: Option<DataFormat>,
}

/// Arguments of `ca rotate`.
#[derive(Debug, Args)]
pub struct RotateArgs {
    /// Stop trusting the old key(s): run once every VM trusts the new key
    #[arg(long)]
    pub finish: bool,
}

/// `-o` formats of `ca show`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DataFormat {
    /// YAML
    Yaml,
    /// JSON
    Json,
}

pub async fn cmd_ca(global: &GlobalArgs, args: CaArgs) -> CommandResult {
    let ns = args.ca_namespace;
    kubevm::target::validate_namespace(&ns)
        .map_err(|e| CommandError::usage(format!("--ca-namespace: {e}")))?;
    let cluster = Cluster::connect(&global.connect_options()).await?;
    match args.command {
        CaCommand::Init => init(&cluster, &ns).await,
        CaCommand::Show(show_args) => show(&cluster, &ns, show_args.output).await,
        CaCommand::Rotate(rotate_args) => rotate(&cluster, &ns, rotate_args.finish).await,
    }
}

fn no_ca(ns: &str) -> CommandError {
    CommandError::Failed(format!(
        "no SSH CA in namespace {ns:?}; create one with `kubectl vm ca init{}`",
        if ns == DEFAULT_CA_NAMESPACE {
            String::new()
        } else {
            format!(" --ca-namespace {ns}")
        }
    ))
}

/// `256 SHA256:… comment (ED25519)`, as `ssh-keygen -l` prints a key.
fn keygen_line(key: &PublishedKey) -> String {
    let bits = key.bits.map(|b| format!("{b} ")).unwrap_or_default();
    format!(
        "{bits}{} {} ({})",
        key.fingerprint, key.comment, key.algorithm
    )
}

fn signing_line(bundle: &CaBundle) -> String {
    let key = bundle.signing_key().public_key();
    format!("256 {} {} (ED25519)", fingerprint(key), key.comment())
}

async fn init(cluster: &Cluster, ns: &str) -> CommandResult {
    match store::init(cluster, ns).await? {
        InitOutcome::Exists => Err(CommandError::Failed(format!(
            "an SSH CA already exists in namespace {ns:?} (secret {SECRET_NAME}) and is not overwritten; replace its key with `kubectl vm ca rotate`"
        ))),
        InitOutcome::Created {
            bundle,
            namespace_created,
            configmap_created,
            role_created,
            binding_created,
        } => {
            let mut out = std::io::stdout().lock();
            // kubectl's words: `created` for a new object, `configured` for one updated.
            let done = |created: bool| if created { "created" } else { "configured" };
            if namespace_created {
                writeln!(out, "namespace/{ns} created")?;
            }
            writeln!(out, "secret/{SECRET_NAME} created")?;
            writeln!(
                out,
                "configmap/{CONFIGMAP_NAME} {}",
                done(configmap_created)
            )?;
            writeln!(
                out,
                "role.rbac.authorization.k8s.io/{READER_NAME} {}",
                done(role_created)
            )?;
            writeln!(
                out,
                "rolebinding.rbac.authorization.k8s.io/{READER_NAME} {}",
                done(binding_created)
            )?;
            writeln!(
                out,
                "SSH CA created in namespace {ns:?}, signing key: {}",
                signing_line(&bundle)
            )?;
            Ok(())
        }
    }
}

async fn show(cluster: &Cluster, ns: &str, format: Option<DataFormat>) -> CommandResult {
    let keys = store::published_keys(cluster, ns)
        .await?
        .ok_or_else(|| no_ca(ns))?;
    let rotating = keys.len() > 1;
    let mut out = std::io::stdout().lock();
    if let Some(format) = format {
        let value = json!({
            "namespace": ns,
            "configMap": CONFIGMAP_NAME,
            "rotationInProgress": rotating,
            "keys": keys.iter().map(|k| json!({
                "role": if k.signing { "signing" } else { "trusted" },
                "fingerprint": k.fingerprint,
                "algorithm": k.algorithm,
                "bits": k.bits,
                "comment": k.comment,
                "publicKey": k.openssh,
            })).collect::<Vec<_>>(),
        });
        let format = match format {
            DataFormat::Yaml => OutputFormat::Yaml,
            DataFormat::Json => OutputFormat::Json,
        };
        render::write_object(&mut out, &value, format)?;
        return Ok(());
    }
    writeln!(out, "{:<12}{ns}", "Namespace:")?;
    writeln!(out, "{:<12}configmap/{CONFIGMAP_NAME}", "Published:")?;
    let rotation = if rotating {
        "in progress: the old key stays trusted until `kubectl vm ca rotate --finish`"
    } else {
        "none"
    };
    writeln!(out, "{:<12}{rotation}", "Rotation:")?;
    writeln!(out, "Keys (oldest first):")?;
    for key in &keys {
        let role = if key.signing { "signing" } else { "trusted" };
        writeln!(out, "  {role:<10}{}", keygen_line(key))?;
        writeln!(out, "  {:<10}{}", "", key.openssh)?;
    }
    Ok(())
}

async fn rotate(cluster: &Cluster, ns: &str, finish: bool) -> CommandResult {
    let mut out = std::io::stdout().lock();
    match store::rotate(cluster, ns, finish).await? {
        RotateOutcome::NoCa => Err(no_ca(ns)),
        RotateOutcome::AlreadyRotating { bundle } => Err(CommandError::Failed(format!(
            "a rotation is already in progress in namespace {ns:?} ({} keys trusted); finish it with `kubectl vm ca rotate --finish` before starting another",
            bundle.fingerprints().len()
        ))),
        RotateOutcome::NotRotating { bundle } => Err(CommandError::Failed(format!(
            "no rotation is in progress in namespace {ns:?} (one key, {}); start one with `kubectl vm ca rotate`",
            bundle.fingerprints()[0]
        ))),
        RotateOutcome::Started { bundle } => {
            let fingerprints = bundle.fingerprints();
            writeln!(
                out,
                "Rotation started in namespace {ns:?}: new signing key: {}",
                signing_line(&bundle)
            )?;
            for old in &fingerprints[..fingerprints.len() - 1] {
                writeln!(
                    out,
                    "Still trusted until `kubectl vm ca rotate --finish`: {old}"
                )?;
            }
            writeln!(
                out,
                "Finish the rotation once every VM trusts the new key (VMs read it when they are created or restarted)."
            )?;
            Ok(())
        }
        RotateOutcome::Finished { bundle, dropped } => {
            writeln!(
                out,
                "Rotation finished in namespace {ns:?}: signing key: {}",
                signing_line(&bundle)
            )?;
            for old in dropped {
                writeln!(out, "No longer trusted: {old}")?;
            }
            Ok(())
        }
    }
}
