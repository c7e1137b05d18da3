//! KubeVirt's `objectgraph` subresource on `virtualmachines` and `virtualmachineinstances`
//! (kubevirt `pkg/virt-api/rest/objectgraph.go`, v1.6+): a GET with an `ObjectGraphOptions`
//! JSON body (`includeOptionalNodes`, `labelSelector`) answering an `ObjectGraphNode` tree of
//! what the object refers to. As upstream:
//! - 400 `ObjectGraph feature gate not enabled: Unable to return object graph.` unless the
//!   KubeVirt CR lists the `ObjectGraph` feature gate
//!   (`pkg/virt-config/featuregate/active.go`);
//! - nodes come from references, not from reading the objects (a missing Secret is still a
//!   node), each labelled `kubevirt.io/dependency-type` storage|network|compute|config;
//! - VM children: the VMI when `status.created` (with the launcher pod owned by it), instance
//!   type and preference (optional) with their ControllerRevision, access-credential Secrets,
//!   volumes (DataVolume → its PVC, PVC, ConfigMap, Secret, ServiceAccount, cloud-init
//!   `secretRef`/`networkDataSecretRef`), Multus networks (optional);
//! - optional nodes are dropped only when `includeOptionalNodes` is explicitly false; a
//!   `labelSelector` (`matchLabels` here) keeps matching nodes (the root always stays).

use serde_json::{Value, json};

use crate::core::app::App;
use crate::core::status::ApiError;
use crate::core::store::Key;

/// The answer to `objectgraph` on `plural` `ns/name`, or `None` for other subresources.
pub fn answer(
    app: &App,
    plural: &str,
    ns: &str,
    name: &str,
    sub: &str,
    body: &[u8],
) -> Option<Result<Value, ApiError>> {
    if sub != "objectgraph" || !matches!(plural, "virtualmachines" | "virtualmachineinstances") {
        return None;
    }
    if !gate_enabled(app) {
        return Some(Err(ApiError::bad_request(
            "ObjectGraph feature gate not enabled: Unable to return object graph.",
        )));
    }
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return Some(Err(ApiError::bad_request(format!(
                    "Can not unmarshal Request body to struct, error: {e}"
                ))));
            }
        }
    };
    let obj = app.store.get(&Key::new("kubevirt.io", plural, ns, name))?;
    let (kind_plural, children) = if plural == "virtualmachines" {
        ("virtualmachines", vm_children(app, &obj, ns, name))
    } else {
        ("virtualmachineinstances", vmi_children(app, &obj, ns, name))
    };
    let mut root = node(name, ns, kind_plural, vec![], false);
    root["children"] = json!(filter(children, &options));
    Some(Ok(root))
}

fn gate_enabled(app: &App) -> bool {
    let (items, _) = app.store.list("kubevirt.io", "kubevirts", None);
    items.iter().any(|kv| {
        kv.pointer("/spec/configuration/developerConfiguration/featureGates")
            .and_then(Value::as_array)
            .is_some_and(|g| g.iter().any(|f| f == "ObjectGraph"))
    })
}

/// Upstream `objectGraphMap` and `getResourceDependencyType`.
fn group_kind(plural: &str) -> (&'static str, &'static str, &'static str) {
    match plural {
        "virtualmachines" => ("kubevirt.io", "VirtualMachine", "compute"),
        "virtualmachineinstances" => ("kubevirt.io", "VirtualMachineInstance", "compute"),
        "virtualmachineinstancetypes" => (
            "instancetype.kubevirt.io",
            "VirtualMachineInstancetype",
            "config",
        ),
        "virtualmachineclusterinstancetypes" => (
            "instancetype.kubevirt.io",
            "VirtualMachineClusterInstancetype",
            "config",
        ),
        "virtualmachinepreferences" => (
            "instancetype.kubevirt.io",
            "VirtualMachinePreference",
            "config",
        ),
        "virtualmachineclusterpreferences" => (
            "instancetype.kubevirt.io",
            "VirtualMachineClusterPreference",
            "config",
        ),
        "datavolumes" => ("cdi.kubevirt.io", "DataVolume", "storage"),
        "controllerrevisions" => ("apps", "ControllerRevision", "config"),
        "configmaps" => ("", "ConfigMap", "config"),
        "persistentvolumeclaims" => ("", "PersistentVolumeClaim", "storage"),
        "serviceaccounts" => ("", "ServiceAccount", "config"),
        "secrets" => ("", "Secret", "config"),
        "pods" => ("", "Pod", "compute"),
        _ => ("k8s.cni.cncf.io", "NetworkAttachmentDefinition", "network"),
    }
}

/// Upstream `newGraphNode`.
fn node(name: &str, ns: &str, plural: &str, children: Vec<Value>, optional: bool) -> Value {
    let (group, kind, dep) = group_kind(plural);
    let mut n = json!({
        "objectReference": {"apiGroup": group, "kind": kind, "name": name, "namespace": ns},
        "labels": {"kubevirt.io/dependency-type": dep},
    });
    if !children.is_empty() {
        n["children"] = json!(children);
    }
    if optional {
        n["optional"] = json!(true);
    }
    n
}

fn launcher_pod(app: &App, ns: &str, vmi: &str) -> Option<Value> {
    let (pods, _) = app.store.list("", "pods", Some(ns));
    pods.iter()
        .filter(|p| {
            p.pointer("/metadata/labels/kubevirt.io")
                .and_then(Value::as_str)
                == Some("virt-launcher")
        })
        .find(|p| {
            p.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|o| {
                    o.iter()
                        .any(|r| r["kind"] == "VirtualMachineInstance" && r["name"] == vmi)
                })
        })
        .map(|p| {
            node(
                crate::core::util::meta_str(p, "name"),
                ns,
                "pods",
                vec![],
                false,
            )
        })
}

fn vm_children(app: &App, vm: &Value, ns: &str, name: &str) -> Vec<Value> {
    let mut out = Vec::new();
    if vm.pointer("/status/created") == Some(&Value::Bool(true)) {
        let pod: Vec<Value> = launcher_pod(app, ns, name).into_iter().collect();
        out.push(node(name, ns, "virtualmachineinstances", pod, false));
    }
    for (field, status) in [
        ("instancetype", "instancetypeRef"),
        ("preference", "preferenceRef"),
    ] {
        let m = &vm["spec"][field];
        let Some(mname) = m["name"].as_str() else {
            continue;
        };
        let kind = m["kind"].as_str().unwrap_or("");
        let plural = format!("{}s", kind.to_ascii_lowercase());
        match plural.as_str() {
            "virtualmachineclusterinstancetypes" | "virtualmachineclusterpreferences" => {
                out.push(node(mname, "", &plural, vec![], true))
            }
            "virtualmachineinstancetypes" | "virtualmachinepreferences" => {
                out.push(node(mname, ns, &plural, vec![], true))
            }
            _ => {}
        }
        let st = &vm["status"][status];
        if let Some(rev) = st["controllerRevisionRef"]["name"].as_str() {
            out.push(node(rev, ns, "controllerrevisions", vec![], false));
        } else if st.is_null()
            && let Some(rev) = m["revisionName"].as_str().filter(|r| !r.is_empty())
        {
            out.push(node(rev, ns, "controllerrevisions", vec![], false));
        }
    }
    let spec = &vm["spec"]["template"]["spec"];
    out.extend(spec_children(spec, ns));
    out
}

fn vmi_children(app: &App, vmi: &Value, ns: &str, name: &str) -> Vec<Value> {
    let mut out: Vec<Value> = launcher_pod(app, ns, name).into_iter().collect();
    out.extend(spec_children(&vmi["spec"], ns));
    out
}

/// Access credentials, volumes and networks of a VMI spec.
fn spec_children(spec: &Value, ns: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for ac in spec["accessCredentials"].as_array().into_iter().flatten() {
        if let Some(s) = ac["sshPublicKey"]["source"]["secret"]["secretName"].as_str() {
            out.push(node(s, ns, "secrets", vec![], false));
        } else if let Some(s) = ac["userPassword"]["source"]["secret"]["secretName"].as_str() {
            out.push(node(s, ns, "secrets", vec![], false));
        }
    }
    for v in spec["volumes"].as_array().into_iter().flatten() {
        if let Some(dv) = v["dataVolume"]["name"].as_str() {
            let pvc = node(dv, ns, "persistentvolumeclaims", vec![], false);
            out.push(node(dv, ns, "datavolumes", vec![pvc], false));
        } else if let Some(c) = v["persistentVolumeClaim"]["claimName"].as_str() {
            out.push(node(c, ns, "persistentvolumeclaims", vec![], false));
        } else if let Some(c) = v["configMap"]["name"].as_str() {
            out.push(node(c, ns, "configmaps", vec![], false));
        } else if let Some(s) = v["secret"]["secretName"].as_str() {
            out.push(node(s, ns, "secrets", vec![], false));
        } else if let Some(s) = v["serviceAccount"]["serviceAccountName"].as_str() {
            out.push(node(s, ns, "serviceaccounts", vec![], false));
        } else {
            for source in ["cloudInitNoCloud", "cloudInitConfigDrive"] {
                for r in ["secretRef", "networkDataSecretRef"] {
                    if let Some(s) = v[source][r]["name"].as_str() {
                        out.push(node(s, ns, "secrets", vec![], false));
                    }
                }
            }
        }
    }
    for net in spec["networks"].as_array().into_iter().flatten() {
        if let Some(full) = net["multus"]["networkName"]
            .as_str()
            .filter(|n| !n.is_empty())
        {
            let (nad_ns, nad) = full.split_once('/').unwrap_or((ns, full));
            out.push(node(
                nad,
                nad_ns,
                "networkattachmentdefinitions",
                vec![],
                true,
            ));
        }
    }
    out
}

/// Upstream `filterNodes` / `shouldIncludeNode`.
fn filter(nodes: Vec<Value>, options: &Value) -> Vec<Value> {
    let drop_optional = options["includeOptionalNodes"] == Value::Bool(false);
    let selector = options["labelSelector"]["matchLabels"].as_object();
    nodes
        .into_iter()
        .filter(|n| !(drop_optional && n["optional"] == true))
        .filter(|n| selector.is_none_or(|s| s.iter().all(|(k, v)| n["labels"][k] == *v)))
        .map(|mut n| {
            if let Some(children) = n.get("children").and_then(Value::as_array).cloned() {
                n["children"] = json!(filter(children, options));
            }
            n
        })
        .collect()
}
