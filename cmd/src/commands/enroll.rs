//! `kubectl vm enroll VM --guest-user U[,U2]`: make a KubeVirt VM that kubectl-vm did not
//! create accept the platform's SSH certificates (and `--remove` to end it).

use std::io::Write;

use clap::Args;
use clap_complete::engine::ArgValueCompleter;
use kubevm::ca::store::DEFAULT_CA_NAMESPACE;
use kubevm::enroll::{self, Activation, EnrollEvent, EnrollOutcome, SecretChange};
use kubevm::target::{Target, TargetKind};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// Arguments of `enroll`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt only. For each guest user a Secret NAME-kubevm-trust-USER (owned by the VM) holds\n`cert-authority,principals=\"USER@NAME.NAMESPACE\" <CA key>` lines, and an accessCredentials entry\nwith qemuGuestAgent propagation writes them into that user's authorized_keys through the guest\nagent: certificates the platform issues for USER on this VM log in, certificates for other VMs or\nusers do not. The guest needs qemu-guest-agent and the user must exist.\n\nA new accessCredentials entry reaches a running VM at its next restart (KubeVirt marks the VM\nRestartRequired); later changes (CA rotation, --remove) are live. KubeVirt replaces the user's\nwhole authorized_keys with the keys of the VM's accessCredentials.\n\nThe guest has no host certificate: the first `kubectl vm ssh` asks to record its host key.\n\nExamples:\n  kubectl vm enroll web --guest-user debian\n  kubectl vm enroll web.prod -u debian,ops\n  kubectl vm enroll web -u debian --remove"
)]
pub struct EnrollArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Guest user(s) that certificates may log in as (comma-separated or repeated)
    #[arg(
        short = 'u',
        long = "guest-user",
        value_name = "USER",
        value_delimiter = ',',
        required = true
    )]
    pub users: Vec<String>,

    /// End the enrollment: the guest drops the trust lines (live while it runs)
    #[arg(long)]
    pub remove: bool,

    /// Namespace holding the platform SSH CA
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_CA_NAMESPACE)]
    pub ca_namespace: String,
}

pub async fn cmd_enroll(global: &GlobalArgs, args: EnrollArgs) -> CommandResult {
    crate::connect::check_ca_namespace(&args.ca_namespace)?;
    let target = Target::parse(&args.target, false)?;
    if target.kind == TargetKind::Vmi {
        return Err(CommandError::usage(format!(
            "target {target}: enroll changes virtual machines; use vm/{}",
            target.name
        )));
    }
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    let users: Vec<String> = args.users.iter().map(|u| u.trim().to_owned()).collect();
    enroll::validate_logins(&users)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let mut lines = Vec::new();
    let mut on_event = |e: EnrollEvent| lines.push(event_line(&e));
    let outcome = if args.remove {
        enroll::unenroll(
            &cluster,
            platform.flavor,
            &namespace,
            &target.name,
            &users,
            &mut on_event,
        )
        .await
    } else {
        enroll::enroll(
            &cluster,
            platform.flavor,
            &args.ca_namespace,
            &namespace,
            &target.name,
            &users,
            &mut on_event,
        )
        .await
    };
    let mut out = std::io::stdout().lock();
    for line in lines.iter().flatten() {
        writeln!(out, "{line}")?;
    }
    let outcome = outcome?;
    for line in summary(&outcome, args.remove) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// One line per event, kubectl style; `None` for nothing worth a line.
fn event_line(event: &EnrollEvent) -> Option<String> {
    match event {
        EnrollEvent::Secret { name, change, .. } => {
            let verb = match change {
                SecretChange::Created => "created",
                SecretChange::Updated => "updated",
                SecretChange::Unchanged => "unchanged",
                SecretChange::Emptied => "emptied",
                SecretChange::Deleted => "deleted",
                SecretChange::Absent => return None,
            };
            Some(format!("secret/{name} {verb}"))
        }
        EnrollEvent::VmUpdated => Some("virtualmachine.kubevirt.io updated".into()),
        EnrollEvent::VmUnchanged => Some("virtualmachine.kubevirt.io unchanged".into()),
    }
}

fn summary(outcome: &EnrollOutcome, removed: bool) -> Vec<String> {
    let vm = &outcome.vm;
    let users = outcome.logins.join(", ");
    let first = &outcome.logins[0];
    if removed {
        return vec![match outcome.activation {
            Activation::NextStart => format!(
                "Enrollment of {users} on {vm} ended: no new certificates; the VM is stopped, so its guest drops the trust lines at its next start (run this again after that to remove the emptied entry)"
            ),
            _ => format!(
                "Enrollment of {users} on {vm} ended: no new certificates, and the running guest drops the trust lines now"
            ),
        }];
    }
    let when = match outcome.activation {
        Activation::Live => format!("Enrolled {users} on {vm}: live in the running guest."),
        Activation::RestartRequired => format!(
            "Enrolled {users} on {vm}: the VM runs without the new accessCredentials, KubeVirt applies them at its next start (RestartRequired): kubectl vm restart {vm}"
        ),
        Activation::NextStart => {
            format!("Enrolled {users} on {vm}: the guest gets the trust when the VM starts.")
        }
    };
    vec![
        when,
        format!(
            "KubeVirt replaces the authorized_keys of {users} with the keys of the VM's accessCredentials."
        ),
        format!("Log in with: kubectl vm ssh {first}@{vm}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_says_when_it_applies() {
        let outcome = EnrollOutcome {
            vm: "web.dev".into(),
            logins: vec!["debian".into()],
            activation: Activation::RestartRequired,
        };
        let lines = summary(&outcome, false);
        assert!(lines[0].contains("kubectl vm restart web.dev"), "{lines:?}");
        assert_eq!(lines[2], "Log in with: kubectl vm ssh debian@web.dev");
        let removed = summary(&outcome, true);
        assert!(
            removed[0].contains("drops the trust lines now"),
            "{removed:?}"
        );
    }
}
