//! The command line: global connection flags (accepted before or after any subcommand, as
//! kubectl does not pass its own to plugins) and one variant per command.

use clap::{Parser, Subcommand};

use crate::commands;
use crate::flags::GlobalArgs;

/// Manage virtual machines on KubeVirt and Deckhouse virtualization.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-vm",
    bin_name = "kubectl vm",
    version,
    propagate_version = true,
    max_term_width = 100,
    after_help = "Runs as a kubectl plugin: `kubectl vm COMMAND`. Global flags may follow any command."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Every command.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List virtual machines
    #[command(visible_alias = "ls")]
    List(commands::list::ListArgs),
    /// Show one virtual machine in detail
    Get(commands::get::GetArgs),
    /// Create a virtual machine (disks, cloud-init, platform SSH trust)
    Create(Box<commands::create::CreateArgs>),
    /// Delete a virtual machine and the disks created for it
    Delete(commands::delete::DeleteArgs),
    /// Start virtual machines
    Start(commands::lifecycle::StartArgs),
    /// Stop virtual machines
    #[command(
        after_help = "KubeVirt: PUT …/virtualmachines/NAME/stop (runStrategy Always becomes Halted). Deckhouse: a Stop\nVirtualMachineOperation.\n\nExamples:\n  kubectl vm stop web\n  kubectl vm stop web --force\n  kubectl vm stop --all -n dev -y"
    )]
    Stop(commands::lifecycle::StopArgs),
    /// Restart virtual machines
    #[command(
        after_help = "KubeVirt: PUT …/virtualmachines/NAME/restart; waits for the new instance. Deckhouse: a Restart\nVirtualMachineOperation.\n\nExamples:\n  kubectl vm restart web\n  kubectl vm restart web --force\n  kubectl vm restart -l app=web -y --wait"
    )]
    Restart(commands::lifecycle::StopArgs),
    /// Pause the guests of virtual machines (KubeVirt)
    #[command(
        after_help = "Examples:\n  kubectl vm pause web\n  kubectl vm pause -l tier=batch -y"
    )]
    Pause(commands::lifecycle::VmiArgs),
    /// Resume paused virtual machines (KubeVirt)
    #[command(after_help = "Examples:\n  kubectl vm unpause web")]
    Unpause(commands::lifecycle::VmiArgs),
    /// Ask the guests of virtual machines to reboot (KubeVirt; needs the guest agent or ACPI)
    #[command(after_help = "Examples:\n  kubectl vm soft-reboot web")]
    SoftReboot(commands::lifecycle::VmiArgs),
    /// Hard-reset virtual machines, like pressing their reset button (KubeVirt; needs neither
    /// ACPI nor the guest agent, and flushes nothing)
    #[command(after_help = "Examples:\n  kubectl vm reset web")]
    Reset(commands::lifecycle::VmiArgs),
    /// Move virtual machines off their nodes (live migration)
    Evict(commands::lifecycle::EvictArgs),
    /// Live-migrate a virtual machine, or cancel its migration; `migrate list` shows those in flight
    Migrate(commands::lifecycle::MigrateArgs),
    /// Dump the memory of a running VM into a claim, or dissociate it (KubeVirt)
    MemoryDump(commands::memory_dump::MemoryDumpArgs),
    /// Cancel the evacuation of a VM, a VMI or a whole node that a drain started (KubeVirt)
    EvacuateCancel(commands::migrations::EvacuateCancelArgs),
    /// Connect to the serial console of a virtual machine
    Console(commands::console::ConsoleArgs),
    /// Open the VNC display of a virtual machine (viewer or local proxy)
    Vnc(commands::vnc::VncArgs),
    /// Download disks, snapshots and PVCs: raw, resumable, verified
    Export(Box<commands::export::ExportArgs>),
    /// Upload a local disk image (qcow2, raw, ISO, VMDK, VHD(X), gz/xz) into a DataVolume
    Upload(Box<commands::upload::UploadArgs>),
    /// Manage the platform SSH certificate authority (init, show, rotate)
    Ca(commands::ca::CaArgs),
    /// The in-cluster SSH certificate signer (run by the Deployment `ca init --signer` makes)
    Signer(commands::signer::SignerArgs),
    /// Collect a VM's objects, logs, events and domain XML into one tar.gz (secrets masked)
    CollectDebugInfo(commands::collect_debug_info::CollectDebugInfoArgs),
    /// Make a KubeVirt VM not created by kubectl vm accept platform SSH certificates
    Enroll(commands::enroll::EnrollArgs),
    /// Add or remove a guest user's SSH keys, or set its password, through the guest agent
    Credentials(commands::credentials::CredentialsArgs),
    /// List a VM's disks, attach (hotplug) a disk or image to it, or detach one
    Disk(commands::disk::DiskArgs),
    /// List, import and delete golden images to create VMs from (DataSources; VirtualImages)
    Image(commands::image::ImageArgs),
    /// List KubeVirt instance types (CPU, memory) to create VMs with
    Instancetype(commands::sizes::InstancetypeArgs),
    /// List KubeVirt preferences and what each sets
    Preference(commands::sizes::PreferenceArgs),
    /// List Deckhouse VirtualMachineClasses: sizing policies, core fractions, the default
    Class(commands::sizes::ClassArgs),
    /// Take, list, delete and restore VM snapshots
    Snapshot(commands::snapshot::SnapshotArgs),
    /// Expose ports of a VM as a Service (ClusterIP, NodePort, LoadBalancer)
    Expose(Box<commands::expose::ExposeArgs>),
    /// Clone a VM to a new name, with copies of its disks (KubeVirt VirtualMachineClone,
    /// Deckhouse VirtualMachineOperation Clone)
    Clone(Box<commands::clone::CloneArgs>),
    /// Change a VM after it exists: CPU and memory, run and eviction policy, labels
    Set(commands::set::SetArgs),
    /// List a VM's network interfaces (networks, MACs, IPs, attached or waiting)
    Network(commands::network::NetworkArgs),
    /// Show the guest's serial console history without attaching (or the launcher's log)
    Logs(commands::logs::LogsArgs),
    /// Show what a VM depends on (disks, images, Secrets) and what depends on it (snapshots,
    /// exports, Services)
    #[command(visible_alias = "objectgraph")]
    Deps(commands::deps::DepsArgs),
    /// Show the guest OS, kernel, hostname and time zone the guest agent reports
    Guestosinfo(commands::guest_info::GuestInfoArgs),
    /// Show the users logged in to the guest (guest agent)
    Userlist(commands::guest_info::GuestInfoArgs),
    /// Show the guest's filesystems with their usage (guest agent)
    Fslist(commands::guest_info::GuestInfoArgs),
    /// Log in to a VM with a short-lived certificate signed by the platform CA
    Ssh(commands::ssh::SshArgs),
    /// Copy files to or from a VM (SFTP over a certificate-authenticated session)
    Scp(commands::scp::ScpArgs),
    /// Print (or --install) an OpenSSH config for `ssh NAME.NAMESPACE.vm`
    #[command(name = "ssh-config")]
    SshConfig(commands::ssh_config::SshConfigArgs),
    /// Write a fresh short-lived key and certificate for OpenSSH (run by ssh-config's Match exec)
    #[command(name = "ssh-cert")]
    SshCert(commands::ssh_config::SshCertArgs),
    /// Print the platform CA as OpenSSH host trust (run by ssh-config's KnownHostsCommand)
    #[command(name = "ssh-known-hosts")]
    SshKnownHosts(commands::ssh_config::SshKnownHostsArgs),
    /// Print the running VMs as an Ansible inventory reached through ssh-config's settings
    #[command(name = "ansible-inventory")]
    AnsibleInventory(commands::ansible_inventory::AnsibleInventoryArgs),
    /// Forward local TCP/UDP ports (or stdin/stdout) to ports of a VM
    #[command(name = "port-forward")]
    PortForward(commands::port_forward::PortForwardArgs),
    /// Print the client version and the platform version of the cluster
    Version(commands::version::VersionArgs),
    /// Print a shell completion script, or install kubectl's plugin completion
    Completion(commands::completion::CompletionArgs),
    /// Write man pages and completion scripts (for packagers and `make`)
    #[command(hide = true, name = "generate-docs")]
    GenerateDocs(commands::generate_docs::GenerateDocsArgs),
}

/// The root help's commands, grouped by task as kubectl groups its own. Every visible command
/// is in exactly one group (a test checks it), in the order the help lists them.
pub const COMMAND_GROUPS: &[(&str, &[&str])] = &[
    (
        "Basic commands",
        &[
            "list", "get", "create", "delete", "clone", "expose", "set", "network",
        ],
    ),
    ("Sizes", &["instancetype", "preference", "class"]),
    (
        "Lifecycle",
        &[
            "start",
            "stop",
            "restart",
            "pause",
            "unpause",
            "soft-reboot",
            "reset",
            "evict",
            "migrate",
            "evacuate-cancel",
        ],
    ),
    (
        "Access",
        &[
            "ssh",
            "scp",
            "console",
            "vnc",
            "port-forward",
            "ssh-config",
            "ssh-cert",
            "ssh-known-hosts",
            "ansible-inventory",
            "credentials",
        ],
    ),
    (
        "Storage",
        &["disk", "snapshot", "export", "upload", "image"],
    ),
    ("Platform SSH trust", &["ca", "signer", "enroll"]),
    (
        "Troubleshooting",
        &[
            "collect-debug-info",
            "logs",
            "deps",
            "guestosinfo",
            "userlist",
            "fslist",
            "memory-dump",
        ],
    ),
    ("Other", &["version", "completion", "help"]),
];

/// Widest line of the root help, as `max_term_width` sets it for clap's own sections.
const HELP_WIDTH: usize = 100;

/// The clap command, built from the derive definitions, with the root help's commands
/// listed by [`COMMAND_GROUPS`].
pub fn command() -> clap::Command {
    let mut command = <Cli as clap::CommandFactory>::command();
    command.build();
    let groups = grouped_commands(&command);
    command.help_template(format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{groups}Options (global: they may follow any command):\n{{options}}{{after-help}}"
    ))
}

/// The visible subcommands of `command` under the headings of [`COMMAND_GROUPS`], each with
/// the first sentence of its help wrapped to [`HELP_WIDTH`].
fn grouped_commands(command: &clap::Command) -> String {
    let label = |sub: &clap::Command| {
        let aliases: Vec<&str> = sub.get_visible_aliases().collect();
        if aliases.is_empty() {
            sub.get_name().to_owned()
        } else {
            format!("{} ({})", sub.get_name(), aliases.join(", "))
        }
    };
    let width = command
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| label(s).len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (heading, names) in COMMAND_GROUPS {
        out.push_str(heading);
        out.push_str(":\n");
        for name in *names {
            let Some(sub) = command.find_subcommand(name) else {
                continue;
            };
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            let about = about.split_whitespace().collect::<Vec<_>>().join(" ");
            let indent = 2 + width + 2;
            let mut line = format!("  {:<width$}  ", label(sub));
            let mut column = indent;
            for (i, word) in about.split(' ').enumerate() {
                if i > 0 && column + 1 + word.len() > HELP_WIDTH {
                    line.push('\n');
                    line.push_str(&" ".repeat(indent));
                    column = indent;
                } else if i > 0 {
                    line.push(' ');
                    column += 1;
                }
                line.push_str(word);
                column += word.len();
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_definition_is_consistent() {
        super::command().debug_assert();
    }

    /// The root help lists every visible command once, under one task heading.
    #[test]
    fn every_command_is_in_exactly_one_group() {
        let command = super::command();
        let visible: Vec<&str> = command
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name())
            .collect();
        let grouped: Vec<&str> = super::COMMAND_GROUPS
            .iter()
            .flat_map(|(_, names)| names.iter().copied())
            .collect();
        for name in &visible {
            let times = grouped.iter().filter(|g| *g == name).count();
            assert_eq!(times, 1, "{name} is in {times} groups");
        }
        for name in &grouped {
            assert!(
                visible.contains(name),
                "{name} is grouped but not a command"
            );
        }
        let help = super::command().render_help().to_string();
        for (heading, _) in super::COMMAND_GROUPS {
            assert!(help.contains(&format!("{heading}:\n")), "{help}");
        }
        assert!(
            help.lines().all(|l| l.chars().count() <= super::HELP_WIDTH),
            "{help}"
        );
        assert!(help.contains("  list (ls) "), "{help}");
    }

    /// Every (long, short) spelling of a flag of `cmd` that is not inherited from the root.
    fn own_flags(cmd: &clap::Command) -> Vec<(Option<String>, Option<char>)> {
        cmd.get_arguments()
            .filter(|a| !a.is_global_set())
            .flat_map(|a| {
                let mut longs: Vec<Option<String>> = vec![a.get_long().map(str::to_owned)];
                longs.extend(
                    a.get_all_aliases()
                        .unwrap_or_default()
                        .into_iter()
                        .map(|l| Some(l.to_owned())),
                );
                let shorts: Vec<char> = a
                    .get_short()
                    .into_iter()
                    .chain(a.get_all_short_aliases().unwrap_or_default())
                    .collect();
                longs
                    .into_iter()
                    .map(|l| (l, None))
                    .chain(shorts.into_iter().map(|c| (None, Some(c))))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn walk(
        cmd: &clap::Command,
        path: &str,
        global: &[(Option<String>, Option<char>)],
        found: &mut Vec<String>,
    ) {
        for (long, short) in own_flags(cmd) {
            if global.iter().any(|(gl, gs)| {
                (long.is_some() && *gl == long) || (short.is_some() && *gs == short)
            }) {
                found.push(format!("{path}: {long:?} {short:?}"));
            }
        }
        for sub in cmd.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), global, found);
        }
    }

    /// A subcommand flag spelled like a global one silently shadows it (`create --user`
    /// was both the guest user and the kubeconfig user); clap's debug_assert misses this.
    #[test]
    fn no_command_flag_shadows_a_global_flag() {
        let root = super::command();
        let global: Vec<(Option<String>, Option<char>)> = root
            .get_arguments()
            .filter(|a| a.is_global_set())
            .flat_map(|a| {
                let mut v = vec![(a.get_long().map(str::to_owned), None)];
                if let Some(c) = a.get_short() {
                    v.push((None, Some(c)));
                }
                v
            })
            .collect();
        assert!(global.iter().any(|(l, _)| l.as_deref() == Some("user")));
        let mut found = Vec::new();
        for sub in root.get_subcommands() {
            walk(sub, sub.get_name(), &global, &mut found);
        }
        assert!(found.is_empty(), "flags shadowing global ones: {found:?}");
    }

    /// A subcommand argument whose field has the id of a global one (`user`) takes nothing:
    /// clap hands the value to the global argument (`credentials -u debian` became the
    /// kubeconfig user).
    #[test]
    fn no_command_arg_id_is_a_global_id() {
        fn walk(cmd: &clap::Command, path: &str, global: &[String], found: &mut Vec<String>) {
            for a in cmd.get_arguments().filter(|a| !a.is_global_set()) {
                if global.iter().any(|g| g == a.get_id().as_str()) {
                    found.push(format!("{path}: {}", a.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), global, found);
            }
        }
        let root = super::command();
        let global: Vec<String> = root
            .get_arguments()
            .filter(|a| a.is_global_set())
            .map(|a| a.get_id().to_string())
            .collect();
        let mut found = Vec::new();
        for sub in root.get_subcommands() {
            walk(sub, sub.get_name(), &global, &mut found);
        }
        assert!(found.is_empty(), "argument ids of global flags: {found:?}");
    }
}
