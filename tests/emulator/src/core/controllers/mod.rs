//! Minimal controllers: one background task that reacts to store changes (and ticks every
//! `import_step` for progress) and runs small, idempotent reconcilers. Objects a fixture or a
//! test wrote directly are "settled" (see `App::settle`) and left alone until their generation
//! changes, so hand-written states stay as written.
//!
//! Reconcilers by platform: `kubevirt` (VirtualMachine → DataVolumes, VMI, launcher pod), `pool`
//! (VirtualMachinePool → replica VMs), `cdi`
//! (DataVolume imports), `deckhouse` (VirtualDisk, images, classes, VirtualMachine); VMI phases,
//! migrations and operations live in `lifecycle/`, exports in `export.rs`.
//!
//! Add a reconciler: write `fn reconcile_x(app, obj, tick)` and list it in [`RECONCILERS`].

mod cdi;
pub mod cron_schedule;
pub(crate) mod deckhouse;
pub(crate) mod import_cron;
pub mod importer;
mod kubevirt;
mod pool;

pub(crate) use kubevirt::{kubevirt_should_run, launcher_pod, new_vmi};

use crate::core::app::App;
use crate::core::store::Key;
use crate::core::util::{meta_str, now_rfc3339};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::{broadcast, watch};

/// A reconciler for one kind: `(app, object, tick)`; `tick` is true on the progress timer.
type Reconciler = fn(&App, &Value, bool);

/// Which reconciler runs for which `(group, plural)`.
const RECONCILERS: &[(&str, &str, Reconciler)] = &[
    ("kubevirt.io", "virtualmachines", kubevirt::kubevirt_vm),
    (
        "pool.kubevirt.io",
        "virtualmachinepools",
        pool::kubevirt_pool,
    ),
    // VM clones (clone.rs); Deckhouse's run as operations (lifecycle/).
    (
        crate::kubevirt::clone::CLONE_GROUP,
        "virtualmachineclones",
        crate::kubevirt::clone::kubevirt_clone,
    ),
    // Lifecycle (lifecycle/): VMI phases, migrations, Deckhouse operations.
    (
        "kubevirt.io",
        "virtualmachineinstances",
        crate::core::lifecycle::kubevirt_vmi,
    ),
    (
        "kubevirt.io",
        "virtualmachineinstancemigrations",
        crate::core::lifecycle::migration,
    ),
    (
        "virtualization.deckhouse.io",
        "virtualmachineoperations",
        crate::core::lifecycle::vmop,
    ),
    ("cdi.kubevirt.io", "datavolumes", cdi::data_volume),
    ("cdi.kubevirt.io", "datasources", cdi::data_source),
    (
        "cdi.kubevirt.io",
        "dataimportcrons",
        import_cron::data_import_cron,
    ),
    // KubeVirt snapshots and restores (vm_snapshot.rs).
    (
        crate::kubevirt::export_snapshot::SNAPSHOT_GROUP,
        crate::kubevirt::vm_snapshot::SNAPSHOTS,
        crate::kubevirt::vm_snapshot::vm_snapshot,
    ),
    (
        crate::kubevirt::export_snapshot::SNAPSHOT_GROUP,
        crate::kubevirt::vm_snapshot::CONTENTS,
        crate::kubevirt::vm_snapshot::vm_snapshot_content,
    ),
    (
        crate::kubevirt::export_snapshot::SNAPSHOT_GROUP,
        crate::kubevirt::vm_snapshot::RESTORES,
        crate::kubevirt::vm_snapshot::vm_restore,
    ),
    // Deckhouse VM snapshots (dh_snapshot.rs); restores run as operations (lifecycle/).
    (
        "virtualization.deckhouse.io",
        crate::deckhouse::snapshot::VM_SNAPSHOTS,
        crate::deckhouse::snapshot::vm_snapshot,
    ),
    // Deckhouse VMs made from snapshots (dh_snapshot_op.rs).
    (
        "virtualization.deckhouse.io",
        crate::deckhouse::snapshot_op::VMSOPS,
        crate::deckhouse::snapshot_op::vmsop,
    ),
    // The volume resizer (expansion.rs): claims asking for more than they have.
    ("", "persistentvolumeclaims", crate::core::expansion::claim),
    (
        "virtualization.deckhouse.io",
        "virtualdisks",
        deckhouse::virtual_disk,
    ),
    (
        "virtualization.deckhouse.io",
        "virtualimages",
        deckhouse::virtual_image,
    ),
    (
        "virtualization.deckhouse.io",
        "clustervirtualimages",
        deckhouse::virtual_image,
    ),
    (
        "virtualization.deckhouse.io",
        "virtualmachineclasses",
        deckhouse::vm_class,
    ),
    (
        "virtualization.deckhouse.io",
        "virtualmachines",
        deckhouse::deckhouse_vm,
    ),
    (
        "virtualization.deckhouse.io",
        "virtualmachineblockdeviceattachments",
        deckhouse::vmbda,
    ),
    // Fixed addresses (network.rs).
    (
        "virtualization.deckhouse.io",
        "virtualmachineipaddresses",
        crate::kubevirt::network::vmip,
    ),
    // kube-controller-manager's EndpointSlice controller.
    ("", "services", crate::core::services::endpoint_slices),
    (
        crate::kubevirt::export::KV_EXPORT_GROUP,
        "virtualmachineexports",
        crate::kubevirt::export::kubevirt_export,
    ),
    (
        crate::kubevirt::export::SF_GROUP,
        "dataexports",
        crate::kubevirt::export::data_export,
    ),
];

/// Progress made per tick, in percent.
const STEP_PERCENT: f64 = 10.0;
/// The node every emulated VM lands on.
pub(crate) const NODE: &str = "node-1";

/// Runs the controllers until `shutdown` flips.
pub async fn run(app: Arc<App>, mut shutdown: watch::Receiver<bool>) {
    let mut rx = app.store.subscribe();
    let mut tick = tokio::time::interval(app.import_step);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tick.tick() => reconcile_all(&app, true),
            ev = rx.recv() => {
                if matches!(ev, Err(broadcast::error::RecvError::Closed)) {
                    break;
                }
                // Coalesce a burst of events into one pass.
                while rx.try_recv().is_ok() {}
                reconcile_all(&app, false);
            }
        }
    }
}

/// One pass over every object that has a reconciler.
pub fn reconcile_all(app: &App, tick: bool) {
    for (group, plural, reconcile) in RECONCILERS {
        if app.registry.find_plural(group, plural).is_none() {
            continue;
        }
        let (objs, _) = app.store.list(group, plural, None);
        for obj in objs.iter().filter(|o| !app.is_settled(o)) {
            reconcile(app, obj, tick);
        }
    }
    crate::kubevirt::evacuation::controller(app);
    crate::kubevirt::memory_dump::controller(app, tick);
}

pub(crate) fn owner_ref(obj: &Value) -> Value {
    json!({
        "apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true
    })
}

/// Whether an object has a controller owner already.
fn has_controller(obj: &Value) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r["controller"] == true))
}

#[cfg(test)]
fn owned_by(obj: &Value, owner: &Value) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == owner["metadata"]["uid"]))
}

/// Sets a condition, keeping `lastTransitionTime` when the status does not change.
pub(crate) fn set_condition(
    status: &mut Value,
    type_: &str,
    state: bool,
    reason: &str,
    message: &str,
) {
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let conds = status["conditions"].as_array_mut().expect("array");
    let state = if state { "True" } else { "False" };
    let existing = conds.iter().position(|c| c["type"] == type_);
    let since = match existing.map(|i| &conds[i]) {
        Some(c) if c["status"] == state => c["lastTransitionTime"].clone(),
        _ => json!(now_rfc3339()),
    };
    // Deckhouse CRDs require every condition field, message included.
    let c = json!({"type": type_, "status": state, "lastTransitionTime": since, "reason": reason, "message": message});
    match existing {
        Some(i) => conds[i] = c,
        None => conds.push(c),
    }
}

/// A stable pseudo-random byte pair from an object's uid (for IPs and MACs).
fn uid_bytes(obj: &Value) -> [u8; 4] {
    let hex: String = meta_str(obj, "uid")
        .chars()
        .filter(char::is_ascii_hexdigit)
        .collect();
    let b =
        |i: usize| u8::from_str_radix(hex.get(i * 2..i * 2 + 2).unwrap_or("07"), 16).unwrap_or(7);
    [b(0), b(1), b(2), b(3)]
}

/// The seed of an object's own pseudo-random addresses: its uid bytes.
pub(crate) fn uid_seed_of(obj: &Value) -> [u8; 4] {
    uid_bytes(obj)
}

/// The seed of the MACs of VMI `vmi`'s interfaces: its VM's (the VMI's owner's) uid bytes.
pub(crate) fn uid_seed(vmi: &Value) -> [u8; 4] {
    let owner = vmi
        .pointer("/metadata/ownerReferences/0/uid")
        .cloned()
        .unwrap_or(Value::Null);
    uid_bytes(&json!({"metadata": {"uid": owner}}))
}

fn key_of(group: &str, plural: &str, obj: &Value) -> Key {
    Key::of(group, plural, obj)
}

fn percent(progress: &Value) -> f64 {
    progress
        .as_str()
        .and_then(|p| p.trim_end_matches('%').parse().ok())
        .unwrap_or(0.0)
}

/// Creates a bound PVC owned by `owner` unless it exists.
/// The PVC `name` of `owner` (a DataVolume or disk), bound, made once.
pub(crate) fn ensure_pvc_for(
    app: &App,
    owner: &Value,
    name: &str,
    size: &str,
    class: Option<String>,
) {
    ensure_pvc(app, owner, name, size, class)
}

fn ensure_pvc(app: &App, owner: &Value, name: &str, size: &str, class: Option<String>) {
    let ns = meta_str(owner, "namespace");
    if app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, name))
        .is_some()
    {
        return;
    }
    let class = class.unwrap_or_else(|| "local-path".into());
    let pvc = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [owner_ref(owner)]},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}},
                 "storageClassName": class, "volumeMode": "Filesystem", "volumeName": format!("pvc-{}", meta_str(owner, "uid"))},
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}},
    });
    let _ = app.store.create("", "persistentvolumeclaims", pvc);
}
