//! Test plans shared by the create tests.

use std::sync::OnceLock;

use super::plan::{BootSource, VmPlan};
use crate::ca::{CaBundle, DEFAULT_HOST_CERT_VALIDITY, HostKeys};
use crate::flavor::Flavor;
use crate::quantity::Quantity;

/// One CA and host identity for all tests.
fn ca() -> &'static (CaBundle, HostKeys) {
    static CA: OnceLock<(CaBundle, HostKeys)> = OnceLock::new();
    CA.get_or_init(|| {
        let ca = CaBundle::generate().unwrap();
        let host = HostKeys::issue(&ca, "web", "default", DEFAULT_HOST_CERT_VALIDITY).unwrap();
        (ca, host)
    })
}

/// The CA's public keys.
pub fn ca_keys() -> Vec<String> {
    ca().0.public_keys_openssh().unwrap()
}

/// A host identity for VM `web`.
pub fn host_keys() -> HostKeys {
    ca().1.clone()
}

/// A persisted registry image.
pub fn image() -> BootSource {
    BootSource::ContainerDisk {
        image: "quay.io/containerdisks/debian:12".into(),
        ephemeral: false,
    }
}

/// Every boot source valid on `flavor`, with a short name for messages.
pub fn boot_sources(flavor: Flavor) -> Vec<(&'static str, BootSource)> {
    let sha256 = format!("sha256:{}", "ab".repeat(32)).parse().unwrap();
    let streebog = format!("streebog512:{}", "cd".repeat(64)).parse().unwrap();
    let mut sources = vec![
        ("image", image()),
        (
            "url",
            BootSource::Url {
                url: "https://example.com/images/debian-12.qcow2".into(),
                checksums: match flavor {
                    Flavor::KubeVirt => vec![sha256],
                    Flavor::Deckhouse => vec![sha256, streebog],
                },
            },
        ),
        (
            "blank",
            BootSource::Blank {
                size: Quantity::parse("20Gi").unwrap(),
            },
        ),
        (
            "disk",
            BootSource::ExistingDisk {
                name: "existing-disk".into(),
            },
        ),
    ];
    match flavor {
        Flavor::KubeVirt => {
            sources.push((
                "ephemeral",
                BootSource::ContainerDisk {
                    image: "quay.io/containerdisks/debian:12".into(),
                    ephemeral: true,
                },
            ));
            sources.push((
                "clone",
                BootSource::ClonePvc {
                    name: "golden/debian".into(),
                },
            ));
        }
        Flavor::Deckhouse => {
            sources.push((
                "vi",
                BootSource::ContainerDisk {
                    image: "vi/debian".into(),
                    ephemeral: false,
                },
            ));
            sources.push((
                "cvi",
                BootSource::ContainerDisk {
                    image: "cvi/ubuntu".into(),
                    ephemeral: false,
                },
            ));
        }
    }
    sources
}

/// VM `web` in `default` with platform SSH (CA keys and a host key).
pub fn plan(flavor: Flavor, boot: BootSource) -> VmPlan {
    let mut plan = VmPlan::new("web", "default", flavor, boot);
    plan.platform_ssh.ca_public_keys = ca_keys();
    plan.platform_ssh.host = Some(host_keys());
    plan
}
