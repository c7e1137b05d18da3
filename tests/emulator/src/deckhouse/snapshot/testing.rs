//! What the snapshot tests share: a Deckhouse emulator with snapshot storage, a settled VM
//! `web` with disk `web-root`, and readers of what the controllers made.

use serde_json::{Value, json};

use super::{DH, READY, VM_SNAPSHOTS, text};
use crate::core::app::App;
use crate::core::controllers::reconcile_all;
use crate::core::store::Key;

pub(super) fn app() -> App {
    let app = App::new(
        crate::core::registry::Registry::new(crate::ServeFlavor::Deckhouse),
        std::time::Duration::from_secs(1),
    );
    crate::kubevirt::vm_snapshot::snapshot_storage(&app);
    app
}

pub(super) fn ticks(app: &App, n: usize) {
    for _ in 0..n {
        reconcile_all(app, true);
    }
}

pub(super) fn get(app: &App, plural: &str, name: &str) -> Option<Value> {
    let group = if plural == "secrets" || plural == "persistentvolumeclaims" {
        ""
    } else {
        DH
    };
    app.store.get(&Key::new(group, plural, "default", name))
}

/// VM `web` (runPolicy `policy`) with the disk `web-root`, settled.
pub(super) fn vm(app: &App, policy: &str) {
    app.store
        .create(
            DH,
            "virtualdisks",
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualDisk", "metadata": {"name": "web-root", "namespace": "default"},
            "spec": {"persistentVolumeClaim": {"size": "1Mi"}}}),
        )
        .unwrap();
    app.store
        .create(DH, "virtualmachines", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualMachine", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"runPolicy": policy, "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "web-root"}]}}))
        .unwrap();
    ticks(app, 4);
}

pub(super) fn snapshot(app: &App, name: &str, vm: &str) -> Value {
    app.store
        .create(DH, VM_SNAPSHOTS, json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
            "kind": "VirtualMachineSnapshot", "metadata": {"name": name, "namespace": "default"},
            "spec": {"virtualMachineName": vm, "requiredConsistency": true, "keepIPAddress": "Never"}}))
        .unwrap()
}

pub(super) fn claim(app: &App) -> String {
    text(
        &get(app, "virtualdisks", "web-root").unwrap(),
        "/status/target/persistentVolumeClaimName",
    )
    .to_string()
}

pub(super) fn data(app: &App, pvc: &str) -> Vec<u8> {
    std::fs::read(crate::kubevirt::upload::uploaded_file(app, "default", pvc).unwrap()).unwrap()
}

pub(super) fn ready(obj: &Value) -> (String, String, String) {
    let c = obj["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == READY).cloned())
        .unwrap_or_default();
    (
        text(obj, "/status/phase").into(),
        text(&c, "/reason").into(),
        text(&c, "/message").into(),
    )
}
