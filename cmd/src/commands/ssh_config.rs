//! `kubectl vm ssh-config [--install]` and the helpers it configures: `kubectl vm ssh-cert`
//! (a certificate before each connection) and `kubectl vm ssh-known-hosts` (the CA keys as
//! OpenSSH host trust).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kubevm::ca::store::{self, DEFAULT_CA_NAMESPACE};
use kubevm::ssh::cert;
use kubevm::ssh::config::{self, ConfigPaths, Invocation, VmEntry};
use kubevm::ssh::files;
use kubevm::ssh::vm as sshvm;
use kubevm::vm::Scope;

use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// Arguments of `ssh-config`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  kubectl vm ssh-config\n  kubectl vm --context prod ssh-config --install && ssh web.prod.vm"
)]
pub struct SshConfigArgs {
    /// Write the config under ~/.kube/kubectl-vm and include it from ~/.ssh/config
    #[arg(long)]
    pub install: bool,

    /// Default login name
    #[arg(short = 'l', long = "login", value_name = "USER", default_value = sshvm::DEFAULT_USER)]
    pub login: String,

    /// Namespace holding the platform SSH CA
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_CA_NAMESPACE)]
    pub ca_namespace: String,
}

/// Arguments of `ssh-known-hosts` (run by OpenSSH through `KnownHostsCommand`).
#[derive(Debug, Args)]
pub struct SshKnownHostsArgs {
    /// Type of the key the host offers (OpenSSH's %t; NONE when there is none)
    #[arg(value_name = "KEY_TYPE", requires = "key")]
    pub key_type: Option<String>,

    /// The key the host offers, base64 (OpenSSH's %K): a host certificate revoked by serial or
    /// key ID gets an @revoked line
    #[arg(value_name = "KEY")]
    pub key: Option<String>,

    /// Namespace holding the platform SSH CA
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_CA_NAMESPACE)]
    pub ca_namespace: String,
}

/// Arguments of `ssh-cert` (run by OpenSSH through `Match exec`).
#[derive(Debug, Args)]
pub struct SshCertArgs {
    /// The host: NAME.NAMESPACE.vm
    #[arg(value_name = "HOST")]
    pub host: String,

    /// Login name the certificate is for
    #[arg(short = 'l', long = "login", value_name = "USER", default_value = sshvm::DEFAULT_USER)]
    pub login: String,

    /// Lifetime of the certificate (at most 1h)
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = kubevm::cluster::parse_duration)]
    pub ttl: Duration,

    /// Namespace holding the platform SSH CA
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_CA_NAMESPACE)]
    pub ca_namespace: String,
}

pub(super) fn home() -> CommandResult<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| CommandError::usage("HOME is not set"))
}

/// The global flags that select the cluster, for the generated commands.
pub(super) fn cluster_flags(global: &GlobalArgs) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(k) = &global.kubeconfig {
        let abs = std::path::absolute(k).unwrap_or_else(|_| k.clone());
        out.extend(["--kubeconfig".to_string(), abs.display().to_string()]);
    }
    for (flag, value) in [
        ("--context", &global.context),
        ("--cluster", &global.cluster),
        ("--user", &global.user),
    ] {
        if let Some(v) = value {
            out.extend([flag.to_string(), v.clone()]);
        }
    }
    if global.flavor != "auto" {
        out.extend(["--flavor".to_string(), global.flavor.clone()]);
    }
    out
}

pub async fn cmd_ssh_config(global: &GlobalArgs, args: SshConfigArgs) -> CommandResult {
    if !kubevm::signer::policy::valid_login(&args.login) {
        return Err(CommandError::usage(format!(
            "invalid login {:?}",
            args.login
        )));
    }
    crate::connect::check_ca_namespace(&args.ca_namespace)?;
    let paths = ConfigPaths::under(&home()?);
    let program = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "kubectl-vm".into());
    let inv = Invocation {
        program,
        global_args: cluster_flags(global),
    };
    // Checked before any request: the config must carry these words unchanged.
    inv.check().map_err(CommandError::Usage)?;
    paths.check().map_err(CommandError::Usage)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    // Without a CA there is nothing to trust hosts by (ssh-known-hosts reads it each time).
    store::read_public_keys(&cluster, &args.ca_namespace)
        .await?
        .ok_or_else(|| {
            CommandError::Failed(format!(
                "no SSH CA in namespace {:?}; create one with `kubectl vm ca init`",
                args.ca_namespace
            ))
        })?;
    // VMs whose host the platform does not vouch for (enrolled, foreign) get their own block
    // that lets a key recorded on first use count; all namespaces if allowed, else the current
    // one. Every other `*.vm` host must show a host certificate of the CA.
    let list = match kubevm::vm::list(&cluster, &platform, &Scope::AllNamespaces, None).await {
        Ok(list) => list,
        Err(kubevm::Error::Forbidden { .. }) => {
            kubevm::vm::list(
                &cluster,
                &platform,
                &Scope::Namespace(cluster.namespace.clone()),
                None,
            )
            .await?
        }
        Err(e) => return Err(e.into()),
    };
    let vms: Vec<VmEntry> = list
        .items
        .iter()
        .filter(|v| !v.trust.platform_vouches())
        .map(|v| VmEntry {
            name: v.name.clone(),
            namespace: v.namespace.clone(),
        })
        .collect();
    let text = config::render(&inv, &paths, &args.login, &vms);
    if !args.install {
        print!("{text}");
        return Ok(());
    }
    let user_config = home()?.join(".ssh/config");
    let changed = config::install(&paths, &text, Some(&user_config))
        .map_err(|e| CommandError::Failed(e.to_string()))?;
    println!(
        "wrote {} ({} VMs trusted on first use, all others by host certificate)",
        paths.config.display(),
        vms.len()
    );
    if changed {
        println!(
            "added `{}` to {}",
            config::include_line(&paths),
            user_config.display()
        );
    } else {
        println!("{} already includes it", user_config.display());
    }
    println!("try: ssh NAME.NAMESPACE.vm");
    Ok(())
}

pub async fn cmd_ssh_known_hosts(global: &GlobalArgs, args: SshKnownHostsArgs) -> CommandResult {
    crate::connect::check_ca_namespace(&args.ca_namespace)?;
    let cluster = kubevm::cluster::Cluster::connect(&global.connect_options()).await?;
    let config_map = store::read_configmap(&cluster, &args.ca_namespace)
        .await?
        .ok_or_else(|| {
            CommandError::Failed(format!(
                "no SSH CA in namespace {:?}; create one with `kubectl vm ca init`",
                args.ca_namespace
            ))
        })?;
    let (keys, mut revoked) = store::host_trust_lines(&config_map)?;
    if let (Some(key_type), Some(key)) = (&args.key_type, &args.key) {
        let lists = kubevm::ca::krl::Revocations::from_configmap(&config_map);
        revoked.extend(config::revoked_offered_certificate(&lists, key_type, key));
    }
    print!("{}", config::known_hosts(&keys, &revoked));
    Ok(())
}

pub async fn cmd_ssh_cert(global: &GlobalArgs, args: SshCertArgs) -> CommandResult {
    crate::connect::check_ca_namespace(&args.ca_namespace)?;
    cert::check_ttl(args.ttl).map_err(CommandError::usage)?;
    // Both end up in a file name: only checked names get there.
    let target = config::vm_of_host(&args.host)?;
    if !kubevm::signer::policy::valid_login(&args.login) {
        return Err(CommandError::usage(format!(
            "invalid login {:?}",
            args.login
        )));
    }
    let paths = ConfigPaths::under(&home()?);
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let cert_target = sshvm::CertTarget {
        mode: kubevm::signer::client::mode(&cluster, Some(&platform)).await?,
        flavor: platform.flavor,
        namespace: &namespace,
        vm: &target.name,
        ca_namespace: &args.ca_namespace,
    };
    // OpenSSH may forward ports and open a terminal: the certificate allows both.
    let spec = kubevm::signer::CertificateRequestSpec {
        login: Some(args.login.clone()),
        ttl_seconds: Some(args.ttl.as_secs()),
        pty: true,
        port_forwarding: true,
        ..Default::default()
    };
    // Notices go to stderr, which OpenSSH shows for `Match exec`.
    let notice = |event: sshvm::SshEvent| {
        if let sshvm::SshEvent::Notice(text) = event {
            eprintln!("Notice: {text}");
        }
    };
    let key = config::stable_key(&paths.key).map_err(|e| CommandError::Failed(e.to_string()))?;
    let id = sshvm::issue_certificate(&cluster, &cert_target, key, spec, &notice)
        .await
        .map_err(|e| CommandError::Failed(e.to_string()))?
        .ok_or_else(|| {
            CommandError::Failed(format!(
                "cannot read the SSH CA (Secret {}/{}) and the cluster has no SSH signer: use your own key with ssh -i",
                args.ca_namespace,
                kubevm::ca::SECRET_NAME
            ))
        })?;
    let (_, cert) = id
        .openssh_files()
        .map_err(|e| CommandError::Failed(e.to_string()))?;
    // Atomic replace: a connection reads the old or the new certificate, both for the key.
    files::write_private(&paths.certificate(&args.login, &args.host), cert.as_bytes())?;
    Ok(())
}
