//! `create NAME --replicas N`: a pool of N independent VMs named `NAME-0` … `NAME-<N-1>`, each
//! with its own persistent disks and its own cloud-init (the platform SSH trust is VM-scoped:
//! host key, host certificate and principals name one VM).
//!
//! - KubeVirt: a `pool.kubevirt.io/v1beta1` VirtualMachinePool whose `virtualMachineTemplate`
//!   is the VM `create` would make. Upstream's pool controller
//!   (kubevirt/kubevirt pkg/virt-controller/watch/pool/pool.go, `indexVMSpec`) names replica
//!   `i` `NAME-i`, appends `-i` to each `dataVolumeTemplates` name (so every replica gets its own
//!   disks) and, with `spec.nameGeneration.appendIndexToSecretRefs`, to the cloud-init
//!   `secretRef` (Go's `UserDataSecretRef`): the template names `NAME-cloudinit` and kubectl-vm creates one
//!   Secret `NAME-cloudinit-i` per replica, owned by the pool, with that replica's user data.
//! - Deckhouse has no pool kind: N VirtualMachines `NAME-i` (the same names), each made exactly
//!   as `create NAME-i` would, all labelled [`POOL_LABEL`]`=NAME`.

pub use crate::names::POOL_LABEL;

use serde_json::{Value, json};

use super::cloudinit::{self, UserData};
use super::plan::{BootSource, PlanError, VmPlan};
use super::{CreateError, Owner, PlannedObject, labels, metadata, vm_metadata};
use crate::flavor::Flavor;

/// The most replicas one `create` makes: each needs its own signed host certificate and
/// Secret (or VM and disks), created one request at a time, and a pool this large is already
/// past what one command line manages comfortably.
pub const MAX_REPLICAS: u32 = 32;
/// API version of KubeVirt's VirtualMachinePool.
pub const POOL_API_VERSION: &str = "pool.kubevirt.io/v1beta1";

/// Name of replica `index` of pool `pool` (upstream's `generateVMName`).
pub fn replica_name(pool: &str, index: u32) -> String {
    format!("{pool}-{index}")
}

/// The plan of replica `index`: the pool's plan under the replica's name, labelled with the
/// pool. Everything derived from the name (disks, host key, principals) follows it.
pub fn replica_plan(plan: &VmPlan, index: u32) -> VmPlan {
    let mut replica = plan.clone();
    replica.name = replica_name(&plan.name, index);
    replica.replicas = None;
    replica.pool = Some(plan.name.clone());
    replica
}

/// `--replicas` checks: the count, and the flags that cannot give N VMs their own identity.
pub(super) fn validate(plan: &VmPlan) -> Result<(), PlanError> {
    let conflict = |s: String| Err(PlanError::Conflict(s));
    let Some(n) = plan.replicas else {
        return Ok(());
    };
    if n == 0 || n > MAX_REPLICAS {
        return conflict(format!(
            "--replicas {n} is out of range: give 1 to {MAX_REPLICAS}"
        ));
    }
    if let BootSource::ExistingDisk { name } = &plan.boot {
        return conflict(format!(
            "--disk {name} cannot be used with --replicas: every replica gets its own disks; boot from --image, --url, --clone-pvc or --blank"
        ));
    }
    if crate::platform::of(plan.flavor).pool.is_some()
        && matches!(&plan.boot, BootSource::Url { checksums, .. } if !checksums.is_empty())
    {
        return conflict(
            "--checksum cannot be used with --replicas on KubeVirt: a checksum-verified import is a standalone DataVolume, which a VirtualMachinePool cannot give each replica".into(),
        );
    }
    if plan.hostname.is_some() {
        return conflict(
            "--hostname cannot be used with --replicas: every replica would get the same host name (each is named after its VM)".into(),
        );
    }
    if plan.extras.uuid.is_some() {
        return conflict(
            "--uuid cannot be used with --replicas: every replica would get the same SMBIOS UUID"
                .into(),
        );
    }
    // The longest names are those of the last replica.
    replica_plan(plan, n - 1)
        .validate()
        .map_err(|e| PlanError::Conflict(format!("--replicas {n}: {e}")))
}

/// Validate the pool plan and build its objects from the replicas' plans (which carry each
/// replica's host keys).
pub fn build(plan: &VmPlan, replicas: &[VmPlan]) -> Result<super::Manifests, CreateError> {
    plan.validate()?;
    let mut user_data = Vec::new();
    for replica in replicas {
        user_data.push(cloudinit::build(replica)?);
    }
    let objects = match plan.flavor {
        Flavor::KubeVirt => kubevirt_objects(plan, replicas, &user_data),
        Flavor::Deckhouse => replicas
            .iter()
            .zip(&user_data)
            .flat_map(|(r, u)| super::deckhouse::objects(r, u.as_ref()))
            .collect(),
    };
    Ok(super::Manifests {
        objects,
        user_data: user_data.into_iter().next().flatten(),
    })
}

/// The VirtualMachinePool, then one user-data Secret per replica (owned by the pool).
fn kubevirt_objects(
    plan: &VmPlan,
    replicas: &[VmPlan],
    user_data: &[Option<UserData>],
) -> Vec<PlannedObject> {
    let mut template_plan = plan.clone();
    template_plan.pool = Some(plan.name.clone());
    // The template names the Secret `NAME-cloudinit` whatever the size of the data: the
    // controller appends each replica's index to it.
    let secret_ref = user_data.iter().flatten().next().map(|_| UserData {
        text: String::new(),
        contains_secrets: true,
    });
    let vm = super::kubevirt::virtual_machine(&template_plan, secret_ref.as_ref());
    let selector = json!({ POOL_LABEL: plan.name });
    let pool = json!({
        "apiVersion": POOL_API_VERSION,
        "kind": "VirtualMachinePool",
        "metadata": metadata(&template_plan, &plan.name),
        "spec": {
            "replicas": replicas.len(),
            "selector": { "matchLabels": selector },
            "nameGeneration": { "appendIndexToSecretRefs": true },
            "virtualMachineTemplate": {
                "metadata": vm_metadata(&template_plan),
                "spec": vm["spec"],
            },
        },
    });
    let mut objects = vec![PlannedObject::new(pool)];
    for (index, (replica, data)) in replicas.iter().zip(user_data).enumerate() {
        let Some(data) = data else { continue };
        let name = format!("{}-{index}", plan.cloudinit_secret_name());
        objects.push(PlannedObject {
            object: json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": { "name": name, "namespace": plan.namespace, "labels": labels(replica) },
                "type": "Opaque",
                "stringData": { super::kubevirt::SECRET_KEY: data.text },
            }),
            owner: Owner::Vm,
        });
    }
    objects
}

/// Replica names a planned VirtualMachinePool will get (`NAME-0` … ), for the existence check.
pub fn planned_replicas(pool: &Value) -> Vec<String> {
    let name = pool["metadata"]["name"].as_str().unwrap_or_default();
    let n = pool["spec"]["replicas"].as_u64().unwrap_or(1) as u32;
    (0..n).map(|i| replica_name(name, i)).collect()
}

#[cfg(test)]
mod tests;
