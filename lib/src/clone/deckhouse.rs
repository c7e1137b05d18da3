//! Deckhouse: a VirtualMachineOperation `type: Clone` (FACTS §10; `pkg/controller/vmop/snapshot/
//! internal/service/clone.go`). The source may be Running or Stopped. Names come from
//! `clone.nameReplacement`: the VM becomes NEW, each VirtualDisk `SRC-x` becomes `NEW-x` (any
//! other `d` becomes `NEW-d`), and so does the provisioning Secret. The controller creates the
//! VM without labels and the disks with the source disks' labels (`restorer/vm_restorer.go`,
//! `snapshot_resources.go`), so afterwards the VM and its disks are labelled for NEW here. The
//! operation stays as the record of the clone, owned by the new VM (like KubeVirt's clone
//! object): `delete NEW` takes it and the copied provisioning Secret, and NEW can be cloned
//! again.

use serde_json::{Value, json};

use super::{CloneRequest, label, our_labels};
use crate::api::{DECKHOUSE_VM, Kind, SECRET, VIRTUAL_DISK};
use crate::cluster::Cluster;
use crate::error::Result;

/// What the operation will make.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The VirtualMachineOperation.
    pub operation: Value,
    /// `(source disk, new disk)`.
    pub disks: Vec<(String, String)>,
}

/// The new name of the source's `name` (a disk or Secret) for the clone `target`.
pub fn new_name(source_vm: &str, target: &str, name: &str) -> String {
    match name.strip_prefix(&format!("{source_vm}-")) {
        Some(rest) => format!("{target}-{rest}"),
        None => format!("{target}-{name}"),
    }
}

/// The longest `to` of a `nameReplacement` rule Deckhouse accepts: the CEL rule
/// `self.all(nr, has(nr.to) && size(nr.to) >= 1 && size(nr.to) <= 59)` on
/// VirtualMachineOperation `spec.clone.nameReplacement` and VirtualMachineSnapshotOperation
/// `spec.createVirtualMachine.nameReplacement` (deckhouse/virtualization `crds/
/// virtualmachineoperations.yaml`, `crds/virtualmachinesnapshotoperations.yaml`). Longer is a
/// 422 from the API server, although a VM name may have 63.
pub const NAME_REPLACEMENT_MAX: usize = 59;

/// Refuses (as a usage error: nothing was made) a new VM name `target` that makes one of
/// `renames` (`(old, new)`: the VM, its disks, its Secret) longer than
/// [`NAME_REPLACEMENT_MAX`].
pub fn check_name_lengths<'a>(
    target: &str,
    renames: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<()> {
    for (old, new) in renames {
        let n = new.chars().count();
        if n > NAME_REPLACEMENT_MAX {
            let what = if new == target {
                format!("is {n} characters long")
            } else {
                format!("makes {old:?} into {new:?} ({n} characters)")
            };
            return Err(crate::error::Error::Usage(format!(
                "the new VM's name {target:?} {what}: Deckhouse allows at most {NAME_REPLACEMENT_MAX} characters for a copy's names; choose a shorter name"
            )));
        }
    }
    Ok(())
}

/// The `(old, new)` names of a planned operation's `nameReplacement` rules (at `pointer`).
pub fn renames<'a>(operation: &'a Value, pointer: &str) -> Vec<(&'a str, &'a str)> {
    operation
        .pointer(pointer)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r.pointer("/from/name")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                r["to"].as_str().unwrap_or(""),
            )
        })
        .collect()
}

/// The operation's name for a new VM `target`.
pub fn operation_name(target: &str) -> String {
    format!("clone-{target}")
}

/// The operation cloning `source` for `request`.
pub fn plan(request: &CloneRequest, source: &Value) -> Plan {
    let src = request.source.name.as_str();
    let target = request.target.as_str();
    let disks: Vec<(String, String)> = source
        .pointer("/spec/blockDeviceRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == "VirtualDisk")
        .filter_map(|r| r["name"].as_str())
        .map(|d| (d.to_owned(), new_name(src, target, d)))
        .collect();
    let mut rules = vec![json!({"from": {"kind": "VirtualMachine", "name": src}, "to": target})];
    for (old, new) in &disks {
        rules.push(json!({"from": {"kind": "VirtualDisk", "name": old}, "to": new}));
    }
    if let Some(secret) = source
        .pointer("/spec/provisioning/userDataRef")
        .filter(|r| r["kind"] == "Secret")
        .and_then(|r| r["name"].as_str())
    {
        rules.push(json!({"from": {"kind": "Secret", "name": secret}, "to": new_name(src, target, secret)}));
    }
    Plan {
        operation: json!({
            "apiVersion": crate::lifecycle::deckhouse::VMOP.api_version(),
            "kind": "VirtualMachineOperation",
            "metadata": {
                "name": operation_name(target),
                "namespace": request.source.namespace,
                "labels": our_labels(target),
            },
            "spec": {
                "type": "Clone",
                "virtualMachineName": src,
                "clone": {"mode": "Strict", "nameReplacement": rules},
            },
        }),
        disks,
    }
}

/// `(phase, detail, end)` of the operation: `end` is set once it completed or failed.
pub fn progress(
    op: &Value,
) -> (
    String,
    Option<String>,
    Option<std::result::Result<(), String>>,
) {
    let phase = op
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let completed = op
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Completed")
        .cloned()
        .unwrap_or(Value::Null);
    let reason = completed["reason"].as_str().map(str::to_owned);
    let name = op["metadata"]["name"].as_str().unwrap_or_default();
    match phase.as_str() {
        "Completed" => (phase, None, Some(Ok(()))),
        "Failed" | "Superseded" => {
            let mut message = completed["message"]
                .as_str()
                .filter(|m| !m.is_empty())
                .map(str::to_owned)
                .or(reason.clone())
                .unwrap_or_else(|| "no reason given".into());
            let failed: Vec<&str> = op
                .pointer("/status/resources")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|r| r["status"] == "Failed")
                .filter_map(|r| r["message"].as_str())
                .collect();
            if !failed.is_empty() {
                message = format!("{message} ({})", failed.join("; "));
            }
            (
                phase,
                reason,
                Some(Err(format!(
                    "virtualmachineoperation {name:?} failed: {message}"
                ))),
            )
        }
        _ => (phase, reason, None),
    }
}

/// After success: label the new VM and its disks for it (they carried the source's labels or
/// none). Returns the disks' names.
pub async fn adopt(cluster: &Cluster, request: &CloneRequest) -> Result<Vec<String>> {
    let ns = request.source.namespace.as_str();
    let target = request.target.as_str();
    label(cluster, &DECKHOUSE_VM, ns, target, our_labels(target)).await?;
    let vm = crate::lifecycle::get_vm(
        cluster,
        crate::flavor::Flavor::Deckhouse,
        &request.target_ref(),
    )
    .await?;
    let disks: Vec<String> = vm
        .pointer("/spec/blockDeviceRefs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == "VirtualDisk")
        .filter_map(|r| r["name"].as_str().map(str::to_owned))
        .collect();
    for disk in &disks {
        label(cluster, &VIRTUAL_DISK, ns, disk, our_labels(target)).await?;
    }
    let owner = json!({
        "apiVersion": DECKHOUSE_VM.api_version(), "kind": "VirtualMachine",
        "name": target, "uid": vm.pointer("/metadata/uid").cloned().unwrap_or_default(),
    });
    let operation = operation_name(target);
    add_owner(
        cluster,
        &crate::lifecycle::deckhouse::VMOP,
        ns,
        &operation,
        &owner,
    )
    .await?;
    // The Secret the operation copied: nameReplacement renames the source's to `NEW-…`, so the
    // new VM refers to the copy, never to the source's own.
    if let Some(secret) = vm
        .pointer("/spec/provisioning/userDataRef")
        .filter(|r| r["kind"] == "Secret")
        .and_then(|r| r["name"].as_str())
        .filter(|s| s.starts_with(&format!("{target}-")))
    {
        add_owner(cluster, &SECRET, ns, secret, &owner).await?;
    }
    Ok(disks)
}

/// Adds `owner` to the ownerReferences of `name` (a JSON merge patch replaces the list, so the
/// patch carries the object's resourceVersion: a concurrent change makes it fail, not vanish).
pub(crate) async fn add_owner(
    cluster: &Cluster,
    kind: &Kind,
    ns: &str,
    name: &str,
    owner: &Value,
) -> Result<()> {
    let api = kind.api(&cluster.client, Some(ns));
    let Some(obj) = api
        .get_opt(name)
        .await
        .map_err(|e| cluster.error(e, &kind.action("get", Some(ns)).named(name)))?
    else {
        return Ok(());
    };
    let mut refs = obj.metadata.owner_references.clone().unwrap_or_default();
    if refs.iter().any(|r| Some(&json!(r.uid)) == owner.get("uid")) {
        return Ok(());
    }
    let mut refs: Vec<Value> = refs
        .drain(..)
        .map(|r| serde_json::to_value(r).unwrap_or_default())
        .collect();
    refs.push(owner.clone());
    let patch = json!({"metadata": {
        "resourceVersion": obj.metadata.resource_version,
        "ownerReferences": refs,
    }});
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(patch),
    )
    .await
    .map_err(|e| cluster.error(e, &kind.action("patch", Some(ns)).named(name)))?;
    Ok(())
}

/// Points a cloned VM's cloud-init at its own Secret: the copied spec holds the source's text
/// inline (`provisioning.userData`).
pub(super) async fn point_user_data_at(
    cluster: &Cluster,
    ns: &str,
    vm: &str,
    secret: &str,
) -> Result<()> {
    DECKHOUSE_VM
        .api(&cluster.client, Some(ns))
        .patch(
            vm,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"provisioning": {
                "type": "UserDataRef", "userData": null,
                "userDataRef": {"kind": "Secret", "name": secret}}}})),
        )
        .await
        .map_err(|e| cluster.error(e, &DECKHOUSE_VM.action("patch", Some(ns)).named(vm)))?;
    Ok(())
}
