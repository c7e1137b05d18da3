//! KubeVirt: a `clone.kubevirt.io/v1beta1` VirtualMachineClone (FACTS: clone.kubevirt.io;
//! `pkg/virt-controller/watch/clone/`). virt-controller goes `SnapshotInProgress` →
//! `RestoreInProgress` → `CreatingTargetVM` → `Succeeded`; the new VM is created halted with
//! new claims named `NEW-<volume>` (`volumeNamePolicy: PrefixTargetName`), no MAC addresses,
//! SMBIOS serial or firmware UUID of the source (`vm-target.go`). Our labels go on through
//! `spec.patches` (JSON patches applied to the new VM), replacing the source's `kubevm.io/vm`
//! wherever the source carries it (VM, pod template, DataVolume templates).

use serde_json::{Value, json};

use super::{CloneRequest, our_labels};
use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::Result;
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};

/// KubeVirt's VirtualMachineClone.
pub const CLONE: Kind = Kind {
    group: "clone.kubevirt.io",
    version: "v1beta1",
    kind: "VirtualMachineClone",
    plural: "virtualmachineclones",
    namespaced: true,
};

/// The clone object's name for a new VM `target`.
pub fn clone_name(target: &str) -> String {
    format!("clone-{target}")
}

/// `~` and `/` escaped for a JSON pointer (RFC 6901).
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// JSON patches (as strings, the CRD's `spec.patches`) that make the new VM ours.
pub fn label_patches(source: &Value, target: &str) -> Vec<String> {
    let mut ops = Vec::new();
    match source
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
    {
        Some(_) => {
            for (k, v) in [(VM_LABEL, target), (MANAGED_BY_LABEL, MANAGED_BY)] {
                ops.push(json!({"op": "add", "path": format!("/metadata/labels/{}", escape(k)), "value": v}));
            }
        }
        None => {
            ops.push(json!({"op": "add", "path": "/metadata/labels", "value": our_labels(target)}))
        }
    }
    let mut replace_at = |base: String, labels: Option<&Value>| {
        if labels.and_then(|l| l.get(VM_LABEL)).is_some() {
            ops.push(json!({"op": "replace", "path": format!("{base}/{}", escape(VM_LABEL)), "value": target}));
        }
    };
    replace_at(
        "/spec/template/metadata/labels".into(),
        source.pointer("/spec/template/metadata/labels"),
    );
    for (i, t) in source
        .pointer("/spec/dataVolumeTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        replace_at(
            format!("/spec/dataVolumeTemplates/{i}/metadata/labels"),
            t.pointer("/metadata/labels"),
        );
    }
    ops.iter().map(Value::to_string).collect()
}

/// The VirtualMachineClone for `request`.
pub fn clone_object(request: &CloneRequest, source: &Value) -> Value {
    json!({
        "apiVersion": CLONE.api_version(),
        "kind": CLONE.kind,
        "metadata": {
            "name": clone_name(&request.target),
            "namespace": request.source.namespace,
            "labels": our_labels(&request.target),
        },
        "spec": {
            "source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": request.source.name},
            "target": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": request.target},
            "volumeNamePolicy": "PrefixTargetName",
            "patches": label_patches(source, &request.target),
        },
    })
}

/// `(phase, detail, end)` of a VirtualMachineClone: `end` is set once it succeeded or failed.
pub fn progress(
    clone: &Value,
) -> (
    String,
    Option<String>,
    Option<std::result::Result<(), String>>,
) {
    let phase = clone
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    let reason = |t: &str| {
        clone
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| c["type"] == t)
            .and_then(|c| c["reason"].as_str())
            .map(str::to_owned)
    };
    let ready = reason("Ready").filter(|r| r != "Still processing" && r != "Ready");
    let name = clone["metadata"]["name"].as_str().unwrap_or_default();
    match phase {
        "Succeeded" => (phase.into(), None, Some(Ok(()))),
        "Failed" => (
            phase.into(),
            ready.clone(),
            Some(Err(format!(
                "virtualmachineclone {name:?} failed: {}",
                ready.unwrap_or_else(|| "no reason given".into())
            ))),
        ),
        // No phase yet: pending (clone.go: the source does not exist, or its volumes cannot be
        // snapshotted), with the reason in the Ready condition.
        "" => match ready {
            Some(r) => ("Pending".into(), Some(r), None),
            None => (String::new(), None, None),
        },
        _ => (phase.into(), ready, None),
    }
}

/// After success: the new VM's claims (it was labelled at creation through the patches).
pub async fn adopt(cluster: &Cluster, request: &CloneRequest) -> Result<Vec<String>> {
    let vm = crate::lifecycle::get_vm(
        cluster,
        crate::flavor::Flavor::KubeVirt,
        &request.target_ref(),
    )
    .await?;
    Ok(vm
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            v.pointer("/dataVolume/name")
                .or_else(|| v.pointer("/persistentVolumeClaim/claimName"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect())
}
