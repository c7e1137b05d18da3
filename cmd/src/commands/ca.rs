//! `kubectl vm ca init|show|rotate`: the platform SSH certificate authority.

use std::io::Write;

use clap::{Args, Subcommand, ValueEnum};
use clap_complete::engine::ArgValueCompleter;
use kubevm::ca::propagate;
use kubevm::ca::store::{self, DEFAULT_CA_NAMESPACE, InitOutcome, PublishedKey, RotateOutcome};
use kubevm::ca::{CONFIGMAP_NAME, CaBundle, SECRET_NAME, fingerprint, objects::READER_NAME};
use kubevm::cluster::Cluster;
use kubevm::signer::install;
use serde_json::json;

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::render::{self, OutputFormat};

/// Arguments of `ca`.
#[derive(Debug, Args)]
#[command(
    after_help = "The CA's private keys live in Secret kubevm-ssh-ca (administrators only), its public keys in\nConfigMap kubevm-ssh-ca, readable by every authenticated user.\n\nExamples:\n  kubectl vm ca init\n  kubectl vm ca show -o yaml\n  kubectl vm ca rotate\n  kubectl vm ca rotate --finish\n  kubectl vm ca migrate --dry-run"
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
    /// Create the CA: an Ed25519 key in a Secret, its public key in a ConfigMap everyone may read;
    /// with --signer also the in-cluster signer that alone uses the key
    Init(InitArgs),
    /// Print the trusted public keys with their fingerprints (needs only read access)
    Show(ShowArgs),
    /// Start a key rotation (the old key stays trusted), or finish one with --finish
    Rotate(RotateArgs),
    /// Give VMs made before VM-scoped trust the scoped form (at their next boot)
    Migrate(MigrateArgs),
    /// Revoke a host key, or certificates by serial or key ID: published with the CA keys as a KRL
    Revoke(RevokeArgs),
}

/// Arguments of `ca revoke`.
#[derive(Debug, Args)]
#[command(
    group(clap::ArgGroup::new("what").required(true).args(["key", "serial", "key_id"])),
    after_help = "Everything revoked is published in ConfigMap kubevm-ssh-ca next to the CA keys: host keys in\nrevoked.pub, certificate serials and key IDs in revoked-certs, and all of it as an OpenSSH KRL in\nrevoked.krl (check a certificate with `ssh-keygen -Q -f revoked.krl CERT`). kubectl vm ssh and scp\nrefuse a host presenting a revoked key or host certificate; ssh-known-hosts makes OpenSSH through\nssh-config refuse them too. The KRL is written into the cloud-init of every VM kubectl vm made; the\nguest's sshd refuses revoked user certificates (RevokedKeys) from its next boot.\n\nExamples:\n  kubectl vm ca revoke --key ssh_host_ed25519_key.pub\n  kubectl vm ca revoke --serial 8418127720583771449\n  kubectl vm ca revoke --key-id kubectl-vm:alice:dev/web\n  kubectl vm ca revoke --key-id kubevm-host:dev/web"
)]
pub struct RevokeArgs {
    /// A host key to revoke: a public key or host certificate file (OpenSSH one-line form)
    #[arg(long, value_name = "FILE")]
    pub key: Option<std::path::PathBuf>,

    /// Revoke user and host certificates with this serial number (`ssh-keygen -L` shows it)
    #[arg(long, value_name = "N")]
    pub serial: Option<u64>,

    /// Revoke user and host certificates with this key ID (`ssh-keygen -L` shows it)
    #[arg(long, value_name = "ID")]
    pub key_id: Option<String>,
}

/// Arguments of `ca migrate`.
#[derive(Debug, Args)]
#[command(
    after_help = "VMs kubectl vm created before VM-scoped trust accept any certificate of the CA whose principal is
the login name. The signer issues only LOGIN@NAME.NAMESPACE, so no certificate opens them until
they are migrated: migrate rewrites the trust section of each one's cloud-init Secret (a principals
file per login, AuthorizedPrincipalsFile in the sshd drop-in), effective at the VM's next boot, and
annotates the VM ssh.kubevm.io/trust=vm-scoped. VMs of ours without platform SSH are annotated
none. Only VMs labelled as made by kubectl vm are read, and only a Secret labelled as ours that the
VM references and owns (by uid) is written.

Examples:
  kubectl vm ca migrate --dry-run
  kubectl vm ca migrate && kubectl vm restart web"
)]
pub struct MigrateArgs {
    /// Say what would be done, change nothing
    #[arg(long)]
    pub dry_run: bool,
}

/// Arguments of `ca init`.
#[derive(Debug, Args)]
#[command(
    after_help = "With --signer, users get certificates from the signer through the API server and never read the\nCA Secret. Grant SSH with the ClusterRoles it installs, per namespace or per VM:\n  kubectl create rolebinding alice-ssh -n dev --clusterrole kubevm:ssh --user alice\n  kubectl create role web-ssh -n dev --verb create --resource virtualmachines.ssh.kubevm.io/sshcertificate --resource-name web\n  kubectl create rolebinding alice-web -n dev --role web-ssh --user alice\nand let VM creators get host certificates with kubevm:ssh-host-certificates.\n\nExamples:\n  kubectl vm ca init\n  kubectl vm ca init --signer --image registry.example/kubectl-vm:0.1.0\n  kubectl vm ca init --signer --image registry.example/kubectl-vm:0.1.0 --dry-run=client -o yaml"
)]
pub struct InitArgs {
    /// Also install the SSH signer (Deployment, Service, APIService, RBAC)
    #[arg(long)]
    pub signer: bool,

    /// Container image of the signer (kubectl-vm as its entrypoint; see Containerfile)
    #[arg(long, value_name = "IMAGE", requires = "signer")]
    pub image: Option<String>,

    /// Replicas of the signer's Deployment
    #[arg(long, value_name = "N", default_value_t = 2, requires = "signer", value_parser = clap::value_parser!(u32).range(1..=10))]
    pub replicas: u32,

    /// Longest user certificate lifetime the signer issues
    #[arg(long, value_name = "DURATION", default_value = "1h", requires = "signer", value_parser = kubevm::cluster::parse_duration)]
    pub max_ttl: std::time::Duration,

    /// client: print the signer's manifests without contacting the cluster; server: have the server check them
    #[arg(long, value_name = "MODE", num_args = 0..=1, default_missing_value = "client", value_parser = ["client", "server", "none"], requires = "signer")]
    pub dry_run: Option<String>,

    /// Output format of --dry-run=client
    #[arg(short, long, value_enum)]
    pub output: Option<DataFormat>,
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
#[command(
    after_help = "With --renew-before the CA keys stay as they are: only host certificates ending within the window\nare renewed (for the host key already certified), one line per VM says which were renewed and\nwhich kept, and until when; a VM kept is not written. A renewed certificate reaches the guest at\nits next boot.\n\nExamples:\n  kubectl vm ca rotate\n  kubectl vm ca rotate --finish\n  kubectl vm ca rotate --renew-before\n  kubectl vm ca rotate --renew-before 90d"
)]
pub struct RotateArgs {
    /// Stop trusting the old key(s): run once every VM trusts the new key
    #[arg(long)]
    pub finish: bool,

    /// Only renew host certificates that end within DURATION (60d when given without a value:
    /// two monthly reboot cycles); the CA keys are not rotated
    #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "60d", conflicts_with = "finish", value_parser = parse_window)]
    pub renew_before: Option<std::time::Duration>,
}

/// A `--renew-before` window: a duration (`30d`, `720h`) of more than zero.
fn parse_window(text: &str) -> Result<std::time::Duration, String> {
    let days = text
        .strip_suffix('d')
        .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
    let window = match days {
        Some(d) => d
            .parse::<u64>()
            .ok()
            .and_then(|d| d.checked_mul(24 * 3600))
            .map(std::time::Duration::from_secs)
            .ok_or_else(|| format!("invalid duration {text:?}"))?,
        None => kubevm::cluster::parse_duration(text)?,
    };
    if window.is_zero() {
        return Err("the window must be more than 0".into());
    }
    Ok(window)
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
    if let CaCommand::Init(init_args) = &args.command
        && init_args.signer
    {
        return init_signer(global, &ns, init_args).await;
    }
    if let CaCommand::Revoke(revoke_args) = &args.command {
        return revoke(global, &ns, revoke_args).await;
    }
    if let CaCommand::Migrate(migrate_args) = &args.command {
        return migrate(global, migrate_args.dry_run).await;
    }
    let cluster = Cluster::connect(&global.connect_options()).await?;
    match args.command {
        CaCommand::Init(_) => init(&cluster, &ns).await,
        CaCommand::Show(show_args) => show(&cluster, &ns, show_args.output).await,
        CaCommand::Rotate(RotateArgs {
            renew_before: Some(window),
            ..
        }) => renew(&cluster, &ns, window).await,
        CaCommand::Rotate(rotate_args) => rotate(&cluster, &ns, rotate_args.finish).await,
        CaCommand::Migrate(_) | CaCommand::Revoke(_) => unreachable!("handled above"),
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

fn data_format(format: DataFormat) -> OutputFormat {
    match format {
        DataFormat::Yaml => OutputFormat::Yaml,
        DataFormat::Json => OutputFormat::Json,
    }
}

/// `ca init --signer`: the CA if missing, then the signer's objects (server-side apply).
async fn init_signer(global: &GlobalArgs, ns: &str, args: &InitArgs) -> CommandResult {
    let image = args
        .image
        .clone()
        .filter(|i| !i.trim().is_empty())
        .ok_or_else(|| {
            CommandError::usage("--signer needs --image IMAGE (built from the Containerfile)")
        })?;
    if args.max_ttl.is_zero() {
        return Err(CommandError::usage("--max-ttl must be more than 0"));
    }
    let dry_run = args.dry_run.as_deref().filter(|m| *m != "none");
    if args.output.is_some() && dry_run != Some("client") {
        return Err(CommandError::usage("-o goes with --dry-run=client"));
    }
    let options = install::InstallOptions {
        namespace: ns.to_owned(),
        image,
        replicas: args.replicas,
        max_ttl_seconds: args.max_ttl.as_secs(),
    };
    if dry_run == Some("client") {
        let tls = install::ServingCert::generate(ns)?;
        let list = json!({"apiVersion": "v1", "kind": "List", "items": install::manifests(&options, &tls)});
        let mut out = std::io::stdout().lock();
        render::write_object(
            &mut out,
            &list,
            data_format(args.output.unwrap_or(DataFormat::Yaml)),
        )?;
        eprintln!(
            "Note: the CA itself (Secret and ConfigMap {SECRET_NAME}) is made by `kubectl vm ca init` against the cluster; the signer only reads it."
        );
        return Ok(());
    }
    let cluster = Cluster::connect(&global.connect_options()).await?;
    let mut out = std::io::stdout().lock();
    let server_dry_run = dry_run == Some("server");
    // Keep the serving certificate across re-runs: the APIService's caBundle stays valid.
    let tls = match install::existing_serving_cert(&cluster, ns).await? {
        Some(tls) => tls,
        None => install::ServingCert::generate(ns)?,
    };
    let manifests = install::manifests(&options, &tls);
    // Nothing is written when any of the names is taken by something not ours.
    install::check_ours(&cluster, &manifests).await?;
    if !server_dry_run {
        match store::init(&cluster, ns).await? {
            InitOutcome::Exists => {
                writeln!(out, "secret/{SECRET_NAME} unchanged (the SSH CA exists)")?
            }
            InitOutcome::Created { bundle, .. } => writeln!(
                out,
                "SSH CA created in namespace {ns:?}, signing key: {}",
                signing_line(&bundle)
            )?,
        }
    }
    let suffix = if server_dry_run {
        " (server dry run)"
    } else {
        ""
    };
    for applied in install::apply(
        &cluster,
        &install::manifests(&options, &tls),
        server_dry_run,
    )
    .await?
    {
        let verb = if applied.created {
            "created"
        } else {
            "configured"
        };
        writeln!(out, "{} {verb}{suffix}", applied.object)?;
    }
    if !server_dry_run {
        writeln!(
            out,
            "The signer serves {} once its pods are ready (`kubectl get apiservice {}`). Grant SSH with ClusterRole {} (see `kubectl vm ca init --help`).",
            kubevm::signer::GROUP,
            kubevm::signer::APISERVICE_NAME,
            install::USER_ROLE
        )?;
    }
    Ok(())
}

fn report_trust_update(out: &mut impl Write, update: &propagate::TrustUpdate) -> CommandResult {
    writeln!(
        out,
        "Updated the SSH trust of {} VMs (applied at their next boot){}",
        update.updated.len(),
        if update.updated.is_empty() {
            String::new()
        } else {
            format!(": {}", update.updated.join(", "))
        }
    )?;
    for (vm, why) in &update.skipped {
        writeln!(out, "Not updated: {vm}: {why}")?;
    }
    Ok(())
}

/// Rewrite the enrollment Secrets (`kubectl vm enroll`) with `keys`; a line only when there
/// are any.
async fn update_enrolled(
    cluster: &Cluster,
    out: &mut impl Write,
    keys: &[String],
) -> CommandResult {
    let update = kubevm::enroll::update_enrolled(cluster, keys).await?;
    if !update.updated.is_empty() {
        writeln!(
            out,
            "Updated the SSH trust of {} enrolled VM users (live in running guests): {}",
            update.updated.len(),
            update.updated.join(", ")
        )?;
    }
    for (vm, why) in &update.skipped {
        writeln!(out, "Not updated: {vm}: {why}")?;
    }
    Ok(())
}

/// `Signer (APIService …, Available)` or `Direct (…)`, for `ca show`.
async fn mode_line(cluster: &Cluster) -> CommandResult<(String, bool)> {
    use kubevm::signer::client::{Mode, mode};
    match mode(cluster, None).await? {
        Mode::Signer => {
            let available = install::apiservice_available(cluster).await;
            let state = match available {
                Some((true, _)) => "Available".to_owned(),
                Some((false, why)) => format!("not available: {why}"),
                None => "availability unknown".to_owned(),
            };
            Ok((
                format!("signer: certificates come from APIService {} ({state}); the CA Secret is read by the signer only", kubevm::signer::APISERVICE_NAME),
                true,
            ))
        }
        Mode::Direct => Ok((
            "direct (unsafe): no signer is installed, so users who can read the CA Secret sign their own certificates; install it with `kubectl vm ca init --signer --image IMAGE`".to_owned(),
            false,
        )),
    }
}

/// `ca revoke --key FILE | --serial N | --key-id ID`: the input is read and checked before
/// any request; then the KRL is carried into every VM of ours.
async fn revoke(global: &GlobalArgs, ns: &str, args: &RevokeArgs) -> CommandResult {
    use kubevm::ca::krl;
    let what = match (&args.key, args.serial, &args.key_id) {
        (Some(file), None, None) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| CommandError::usage(format!("--key {}: {e}", file.display())))?;
            let key = kubevm::ssh::cert::host_key_of(&text)
                .map_err(|e| CommandError::usage(format!("--key {}: {e}", file.display())))?;
            store::Revoke::Key(key.key)
        }
        (None, Some(serial), None) => {
            krl::check_serial(serial).map_err(|e| CommandError::usage(format!("--serial: {e}")))?;
            store::Revoke::Serial(serial)
        }
        (None, None, Some(id)) => {
            krl::check_key_id(id).map_err(|e| CommandError::usage(format!("--key-id: {e}")))?;
            store::Revoke::KeyId(id.clone())
        }
        _ => unreachable!("clap requires exactly one of --key, --serial, --key-id"),
    };
    let label = match &what {
        store::Revoke::Key(key) => format!("host key {}", fingerprint(key)),
        store::Revoke::Serial(n) => format!("certificates with serial {n}"),
        store::Revoke::KeyId(id) => format!("certificates with key ID {id:?}"),
    };
    let cluster = Cluster::connect(&global.connect_options()).await?;
    let mut out = std::io::stdout().lock();
    let krl = match store::revoke(&cluster, ns, &what).await? {
        store::RevokeOutcome::NoCa => return Err(no_ca(ns)),
        store::RevokeOutcome::AlreadyRevoked => {
            writeln!(out, "{label}: already revoked")?;
            return Ok(());
        }
        store::RevokeOutcome::Added { count, krl } => {
            let kind = match &what {
                store::Revoke::Key(_) => "host keys",
                store::Revoke::Serial(_) => "serials",
                store::Revoke::KeyId(_) => "key IDs",
            };
            writeln!(
                out,
                "revoked {label} ({count} {kind} revoked in configmap/{CONFIGMAP_NAME} in {ns:?}, KRL {}); ssh, scp and ssh-config refuse it from now on",
                krl::KRL_KEY
            )?;
            krl
        }
    };
    // The guests' sshd learns it at their next boot.
    let keys = store::read_public_keys(&cluster, ns)
        .await?
        .ok_or_else(|| no_ca(ns))?;
    let update =
        propagate::update_vm_trust::<propagate::CaCertifier>(&cluster, &keys, &krl, None).await?;
    writeln!(
        out,
        "Updated the revocation list of {} VMs (their sshd refuses it from their next boot){}",
        update.updated.len(),
        if update.updated.is_empty() {
            String::new()
        } else {
            format!(": {}", update.updated.join(", "))
        }
    )?;
    for (vm, why) in &update.skipped {
        writeln!(out, "Not updated: {vm}: {why}")?;
    }
    Ok(())
}

/// `ca migrate`: one line per VM that had no trust annotation.
async fn migrate(global: &GlobalArgs, dry_run: bool) -> CommandResult {
    use kubevm::ca::migrate::Outcome;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let results = kubevm::ca::migrate::migrate(&cluster, platform.flavor, dry_run).await?;
    let mut out = std::io::stdout().lock();
    if results.is_empty() {
        writeln!(
            out,
            "Every VM kubectl vm made already has VM-scoped trust (or none): nothing to migrate."
        )?;
        return Ok(());
    }
    let mut migrated = 0;
    for vm in &results {
        let target = format!("{}.{}", vm.name, vm.namespace);
        match &vm.outcome {
            Outcome::Migrated { logins } if dry_run => writeln!(
                out,
                "{target}: would write scoped trust for {} (dry run)",
                logins.join(", ")
            )?,
            Outcome::Migrated { logins } => {
                migrated += 1;
                writeln!(
                    out,
                    "{target}: scoped trust written for {}, takes effect at next boot",
                    logins.join(", ")
                )?
            }
            Outcome::NoPlatformTrust => writeln!(
                out,
                "{target}: no platform SSH trust in its cloud-init; {}marked trust=none",
                if dry_run { "would be " } else { "" }
            )?,
            Outcome::Skipped(why) => writeln!(out, "{target}: skipped: {why}")?,
        }
    }
    if migrated > 0 {
        writeln!(
            out,
            "Restart the migrated VMs (`kubectl vm restart NAME`) for their guests to apply it."
        )?;
    }
    Ok(())
}

async fn show(cluster: &Cluster, ns: &str, format: Option<DataFormat>) -> CommandResult {
    let keys = store::published_keys(cluster, ns)
        .await?
        .ok_or_else(|| no_ca(ns))?;
    let rotating = keys.len() > 1;
    let (mode, signer) = mode_line(cluster).await?;
    let mut out = std::io::stdout().lock();
    if let Some(format) = format {
        let value = json!({
            "mode": if signer { "signer" } else { "direct" },
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
        render::write_object(&mut out, &value, data_format(format))?;
        return Ok(());
    }
    writeln!(out, "{:<12}{mode}", "Mode:")?;
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

/// `ca rotate --renew-before WINDOW`: one line per VM, then a summary.
async fn renew(cluster: &Cluster, ns: &str, window: std::time::Duration) -> CommandResult {
    use kubevm::ca::renew::{Renewal, renew_expiring};
    let keys = store::read_public_keys(cluster, ns)
        .await?
        .ok_or_else(|| no_ca(ns))?;
    let results = match kubevm::signer::client::mode(cluster, None).await? {
        kubevm::signer::client::Mode::Signer => {
            renew_expiring(cluster, &keys, &propagate::SignerCertifier(cluster), window).await?
        }
        kubevm::signer::client::Mode::Direct => {
            let bundle = store::read_bundle(cluster, ns).await?.ok_or_else(|| {
                CommandError::Failed(format!(
                    "cannot read the CA Secret in namespace {ns:?} to sign host certificates, and no signer is installed"
                ))
            })?;
            renew_expiring(cluster, &keys, &propagate::CaCertifier(&bundle), window).await?
        }
    };
    let at = |t: u64| {
        jiff::Timestamp::from_second(i64::try_from(t).unwrap_or(i64::MAX))
            .map(|t| t.to_string())
            .unwrap_or_else(|_| t.to_string())
    };
    let now = jiff::Timestamp::now().as_second();
    let mut out = std::io::stdout().lock();
    let (mut renewed, mut kept) = (0, 0);
    for (vm, result) in &results {
        match result {
            Renewal::Renewed { was_until, until } => {
                renewed += 1;
                writeln!(
                    out,
                    "{vm}: renewed: valid until {} (was until {})",
                    at(*until),
                    at(*was_until)
                )?
            }
            Renewal::Kept { until } => {
                kept += 1;
                let days = (i64::try_from(*until).unwrap_or(i64::MAX) - now) / 86_400;
                writeln!(
                    out,
                    "{vm}: kept: valid until {} ({days} days left)",
                    at(*until)
                )?
            }
            Renewal::Skipped(why) => writeln!(out, "{vm}: skipped: {why}")?,
        }
    }
    writeln!(
        out,
        "Renewed {renewed} host certificates ending within {}, kept {kept}{}",
        humantime_days(window),
        if renewed > 0 {
            "; each guest reads its new certificate at its next boot"
        } else {
            ""
        }
    )?;
    Ok(())
}

/// `60d`, or seconds when not whole days.
fn humantime_days(window: std::time::Duration) -> String {
    let secs = window.as_secs();
    if secs.is_multiple_of(86_400) {
        format!("{}d", secs / 86_400)
    } else {
        format!("{secs}s")
    }
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
            let keys = bundle
                .public_keys_openssh()
                .map_err(|e| CommandError::Failed(e.to_string()))?;
            // Every VM kubectl-vm made learns the new key, and gets a host certificate of it,
            // at its next boot.
            let krl = store::read_krl(cluster, ns).await?;
            let update = match kubevm::signer::client::mode(cluster, None).await? {
                kubevm::signer::client::Mode::Signer => {
                    propagate::update_vm_trust(
                        cluster,
                        &keys,
                        &krl,
                        Some(&propagate::SignerCertifier(cluster)),
                    )
                    .await?
                }
                kubevm::signer::client::Mode::Direct => {
                    propagate::update_vm_trust(
                        cluster,
                        &keys,
                        &krl,
                        Some(&propagate::CaCertifier(&bundle)),
                    )
                    .await?
                }
            };
            report_trust_update(&mut out, &update)?;
            update_enrolled(cluster, &mut out, &keys).await?;
            writeln!(
                out,
                "Until then user certificates stay signed by the old key, which every VM trusts. Restart the VMs (they read the new key at boot), then finish the rotation."
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
            let keys = bundle
                .public_keys_openssh()
                .map_err(|e| CommandError::Failed(e.to_string()))?;
            let krl = store::read_krl(cluster, ns).await?;
            let update =
                propagate::update_vm_trust::<propagate::CaCertifier>(cluster, &keys, &krl, None)
                    .await?;
            report_trust_update(&mut out, &update)?;
            update_enrolled(cluster, &mut out, &keys).await?;
            Ok(())
        }
    }
}
