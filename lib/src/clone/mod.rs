//! `clone`: a new VM with its own copies of a VM's disks, through the platform's own clone
//! ([`kubevirt`]: a `clone.kubevirt.io` VirtualMachineClone; [`deckhouse`]: a
//! VirtualMachineOperation of type `Clone`), followed through its phases.
//!
//! Refused before anything is created: a bad or equal name, a source that does not exist, a
//! target name (or a new disk's name) that is taken. The new VM is labelled as ours
//! ([`crate::create::companion_selector`] finds its disks), so `delete NEW` removes it with
//! them, and the copies no longer carry the source's `kubevm.io/vm` label (`delete SRC` leaves
//! them alone).
//!
//! What stays afterwards is what the platform keeps: KubeVirt deletes a succeeded clone object
//! when its target VM is deleted (`pkg/virt-controller/watch/clone/clone.go`); Deckhouse keeps
//! operations as records of what was done.

pub mod deckhouse;
pub mod identity;
pub mod kubevirt;

use std::time::Duration;

use kube::api::{DynamicObject, PostParams};
use serde_json::{Value, json};

use crate::api::Kind;
use crate::cluster::Cluster;
use crate::create::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};
use crate::error::{Error, Result};
use crate::flavor::{Flavor, Platform};
pub use crate::lifecycle::DryRun;
use crate::lifecycle::VmRef;

/// How often the clone object is read while waiting.
const POLL: Duration = Duration::from_millis(200);

/// What to clone, and how.
#[derive(Debug, Clone)]
pub struct CloneRequest {
    /// The source VM.
    pub source: VmRef,
    /// The new VM's name (same namespace).
    pub target: String,
    /// Start the new VM once it exists.
    pub start: bool,
    /// Wait for the clone (and the start) to finish.
    pub wait: bool,
    /// How long to wait.
    pub timeout: Duration,
    /// Dry run strategy.
    pub dry_run: DryRun,
}

impl CloneRequest {
    /// Everything checkable before the first request (one line, exit 2).
    pub fn validate(&self) -> Result<()> {
        crate::validate::dns_label("VM", &self.target).map_err(|e| Error::Usage(e.to_string()))?;
        if self.target == self.source.name {
            return Err(Error::Usage(format!(
                "the new VM's name {:?} is the source's: choose another",
                self.target
            )));
        }
        if self.start && self.dry_run != DryRun::None {
            return Err(Error::Usage(
                "--start cannot be combined with --dry-run".into(),
            ));
        }
        Ok(())
    }

    fn target_ref(&self) -> VmRef {
        VmRef {
            namespace: self.source.namespace.clone(),
            name: self.target.clone(),
        }
    }
}

/// Progress of a clone.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The platform accepted the clone object (`kind/name`).
    Accepted(String),
    /// The clone is in a new phase (as the platform names it), with a detail if any.
    Phase {
        /// The phase.
        phase: String,
        /// A condition's reason or message.
        detail: Option<String>,
    },
    /// The new VM was labelled as ours (and its disks re-labelled for it).
    Labelled(usize),
    /// The new VM is starting (or already running).
    Starting,
}

/// What `clone` did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The new VM as `kind.group/name`.
    pub vm_ref: String,
    /// The clone object (VirtualMachineClone or VirtualMachineOperation) as sent or stored.
    pub request_object: Value,
    /// The new VM as read at the end (absent for dry runs and without `--wait`).
    pub vm: Option<Value>,
    /// The names of the new VM's disks (claims on KubeVirt, VirtualDisks on Deckhouse).
    pub disks: Vec<String>,
    /// Whether it waited for the end.
    pub waited: bool,
}

/// The labels that make a VM (and its disks) ours.
pub fn our_labels(vm: &str) -> Value {
    json!({ MANAGED_BY_LABEL: MANAGED_BY, VM_LABEL: vm })
}

/// Clone `request.source` to `request.target`, reporting progress through `on_event`.
pub async fn clone(
    cluster: &Cluster,
    platform: &Platform,
    request: &CloneRequest,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    request.validate()?;
    let flavor = platform.flavor;
    let source = crate::lifecycle::get_vm(cluster, flavor, &request.source).await?;
    let vm_kind = Kind::vm(flavor);
    let ns = request.source.namespace.as_str();
    ensure_free(cluster, &vm_kind, ns, &request.target).await?;
    let (clone_kind, object) = match flavor {
        Flavor::KubeVirt => (kubevirt::CLONE, kubevirt::clone_object(request, &source)),
        Flavor::Deckhouse => {
            let plan = deckhouse::plan(request, &source);
            for disk in &plan.disks {
                ensure_free(cluster, &crate::api::VIRTUAL_DISK, ns, &disk.1).await?;
            }
            (crate::lifecycle::deckhouse::VMOP, plan.operation)
        }
    };
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if request.dry_run == DryRun::Client {
        return Ok(Outcome {
            vm_ref: vm_kind.object_ref(&request.target),
            request_object: object,
            vm: None,
            disks: Vec::new(),
            waited: false,
        });
    }
    let params = PostParams {
        dry_run: request.dry_run == DryRun::Server,
        ..Default::default()
    };
    let data: DynamicObject = serde_json::from_value(object)
        .map_err(|e| Error::Internal(format!("the {} does not serialise: {e}", clone_kind.kind)))?;
    let api = clone_kind.api(&cluster.client, Some(ns));
    let created = api.create(&params, &data).await.map_err(|e| {
        cluster.error(
            e,
            &clone_kind.action("create", Some(ns)).named(name.as_str()),
        )
    })?;
    let created = serde_json::to_value(created).unwrap_or_default();
    if request.dry_run == DryRun::Server || !request.wait {
        return Ok(Outcome {
            vm_ref: vm_kind.object_ref(&request.target),
            request_object: created,
            vm: None,
            disks: Vec::new(),
            waited: false,
        });
    }
    on_event(Event::Accepted(clone_kind.object_ref(&name)));
    let work = async {
        let mut last: Option<(String, Option<String>)> = None;
        loop {
            let current = api.get(&name).await.map_err(|e| {
                cluster.error(e, &clone_kind.action("get", Some(ns)).named(name.as_str()))
            })?;
            let current = serde_json::to_value(current).unwrap_or_default();
            let (phase, detail, end) = match flavor {
                Flavor::KubeVirt => kubevirt::progress(&current),
                Flavor::Deckhouse => deckhouse::progress(&current),
            };
            if last.as_ref() != Some(&(phase.clone(), detail.clone())) && !phase.is_empty() {
                on_event(Event::Phase {
                    phase: phase.clone(),
                    detail: detail.clone(),
                });
            }
            match end {
                Some(Ok(())) => return Ok(current),
                Some(Err(message)) => return Err(Error::Platform(message)),
                None => {}
            }
            last = Some((phase, detail));
            tokio::time::sleep(POLL).await;
        }
    };
    let record = match tokio::time::timeout(request.timeout, work).await {
        Ok(result) => result?,
        Err(_) => {
            return Err(Error::Timeout(format!(
                "{} {name:?} in namespace {ns:?} to finish cloning VM {:?}",
                clone_kind.kind.to_ascii_lowercase(),
                request.source.name
            )));
        }
    };
    let disks = match flavor {
        Flavor::KubeVirt => kubevirt::adopt(cluster, request).await?,
        Flavor::Deckhouse => deckhouse::adopt(cluster, request).await?,
    };
    on_event(Event::Labelled(disks.len()));
    if request.start {
        on_event(Event::Starting);
        let options = crate::lifecycle::Options {
            dry_run: DryRun::None,
            wait: true,
            timeout: request.timeout,
            want_object: false,
        };
        let vm = request.target_ref();
        let running = crate::lifecycle::get_vm(cluster, flavor, &vm).await?;
        if running
            .pointer("/status/printableStatus")
            .and_then(Value::as_str)
            != Some("Running")
            && running.pointer("/status/phase").and_then(Value::as_str) != Some("Running")
        {
            crate::lifecycle::run(
                cluster,
                platform,
                &crate::lifecycle::Action::Start { paused: false },
                &vm,
                &options,
                &|_| {},
            )
            .await?;
        }
    }
    let vm = crate::lifecycle::get_vm(cluster, flavor, &request.target_ref()).await?;
    Ok(Outcome {
        vm_ref: vm_kind.object_ref(&request.target),
        request_object: record,
        vm: Some(vm),
        disks,
        waited: true,
    })
}

/// Refuse when `name` of `kind` exists (nothing was created yet).
async fn ensure_free(cluster: &Cluster, kind: &Kind, ns: &str, name: &str) -> Result<()> {
    let found = kind
        .api(&cluster.client, Some(ns))
        .get_opt(name)
        .await
        .map_err(|e| cluster.error(e, &kind.action("get", Some(ns)).named(name)))?;
    if found.is_some() {
        return Err(Error::NotOurs(format!(
            "{} {name:?} already exists in namespace {ns:?}; nothing was created (choose another name)",
            kind.kind.to_ascii_lowercase()
        )));
    }
    Ok(())
}

/// A JSON merge patch of `labels` onto `name` of `kind`.
pub(crate) async fn label(
    cluster: &Cluster,
    kind: &Kind,
    ns: &str,
    name: &str,
    labels: Value,
) -> Result<()> {
    kind.api(&cluster.client, Some(ns))
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .map_err(|e| cluster.error(e, &kind.action("patch", Some(ns)).named(name)))?;
    Ok(())
}

#[cfg(test)]
mod tests;
