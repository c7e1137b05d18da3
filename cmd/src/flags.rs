//! Flags shared by many commands, declared once: the global connection flags (named and
//! behaving like kubectl's), `--dry-run`, `--wait`/`--no-wait`/`--timeout` and the `-o`
//! formats of a change.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use clap_complete::engine::ArgValueCompleter;
use kubevm::api::DryRun as LibDryRun;
use kubevm::cluster::ConnectOptions;
use kubevm::flavor::FlavorChoice;

use crate::complete;

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

/// `--dry-run` strategies, as kubectl names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DryRun {
    /// Really send the request
    None,
    /// Print what would be requested, without sending a change
    Client,
    /// Send the request with dryRun=All: checked by the server, nothing changes
    Server,
}

impl DryRun {
    /// The library's strategy for an optional `--dry-run` (absent: really act).
    pub fn lib(flag: Option<DryRun>) -> LibDryRun {
        match flag.unwrap_or(DryRun::None) {
            DryRun::None => LibDryRun::None,
            DryRun::Client => LibDryRun::Client,
            DryRun::Server => LibDryRun::Server,
        }
    }
}

/// `--wait`, `--no-wait` and `--timeout`.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Wait for the end state (the default for one VM)
    #[arg(long, conflicts_with = "no_wait")]
    pub wait: bool,

    /// Return once the platform accepted the request (the default for several VMs)
    #[arg(long)]
    pub no_wait: bool,

    /// How long to wait, e.g. 90s, 5m
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = kubevm::cluster::parse_duration)]
    pub timeout: Duration,
}

/// `-o` of attach and detach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ChangeFormat {
    /// kind.group/name of the object that holds the attachment
    Name,
    /// That object as JSON
    Json,
    /// That object as YAML
    Yaml,
}
