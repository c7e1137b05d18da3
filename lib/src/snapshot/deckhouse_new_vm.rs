//! Deckhouse: `restore SNAPSHOT --new-vm NEW`, a VirtualMachineSnapshotOperation
//! `type: CreateVirtualMachine` (deckhouse/virtualization `crds/
//! virtualmachinesnapshotoperations.yaml`, `pkg/controller/vmsop/internal/handler/lifecycle.go`,
//! `internal/operation/create_virtual_machine.go`: the clone restorer run on the snapshot's VM).
//! Names as `clone` gives them (`createVirtualMachine.nameReplacement`): the VM becomes NEW and
//! each disk `OLD-x` becomes `NEW-x`; the disks are made from the snapshot's VirtualDiskSnapshots
//! and owned by NEW. A taken name is refused here before anything is made (the platform would
//! fail the operation too). Afterwards NEW and its disks are labelled as ours and the operation
//! is owned by NEW, so `delete NEW` removes it; the source VM and the snapshot are not touched.

use serde_json::{Value, json};

use super::kubevirt::{create_obj, get, get_opt};
use super::{DryRun, Event, Options, Outcome, text};
use crate::api::{DECKHOUSE_VM, Kind, VIRTUAL_DISK};
use crate::clone::{deckhouse::new_name, label, our_labels};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::lifecycle::watch::{self, Watched};

/// Deckhouse's VirtualMachineSnapshotOperation.
pub const VMSOP: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualMachineSnapshotOperation",
    plural: "virtualmachinesnapshotoperations",
    namespaced: true,
};

/// The operation making `target` from snapshot `snap` of VM `source` with `disks` renamed
/// (`(old, new)`), labelled as ours for `target`.
pub fn operation_object(
    ns: &str,
    snap: &str,
    source: &str,
    target: &str,
    disks: &[(String, String)],
    dry_run: bool,
) -> Value {
    let mut rules = vec![json!({"from": {"kind": "VirtualMachine", "name": source}, "to": target})];
    for (old, new) in disks {
        rules.push(json!({"from": {"kind": "VirtualDisk", "name": old}, "to": new}));
    }
    json!({
        "apiVersion": VMSOP.api_version(), "kind": VMSOP.kind,
        "metadata": {"generateName": format!("{snap}-new-vm-"), "namespace": ns,
            "labels": our_labels(target)},
        "spec": {
            "type": "CreateVirtualMachine",
            "virtualMachineSnapshotName": snap,
            "createVirtualMachine": {
                "mode": if dry_run { "DryRun" } else { "Strict" },
                "nameReplacement": rules,
            },
        },
    })
}

/// Refuses a taken name (nothing made yet).
async fn ensure_free(cluster: &Cluster, kind: Kind, ns: &str, name: &str) -> Result<()> {
    if get_opt(cluster, kind, ns, name).await?.is_some() {
        return Err(Error::NotOurs(format!(
            "{} {name:?} already exists in namespace {ns:?}; nothing was created (choose another name for --new-vm)",
            kind.kind.to_ascii_lowercase()
        )));
    }
    Ok(())
}

/// Restore snapshot `snap` (Ready, already read) as a new VM `target`.
pub async fn restore(
    cluster: &Cluster,
    ns: &str,
    snap: &Value,
    target: &str,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let snap_name = text(snap, "/metadata/name").to_owned();
    let source = text(snap, "/spec/virtualMachineName").to_owned();
    let mut disks = vec![];
    for vds in snap
        .pointer("/status/virtualDiskSnapshotNames")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let vds = get(cluster, super::deckhouse::VD_SNAPSHOT, ns, vds).await?;
        let disk = text(&vds, "/spec/virtualDiskName").to_owned();
        let new = new_name(&source, target, &disk);
        disks.push((disk, new));
    }
    ensure_free(cluster, DECKHOUSE_VM, ns, target).await?;
    for (_, new) in &disks {
        ensure_free(cluster, VIRTUAL_DISK, ns, new).await?;
    }
    let obj = operation_object(ns, &snap_name, &source, target, &disks, false);
    let mut outcome = Outcome {
        snapshot: snap_name.clone(),
        vm: format!("{target}.{ns}"),
        object_ref: VMSOP.object_ref(&format!("{snap_name}-new-vm-")),
        object: Some(obj.clone()),
        waited: false,
        no_agent: false,
        restarted: false,
    };
    match options.dry_run {
        DryRun::Client => return Ok(outcome),
        DryRun::Server => {
            outcome.object = Some(create_obj(cluster, VMSOP, ns, &obj, true).await?);
            return Ok(outcome);
        }
        DryRun::None => {}
    }
    let made = create_obj(cluster, VMSOP, ns, &obj, false).await?;
    let op_name = text(&made, "/metadata/name").to_owned();
    outcome.object_ref = VMSOP.object_ref(&op_name);
    outcome.object = Some(made);
    on_event(Event::Created(format!(
        "virtualmachinesnapshotoperation/{op_name}"
    )));
    if !options.wait {
        return Ok(outcome);
    }
    let mut last = String::new();
    let done = watch::until(cluster, &[Watched::new(VMSOP, ns, &op_name)], |objs| {
        let Some(op) = &objs[0] else {
            return Some(Err(Error::Platform(format!(
                "virtualmachinesnapshotoperation {op_name} was deleted while restoring"
            ))));
        };
        let (phase, reason, end) = crate::clone::deckhouse::progress(op);
        let now = format!("{phase}\n{}", reason.clone().unwrap_or_default());
        if !phase.is_empty() && now != last {
            last = now;
            on_event(Event::Phase {
                phase,
                message: reason.unwrap_or_default(),
            });
        }
        match end? {
            Ok(()) => Some(Ok(op.clone())),
            Err(why) => Some(Err(Error::Stuck(format!(
                "restore of {snap_name} as {target}.{ns} failed: {why}"
            )))),
        }
    })
    .await?;
    adopt(cluster, ns, target, &op_name, &disks).await?;
    outcome.object = Some(done);
    outcome.waited = true;
    Ok(outcome)
}

/// Labels the new VM and its disks as ours and makes it the owner of the operation.
async fn adopt(
    cluster: &Cluster,
    ns: &str,
    target: &str,
    op_name: &str,
    disks: &[(String, String)],
) -> Result<()> {
    label(cluster, &DECKHOUSE_VM, ns, target, our_labels(target)).await?;
    for (_, disk) in disks {
        label(cluster, &VIRTUAL_DISK, ns, disk, our_labels(target)).await?;
    }
    let vm = get(cluster, DECKHOUSE_VM, ns, target).await?;
    let owner = json!({
        "apiVersion": DECKHOUSE_VM.api_version(), "kind": "VirtualMachine",
        "name": target, "uid": vm.pointer("/metadata/uid").cloned().unwrap_or_default(),
    });
    crate::clone::deckhouse::add_owner(cluster, &VMSOP, ns, op_name, &owner).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operation_renames_the_vm_and_its_disks_and_is_ours() {
        let disks = [("web-root".to_owned(), new_name("web", "copy", "web-root"))];
        let op = operation_object("ns", "s1", "web", "copy", &disks, false);
        assert_eq!(op["spec"]["type"], "CreateVirtualMachine");
        assert_eq!(op["spec"]["virtualMachineSnapshotName"], "s1");
        let spec = &op["spec"]["createVirtualMachine"];
        assert_eq!(spec["mode"], "Strict");
        assert_eq!(
            spec["nameReplacement"],
            json!([{"from": {"kind": "VirtualMachine", "name": "web"}, "to": "copy"},
                {"from": {"kind": "VirtualDisk", "name": "web-root"}, "to": "copy-root"}])
        );
        assert!(super::super::kubevirt::is_ours(&op));
    }
}
