//! Creating a set of objects all or nothing: server-side apply (field manager `kubectl-vm`)
//! in dependency order, and on failure removal of every object this run created, so nothing
//! half-created remains. Objects that already existed (a disk kept by `delete --keep-disks`)
//! are applied onto but never removed.

use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::Value;

use crate::api::Kind;
use crate::cluster::Cluster;
use crate::create::{Manifests, Owner, VmOwner};
use crate::error::{Error, Result};

/// Field manager of every write kubectl-vm makes.
pub const FIELD_MANAGER: &str = "kubectl-vm";

/// One object after applying.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The object as the server returned it.
    pub object: Value,
    /// Whether this run created it (it did not exist before).
    pub created: bool,
}

/// Apply `manifests` in order into `namespace`. With `dry_run` the server validates every
/// object without storing anything. `on_applied` sees each object as it lands.
pub async fn apply_all(
    cluster: &Cluster,
    manifests: &Manifests,
    dry_run: bool,
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
        match apply_one(cluster, &planned.object, dry_run).await {
            Ok(applied) => {
                if applied.object.get("kind").and_then(Value::as_str) == Some("VirtualMachine") {
                    vm_owner = VmOwner::from_object(&applied.object);
                }
                on_applied(&applied);
                done.push(applied);
            }
            Err(err) => {
                let removed = if dry_run {
                    0
                } else {
                    roll_back(cluster, &done).await
                };
                let name = planned.name().to_owned();
                let kind = planned.kind().to_ascii_lowercase();
                let undo = match removed {
                    0 => String::new(),
                    1 => "; removed the 1 object created before it".to_owned(),
                    n => format!("; removed the {n} objects created before it"),
                };
                return Err(Error::Apply {
                    object: format!("{kind} {name:?}"),
                    reason: err.to_string(),
                    undo,
                });
            }
        }
    }
    Ok(done)
}

async fn apply_one(cluster: &Cluster, object: &Value, dry_run: bool) -> Result<Applied> {
    let kind = Kind::of(object)
        .ok_or_else(|| Error::Internal(format!("no API known for {}", object["kind"])))?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = object["metadata"]["namespace"].as_str();
    let api = kind.api(&cluster.client, namespace);
    let existed = api
        .get_opt(name)
        .await
        .map_err(|e| cluster.error(e, &kind.action("get", namespace).named(name)))?
        .is_some();
    let mut params = PatchParams::apply(FIELD_MANAGER);
    params.dry_run = dry_run;
    let applied = api
        .patch(name, &params, &Patch::Apply(object))
        .await
        .map_err(|e| cluster.error(e, &kind.action("patch", namespace).named(name)))?;
    Ok(Applied {
        object: serde_json::to_value(applied).unwrap_or(Value::Null),
        created: !existed,
    })
}

/// Delete what this run created, newest first; returns how many went. Best effort: the
/// original error is what the user needs to see.
async fn roll_back(cluster: &Cluster, done: &[Applied]) -> usize {
    let mut removed = 0;
    for applied in done.iter().rev().filter(|a| a.created) {
        let Some(kind) = Kind::of(&applied.object) else {
            continue;
        };
        let name = applied.object["metadata"]["name"]
            .as_str()
            .unwrap_or_default();
        let namespace = applied.object["metadata"]["namespace"].as_str();
        if kind
            .api(&cluster.client, namespace)
            .delete(name, &DeleteParams::background())
            .await
            .is_ok()
        {
            removed += 1;
        }
    }
    removed
}
