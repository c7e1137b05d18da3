//! Deckhouse's importer pods: while a VirtualDisk or VirtualImage imports from a URL or a
//! container image, the controller runs a `dvcr-importer` pod in the object's namespace.
//!
//! Facts from deckhouse/virtualization (images/virtualization-artifact/pkg/controller):
//! - name `d8v-<vd|vi>-importer-<uid of the disk/image>` (supplements/generator.go
//!   `tplImporterPod`); releases before it used `<vd|vi>-importer-<name>` (`LegacyImporterPod`,
//!   the `vd-importer-*` the docs name);
//! - labels `heritage: deckhouse`, `app: dvcr-data-importer`,
//!   `resource-quota-overrides.deckhouse.io/ignore: "true"`, annotation
//!   `internal.virtualization.deckhouse.io/storage.createdByController: "yes"`, a controller
//!   owner reference to the disk/image (importer/importer_pod.go `makeImporterPodSpec`,
//!   service/importer_service.go `Start`: `metav1.NewControllerRef`);
//! - one container `d8v-dvcr-importer` running `/usr/local/bin/dvcr-importer`, restart policy
//!   OnFailure (common/consts.go, importer_pod.go);
//! - the pod is deleted once the disk is ready (vd/internal/source/step/clean_up_importer_step.go).
//!
//! Here the pod runs while the import does, logs what it imports, and when the import fails
//! (see [`crate::core::storage::import_error`]) its container keeps failing and restarting with the
//! error in its log, as the real importer's does; the kubelet's events are recorded.

use super::owner_ref;
use crate::core::app::App;
use crate::core::store::{Key, Propagation};
use crate::core::util::{meta_str, now_rfc3339};
use serde_json::{Value, json};

/// The importer's container name.
pub const CONTAINER: &str = "d8v-dvcr-importer";

/// The importer pod name of a VirtualDisk (`prefix` "vd") or VirtualImage ("vi").
pub fn pod_name(prefix: &str, owner: &Value) -> String {
    format!("d8v-{prefix}-importer-{}", meta_str(owner, "uid"))
}

/// What the importer fetches, if it imports at all (HTTP and container image sources).
fn source(owner: &Value) -> Option<String> {
    let ds = owner.pointer("/spec/dataSource")?;
    match ds["type"].as_str()? {
        "HTTP" => ds["http"]["url"].as_str().map(str::to_owned),
        "ContainerImage" => ds["containerImage"]["image"].as_str().map(str::to_owned),
        _ => None,
    }
}

/// The pod runs (or fails with `failure`) while `owner` imports.
pub fn ensure(app: &App, prefix: &str, owner: &Value, failure: Option<&str>) {
    let Some(source) = source(owner) else {
        return;
    };
    let ns = meta_str(owner, "namespace");
    let name = pod_name(prefix, owner);
    let key = Key::new("", "pods", ns, &name);
    let start = format!("{} importing {source}", now_rfc3339());
    let log = match failure {
        Some(error) => format!("{start}\n{} import failed: {error}\n", now_rfc3339()),
        None => format!("{start}\n"),
    };
    let status = |restarts: i64| match failure {
        Some(error) => json!({
            "phase": "Running",
            "containerStatuses": [{
                "name": CONTAINER, "ready": false, "restartCount": restarts,
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                    "message": format!("back-off restarting failed container {CONTAINER}")}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": error}},
            }],
        }),
        None => json!({
            "phase": "Running",
            "containerStatuses": [{"name": CONTAINER, "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": now_rfc3339()}}}],
        }),
    };
    let log_key = format!("emulator.kubevm.io/log.{CONTAINER}");
    if let Some(pod) = app.store.get(&key) {
        let failing = pod["status"]["containerStatuses"][0]["state"]["waiting"].is_object();
        if failure.is_some() && !failing {
            app.store.modify(&key, |p| {
                p["metadata"]["annotations"][&log_key] = json!(log);
                p["status"] = status(1);
            });
            back_off(app, ns, &name);
        }
        return;
    }
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": {"heritage": "deckhouse", "app": "dvcr-data-importer",
                       "resource-quota-overrides.deckhouse.io/ignore": "true"},
            "annotations": {"internal.virtualization.deckhouse.io/storage.createdByController": "yes",
                            log_key: log},
            "ownerReferences": [owner_ref(owner)],
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "nodeName": "node-1",
            "containers": [{"name": CONTAINER, "image": "dvcr-importer",
                            "command": ["/usr/local/bin/dvcr-importer"]}],
        },
        "status": status(if failure.is_some() { 1 } else { 0 }),
    });
    if app.store.create("", "pods", pod).is_ok() {
        event(
            app,
            ns,
            &name,
            "Normal",
            "Started",
            &format!("Started container {CONTAINER}"),
        );
        if failure.is_some() {
            back_off(app, ns, &name);
        }
    }
}

/// The kubelet's event for a container that keeps failing.
fn back_off(app: &App, ns: &str, pod: &str) {
    event(
        app,
        ns,
        pod,
        "Warning",
        "BackOff",
        &format!("Back-off restarting failed container {CONTAINER} in pod {pod}"),
    );
}

/// The import is over: the controller deletes its pod.
pub fn remove(app: &App, prefix: &str, owner: &Value) {
    let key = Key::new(
        "",
        "pods",
        meta_str(owner, "namespace"),
        &pod_name(prefix, owner),
    );
    if app.store.get(&key).is_some() {
        app.store.delete(&key, Propagation::Cascade);
    }
}

/// An event about the pod, as the kubelet records it.
fn event(app: &App, ns: &str, pod: &str, type_: &str, reason: &str, message: &str) {
    let now = now_rfc3339();
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{pod}.{}", crate::core::util::random_suffix(16)), "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": ns},
        "type": type_, "reason": reason, "message": message,
        "source": {"component": "kubelet", "host": "node-1"},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    let _ = app.store.create("", "events", event);
}
