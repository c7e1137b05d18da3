//! `kubectl vm credentials add-ssh-key|remove-ssh-key|set-password VM -u USER`: a guest user's
//! SSH keys and password through KubeVirt's accessCredentials and the guest agent.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use clap_complete::engine::ArgValueCompleter;
use kubevm::credentials::{self, CredentialOutcome, Operation};
use kubevm::enroll::{Activation, SecretChange};
use kubevm::target::{Target, TargetKind};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::prompt;

/// Arguments of `credentials`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt only, through the guest agent (qemu-guest-agent in the guest). Keys live in Secret\nNAME-kubevm-keys-USER, the password in NAME-kubevm-password-USER, both made here and owned by\nthe VM. The first change for a user adds an accessCredentials entry, which a running VM gets at\nits restart (KubeVirt marks it RestartRequired); later changes are live. KubeVirt replaces the\nuser's whole authorized_keys with the keys of the VM's accessCredentials.\n\nExamples:\n  kubectl vm credentials add-ssh-key web -u debian -f ~/.ssh/id_ed25519.pub\n  kubectl vm credentials remove-ssh-key web -u debian --value \"ssh-ed25519 AAAA…\"\n  kubectl vm credentials set-password web -u debian\n  kubectl vm credentials set-password web -u debian --password-file pw.txt"
)]
pub struct CredentialsArgs {
    #[command(subcommand)]
    pub command: CredentialsCommand,
}

/// The `credentials` subcommands.
#[derive(Debug, Subcommand)]
pub enum CredentialsCommand {
    /// Add SSH public keys to a guest user's authorized_keys
    AddSshKey(KeyArgs),
    /// Remove SSH public keys added with add-ssh-key
    RemoveSshKey(KeyArgs),
    /// Set a guest user's password (asked on the terminal, or --password-file)
    SetPassword(PasswordArgs),
}

/// Arguments of `add-ssh-key` and `remove-ssh-key`.
#[derive(Debug, Args)]
pub struct KeyArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// The guest user
    #[arg(short = 'u', long = "guest-user", value_name = "USER", required = true)]
    pub guest_user: String,

    /// A file of public keys, one per line (`-` for stdin)
    #[arg(short = 'f', long = "file", value_name = "FILE", value_hint = clap::ValueHint::FilePath, required_unless_present = "value", conflicts_with = "value")]
    pub file: Option<PathBuf>,

    /// One public key, as in authorized_keys
    #[arg(long, value_name = "KEY")]
    pub value: Option<String>,
}

/// Arguments of `set-password`.
#[derive(Debug, Args)]
pub struct PasswordArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// The guest user
    #[arg(short = 'u', long = "guest-user", value_name = "USER", required = true)]
    pub guest_user: String,

    /// Read the password from the first line of this file (never from the command line)
    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub password_file: Option<PathBuf>,
}

fn target_of(text: &str, global: &GlobalArgs) -> CommandResult<Target> {
    let target = Target::parse(text, false)?;
    if target.kind == TargetKind::Vmi {
        return Err(CommandError::usage(format!(
            "target {target}: credentials change virtual machines; use vm/{}",
            target.name
        )));
    }
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    Ok(target)
}

fn read_keys(args: &KeyArgs) -> CommandResult<Vec<String>> {
    let text = match (&args.file, &args.value) {
        (_, Some(v)) => v.clone(),
        (Some(p), None) if p.as_os_str() == "-" => std::io::read_to_string(std::io::stdin())
            .map_err(|e| CommandError::usage(format!("cannot read public keys from stdin: {e}")))?,
        (Some(p), None) => std::fs::read_to_string(p)
            .map_err(|e| CommandError::usage(format!("cannot read {}: {e}", p.display())))?,
        (None, None) => return Err(CommandError::usage("give --file or --value")),
    };
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

async fn read_password(args: &PasswordArgs) -> CommandResult<String> {
    if let Some(path) = &args.password_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CommandError::usage(format!("cannot read {}: {e}", path.display())))?;
        return Ok(text.lines().next().unwrap_or_default().to_owned());
    }
    if !prompt::interactive() {
        return Err(CommandError::usage(
            "no terminal to ask for the password on: give --password-file FILE",
        ));
    }
    let first = prompt::secret(&format!("New password for {}: ", args.guest_user)).await?;
    let again = prompt::secret("Retype the new password: ").await?;
    if first != again {
        return Err(CommandError::usage("the passwords do not match"));
    }
    Ok(first)
}

pub async fn cmd_credentials(global: &GlobalArgs, args: CredentialsArgs) -> CommandResult {
    let (target, user, operation) = match &args.command {
        CredentialsCommand::AddSshKey(a) => (
            target_of(&a.target, global)?,
            a.guest_user.clone(),
            Operation::AddKeys(read_keys(a)?),
        ),
        CredentialsCommand::RemoveSshKey(a) => (
            target_of(&a.target, global)?,
            a.guest_user.clone(),
            Operation::RemoveKeys(read_keys(a)?),
        ),
        CredentialsCommand::SetPassword(a) => {
            let target = target_of(&a.target, global)?;
            // The user is checked before asking for a password.
            credentials::validate(&a.guest_user, &Operation::SetPassword("-".into()))?;
            (
                target,
                a.guest_user.clone(),
                Operation::SetPassword(read_password(a).await?),
            )
        }
    };
    credentials::validate(&user, &operation)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let outcome = credentials::apply(
        &cluster,
        platform.flavor,
        &namespace,
        &target.name,
        &user,
        &operation,
    )
    .await?;
    let mut out = std::io::stdout().lock();
    for line in report(&outcome, &user, &operation) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

fn report(outcome: &CredentialOutcome, user: &str, operation: &Operation) -> Vec<String> {
    let verb = match outcome.change {
        SecretChange::Created => "created",
        SecretChange::Unchanged => "unchanged",
        _ => "updated",
    };
    let mut lines = vec![format!("secret/{} {verb}", outcome.secret)];
    if outcome.vm_updated {
        lines.push("virtualmachine.kubevirt.io updated".into());
    }
    let vm = &outcome.vm;
    let what = match operation {
        Operation::SetPassword(_) => format!("the password of {user}"),
        _ => format!("{user} has {} key(s) from kubectl vm", outcome.keys),
    };
    lines.push(match outcome.activation {
        Activation::Live => format!("On {vm}: {what}; live in the running guest."),
        Activation::RestartRequired => format!(
            "On {vm}: {what}; the VM runs without the new accessCredentials entry, KubeVirt applies it at its next start (RestartRequired): kubectl vm restart {vm}"
        ),
        Activation::NextStart => format!("On {vm}: {what}; applied when the VM starts."),
    });
    lines
}
