//! What the emulated CDI and Deckhouse disk controllers ask of storage:
//!
//! - WaitForFirstConsumer binding. A StorageClass with `volumeBindingMode:
//!   WaitForFirstConsumer` binds a claim only once a pod uses it. CDI (honorWaitForFirstConsumer,
//!   on by default; populators since v1.57) then leaves the DataVolume in `PendingPopulation`
//!   until a consumer exists (KubeVirt's virt-controller makes one when the VM is to run);
//!   Deckhouse puts the VirtualDisk in phase `WaitForFirstConsumer` (deckhouse FACTS: VD phases).
//! - Import failures. The annotation [`IMPORT_ERROR_ANNOTATION`] (an emulator-only switch), or
//!   an HTTP source whose host is under `.invalid`, makes a disk's import fail: CDI restarts the importer pod again
//!   and again, so the DataVolume stays `ImportInProgress` with `status.restartCount` growing and
//!   a `Running` condition `False`, reason `Error` (CDI `pkg/controller/import-controller.go`,
//!   `updateDvStatusFromPod`); a Deckhouse VirtualDisk goes to phase `Failed` with condition
//!   `Ready` `False`, reason `ProvisioningFailed`.

use serde_json::Value;

use crate::core::app::App;
use crate::core::store::Key;
use crate::core::util::meta_str;

/// Annotation that makes a disk import fail (value: the importer's error message).
pub const IMPORT_ERROR_ANNOTATION: &str = "emulator.kubevm.io/import-error";

/// The import error a disk fails with, if any: the annotation's message, or for an HTTP
/// source on the reserved `.invalid` top-level domain (RFC 2606: it never resolves) the
/// error CDI's importer reports for a name that does not resolve.
pub fn import_error(disk: &Value) -> Option<String> {
    if let Some(message) = disk
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(IMPORT_ERROR_ANNOTATION))
        .and_then(Value::as_str)
    {
        return Some(message.to_owned());
    }
    let url = ["/spec/source/http/url", "/spec/dataSource/http/url"]
        .iter()
        .find_map(|p| disk.pointer(p).and_then(Value::as_str))?;
    let host = url.split("://").nth(1)?.split(['/', ':']).next()?;
    host.ends_with(".invalid").then(|| {
        format!(
            "Unable to connect to http data source: Get \"{url}\": dial tcp: lookup {host}: no such host"
        )
    })
}

/// Whether claims of `class` (or of the default class when `None`) wait for their first
/// consumer before binding.
pub fn waits_for_first_consumer(app: &App, class: Option<&str>) -> bool {
    let (classes, _) = app.store.list("storage.k8s.io", "storageclasses", None);
    let chosen = match class {
        Some(name) => classes.into_iter().find(|c| meta_str(c, "name") == name),
        None => classes.into_iter().find(|c| {
            c.pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class")
                .and_then(Value::as_str)
                == Some("true")
        }),
    };
    chosen.is_some_and(|c| {
        c.get("volumeBindingMode").and_then(Value::as_str) == Some("WaitForFirstConsumer")
    })
}

/// Whether a KubeVirt VM that is to run uses DataVolume `dv` (a template of it or a volume).
pub fn kubevirt_consumer(app: &App, dv: &Value) -> bool {
    let ns = meta_str(dv, "namespace");
    let name = meta_str(dv, "name");
    let (vms, _) = app.store.list("kubevirt.io", "virtualmachines", Some(ns));
    vms.iter().any(|vm| {
        let vmi = app
            .store
            .get(&Key::new(
                "kubevirt.io",
                "virtualmachineinstances",
                ns,
                meta_str(vm, "name"),
            ))
            .is_some();
        let uses = vm
            .pointer("/spec/template/spec/volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|v| v.pointer("/dataVolume/name").and_then(Value::as_str) == Some(name));
        uses && crate::core::controllers::kubevirt_should_run(vm, vmi)
    })
}

/// Whether a Deckhouse VM that is to run uses VirtualDisk `vd`.
pub fn deckhouse_consumer(app: &App, vd: &Value) -> bool {
    let ns = meta_str(vd, "namespace");
    let name = meta_str(vd, "name");
    let (vms, _) = app
        .store
        .list("virtualization.deckhouse.io", "virtualmachines", Some(ns));
    vms.iter().any(|vm| {
        let uses = vm
            .pointer("/spec/blockDeviceRefs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|r| r["kind"] == "VirtualDisk" && r["name"] == name);
        let policy = vm
            .pointer("/spec/runPolicy")
            .and_then(Value::as_str)
            .unwrap_or("AlwaysOnUnlessStoppedManually");
        uses && matches!(policy, "AlwaysOn" | "AlwaysOnUnlessStoppedManually")
    }) || {
        // A hotplug attachment (VMBDA) consumes the disk too.
        let (bdas, _) = app.store.list(
            "virtualization.deckhouse.io",
            "virtualmachineblockdeviceattachments",
            Some(ns),
        );
        bdas.iter().any(|b| {
            b.pointer("/spec/blockDeviceRef/kind") == Some(&serde_json::json!("VirtualDisk"))
                && b.pointer("/spec/blockDeviceRef/name")
                    .and_then(Value::as_str)
                    == Some(name)
        })
    }
}
