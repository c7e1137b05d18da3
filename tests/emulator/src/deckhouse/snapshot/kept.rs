//! The Secret a VirtualMachineSnapshot keeps its VM (and the VM's provisioning Secret) in
//! (deckhouse/virtualization @ cf3a9e6c `pkg/controller/service/restorer/secret_restorer.go`,
//! `supplements/generator.go` `CommonSupplement`): Secret `d8v-vms-<name>-<uid>`, type
//! `virtualmachine.virtualization.deckhouse.io/snapshot`, key `vm`, and key `provisioner` when
//! the VM had a provisioning Secret.

use base64::Engine;
use serde_json::Value;

use super::text;
use crate::core::app::App;
use crate::core::store::Key;

/// An object as the snapshot's Secret keeps it: `secret_restorer.go` puts
/// `base64.StdEncoding.EncodeToString(json.Marshal(obj))` into `Secret.Data`, so the API shows
/// it base64-encoded twice.
pub(super) fn stored(obj: &Value) -> String {
    let b64 = &base64::engine::general_purpose::STANDARD;
    b64.encode(b64.encode(obj.to_string()))
}

/// The Secret `vm` takes its provisioning from (`setProvisioning`: `userDataRef` or
/// `sysprepRef` of kind Secret).
pub fn provisioning_secret(vm: &Value) -> Option<&str> {
    let p = vm.pointer("/spec/provisioning")?;
    p.get("userDataRef")
        .or_else(|| p.get("sysprepRef"))
        .filter(|r| r["kind"] == "Secret")
        .and_then(|r| r["name"].as_str())
}

/// Object `key` kept in the snapshot's Secret (`status.virtualMachineSnapshotSecretName`;
/// `secret_restorer.go` `get`: base64 of the JSON in `Data`).
fn kept(app: &App, ns: &str, snap: &Value, key: &str) -> Option<Value> {
    let secret = app.store.get(&Key::new(
        "",
        "secrets",
        ns,
        text(snap, "/status/virtualMachineSnapshotSecretName"),
    ))?;
    let b64 = &base64::engine::general_purpose::STANDARD;
    let data = b64
        .decode(secret.pointer(&format!("/data/{key}"))?.as_str()?)
        .ok()?;
    serde_json::from_slice(&b64.decode(data).ok()?).ok()
}

/// The snapshot's VM as kept in its Secret (key `vm`).
pub fn kept_vm(app: &App, ns: &str, snap: &Value) -> Option<Value> {
    kept(app, ns, snap, "vm")
}

/// The VM's provisioning Secret as the snapshot keeps it (key `provisioner`), if it had one.
pub fn kept_provisioner(app: &App, ns: &str, snap: &Value) -> Option<Value> {
    kept(app, ns, snap, "provisioner")
}
