//! Creating a VM's objects all or nothing, never touching what this run did not create.
//!
//! 1. [`check_existing`]: every object the plan would create (and, on KubeVirt, every
//!    DataVolume of `spec.dataVolumeTemplates`) is looked up first. One that exists refuses
//!    the whole create, unless it is a disk kept for this VM by `delete --keep-disks`
//!    (labelled with [`companion_selector`]'s labels for this VM and owned by nothing), which
//!    is reused as it is.
//! 2. [`create_all`]: each new object is POSTed (create semantics: a concurrent `create` of the
//!    same name gets 409 AlreadyExists instead of silently taking the object over).
//! 3. On failure or interruption every object this run created is deleted again, newest
//!    first, with a uid precondition, so an object that replaced ours meanwhile is never
//!    removed. What could not be removed is named with the command that removes it.
//!
//! [`companion_selector`]: crate::names::companion_selector

pub use crate::names::FIELD_MANAGER;

use kube::api::{DeleteParams, DynamicObject, PostParams, Preconditions};
use serde_json::Value;
use tokio::sync::watch;

use crate::api::{DATA_VOLUME, DECKHOUSE_VM, KUBEVIRT_POOL, KUBEVIRT_VM, Kind, VIRTUAL_DISK};
use crate::cluster::Cluster;
use crate::create::pool::planned_replicas;
use crate::create::{Manifests, Owner, VmOwner};
use crate::error::{Error, Result};
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};

/// One object after creating (or reusing) it.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The object as the server returned it.
    pub object: Value,
    /// Whether this run created it; `false` for a kept disk reused as it is.
    pub created: bool,
}

/// Objects that already exist and may be reused: disks kept for this VM.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Existing {
    /// Kept disks (`kind`, `name`) with the object as read.
    pub reused: Vec<(Kind, String, Value)>,
}

impl Existing {
    fn get(&self, kind: &Kind, name: &str) -> Option<&Value> {
        self.reused
            .iter()
            .find(|(k, n, _)| k == kind && n == name)
            .map(|(_, _, o)| o)
    }
}

/// Whether `object` is a disk (or a Deckhouse VirtualMachineIPAddress, `delete --keep-ip`)
/// kept for VM `vm` (our labels for it, no owner left).
pub fn is_kept_disk(kind: &Kind, object: &Value, vm: &str) -> bool {
    let labels = &object["metadata"]["labels"];
    let owners = object["metadata"]["ownerReferences"]
        .as_array()
        .is_some_and(|refs| !refs.is_empty());
    (*kind == DATA_VOLUME
        || *kind == VIRTUAL_DISK
        || *kind == crate::api::VIRTUAL_MACHINE_IP_ADDRESS)
        && labels[VM_LABEL] == vm
        && labels[MANAGED_BY_LABEL] == MANAGED_BY
        && !owners
}

/// Every object `manifests` would create, as (kind, name, the VM it is created for): the
/// planned objects and the DataVolumes the KubeVirt VM's templates make; for a
/// VirtualMachinePool also the replica VMs and their DataVolumes (`NAME-i`, `DV-i`), which
/// must be free: upstream's pool controller skips an index whose name a VM already has, so a
/// foreign `NAME-i` would leave replica `i` without its Secret.
fn targets(manifests: &Manifests) -> Result<Vec<(Kind, String, String)>> {
    let mut out = Vec::new();
    for planned in &manifests.objects {
        let kind = Kind::of(&planned.object)
            .ok_or_else(|| Error::Internal(format!("no API known for {}", planned.kind())))?;
        let for_vm = |o: &Value| {
            o.pointer("/metadata/labels")
                .and_then(|l| l.get(VM_LABEL))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let vm = for_vm(&planned.object);
        out.push((kind, planned.name().to_owned(), vm.clone()));
        let (spec, suffixes) = if kind == KUBEVIRT_POOL {
            let replicas = planned_replicas(&planned.object);
            for name in &replicas {
                out.push((KUBEVIRT_VM, name.clone(), vm.clone()));
            }
            let suffixes = (0..replicas.len()).map(|i| format!("-{i}")).collect();
            (
                planned.object.pointer("/spec/virtualMachineTemplate/spec"),
                suffixes,
            )
        } else {
            (planned.object.get("spec"), vec![String::new()])
        };
        let templates = spec
            .and_then(|s| s.get("dataVolumeTemplates"))
            .and_then(Value::as_array);
        for t in templates.into_iter().flatten() {
            if let Some(name) = t.pointer("/metadata/name").and_then(Value::as_str) {
                for suffix in &suffixes {
                    out.push((DATA_VOLUME, format!("{name}{suffix}"), for_vm(t)));
                }
            }
        }
    }
    Ok(out)
}

/// Look up everything the plan would create. An existing object refuses the create with one
/// line naming it, unless it is a disk kept for this VM.
pub async fn check_existing(cluster: &Cluster, manifests: &Manifests) -> Result<Existing> {
    let vm = manifests.vm();
    let namespace = vm["metadata"]["namespace"].as_str().unwrap_or_default();
    let ns = Some(namespace);
    let mut existing = Existing::default();
    for (kind, name, vm_name) in targets(manifests)? {
        let vm_name = vm_name.as_str();
        let found = match kind.api(&cluster.client, ns).get_opt(&name).await {
            Ok(found) => found,
            Err(e) => match cluster.error(e, &kind.action("get", ns).named(name.as_str())) {
                // A platform without CDI serves no DataVolumes: nothing can exist there.
                Error::NotServed { .. } => None,
                other => return Err(other),
            },
        };
        let Some(found) = found else { continue };
        let object = serde_json::to_value(found).unwrap_or(Value::Null);
        let what = kind.kind.to_ascii_lowercase();
        if kind == KUBEVIRT_VM || kind == DECKHOUSE_VM || kind == KUBEVIRT_POOL {
            return Err(Error::NotOurs(format!(
                "{what} {name:?} already exists in namespace {namespace:?}; delete it first or choose another name"
            )));
        }
        if is_kept_disk(&kind, &object, vm_name) {
            existing.reused.push((kind, name, object));
            continue;
        }
        return Err(Error::NotOurs(format!(
            "{what} {name:?} already exists in namespace {namespace:?} and was not created by kubectl vm for VM {vm_name:?}; nothing was changed (delete it or choose another VM name)"
        )));
    }
    Ok(existing)
}

/// Create `manifests` in order (POST; with `dry_run` the server only validates). Kept disks
/// in `existing` are reused, not written. `interrupts` counts Ctrl-C presses: the first stops
/// creating and rolls back, a second abandons the rollback. `on_applied` sees each object.
pub async fn create_all(
    cluster: &Cluster,
    manifests: &Manifests,
    existing: &Existing,
    dry_run: bool,
    mut interrupts: Option<watch::Receiver<usize>>,
    mut on_applied: impl FnMut(&Applied),
) -> Result<Vec<Applied>> {
    let mut done: Vec<Applied> = Vec::new();
    let mut vm_owner: Option<VmOwner> = None;
    for planned in &manifests.objects {
        let mut planned = planned.clone();
        if planned.owner == Owner::Vm {
            match &vm_owner {
                Some(owner) => planned.set_owner(owner),
                // A dry run has no real uid; the reference is checked by the real run.
                None if dry_run => {}
                None => {
                    return Err(Error::Internal(
                        "an owned object comes before its VM".into(),
                    ));
                }
            }
        }
        let kind = Kind::of(&planned.object)
            .ok_or_else(|| Error::Internal(format!("no API known for {}", planned.kind())))?;
        if let Some(kept) = existing.get(&kind, planned.name()) {
            let applied = Applied {
                object: kept.clone(),
                created: false,
            };
            on_applied(&applied);
            done.push(applied);
            continue;
        }
        let outcome = match interrupts.as_mut() {
            Some(rx) => tokio::select! {
                biased;
                _ = rx.wait_for(|n| *n >= 1) => None,
                r = create_one(cluster, kind, &planned.object, dry_run) => Some(r),
            },
            None => Some(create_one(cluster, kind, &planned.object, dry_run).await),
        };
        let reason = match outcome {
            Some(Ok(applied)) => {
                if planned.is_main() {
                    vm_owner = VmOwner::from_object(&applied.object);
                }
                on_applied(&applied);
                done.push(applied);
                continue;
            }
            Some(Err(err)) => crate::image::kubevirt::with_clone_permission_hint(err.to_string()),
            None => format!(
                "interrupted while waiting for the server (check that it was not created anyway: kubectl get -n {} {})",
                planned.object["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default(),
                kind.object_ref(planned.name())
            ),
        };
        let undo = if dry_run {
            String::new()
        } else {
            roll_back(cluster, &done, interrupts.as_mut())
                .await
                .describe()
        };
        let name = planned.name().to_owned();
        return Err(Error::Apply {
            object: format!("{} {name:?}", kind.kind.to_ascii_lowercase()),
            reason,
            undo,
        });
    }
    Ok(done)
}

async fn create_one(
    cluster: &Cluster,
    kind: Kind,
    object: &Value,
    dry_run: bool,
) -> Result<Applied> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = object["metadata"]["namespace"].as_str();
    let api = kind.api(&cluster.client, namespace);
    let params = PostParams {
        dry_run,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    };
    let body: DynamicObject = serde_json::from_value(object.clone())
        .map_err(|e| Error::Internal(format!("{} {name}: {e}", kind.kind)))?;
    let created = api
        .create(&params, &body)
        .await
        .map_err(|e| cluster.error(e, &kind.action("create", namespace).named(name)))?;
    Ok(Applied {
        object: serde_json::to_value(created).unwrap_or(Value::Null),
        created: true,
    })
}

/// What a rollback achieved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rollback {
    /// How many objects this run created were removed (or were already gone).
    pub removed: usize,
    /// Objects left behind: (`kind.group/name`, namespace, why).
    pub left: Vec<(String, String, String)>,
    /// Whether a second interrupt abandoned the rollback.
    pub abandoned: bool,
}

impl Rollback {
    /// The tail of the error message: what was removed and what is left, with the command
    /// that removes the rest.
    pub fn describe(&self) -> String {
        let total = self.removed + self.left.len();
        if self.left.is_empty() {
            return match self.removed {
                0 => String::new(),
                1 => "; removed the 1 object created before it".to_owned(),
                n => format!("; removed the {n} objects created before it"),
            };
        }
        let refs: Vec<&str> = self.left.iter().map(|(r, _, _)| r.as_str()).collect();
        let why: Vec<String> = self
            .left
            .iter()
            .map(|(r, _, why)| format!("{r}: {why}"))
            .collect();
        let ns = &self.left[0].1;
        format!(
            "; {}removed {} of the {total} objects created before it; left behind: {} ({}); remove them with: kubectl delete -n {ns} {}",
            if self.abandoned {
                "rollback interrupted: "
            } else {
                ""
            },
            self.removed,
            refs.join(", "),
            why.join("; "),
            refs.join(" "),
        )
    }
}

/// Delete what this run created, newest first, each with a uid precondition. An object
/// already gone or replaced by someone else (precondition failed) counts as removed: it is
/// not ours to delete.
pub async fn roll_back(
    cluster: &Cluster,
    done: &[Applied],
    mut interrupts: Option<&mut watch::Receiver<usize>>,
) -> Rollback {
    let mut result = Rollback::default();
    for applied in done.iter().rev().filter(|a| a.created) {
        let Some(kind) = Kind::of(&applied.object) else {
            continue;
        };
        let meta = &applied.object["metadata"];
        let name = meta["name"].as_str().unwrap_or_default();
        let namespace = meta["namespace"].as_str().unwrap_or_default();
        let reference = kind.object_ref(name);
        if result.abandoned {
            result
                .left
                .push((reference, namespace.to_owned(), "not removed".to_owned()));
            continue;
        }
        let mut params = DeleteParams::background();
        params.preconditions = Some(Preconditions {
            uid: meta["uid"].as_str().map(str::to_owned),
            resource_version: None,
        });
        let api = kind.api(&cluster.client, Some(namespace));
        let outcome = match interrupts.as_deref_mut() {
            Some(rx) => tokio::select! {
                biased;
                _ = rx.wait_for(|n| *n >= 2) => None,
                r = api.delete(name, &params) => Some(r),
            },
            None => Some(api.delete(name, &params).await),
        };
        match outcome {
            Some(Ok(_)) => result.removed += 1,
            Some(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => result.removed += 1,
            Some(Err(e)) => {
                let why = cluster
                    .error(e, &kind.action("delete", Some(namespace)).named(name))
                    .to_string();
                result.left.push((reference, namespace.to_owned(), why));
            }
            None => {
                result.abandoned = true;
                result
                    .left
                    .push((reference, namespace.to_owned(), "not removed".to_owned()));
            }
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_unowned_disks_labelled_for_this_vm_are_reused() {
        let kept = json!({"metadata": {"name": "web-root", "labels": {
            "kubevm.io/vm": "web", "app.kubernetes.io/managed-by": "kubectl-vm"}}});
        assert!(is_kept_disk(&VIRTUAL_DISK, &kept, "web"));
        assert!(is_kept_disk(&DATA_VOLUME, &kept, "web"));
        assert!(
            !is_kept_disk(&VIRTUAL_DISK, &kept, "db"),
            "another VM's disk"
        );
        assert!(
            !is_kept_disk(&crate::api::SECRET, &kept, "web"),
            "not a disk"
        );
        let mut owned = kept.clone();
        owned["metadata"]["ownerReferences"] = json!([{"uid": "x"}]);
        assert!(!is_kept_disk(&VIRTUAL_DISK, &owned, "web"));
        let foreign = json!({"metadata": {"name": "web-root"}});
        assert!(!is_kept_disk(&VIRTUAL_DISK, &foreign, "web"));
    }

    #[test]
    fn a_failed_rollback_names_what_is_left_and_how_to_remove_it() {
        let r = Rollback {
            removed: 1,
            left: vec![(
                "datavolume.cdi.kubevirt.io/web-boot".into(),
                "dev".into(),
                "the server answered 500 InternalError: boom".into(),
            )],
            abandoned: false,
        };
        assert_eq!(
            r.describe(),
            "; removed 1 of the 2 objects created before it; left behind: datavolume.cdi.kubevirt.io/web-boot (datavolume.cdi.kubevirt.io/web-boot: the server answered 500 InternalError: boom); remove them with: kubectl delete -n dev datavolume.cdi.kubevirt.io/web-boot"
        );
        assert_eq!(Rollback::default().describe(), "");
    }
}
