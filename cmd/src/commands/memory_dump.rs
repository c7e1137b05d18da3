//! `memory-dump get|remove VM`: flags into [`kubevm::memory_dump`] requests; progress on
//! stderr, one result line on stdout.

use std::io::Write;

use clap::{Args, Subcommand};
use clap_complete::engine::ArgValueCompleter;
use kubevm::lifecycle::VmRef;
use kubevm::memory_dump::{self, Event, GetRequest, NewClaim};
use kubevm::target::Target;

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::{GlobalArgs, WaitArgs};

/// `memory-dump`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum MemoryDumpCommand {
    /// Dump the memory of a running VM into a claim and wait for it to complete
    #[command(
        after_help = "KubeVirt: PUT …/virtualmachines/NAME/memorydump {claimName}, then the VM's\nstatus.memoryDumpRequest is watched until Completed. --create-claim sizes the claim as virtctl does:\nthe VMI's memory request + 100 MiB, plus the storage class's filesystem overhead from CDIConfig\n(5.5% if it cannot be read), rounded up to 1 MiB. Deckhouse: refused (it has no memory dump).\n\nExamples:\n  kubectl vm memory-dump get web --claim-name web-dump --create-claim\n  kubectl vm memory-dump get web --claim-name web-dump --no-wait\n  kubectl vm memory-dump get web            # dump again into the claim already associated"
    )]
    Get(GetArgs),
    /// Dissociate the dump claim from the VM (the claim and its dump stay)
    #[command(after_help = "Examples:\n  kubectl vm memory-dump remove web")]
    Remove(RemoveArgs),
}

/// Arguments of `memory-dump`.
#[derive(Debug, Args)]
pub struct MemoryDumpArgs {
    #[command(subcommand)]
    pub command: MemoryDumpCommand,
}

/// Arguments of `memory-dump get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// The VM: NAME or NAME.NAMESPACE
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// The claim to dump into (default: the one already associated)
    #[arg(long, value_name = "NAME")]
    pub claim_name: Option<String>,

    /// Create the claim, sized for the VM's memory
    #[arg(long, requires = "claim_name")]
    pub create_claim: bool,

    /// With --create-claim: the claim's storage class
    #[arg(long, value_name = "CLASS", requires = "create_claim")]
    pub storage_class: Option<String>,

    /// With --create-claim: ReadWriteOnce (default) or ReadWriteMany
    #[arg(long, value_name = "MODE", requires = "create_claim")]
    pub access_mode: Option<String>,

    #[command(flatten)]
    pub wait: WaitArgs,
}

/// Arguments of `memory-dump remove`.
#[derive(Debug, Args)]
pub struct RemoveArgs {
    /// The VM: NAME or NAME.NAMESPACE
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    #[command(flatten)]
    pub wait: WaitArgs,
}

fn say(vm: &str) -> impl Fn(Event) + Send + Sync + '_ {
    move |event| match event {
        Event::ClaimCreated { claim, size } => {
            eprintln!("{vm}: claim {claim} created ({size})");
        }
        Event::Requested => eprintln!("{vm}: request accepted"),
        Event::Phase(phase) => eprintln!("{vm}: memory dump {phase}"),
    }
}

fn check_name(value: &str, flag: &str) -> Result<(), CommandError> {
    kubevm::target::validate_name(value)
        .map_err(|why| CommandError::usage(format!("invalid {flag} {value:?}: {why}")))
}

pub async fn cmd_memory_dump(global: &GlobalArgs, args: MemoryDumpArgs) -> CommandResult {
    match args.command {
        MemoryDumpCommand::Get(a) => get(global, a).await,
        MemoryDumpCommand::Remove(a) => remove(global, a).await,
    }
}

async fn get(global: &GlobalArgs, args: GetArgs) -> CommandResult {
    let target = Target::parse(&args.target, false)?;
    if let Some(claim) = &args.claim_name {
        check_name(claim, "--claim-name")?;
    }
    if let Some(sc) = &args.storage_class {
        check_name(sc, "--storage-class")?;
    }
    if let Some(mode) = &args.access_mode {
        memory_dump::check_access_mode(mode)?;
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    memory_dump::check(platform.flavor)?;
    let vm = VmRef {
        namespace: target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?,
        name: target.name.clone(),
    };
    let request = GetRequest {
        vm: vm.clone(),
        claim: args.claim_name.clone(),
        create: args.create_claim.then(|| NewClaim {
            storage_class: args.storage_class.clone(),
            access_mode: args.access_mode.clone(),
        }),
        wait: !args.wait.no_wait,
        timeout: args.wait.timeout,
    };
    let done = memory_dump::get(&cluster, platform.flavor, &request, &say(&vm.name)).await?;
    let mut out = std::io::stdout().lock();
    match done.file_name {
        Some(file) => writeln!(
            out,
            "memory dump of {} completed: {file} in claim {}",
            vm.name, done.claim
        )?,
        None => writeln!(
            out,
            "memory dump of {} requested into claim {}",
            vm.name, done.claim
        )?,
    }
    Ok(())
}

async fn remove(global: &GlobalArgs, args: RemoveArgs) -> CommandResult {
    let target = Target::parse(&args.target, false)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    memory_dump::check(platform.flavor)?;
    let vm = VmRef {
        namespace: target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?,
        name: target.name.clone(),
    };
    let wait = !args.wait.no_wait;
    let claim = memory_dump::remove(
        &cluster,
        platform.flavor,
        &vm,
        wait,
        args.wait.timeout,
        &say(&vm.name),
    )
    .await?;
    let claim = claim
        .map(|c| format!(" (claim {c} kept)"))
        .unwrap_or_default();
    let what = if wait { "removed" } else { "removal requested" };
    writeln!(
        std::io::stdout().lock(),
        "memory dump of {} {what}{claim}",
        vm.name
    )?;
    Ok(())
}
