//! The kinds the emulator serves: names, scope, versions, printer columns and where their schema
//! comes from. KubeVirt/CDI kinds are described here (their CRDs are generated in Go upstream, so
//! only the swagger exists); Deckhouse kinds are read from the embedded CRD files themselves.

use crate::ServeFlavor;
use serde_json::Value;
use std::cmp::Ordering;
use std::sync::{Arc, LazyLock};

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
    /// Not validated (core kinds and kinds without a published schema).
    None,
    /// A definition of an embedded swagger document (`#/definitions/<name>`).
    Swagger {
        /// Which document.
        doc: SwaggerDoc,
        /// Definition name, e.g. `v1.VirtualMachine`.
        definition: &'static str,
    },
    /// `openAPIV3Schema` of a CRD, per served version.
    Crd(Vec<(String, Arc<Value>)>),
}

/// The embedded swagger documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwaggerDoc {
    /// kubevirt/kubevirt `api/openapi-spec/swagger.json`.
    KubeVirt,
    /// kubevirt/containerized-data-importer `api/openapi-spec/swagger.json`.
    Cdi,
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
    /// Other subresources served by `handlers.rs` (e.g. `log` for pods).
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
        crate::status::qualified(&self.group, &self.plural)
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

fn core_kinds() -> Vec<ResourceDef> {
    let c = Column::new;
    let age = Column::age;
    let none = || SchemaRef::None;
    let mut pods = def(
        "",
        &["v1"],
        "pods",
        "Pod",
        &["po"],
        &["all"],
        true,
        true,
        vec![
            c("Ready", "string", "@pod-ready"),
            c("Status", "string", ".status.phase"),
            c("Restarts", "string", "@pod-restarts"),
            age(),
            c("IP", "string", ".status.podIP").wide(),
            c("Node", "string", ".spec.nodeName").wide(),
        ],
        none(),
    );
    pods.extra_subresources = vec!["log"];
    let mut ssr = def(
        "authentication.k8s.io",
        &["v1"],
        "selfsubjectreviews",
        "SelfSubjectReview",
        &[],
        &[],
        false,
        false,
        vec![],
        none(),
    );
    ssr.stored = false;
    vec![
        def(
            "",
            &["v1"],
            "namespaces",
            "Namespace",
            &["ns"],
            &[],
            false,
            true,
            vec![c("Status", "string", ".status.phase"), age()],
            none(),
        ),
        def(
            "",
            &["v1"],
            "nodes",
            "Node",
            &["no"],
            &[],
            false,
            true,
            vec![
                c("Status", "string", "@node-status"),
                c("Roles", "string", "@node-roles"),
                age(),
                c("Version", "string", ".status.nodeInfo.kubeletVersion"),
                c(
                    "Internal-IP",
                    "string",
                    ".status.addresses[?(@.type=='InternalIP')].address",
                )
                .wide(),
            ],
            none(),
        ),
        pods,
        def(
            "",
            &["v1"],
            "events",
            "Event",
            &["ev"],
            &[],
            true,
            false,
            vec![
                c("Last Seen", "date", ".lastTimestamp"),
                c("Type", "string", ".type"),
                c("Reason", "string", ".reason"),
                c("Object", "string", "@event-object"),
                c("Message", "string", ".message"),
            ],
            none(),
        ),
        def(
            "",
            &["v1"],
            "persistentvolumeclaims",
            "PersistentVolumeClaim",
            &["pvc"],
            &[],
            true,
            true,
            vec![
                c("Status", "string", ".status.phase"),
                c("Volume", "string", ".spec.volumeName"),
                c("Capacity", "string", ".status.capacity.storage"),
                c("Access Modes", "string", "@access-modes"),
                c("StorageClass", "string", ".spec.storageClassName"),
                age(),
            ],
            none(),
        ),
        def(
            "",
            &["v1"],
            "persistentvolumes",
            "PersistentVolume",
            &["pv"],
            &[],
            false,
            true,
            vec![
                c("Capacity", "string", ".spec.capacity.storage"),
                c("Access Modes", "string", "@access-modes"),
                c(
                    "Reclaim Policy",
                    "string",
                    ".spec.persistentVolumeReclaimPolicy",
                ),
                c("Status", "string", ".status.phase"),
                c("StorageClass", "string", ".spec.storageClassName"),
                age(),
            ],
            none(),
        ),
        def(
            "",
            &["v1"],
            "secrets",
            "Secret",
            &[],
            &[],
            true,
            false,
            vec![
                c("Type", "string", ".type"),
                c("Data", "integer", "@data-count"),
                age(),
            ],
            none(),
        ),
        def(
            "",
            &["v1"],
            "configmaps",
            "ConfigMap",
            &["cm"],
            &[],
            true,
            false,
            vec![c("Data", "integer", "@data-count"), age()],
            none(),
        ),
        def(
            "",
            &["v1"],
            "resourcequotas",
            "ResourceQuota",
            &["quota"],
            &[],
            true,
            true,
            vec![age()],
            none(),
        ),
        def(
            "",
            &["v1"],
            "services",
            "Service",
            &["svc"],
            &["all"],
            true,
            true,
            vec![
                c("Type", "string", ".spec.type"),
                c("Cluster-IP", "string", ".spec.clusterIP"),
                age(),
            ],
            none(),
        ),
        def(
            "",
            &["v1"],
            "serviceaccounts",
            "ServiceAccount",
            &["sa"],
            &[],
            true,
            false,
            vec![age()],
            none(),
        ),
        def(
            "coordination.k8s.io",
            &["v1"],
            "leases",
            "Lease",
            &[],
            &[],
            true,
            false,
            vec![c("Holder", "string", ".spec.holderIdentity"), age()],
            none(),
        ),
        def(
            "rbac.authorization.k8s.io",
            &["v1"],
            "roles",
            "Role",
            &[],
            &[],
            true,
            false,
            vec![age()],
            none(),
        ),
        def(
            "rbac.authorization.k8s.io",
            &["v1"],
            "rolebindings",
            "RoleBinding",
            &[],
            &[],
            true,
            false,
            vec![c("Role", "string", ".roleRef.name"), age()],
            none(),
        ),
        def(
            "rbac.authorization.k8s.io",
            &["v1"],
            "clusterroles",
            "ClusterRole",
            &[],
            &[],
            false,
            false,
            vec![age()],
            none(),
        ),
        def(
            "rbac.authorization.k8s.io",
            &["v1"],
            "clusterrolebindings",
            "ClusterRoleBinding",
            &[],
            &[],
            false,
            false,
            vec![c("Role", "string", ".roleRef.name"), age()],
            none(),
        ),
        def(
            "storage.k8s.io",
            &["v1"],
            "storageclasses",
            "StorageClass",
            &["sc"],
            &[],
            false,
            false,
            vec![
                c("Provisioner", "string", ".provisioner"),
                c("ReclaimPolicy", "string", ".reclaimPolicy"),
                age(),
            ],
            none(),
        ),
        ssr,
    ]
}

fn swagger(doc: SwaggerDoc, definition: &'static str) -> SchemaRef {
    SchemaRef::Swagger { doc, definition }
}

fn kubevirt_kinds() -> Vec<ResourceDef> {
    use SwaggerDoc::{Cdi, KubeVirt as Kv};
    let c = Column::new;
    let age = Column::age;
    let ready = |t: &str| format!(".status.conditions[?(@.type=='{t}')].status");
    vec![
        def(
            "kubevirt.io",
            &["v1"],
            "virtualmachines",
            "VirtualMachine",
            &["vm", "vms"],
            &["all"],
            true,
            true,
            vec![
                age(),
                c("Status", "string", ".status.printableStatus"),
                c("Ready", "string", &ready("Ready")),
            ],
            swagger(Kv, "v1.VirtualMachine"),
        ),
        def(
            "kubevirt.io",
            &["v1"],
            "virtualmachineinstances",
            "VirtualMachineInstance",
            &["vmi", "vmis"],
            &["all"],
            true,
            true,
            vec![
                age(),
                c("Phase", "string", ".status.phase"),
                c("IP", "string", ".status.interfaces[0].ipAddress"),
                c("NodeName", "string", ".status.nodeName"),
                c("Ready", "string", &ready("Ready")),
                c("Live-Migratable", "string", &ready("LiveMigratable")).wide(),
                c("Paused", "string", &ready("Paused")).wide(),
            ],
            swagger(Kv, "v1.VirtualMachineInstance"),
        ),
        def(
            "kubevirt.io",
            &["v1"],
            "virtualmachineinstancemigrations",
            "VirtualMachineInstanceMigration",
            &["vmim", "vmims"],
            &["all"],
            true,
            true,
            vec![
                c("Phase", "string", ".status.phase"),
                c("VMI", "string", ".spec.vmiName"),
            ],
            swagger(Kv, "v1.VirtualMachineInstanceMigration"),
        ),
        def(
            "kubevirt.io",
            &["v1"],
            "kubevirts",
            "KubeVirt",
            &["kv", "kvs"],
            &["all"],
            true,
            true,
            vec![age(), c("Phase", "string", ".status.phase")],
            swagger(Kv, "v1.KubeVirt"),
        ),
        def(
            "export.kubevirt.io",
            &["v1", "v1beta1"],
            "virtualmachineexports",
            "VirtualMachineExport",
            &["vmexport", "vmexports"],
            &["all"],
            true,
            true,
            vec![
                c("SourceKind", "string", ".spec.source.kind"),
                c("SourceName", "string", ".spec.source.name"),
                c("Phase", "string", ".status.phase"),
            ],
            swagger(Kv, "v1.VirtualMachineExport"),
        ),
        def(
            "snapshot.kubevirt.io",
            &["v1beta1"],
            "virtualmachinesnapshots",
            "VirtualMachineSnapshot",
            &["vmsnapshot", "vmsnapshots"],
            &["all"],
            true,
            true,
            vec![
                age(),
                c("SourceKind", "string", ".spec.source.kind"),
                c("SourceName", "string", ".spec.source.name"),
                c("Phase", "string", ".status.phase"),
                c("ReadyToUse", "boolean", ".status.readyToUse"),
            ],
            swagger(Kv, "v1beta1.VirtualMachineSnapshot"),
        ),
        def(
            "snapshot.kubevirt.io",
            &["v1beta1"],
            "virtualmachinesnapshotcontents",
            "VirtualMachineSnapshotContent",
            &["vmsnapshotcontent", "vmsnapshotcontents"],
            &["all"],
            true,
            true,
            vec![age(), c("ReadyToUse", "boolean", ".status.readyToUse")],
            swagger(Kv, "v1beta1.VirtualMachineSnapshotContent"),
        ),
        def(
            "instancetype.kubevirt.io",
            &["v1beta1"],
            "virtualmachineinstancetypes",
            "VirtualMachineInstancetype",
            &["vminstancetype", "vminstancetypes", "vmf", "vmfs"],
            &[],
            true,
            false,
            vec![age()],
            swagger(Kv, "v1beta1.VirtualMachineInstancetype"),
        ),
        def(
            "instancetype.kubevirt.io",
            &["v1beta1"],
            "virtualmachineclusterinstancetypes",
            "VirtualMachineClusterInstancetype",
            &[
                "vmclusterinstancetype",
                "vmclusterinstancetypes",
                "vmcf",
                "vmcfs",
            ],
            &[],
            false,
            false,
            vec![age()],
            swagger(Kv, "v1beta1.VirtualMachineClusterInstancetype"),
        ),
        def(
            "instancetype.kubevirt.io",
            &["v1beta1"],
            "virtualmachinepreferences",
            "VirtualMachinePreference",
            &["vmpref", "vmprefs", "vmp", "vmps"],
            &[],
            true,
            false,
            vec![age()],
            swagger(Kv, "v1beta1.VirtualMachinePreference"),
        ),
        def(
            "instancetype.kubevirt.io",
            &["v1beta1"],
            "virtualmachineclusterpreferences",
            "VirtualMachineClusterPreference",
            &["vmcp", "vmcps"],
            &[],
            false,
            false,
            vec![age()],
            swagger(Kv, "v1beta1.VirtualMachineClusterPreference"),
        ),
        def(
            "cdi.kubevirt.io",
            &["v1beta1"],
            "datavolumes",
            "DataVolume",
            &["dv", "dvs"],
            &["all"],
            true,
            true,
            vec![
                c("Phase", "string", ".status.phase"),
                c("Progress", "string", ".status.progress"),
                c("Restarts", "integer", ".status.restartCount"),
                age(),
            ],
            swagger(Cdi, "v1beta1.DataVolume"),
        ),
        def(
            "cdi.kubevirt.io",
            &["v1beta1"],
            "datasources",
            "DataSource",
            &["das"],
            &["all"],
            true,
            true,
            vec![age()],
            swagger(Cdi, "v1beta1.DataSource"),
        ),
        def(
            "cdi.kubevirt.io",
            &["v1beta1"],
            "cdis",
            "CDI",
            &["cdi", "cdis"],
            &[],
            false,
            true,
            vec![age(), c("Phase", "string", ".status.phase")],
            swagger(Cdi, "v1beta1.CDI"),
        ),
        // Not in the CDI swagger, so served without validation.
        def(
            "cdi.kubevirt.io",
            &["v1beta1"],
            "storageprofiles",
            "StorageProfile",
            &[],
            &[],
            false,
            true,
            vec![age()],
            SchemaRef::None,
        ),
    ]
}

fn kubevirt_aggregated() -> AggregatedGroup {
    let mut entries = vec![];
    for sub in [
        "console",
        "vnc",
        "portforward",
        "usbredir",
        "vsock",
        "guestosinfo",
        "userlist",
        "filesystemlist",
    ] {
        entries.push((format!("virtualmachineinstances/{sub}"), true, vec!["get"]));
    }
    for sub in [
        "pause",
        "unpause",
        "freeze",
        "unfreeze",
        "softreboot",
        "reset",
        "addvolume",
        "removevolume",
    ] {
        entries.push((
            format!("virtualmachineinstances/{sub}"),
            true,
            vec!["update"],
        ));
    }
    for sub in [
        "start",
        "stop",
        "restart",
        "migrate",
        "addvolume",
        "removevolume",
        "memorydump",
    ] {
        entries.push((format!("virtualmachines/{sub}"), true, vec!["update"]));
    }
    for sub in ["portforward", "expand-spec"] {
        entries.push((format!("virtualmachines/{sub}"), true, vec!["get"]));
    }
    AggregatedGroup {
        group: "subresources.kubevirt.io".into(),
        version: "v1".into(),
        entries,
    }
}

fn deckhouse_aggregated() -> AggregatedGroup {
    let mut entries = vec![];
    for sub in ["console", "vnc", "portforward"] {
        entries.push((format!("virtualmachines/{sub}"), true, vec!["get"]));
    }
    for sub in ["addvolume", "removevolume", "freeze", "unfreeze"] {
        entries.push((format!("virtualmachines/{sub}"), true, vec!["update"]));
    }
    AggregatedGroup {
        group: "subresources.virtualization.deckhouse.io".into(),
        version: "v1alpha2".into(),
        entries,
    }
}

/// The embedded Deckhouse (and storage-foundation) CRD files.
pub const DECKHOUSE_CRDS: &[(&str, &str)] = &[
    (
        "virtualmachines.yaml",
        include_str!("../schemas/deckhouse/virtualmachines.yaml"),
    ),
    (
        "virtualdisks.yaml",
        include_str!("../schemas/deckhouse/virtualdisks.yaml"),
    ),
    (
        "virtualimages.yaml",
        include_str!("../schemas/deckhouse/virtualimages.yaml"),
    ),
    (
        "clustervirtualimages.yaml",
        include_str!("../schemas/deckhouse/clustervirtualimages.yaml"),
    ),
    (
        "virtualmachineclasses.yaml",
        include_str!("../schemas/deckhouse/virtualmachineclasses.yaml"),
    ),
    (
        "virtualmachineoperations.yaml",
        include_str!("../schemas/deckhouse/virtualmachineoperations.yaml"),
    ),
    (
        "virtualmachineblockdeviceattachments.yaml",
        include_str!("../schemas/deckhouse/virtualmachineblockdeviceattachments.yaml"),
    ),
    (
        "virtualdisksnapshots.yaml",
        include_str!("../schemas/deckhouse/virtualdisksnapshots.yaml"),
    ),
    (
        "virtualmachineipaddresses.yaml",
        include_str!("../schemas/deckhouse/virtualmachineipaddresses.yaml"),
    ),
    (
        "dataexports.yaml",
        include_str!("../schemas/deckhouse/dataexports.yaml"),
    ),
];

/// Parsed Deckhouse CRDs as resource definitions (parsed once, on first use).
static DECKHOUSE: LazyLock<Vec<ResourceDef>> = LazyLock::new(|| {
    DECKHOUSE_CRDS
        .iter()
        .flat_map(|(file, text)| {
            yaml_serde::Deserializer::from_str(text)
                .filter_map(|doc| {
                    let y = yaml_serde::Value::deserialize(doc).ok()?;
                    serde_json::to_value(y).ok()
                })
                .filter(|v| {
                    v.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition")
                })
                .map(|crd| {
                    crd_to_def(&crd).unwrap_or_else(|e| panic!("bad embedded CRD {file}: {e}"))
                })
                .collect::<Vec<_>>()
        })
        .collect()
});

use serde::Deserialize;

/// Builds a [`ResourceDef`] from a `CustomResourceDefinition` (apiextensions.k8s.io/v1).
pub fn crd_to_def(crd: &Value) -> Result<ResourceDef, String> {
    let spec = crd.get("spec").ok_or("no spec")?;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let names = spec.get("names").ok_or("no names")?;
    let mut versions: Vec<&Value> = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or("no versions")?
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(false))
        .collect();
    versions.sort_by(|a, b| compare_versions(&s(a, "name"), &s(b, "name")));
    let storage = versions
        .iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .or(versions.first())
        .ok_or("no served version")?;
    // Printer columns come from the storage version (they are identical across versions here).
    let columns = storage
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .map(|cols| {
            cols.iter()
                .map(|c| Column {
                    name: s(c, "name"),
                    type_: s(c, "type"),
                    format: s(c, "format"),
                    description: s(c, "description"),
                    priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    json_path: s(c, "jsonPath"),
                })
                .collect()
        })
        .unwrap_or_default();
    let schemas = versions
        .iter()
        .filter_map(|v| {
            let schema = v.get("schema")?.get("openAPIV3Schema")?.clone();
            Some((s(v, "name"), Arc::new(schema)))
        })
        .collect();
    Ok(ResourceDef {
        group: s(spec, "group"),
        versions: versions.iter().map(|v| s(v, "name")).collect(),
        plural: s(names, "plural"),
        singular: s(names, "singular"),
        kind: s(names, "kind"),
        short_names: strings(names.get("shortNames")),
        categories: strings(names.get("categories")),
        namespaced: s(spec, "scope") == "Namespaced",
        has_status: storage
            .get("subresources")
            .and_then(|r| r.get("status"))
            .is_some(),
        stored: true,
        extra_subresources: vec![],
        columns,
        schema: SchemaRef::Crd(schemas),
    })
}

impl Registry {
    /// The kinds served for `flavor` (core kinds are always served).
    pub fn new(flavor: ServeFlavor) -> Self {
        let mut defs = core_kinds();
        let mut aggregated = vec![];
        if matches!(flavor, ServeFlavor::KubeVirt | ServeFlavor::Both) {
            defs.extend(kubevirt_kinds());
            aggregated.push(kubevirt_aggregated());
        }
        if matches!(flavor, ServeFlavor::Deckhouse | ServeFlavor::Both) {
            defs.extend(DECKHOUSE.iter().cloned());
            defs.extend(crate::internal_kinds::defs());
            aggregated.push(deckhouse_aggregated());
        }
        Registry {
            resources: defs.into_iter().map(Arc::new).collect(),
            aggregated,
        }
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
