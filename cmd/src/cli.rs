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
    /// Download disks, snapshots and PVCs: raw, resumable, verified
    Export(Box<commands::export::ExportArgs>),
    /// Manage the platform SSH certificate authority (init, show, rotate)
    Ca(commands::ca::CaArgs),
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
}
