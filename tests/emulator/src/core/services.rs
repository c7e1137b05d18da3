//! Services as the API server and kube-controller-manager make them: defaults and validation
//! (`pkg/apis/core/v1/defaults.go` SetDefaults_Service, `pkg/apis/core/validation/validation.go`
//! ValidateService), cluster IP and node port allocation at create (`pkg/registry/core/service/
//! ipallocator`, `portallocator`, default ranges 10.96.0.0/12 and 30000-32767), and the
//! EndpointSlice controller (`pkg/controller/endpointslice`): one slice per selecting Service,
//! named `<service>-<random>`, labelled `kubernetes.io/service-name`, listing the Running pods
//! the selector matches with their IPs and the resolved target ports.
//!
//! The legacy Endpoints objects are not written here: the aggregator's tests write theirs by
//! hand, as a cluster's endpoints controller would, and nothing else reads them.

use crate::core::app::App;
use crate::core::status::{ApiError, Cause};
use crate::core::store::Key;
use crate::core::util::{meta_str, random_suffix};
use serde_json::{Map, Value, json};

/// First address of the service CIDR (`--service-cluster-ip-range=10.96.0.0/12`); .1 is the
/// `kubernetes` Service's.
const CLUSTER_IP_BASE: u32 = u32::from_be_bytes([10, 96, 0, 0]);
/// Addresses in a /12.
const CLUSTER_IP_COUNT: u32 = 1 << 20;
/// `--service-node-port-range` default.
const NODE_PORTS: std::ops::RangeInclusive<u64> = 30000..=32767;
/// The label that ties an EndpointSlice to its Service (discovery/v1 `LabelServiceName`).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The EndpointSlice controller's `endpointslice.kubernetes.io/managed-by` value.
const SLICE_MANAGER: &str = "endpointslice-controller.k8s.io";

fn cause(field: impl Into<String>, reason: &'static str, message: impl Into<String>) -> Cause {
    Cause {
        reason,
        field: field.into(),
        message: message.into(),
    }
}

fn service_type(svc: &Value) -> &str {
    svc.pointer("/spec/type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
}

/// SetDefaults_Service and the port defaults, then ValidateService's rules about ports, types,
/// cluster IPs and node ports. Runs on every write of a Service.
pub fn prepare(svc: &mut Value) -> Result<(), ApiError> {
    let name = meta_str(svc, "name").to_string();
    let spec = svc
        .as_object_mut()
        .expect("object")
        .entry("spec")
        .or_insert_with(|| json!({}));
    if !spec.is_object() {
        *spec = json!({});
    }
    let m = spec.as_object_mut().expect("object");
    m.entry("type").or_insert_with(|| json!("ClusterIP"));
    m.entry("sessionAffinity").or_insert_with(|| json!("None"));
    m.entry("internalTrafficPolicy")
        .or_insert_with(|| json!("Cluster"));
    let kind = m["type"].as_str().unwrap_or("ClusterIP").to_string();
    if matches!(kind.as_str(), "NodePort" | "LoadBalancer") {
        m.entry("externalTrafficPolicy")
            .or_insert_with(|| json!("Cluster"));
    }
    if let Some(ports) = m.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            p.entry("protocol").or_insert_with(|| json!("TCP"));
            if let Some(port) = p.get("port").cloned() {
                p.entry("targetPort").or_insert(port);
            }
        }
    }
    let mut causes = vec![];
    let headless = m.get("clusterIP").and_then(Value::as_str) == Some("None");
    if !matches!(
        kind.as_str(),
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    ) {
        causes.push(cause(
            "spec.type",
            "FieldValueNotSupported",
            format!(
                "Unsupported value: {kind:?}: supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""
            ),
        ));
    }
    let ports: Vec<Value> = m
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() && !headless && kind != "ExternalName" {
        causes.push(cause("spec.ports", "FieldValueRequired", "Required value"));
    }
    if headless && matches!(kind.as_str(), "NodePort" | "LoadBalancer") {
        causes.push(cause(
            "spec.clusterIPs[0]",
            "FieldValueInvalid",
            format!("Invalid value: \"None\": may not be set to 'None' for {kind} services"),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in ports.iter().enumerate() {
        let at = |f: &str| format!("spec.ports[{i}].{f}");
        let port_name = p.get("name").and_then(Value::as_str).unwrap_or("");
        if ports.len() > 1 && port_name.is_empty() {
            causes.push(cause(at("name"), "FieldValueRequired", "Required value"));
        } else if !port_name.is_empty() && !seen.insert(port_name.to_string()) {
            causes.push(cause(
                at("name"),
                "FieldValueDuplicate",
                format!("Duplicate value: {port_name:?}"),
            ));
        }
        match p.get("port").and_then(Value::as_u64) {
            Some(1..=65535) => {}
            _ => causes.push(cause(
                at("port"),
                "FieldValueInvalid",
                format!(
                    "Invalid value: {}: must be between 1 and 65535, inclusive",
                    p.get("port").unwrap_or(&json!(0))
                ),
            )),
        }
        let protocol = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
        if !matches!(protocol, "TCP" | "UDP" | "SCTP") {
            causes.push(cause(
                at("protocol"),
                "FieldValueNotSupported",
                format!(
                    "Unsupported value: {protocol:?}: supported values: \"SCTP\", \"TCP\", \"UDP\""
                ),
            ));
        }
        if p.get("nodePort").and_then(Value::as_u64).unwrap_or(0) != 0 && kind == "ClusterIP" {
            causes.push(cause(
                at("nodePort"),
                "FieldValueForbidden",
                "Forbidden: may not be used when `type` is 'ClusterIP'",
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid("", "Service", &name, causes))
    }
}

fn ip_text(n: u32) -> String {
    std::net::Ipv4Addr::from(n).to_string()
}

/// Gives a new Service its cluster IP (unless headless or ExternalName) and node ports (for
/// NodePort and LoadBalancer), honouring requested ones if free. Called at create.
pub fn allocate(app: &App, svc: &mut Value) -> Result<(), ApiError> {
    let name = meta_str(svc, "name").to_string();
    let (existing, _) = app.store.list("", "services", None);
    let kind = service_type(svc).to_string();
    if kind == "ExternalName" {
        return Ok(());
    }
    let spec = svc["spec"].as_object_mut().expect("prepared");
    let requested = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if requested != "None" {
        let used: std::collections::BTreeSet<&str> = existing
            .iter()
            .filter_map(|s| s.pointer("/spec/clusterIP").and_then(Value::as_str))
            .collect();
        let ip = if requested.is_empty() {
            // Like the allocator, start at a random offset; skip .0 and .1.
            let start: u32 = rand_offset(CLUSTER_IP_COUNT - 2);
            (0..CLUSTER_IP_COUNT - 2)
                .map(|i| ip_text(CLUSTER_IP_BASE + 2 + (start + i) % (CLUSTER_IP_COUNT - 2)))
                .find(|ip| !used.contains(ip.as_str()))
                .ok_or_else(|| {
                    ApiError::internal("failed to allocate a serviceIP: range is full")
                })?
        } else {
            let parsed: Option<std::net::Ipv4Addr> = requested.parse().ok();
            let in_range = parsed.is_some_and(|a| {
                let n = u32::from(a);
                (CLUSTER_IP_BASE..CLUSTER_IP_BASE + CLUSTER_IP_COUNT).contains(&n)
            });
            let message = if !in_range {
                Some(format!(
                    "failed to allocate IP {requested}: the provided IP ({requested}) is not in the valid range. The range of valid IPs is 10.96.0.0/12"
                ))
            } else if used.contains(requested.as_str()) {
                Some(format!(
                    "failed to allocate IP {requested}: provided IP is already allocated"
                ))
            } else {
                None
            };
            if let Some(message) = message {
                return Err(ApiError::invalid(
                    "",
                    "Service",
                    &name,
                    vec![cause(
                        "spec.clusterIPs",
                        "FieldValueInvalid",
                        format!("Invalid value: []string{{{requested:?}}}: {message}"),
                    )],
                ));
            }
            requested
        };
        spec.insert("clusterIP".into(), json!(ip));
        spec.insert("clusterIPs".into(), json!([ip]));
        spec.insert("ipFamilies".into(), json!(["IPv4"]));
        spec.entry("ipFamilyPolicy")
            .or_insert_with(|| json!("SingleStack"));
    } else {
        spec.insert("clusterIPs".into(), json!(["None"]));
        spec.insert("ipFamilies".into(), json!(["IPv4"]));
        spec.entry("ipFamilyPolicy")
            .or_insert_with(|| json!("SingleStack"));
    }
    if matches!(kind.as_str(), "NodePort" | "LoadBalancer") {
        let mut used: std::collections::BTreeSet<u64> = existing
            .iter()
            .flat_map(|s| {
                s.pointer("/spec/ports")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|p| p.get("nodePort").and_then(Value::as_u64))
            .collect();
        let ports = spec
            .get_mut("ports")
            .and_then(Value::as_array_mut)
            .expect("validated");
        for (i, p) in ports.iter_mut().enumerate() {
            let want = p.get("nodePort").and_then(Value::as_u64).unwrap_or(0);
            let port = if want == 0 {
                let span = NODE_PORTS.end() - NODE_PORTS.start() + 1;
                let start = u64::from(rand_offset(span as u32));
                (0..span)
                    .map(|k| NODE_PORTS.start() + (start + k) % span)
                    .find(|n| !used.contains(n))
                    .ok_or_else(|| {
                        ApiError::internal("failed to allocate a nodePort: range is full")
                    })?
            } else {
                let message = if !NODE_PORTS.contains(&want) {
                    Some(
                        "provided port is not in the valid range. The range of valid ports is 30000-32767",
                    )
                } else if used.contains(&want) {
                    Some("provided port is already allocated")
                } else {
                    None
                };
                if let Some(message) = message {
                    return Err(ApiError::invalid(
                        "",
                        "Service",
                        &name,
                        vec![cause(
                            format!("spec.ports[{i}].nodePort"),
                            "FieldValueInvalid",
                            format!("Invalid value: {want}: {message}"),
                        )],
                    ));
                }
                want
            };
            used.insert(port);
            p["nodePort"] = json!(port);
        }
    }
    if kind == "LoadBalancer" {
        svc["status"] = json!({"loadBalancer": {}});
    }
    Ok(())
}

fn rand_offset(bound: u32) -> u32 {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).expect("random bytes");
    u32::from_le_bytes(bytes) % bound.max(1)
}

/// Whether every `key: value` of `selector` is among `labels`.
fn selects(selector: &Map<String, Value>, labels: &Value) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A port of a Service resolved against a pod: a number, or the named container port.
fn resolve_target(port: &Value, pod: &Value) -> Option<u64> {
    match &port["targetPort"] {
        Value::Number(n) => n.as_u64(),
        Value::String(name) => pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .find(|p| p["name"] == json!(name))
            .and_then(|p| p["containerPort"].as_u64()),
        _ => port["port"].as_u64(),
    }
}

/// The EndpointSlice controller for one Service: its slice lists the Running pods that the
/// selector matches. Services without a selector are left to whoever manages their endpoints.
pub fn endpoint_slices(app: &App, svc: &Value, _tick: bool) {
    let Some(selector) = svc.pointer("/spec/selector").and_then(Value::as_object) else {
        return;
    };
    if selector.is_empty() || service_type(svc) == "ExternalName" {
        return;
    }
    let ns = meta_str(svc, "namespace").to_string();
    let name = meta_str(svc, "name").to_string();
    let (pods, _) = app.store.list("", "pods", Some(&ns));
    let matched: Vec<&Value> = pods
        .iter()
        .filter(|p| selects(selector, &p["metadata"]["labels"]))
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|p| {
            p.pointer("/status/podIP")
                .and_then(Value::as_str)
                .is_some_and(|ip| !ip.is_empty())
        })
        .collect();
    let service_ports = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ports: Vec<Value> = service_ports
        .iter()
        .map(|p| {
            let port = matched
                .first()
                .and_then(|pod| resolve_target(p, pod))
                .or_else(|| p["targetPort"].as_u64())
                .or_else(|| p["port"].as_u64());
            json!({"name": p.get("name").cloned().unwrap_or(json!("")), "protocol": p["protocol"], "port": port})
        })
        .collect();
    let endpoints: Vec<Value> = matched
        .iter()
        .map(|pod| {
            let ready = pod.pointer("/status/phase") == Some(&json!("Running"));
            json!({
                "addresses": [pod["status"]["podIP"]],
                "conditions": {"ready": ready, "serving": ready, "terminating": false},
                "nodeName": pod.pointer("/spec/nodeName").cloned().unwrap_or(Value::Null),
                "targetRef": {"kind": "Pod", "namespace": ns, "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]},
            })
        })
        .collect();
    let (slices, _) = app
        .store
        .list("discovery.k8s.io", "endpointslices", Some(&ns));
    let mine = slices.into_iter().find(|s| {
        s.pointer("/metadata/labels")
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            == Some(&json!(name))
            && s.pointer("/metadata/ownerReferences/0/uid") == svc.pointer("/metadata/uid")
    });
    match mine {
        Some(slice) => {
            if slice["endpoints"] != json!(endpoints) || slice["ports"] != json!(ports) {
                app.store.modify(
                    &Key::new(
                        "discovery.k8s.io",
                        "endpointslices",
                        &ns,
                        meta_str(&slice, "name"),
                    ),
                    |o| {
                        o["endpoints"] = json!(endpoints);
                        o["ports"] = json!(ports);
                    },
                );
            }
        }
        None => {
            let slice = json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {
                    "name": format!("{name}-{}", random_suffix(5)),
                    "namespace": ns,
                    "labels": {SERVICE_NAME_LABEL: name, "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                        "uid": svc["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}],
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": ports,
            });
            let _ = app
                .store
                .create("discovery.k8s.io", "endpointslices", slice);
        }
    }
}

#[cfg(test)]
mod tests;
