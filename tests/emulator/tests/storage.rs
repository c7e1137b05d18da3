//! The emulated CDI and Deckhouse disk controllers against storage as the real ones see it:
//! WaitForFirstConsumer classes hold an import until a running VM uses the disk (CDI phase
//! `PendingPopulation`, Deckhouse `WaitForFirstConsumer`), and a failing import is retried with
//! a growing `restartCount` and a `Running` condition `False`/`Error` (CDI), or ends `Failed`
//! (Deckhouse). The fixtures' default class `local-path` is WaitForFirstConsumer.

use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kubevm_emulator::core::storage::IMPORT_ERROR_ANNOTATION;
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};

use crate::common;

fn api(
    client: &kube::Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(client.clone(), "default", &ar)
}

/// Poll `name` until `done` holds for it (10 s at most); returns the object.
async fn until(api: &Api<DynamicObject>, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let object = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
        if done(&object) {
            return object;
        }
        assert!(Instant::now() < deadline, "never reached: {object}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn data_volumes(client: &kube::Client) -> Api<DynamicObject> {
    api(
        client,
        "cdi.kubevirt.io",
        "v1beta1",
        "DataVolume",
        "datavolumes",
    )
}

/// Creates KubeVirt VM `vm` that is to run with DataVolume `dv` as its root disk (its consumer).
async fn run_kubevirt_vm_on(client: &kube::Client, dv: &str) {
    run_kubevirt_vm_named(client, "vm", dv).await
}

/// Creates a running KubeVirt VM `name` whose root disk is DataVolume `dv`.
async fn run_kubevirt_vm_named(client: &kube::Client, name: &str, dv: &str) {
    let vms = api(
        client,
        "kubevirt.io",
        "v1",
        "VirtualMachine",
        "virtualmachines",
    );
    common::create(
        &vms,
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "root", "dataVolume": {"name": dv}}]}}}}),
    )
    .await;
}

/// The condition of `type_` in an object's status.
fn condition(object: &Value, type_: &str) -> Value {
    object["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
        .clone()
}

fn http_dv(name: &str, annotations: Value) -> Value {
    json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"source": {"http": {"url": "https://images.example.org/d.qcow2"}},
                 "storage": {"resources": {"requests": {"storage": "1Gi"}}}}})
}

#[tokio::test]
async fn cdi_waits_for_a_consumer_on_wait_for_first_consumer_storage() {
    let (emu, client) = common::start_importing(ServeFlavor::KubeVirt, "kubevirt.yaml").await;
    let dvs = data_volumes(&client);
    common::create(&dvs, http_dv("disk", json!({}))).await;
    let phase = |v: &Value| v["status"]["phase"].as_str().unwrap_or("").to_owned();
    let dv = until(&dvs, "disk", |v| !phase(v).is_empty()).await;
    assert_eq!(phase(&dv), "PendingPopulation");
    // Meanwhile a DataVolume with a consumer is imported to the end, over several controller
    // ticks: each of them left the one without a consumer alone.
    common::create(&dvs, http_dv("other", json!({}))).await;
    run_kubevirt_vm_named(&client, "other-vm", "other").await;
    until(&dvs, "other", |v| phase(v) == "Succeeded").await;
    assert_eq!(
        phase(&serde_json::to_value(dvs.get("disk").await.unwrap()).unwrap()),
        "PendingPopulation",
        "no consumer, no import"
    );

    // A VM that is to run consumes it: the import goes on to the end.
    run_kubevirt_vm_on(&client, "disk").await;
    until(&dvs, "disk", |v| phase(v) == "Succeeded").await;
    emu.shutdown().await;
}

#[tokio::test]
async fn a_failing_cdi_import_is_retried_with_a_growing_restart_count() {
    let (emu, client) = common::start_importing(ServeFlavor::KubeVirt, "kubevirt.yaml").await;
    let dvs = data_volumes(&client);
    let message = "Unable to connect to http data source: expected status code 200, got 404. Status: 404 Not Found";
    common::create(
        &dvs,
        http_dv("bad", json!({IMPORT_ERROR_ANNOTATION: message})),
    )
    .await;
    // The default class waits for a consumer: a running VM makes the import start.
    run_kubevirt_vm_on(&client, "bad").await;
    let dv = until(&dvs, "bad", |v| {
        v["status"]["restartCount"].as_i64().unwrap_or(0) >= 3
    })
    .await;
    assert_eq!(dv["status"]["phase"], "ImportInProgress");
    let running = condition(&dv, "Running");
    assert_eq!(
        (running["status"].as_str(), running["reason"].as_str()),
        (Some("False"), Some("Error"))
    );
    assert_eq!(running["message"], message);
    emu.shutdown().await;
}

#[tokio::test]
async fn deckhouse_disks_wait_for_first_consumer_or_fail() {
    let (emu, client) = common::start_importing(ServeFlavor::Deckhouse, "deckhouse.yaml").await;
    let vds = api(
        &client,
        "virtualization.deckhouse.io",
        "v1alpha2",
        "VirtualDisk",
        "virtualdisks",
    );
    let disk = |name: &str, annotations: Value| {
        json!({
        "apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"persistentVolumeClaim": {"size": "1Gi"},
                 "dataSource": {"type": "HTTP", "http": {"url": "https://images.example.org/d.qcow2"}}}})
    };
    common::create(&vds, disk("idle", json!({}))).await;
    let phase = |v: &Value| v["status"]["phase"].as_str().unwrap_or("").to_owned();
    until(&vds, "idle", |v| phase(v) == "WaitForFirstConsumer").await;

    common::create(
        &vds,
        disk("broken", json!({IMPORT_ERROR_ANNOTATION: "404 Not Found"})),
    )
    .await;
    let vms = api(
        &client,
        "virtualization.deckhouse.io",
        "v1alpha2",
        "VirtualMachine",
        "virtualmachines",
    );
    common::create(
        &vms,
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
        "metadata": {"name": "vm"},
        "spec": {"virtualMachineClassName": "generic", "runPolicy": "AlwaysOn",
                 "cpu": {"cores": 1}, "memory": {"size": "1Gi"},
                 "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "broken"}]}}),
    )
    .await;
    let broken = until(&vds, "broken", |v| phase(v) == "Failed").await;
    let ready = condition(&broken, "Ready");
    assert_eq!(ready["reason"], "ProvisioningFailed");
    assert_eq!(ready["message"], "404 Not Found");
    assert_eq!(
        phase(&serde_json::to_value(vds.get("idle").await.unwrap()).unwrap()),
        "WaitForFirstConsumer"
    );
    emu.shutdown().await;
}

/// Deckhouse's importer pod runs while a disk imports (name, labels, owner, container as
/// the controller makes them), logs its source, and goes once the disk is ready; a failing
/// import leaves it restarting with the error in its log and a BackOff event.
#[tokio::test]
async fn deckhouse_importer_pods_live_while_disks_import() {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![common::fixture("deckhouse.yaml")],
        flavor: ServeFlavor::Deckhouse,
        // Slow enough for the Provisioning phase to be seen.
        import_step: Duration::from_millis(300),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = common::client(&emu).await;
    let vds = api(
        &client,
        "virtualization.deckhouse.io",
        "v1alpha2",
        "VirtualDisk",
        "virtualdisks",
    );
    let vms = api(
        &client,
        "virtualization.deckhouse.io",
        "v1alpha2",
        "VirtualMachine",
        "virtualmachines",
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    for (name, annotations) in [
        ("good", json!({})),
        ("bad", json!({IMPORT_ERROR_ANNOTATION: "404 Not Found"})),
    ] {
        common::create(
            &vds,
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"persistentVolumeClaim": {"size": "1Gi"},
                     "dataSource": {"type": "HTTP", "http": {"url": format!("https://images.example.org/{name}.qcow2")}}}}),
        )
        .await;
        // A VM that uses it, so a WaitForFirstConsumer class lets the import start.
        common::create(
            &vms,
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
            "metadata": {"name": format!("vm-{name}")},
            "spec": {"virtualMachineClassName": "generic", "runPolicy": "AlwaysOn",
                     "cpu": {"cores": 1}, "memory": {"size": "1Gi"},
                     "blockDeviceRefs": [{"kind": "VirtualDisk", "name": name}]}}),
        )
        .await;
    }
    let phase = |v: &Value| v["status"]["phase"].as_str().unwrap_or("").to_owned();
    let good = until(&vds, "good", |v| phase(v) == "Provisioning").await;
    let uid = good["metadata"]["uid"].as_str().unwrap().to_owned();
    let name = format!("d8v-vd-importer-{uid}");
    let pod = serde_json::to_value(pods.get(&name).await.unwrap()).unwrap();
    assert_eq!(pod["metadata"]["labels"]["app"], "dvcr-data-importer");
    assert_eq!(pod["metadata"]["labels"]["heritage"], "deckhouse");
    let owner = &pod["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["uid"], &owner["controller"]),
        (&json!("VirtualDisk"), &json!(uid), &json!(true))
    );
    assert_eq!(pod["spec"]["containers"][0]["name"], "d8v-dvcr-importer");
    let params = kube::api::LogParams {
        container: Some("d8v-dvcr-importer".into()),
        ..Default::default()
    };
    let log = pods.logs(&name, &params).await.unwrap();
    assert!(
        log.contains("https://images.example.org/good.qcow2"),
        "{log}"
    );
    until(&vds, "good", |v| phase(v) == "Ready").await;
    assert!(
        pods.get_opt(&name).await.unwrap().is_none(),
        "the importer is deleted once the disk is ready"
    );

    let bad = until(&vds, "bad", |v| phase(v) == "Failed").await;
    let name = format!(
        "d8v-vd-importer-{}",
        bad["metadata"]["uid"].as_str().unwrap()
    );
    let pod = serde_json::to_value(pods.get(&name).await.unwrap()).unwrap();
    let status = &pod["status"]["containerStatuses"][0];
    assert_eq!(status["state"]["waiting"]["reason"], "CrashLoopBackOff");
    assert!(status["restartCount"].as_i64().unwrap() >= 1);
    let log = pods.logs(&name, &params).await.unwrap();
    assert!(log.contains("404 Not Found"), "{log}");
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let list = events
        .list(&kube::api::ListParams::default().fields(&format!(
            "involvedObject.kind=Pod,involvedObject.name={name}"
        )))
        .await
        .unwrap();
    assert!(
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("BackOff")),
        "{:?}",
        list.items
    );
    emu.shutdown().await;
}

/// CDI's importer pod (`pkg/controller/import-controller.go` `makeImporterPodSpec`): named
/// `importer-<PVC>`, owned by the PVC, container `importer`, deleted once the DataVolume
/// succeeded; a failing import keeps restarting it with the error in its log.
#[tokio::test]
async fn cdi_importer_pods_live_while_data_volumes_import() {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![common::fixture("kubevirt.yaml")],
        flavor: ServeFlavor::KubeVirt,
        // Slow enough for ImportInProgress to be seen.
        import_step: Duration::from_millis(300),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = common::client(&emu).await;
    let dvs = data_volumes(&client);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    for (name, error) in [("good", None), ("bad", Some("404 Not Found"))] {
        let mut annotations = json!({"cdi.kubevirt.io/storage.bind.immediate.requested": "true"});
        if let Some(error) = error {
            annotations[IMPORT_ERROR_ANNOTATION] = json!(error);
        }
        common::create(
            &dvs,
            json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"source": {"http": {"url": format!("https://images.example.org/{name}.qcow2")}},
                     "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}),
        )
        .await;
    }
    let phase = |v: &Value| v["status"]["phase"].as_str().unwrap_or("").to_owned();
    until(&dvs, "good", |v| phase(v) == "ImportInProgress").await;
    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), "default");
    let pvc_uid = pvcs.get("good").await.unwrap().metadata.uid.unwrap();
    let pod = serde_json::to_value(pods.get("importer-good").await.unwrap()).unwrap();
    assert_eq!(
        pod["metadata"]["labels"],
        json!({"app": "containerized-data-importer", "cdi.kubevirt.io": "importer",
               "prometheus.cdi.kubevirt.io": ""})
    );
    let owner = &pod["metadata"]["ownerReferences"][0];
    assert_eq!(
        (
            &owner["kind"],
            &owner["name"],
            &owner["uid"],
            &owner["controller"]
        ),
        (
            &json!("PersistentVolumeClaim"),
            &json!("good"),
            &json!(pvc_uid),
            &json!(true)
        )
    );
    assert_eq!(pod["spec"]["containers"][0]["name"], "importer");
    assert_eq!(pod["spec"]["restartPolicy"], "OnFailure");
    let params = kube::api::LogParams {
        container: Some("importer".into()),
        ..Default::default()
    };
    let log = pods.logs("importer-good", &params).await.unwrap();
    assert!(
        log.contains("https://images.example.org/good.qcow2"),
        "{log}"
    );
    until(&dvs, "good", |v| phase(v) == "Succeeded").await;
    assert!(
        pods.get_opt("importer-good").await.unwrap().is_none(),
        "the importer is deleted once the import succeeded"
    );

    until(&dvs, "bad", |v| {
        v["status"]["restartCount"].as_i64() >= Some(1)
    })
    .await;
    let pod = serde_json::to_value(pods.get("importer-bad").await.unwrap()).unwrap();
    let status = &pod["status"]["containerStatuses"][0];
    assert_eq!(status["state"]["waiting"]["reason"], "CrashLoopBackOff");
    assert_eq!(
        status["lastState"]["terminated"]["message"],
        "404 Not Found"
    );
    let log = pods.logs("importer-bad", &params).await.unwrap();
    assert!(log.contains("404 Not Found"), "{log}");
    emu.shutdown().await;
}

/// A StorageClass that binds at once and lets claims grow.
async fn expandable_class(client: &kube::Client) {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("storage.k8s.io", "v1", "StorageClass"),
        "storageclasses",
    );
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    common::create(
        &classes,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "expandable"}, "provisioner": "example.org/csi",
            "volumeBindingMode": "Immediate", "allowVolumeExpansion": true}),
    )
    .await;
}

async fn patch_storage(api: &Api<DynamicObject>, name: &str, patch: Value) -> Result<(), String> {
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .map(|_| ())
    .map_err(|e| match e {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        e => e.to_string(),
    })
}

/// kube-apiserver: a claim grows only when its class allows expansion (PersistentVolumeClaimResize
/// admission, 403) and never below its capacity (validation, 422); the resizer then allocates
/// the new size, which waits for a pod to mount the claim (nothing does here; `resize.rs`
/// follows it to the end).
#[tokio::test]
async fn claims_grow_only_where_their_class_allows() {
    let (_emu, client) = common::start_importing(ServeFlavor::KubeVirt, "kubevirt.yaml").await;
    expandable_class(&client).await;
    let dvs = data_volumes(&client);
    common::create(
        &dvs,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "grow"},
            "spec": {"source": {"blank": {}}, "storage": {"storageClassName": "expandable",
                "resources": {"requests": {"storage": "1Gi"}}}}}),
    )
    .await;
    until(&dvs, "grow", |d| d["status"]["phase"] == "Succeeded").await;
    let pvcs = api(
        &client,
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
    );
    let grow = |size: &str| json!({"spec": {"resources": {"requests": {"storage": size}}}});
    patch_storage(&pvcs, "grow", grow("2Gi")).await.unwrap();
    let pvc = until(&pvcs, "grow", |p| {
        p["status"]["allocatedResourceStatuses"]["storage"] == "NodeResizePending"
    })
    .await;
    assert_eq!(pvc["status"]["allocatedResources"]["storage"], "2Gi");
    assert_eq!(pvc["status"]["capacity"]["storage"], "1Gi");
    assert!(
        pvc["status"]["conditions"]
            .as_array()
            .is_none_or(|c| c.iter().all(|c| c["type"] != "Resizing")),
        "{pvc}"
    );
    assert_eq!(
        patch_storage(&pvcs, "grow", grow("512Mi"))
            .await
            .unwrap_err(),
        "422 Invalid: PersistentVolumeClaim \"grow\" is invalid: spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"
    );
    // The fixture's fedora-dv-root is on local-path, which does not allow expansion.
    assert_eq!(
        patch_storage(&pvcs, "fedora-dv-root", grow("100Gi"))
            .await
            .unwrap_err(),
        "403 Forbidden: persistentvolumeclaims \"fedora-dv-root\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"
    );
}

/// Deckhouse's resizing handler: a bigger `spec.persistentVolumeClaim.size` grows the claim and
/// the disk comes back Ready with the new capacity; on a class that cannot grow, condition
/// `Resizing` False, `ResizingNotAvailable`, with the API server's refusal.
#[tokio::test]
async fn deckhouse_disks_grow_through_their_claims() {
    let (_emu, client) = common::start_importing(ServeFlavor::Deckhouse, "deckhouse.yaml").await;
    expandable_class(&client).await;
    let vds = api(
        &client,
        "virtualization.deckhouse.io",
        "v1alpha2",
        "VirtualDisk",
        "virtualdisks",
    );
    for (name, class) in [("grow", "expandable"), ("stuck", "manual")] {
        common::create(
            &vds,
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
                "metadata": {"name": name},
                "spec": {"persistentVolumeClaim": {"size": "1Gi", "storageClassName": class}}}),
        )
        .await;
    }
    for name in ["grow", "stuck"] {
        until(&vds, name, |d| d["status"]["phase"] == "Ready").await;
    }
    // A running VM mounts `grow`, so the kubelet finishes its claim's growth (expansion.rs).
    let vms = api(
        &client,
        "virtualization.deckhouse.io",
        "v1alpha2",
        "VirtualMachine",
        "virtualmachines",
    );
    common::create(
        &vms,
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
            "metadata": {"name": "grower"},
            "spec": {"runPolicy": "AlwaysOn", "virtualMachineClassName": "generic",
                "cpu": {"cores": 1}, "memory": {"size": "1Gi"},
                "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "grow"}]}}),
    )
    .await;
    until(&vms, "grower", |v| v["status"]["phase"] == "Running").await;
    let size = json!({"spec": {"persistentVolumeClaim": {"size": "3Gi"}}});
    patch_storage(&vds, "grow", size.clone()).await.unwrap();
    let vd = until(&vds, "grow", |d| {
        d["status"]["phase"] == "Ready" && d["status"]["capacity"] == "3Gi"
    })
    .await;
    assert!(
        vd["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["type"] != "Resizing"),
        "{vd}"
    );
    let pvcs = api(
        &client,
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
    );
    let claim = vd["status"]["target"]["persistentVolumeClaimName"]
        .as_str()
        .unwrap();
    let pvc = serde_json::to_value(pvcs.get(claim).await.unwrap()).unwrap();
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "3Gi");
    patch_storage(&vds, "stuck", size).await.unwrap();
    let vd = until(&vds, "stuck", |d| {
        d["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Resizing"))
    })
    .await;
    let resizing = condition(&vd, "Resizing");
    assert_eq!(
        (&resizing["status"], &resizing["reason"]),
        (&json!("False"), &json!("ResizingNotAvailable"))
    );
    let claim = vd["status"]["target"]["persistentVolumeClaimName"]
        .as_str()
        .unwrap();
    assert_eq!(
        resizing["message"],
        format!(
            "Disk resizing is not allowed: persistentvolumeclaims \"{claim}\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize."
        )
    );
    assert_eq!(vd["status"]["capacity"], "1Gi");
}
