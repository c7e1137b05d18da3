//! Connecting to the cluster the global flags select, shared by every command.

use kubevm::cluster::Cluster;
use kubevm::flavor::{self, Platform};

use crate::error::CommandError;
use crate::error::CommandResult;
use crate::flags::GlobalArgs;

/// Connect to the cluster the global flags select and find out its platform.
pub async fn connect(global: &GlobalArgs) -> CommandResult<(Cluster, Platform)> {
    let cluster = Cluster::connect(&global.connect_options()).await?;
    let platform = flavor::discover(&cluster, global.flavor_choice()).await?;
    note_other_platform(global, &platform);
    Ok((cluster, platform))
}

/// When detection picked one of two served platforms, say so once on stderr and how to pick
/// the other.
pub fn note_other_platform(global: &GlobalArgs, platform: &Platform) {
    if global.flavor_choice() == flavor::FlavorChoice::Auto
        && let Some(other) = platform.also_served()
    {
        eprintln!(
            "Note: this cluster serves both {} and {}; using {} (pass --flavor {other} for the other)",
            platform.flavor.display_name(),
            other.display_name(),
            platform.flavor.display_name(),
        );
    }
}

/// `pool/NAME` names no pool in `namespace`.
pub fn pool_not_found(name: &str, namespace: &str) -> CommandError {
    CommandError::Failed(format!(
        "pool {name:?} not found in namespace {namespace:?} (no VirtualMachinePool, or no VMs created for it by create --replicas)"
    ))
}

/// `--ca-namespace` is a namespace name: checked before any request.
pub fn check_ca_namespace(namespace: &str) -> CommandResult {
    kubevm::target::validate_namespace(namespace)
        .map_err(|e| CommandError::usage(format!("--ca-namespace: {e}")))
}

/// Streams (port-forward, VNC) go through the platform's aggregated subresource API; a
/// command that listens first and dials later checks discovery for it before it listens.
pub fn require_subresources(platform: &Platform) -> CommandResult {
    let api = kubevm::platform::of(platform.flavor).streams;
    platform.require(api.group, api.version, api.resource)?;
    Ok(())
}
