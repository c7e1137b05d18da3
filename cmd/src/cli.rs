//! The command line: global connection flags (accepted before or after any subcommand, as
//! kubectl does not pass its own to plugins) and one variant per command.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use clap_complete::engine::ArgValueCompleter;
use kubevm::cluster::ConnectOptions;
use kubevm::flavor::FlavorChoice;

use crate::commands;
use crate::complete;

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

/// Connection flags shared by every command, named and behaving like kubectl's.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Path to the kubeconfig file (instead of KUBECONFIG or ~/.kube/config)
    #[arg(long, global = true, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use
    #[arg(long, global = true, value_name = "NAME", add = ArgValueCompleter::new(complete::contexts))]
    pub context: Option<String>,

    /// The kubeconfig cluster to use
    #[arg(long, global = true, value_name = "NAME")]
    pub cluster: Option<String>,

    /// The kubeconfig user to use
    #[arg(long, global = true, value_name = "NAME")]
    pub user: Option<String>,

    /// Namespace to work in (default: the context's namespace)
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE", add = ArgValueCompleter::new(complete::namespaces))]
    pub namespace: Option<String>,

    /// User to impersonate
    #[arg(long = "as", global = true, value_name = "USER")]
    pub impersonate: Option<String>,

    /// Group to impersonate (repeatable)
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub impersonate_groups: Vec<String>,

    /// Time limit for a single API request, e.g. 30s or 1m (0: none)
    #[arg(long, global = true, value_name = "DURATION", value_parser = kubevm::cluster::parse_duration)]
    pub request_timeout: Option<Duration>,

    /// Do not verify the API server's TLS certificate (insecure)
    #[arg(long, global = true)]
    pub insecure_skip_tls_verify: bool,

    /// Virtualization platform: auto (detect), kubevirt or deckhouse
    #[arg(long, global = true, value_name = "FLAVOR", default_value = "auto", value_parser = ["auto", "kubevirt", "deckhouse"])]
    pub flavor: String,

    /// Log API requests on stderr, as kubectl's -v: 6 method, URL, status and latency; 7 also
    /// headers; 8 also bodies (cut at 1024 chars); 9 whole bodies. Secrets are masked
    #[arg(
        short = 'v',
        long = "v",
        global = true,
        value_name = "N",
        default_value_t = 0
    )]
    pub verbosity: u8,
}

impl GlobalArgs {
    /// The connection options these flags describe.
    pub fn connect_options(&self) -> ConnectOptions {
        ConnectOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
            namespace: self.namespace.clone(),
            impersonate: self.impersonate.clone(),
            impersonate_groups: self.impersonate_groups.clone(),
            request_timeout: self.request_timeout,
            insecure_skip_tls_verify: self.insecure_skip_tls_verify,
            http_log: (self.verbosity >= 6).then(|| kubevm::http_log::HttpLog {
                level: self.verbosity,
                sink: std::sync::Arc::new(|line: &str| eprintln!("{line}")),
            }),
        }
    }

    /// The `--flavor` choice.
    pub fn flavor_choice(&self) -> FlavorChoice {
        self.flavor.parse().unwrap_or_default()
    }
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
    /// Live-migrate a virtual machine, or cancel its migration
    Migrate(commands::lifecycle::MigrateArgs),
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
    /// Take, list, delete and restore VM snapshots
    Snapshot(commands::snapshot::SnapshotArgs),
    /// Expose ports of a VM as a Service (ClusterIP, NodePort, LoadBalancer)
    Expose(Box<commands::expose::ExposeArgs>),
    /// Clone a VM to a new name, with copies of its disks (KubeVirt VirtualMachineClone,
    /// Deckhouse VirtualMachineOperation Clone)
    Clone(Box<commands::clone::CloneArgs>),
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

/// The clap command, built from the derive definitions.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cli_definition_is_consistent() {
        super::command().debug_assert();
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
