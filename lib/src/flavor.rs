//! Which virtualization platform a cluster serves, found with one discovery round trip.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use crate::cluster::Cluster;
use crate::error::{Error, Result};

/// API group of KubeVirt's core kinds (VirtualMachine, VirtualMachineInstance, …).
pub const KUBEVIRT_GROUP: &str = "kubevirt.io";
/// API group of KubeVirt's aggregated subresource API (start, stop, console, …).
pub const KUBEVIRT_SUBRESOURCES_GROUP: &str = "subresources.kubevirt.io";
/// API group of KubeVirt's VirtualMachineExport.
pub const KUBEVIRT_EXPORT_GROUP: &str = "export.kubevirt.io";
/// API group of CDI (DataVolume, DataSource, …).
pub const CDI_GROUP: &str = "cdi.kubevirt.io";
/// API group of Deckhouse virtualization's kinds.
pub const DECKHOUSE_GROUP: &str = "virtualization.deckhouse.io";
/// API group of Deckhouse virtualization's aggregated subresource API.
pub const DECKHOUSE_SUBRESOURCES_GROUP: &str = "subresources.virtualization.deckhouse.io";
/// The version Deckhouse serves its VM kinds in. The group's preferred version can be
/// `v1alpha3` (served for VirtualMachineClass only), so it is never taken from discovery.
pub const DECKHOUSE_VERSION: &str = "v1alpha2";

/// A virtualization platform that kubectl-vm drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// Upstream KubeVirt (`kubevirt.io/v1`, CDI, `export.kubevirt.io`).
    KubeVirt,
    /// Deckhouse virtualization (`virtualization.deckhouse.io/v1alpha2`).
    Deckhouse,
}

impl Flavor {
    /// The lower-case name used on the command line (`kubevirt`, `deckhouse`).
    pub fn as_str(self) -> &'static str {
        match self {
            Flavor::KubeVirt => "kubevirt",
            Flavor::Deckhouse => "deckhouse",
        }
    }

    /// `group/version` of this platform's VirtualMachine kind.
    pub fn vm_api_version(self) -> &'static str {
        match self {
            Flavor::KubeVirt => "kubevirt.io/v1",
            Flavor::Deckhouse => "virtualization.deckhouse.io/v1alpha2",
        }
    }

    /// Human name of the platform, for messages.
    pub fn display_name(self) -> &'static str {
        match self {
            Flavor::KubeVirt => "KubeVirt",
            Flavor::Deckhouse => "Deckhouse virtualization",
        }
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `--flavor` choice: detect, or force one platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlavorChoice {
    /// Detect from discovery (Deckhouse wins when both are served).
    #[default]
    Auto,
    /// Use this platform without asking the cluster.
    Fixed(Flavor),
}

impl FromStr for FlavorChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "auto" => Ok(FlavorChoice::Auto),
            "kubevirt" => Ok(FlavorChoice::Fixed(Flavor::KubeVirt)),
            "deckhouse" => Ok(FlavorChoice::Fixed(Flavor::Deckhouse)),
            other => Err(format!(
                "unknown flavor {other:?}: use auto, kubevirt or deckhouse"
            )),
        }
    }
}

/// One API group as the server announces it in `/apis`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedGroup {
    /// Group name, e.g. `export.kubevirt.io`.
    pub name: String,
    /// Served versions, in the server's order.
    pub versions: Vec<String>,
    /// The server's preferred version.
    pub preferred: Option<String>,
}

/// What discovery found: the flavor and the versions of the groups kubectl-vm uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    /// The platform to drive.
    pub flavor: Flavor,
    /// Every API group the server serves.
    pub groups: Vec<ServedGroup>,
}

impl Platform {
    /// A platform known without discovery (`--flavor kubevirt|deckhouse`).
    pub fn assumed(flavor: Flavor) -> Self {
        Platform {
            flavor,
            groups: Vec::new(),
        }
    }

    /// The served group of that name, if any.
    pub fn group(&self, name: &str) -> Option<&ServedGroup> {
        self.groups.iter().find(|g| g.name == name)
    }

    /// Whether the server serves `group` at `version`. Without discovery data (assumed
    /// platform) every version is taken as served.
    pub fn serves(&self, group: &str, version: &str) -> bool {
        if self.groups.is_empty() {
            return true;
        }
        self.group(group)
            .is_some_and(|g| g.versions.iter().any(|v| v == version))
    }

    /// Refuses before any write when discovery says `group/version` is not served (an
    /// aggregated API such as virt-api's missing): `NotServed` naming `resource.group` and the
    /// component that serves it. Without discovery data nothing is refused.
    pub fn require(&self, group: &str, version: &str, resource: &str) -> crate::error::Result<()> {
        if self.serves(group, version) {
            Ok(())
        } else {
            Err(crate::error::Error::NotServed {
                resource: format!("{resource}.{group}"),
            })
        }
    }

    /// The other platform, when the server serves it too (detection picked `self.flavor`).
    pub fn also_served(&self) -> Option<Flavor> {
        let other = match self.flavor {
            Flavor::KubeVirt => Flavor::Deckhouse,
            Flavor::Deckhouse => Flavor::KubeVirt,
        };
        let (group, version) = match other {
            Flavor::KubeVirt => (KUBEVIRT_GROUP, "v1"),
            Flavor::Deckhouse => (DECKHOUSE_GROUP, DECKHOUSE_VERSION),
        };
        (!self.groups.is_empty() && self.serves(group, version)).then_some(other)
    }

    /// The newest served version of KubeVirt's export group (`v1`, `v1beta1` or `v1alpha1`).
    pub fn kubevirt_export_version(&self) -> Option<&str> {
        let group = self.group(KUBEVIRT_EXPORT_GROUP)?;
        ["v1", "v1beta1", "v1alpha1"]
            .into_iter()
            .find(|want| group.versions.iter().any(|v| v == want))
    }
}

#[derive(Deserialize)]
struct ApiGroupList {
    #[serde(default)]
    groups: Vec<ApiGroup>,
}

#[derive(Deserialize)]
struct ApiGroup {
    name: String,
    #[serde(default)]
    versions: Vec<GroupVersion>,
    #[serde(rename = "preferredVersion")]
    preferred_version: Option<GroupVersion>,
}

#[derive(Deserialize)]
struct GroupVersion {
    version: String,
}

/// Decide the flavor from the server's group list. Deckhouse runs a renamed KubeVirt
/// underneath, so its group wins when both appear.
pub fn flavor_from_groups(groups: &[ServedGroup]) -> Option<Flavor> {
    let served = |name: &str, version: &str| {
        groups
            .iter()
            .any(|g| g.name == name && g.versions.iter().any(|v| v == version))
    };
    if served(DECKHOUSE_GROUP, DECKHOUSE_VERSION) {
        Some(Flavor::Deckhouse)
    } else if served(KUBEVIRT_GROUP, "v1") {
        Some(Flavor::KubeVirt)
    } else {
        None
    }
}

/// Read `/apis` once and work out the platform. A `--flavor` choice still reads the group
/// list (later commands need the served versions) but skips detection.
pub async fn discover(cluster: &Cluster, choice: FlavorChoice) -> Result<Platform> {
    let request = http::Request::get("/apis")
        .body(Vec::new())
        .map_err(|e| Error::Internal(format!("building discovery request: {e}")))?;
    let list: ApiGroupList = cluster
        .client
        .request(request)
        .await
        .map_err(|e| cluster.error(e, &crate::error::Action::discovery()))?;
    let groups: Vec<ServedGroup> = list
        .groups
        .into_iter()
        .map(|g| ServedGroup {
            name: g.name,
            versions: g.versions.into_iter().map(|v| v.version).collect(),
            preferred: g.preferred_version.map(|v| v.version),
        })
        .collect();
    let flavor = match choice {
        FlavorChoice::Fixed(flavor) => flavor,
        FlavorChoice::Auto => flavor_from_groups(&groups).ok_or(Error::NoPlatform)?,
    };
    Ok(Platform { flavor, groups })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, versions: &[&str]) -> ServedGroup {
        ServedGroup {
            name: name.into(),
            versions: versions.iter().map(|v| v.to_string()).collect(),
            preferred: versions.first().map(|v| v.to_string()),
        }
    }

    #[test]
    fn deckhouse_wins_over_kubevirt() {
        let groups = [
            group("kubevirt.io", &["v1"]),
            group("virtualization.deckhouse.io", &["v1alpha3", "v1alpha2"]),
        ];
        assert_eq!(flavor_from_groups(&groups), Some(Flavor::Deckhouse));
    }

    #[test]
    fn the_other_platform_is_reported_when_served() {
        let mut platform = Platform::assumed(Flavor::Deckhouse);
        assert_eq!(
            platform.also_served(),
            None,
            "no discovery data: nothing known"
        );
        platform.groups = vec![
            group("kubevirt.io", &["v1"]),
            group("virtualization.deckhouse.io", &["v1alpha2"]),
        ];
        assert_eq!(platform.also_served(), Some(Flavor::KubeVirt));
        platform.groups.remove(0);
        assert_eq!(platform.also_served(), None);
    }

    #[test]
    fn kubevirt_alone() {
        let groups = [
            group("apps", &["v1"]),
            group("kubevirt.io", &["v1", "v1alpha3"]),
        ];
        assert_eq!(flavor_from_groups(&groups), Some(Flavor::KubeVirt));
    }

    #[test]
    fn neither() {
        assert_eq!(flavor_from_groups(&[group("apps", &["v1"])]), None);
    }

    #[test]
    fn export_version_follows_discovery() {
        let mut platform = Platform::assumed(Flavor::KubeVirt);
        platform.groups = vec![group("export.kubevirt.io", &["v1beta1", "v1alpha1"])];
        assert_eq!(platform.kubevirt_export_version(), Some("v1beta1"));
        platform.groups = vec![group("export.kubevirt.io", &["v1", "v1beta1"])];
        assert_eq!(platform.kubevirt_export_version(), Some("v1"));
    }

    #[test]
    fn flavor_choice_parses() {
        assert_eq!("auto".parse::<FlavorChoice>(), Ok(FlavorChoice::Auto));
        assert_eq!(
            "deckhouse".parse::<FlavorChoice>(),
            Ok(FlavorChoice::Fixed(Flavor::Deckhouse))
        );
        assert!("openshift".parse::<FlavorChoice>().is_err());
    }
}
