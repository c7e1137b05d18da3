//! `kubectl vm disk list|attach|detach VM`: a VM's disks, and hotplugging one into a running
//! VM (KubeVirt addvolume/removevolume, Deckhouse VirtualMachineBlockDeviceAttachment).

use std::io::Write;

use clap::{Args, Subcommand, ValueEnum};
use clap_complete::engine::ArgValueCompleter;
use kubevm::disk::{
    self, AttachRequest, Bus, DryRun as LibDryRun, Event, GuestSees, Options, Outcome,
};
use kubevm::quantity::Quantity;
use kubevm::target::{Target, TargetKind};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::flags::{ChangeFormat, DryRun, WaitArgs};
use crate::render::{OutputFormat, Table, cell};

/// Arguments of `disk`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: PUT …/virtualmachines/VM/addvolume|removevolume; the change is kept in the VM's\ntemplate and a running VM gets it live (hotplug buses: scsi, virtio). Deckhouse: a\nVirtualMachineBlockDeviceAttachment VM-DISK made here; detach deletes it (SCSI, images\nread-only). A new disk (--size) is a blank DataVolume / VirtualDisk made here; detach keeps it.\n\nExamples:\n  kubectl vm disk list web\n  kubectl vm disk attach web data --size 10Gi\n  kubectl vm disk attach web pvc/shared --read-only --serial SHARED1\n  kubectl vm disk attach linux-vm cvi/ubuntu-iso\n  kubectl vm disk detach web data\n  kubectl vm disk resize web data --size 20Gi\n\nresize grows the claim behind the disk (KubeVirt) or the VirtualDisk (Deckhouse); it is\nrefused before any change unless the size is larger and the StorageClass has\nallowVolumeExpansion: true."
)]
pub struct DiskArgs {
    #[command(subcommand)]
    pub command: DiskCommand,
}

/// The `disk` subcommands.
#[derive(Debug, Subcommand)]
pub enum DiskCommand {
    /// List a VM's disks: source, bus, size, serial, hotplugged, attachment state
    List(ListArgs),
    /// Attach an existing disk or image, or a new blank disk (--size), to a VM
    Attach(AttachArgs),
    /// Detach a hotplugged disk from a VM (the disk itself is kept)
    Detach(DetachArgs),
    /// Grow a disk: its PersistentVolumeClaim (KubeVirt) or VirtualDisk (Deckhouse)
    Resize(ResizeArgs),
}

/// Arguments of `disk resize`.
#[derive(Debug, Args)]
pub struct ResizeArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// The disk's name in the VM (as `disk list` shows it) or its claim / VirtualDisk name
    #[arg(value_name = "DISK")]
    pub disk: String,

    /// The new size (e.g. 20Gi); it must be larger than the disk's
    #[arg(long, value_name = "SIZE", required = true)]
    pub size: String,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would be done: client or server (see attach)
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format of the result (default: a sentence)
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ChangeFormat>,
}

/// Arguments of `disk list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Output format: yaml or json instead of the table
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<OutputFormat>,
}

/// Bus of a hotplugged KubeVirt disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BusArg {
    /// SCSI (default)
    Scsi,
    /// virtio-blk
    Virtio,
}

/// Arguments of `disk attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// The disk: [pvc/|dv/]NAME (KubeVirt) or [vd/|vi/|cvi/]NAME (Deckhouse)
    #[arg(value_name = "DISK", add = ArgValueCompleter::new(complete::disk_names))]
    pub disk: String,

    /// Make a new blank disk of this size (e.g. 10Gi) named DISK first
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,

    /// StorageClass of the new disk (default: the cluster's)
    #[arg(long, value_name = "CLASS", requires = "size")]
    pub storage_class: Option<String>,

    /// KubeVirt: the volume's name in the VM (default: DISK's name)
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// KubeVirt: the disk's bus
    #[arg(long, value_enum, default_value = "scsi")]
    pub bus: BusArg,

    /// KubeVirt: the serial the guest sees, as /dev/disk/by-id/*SERIAL* (default: the volume's
    /// name when it has at most 20 of A-Z a-z 0-9 _ . + -)
    #[arg(long, value_name = "SERIAL")]
    pub serial: Option<String>,

    /// Attach read-only (Deckhouse images always are)
    #[arg(long)]
    pub read_only: bool,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would be done: client (send nothing that changes anything) or server
    /// (the server checks the requests without acting on them)
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format of the result (default: a sentence)
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ChangeFormat>,
}

/// Arguments of `disk detach`.
#[derive(Debug, Args)]
pub struct DetachArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// The disk's name in the VM (as `disk list` shows it) or its PVC / DataVolume / device name
    #[arg(value_name = "DISK")]
    pub disk: String,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would be done: client or server (see attach)
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format of the result (default: a sentence)
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ChangeFormat>,
}

fn target_of(text: &str, global: &GlobalArgs) -> CommandResult<Target> {
    let target = Target::parse(text, false)?;
    if target.kind == TargetKind::Vmi {
        return Err(CommandError::usage(format!(
            "target {target}: disks belong to virtual machines; use vm/{}",
            target.name
        )));
    }
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    Ok(target)
}

fn options(wait: &WaitArgs, dry_run: Option<DryRun>) -> Options {
    Options {
        dry_run: match dry_run.unwrap_or(DryRun::None) {
            DryRun::None => LibDryRun::None,
            DryRun::Client => LibDryRun::Client,
            DryRun::Server => LibDryRun::Server,
        },
        wait: !wait.no_wait,
        timeout: wait.timeout,
    }
}

/// Hotplug through an aggregated API (KubeVirt's `addvolume`/`removevolume`) is refused
/// before any write when discovery does not list it (a new disk would be made and then not
/// attached); platforms that attach with objects of their own need no such API.
fn require_hotplug(platform: &kubevm::flavor::Platform) -> CommandResult {
    if let Some(api) = kubevm::platform::of(platform.flavor).hotplug {
        platform.require(api.group, api.version, api.resource)?;
    }
    Ok(())
}

/// Progress on stderr.
fn render_event(event: Event) {
    match event {
        Event::Created(what) => eprintln!("{what} created"),
        Event::Accepted(what) => eprintln!("{what} accepted"),
        Event::Removed(what) => eprintln!("{what} deleted again: the attach failed"),
        Event::Phase { phase, message } if message.is_empty() => eprintln!("  {phase}"),
        Event::Phase { phase, message } => eprintln!("  {phase}: {message}"),
    }
}

pub async fn cmd_disk(global: &GlobalArgs, args: DiskArgs) -> CommandResult {
    match args.command {
        DiskCommand::List(a) => list(global, a).await,
        DiskCommand::Attach(a) => attach(global, a).await,
        DiskCommand::Detach(a) => detach(global, a).await,
        DiskCommand::Resize(a) => resize(global, a).await,
    }
}

async fn list(global: &GlobalArgs, args: ListArgs) -> CommandResult {
    if matches!(args.output, Some(OutputFormat::Wide | OutputFormat::Name)) {
        return Err(CommandError::usage("-o takes yaml or json here"));
    }
    let target = target_of(&args.target, global)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let disks = disk::list(&cluster, platform.flavor, &namespace, &target.name).await?;
    let mut out = std::io::stdout().lock();
    if let Some(format) = args.output {
        let value =
            serde_json::to_value(&disks).map_err(|e| CommandError::Failed(e.to_string()))?;
        crate::render::write_object(&mut out, &value, format)?;
        return Ok(());
    }
    let mut table = Table::new(&[
        "NAME", "SOURCE", "BUS", "SIZE", "SERIAL", "TARGET", "HOTPLUG", "RO", "STATE",
    ]);
    for d in &disks {
        table.push(vec![
            cell(Some(&d.name)),
            cell(Some(&d.source)),
            cell(Some(&d.bus)),
            cell(Some(&d.size)),
            cell(Some(&d.serial)),
            cell(Some(&d.target)),
            d.hotplugged.to_string(),
            d.read_only.to_string(),
            cell(Some(&d.state)),
        ]);
    }
    table.write(&mut out, true)?;
    out.flush()?;
    Ok(())
}

fn print_outcome(
    outcome: &Outcome,
    output: Option<ChangeFormat>,
    sentence: String,
) -> CommandResult {
    let mut out = std::io::stdout().lock();
    match output {
        Some(ChangeFormat::Name) => writeln!(out, "{}", outcome.object_ref)?,
        Some(format) => {
            let value = outcome.object.clone().unwrap_or_default();
            let f = if format == ChangeFormat::Json {
                OutputFormat::Json
            } else {
                OutputFormat::Yaml
            };
            crate::render::write_object(&mut out, &value, f)?;
        }
        None => writeln!(out, "{sentence}")?,
    }
    Ok(())
}

fn dry_note(options: &Options) -> &'static str {
    match options.dry_run {
        LibDryRun::Client => " (dry run)",
        LibDryRun::Server => " (server dry run)",
        LibDryRun::None => "",
    }
}

async fn attach(global: &GlobalArgs, args: AttachArgs) -> CommandResult {
    let target = target_of(&args.target, global)?;
    let size = args
        .size
        .as_deref()
        .map(|s| Quantity::parse(s).map_err(|e| CommandError::usage(format!("--size: {e}"))))
        .transpose()?;
    // Everything that needs no platform is checked before the first request (discovery).
    let (kind, name) = disk::parse_source_syntax(&args.disk)?;
    let mut request = AttachRequest {
        kind,
        name,
        size,
        storage_class: args.storage_class.clone(),
        volume: args.name.clone(),
        bus: match args.bus {
            BusArg::Scsi => Bus::Scsi,
            BusArg::Virtio => Bus::Virtio,
        },
        serial: args.serial.clone(),
        read_only: args.read_only,
    };
    request.validate_local()?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    (request.kind, request.name) = disk::parse_source(&args.disk, platform.flavor)?;
    request.validate(platform.flavor)?;
    require_hotplug(&platform)?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let options = options(&args.wait, args.dry_run);
    let outcome = disk::attach(
        &cluster,
        platform.flavor,
        &namespace,
        &target.name,
        &request,
        &options,
        &render_event,
    )
    .await?;
    let when = if options.dry_run != LibDryRun::None {
        String::new()
    } else if !outcome.live {
        "; the VM is not running: the disk is there at its next start".into()
    } else if outcome.waited {
        "; the running guest sees it now, no restart needed".into()
    } else {
        "; not waited for: see `kubectl vm disk list`".into()
    };
    let sentence = format!(
        "disk {} attached to {}{}{when}",
        outcome.disk,
        outcome.vm,
        dry_note(&options)
    );
    print_outcome(&outcome, args.output, sentence)
}

async fn detach(global: &GlobalArgs, args: DetachArgs) -> CommandResult {
    let target = target_of(&args.target, global)?;
    // A volume name or a claim's: a DNS-1123 subdomain either way.
    kubevm::validate::dns_subdomain("disk", &args.disk)
        .map_err(|e| CommandError::usage(e.to_string()))?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let options = options(&args.wait, args.dry_run);
    let outcome = disk::detach(
        &cluster,
        platform.flavor,
        &namespace,
        &target.name,
        &args.disk,
        &options,
        &render_event,
    )
    .await?;
    let sentence = format!(
        "disk {} detached from {}{} (the disk itself is kept)",
        outcome.disk,
        outcome.vm,
        dry_note(&options)
    );
    print_outcome(&outcome, args.output, sentence)
}

async fn resize(global: &GlobalArgs, args: ResizeArgs) -> CommandResult {
    let target = target_of(&args.target, global)?;
    let size =
        Quantity::parse(&args.size).map_err(|e| CommandError::usage(format!("--size: {e}")))?;
    if size.bytes() == 0 {
        return Err(CommandError::usage("--size must be more than 0"));
    }
    kubevm::validate::dns_subdomain("disk", &args.disk)
        .map_err(|e| CommandError::usage(e.to_string()))?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let options = options(&args.wait, args.dry_run);
    let outcome = disk::resize(
        &cluster,
        platform.flavor,
        &namespace,
        &target.name,
        &args.disk,
        size,
        &options,
        &render_event,
    )
    .await?;
    let when = if options.dry_run != LibDryRun::None {
        String::new()
    } else if !outcome.waited {
        "; not waited for: see `kubectl vm disk list`".into()
    } else {
        match outcome.guest {
            GuestSees::Now => "; the running guest sees it now (grow its partition and filesystem there)".into(),
            GuestSees::AfterRestart => "; the running guest sees it after a restart (KubeVirt's ExpandDisks feature gate is off)".into(),
            GuestSees::AtNextStart => "; the VM is not running: it starts with the new size".into(),
        }
    };
    let sentence = match &outcome.pending {
        // The storage grew; the disk shows it once the VM runs (the platform's words).
        Some(why) => format!(
            "disk {} of {} grows from {} to {}, applied at next start: the VM is not running ({why})",
            outcome.disk, outcome.vm, outcome.from, outcome.to
        ),
        None => format!(
            "disk {} of {} grown from {} to {}{}{when}",
            outcome.disk,
            outcome.vm,
            outcome.from,
            outcome.to,
            dry_note(&options)
        ),
    };
    let mut out = std::io::stdout().lock();
    match args.output {
        Some(ChangeFormat::Name) => writeln!(out, "{}", outcome.object_ref)?,
        Some(format) => {
            let value = outcome.object.clone().unwrap_or_default();
            let f = if format == ChangeFormat::Json {
                OutputFormat::Json
            } else {
                OutputFormat::Yaml
            };
            crate::render::write_object(&mut out, &value, f)?;
        }
        None => writeln!(out, "{sentence}")?,
    }
    Ok(())
}
