//! Importer pods: while a disk or image imports from a URL or a registry, the platform's
//! controller runs an importer pod in the object's namespace. Both platforms are modelled.
//!
//! Deckhouse, from deckhouse/virtualization (images/virtualization-artifact/pkg/controller):
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
//! CDI (a KubeVirt DataVolume from `http` or `registry`), from kubevirt/containerized-data-importer
//! `pkg/controller/import-controller.go` (`createImporterPod`, `makeImporterPodSpec`):
//! - name `importer-<PVC name>` (the PVC's `cdi.kubevirt.io/storage.import.importPodName`,
//!   `naming.GetResourceName(common.ImporterPodName, pvc.Name)`), in the PVC's namespace;
//! - labels `app: containerized-data-importer`, `cdi.kubevirt.io: importer`,
//!   `prometheus.cdi.kubevirt.io: ""`, annotation `cdi.kubevirt.io/storage.createdBy: "yes"`,
//!   a controller owner reference to the PVC;
//! - one container `importer`, restart policy OnFailure;
//! - deleted when the import succeeds (the controller's `cleanup`, unless the PVC asks to
//!   retain it with `cdi.kubevirt.io/storage.pod.retainAfterCompletion`).
//!
//! Here the pod runs while the import does, logs what it imports, and when the import fails
//! (see [`crate::core::storage::import_error`]) its container keeps failing and restarting with the
//! error in its log, as the real importer's does; the kubelet's events are recorded.

use super::owner_ref;
use crate::core::app::App;
use crate::core::store::{Key, Propagation};
use crate::core::util::{meta_str, now_rfc3339};
use serde_json::{Value, json};

/// The Deckhouse importer's container name.
pub const CONTAINER: &str = "d8v-dvcr-importer";

/// The CDI importer's container name (`common.ImporterPodName`).
pub const CDI_CONTAINER: &str = "importer";

/// Where a ClusterVirtualImage's importer runs: the module's namespace (deckhouse/virtualization
/// docs list `d8v-cvi-importer-*` among the module's own components; its audit rules skip
/// `cvi-importer` pods in `d8-virtualization`).
pub const CVI_NAMESPACE: &str = "d8-virtualization";

/// The namespace of the importer of `owner` (`prefix` "cvi" for a ClusterVirtualImage).
fn pod_namespace<'a>(prefix: &str, owner: &'a Value) -> &'a str {
    if prefix == "cvi" {
        CVI_NAMESPACE
    } else {
        meta_str(owner, "namespace")
    }
}

/// The importer pod name of a VirtualDisk (`prefix` "vd"), VirtualImage ("vi") or
/// ClusterVirtualImage ("cvi").
pub fn pod_name(prefix: &str, owner: &Value) -> String {
    format!("d8v-{prefix}-importer-{}", meta_str(owner, "uid"))
}

/// The CDI importer pod name of the PVC named `pvc`.
pub fn cdi_pod_name(pvc: &str) -> String {
    format!("importer-{pvc}")
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

/// What a CDI DataVolume's importer fetches (`http` and `registry` sources).
fn cdi_source(dv: &Value) -> Option<String> {
    ["/spec/source/http/url", "/spec/source/registry/url"]
        .iter()
        .find_map(|p| dv.pointer(p).and_then(Value::as_str))
        .map(str::to_owned)
}

/// One platform's importer pod: what differs between Deckhouse and CDI.
struct PodShape {
    name: String,
    namespace: String,
    labels: Value,
    annotations: Value,
    owner: Value,
    container: &'static str,
    image: &'static str,
    command: Value,
}

/// The pod runs (or fails with `failure`) while `owner` imports.
pub fn ensure(app: &App, prefix: &str, owner: &Value, failure: Option<&str>) {
    let Some(source) = source(owner) else {
        return;
    };
    let shape = PodShape {
        name: pod_name(prefix, owner),
        namespace: pod_namespace(prefix, owner).to_owned(),
        labels: json!({"heritage": "deckhouse", "app": "dvcr-data-importer",
                       "resource-quota-overrides.deckhouse.io/ignore": "true"}),
        annotations: json!({"internal.virtualization.deckhouse.io/storage.createdByController": "yes"}),
        owner: owner_ref(owner),
        container: CONTAINER,
        image: "dvcr-importer",
        command: json!(["/usr/local/bin/dvcr-importer"]),
    };
    run(app, shape, &source, failure);
}

/// The CDI importer of DataVolume `dv` runs (or fails with `failure`) while it imports; it is
/// owned by the DataVolume's PVC, which must exist.
pub fn ensure_cdi(app: &App, dv: &Value, failure: Option<&str>) {
    let Some(source) = cdi_source(dv) else {
        return;
    };
    let ns = meta_str(dv, "namespace");
    let Some(pvc) = app.store.get(&Key::new(
        "",
        "persistentvolumeclaims",
        ns,
        meta_str(dv, "name"),
    )) else {
        return;
    };
    let shape = PodShape {
        name: cdi_pod_name(meta_str(&pvc, "name")),
        namespace: ns.to_owned(),
        labels: json!({"app": "containerized-data-importer", "cdi.kubevirt.io": "importer",
                       "prometheus.cdi.kubevirt.io": ""}),
        annotations: json!({"cdi.kubevirt.io/storage.createdBy": "yes"}),
        owner: json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "name": meta_str(&pvc, "name"), "uid": meta_str(&pvc, "uid"),
            "controller": true, "blockOwnerDeletion": true}),
        container: CDI_CONTAINER,
        image: "cdi-importer",
        command: json!(["/usr/bin/cdi-importer"]),
    };
    run(app, shape, &source, failure);
}

/// Creates the pod `shape` describes, importing `source`, or marks its container failing.
fn run(app: &App, shape: PodShape, source: &str, failure: Option<&str>) {
    let container = shape.container;
    let (ns, name) = (shape.namespace.as_str(), shape.name.as_str());
    let key = Key::new("", "pods", ns, name);
    let start = format!("{} importing {source}", now_rfc3339());
    let log = match failure {
        Some(error) => format!("{start}\n{} import failed: {error}\n", now_rfc3339()),
        None => format!("{start}\n"),
    };
    let status = |restarts: i64| match failure {
        Some(error) => json!({
            "phase": "Running",
            "containerStatuses": [{
                "name": container, "ready": false, "restartCount": restarts,
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                    "message": format!("back-off restarting failed container {container}")}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": error}},
            }],
        }),
        None => json!({
            "phase": "Running",
            "containerStatuses": [{"name": container, "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": now_rfc3339()}}}],
        }),
    };
    let log_key = format!("emulator.kubevm.io/log.{container}");
    if let Some(pod) = app.store.get(&key) {
        let failing = pod["status"]["containerStatuses"][0]["state"]["waiting"].is_object();
        if failure.is_some() && !failing {
            app.store.modify(&key, |p| {
                p["metadata"]["annotations"][&log_key] = json!(log);
                p["status"] = status(1);
            });
            back_off(app, ns, name, container);
        }
        return;
    }
    let mut annotations = shape.annotations.clone();
    annotations[&log_key] = json!(log);
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": shape.labels,
            "annotations": annotations,
            "ownerReferences": [shape.owner],
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "nodeName": "node-1",
            "containers": [{"name": container, "image": shape.image,
                            "command": shape.command}],
        },
        "status": status(if failure.is_some() { 1 } else { 0 }),
    });
    if app.store.create("", "pods", pod).is_ok() {
        event(
            app,
            ns,
            name,
            "Normal",
            "Started",
            &format!("Started container {container}"),
        );
        if failure.is_some() {
            back_off(app, ns, name, container);
        }
    }
}

/// The kubelet's event for a container that keeps failing.
fn back_off(app: &App, ns: &str, pod: &str, container: &str) {
    event(
        app,
        ns,
        pod,
        "Warning",
        "BackOff",
        &format!("Back-off restarting failed container {container} in pod {pod}"),
    );
}

/// The import is over: the controller deletes its pod.
pub fn remove(app: &App, prefix: &str, owner: &Value) {
    delete(app, pod_namespace(prefix, owner), &pod_name(prefix, owner));
}

/// The DataVolume `dv` imported: CDI deletes its importer (unless the PVC asks to keep it).
pub fn remove_cdi(app: &App, dv: &Value) {
    let ns = meta_str(dv, "namespace");
    let pvc = app.store.get(&Key::new(
        "",
        "persistentvolumeclaims",
        ns,
        meta_str(dv, "name"),
    ));
    let retain = pvc.is_some_and(|p| {
        p.pointer("/metadata/annotations/cdi.kubevirt.io~1storage.pod.retainAfterCompletion")
            .and_then(Value::as_str)
            == Some("true")
    });
    if !retain {
        delete(app, ns, &cdi_pod_name(meta_str(dv, "name")));
    }
}

fn delete(app: &App, ns: &str, name: &str) {
    let key = Key::new("", "pods", ns, name);
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
