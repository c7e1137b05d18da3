//! `kubectl vm deps VM` (alias `objectgraph`): what a VM depends on and what depends on it, as
//! a tree or `-o json|yaml` for backup tools.

use std::io::Write;

use clap::Args;
use clap_complete::engine::ArgValueCompleter;
use kubevm::target::Target;

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::render::OutputFormat;

/// Arguments of `deps`.
#[derive(Debug, Args)]
#[command(
    after_help = "Depends on: the VMI and its launcher pod, disks (DataVolumes and PVCs; Deckhouse VirtualDisks,\nimages, attachments), Secrets (user data, access credentials), ConfigMaps, instance types and\npreferences, networks, the class and IP address on Deckhouse. Depended on by: snapshots, exports\nand Services (made by `expose` or selecting the VM's pod). Owned by: a VirtualMachinePool.\nOn KubeVirt the first part comes from the VM's objectgraph subresource where served (the\nObjectGraph feature gate), else it is computed like it; the rest is computed from the objects.\n\nExamples:\n  kubectl vm deps web\n  kubectl vm objectgraph web.prod -o json"
)]
pub struct DepsArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Output format: yaml or json instead of the tree
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<OutputFormat>,
}

pub async fn cmd_deps(global: &GlobalArgs, args: DepsArgs) -> CommandResult {
    if matches!(args.output, Some(OutputFormat::Wide | OutputFormat::Name)) {
        return Err(CommandError::usage("-o takes yaml or json here"));
    }
    let target = Target::parse(&args.target, false)?;
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let graph = kubevm::deps::graph(&cluster, platform.flavor, &namespace, &target.name).await?;
    let mut out = std::io::stdout().lock();
    if let Some(format) = args.output {
        let value =
            serde_json::to_value(&graph).map_err(|e| CommandError::Failed(e.to_string()))?;
        crate::render::write_object(&mut out, &value, format)?;
        return Ok(());
    }
    for line in kubevm::deps::tree(&graph) {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    Ok(())
}
