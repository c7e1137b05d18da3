//! `set network`: add and remove a VM's secondary networks.
//!
//! KubeVirt: a secondary network is an interface with bridge binding on a Multus
//! NetworkAttachmentDefinition (`spec.template.spec.domain.devices.interfaces[]` and
//! `spec.template.spec.networks[].multus.networkName`). Under `vmRolloutStrategy: LiveUpdate`
//! virt-controller hot-plugs a new one into the running VMI (through a live migration,
//! `MigrationRequired`), and unplugs one whose interface is marked `state: absent`
//! (`pkg/network/vmliveupdate/restart.go`: an interface removed outright needs a restart, so
//! a running VM's interface is marked absent, a stopped VM's removed). Otherwise
//! `RestartRequired`.
//!
//! Deckhouse: `spec.networks[]` entries of type `Network` (the project's) or `ClusterNetwork`;
//! the list starts with the `Main` network (implicit when `spec.networks` is unset). Adding or
//! removing an additional network applies without a restart (the virtualization user guide,
//! "Additional network interfaces").

use serde_json::Value;

use super::{Change, SetPlatform};
use crate::cluster::Cluster;
use crate::error::Result;
use crate::network::spec::must_exist;
pub use crate::network::spec::{Attach, DeckhouseNetwork, Networks, parse_nad};

impl Change for Networks {
    fn check(&self, platform: &dyn SetPlatform) -> Result<()> {
        platform.check_networks(self)
    }

    fn apply(&self, platform: &dyn SetPlatform, vm: &mut Value) -> Result<()> {
        platform.networks(self, vm)
    }

    fn verify<'a>(
        &'a self,
        platform: &'a dyn SetPlatform,
        cluster: &'a Cluster,
        edited: &'a Value,
    ) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            for object in platform.network_objects(self, edited)? {
                must_exist(cluster, &object).await?;
            }
            Ok(())
        })
    }
}

/// Apply `request` to VM `vm` ([`super::run`]); on a platform whose instance is apart from
/// the VM (KubeVirt), a change the VM reports as applied but the instance still plugs or
/// unplugs by a live migration is reported as migrating.
pub async fn run(
    cluster: &Cluster,
    platform_info: &crate::flavor::Platform,
    request: &Networks,
    vm: &crate::lifecycle::VmRef,
    options: &super::Options,
    on_event: &(dyn Fn(super::Event) + Send + Sync),
) -> Result<super::Outcome> {
    let mut outcome = super::run(cluster, platform_info, request, vm, options, on_event).await?;
    let instance = crate::platform::of(platform_info.flavor).instance;
    if let (super::Applies::Live, Some(kind)) = (&outcome.applies, instance) {
        let vmi = kind
            .api(&cluster.client, Some(&vm.namespace))
            .get_opt(&vm.name)
            .await
            .map_err(|e| {
                cluster.error(e, &kind.action("get", Some(&vm.namespace)).named(&vm.name))
            })?;
        if let Some(message) = vmi
            .map(|v| serde_json::to_value(v).unwrap_or_default())
            .and_then(|v| hotplug_pending(&v))
        {
            outcome.applies = super::Applies::Migrating { message };
        }
    }
    Ok(outcome)
}

/// A KubeVirt VMI whose spec has interfaces its status does not (or an `absent` one its
/// status still lists): what KubeVirt still plugs, in its words when it set
/// `MigrationRequired` (VEP 29: the workload updater migrates the VMI to plug them).
pub fn hotplug_pending(vmi: &Value) -> Option<String> {
    let status: Vec<&str> = vmi
        .pointer("/status/interfaces")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(|i| i["name"].as_str()).collect())
        .unwrap_or_default();
    let mut plug = vec![];
    let mut unplug = vec![];
    for i in vmi
        .pointer("/spec/domain/devices/interfaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = i["name"].as_str().unwrap_or("");
        let listed = status.contains(&name);
        match (i["state"] == "absent", listed) {
            (false, false) => plug.push(name),
            (true, true) => unplug.push(name),
            _ => {}
        }
    }
    if plug.is_empty() && unplug.is_empty() {
        return None;
    }
    let mut what = vec![];
    if !plug.is_empty() {
        what.push(format!("plugging {}", plug.join(", ")));
    }
    if !unplug.is_empty() {
        what.push(format!("unplugging {}", unplug.join(", ")));
    }
    let condition = crate::lifecycle::condition(vmi, "MigrationRequired")
        .filter(|c| c["status"] == "True")
        .map(|_| " (the VMI's MigrationRequired condition)")
        .unwrap_or("");
    Some(format!(
        "KubeVirt is {} by a live migration of the VMI{condition}",
        what.join(" and ")
    ))
}
