//! `kubectl vm version`: the client's version, and the cluster's Kubernetes and platform
//! versions when the cluster is reachable.

use std::io::Write;

use clap::Args;
use kubevm::version::server_versions;
use serde_json::json;

use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// Arguments of `version`.
#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  kubectl vm version\n  kubectl vm version --client -o json")]
pub struct VersionArgs {
    /// Only print the client version (no cluster access)
    #[arg(long)]
    pub client: bool,

    /// Output format
    #[arg(short, long, value_parser = ["yaml", "json"])]
    pub output: Option<String>,
}

/// The version of this build.
pub const CLIENT_VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));

pub async fn cmd_version(global: &GlobalArgs, args: VersionArgs) -> CommandResult {
    let mut report = json!({"clientVersion": CLIENT_VERSION});
    let mut failure = None;
    if !args.client {
        match crate::connect::connect(global).await {
            Ok((cluster, platform)) => match server_versions(&cluster, &platform).await {
                Ok(versions) => {
                    report["serverVersion"] = json!(versions.kubernetes);
                    report["platform"] = json!(platform.flavor.display_name());
                    report["platformAPI"] = json!(platform.flavor.vm_api_version());
                    if let Some(v) = versions.platform {
                        report["platformVersion"] = json!(v);
                    }
                }
                Err(e) => failure = Some(CommandError::from(e)),
            },
            Err(e) => failure = Some(e),
        }
    }
    let mut out = std::io::stdout().lock();
    match args.output.as_deref() {
        Some("json") => {
            serde_json::to_writer_pretty(&mut out, &report).map_err(std::io::Error::other)?;
            writeln!(out)?;
        }
        Some(_) => out.write_all(
            yaml_serde::to_string(&report)
                .map_err(std::io::Error::other)?
                .as_bytes(),
        )?,
        None => {
            writeln!(out, "Client Version: {CLIENT_VERSION}")?;
            if let Some(server) = report.get("serverVersion").and_then(|v| v.as_str()) {
                writeln!(out, "Server Version: {server}")?;
                let platform = report["platform"].as_str().unwrap_or_default();
                let api = report["platformAPI"].as_str().unwrap_or_default();
                match report.get("platformVersion").and_then(|v| v.as_str()) {
                    Some(version) => writeln!(out, "Platform: {platform} {version} ({api})")?,
                    None => writeln!(out, "Platform: {platform} ({api})")?,
                }
            }
        }
    }
    out.flush()?;
    failure.map_or(Ok(()), Err)
}
