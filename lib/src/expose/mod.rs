//! `expose`: a Service in front of a VM's ports, selecting the VM's pod by the label its
//! platform gives it ([`kubevirt`]: `vm.kubevirt.io/name`, [`deckhouse`]:
//! `vm.kubevirt.internal.virtualization.deckhouse.io/name`), owned by the VM so that it goes
//! when the VM does, and labelled as ours. Created with create semantics: a taken name is
//! refused by the server and nothing is changed.
//!
//! virtctl's `expose` (FACTS §3) selects on the template's labels instead, which silently
//! matches nothing for a VM without labels and every VM sharing them otherwise.

pub mod deckhouse;
pub mod kubevirt;

use kube::api::PostParams;
use serde_json::{Value, json};

pub use crate::api::DryRun;
use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::lifecycle::VmRef;
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};

/// The core Service kind.
pub const SERVICE: Kind = Kind {
    group: "",
    version: "v1",
    kind: "Service",
    plural: "services",
    namespaced: true,
};

/// A Service's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceType {
    /// A cluster-internal virtual IP (the default).
    ClusterIP,
    /// The cluster IP plus a port on every node.
    NodePort,
    /// A node port plus an external load balancer, where the cluster has one.
    LoadBalancer,
}

impl ServiceType {
    /// Parse a `--type` value (case-insensitive, as kubectl's own `expose`).
    pub fn parse(text: &str) -> Result<Self> {
        match text.to_ascii_lowercase().as_str() {
            "clusterip" => Ok(Self::ClusterIP),
            "nodeport" => Ok(Self::NodePort),
            "loadbalancer" => Ok(Self::LoadBalancer),
            _ => Err(Error::Usage(format!(
                "--type {text:?}: use ClusterIP, NodePort or LoadBalancer"
            ))),
        }
    }

    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClusterIP => "ClusterIP",
            Self::NodePort => "NodePort",
            Self::LoadBalancer => "LoadBalancer",
        }
    }
}

/// A port's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP (the default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// Parse `tcp`, `udp` or `sctp` in any case.
    pub fn parse(text: &str) -> Result<Self> {
        match text.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Self::Tcp),
            "udp" => Ok(Self::Udp),
            "sctp" => Ok(Self::Sctp),
            _ => Err(Error::Usage(format!(
                "protocol {text:?}: use TCP, UDP or SCTP"
            ))),
        }
    }

    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// Where a Service port goes in the pod: a number, or a named container port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetPort {
    /// A port number.
    Number(u16),
    /// A named port.
    Name(String),
}

/// One port of the Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// The port's name (needed when there are several; made up from protocol and port if not given).
    pub name: Option<String>,
    /// The Service's port.
    pub port: u16,
    /// The guest's port (default: `port`).
    pub target: Option<TargetPort>,
    /// Protocol.
    pub protocol: Protocol,
    /// The node port (NodePort and LoadBalancer only; default: the server picks one).
    pub node_port: Option<u16>,
}

impl PortSpec {
    /// Parse `PORT[:TARGET][/PROTOCOL]`, e.g. `80`, `80:8080`, `53/udp`, `443:https/tcp`.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |why: &str| Error::Usage(format!("--port {text:?}: {why}"));
        let (ports, protocol) = match text.split_once('/') {
            Some((p, proto)) => (
                p,
                Protocol::parse(proto).map_err(|_| bad("protocol must be tcp, udp or sctp"))?,
            ),
            None => (text, Protocol::Tcp),
        };
        let (port, target) = match ports.split_once(':') {
            Some((p, t)) => (p, Some(parse_target(t).map_err(|e| bad(&e))?)),
            None => (ports, None),
        };
        let port = parse_port(port).map_err(|e| bad(&e))?;
        Ok(Self {
            name: None,
            port,
            target,
            protocol,
            node_port: None,
        })
    }

    fn name_or_default(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            format!(
                "{}-{}",
                self.protocol.as_str().to_ascii_lowercase(),
                self.port
            )
        })
    }
}

fn parse_port(text: &str) -> std::result::Result<u16, String> {
    match text.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("{text:?} is not a port number (1-65535)")),
    }
}

/// A target port: a number, or a container port name (IANA_SVC_NAME: at most 15 lower-case
/// letters, digits and inner dashes, with a letter, no `--`).
pub fn parse_target(text: &str) -> std::result::Result<TargetPort, String> {
    if text.chars().all(|c| c.is_ascii_digit()) {
        return parse_port(text).map(TargetPort::Number);
    }
    if valid_port_name(text) {
        Ok(TargetPort::Name(text.to_owned()))
    } else {
        Err(format!(
            "{text:?} is neither a port number nor a port name (at most 15 lower-case letters, digits and '-')"
        ))
    }
}

/// Whether `name` is an IANA_SVC_NAME (k8s.io/apimachinery `validation.IsValidPortName`).
pub fn valid_port_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && name.chars().any(|c| c.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

/// What to expose, and how.
#[derive(Debug, Clone)]
pub struct ExposeRequest {
    /// The VM.
    pub vm: VmRef,
    /// The Service's name (default: the VM's).
    pub service_name: Option<String>,
    /// Its ports (at least one).
    pub ports: Vec<PortSpec>,
    /// Its type.
    pub service_type: ServiceType,
    /// A fixed cluster IP, or `None` for a headless Service.
    pub cluster_ip: Option<String>,
    /// External IPs the cluster routes to the Service.
    pub external_ips: Vec<String>,
}

impl ExposeRequest {
    /// The Service's name.
    pub fn name(&self) -> &str {
        self.service_name.as_deref().unwrap_or(&self.vm.name)
    }

    /// Everything checkable before the first request (one line each, exit 2).
    pub fn validate(&self) -> Result<()> {
        let usage = |m: String| Err(Error::Usage(m));
        crate::validate::dns_label("service", self.name())
            .map_err(|e| Error::Usage(e.to_string()))?;
        if self.ports.is_empty() {
            return usage("expose needs at least one --port".into());
        }
        let mut names = std::collections::BTreeSet::new();
        let mut numbers = std::collections::BTreeSet::new();
        for p in &self.ports {
            if let Some(name) = &p.name
                && !valid_port_name(name)
            {
                return usage(format!(
                    "port name {name:?}: at most 15 lower-case letters, digits and '-', with a letter"
                ));
            }
            if !names.insert(p.name_or_default()) {
                return usage(format!("port name {:?} is used twice", p.name_or_default()));
            }
            if !numbers.insert((p.port, p.protocol)) {
                return usage(format!(
                    "port {}/{} is given twice",
                    p.port,
                    p.protocol.as_str()
                ));
            }
            if p.node_port.is_some() && self.service_type == ServiceType::ClusterIP {
                return usage("--node-port needs --type NodePort or LoadBalancer".into());
            }
        }
        if let Some(ip) = &self.cluster_ip {
            if ip == "None" {
                if self.service_type != ServiceType::ClusterIP {
                    return usage(format!(
                        "--cluster-ip None (headless) cannot be used with --type {}",
                        self.service_type.as_str()
                    ));
                }
            } else if ip.parse::<std::net::IpAddr>().is_err() {
                return usage(format!(
                    "--cluster-ip {ip:?} is not an IP address (or None)"
                ));
            }
        }
        for ip in &self.external_ips {
            if ip.parse::<std::net::IpAddr>().is_err() {
                return usage(format!("--external-ip {ip:?} is not an IP address"));
            }
        }
        Ok(())
    }

    /// The Service for a VM whose pods carry `selector`, owned by the VM `vm`.
    pub fn service(&self, vm: &Value, selector: Value) -> Value {
        let several = self.ports.len() > 1;
        let ports: Vec<Value> = self
            .ports
            .iter()
            .map(|p| {
                let mut port = json!({"port": p.port, "protocol": p.protocol.as_str()});
                if several || p.name.is_some() {
                    port["name"] = json!(p.name_or_default());
                }
                port["targetPort"] = match &p.target {
                    Some(TargetPort::Number(n)) => json!(n),
                    Some(TargetPort::Name(n)) => json!(n),
                    None => json!(p.port),
                };
                if let Some(n) = p.node_port {
                    port["nodePort"] = json!(n);
                }
                port
            })
            .collect();
        let mut spec = json!({
            "type": self.service_type.as_str(),
            "selector": selector,
            "ports": ports,
        });
        if let Some(ip) = &self.cluster_ip {
            spec["clusterIP"] = json!(ip);
        }
        if !self.external_ips.is_empty() {
            spec["externalIPs"] = json!(self.external_ips);
        }
        let meta = &vm["metadata"];
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": self.name(),
                "namespace": self.vm.namespace,
                "labels": {MANAGED_BY_LABEL: MANAGED_BY, VM_LABEL: self.vm.name},
                "ownerReferences": [{
                    "apiVersion": vm["apiVersion"], "kind": vm["kind"],
                    "name": meta["name"], "uid": meta["uid"],
                }],
            },
            "spec": spec,
        })
    }
}

/// What `expose` did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// `service/NAME`.
    pub object_ref: String,
    /// The Service as the server returned it (or as it would be sent, with a client dry run).
    pub service: Value,
}

/// Create the Service for `request` (`dry_run` as kubectl's).
pub async fn expose(
    cluster: &Cluster,
    flavor: Flavor,
    request: &ExposeRequest,
    dry_run: DryRun,
) -> Result<Outcome> {
    request.validate()?;
    let vm = crate::lifecycle::get_vm(cluster, flavor, &request.vm).await?;
    let selector = match flavor {
        Flavor::KubeVirt => kubevirt::selector(cluster, &request.vm, &vm).await?,
        Flavor::Deckhouse => deckhouse::selector(&vm),
    };
    let service = request.service(&vm, selector);
    let object_ref = SERVICE.object_ref(request.name());
    if dry_run == DryRun::Client {
        return Ok(Outcome {
            object_ref,
            service,
        });
    }
    let ns = &request.vm.namespace;
    let params = PostParams {
        dry_run: dry_run == DryRun::Server,
        ..Default::default()
    };
    let data: kube::api::DynamicObject = serde_json::from_value(service)
        .map_err(|e| Error::Internal(format!("the Service does not serialise: {e}")))?;
    let created = SERVICE
        .api(&cluster.client, Some(ns))
        .create(&params, &data)
        .await
        .map_err(|e| cluster.error(e, &SERVICE.action("create", Some(ns)).named(request.name())))?;
    Ok(Outcome {
        object_ref,
        service: serde_json::to_value(created).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests;
