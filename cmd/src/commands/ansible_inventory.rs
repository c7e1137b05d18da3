//! `kubectl vm ansible-inventory`: the running VMs as an Ansible inventory, reached through
//! the ssh-config settings (written to a private ssh_config that `ansible_ssh_common_args`
//! names).

use std::io::Write;

use clap::{Args, ValueEnum};
use kubevm::ansible_inventory::{self as inventory, Options};
use kubevm::ca::store::{self, DEFAULT_CA_NAMESPACE};
use kubevm::ssh::config::{self, ConfigPaths, Invocation};
use kubevm::ssh::{files, vm as sshvm};
use kubevm::vm::Scope;

use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// Formats of the inventory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InventoryFormat {
    /// The dynamic-inventory script answer (`_meta.hostvars`)
    Json,
    /// The YAML inventory file (`all: hosts: … children: …`)
    Yaml,
    /// The INI inventory file (plain-word variables only)
    Ini,
}

/// Arguments of `ansible-inventory`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
    ansible-inventory -i <(kubectl vm ansible-inventory) --graph\n  \
    ansible all -i <(kubectl vm ansible-inventory -A) -m ping\n  \
    kubectl vm ansible-inventory -A --group-by-label app -o yaml > inventory.yml\n  \
    printf '#!/bin/sh\\nexec kubectl vm ansible-inventory -A \"$@\"\\n' > inv.sh; chmod +x inv.sh; ansible-playbook -i inv.sh site.yml\n\n\
Groups: one per namespace, the comma lists of the annotations ansible.kubevm.io/groups and\n\
ansible.deckhouse.io/groups, and KEY_VALUE per --group-by-label KEY. Host variables: the\n\
annotations vars.ansible.kubevm.io/VAR (and d8's vars.ansible.deckhouse.io/VAR), marked unsafe;\n\
variables that steer the connection (ansible_host, ansible_port, ansible_ssh_*, …) are ignored.")]
pub struct AnsibleInventoryArgs {
    /// Print the whole inventory as a dynamic inventory script does (JSON)
    #[arg(long)]
    pub list: bool,

    /// Print the variables of one host (NAME.NAMESPACE) as a dynamic inventory script does
    #[arg(long, value_name = "HOST")]
    pub host: Option<String>,

    /// Output format (default: yaml, or json with --list/--host)
    #[arg(short, long, value_enum)]
    pub output: Option<InventoryFormat>,

    /// Only VMs whose labels match this selector (e.g. app=web,tier!=db)
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// VMs of all namespaces
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Make groups KEY_VALUE from this label's values (repeatable)
    #[arg(long, value_name = "KEY")]
    pub group_by_label: Vec<String>,

    /// Namespace holding the platform SSH CA
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_CA_NAMESPACE)]
    pub ca_namespace: String,
}

/// Whether stdout is a pipe (`<(…)`, `|`), which gets [`inventory::yaml_pipe_padding`].
fn stdout_is_pipe() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::FileTypeExt;
    std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata())
        .is_ok_and(|m| m.file_type().is_fifo())
}

pub async fn cmd_ansible_inventory(
    global: &GlobalArgs,
    args: AnsibleInventoryArgs,
) -> CommandResult {
    crate::connect::check_ca_namespace(&args.ca_namespace)?;
    let format = check_args(global, &args)?;
    let home = super::ssh_config::home()?;
    let program = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "kubectl-vm".into());
    let inv = Invocation {
        program,
        global_args: super::ssh_config::cluster_flags(global),
    };
    // The generated ssh_config carries these words: checked before any request.
    inv.check().map_err(CommandError::Usage)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let scope = if args.all_namespaces {
        Scope::AllNamespaces
    } else {
        Scope::Namespace(cluster.namespace.clone())
    };
    // One file per cluster selection: KUBECONFIG is inherited by the commands ssh runs.
    let kubeconfig_env = std::env::var("KUBECONFIG").unwrap_or_default();
    let ssh_config_path = inventory::ssh_config_path(
        &home,
        &inv,
        &[
            &cluster.server,
            cluster.context.as_deref().unwrap_or(""),
            &kubeconfig_env,
        ],
    );
    let options = Options {
        group_by_labels: args.group_by_label.clone(),
        ssh_common_args: Some(inventory::ssh_common_args(&ssh_config_path)),
    };
    let mut warn = |event: inventory::Event| eprintln!("Warning: {event}");
    let built = inventory::collect(
        &cluster,
        &platform,
        &scope,
        args.selector.as_deref(),
        &options,
        &mut warn,
    )
    .await?;
    if let Some(host) = &args.host {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &inventory::host_json(&built, host))
            .map_err(std::io::Error::from)?;
        writeln!(out)?;
        return Ok(());
    }
    // Without a CA no host can be verified: say so, the inventory is still right.
    match store::read_public_keys(&cluster, &args.ca_namespace).await {
        Ok(Some(_)) => {}
        Ok(None) => eprintln!(
            "Warning: no SSH CA in namespace {:?}: hosts cannot be verified; create one with `kubectl vm ca init`",
            args.ca_namespace
        ),
        Err(e) => eprintln!("Warning: cannot read the SSH CA: {e}"),
    }
    let text = config::render(
        &inv,
        &ConfigPaths::under(&home),
        sshvm::DEFAULT_USER,
        &built.vms,
    );
    files::write_private(&ssh_config_path, text.as_bytes())?;
    let body = render(&built, format, &mut warn)?;
    // One write: a reader of the pipe sees the padding whole (see yaml_pipe_padding).
    let mut out = std::io::stdout().lock();
    out.write_all(body.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The local checks of the flags, before any request; returns the output format.
fn check_args(global: &GlobalArgs, args: &AnsibleInventoryArgs) -> CommandResult<InventoryFormat> {
    if args.all_namespaces && global.namespace.is_some() {
        return Err(CommandError::usage(
            "-A/--all-namespaces and -n/--namespace cannot be used together",
        ));
    }
    if let Some(selector) = &args.selector {
        kubevm::selector::check(selector)?;
    }
    if args.group_by_label.iter().any(|k| k.trim().is_empty()) {
        return Err(CommandError::usage("--group-by-label needs a label key"));
    }
    if args.list && args.host.is_some() {
        return Err(CommandError::usage(
            "--list and --host cannot be used together",
        ));
    }
    if args.host.is_some() && args.output.is_some_and(|o| o != InventoryFormat::Json) {
        return Err(CommandError::usage("--host prints JSON only"));
    }
    Ok(args.output.unwrap_or(if args.list || args.host.is_some() {
        InventoryFormat::Json
    } else {
        InventoryFormat::Yaml
    }))
}

/// The inventory in the asked format (INI warns of hosts it cannot express).
fn render(
    built: &inventory::Inventory,
    format: InventoryFormat,
    warn: &mut dyn FnMut(inventory::Event),
) -> CommandResult<String> {
    Ok(match format {
        InventoryFormat::Json => {
            let mut s = serde_json::to_string_pretty(&inventory::list_json(built))
                .map_err(std::io::Error::from)?;
            s.push('\n');
            s
        }
        InventoryFormat::Yaml if stdout_is_pipe() => {
            format!(
                "{}{}",
                inventory::yaml_pipe_padding(),
                inventory::yaml(built)
            )
        }
        InventoryFormat::Yaml => inventory::yaml(built),
        InventoryFormat::Ini => inventory::ini(built, warn),
    })
}
