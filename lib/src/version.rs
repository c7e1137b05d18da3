//! Versions the server reports: Kubernetes itself and the virtualization platform.

use serde::Deserialize;

use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};
use crate::flavor::{Flavor, Platform};

/// What the cluster runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerVersions {
    /// Kubernetes `gitVersion`, e.g. `v1.36.0`.
    pub kubernetes: String,
    /// The platform's own version (`v1.9.0` for KubeVirt), when the platform reports one.
    pub platform: Option<String>,
}

#[derive(Deserialize)]
struct VersionInfo {
    #[serde(rename = "gitVersion")]
    git_version: String,
}

async fn get_version(cluster: &Cluster, path: &str, what: &str) -> Result<String> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| Error::Internal(format!("building version request: {e}")))?;
    let info: VersionInfo = cluster
        .client
        .request(request)
        .await
        .map_err(|e| cluster.error(e, &Action::new("get", what, what)))?;
    Ok(info.git_version)
}

/// Ask the server for its versions. The Kubernetes version must be readable; the
/// platform's is best effort (KubeVirt reports it on `subresources.kubevirt.io/v1/version`;
/// Deckhouse virtualization has no version endpoint).
pub async fn server_versions(cluster: &Cluster, platform: &Platform) -> Result<ServerVersions> {
    let kubernetes = get_version(cluster, "/version", "version").await?;
    let platform_version = match platform.flavor {
        Flavor::KubeVirt => get_version(
            cluster,
            "/apis/subresources.kubevirt.io/v1/version",
            "kubevirt version",
        )
        .await
        .ok(),
        Flavor::Deckhouse => None,
    };
    Ok(ServerVersions {
        kubernetes,
        platform: platform_version,
    })
}
