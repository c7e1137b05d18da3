//! `kubectl vm delete NAME`: the VM, and the disks created for it unless `--keep-disks`.

use std::io::Write;
use std::time::Duration;

use clap::{ArgAction, Args};
use clap_complete::engine::ArgValueCompleter;
use kubevm::delete::pool::PoolDeletePlan;
use kubevm::delete::{self, DeletePlan};
use kubevm::target::{Target, TargetKind};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::{DryRun, GlobalArgs};
use crate::prompt;

/// Arguments of `delete`.
#[derive(Debug, Args)]
#[command(
    after_help = "Disks kubectl vm created for the VM are deleted with it unless --keep-disks, which keeps them so\nthe VM can be recreated from the same declaration with its data. Disks you attached yourself are\nnever deleted. The address object of create --ip goes too unless --keep-ip. NAME may be a pool made by create --replicas: its VMs, their disks and Secrets go too. On a terminal it asks before deleting unless --yes.\n\nExamples:\n  kubectl vm delete web\n  kubectl vm delete web.prod --keep-disks\n  kubectl vm delete linux-vm --keep-ip\n  kubectl vm delete web --dry-run=server\n  kubectl vm delete web -y --wait=false\n  kubectl vm delete pool/web -y"
)]
pub struct DeleteArgs {
    /// The VM, or a pool made by create --replicas: NAME, NAME.NAMESPACE, vm/NAME[/NAMESPACE] or pool/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Keep the disks created for the VM (they are released from it, not deleted)
    #[arg(long)]
    pub keep_disks: bool,

    /// Keep the VirtualMachineIPAddress `create --ip` made (Deckhouse), so the name gets its address again
    #[arg(long)]
    pub keep_ip: bool,

    /// Do not ask for confirmation
    #[arg(short = 'y', long)]
    pub yes: bool,

    /// Wait until the VM and the deleted disks are gone
    #[arg(long, value_name = "BOOL", action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_value_t = true, default_missing_value = "true")]
    pub wait: bool,

    /// How long --wait waits, e.g. 30s, 5m (0: no limit)
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = kubevm::cluster::parse_duration)]
    pub timeout: Duration,

    /// Only print what would be deleted: client (no request changes anything) or server
    /// (the server checks the requests without persisting them)
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,
}

pub async fn cmd_delete(global: &GlobalArgs, args: DeleteArgs) -> CommandResult {
    if let Some(pool) = kubevm::target::parse_pool(&args.target)? {
        if let Some(flag) = global.namespace.as_deref() {
            pool.namespace_in(flag, true)?;
        }
        let (cluster, platform) = crate::connect::connect(global).await?;
        let namespace = pool.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
        let plan = delete::pool::plan(&cluster, &platform, &pool.name, &namespace)
            .await?
            .ok_or_else(|| crate::connect::pool_not_found(&pool.name, &namespace))?;
        return delete_pool(&cluster, &platform, &args, plan).await;
    }
    let target = Target::parse(&args.target, false)?;
    if target.kind == TargetKind::Vmi {
        return Err(CommandError::usage(format!(
            "target {target}: delete removes virtual machines; use vm/{} (to restart only the instance, use `kubectl delete vmi {}`)",
            target.name, target.name
        )));
    }
    // A namespace in the target that -n contradicts is refused before any request.
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let plan = match delete::plan(
        &cluster,
        &platform,
        &target.name,
        &namespace,
        args.keep_disks,
    )
    .await
    {
        Ok(plan) => plan,
        // No VM of that name: maybe a pool made by `create --replicas`.
        Err(e @ kubevm::Error::NotFound { .. }) if target.kind == TargetKind::Vm => {
            let is_vm = matches!(&e, kubevm::Error::NotFound { kind, .. } if kind != "namespace");
            let pool = if is_vm {
                delete::pool::plan(&cluster, &platform, &target.name, &namespace).await?
            } else {
                None
            };
            return match pool {
                Some(pool) => delete_pool(&cluster, &platform, &args, pool).await,
                None => Err(e.into()),
            };
        }
        Err(e) => return Err(e.into()),
    };
    let mut plan = plan;
    plan.keep_ip = args.keep_ip;
    if let Some(pool) = &plan.pool {
        return Err(CommandError::Failed(format!(
            "virtualmachine {:?} is a replica of VirtualMachinePool {pool:?}, which would create it again; delete the pool instead: kubectl vm delete {pool}",
            plan.name
        )));
    }
    let dry_run = args.dry_run.unwrap_or(DryRun::None);
    if dry_run == DryRun::None && !args.yes && prompt::interactive() {
        let question = question(&plan);
        if !prompt::confirm(&question).await? {
            return Err(CommandError::Failed(format!(
                "aborted: virtual machine \"{namespace}/{}\" was not deleted (answer y to confirm, or pass --yes)",
                plan.name
            )));
        }
    }
    // What stays: read before the delete (a graph that cannot be read says nothing).
    let stays = kubevm::deps::graph(&cluster, platform.flavor, &namespace, &plan.name)
        .await
        .map(|g| delete::stays_behind(&plan, &g))
        .unwrap_or_default();
    if dry_run != DryRun::Client {
        delete::execute(&cluster, &plan, dry_run == DryRun::Server).await?;
    }
    print_report(report(&plan), dry_run)?;
    for line in stays {
        eprintln!("Left in place: {line}");
    }
    if args.wait && dry_run == DryRun::None {
        let timeout = wait_limit(&args);
        delete::wait_gone(&cluster, &platform, &plan, timeout).await?;
    }
    Ok(())
}

/// Delete a pool: the KubeVirt VirtualMachinePool (its replicas, their disks and the
/// per-replica Secrets go with it), or on Deckhouse each VM created for the pool.
async fn delete_pool(
    cluster: &kubevm::cluster::Cluster,
    platform: &kubevm::flavor::Platform,
    args: &DeleteArgs,
    plan: PoolDeletePlan,
) -> CommandResult {
    if args.keep_disks {
        return Err(CommandError::usage(format!(
            "--keep-disks cannot be used on pool {:?}: its replicas' disks are made per replica and go with them",
            plan.name
        )));
    }
    if args.keep_ip {
        return Err(CommandError::usage(format!(
            "--keep-ip cannot be used on pool {:?}: create --ip makes no address for pools",
            plan.name
        )));
    }
    let dry_run = args.dry_run.unwrap_or(DryRun::None);
    if dry_run == DryRun::None && !args.yes && prompt::interactive() {
        let names: Vec<&str> = plan.replicas.iter().map(|r| r.name.as_str()).collect();
        let question = format!(
            "Delete pool \"{}/{}\" and its {} virtual machines ({}) with their disks?",
            plan.namespace,
            plan.name,
            names.len(),
            names.join(", ")
        );
        if !prompt::confirm(&question).await? {
            return Err(CommandError::Failed(format!(
                "aborted: pool \"{}/{}\" was not deleted (answer y to confirm, or pass --yes)",
                plan.namespace, plan.name
            )));
        }
    }
    if dry_run != DryRun::Client {
        delete::pool::execute(cluster, &plan, dry_run == DryRun::Server).await?;
    }
    print_report(pool_report(&plan), dry_run)?;
    if args.wait && dry_run == DryRun::None {
        let timeout = wait_limit(args);
        delete::pool::wait_gone(cluster, platform, &plan, timeout).await?;
    }
    Ok(())
}

/// The report's lines on stdout, each marked when nothing was really deleted.
fn print_report(lines: Vec<String>, dry_run: DryRun) -> std::io::Result<()> {
    let suffix = match dry_run {
        DryRun::None => "",
        DryRun::Client => " (dry run)",
        DryRun::Server => " (server dry run)",
    };
    let mut out = std::io::stdout().lock();
    for line in lines {
        writeln!(out, "{line}{suffix}")?;
    }
    out.flush()
}

/// How long `--wait` waits: `--timeout`, where 0 is (practically) forever, as kubectl's.
fn wait_limit(args: &DeleteArgs) -> Duration {
    if args.timeout.is_zero() {
        Duration::from_secs(10 * 365 * 24 * 3600)
    } else {
        args.timeout
    }
}

/// The pool (KubeVirt), then each replica's lines as `delete` prints them, then the Secrets.
fn pool_report(plan: &PoolDeletePlan) -> Vec<String> {
    let mut lines = Vec::new();
    if plan.pool_uid.is_some() {
        lines.push(format!("{} deleted", plan.display()));
    }
    for replica in &plan.replicas {
        lines.extend(report(replica));
    }
    lines.extend(
        plan.secrets
            .iter()
            .map(|s| format!("{} deleted", s.display())),
    );
    lines
}

/// `Delete virtual machine "prod/web" and its 2 disks (web-root, web-data)?`
fn question(plan: &DeletePlan) -> String {
    let names: Vec<&str> = plan.disks.iter().map(|d| d.name.as_str()).collect();
    let disks = match names.len() {
        0 => String::new(),
        1 => format!(" its disk ({})", names[0]),
        n => format!(" its {n} disks ({})", names.join(", ")),
    };
    let disks = match (disks.is_empty(), plan.keep_disks) {
        (true, _) => String::new(),
        (false, false) => format!(" and{disks}"),
        (false, true) => format!(", keeping{disks}"),
    };
    format!(
        "Delete virtual machine \"{}/{}\"{disks}?",
        plan.namespace, plan.name
    )
}

/// The lines printed after the delete, like kubectl's: the VM, then each disk deleted or
/// kept, then the owned Secrets.
fn report(plan: &DeletePlan) -> Vec<String> {
    let mut lines = vec![format!("{} deleted", plan.vm_display())];
    let fate = if plan.keep_disks { "kept" } else { "deleted" };
    lines.extend(
        plan.attachments
            .iter()
            .map(|a| format!("{} deleted", a.display())),
    );
    lines.extend(plan.disks.iter().map(|d| format!("{} {fate}", d.display())));
    let ip_fate = if plan.keep_ip { "kept" } else { "deleted" };
    lines.extend(
        plan.ips
            .iter()
            .map(|i| format!("{} {ip_fate}", i.display())),
    );
    lines.extend(
        plan.secrets
            .iter()
            .map(|s| format!("{} deleted", s.display())),
    );
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubevm::api::DECKHOUSE_VM;
    use kubevm::api::{SECRET, VIRTUAL_DISK};
    use kubevm::delete::Companion;

    fn plan(disks: &[&str], keep_disks: bool) -> DeletePlan {
        DeletePlan {
            vm_kind: DECKHOUSE_VM,
            instance_kind: None,
            name: "web".into(),
            namespace: "prod".into(),
            uid: "u".into(),
            disks: disks
                .iter()
                .map(|d| Companion {
                    kind: VIRTUAL_DISK,
                    name: (*d).into(),
                    owned: false,
                    uid: String::new(),
                })
                .collect(),
            keep_disks,
            ips: vec![],
            keep_ip: false,
            secrets: vec![Companion {
                kind: SECRET,
                name: "web-cloud-init".into(),
                owned: true,
                uid: String::new(),
            }],
            attachments: vec![],
            pool: None,
        }
    }

    #[test]
    fn question_names_the_disks() {
        assert_eq!(
            question(&plan(&["web-root", "web-data"], false)),
            "Delete virtual machine \"prod/web\" and its 2 disks (web-root, web-data)?"
        );
        assert_eq!(
            question(&plan(&["web-root"], true)),
            "Delete virtual machine \"prod/web\", keeping its disk (web-root)?"
        );
        assert_eq!(
            question(&plan(&[], false)),
            "Delete virtual machine \"prod/web\"?"
        );
    }

    #[test]
    fn report_like_kubectl() {
        assert_eq!(
            report(&plan(&["web-root"], true)),
            [
                "virtualmachine.virtualization.deckhouse.io \"web\" deleted",
                "virtualdisk.virtualization.deckhouse.io \"web-root\" kept",
                "secret \"web-cloud-init\" deleted",
            ]
        );
    }
}
