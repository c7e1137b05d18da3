//! `set resources`: CPU and memory of a VM (KubeVirt: the template's CPU topology and guest
//! memory, or its instancetype; Deckhouse: `spec.cpu` and `spec.memory`, within the sizing
//! policy of its VirtualMachineClass).

use serde_json::Value;

use super::{Change, SetPlatform};
use crate::cluster::Cluster;
use crate::create::options::CoreFraction;
use crate::error::{Error, Result};
use crate::quantity::Quantity;

/// What to change; `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resources {
    /// Total vCPUs (KubeVirt: sockets × cores × threads, by changing sockets; Deckhouse:
    /// cores).
    pub cpu: Option<u32>,
    /// Memory (KubeVirt: guest memory; Deckhouse: `spec.memory.size`).
    pub memory: Option<Quantity>,
    /// Deckhouse: the guaranteed share of each core.
    pub core_fraction: Option<CoreFraction>,
    /// KubeVirt topology: sockets.
    pub sockets: Option<u32>,
    /// KubeVirt topology: cores per socket.
    pub cores: Option<u32>,
    /// KubeVirt topology: threads per core.
    pub threads: Option<u32>,
    /// KubeVirt: the instancetype an instancetype-backed VM takes CPU and memory from.
    pub instancetype: Option<String>,
}

impl Resources {
    /// Refuse an empty request or zero counts (before any request).
    pub fn validate(&self) -> Result<()> {
        if *self == Resources::default() {
            return Err(Error::InvalidTarget(
                "nothing to change: give --cpu, --memory, --core-fraction, --sockets/--cores/--threads or --instancetype".into(),
            ));
        }
        for (flag, value) in [
            ("--cpu", self.cpu),
            ("--sockets", self.sockets),
            ("--cores", self.cores),
            ("--threads", self.threads),
        ] {
            if value == Some(0) {
                return Err(Error::InvalidTarget(format!("{flag} must be at least 1")));
            }
        }
        if self.memory == Some(Quantity::from_bytes(0)) {
            return Err(Error::InvalidTarget("--memory must be more than 0".into()));
        }
        if let Some(name) = &self.instancetype {
            crate::validate::dns_subdomain("instancetype", name)
                .map_err(|e| Error::InvalidTarget(e.to_string()))?;
        }
        Ok(())
    }

    /// Whether CPU or memory is asked for directly (not through an instancetype).
    pub(crate) fn sizes(&self) -> bool {
        self.cpu.is_some()
            || self.memory.is_some()
            || self.sockets.is_some()
            || self.cores.is_some()
            || self.threads.is_some()
            || self.core_fraction.is_some()
    }
}

impl Change for Resources {
    fn check(&self, platform: &dyn SetPlatform) -> Result<()> {
        self.validate()?;
        platform.check_resources(self)
    }

    fn apply(&self, platform: &dyn SetPlatform, vm: &mut Value) -> Result<()> {
        platform.resources(self, vm)
    }

    fn verify<'a>(
        &'a self,
        platform: &'a dyn SetPlatform,
        cluster: &'a Cluster,
        edited: &'a Value,
    ) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let Some(class) = platform.sizing_class(edited) else {
                return Ok(());
            };
            check_sizing(cluster, class, edited).await
        })
    }
}

/// Check a Deckhouse VM object against the sizing policy of its VirtualMachineClass, as
/// `create` does (every violation at once, in Deckhouse's words).
async fn check_sizing(cluster: &Cluster, class_name: &str, vm: &Value) -> Result<()> {
    use crate::create::sizing;
    let kind = crate::api::VIRTUAL_MACHINE_CLASS;
    let mut found = None;
    for version in [kind.version, "v1alpha3"] {
        let k = crate::api::Kind { version, ..kind };
        match k.api(&cluster.client, None).get_opt(class_name).await {
            Ok(o) => {
                found = o;
                break;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) => return Err(cluster.error(e, &k.action("get", None).named(class_name))),
        }
    }
    // A class that is gone is the platform's to report.
    let Some(class) = found else { return Ok(()) };
    let class = serde_json::to_value(class).unwrap_or(Value::Null);
    let policies = sizing::policies(&class).map_err(|e| Error::Usage(e.to_string()))?;
    let cores = vm
        .pointer("/spec/cpu/cores")
        .and_then(Value::as_u64)
        .unwrap_or(1) as u32;
    let memory = vm
        .pointer("/spec/memory/size")
        .and_then(Value::as_str)
        .and_then(|s| Quantity::parse(s).ok())
        .unwrap_or(Quantity::from_bytes(0));
    let fraction = vm
        .pointer("/spec/cpu/coreFraction")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<CoreFraction>().ok());
    sizing::check(class_name, &policies, cores, memory, fraction)
        .map_err(|e| Error::Usage(format!("VirtualMachine {}: {e}", name_of(vm))))
}

fn name_of(vm: &Value) -> &str {
    vm.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_zero_requests_are_refused() {
        assert!(Resources::default().validate().is_err());
        let zero = Resources {
            cpu: Some(0),
            ..Default::default()
        };
        assert!(zero.validate().unwrap_err().to_string().contains("--cpu"));
        let bad = Resources {
            instancetype: Some("Not_A_Name".into()),
            ..Default::default()
        };
        assert!(bad.validate().is_err());
        let ok = Resources {
            memory: Some(Quantity::parse("4Gi").unwrap()),
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
    }
}
