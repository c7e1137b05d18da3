//! The value types of `create`'s flags: `--image` references, `--run-strategy`, `--firmware`,
//! `--os`, `--core-fraction`, instancetype/preference references.

use std::fmt;
use std::str::FromStr;

use crate::validate::{self, ValidationError};

/// What an `--image` value names.
///
/// On Deckhouse `vi/NAME` (or `virtualimage/NAME`) names a VirtualImage in the VM's namespace
/// and `cvi/NAME` (or `clustervirtualimage/NAME`) a ClusterVirtualImage; on KubeVirt
/// `ds/[NAMESPACE/]NAME` (or `datasource/…`) names a CDI DataSource; anything else is a
/// container registry image. A Docker Hub image whose owner is literally `vi`, `cvi` or `ds`
/// can be written with its registry, `docker.io/vi/NAME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageRef<'a> {
    /// A container registry image reference.
    Registry(&'a str),
    /// A Deckhouse VirtualImage (namespaced).
    VirtualImage(&'a str),
    /// A Deckhouse ClusterVirtualImage.
    ClusterVirtualImage(&'a str),
    /// A CDI DataSource (KubeVirt): `ds/NAME` in the VM's namespace or `ds/NAMESPACE/NAME`.
    DataSource {
        /// Its namespace, when given.
        namespace: Option<&'a str>,
        /// Its name.
        name: &'a str,
    },
}

impl<'a> ImageRef<'a> {
    /// Classify an `--image` value.
    pub fn parse(image: &'a str) -> ImageRef<'a> {
        match image.split_once('/') {
            Some(("vi" | "virtualimage", name)) => ImageRef::VirtualImage(name),
            Some(("cvi" | "clustervirtualimage", name)) => ImageRef::ClusterVirtualImage(name),
            Some(("ds" | "datasource", rest)) => match rest.split_once('/') {
                Some((namespace, name)) => ImageRef::DataSource {
                    namespace: Some(namespace),
                    name,
                },
                None => ImageRef::DataSource {
                    namespace: None,
                    name: rest,
                },
            },
            _ => ImageRef::Registry(image),
        }
    }
}

/// `--run-strategy`: what keeps the VM running.
///
/// Deckhouse has `runPolicy` instead; the mapping is
/// `Always`→`AlwaysOn`, `RerunOnFailure`→`AlwaysOnUnlessStoppedManually` (restarted after a
/// failure, stays off once stopped on purpose), `Manual`→`Manual`, `Halted`→`AlwaysOff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStrategy {
    /// Always running; restarted whenever it stops.
    Always,
    /// Restarted only after a failure.
    RerunOnFailure,
    /// Started and stopped only on request; not started at creation.
    Manual,
    /// Kept stopped.
    Halted,
}

impl RunStrategy {
    /// KubeVirt's `spec.runStrategy` value.
    pub fn kubevirt(self) -> &'static str {
        match self {
            RunStrategy::Always => "Always",
            RunStrategy::RerunOnFailure => "RerunOnFailure",
            RunStrategy::Manual => "Manual",
            RunStrategy::Halted => "Halted",
        }
    }

    /// Deckhouse's `spec.runPolicy` value (see the type's docs for the mapping).
    pub fn deckhouse(self) -> &'static str {
        match self {
            RunStrategy::Always => "AlwaysOn",
            RunStrategy::RerunOnFailure => "AlwaysOnUnlessStoppedManually",
            RunStrategy::Manual => "Manual",
            RunStrategy::Halted => "AlwaysOff",
        }
    }

    /// Whether a VM with this strategy starts as soon as it is created.
    pub fn starts_at_creation(self) -> bool {
        matches!(self, RunStrategy::Always | RunStrategy::RerunOnFailure)
    }
}

impl FromStr for RunStrategy {
    type Err = ValidationError;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.to_ascii_lowercase().as_str() {
            "always" => Ok(RunStrategy::Always),
            "rerunonfailure" => Ok(RunStrategy::RerunOnFailure),
            "manual" => Ok(RunStrategy::Manual),
            "halted" => Ok(RunStrategy::Halted),
            _ => Err(ValidationError::Choice {
                what: "run strategy",
                value: value.to_string(),
                choices: "Always, RerunOnFailure, Manual, Halted",
            }),
        }
    }
}

/// `--firmware`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firmware {
    /// UEFI without Secure Boot.
    Efi,
    /// Legacy BIOS.
    Bios,
}

impl FromStr for Firmware {
    type Err = ValidationError;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.to_ascii_lowercase().as_str() {
            "efi" | "uefi" => Ok(Firmware::Efi),
            "bios" => Ok(Firmware::Bios),
            _ => Err(ValidationError::Choice {
                what: "firmware",
                value: value.to_string(),
                choices: "efi, bios",
            }),
        }
    }
}

/// `--os`: the guest family, which decides the guest configuration that is injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OsType {
    /// Linux with cloud-init.
    #[default]
    Linux,
    /// Windows (cloudbase-init); no platform injection.
    Windows,
}

impl FromStr for OsType {
    type Err = ValidationError;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.to_ascii_lowercase().as_str() {
            "linux" => Ok(OsType::Linux),
            "windows" => Ok(OsType::Windows),
            _ => Err(ValidationError::Choice {
                what: "OS type",
                value: value.to_string(),
                choices: "linux, windows",
            }),
        }
    }
}

/// `--core-fraction` (Deckhouse): the guaranteed share of each core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreFraction {
    /// Chosen by the platform from the load (`Auto`).
    Auto,
    /// A fixed percentage, 1 to 100.
    Percent(u8),
}

impl FromStr for CoreFraction {
    type Err = ValidationError;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        if value.eq_ignore_ascii_case("auto") {
            return Ok(CoreFraction::Auto);
        }
        match value.strip_suffix('%').unwrap_or(value).parse::<u8>() {
            Ok(p @ 1..=100) => Ok(CoreFraction::Percent(p)),
            _ => Err(ValidationError::Choice {
                what: "core fraction",
                value: value.to_string(),
                choices: "a percentage from 1% to 100% (e.g. 20%) or Auto",
            }),
        }
    }
}

impl fmt::Display for CoreFraction {
    /// The API form: `Auto` or `20%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CoreFraction::Auto => f.write_str("Auto"),
            CoreFraction::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// A KubeVirt instancetype or preference reference, `[kind/]name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindRef {
    /// The API kind (`VirtualMachineClusterInstancetype`, …).
    pub kind: &'static str,
    /// Object name.
    pub name: String,
}

impl KindRef {
    /// Parse `--instancetype [kind/]name`; the kind defaults to the cluster-wide one.
    pub fn instancetype(value: &str) -> Result<KindRef, ValidationError> {
        Self::parse(
            value,
            "instancetype",
            (
                "VirtualMachineInstancetype",
                &["virtualmachineinstancetype", "vminstancetype"],
            ),
            (
                "VirtualMachineClusterInstancetype",
                &["virtualmachineclusterinstancetype", "vmclusterinstancetype"],
            ),
        )
    }

    /// Parse `--preference [kind/]name`; the kind defaults to the cluster-wide one.
    pub fn preference(value: &str) -> Result<KindRef, ValidationError> {
        Self::parse(
            value,
            "preference",
            (
                "VirtualMachinePreference",
                &["virtualmachinepreference", "vmpreference"],
            ),
            (
                "VirtualMachineClusterPreference",
                &["virtualmachineclusterpreference", "vmclusterpreference"],
            ),
        )
    }

    fn parse(
        value: &str,
        what: &'static str,
        namespaced: (&'static str, &[&str]),
        cluster: (&'static str, &[&str]),
    ) -> Result<KindRef, ValidationError> {
        let (kind, name) = match value.split_once('/') {
            None => (cluster.0, value),
            Some((kind, name)) => {
                let kind = kind.to_ascii_lowercase();
                if namespaced.1.contains(&kind.as_str()) {
                    (namespaced.0, name)
                } else if cluster.1.contains(&kind.as_str()) {
                    (cluster.0, name)
                } else {
                    return Err(ValidationError::Name {
                        kind: what,
                        name: value.to_string(),
                        reason: format!(
                            "unknown kind {kind:?}; use NAME, {}/NAME or {}/NAME",
                            namespaced.1[1], cluster.1[1]
                        ),
                    });
                }
            }
        };
        validate::dns_subdomain(what, name)?;
        Ok(KindRef {
            kind,
            name: name.to_string(),
        })
    }
}
