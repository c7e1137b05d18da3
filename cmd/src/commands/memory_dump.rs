//! `memory-dump get|download|remove VM`: flags into [`kubevm::memory_dump`] requests; progress
//! on stderr, one result line on stdout.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use clap_complete::engine::ArgValueCompleter;
use kubevm::export::Format;
use kubevm::lifecycle::VmRef;
use kubevm::memory_dump::download::{DownloadEvent, DownloadRequest, check_transfer};
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
        after_help = "KubeVirt: PUT …/virtualmachines/NAME/memorydump {claimName}, then the VM's\nstatus.memoryDumpRequest is watched until Completed. --create-claim sizes the claim as virtctl does:\nthe VMI's memory request + 100 MiB, plus the storage class's filesystem overhead from CDIConfig\n(5.5% if it cannot be read), rounded up to 1 MiB. Deckhouse: refused (it has no memory dump).\n\nExamples:\n  kubectl vm memory-dump get web --claim-name web-dump --create-claim\n  kubectl vm memory-dump get web --claim-name web-dump --no-wait\n  kubectl vm memory-dump get web -o web.core.gz --format gzip   # dump, then download\n  kubectl vm memory-dump get web            # dump again into the claim already associated"
    )]
    Get(GetArgs),
    /// Download the VM's completed memory dump (an ELF core file) to a file
    #[command(
        after_help = "Waits for the dump to complete, exports its claim with a VirtualMachineExport and fetches the
dump file through the export's `dir` link (KubeVirt serves a memory dump claim as `dir` and
`tar.gz`; virtctl saves the tar.gz, this saves the dump itself): raw with HTTP Range, resumed
after errors, FILE.partial until complete, FILE.sha256 written next to it. --format gzip still
fetches raw (resumable) and gzips the complete file before it takes its name; the sha256 printed
is the dump's (`gzip -dc FILE | sha256sum`), FILE.sha256 the gzip file's. On failure the export
is kept and the message says how to resume (--reuse NAME --resume). Deckhouse: refused.

Examples:
  kubectl vm memory-dump download web -o web.core
  file web.core                 # ELF 64-bit LSB core file, x86-64
  kubectl vm memory-dump download web -o web.core.gz --format gzip
  kubectl vm memory-dump download web -o web.core --reuse export-pvc-web-dump-x7k2p --resume"
    )]
    Download(DownloadArgs),
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

    /// Then download the dump to FILE (as `memory-dump download`)
    #[arg(short = 'o', long, value_name = "FILE", conflicts_with = "no_wait")]
    pub output: Option<PathBuf>,

    /// With -o: how the dump is fetched, as `memory-dump download` does
    #[command(flatten)]
    pub transfer: TransferArgs,

    #[command(flatten)]
    pub wait: WaitArgs,
}

/// Arguments of `memory-dump download`.
#[derive(Debug, Args)]
pub struct DownloadArgs {
    /// The VM: NAME or NAME.NAMESPACE
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// The file to write (the dump itself: an ELF core file)
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: PathBuf,

    #[command(flatten)]
    pub transfer: TransferArgs,
}

/// How a dump is fetched (`download`, `get -o`).
#[derive(Debug, Args)]
pub struct TransferArgs {
    /// raw (the ELF core as served) or gzip (compressed once downloaded)
    #[arg(long, value_name = "FORMAT", default_value = "raw", value_parser = ["raw", "gzip"])]
    pub format: String,

    /// Continue FILE.partial left by an earlier run (with --reuse)
    #[arg(long)]
    pub resume: bool,

    /// Use an existing VirtualMachineExport (one a failed run kept)
    #[arg(long, value_name = "NAME")]
    pub reuse: Option<String>,

    /// Keep the export after a successful download
    #[arg(long, conflicts_with = "reuse")]
    pub keep: bool,

    /// Do not verify the export server's TLS certificate (insecure)
    #[arg(long)]
    pub insecure: bool,

    /// Retries after errors worth retrying (network, 5xx)
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub retries: u32,

    /// How long to wait for the dump to complete and its export to be ready
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = kubevm::cluster::parse_duration)]
    pub download_timeout: Duration,
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

/// The first download flag `get` was given without `-o` (they would be ignored).
fn transfer_flag_without_output(t: &TransferArgs) -> Option<&'static str> {
    [
        (t.format != "raw", "--format"),
        (t.resume, "--resume"),
        (t.reuse.is_some(), "--reuse"),
        (t.keep, "--keep"),
        (t.insecure, "--insecure"),
    ]
    .into_iter()
    .find_map(|(given, flag)| given.then_some(flag))
}

fn check_name(value: &str, flag: &str) -> Result<(), CommandError> {
    kubevm::target::validate_name(value)
        .map_err(|why| CommandError::usage(format!("invalid {flag} {value:?}: {why}")))
}

pub async fn cmd_memory_dump(global: &GlobalArgs, args: MemoryDumpArgs) -> CommandResult {
    match args.command {
        MemoryDumpCommand::Get(a) => get(global, a).await,
        MemoryDumpCommand::Download(a) => download(global, a).await,
        MemoryDumpCommand::Remove(a) => remove(global, a).await,
    }
}

fn download_request(vm: &VmRef, output: PathBuf, transfer: &TransferArgs) -> DownloadRequest {
    let format = if transfer.format == "gzip" {
        Format::Gzip
    } else {
        Format::Raw
    };
    DownloadRequest {
        resume: transfer.resume,
        reuse: transfer.reuse.clone(),
        keep: transfer.keep,
        insecure: transfer.insecure,
        timeout: transfer.download_timeout,
        max_retries: transfer.retries,
        ..DownloadRequest::new(vm.clone(), output, format)
    }
}

async fn fetch(
    cluster: &kubevm::cluster::Cluster,
    platform: &kubevm::flavor::Platform,
    request: &DownloadRequest,
) -> CommandResult {
    let vm = request.vm.name.clone();
    let mut view = crate::commands::export::View::new(std::io::stderr().is_terminal());
    let phase = say(&vm);
    let result =
        memory_dump::download::download(cluster, platform, request, &mut |event| match event {
            DownloadEvent::Dump(e) => phase(e),
            DownloadEvent::Found { claim, file } => {
                eprintln!("{vm}: memory dump {file} in claim {claim}");
            }
            DownloadEvent::Export(e) => view.show(e),
        })
        .await;
    view.finish();
    result?;
    writeln!(
        std::io::stdout().lock(),
        "memory dump of {vm} downloaded to {}",
        request.output.display()
    )?;
    Ok(())
}

async fn download(global: &GlobalArgs, args: DownloadArgs) -> CommandResult {
    let target = Target::parse(&args.target, false)?;
    let t = &args.transfer;
    check_transfer(&args.output, t.resume, t.reuse.as_deref())?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    memory_dump::check(platform.flavor)?;
    let vm = VmRef {
        namespace: target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?,
        name: target.name.clone(),
    };
    let request = download_request(&vm, args.output, &args.transfer);
    fetch(&cluster, &platform, &request).await
}

async fn get(global: &GlobalArgs, args: GetArgs) -> CommandResult {
    let target = Target::parse(&args.target, false)?;
    let t = &args.transfer;
    match &args.output {
        Some(output) => check_transfer(output, t.resume, t.reuse.as_deref())?,
        None => {
            if let Some(flag) = transfer_flag_without_output(t) {
                return Err(CommandError::usage(format!(
                    "{flag} is about the download: pass it with -o FILE"
                )));
            }
        }
    }
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
    drop(out);
    if let Some(output) = args.output {
        let request = download_request(&vm, output, &args.transfer);
        fetch(&cluster, &platform, &request).await?;
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
