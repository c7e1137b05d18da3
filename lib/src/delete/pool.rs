//! Deleting a pool made by `create --replicas` (see [`crate::create::pool`]).
//!
//! - KubeVirt: the VirtualMachinePool, with a uid precondition. The garbage collector takes
//!   what it owns: the replica VMs (controller ownerReference set by the pool controller),
//!   through them their DataVolumes, and the per-replica user-data Secrets kubectl-vm created
//!   owned by the pool. The replicas are listed first only to report and wait for them.
//! - Deckhouse has no pool object: the pool is the VMs kubectl-vm created for it, each deleted
//!   like `kubectl vm delete NAME-i` (uid precondition, its disks and Secrets). A VM counts only
//!   when it carries every label `create` gave it (managed-by kubectl-vm,
//!   [`POOL_LABEL`]`=NAME`, [`VM_LABEL`] naming itself) and its name is `NAME-<index>`: one
//!   that merely carries the pool label is never touched.

use std::time::Duration;

use kube::api::{DeleteParams, ListParams};
use serde_json::Value;

use super::{Companion, DeletePlan, guarded, owned_by, owned_secrets, quoted_ref, to_value};
use crate::api::{KUBEVIRT_POOL, Kind, SECRET};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::{Flavor, Platform};
use crate::names::POOL_LABEL;
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};

/// What deleting a pool involves.
#[derive(Debug, Clone)]
pub struct PoolDeletePlan {
    /// Pool name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// The VirtualMachinePool's uid (KubeVirt); `None` on Deckhouse, which has no pool object.
    pub pool_uid: Option<String>,
    /// Each replica as `delete` would remove it alone, by index.
    pub replicas: Vec<DeletePlan>,
    /// The per-replica user-data Secrets owned by the pool (KubeVirt).
    pub secrets: Vec<Companion>,
}

impl PoolDeletePlan {
    /// The pool as kubectl names it, `virtualmachinepool.pool.kubevirt.io "web"`, or on
    /// Deckhouse a description of the VM set.
    pub fn display(&self) -> String {
        match self.pool_uid {
            Some(_) => quoted_ref(&KUBEVIRT_POOL, &self.name),
            None => format!("pool {:?}", self.name),
        }
    }
}

/// Whether `name` is `pool-<index>`.
fn is_replica_name(pool: &str, name: &str) -> bool {
    name.strip_prefix(pool)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether a Deckhouse VM is one `create --replicas` made for pool `pool`.
pub fn is_our_replica(vm: &Value, pool: &str) -> bool {
    let meta = &vm["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    let labels = &meta["labels"];
    is_replica_name(pool, name)
        && labels[POOL_LABEL] == pool
        && labels[MANAGED_BY_LABEL] == MANAGED_BY
        && labels[VM_LABEL] == name
}

fn index_of(name: &str) -> u64 {
    name.rsplit('-')
        .next()
        .and_then(|i| i.parse().ok())
        .unwrap_or(u64::MAX)
}

/// The pool `name`: its uid (KubeVirt) and its replicas' names by index, or `None` when there
/// is no such pool (KubeVirt: no VirtualMachinePool; Deckhouse: no VM created for it).
pub async fn members(
    cluster: &Cluster,
    platform: &Platform,
    name: &str,
    namespace: &str,
) -> Result<Option<(Option<String>, Vec<String>)>> {
    let ns = Some(namespace);
    let vm_kind = Kind::vm(platform.flavor);
    let (pool_uid, replica_names) = match platform.flavor {
        Flavor::KubeVirt => {
            if !platform.serves(KUBEVIRT_POOL.group, KUBEVIRT_POOL.version) {
                return Ok(None);
            }
            let Some(pool) = KUBEVIRT_POOL
                .api(&cluster.client, ns)
                .get_opt(name)
                .await
                .map_err(|e| cluster.error(e, &KUBEVIRT_POOL.action("get", ns).named(name)))?
                .map(to_value)
            else {
                return Ok(None);
            };
            let uid = pool["metadata"]["uid"].as_str().unwrap_or_default();
            // The replicas are the VMs the pool controls, whatever their labels.
            let vms = vm_kind
                .api(&cluster.client, ns)
                .list(&ListParams::default())
                .await
                .map_err(|e| cluster.error(e, &vm_kind.action("list", ns)))?;
            let names: Vec<String> = vms
                .into_iter()
                .map(to_value)
                .filter(|vm| owned_by(vm, uid))
                .filter_map(|vm| vm["metadata"]["name"].as_str().map(str::to_owned))
                .collect();
            (Some(uid.to_owned()), names)
        }
        Flavor::Deckhouse => {
            let selector = format!("{POOL_LABEL}={name},{MANAGED_BY_LABEL}={MANAGED_BY}");
            let vms = vm_kind
                .api(&cluster.client, ns)
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| cluster.error(e, &vm_kind.action("list", ns)))?;
            let names: Vec<String> = vms
                .into_iter()
                .map(to_value)
                .filter(|vm| is_our_replica(vm, name))
                .filter_map(|vm| vm["metadata"]["name"].as_str().map(str::to_owned))
                .collect();
            if names.is_empty() {
                return Ok(None);
            }
            (None, names)
        }
    };
    let mut replica_names = replica_names;
    replica_names.sort_by_key(|n| index_of(n));
    Ok(Some((pool_uid, replica_names)))
}

/// The pool `name` and what goes with it, or `None` when there is no such pool.
pub async fn plan(
    cluster: &Cluster,
    platform: &Platform,
    name: &str,
    namespace: &str,
) -> Result<Option<PoolDeletePlan>> {
    let ns = Some(namespace);
    let Some((pool_uid, replica_names)) = members(cluster, platform, name, namespace).await? else {
        return Ok(None);
    };
    let mut replicas = Vec::new();
    for replica in &replica_names {
        match super::plan(cluster, platform, replica, namespace, false).await {
            Ok(p) => replicas.push(p),
            // Gone meanwhile (scaled in, or deleted by the garbage collector).
            Err(Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    // Deckhouse replicas own their Secrets (listed with each replica).
    let secrets = match &pool_uid {
        Some(uid) => {
            let selector = format!("{POOL_LABEL}={name},{MANAGED_BY_LABEL}={MANAGED_BY}");
            match SECRET
                .api(&cluster.client, ns)
                .list(&ListParams::default().labels(&selector))
                .await
            {
                Ok(list) => owned_secrets(list, uid),
                // Listing only completes the report; the collector deletes them anyway.
                Err(_) => Vec::new(),
            }
        }
        None => Vec::new(),
    };
    Ok(Some(PoolDeletePlan {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        pool_uid,
        replicas,
        secrets,
    }))
}

/// Carry out the plan (see the module docs); `server_dry_run` sends `dryRun=All`.
pub async fn execute(cluster: &Cluster, plan: &PoolDeletePlan, server_dry_run: bool) -> Result<()> {
    let ns = Some(plan.namespace.as_str());
    match &plan.pool_uid {
        Some(uid) => {
            KUBEVIRT_POOL
                .api(&cluster.client, ns)
                .delete(
                    &plan.name,
                    &guarded(DeleteParams::background(), uid, server_dry_run),
                )
                .await
                .map_err(|e| {
                    cluster.error(
                        e,
                        &KUBEVIRT_POOL.action("delete", ns).named(plan.name.as_str()),
                    )
                })?;
        }
        None => {
            for replica in &plan.replicas {
                match super::execute(cluster, replica, server_dry_run).await {
                    // Gone already, or replaced by a VM that is not ours.
                    Err(Error::NotFound { .. }) | Err(Error::Conflict(_)) => {}
                    other => other?,
                }
            }
        }
    }
    Ok(())
}

/// Wait until the pool (KubeVirt), each replica and their deleted disks are gone.
pub async fn wait_gone(
    cluster: &Cluster,
    platform: &Platform,
    plan: &PoolDeletePlan,
    timeout: Duration,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    if let Some(uid) = &plan.pool_uid {
        let ns = Some(plan.namespace.as_str());
        let api = KUBEVIRT_POOL.api(&cluster.client, ns);
        super::poll_until_gone(timeout, Duration::from_millis(250), || {
            let api = &api;
            async move {
                let found = api.get_opt(&plan.name).await.map_err(|e| {
                    cluster.error(
                        e,
                        &KUBEVIRT_POOL.action("get", ns).named(plan.name.as_str()),
                    )
                })?;
                Ok(found
                    .filter(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
                    .map(|_| vec![quoted_ref(&KUBEVIRT_POOL, &plan.name)])
                    .unwrap_or_default())
            }
        })
        .await?;
    }
    for replica in &plan.replicas {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        super::wait_gone(cluster, platform, replica, left).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vm(name: &str, labels: Value) -> Value {
        json!({"metadata": {"name": name, "labels": labels}})
    }

    #[test]
    fn only_vms_create_made_for_the_pool_are_replicas() {
        let ours = |n: &str| {
            json!({"kubevm.io/pool": "web", "app.kubernetes.io/managed-by": "kubectl-vm",
                   "kubevm.io/vm": n})
        };
        assert!(is_our_replica(&vm("web-0", ours("web-0")), "web"));
        assert!(is_our_replica(&vm("web-12", ours("web-12")), "web"));
        // Same labels, wrong names; or a VM that only carries the pool label.
        assert!(!is_our_replica(&vm("web-x", ours("web-x")), "web"));
        assert!(!is_our_replica(&vm("web-", ours("web-")), "web"));
        assert!(!is_our_replica(&vm("webs-0", ours("webs-0")), "web"));
        assert!(!is_our_replica(&vm("web-0", ours("web-1")), "web"));
        assert!(!is_our_replica(
            &vm("web-1", json!({"kubevm.io/pool": "web"})),
            "web"
        ));
        let mut other_pool = ours("web-0");
        other_pool["kubevm.io/pool"] = json!("db");
        assert!(!is_our_replica(&vm("web-0", other_pool), "web"));
        assert_eq!(index_of("web-10"), 10);
    }
}
