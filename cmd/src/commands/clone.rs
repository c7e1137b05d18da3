//! `kubectl vm clone SRC NEW`: a new VM with copies of SRC's disks, through the platform's own
//! clone (KubeVirt VirtualMachineClone, Deckhouse VirtualMachineOperation `Clone`).

use std::io::Write;

use clap::{Args, ValueEnum};
use clap_complete::engine::ArgValueCompleter;
use kubevm::clone::{self, CloneRequest, DryRun as LibDryRun, Event};
use kubevm::lifecycle::VmRef;
use kubevm::target::{Target, TargetKind};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::flags::{DryRun, WaitArgs};
use crate::render::OutputFormat;

/// Arguments of `clone`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: a clone.kubevirt.io VirtualMachineClone clone-NEW; the new VM is created stopped,\nwith new claims NEW-<volume>, no MAC address, SMBIOS serial or firmware UUID of the source.\nDeckhouse: a VirtualMachineOperation clone-NEW of type Clone (kept as the record); disks\nSRC-x become NEW-x, and the new VM starts as its runPolicy says. Either way the source is\nnot changed, the new VM and its disks are labelled as kubectl vm's (delete NEW removes them)\nand a taken name is refused before anything is created. The new VM gets its own SSH identity\n(principals, host key and host certificate naming it) in a Secret NEW-cloudinit it owns; the\nuser's own cloud-init data is carried over.\n\nExamples:\n  kubectl vm clone web web-2\n  kubectl vm clone web web-2 --start\n  kubectl vm clone web web-2 --dry-run -o yaml\n  kubectl vm clone linux-vm linux-vm-2 --timeout 10m -o name"
)]
pub struct CloneArgs {
    /// The source VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "SRC", add = ArgValueCompleter::new(complete::vm_names))]
    pub source: String,

    /// The new VM's name (in the source's namespace)
    #[arg(value_name = "NEW")]
    pub target: String,

    /// Start the new VM once it exists
    #[arg(long)]
    pub start: bool,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would be done: client (send nothing) or server (checked, not stored)
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format of the result (default: a sentence): name, or the new VM (the clone
    /// object for dry runs and --no-wait) as json or yaml
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<CloneFormat>,
}

/// `-o` of clone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CloneFormat {
    /// kind.group/NEW
    Name,
    /// As JSON
    Json,
    /// As YAML
    Yaml,
}

fn render_event(event: Event) {
    match event {
        Event::Accepted(what) => eprintln!("{what} accepted"),
        Event::Phase {
            phase,
            detail: Some(detail),
        } => eprintln!("  {phase}: {detail}"),
        Event::Phase { phase, .. } => eprintln!("  {phase}"),
        Event::Labelled(disks) => eprintln!("  labelled as kubectl vm's, with {disks} disk(s)"),
        Event::Starting => eprintln!("  starting"),
        Event::Notice(text) => eprintln!("  {text}"),
    }
}

/// Run `clone`.
pub async fn cmd_clone(global: &GlobalArgs, args: CloneArgs) -> CommandResult {
    let source = Target::parse(&args.source, false)?;
    if source.kind == TargetKind::Vmi {
        return Err(CommandError::usage(format!(
            "source {source}: clone works on virtual machines; use vm/{}",
            source.name
        )));
    }
    if let Some(flag) = global.namespace.as_deref() {
        source.namespace_in(flag, true)?;
    }
    let dry_run = match args.dry_run.unwrap_or(DryRun::None) {
        DryRun::None => LibDryRun::None,
        DryRun::Client => LibDryRun::Client,
        DryRun::Server => LibDryRun::Server,
    };
    let request = |namespace: String| CloneRequest {
        source: VmRef {
            namespace,
            name: source.name.clone(),
        },
        target: args.target.clone(),
        start: args.start,
        wait: !args.wait.no_wait,
        timeout: args.wait.timeout,
        dry_run,
    };
    if args.start && args.wait.no_wait {
        return Err(CommandError::usage(
            "--start needs the clone waited for; drop --no-wait",
        ));
    }
    // Everything checkable before connecting.
    request(String::new()).validate()?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = source.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let request = request(namespace);
    let outcome = clone::clone(&cluster, &platform, &request, &render_event).await?;
    let mut out = std::io::stdout().lock();
    match args.output {
        Some(CloneFormat::Name) => writeln!(out, "{}", outcome.vm_ref)?,
        Some(format) => crate::render::write_object(
            &mut out,
            outcome.vm.as_ref().unwrap_or(&outcome.request_object),
            if format == CloneFormat::Json {
                OutputFormat::Json
            } else {
                OutputFormat::Yaml
            },
        )?,
        None => {
            let what = outcome.request_object["kind"]
                .as_str()
                .unwrap_or("clone")
                .to_ascii_lowercase();
            let name = outcome.request_object["metadata"]["name"]
                .as_str()
                .unwrap_or_default();
            let sentence = match dry_run {
                LibDryRun::Client => format!(
                    "{what}/{name} would clone {} to {} (dry run)",
                    request.source, request.target
                ),
                LibDryRun::Server => format!(
                    "{what}/{name} accepted (server dry run): would clone {} to {}",
                    request.source, request.target
                ),
                LibDryRun::None if !outcome.waited => format!(
                    "{what}/{name} created: cloning {} to {}; not waited for",
                    request.source, request.target
                ),
                LibDryRun::None => format!(
                    "{} cloned from {}{}{}",
                    outcome.vm_ref,
                    request.source,
                    if outcome.disks.is_empty() {
                        String::new()
                    } else {
                        format!(" with disks {}", outcome.disks.join(", "))
                    },
                    if args.start { "; started" } else { "" }
                ),
            };
            writeln!(out, "{sentence}")?
        }
    }
    Ok(())
}
