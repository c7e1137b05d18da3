//! `memory-dump get|download|remove`: KubeVirt's memory dump of a running VM into a claim, and
//! the dump out of it ([`download`]).
//!
//! - `PUT /apis/subresources.kubevirt.io/v1/namespaces/NS/virtualmachines/NAME/memorydump`
//!   with a `VirtualMachineMemoryDumpRequest{claimName}` (202), and `…/removememorydump`
//!   with no body (kubevirt `pkg/virt-api/api.go`, handlers `pkg/virt-api/rest/memorydump.go`).
//! - Progress is the VM's `status.memoryDumpRequest` (`claimName`, `phase` Associating →
//!   InProgress → Unmounting → Completed, or Failed with `message`; `startTimestamp`,
//!   `endTimestamp`, `fileName`; `pkg/storage/memorydump/memorydump.go`).
//! - `--create-claim` makes the claim as `virtctl memory-dump get --create-claim` does
//!   (`pkg/virtctl/memorydump/memorydump.go`): refused while the VM still has a dump
//!   associated or the claim exists; sized `CalcExpectedMemoryDumpSize` (the VMI's memory
//!   request + 100 MiB, `pkg/util/util.go`) plus the filesystem overhead of the claim's
//!   storage class from CDIConfig `config` (its `status.filesystemOverhead.storageClass[SC]`,
//!   else `.global`; 5.5% when CDIConfig cannot be read), aligned up to 1 MiB
//!   (`pkg/storage/types/cdi.go`); access mode ReadWriteOnce unless given (ReadOnlyMany is
//!   refused); label `cdi.kubevirt.io/applyStorageProfile: "true"`.
//!
//! Deckhouse virtualization has no memory dump: its subresource API
//! (`subresources.virtualization.deckhouse.io`, deckhouse/virtualization
//! `api/subresources/v1alpha2/register.go`) serves no `memorydump`, and its KubeVirt is internal.
//! The platform table says so (`Capabilities::memory_dump`).

pub mod download;

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::PostParams;
use serde_json::{Value, json};

use crate::api::{KUBEVIRT_VM, KUBEVIRT_VMI};
use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};
use crate::flavor::Flavor;
use crate::lifecycle::VmRef;
use crate::quantity::Quantity;

/// `memoryDumpOverhead` of `CalcExpectedMemoryDumpSize` (`pkg/util/util.go`).
pub const DUMP_OVERHEAD: u64 = 100 * 1024 * 1024;
/// virtctl's filesystem overhead when CDIConfig cannot be read (`filesystemOverhead`).
pub const DEFAULT_FS_OVERHEAD: f64 = 0.055;
const MIB: u64 = 1024 * 1024;

/// Refuse on a platform without memory dumps (exit 2, one line).
pub fn check(flavor: Flavor) -> Result<()> {
    match crate::platform::of(flavor).memory_dump.reason() {
        None => Ok(()),
        Some(why) => Err(Error::InvalidTarget(why.to_owned())),
    }
}

/// A claim to create for the dump.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewClaim {
    /// Storage class (the cluster's default when `None`).
    pub storage_class: Option<String>,
    /// `ReadWriteOnce` (default) or `ReadWriteMany`.
    pub access_mode: Option<String>,
}

/// `memory-dump get`.
#[derive(Debug, Clone)]
pub struct GetRequest {
    /// The VM.
    pub vm: VmRef,
    /// The claim (may be omitted to dump again into the claim already associated).
    pub claim: Option<String>,
    /// Create the claim first.
    pub create: Option<NewClaim>,
    /// Wait for the dump to complete.
    pub wait: bool,
    /// How long to wait.
    pub timeout: Duration,
}

/// Progress of `get` and `remove`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The claim was created with this size.
    ClaimCreated {
        /// Claim name.
        claim: String,
        /// Its size.
        size: Quantity,
    },
    /// KubeVirt accepted the request.
    Requested,
    /// `status.memoryDumpRequest.phase` changed.
    Phase(String),
}

/// How a dump ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dumped {
    /// The claim holding it.
    pub claim: String,
    /// The dump's file in the claim (when waited for).
    pub file_name: Option<String>,
}

/// Check a `--access-mode` locally, as virtctl does (`generatePVC`).
pub fn check_access_mode(mode: &str) -> Result<()> {
    match mode {
        "ReadWriteOnce" | "ReadWriteMany" => Ok(()),
        "ReadOnlyMany" => Err(Error::InvalidTarget(
            "cannot dump memory to a read-only claim: use --access-mode ReadWriteOnce or ReadWriteMany".into(),
        )),
        other => Err(Error::InvalidTarget(format!(
            "invalid --access-mode {other:?}: use ReadWriteOnce or ReadWriteMany"
        ))),
    }
}

/// The size a dump claim needs: `(memory request + 100 MiB) × (1 + overhead)`, aligned up to
/// 1 MiB (`GetSizeIncludingGivenOverhead`).
pub fn claim_size(memory_request: u64, overhead: f64) -> Quantity {
    let total = (1.0 + overhead) * (memory_request + DUMP_OVERHEAD) as f64;
    let aligned = (total / MIB as f64).ceil() as u64 * MIB;
    Quantity::from_bytes(aligned)
}

/// The filesystem overhead CDIConfig gives a storage class (`None`: the default class).
pub fn fs_overhead(cdi_config: Option<&Value>, storage_class: Option<&str>) -> f64 {
    let Some(config) = cdi_config else {
        return DEFAULT_FS_OVERHEAD;
    };
    let parse = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .and_then(|s| s.parse::<f64>().ok())
    };
    storage_class
        .and_then(|sc| {
            parse(
                config
                    .pointer("/status/filesystemOverhead/storageClass")
                    .and_then(|m| m.get(sc)),
            )
        })
        .or_else(|| parse(config.pointer("/status/filesystemOverhead/global")))
        .unwrap_or(DEFAULT_FS_OVERHEAD)
}

fn path(vm: &VmRef, sub: &str) -> String {
    crate::lifecycle::kubevirt::subresource_path("virtualmachines", vm, sub)
}

async fn get_json(cluster: &Cluster, kind: crate::api::Kind, vm: &VmRef) -> Result<Value> {
    kind.api(&cluster.client, Some(&vm.namespace))
        .get(&vm.name)
        .await
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .map_err(|e| cluster.error(e, &kind.action("get", Some(&vm.namespace)).named(&vm.name)))
}

async fn put(cluster: &Cluster, vm: &VmRef, sub: &str, body: Option<Value>) -> Result<()> {
    let request = http::Request::put(path(vm, sub))
        .header("content-type", "application/json")
        .body(body.map(|b| b.to_string().into_bytes()).unwrap_or_default())
        .map_err(|e| Error::Internal(e.to_string()))?;
    cluster
        .client
        .request_text(request)
        .await
        .map(drop)
        .map_err(|e| {
            cluster.error(
                e,
                &Action::new(
                    "update",
                    "virtualmachines/".to_owned() + sub,
                    "virtualmachine",
                )
                .in_namespace(Some(&vm.namespace))
                .named(&vm.name),
            )
        })
}

async fn create_claim(
    cluster: &Cluster,
    vm: &VmRef,
    claim: &str,
    new: &NewClaim,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<()> {
    let current = get_json(cluster, KUBEVIRT_VM, vm).await?;
    if current.pointer("/status/memoryDumpRequest").is_some() {
        return Err(Error::Platform(format!(
            "{} still has a memory dump associated: remove it first (`kubectl vm memory-dump remove {}`) before creating a new claim",
            vm.name, vm.name
        )));
    }
    let pvcs: kube::Api<PersistentVolumeClaim> =
        kube::Api::namespaced(cluster.client.clone(), &vm.namespace);
    let pvc_action = Action::new("get", "persistentvolumeclaims", "persistentvolumeclaim")
        .in_namespace(Some(&vm.namespace));
    if pvcs
        .get_opt(claim)
        .await
        .map_err(|e| cluster.error(e, &pvc_action.clone().named(claim)))?
        .is_some()
    {
        return Err(Error::Platform(format!(
            "claim {claim:?} already exists in {}: name another, or drop --create-claim to dump into it",
            vm.namespace
        )));
    }
    let vmi = get_json(cluster, KUBEVIRT_VMI, vm).await?;
    let memory = vmi
        .pointer("/spec/domain/resources/requests/memory")
        .and_then(Value::as_str)
        .map(Quantity::parse)
        .transpose()
        .map_err(|e| Error::Platform(format!("the VMI's memory request: {}", e.reason)))?
        .map_or(0, Quantity::bytes);
    let cdi: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        cluster.client.clone(),
        &kube::api::ApiResource {
            group: "cdi.kubevirt.io".into(),
            version: "v1beta1".into(),
            api_version: "cdi.kubevirt.io/v1beta1".into(),
            kind: "CDIConfig".into(),
            plural: "cdiconfigs".into(),
        },
    );
    // virtctl falls back to the default overhead when CDIConfig cannot be read.
    let config = cdi
        .get_opt("config")
        .await
        .ok()
        .flatten()
        .map(|o| serde_json::to_value(o).unwrap_or_default());
    let size = claim_size(
        memory,
        fs_overhead(config.as_ref(), new.storage_class.as_deref()),
    );
    let mut spec = json!({
        "accessModes": [new.access_mode.as_deref().unwrap_or("ReadWriteOnce")],
        "resources": {"requests": {"storage": size.to_string()}},
    });
    if let Some(sc) = &new.storage_class {
        spec["storageClassName"] = json!(sc);
    }
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": vm.namespace,
                     "labels": {"cdi.kubevirt.io/applyStorageProfile": "true"}},
        "spec": spec,
    }))
    .map_err(|e| Error::Internal(e.to_string()))?;
    pvcs.create(&PostParams::default(), &pvc)
        .await
        .map_err(|e| {
            cluster.error(
                e,
                &Action::new("create", "persistentvolumeclaims", "persistentvolumeclaim")
                    .in_namespace(Some(&vm.namespace))
                    .named(claim),
            )
        })?;
    on_event(Event::ClaimCreated {
        claim: claim.to_owned(),
        size,
    });
    Ok(())
}

/// Watch the VM until `done` says its dump request is where it should be.
async fn wait_for(
    cluster: &Cluster,
    vm: &VmRef,
    on_event: &(dyn Fn(Event) + Send + Sync),
    mut done: impl FnMut(Option<&Value>) -> Option<Result<Option<String>>>,
) -> Result<Option<String>> {
    let last = std::sync::Mutex::new(String::new());
    let w = crate::lifecycle::watch::Watched::new(KUBEVIRT_VM, &vm.namespace, &vm.name);
    crate::lifecycle::watch::until(cluster, &[w], |objs| {
        let Some(obj) = objs[0].as_ref() else {
            return Some(Err(Error::NotFound {
                kind: "virtualmachine".into(),
                name: vm.name.clone(),
                namespace: Some(vm.namespace.clone()),
            }));
        };
        let req = obj.pointer("/status/memoryDumpRequest");
        let phase = req
            .and_then(|r| r["phase"].as_str())
            .unwrap_or("")
            .to_owned();
        let mut seen = last.lock().expect("phase");
        if !phase.is_empty() && *seen != phase {
            on_event(Event::Phase(phase.clone()));
            seen.clone_from(&phase);
        }
        done(req)
    })
    .await
}

/// `memory-dump get`: (create the claim,) request the dump, and wait for it.
pub async fn get(
    cluster: &Cluster,
    flavor: Flavor,
    request: &GetRequest,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Dumped> {
    check(flavor)?;
    let vm = &request.vm;
    let work = async {
        if let (Some(new), Some(claim)) = (&request.create, &request.claim) {
            create_claim(cluster, vm, claim, new, on_event).await?;
        }
        let mut body = json!({});
        if let Some(claim) = &request.claim {
            body["claimName"] = json!(claim);
        }
        put(cluster, vm, "memorydump", Some(body)).await?;
        on_event(Event::Requested);
        let claim = match &request.claim {
            Some(c) => c.clone(),
            None => get_json(cluster, KUBEVIRT_VM, vm)
                .await?
                .pointer("/status/memoryDumpRequest/claimName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        };
        if !request.wait {
            return Ok(Dumped {
                claim,
                file_name: None,
            });
        }
        let file_name = wait_for(cluster, vm, on_event, |req| {
            let req = req?;
            match req["phase"].as_str() {
                Some("Completed") => Some(Ok(req["fileName"].as_str().map(str::to_owned))),
                Some("Failed") => Some(Err(Error::Platform(format!(
                    "the memory dump of {} failed: {}",
                    vm.name,
                    req["message"].as_str().unwrap_or("no reason given")
                )))),
                _ => None,
            }
        })
        .await?;
        Ok(Dumped { claim, file_name })
    };
    match tokio::time::timeout(request.timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(format!(
            "the memory dump of {vm} (after {}s; raise --timeout, or pass --no-wait)",
            request.timeout.as_secs()
        ))),
    }
}

/// `memory-dump remove`: dissociate the claim from the VM (the claim and its dump stay).
pub async fn remove(
    cluster: &Cluster,
    flavor: Flavor,
    vm: &VmRef,
    wait: bool,
    timeout: Duration,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Option<String>> {
    check(flavor)?;
    let work = async {
        let claim = get_json(cluster, KUBEVIRT_VM, vm)
            .await?
            .pointer("/status/memoryDumpRequest/claimName")
            .and_then(Value::as_str)
            .map(str::to_owned);
        put(cluster, vm, "removememorydump", None).await?;
        on_event(Event::Requested);
        if wait {
            wait_for(cluster, vm, on_event, |req| {
                req.is_none().then_some(Ok(None))
            })
            .await?;
        }
        Ok(claim)
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(format!(
            "the memory dump of {vm} to be dissociated (after {}s; raise --timeout, or pass --no-wait)",
            timeout.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_sizes_follow_virtctl() {
        // No memory request: 100 MiB × 1.055 = 105.5 MiB → 106 MiB.
        assert_eq!(claim_size(0, 0.055).bytes(), 106 * MIB);
        // 2 GiB: (2048 + 100) MiB × 1.055 = 2266.14 MiB → 2267 MiB.
        assert_eq!(claim_size(2048 * MIB, 0.055).bytes(), 2267 * MIB);
        assert_eq!(claim_size(1024 * MIB, 0.0).bytes(), 1124 * MIB);
    }

    #[test]
    fn overhead_prefers_the_storage_class() {
        let config = json!({"status": {"filesystemOverhead": {"global": "0.1",
            "storageClass": {"fast": "0.2"}}}});
        assert_eq!(fs_overhead(Some(&config), Some("fast")), 0.2);
        assert_eq!(fs_overhead(Some(&config), Some("slow")), 0.1);
        assert_eq!(fs_overhead(Some(&config), None), 0.1);
        assert_eq!(fs_overhead(None, Some("fast")), DEFAULT_FS_OVERHEAD);
    }

    #[test]
    fn access_modes_are_checked_locally() {
        assert!(check_access_mode("ReadWriteOnce").is_ok());
        assert!(check_access_mode("ReadWriteMany").is_ok());
        assert!(check_access_mode("ReadOnlyMany").is_err());
        assert!(check_access_mode("rwo").is_err());
    }
}
