//! `kubectl vm network list VM`: a VM's network interfaces, what the VM asks for joined with
//! what the running machine reports (`kubevm::network`).

use clap::{Args, Subcommand};
use kubevm::target::{Target, TargetKind};

use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::render::{self, OutputFormat, Table, cell};

/// Arguments of `network`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: the template's interfaces and networks (pod network, Multus NetworkAttachmentDefinitions)\njoined with the VMI's status.interfaces; Deckhouse: spec.networks (Main, Network, ClusterNetwork)\njoined with status.networks. STATE: attached, plugging, unplugging, detached (KubeVirt state absent),\nremoved (still on the running machine until a restart), stopped. Change them with\n`kubectl vm set network`.\n\nExamples:\n  kubectl vm network list web\n  kubectl vm network list web.prod -o wide\n  kubectl vm network list linux-vm -o yaml"
)]
pub struct NetworkArgs {
    #[command(subcommand)]
    pub command: NetworkCommand,
}

/// The `network` subcommands.
#[derive(Debug, Subcommand)]
pub enum NetworkCommand {
    /// List a VM's network interfaces: network, MAC, IPs and state
    List(ListArgs),
}

/// Arguments of `network list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = clap_complete::engine::ArgValueCompleter::new(crate::complete::vm_names))]
    pub target: String,

    /// Output format: wide (with the binding and the guest's name of it), yaml or json
    #[arg(short = 'o', long, value_parser = ["wide", "yaml", "json"], value_name = "FORMAT")]
    pub output: Option<String>,

    /// Do not print the header row
    #[arg(long)]
    pub no_headers: bool,
}

pub async fn cmd_network(global: &GlobalArgs, args: NetworkArgs) -> CommandResult {
    let NetworkCommand::List(args) = args.command;
    let target = Target::parse(&args.target, false)?;
    if target.kind == TargetKind::Vmi {
        return Err(CommandError::usage(format!(
            "target {target}: network list reads virtual machines; use vm/{}",
            target.name
        )));
    }
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let list = kubevm::network::interfaces(&cluster, &platform, &namespace, &target.name).await?;
    let mut out = std::io::stdout().lock();
    if let Some(f @ ("yaml" | "json")) = args.output.as_deref() {
        let format = if f == "json" {
            OutputFormat::Json
        } else {
            OutputFormat::Yaml
        };
        let value = serde_json::to_value(&list).unwrap_or_default();
        render::write_object(&mut out, &value, format)?;
        return Ok(());
    }
    let wide = args.output.as_deref() == Some("wide");
    let mut headers = vec!["NAME", "NETWORK", "MAC", "IPS", "STATE"];
    if wide {
        headers.insert(2, "BINDING");
        headers.push("GUEST");
    }
    let mut table = Table::new(&headers);
    for i in &list {
        let ips = (!i.ips.is_empty()).then(|| i.ips.join(","));
        let mut row = vec![
            i.name.clone(),
            i.network.clone(),
            cell(i.mac.as_ref()),
            cell(ips.as_ref()),
            i.state.clone(),
        ];
        if wide {
            row.insert(2, cell(i.binding.as_ref()));
            row.push(cell(i.guest_name.as_ref()));
        }
        table.push(row);
    }
    table.write(&mut out, !args.no_headers)?;
    Ok(())
}
