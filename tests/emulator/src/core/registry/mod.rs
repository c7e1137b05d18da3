//! The kinds the emulator serves: names, scope, versions, printer columns and where their schema
//! comes from. The kinds themselves are listed by platform: `core_kinds` (built-in Kubernetes),
//! `kubevirt` (KubeVirt/CDI: names described here, schemas from the operators' embedded CRDs,
//! parsed on first use) and `deckhouse` (read from the embedded CRD files themselves, through
//! `crd`).

mod core_kinds;
mod crd;
mod deckhouse;
mod kubevirt;

pub use crd::crd_to_def;
pub use deckhouse::DECKHOUSE_CRDS;

use crate::ServeFlavor;
use serde_json::Value;
use std::cmp::Ordering;
use std::sync::{Arc, OnceLock};

/// One printer column (`additionalPrinterColumns` entry).
#[derive(Debug, Clone)]
pub struct Column {
    /// Header text.
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// Optional OpenAPI format (e.g. `name`).
    pub format: String,
    /// Description shown by `kubectl explain`-like tools.
    pub description: String,
    /// 0 = always shown, 1 = only with `-o wide`.
    pub priority: i64,
    /// A JSONPath, or `@builtin` for the few computed core columns (see `table.rs`).
    pub json_path: String,
}

impl Column {
    fn new(name: &str, type_: &str, json_path: &str) -> Self {
        Column {
            name: name.into(),
            type_: type_.into(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            json_path: json_path.into(),
        }
    }
    fn wide(mut self) -> Self {
        self.priority = 1;
        self
    }
    fn age() -> Self {
        Column::new("Age", "date", ".metadata.creationTimestamp")
    }
}

/// Where a kind's schema lives.
#[derive(Debug, Clone)]
pub enum SchemaRef {
    /// Not validated (core kinds and the emulator's internal kinds).
    None,
    /// `openAPIV3Schema` of a CRD, per served version.
    Crd(Vec<(String, Arc<Value>)>),
    /// A CRD file embedded in the emulator, parsed the first time a schema is needed.
    Embedded(&'static EmbeddedCrd),
}

impl SchemaRef {
    /// The `openAPIV3Schema` of `version`, if the kind has one.
    pub fn for_version(&self, version: &str) -> Option<Arc<Value>> {
        let versions = match self {
            SchemaRef::None => return None,
            SchemaRef::Crd(v) => v,
            SchemaRef::Embedded(e) => e.schemas(),
        };
        versions
            .iter()
            .find(|(n, _)| n == version)
            .map(|(_, s)| s.clone())
    }
}

/// A `CustomResourceDefinition` YAML file compiled into the emulator (the KubeVirt and CDI
/// CRDs are large, so each is parsed only when its kind is first written or read).
#[derive(Debug)]
pub struct EmbeddedCrd {
    /// File name, for messages.
    pub file: &'static str,
    /// The YAML text.
    pub text: &'static str,
    parsed: OnceLock<Vec<(String, Arc<Value>)>>,
}

impl EmbeddedCrd {
    /// An embedded CRD file.
    pub const fn new(file: &'static str, text: &'static str) -> Self {
        EmbeddedCrd {
            file,
            text,
            parsed: OnceLock::new(),
        }
    }

    /// The parsed CRD object.
    pub fn crd(&self) -> Value {
        let y: yaml_serde::Value = yaml_serde::from_str(self.text)
            .unwrap_or_else(|e| panic!("embedded CRD {}: {e}", self.file));
        serde_json::to_value(y).unwrap_or_else(|e| panic!("embedded CRD {}: {e}", self.file))
    }

    /// `(version, openAPIV3Schema)` of every version the CRD defines.
    pub fn schemas(&self) -> &[(String, Arc<Value>)] {
        self.parsed
            .get_or_init(|| crd::version_schemas(&self.crd()))
    }
}

/// A stored resource type (what a CRD or built-in type is to a real API server).
#[derive(Debug, Clone)]
pub struct ResourceDef {
    /// API group, "" for core.
    pub group: String,
    /// Served versions, most preferred first.
    pub versions: Vec<String>,
    /// Plural resource name used in URLs.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Kind.
    pub kind: String,
    /// Short names (`vm`, `vmi`, …).
    pub short_names: Vec<String>,
    /// Categories (`all`, `virtualization`, …).
    pub categories: Vec<String>,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Whether `/status` is a separate subresource (main writes keep status, create drops it).
    pub has_status: bool,
    /// Whether objects are stored (false for create-only review kinds).
    pub stored: bool,
    /// Other subresources served by `handlers/` (e.g. `log` for pods).
    pub extra_subresources: Vec<&'static str>,
    /// Printer columns after `Name`.
    pub columns: Vec<Column>,
    /// Schema used for validation.
    pub schema: SchemaRef,
}

impl ResourceDef {
    /// Verbs listed in discovery.
    pub fn verbs(&self) -> Vec<&'static str> {
        if self.stored {
            vec![
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        } else {
            vec!["create"]
        }
    }

    /// Whether `version` is served.
    pub fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }

    /// `group/version` of the preferred version (`v1` for core).
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// `virtualmachines.kubevirt.io` / `pods`.
    pub fn qualified(&self) -> String {
        crate::core::status::qualified(&self.group, &self.plural)
    }
}

/// A group served only for its subresources (an aggregated API such as virt-api): discovery
/// entries exist, objects don't.
#[derive(Debug, Clone)]
pub struct AggregatedGroup {
    /// Group name.
    pub group: String,
    /// Its single version.
    pub version: String,
    /// `(name, namespaced, verbs)` entries such as `("virtualmachines/start", true, ["update"])`.
    pub entries: Vec<(String, bool, Vec<&'static str>)>,
}

/// Everything served, for one [`ServeFlavor`].
#[derive(Debug, Clone)]
pub struct Registry {
    /// Stored kinds.
    pub resources: Vec<Arc<ResourceDef>>,
    /// Subresource-only groups.
    pub aggregated: Vec<AggregatedGroup>,
}

/// Orders API versions like Kubernetes does (GA > beta > alpha, higher numbers first, then others
/// alphabetically). `Ordering::Less` means "more preferred".
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    fn key(v: &str) -> (u8, u32, u32) {
        let Some(rest) = v.strip_prefix('v') else {
            return (0, 0, 0);
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(major) = digits.parse::<u32>() else {
            return (0, 0, 0);
        };
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return (3, major, 0);
        }
        for (stage, prefix) in [(2, "beta"), (1, "alpha")] {
            if let Some(n) = tail
                .strip_prefix(prefix)
                .and_then(|n| n.parse::<u32>().ok())
            {
                return (stage, major, n);
            }
        }
        (0, 0, 0)
    }
    let (ka, kb) = (key(a), key(b));
    if ka.0 == 0 && kb.0 == 0 {
        a.cmp(b)
    } else {
        kb.cmp(&ka)
    }
}

#[allow(clippy::too_many_arguments)]
fn def(
    group: &str,
    versions: &[&str],
    plural: &str,
    kind: &str,
    short: &[&str],
    cats: &[&str],
    namespaced: bool,
    has_status: bool,
    columns: Vec<Column>,
    schema: SchemaRef,
) -> ResourceDef {
    let singular = kind.to_ascii_lowercase();
    ResourceDef {
        group: group.into(),
        versions: versions.iter().map(|s| s.to_string()).collect(),
        plural: plural.into(),
        singular,
        kind: kind.into(),
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: cats.iter().map(|s| s.to_string()).collect(),
        namespaced,
        has_status,
        stored: true,
        extra_subresources: vec![],
        columns,
        schema,
    }
}

impl Registry {
    /// The kinds served for `flavor` (core kinds are always served).
    pub fn new(flavor: ServeFlavor) -> Self {
        let mut defs = core_kinds::kinds();
        let mut aggregated = vec![];
        if matches!(flavor, ServeFlavor::KubeVirt | ServeFlavor::Both) {
            defs.extend(kubevirt::kinds());
            aggregated.push(kubevirt::aggregated());
        }
        if matches!(flavor, ServeFlavor::Deckhouse | ServeFlavor::Both) {
            defs.extend(deckhouse::DECKHOUSE.iter().cloned());
            defs.extend(crate::deckhouse::internal_kinds::defs());
            aggregated.push(deckhouse::aggregated());
        }
        Registry {
            resources: defs.into_iter().map(Arc::new).collect(),
            aggregated,
        }
    }

    /// The same without these API groups (neither their kinds nor their subresource-only
    /// groups are served).
    pub fn without_groups(mut self, groups: &[String]) -> Self {
        self.resources.retain(|r| !groups.contains(&r.group));
        self.aggregated.retain(|a| !groups.contains(&a.group));
        self
    }

    /// The kind served at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.plural == plural && r.serves(version))
            .cloned()
    }

    /// The kind with this group and plural, whatever the version.
    pub fn find_plural(&self, group: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.plural == plural)
            .cloned()
    }

    /// The kind for an object's `apiVersion` and `kind`.
    pub fn find_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceDef>> {
        let (group, version) = split_api_version(api_version);
        self.resources
            .iter()
            .find(|r| r.group == group && r.kind == kind && r.serves(version))
            .cloned()
    }

    /// All API groups (excluding core) with their versions, most preferred first; core kinds
    /// are at `/api/v1`.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = vec![];
        let mut add = |group: &str, version: &str| {
            if group.is_empty() {
                return;
            }
            match out.iter_mut().find(|(g, _)| g == group) {
                Some((_, vs)) => {
                    if !vs.iter().any(|v| v == version) {
                        vs.push(version.to_string());
                    }
                }
                None => out.push((group.to_string(), vec![version.to_string()])),
            }
        };
        for r in &self.resources {
            for v in &r.versions {
                add(&r.group, v);
            }
        }
        for a in &self.aggregated {
            add(&a.group, &a.version);
        }
        for (_, vs) in &mut out {
            vs.sort_by(|a, b| compare_versions(a, b));
        }
        out
    }

    /// The subresource-only group at `group/version`, if any.
    pub fn aggregated(&self, group: &str, version: &str) -> Option<&AggregatedGroup> {
        self.aggregated
            .iter()
            .find(|a| a.group == group && a.version == version)
    }
}

/// Splits `group/version` (`v1` alone is the core group).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_priority() {
        let mut v = vec!["v1alpha2", "v1", "v1beta1", "v1alpha3", "v2"];
        v.sort_by(|a, b| compare_versions(a, b));
        assert_eq!(v, ["v2", "v1", "v1beta1", "v1alpha3", "v1alpha2"]);
    }

    #[test]
    fn deckhouse_discovery_trap() {
        let r = Registry::new(ServeFlavor::Deckhouse);
        let groups = r.groups();
        let (_, versions) = groups
            .iter()
            .find(|(g, _)| g == "virtualization.deckhouse.io")
            .unwrap();
        assert_eq!(versions, &["v1alpha3", "v1alpha2"]);
        assert!(
            r.find("virtualization.deckhouse.io", "v1alpha3", "virtualmachines")
                .is_none()
        );
        assert!(
            r.find(
                "virtualization.deckhouse.io",
                "v1alpha3",
                "virtualmachineclasses"
            )
            .is_some()
        );
        let vm = r
            .find("virtualization.deckhouse.io", "v1alpha2", "virtualmachines")
            .unwrap();
        assert_eq!(vm.short_names, ["vm"]);
        assert!(vm.has_status && vm.namespaced);
        assert!(
            r.find("storage-foundation.deckhouse.io", "v1alpha1", "dataexports")
                .is_some()
        );
    }
}
