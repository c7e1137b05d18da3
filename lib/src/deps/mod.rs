//! `kubectl vm deps VM` (alias `objectgraph`): the objects a VM depends on (disks, images,
//! Secrets, its instance and launcher pod, ...) and those that depend on it (snapshots,
//! exports, Services from `expose`), plus what owns it (a pool).
//!
//! KubeVirt's own `virtualmachines/{name}/objectgraph` subresource (kubevirt
//! `pkg/virt-api/rest/objectgraph.go`, v1.6+) answers the "depends on" half (nodes below the
//! VM; no snapshots, exports or Services) and only with the `ObjectGraph` feature gate (a 400
//! without it, a 404 before v1.6). Where it answers, its nodes are used (existence checked for
//! the kinds a VM needs: references are nodes whether or not their object exists); otherwise
//! that half is computed here by the same rules (volumes: DataVolume → PVC, PVC, ConfigMap,
//! Secret, ServiceAccount, cloud-init `secretRef`/`networkDataSecretRef`; access-credential
//! Secrets; instance types and preferences as optional nodes; the VMI and its launcher pod;
//! Multus networks), and on Deckhouse from its own references. The other half is always
//! computed here. The JSON keeps upstream's node names (`objectReference`, `optional`,
//! `children`) so backup tools can read either.

mod deckhouse;
mod kubevirt;

use serde::Serialize;
use serde_json::Value;

use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};
use crate::flavor::Flavor;

/// One object in the graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// What it is.
    pub object_reference: ObjectRef,
    /// Whether the VM works without it (upstream's `optional`: instance types, preferences,
    /// networks, classes).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// Whether it exists now (`false`: referenced but missing).
    pub exists: bool,
    /// Objects below it (a DataVolume's PVC, a VMI's pod).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<Node>,
}

/// An object's identity (upstream's `TypedObjectReference` fields).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// API group (`""`: core).
    pub api_group: String,
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
    /// Namespace (`None`: cluster-scoped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// The graph of one VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Graph {
    /// The VM.
    pub object_reference: ObjectRef,
    /// What the VM needs.
    pub depends_on: Vec<Node>,
    /// What needs the VM (made from it or pointing at it).
    pub dependents: Vec<Node>,
    /// What owns the VM (a pool).
    pub owned_by: Vec<Node>,
}

impl Node {
    /// A node for `kind` `name` in `namespace`.
    pub fn new(group: &str, kind: &str, name: &str, namespace: Option<&str>) -> Node {
        Node {
            object_reference: ObjectRef {
                api_group: group.to_owned(),
                kind: kind.to_owned(),
                name: name.to_owned(),
                namespace: namespace.map(str::to_owned),
            },
            optional: false,
            exists: true,
            children: Vec::new(),
        }
    }

    fn optional(mut self) -> Node {
        self.optional = true;
        self
    }

    fn with_children(mut self, children: Vec<Node>) -> Node {
        self.children = children;
        self
    }

    fn missing_unless(mut self, exists: bool) -> Node {
        self.exists = exists;
        self
    }
}

/// Reads the VM and what is around it and builds its graph.
pub async fn graph(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    name: &str,
) -> Result<Graph> {
    match flavor {
        Flavor::KubeVirt => kubevirt::graph(cluster, namespace, name).await,
        Flavor::Deckhouse => deckhouse::graph(cluster, namespace, name).await,
    }
}

/// Every node of a graph's part, depth first.
pub fn flatten(nodes: &[Node]) -> Vec<&Node> {
    let mut out = Vec::new();
    for n in nodes {
        out.push(n);
        out.extend(flatten(&n.children));
    }
    out
}

/// Lines of the graph as a tree (what `deps` prints by default).
pub fn tree(graph: &Graph) -> Vec<String> {
    let r = &graph.object_reference;
    let mut lines = vec![format!(
        "{} {}{}",
        kind_name(&r.kind, &r.api_group),
        r.name,
        r.namespace
            .as_deref()
            .map(|ns| format!(" (namespace {ns})"))
            .unwrap_or_default()
    )];
    let parts: Vec<(&str, &Vec<Node>)> = [
        ("depends on", &graph.depends_on),
        ("depended on by", &graph.dependents),
        ("owned by", &graph.owned_by),
    ]
    .into_iter()
    .filter(|(_, n)| !n.is_empty())
    .collect();
    for (i, (title, nodes)) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        lines.push(format!("{}{title}", if last { "└── " } else { "├── " }));
        let prefix = if last { "    " } else { "│   " };
        branch(nodes, prefix, &mut lines);
    }
    lines
}

fn branch(nodes: &[Node], prefix: &str, lines: &mut Vec<String>) {
    for (i, n) in nodes.iter().enumerate() {
        let last = i + 1 == nodes.len();
        let r = &n.object_reference;
        let mut notes = Vec::new();
        if n.optional {
            notes.push("optional");
        }
        if !n.exists {
            notes.push("missing");
        }
        let notes = if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join(", "))
        };
        lines.push(format!(
            "{prefix}{}{} {}{notes}",
            if last { "└── " } else { "├── " },
            kind_name(&r.kind, &r.api_group),
            r.name
        ));
        let deeper = format!("{prefix}{}", if last { "    " } else { "│   " });
        branch(&n.children, &deeper, lines);
    }
}

/// `kind.group` as kubectl names resources (`Secret`, `DataVolume.cdi.kubevirt.io`).
fn kind_name(kind: &str, group: &str) -> String {
    if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    }
}

/// `GET path` as JSON; `None` when the server does not serve it (404) or the object is gone.
async fn get_json(cluster: &Cluster, path: &str, action: &Action) -> Result<Option<Value>> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| Error::Internal(e.to_string()))?;
    match cluster.client.request::<Value>(request).await {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(cluster.error(e, action)),
    }
}

/// The items of a namespaced list at `/apis/GROUP/VERSION/namespaces/NS/PLURAL` (or the core
/// group's); empty when the kind is not served.
async fn list(
    cluster: &Cluster,
    group: &str,
    version: &str,
    plural: &str,
    namespace: &str,
) -> Result<Vec<Value>> {
    let base = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let path = format!("{base}/namespaces/{namespace}/{plural}");
    let action = Action::new(
        "list",
        plural.to_owned(),
        plural.trim_end_matches('s').to_owned(),
    )
    .in_namespace(Some(namespace));
    let list = get_json(cluster, &path, &action).await?;
    Ok(list
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default())
}

/// Names of the `items` (for existence checks).
fn names(items: &[Value]) -> std::collections::BTreeSet<String> {
    items
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// The Services that point at the VM: made by `expose` for it (label `kubevm.io/vm`), or
/// selecting its launcher pod's labels.
fn services(
    services: &[Value],
    vm: &str,
    namespace: &str,
    pod_labels: Option<&Value>,
) -> Vec<Node> {
    services
        .iter()
        .filter(|s| {
            let ours = s["metadata"]["labels"][crate::names::VM_LABEL] == vm;
            let selects = s["spec"]["selector"].as_object().is_some_and(|sel| {
                !sel.is_empty()
                    && pod_labels.is_some_and(|labels| sel.iter().all(|(k, v)| labels[k] == *v))
            });
            ours || selects
        })
        .filter_map(|s| s["metadata"]["name"].as_str())
        .map(|n| Node::new("", "Service", n, Some(namespace)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_lines() {
        let g = Graph {
            object_reference: ObjectRef {
                api_group: "kubevirt.io".into(),
                kind: "VirtualMachine".into(),
                name: "web".into(),
                namespace: Some("default".into()),
            },
            depends_on: vec![
                Node::new("cdi.kubevirt.io", "DataVolume", "web-root", Some("default"))
                    .with_children(vec![Node::new(
                        "",
                        "PersistentVolumeClaim",
                        "web-root",
                        Some("default"),
                    )]),
                Node::new("", "Secret", "gone", Some("default")).missing_unless(false),
            ],
            dependents: vec![Node::new("", "Service", "web-ssh", Some("default"))],
            owned_by: vec![],
        };
        assert_eq!(
            tree(&g).join("\n"),
            "VirtualMachine.kubevirt.io web (namespace default)\n\
             ├── depends on\n\
             │   ├── DataVolume.cdi.kubevirt.io web-root\n\
             │   │   └── PersistentVolumeClaim web-root\n\
             │   └── Secret gone (missing)\n\
             └── depended on by\n\
             \x20   └── Service web-ssh"
        );
    }

    #[test]
    fn services_by_label_or_selector() {
        let svcs = vec![
            serde_json::json!({"metadata": {"name": "a", "labels": {"kubevm.io/vm": "web"}}, "spec": {}}),
            serde_json::json!({"metadata": {"name": "b"}, "spec": {"selector": {"vm.kubevirt.io/name": "web"}}}),
            serde_json::json!({"metadata": {"name": "c"}, "spec": {"selector": {"vm.kubevirt.io/name": "db"}}}),
            serde_json::json!({"metadata": {"name": "d"}, "spec": {}}),
        ];
        let labels =
            serde_json::json!({"vm.kubevirt.io/name": "web", "kubevirt.io": "virt-launcher"});
        let got: Vec<String> = services(&svcs, "web", "default", Some(&labels))
            .into_iter()
            .map(|n| n.object_reference.name)
            .collect();
        assert_eq!(got, ["a", "b"]);
    }
}
