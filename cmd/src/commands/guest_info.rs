//! `kubectl vm guestosinfo|userlist|fslist VM`: what the guest agent reports (virtctl's
//! names), as a table or `-o yaml|json`.

use std::io::Write;

use clap::Args;
use clap_complete::engine::ArgValueCompleter;
use kubevm::guest_info::{self, Fact};
use kubevm::target::Target;

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::render::{OutputFormat, Table, cell};

/// Arguments of `guestosinfo`, `userlist` and `fslist`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: the VMI's guestosinfo, userlist and filesystemlist subresources (the guest needs\nqemu-guest-agent). Deckhouse: the OS from the VM's status.guestOSInfo; it publishes no users or\nfilesystems.\n\nExamples:\n  kubectl vm guestosinfo web\n  kubectl vm userlist web.prod\n  kubectl vm fslist web -o json"
)]
pub struct GuestInfoArgs {
    /// The VM: NAME, NAME.NAMESPACE, vm/NAME or vmi/NAME
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Output format: yaml or json (the platform's answer) instead of the table
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<OutputFormat>,
}

pub async fn cmd_guest_info(global: &GlobalArgs, fact: Fact, args: GuestInfoArgs) -> CommandResult {
    if matches!(args.output, Some(OutputFormat::Wide | OutputFormat::Name)) {
        return Err(CommandError::usage("-o takes yaml or json here"));
    }
    let target = Target::parse(&args.target, false)?;
    if let Some(flag) = global.namespace.as_deref() {
        target.namespace_in(flag, true)?;
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    let value = guest_info::read(&cluster, platform.flavor, &namespace, &target.name, fact).await?;
    let mut out = std::io::stdout().lock();
    if let Some(format) = args.output {
        crate::render::write_object(&mut out, &value, format)?;
        return Ok(());
    }
    let rows = guest_info::rows(fact, &value);
    if rows.is_empty() {
        let what = match fact {
            Fact::Users => "No users are logged in",
            _ => "The agent reports no filesystems",
        };
        eprintln!("{what} on {}.{namespace}.", target.name);
        return Ok(());
    }
    let mut table = Table::new(guest_info::headers(fact));
    for row in rows {
        table.push(row.into_iter().map(|c| cell(Some(c))).collect());
    }
    table.write(&mut out, true)?;
    out.flush()?;
    Ok(())
}
