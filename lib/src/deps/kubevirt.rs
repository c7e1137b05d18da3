//! KubeVirt: the "depends on" half as upstream's objectgraph builds it
//! (`pkg/virt-api/rest/objectgraph.go` `buildChildrenFromVM`, `addVolumeGraph`,
//! `getAccessCredentialNodes`, `getInstanceTypeMatcherResource`, `handleNetworkNodes`,
//! `getLauncherPodNode`), plus snapshots, exports and Services that point at the VM, and the
//! pool that owns it.

use serde_json::Value;

use super::{Graph, Node, ObjectRef, get_json, list, names, services};
use crate::api::KUBEVIRT_VM;
use crate::cluster::Cluster;
use crate::error::{Action, Result};

/// Whether `path` names an object that exists (a 404 is `false`; other errors count as
/// existing: the graph does not fail on what the user may not read).
async fn exists(cluster: &Cluster, path: String) -> bool {
    let action = Action::new("get", "objects", "object");
    !matches!(get_json(cluster, &path, &action).await, Ok(None))
}

fn core(ns: &str, plural: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{ns}/{plural}/{name}")
}

pub(super) async fn graph(cluster: &Cluster, ns: &str, name: &str) -> Result<Graph> {
    let vm = KUBEVIRT_VM
        .api(&cluster.client, Some(ns))
        .get(name)
        .await
        .map_err(|e| cluster.error(e, &KUBEVIRT_VM.action("get", Some(ns)).named(name)))?;
    let vm = serde_json::to_value(vm).unwrap_or_default();
    let spec = &vm["spec"]["template"]["spec"];
    let (pods, dvs, svcs, snapshots, exports_beta, exports_v1) = futures::try_join!(
        list(cluster, "", "v1", "pods", ns),
        list(cluster, "cdi.kubevirt.io", "v1beta1", "datavolumes", ns),
        list(cluster, "", "v1", "services", ns),
        list(
            cluster,
            "snapshot.kubevirt.io",
            "v1beta1",
            "virtualmachinesnapshots",
            ns
        ),
        list(
            cluster,
            "export.kubevirt.io",
            "v1beta1",
            "virtualmachineexports",
            ns
        ),
        list(
            cluster,
            "export.kubevirt.io",
            "v1",
            "virtualmachineexports",
            ns
        ),
    )?;
    let dv_names = names(&dvs);
    let depends = match objectgraph(cluster, ns, name).await {
        Some(mut served) => {
            for n in &mut served {
                n.exists = exists_node(cluster, ns, n, &dv_names).await;
                for c in &mut n.children {
                    c.exists = exists_node(cluster, ns, c, &dv_names).await;
                }
            }
            served
        }
        None => {
            let mut depends = instance_nodes(&vm, &pods, name, ns);
            depends.extend(instancetype_nodes(&vm, ns));
            depends.extend(access_credential_nodes(cluster, spec, ns).await);
            depends.extend(volume_nodes(cluster, spec, ns, &dv_names).await);
            depends.extend(network_nodes(spec, ns));
            depends
        }
    };
    Ok(finish(
        vm,
        name,
        ns,
        depends,
        &pods,
        &svcs,
        &snapshots,
        exports_beta,
        exports_v1,
    ))
}

/// The VMI and its launcher pod (owned by the VMI), when the VM has an instance
/// (`getLauncherPodNode`).
fn instance_nodes(vm: &Value, pods: &[Value], name: &str, ns: &str) -> Vec<Node> {
    let mut depends = Vec::new();
    if vm["status"]["created"] == true {
        let launcher = pods.iter().find(|p| {
            p["metadata"]["labels"]["kubevirt.io"] == "virt-launcher"
                && p["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|o| {
                        o.iter()
                            .any(|r| r["kind"] == "VirtualMachineInstance" && r["name"] == name)
                    })
        });
        let children = launcher
            .and_then(|p| p["metadata"]["name"].as_str())
            .map(|p| vec![Node::new("", "Pod", p, Some(ns))])
            .unwrap_or_default();
        depends.push(
            Node::new("kubevirt.io", "VirtualMachineInstance", name, Some(ns))
                .with_children(children),
        );
    }
    depends
}

/// Instance type and preference (optional), with their ControllerRevisions
/// (`getInstanceTypeMatcherResource`).
fn instancetype_nodes(vm: &Value, ns: &str) -> Vec<Node> {
    let mut depends = Vec::new();
    for (field, status) in [
        ("instancetype", "instancetypeRef"),
        ("preference", "preferenceRef"),
    ] {
        let m = &vm["spec"][field];
        let Some(mname) = m["name"].as_str() else {
            continue;
        };
        let kind = m["kind"].as_str().unwrap_or(if field == "instancetype" {
            "VirtualMachineClusterInstancetype"
        } else {
            "VirtualMachineClusterPreference"
        });
        let cluster_scoped = kind.contains("Cluster");
        depends.push(
            Node::new(
                "instancetype.kubevirt.io",
                kind,
                mname,
                (!cluster_scoped).then_some(ns),
            )
            .optional(),
        );
        let revision = vm["status"][status]["controllerRevisionRef"]["name"]
            .as_str()
            .or(m["revisionName"].as_str());
        if let Some(rev) = revision {
            depends.push(Node::new("apps", "ControllerRevision", rev, Some(ns)));
        }
    }
    depends
}

/// The Secrets of the access credentials (`getAccessCredentialNodes`).
async fn access_credential_nodes(cluster: &Cluster, spec: &Value, ns: &str) -> Vec<Node> {
    let mut depends = Vec::new();
    for ac in spec["accessCredentials"].as_array().into_iter().flatten() {
        let secret = ac["sshPublicKey"]["source"]["secret"]["secretName"]
            .as_str()
            .or(ac["userPassword"]["source"]["secret"]["secretName"].as_str());
        if let Some(s) = secret {
            let ok = exists(cluster, core(ns, "secrets", s)).await;
            depends.push(Node::new("", "Secret", s, Some(ns)).missing_unless(ok));
        }
    }
    depends
}

/// What each volume reads: DataVolumes with their claims, claims, ConfigMaps, Secrets,
/// ServiceAccounts and cloud-init Secrets (`addVolumeGraph`).
async fn volume_nodes(
    cluster: &Cluster,
    spec: &Value,
    ns: &str,
    dv_names: &std::collections::BTreeSet<String>,
) -> Vec<Node> {
    let mut depends = Vec::new();
    for v in spec["volumes"].as_array().into_iter().flatten() {
        if let Some(dv) = v["dataVolume"]["name"].as_str() {
            let pvc = exists(cluster, core(ns, "persistentvolumeclaims", dv)).await;
            depends.push(
                Node::new("cdi.kubevirt.io", "DataVolume", dv, Some(ns))
                    .missing_unless(dv_names.contains(dv))
                    .with_children(vec![
                        Node::new("", "PersistentVolumeClaim", dv, Some(ns)).missing_unless(pvc),
                    ]),
            );
        } else if let Some(c) = v["persistentVolumeClaim"]["claimName"].as_str() {
            let ok = exists(cluster, core(ns, "persistentvolumeclaims", c)).await;
            depends.push(Node::new("", "PersistentVolumeClaim", c, Some(ns)).missing_unless(ok));
        } else if let Some(c) = v["configMap"]["name"].as_str() {
            let ok = exists(cluster, core(ns, "configmaps", c)).await;
            depends.push(Node::new("", "ConfigMap", c, Some(ns)).missing_unless(ok));
        } else if let Some(s) = v["secret"]["secretName"].as_str() {
            let ok = exists(cluster, core(ns, "secrets", s)).await;
            depends.push(Node::new("", "Secret", s, Some(ns)).missing_unless(ok));
        } else if let Some(s) = v["serviceAccount"]["serviceAccountName"].as_str() {
            let ok = exists(cluster, core(ns, "serviceaccounts", s)).await;
            depends.push(Node::new("", "ServiceAccount", s, Some(ns)).missing_unless(ok));
        } else {
            // `UserDataSecretRef` is `secretRef` in JSON (kubevirt `api/core/v1/schema.go`).
            for source in ["cloudInitNoCloud", "cloudInitConfigDrive"] {
                for r in ["secretRef", "networkDataSecretRef"] {
                    if let Some(s) = v[source][r]["name"].as_str() {
                        let ok = exists(cluster, core(ns, "secrets", s)).await;
                        depends.push(Node::new("", "Secret", s, Some(ns)).missing_unless(ok));
                    }
                }
            }
        }
    }
    depends
}

/// Multus NetworkAttachmentDefinitions (optional; `handleNetworkNodes`).
fn network_nodes(spec: &Value, ns: &str) -> Vec<Node> {
    let mut depends = Vec::new();
    for net in spec["networks"].as_array().into_iter().flatten() {
        if let Some(full) = net["multus"]["networkName"]
            .as_str()
            .filter(|n| !n.is_empty())
        {
            let (nad_ns, nad) = full.split_once('/').unwrap_or((ns, full));
            depends.push(
                Node::new(
                    "k8s.cni.cncf.io",
                    "NetworkAttachmentDefinition",
                    nad,
                    Some(nad_ns),
                )
                .optional(),
            );
        }
    }
    depends
}

/// The graph from the "depends on" half: what points at the VM and what owns it.
#[allow(clippy::too_many_arguments)]
fn finish(
    vm: Value,
    name: &str,
    ns: &str,
    depends: Vec<Node>,
    pods: &[Value],
    svcs: &[Value],
    snapshots: &[Value],
    exports_beta: Vec<Value>,
    exports_v1: Vec<Value>,
) -> Graph {
    // What points at the VM.
    let mut dependents = Vec::new();
    let mine: Vec<&Value> = snapshots
        .iter()
        .filter(|s| {
            s["spec"]["source"]["kind"] == "VirtualMachine" && s["spec"]["source"]["name"] == name
        })
        .collect();
    let snapshot_names: Vec<&str> = mine
        .iter()
        .filter_map(|s| s["metadata"]["name"].as_str())
        .collect();
    for s in &snapshot_names {
        dependents.push(Node::new(
            "snapshot.kubevirt.io",
            "VirtualMachineSnapshot",
            s,
            Some(ns),
        ));
    }
    let exports = if exports_v1.is_empty() {
        exports_beta
    } else {
        exports_v1
    };
    for e in &exports {
        let source = &e["spec"]["source"];
        let kind = source["kind"].as_str().unwrap_or("");
        let sname = source["name"].as_str().unwrap_or("");
        let points = (kind == "VirtualMachine" && sname == name)
            || (kind == "VirtualMachineSnapshot" && snapshot_names.contains(&sname));
        if points && let Some(n) = e["metadata"]["name"].as_str() {
            dependents.push(Node::new(
                "export.kubevirt.io",
                "VirtualMachineExport",
                n,
                Some(ns),
            ));
        }
    }
    let launcher_labels = pods
        .iter()
        .find(|p| {
            p["metadata"]["labels"]["kubevirt.io"] == "virt-launcher"
                && p["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|o| {
                        o.iter()
                            .any(|r| r["kind"] == "VirtualMachineInstance" && r["name"] == name)
                    })
        })
        .map(|p| p["metadata"]["labels"].clone());
    dependents.extend(services(svcs, name, ns, launcher_labels.as_ref()));

    // The pool that owns it.
    let owned_by = vm["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["kind"] == "VirtualMachinePool")
        .filter_map(|o| o["name"].as_str())
        .map(|p| Node::new("pool.kubevirt.io", "VirtualMachinePool", p, Some(ns)))
        .collect();
    Graph {
        object_reference: ObjectRef {
            api_group: "kubevirt.io".into(),
            kind: "VirtualMachine".into(),
            name: name.to_owned(),
            namespace: Some(ns.to_owned()),
        },
        depends_on: depends,
        dependents,
        owned_by,
    }
}

/// The VM's `objectgraph` subresource (kubevirt `pkg/virt-api/rest/objectgraph.go`) as nodes,
/// when the cluster serves it: `None` when it does not (an older KubeVirt: 404; the
/// `ObjectGraph` feature gate off: 400) or refuses, and the graph is then computed here.
async fn objectgraph(cluster: &Cluster, ns: &str, name: &str) -> Option<Vec<Node>> {
    let path = format!(
        "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/objectgraph"
    );
    // A GET with an ObjectGraphOptions body, as virtctl sends it.
    let request = http::Request::get(&path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(b"{}".to_vec())
        .ok()?;
    let root: Value = cluster.client.request(request).await.ok()?;
    fn convert(v: &Value) -> Node {
        let r = &v["objectReference"];
        let ns = r["namespace"].as_str().filter(|n| !n.is_empty());
        let mut n = Node::new(
            r["apiGroup"].as_str().unwrap_or(""),
            r["kind"].as_str().unwrap_or(""),
            r["name"].as_str().unwrap_or(""),
            ns,
        );
        n.optional = v["optional"] == true;
        n.children = v["children"]
            .as_array()
            .into_iter()
            .flatten()
            .map(convert)
            .collect();
        n
    }
    Some(
        root["children"]
            .as_array()
            .into_iter()
            .flatten()
            .map(convert)
            .collect(),
    )
}

/// Whether a node the platform reported exists (references are nodes whether or not their
/// object does): checked for the kinds a VM needs to start.
async fn exists_node(
    cluster: &Cluster,
    ns: &str,
    n: &Node,
    dv_names: &std::collections::BTreeSet<String>,
) -> bool {
    let name = &n.object_reference.name;
    let plural = match n.object_reference.kind.as_str() {
        "DataVolume" => return dv_names.contains(name),
        "Secret" => "secrets",
        "ConfigMap" => "configmaps",
        "PersistentVolumeClaim" => "persistentvolumeclaims",
        "ServiceAccount" => "serviceaccounts",
        _ => return true,
    };
    exists(cluster, core(ns, plural, name)).await
}
