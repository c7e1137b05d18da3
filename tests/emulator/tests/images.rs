//! The emulated image controllers: a CDI DataSource's `Ready` condition follows the DataVolume
//! behind it (CDI `datasource-controller.go`), and a Deckhouse VirtualImage /
//! ClusterVirtualImage from a URL goes `Pending → Provisioning (NN%) → Ready`, or `Failed` with
//! condition `Ready` reason `ProvisioningFailed` and the importer's error
//! (deckhouse/virtualization `vicondition/condition.go`).

use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kubevm_emulator::{Emulator, ServeFlavor};
use serde_json::{Value, json};

use crate::common;

fn api(
    client: &kube::Client,
    group: &str,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let version = if group == "cdi.kubevirt.io" {
        "v1beta1"
    } else {
        "v1alpha2"
    };
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Every state `name` passes through until `done` holds (10 s at most); returns them.
async fn states(api: &Api<DynamicObject>, name: &str, done: impl Fn(&Value) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = vec![];
    loop {
        let object = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
        let finished = done(&object);
        seen.push(object);
        if finished {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "never reached: {:?}",
            seen.last()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ready(obj: &Value) -> Option<&Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
}

#[tokio::test]
async fn a_data_source_is_ready_once_its_data_volume_succeeded() {
    let (_emu, client) = common::start_importing(ServeFlavor::KubeVirt, "kubevirt.yaml").await;
    let sources = api(
        &client,
        "cdi.kubevirt.io",
        "DataSource",
        "datasources",
        Some("default"),
    );
    // Nothing behind it yet: NotFound.
    common::create(
        &sources,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora", "namespace": "default"},
        "spec": {"source": {"pvc": {"name": "fedora", "namespace": "default"}}}}),
    )
    .await;
    let seen = states(&sources, "fedora", |o| ready(o).is_some()).await;
    let cond = ready(seen.last().unwrap()).unwrap();
    assert_eq!(
        (cond["status"].as_str(), cond["reason"].as_str()),
        (Some("False"), Some("NotFound"))
    );
    assert_eq!(
        seen.last().unwrap()["status"]["source"]["pvc"]["name"],
        "fedora"
    );
    // The DataVolume imports (on the default WaitForFirstConsumer class, bound at once as
    // asked by AnnImmediateBinding: no VM consumes a golden image): the reason follows its
    // phase, then Ready.
    let dvs = api(
        &client,
        "cdi.kubevirt.io",
        "DataVolume",
        "datavolumes",
        Some("default"),
    );
    common::create(
        &dvs,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "fedora", "namespace": "default",
            "annotations": {"cdi.kubevirt.io/storage.bind.immediate.requested": "true"}},
        "spec": {"source": {"http": {"url": "https://images.example/f.qcow2"}},
                 "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}),
    )
    .await;
    let seen = states(&sources, "fedora", |o| {
        ready(o).is_some_and(|c| c["status"] == "True")
    })
    .await;
    let reasons: Vec<String> = seen
        .iter()
        .filter_map(|o| {
            ready(o)
                .and_then(|c| c["reason"].as_str())
                .map(str::to_owned)
        })
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r == "ImportInProgress" || r == "ImportScheduled"),
        "{reasons:?}"
    );
    let cond = ready(seen.last().unwrap()).unwrap();
    assert_eq!(cond["reason"], "Ready");
    assert_eq!(cond["message"], "DataSource is ready to be consumed");
    // No source at all.
    common::create(
        &sources,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "empty", "namespace": "default"}, "spec": {"source": {}}}),
    )
    .await;
    let seen = states(&sources, "empty", |o| ready(o).is_some()).await;
    assert_eq!(ready(seen.last().unwrap()).unwrap()["reason"], "NoSource");
}

#[tokio::test]
async fn a_virtual_image_from_a_url_provisions_with_progress_or_fails_with_the_reason() {
    let (_emu, client) = common::start_importing(ServeFlavor::Deckhouse, "deckhouse.yaml").await;
    let images = api(
        &client,
        "virtualization.deckhouse.io",
        "VirtualImage",
        "virtualimages",
        Some("dev"),
    );
    common::create(&images, json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualImage",
        "metadata": {"name": "debian", "namespace": "dev"},
        "spec": {"storage": "ContainerRegistry",
                 "dataSource": {"type": "HTTP", "http": {"url": "https://images.example/debian.qcow2"}}}})).await;
    let seen = states(&images, "debian", |o| o["status"]["phase"] == "Ready").await;
    let phases: Vec<&str> = seen
        .iter()
        .filter_map(|o| o["status"]["phase"].as_str())
        .collect();
    assert!(phases.contains(&"Provisioning"), "{phases:?}");
    assert!(
        seen.iter().any(|o| o["status"]["phase"] == "Provisioning"
            && o["status"]["progress"]
                .as_str()
                .is_some_and(|p| p != "0%" && p.ends_with('%'))),
        "no progress seen"
    );
    let done = seen.last().unwrap();
    assert_eq!(done["status"]["format"], "qcow2");
    assert_eq!(
        done["status"]["target"]["registryURL"],
        "dvcr.d8-virtualization.svc/vi/dev/debian:latest"
    );
    assert_eq!(ready(done).unwrap()["reason"], "Ready");
    // A host that never resolves (RFC 2606 `.invalid`): Failed, ProvisioningFailed, the error.
    let cluster_images = api(
        &client,
        "virtualization.deckhouse.io",
        "ClusterVirtualImage",
        "clustervirtualimages",
        None,
    );
    common::create(&cluster_images, json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "ClusterVirtualImage",
        "metadata": {"name": "broken"},
        "spec": {"dataSource": {"type": "HTTP", "http": {"url": "https://nowhere.invalid/x.img"}}}})).await;
    let seen = states(&cluster_images, "broken", |o| {
        o["status"]["phase"] == "Failed"
    })
    .await;
    let cond = ready(seen.last().unwrap()).unwrap();
    assert_eq!(cond["reason"], "ProvisioningFailed");
    assert!(
        cond["message"].as_str().unwrap().contains("no such host"),
        "{cond}"
    );
}

/// A Role in `ns` with `rules`, bound to alice.
fn grant(emu: &Emulator, ns: &str, name: &str, rules: Value) {
    let rbac = "rbac.authorization.k8s.io";
    emu.put_object(json!({"apiVersion": format!("{rbac}/v1"), "kind": "Role",
        "metadata": {"name": name, "namespace": ns}, "rules": rules}));
    emu.put_object(
        json!({"apiVersion": format!("{rbac}/v1"), "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name},
        "subjects": [{"apiGroup": rbac, "kind": "User", "name": "alice"}]}),
    );
}

#[tokio::test]
async fn cloning_from_another_namespace_needs_datavolumes_source_there() {
    let (emu, admin) = common::start_importing(ServeFlavor::KubeVirt, "kubevirt.yaml").await;
    let sources = api(
        &admin,
        "cdi.kubevirt.io",
        "DataSource",
        "datasources",
        Some("default"),
    );
    common::create(
        &sources,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "golden", "namespace": "default"},
        "spec": {"source": {"pvc": {"name": "golden", "namespace": "default"}}}}),
    )
    .await;
    grant(
        &emu,
        "dev",
        "dv-maker",
        json!([{"apiGroups": ["cdi.kubevirt.io"],
        "resources": ["datavolumes"], "verbs": ["create", "get"]}]),
    );
    let kc = kube::config::Kubeconfig::from_yaml(&emu.kubeconfig_yaml()).unwrap();
    let options = kube::config::KubeConfigOptions {
        context: Some("emulator-restricted".into()),
        ..Default::default()
    };
    let alice = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kc, &options)
            .await
            .unwrap(),
    )
    .unwrap();
    let dvs = api(
        &alice,
        "cdi.kubevirt.io",
        "DataVolume",
        "datavolumes",
        Some("dev"),
    );
    let dv: DynamicObject = serde_json::from_value(json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume", "metadata": {"name": "copy", "namespace": "dev"},
        "spec": {"sourceRef": {"kind": "DataSource", "name": "golden", "namespace": "default"},
                 "storage": {}}}))
    .unwrap();
    let err = dvs.create(&PostParams::default(), &dv).await.unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code, 422);
    assert_eq!(
        status.message,
        "admission webhook \"datavolume-validate.cdi.kubevirt.io\" denied the request:  User alice has insufficient permissions in clone source namespace default"
    );
    // The permission CDI's authorize.go asks for, in the source namespace: allowed.
    grant(
        &emu,
        "default",
        "clone-source",
        json!([{"apiGroups": ["cdi.kubevirt.io"],
        "resources": ["datavolumes/source"], "verbs": ["create"]}]),
    );
    dvs.create(&PostParams::default(), &dv).await.unwrap();
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

#[tokio::test]
async fn a_virtual_image_from_a_disk_snapshot_waits_until_the_snapshot_is_ready() {
    let (emu, client) = common::start_importing(ServeFlavor::Deckhouse, "deckhouse.yaml").await;
    let images = api(
        &client,
        "virtualization.deckhouse.io",
        "VirtualImage",
        "virtualimages",
        Some("dev"),
    );
    common::create(
        &images,
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualImage",
        "metadata": {"name": "from-snap", "namespace": "dev"},
        "spec": {"storage": "ContainerRegistry",
                 "dataSource": {"type": "ObjectRef",
                                "objectRef": {"kind": "VirtualDiskSnapshot", "name": "snap"}}}}),
    )
    .await;
    // No snapshot: Pending, DatasourceReady False with the platform's reason and message.
    let seen = states(&images, "from-snap", |o| {
        condition(o, "DatasourceReady").is_some_and(|c| c["status"] == "False")
    })
    .await;
    let pending = seen.last().unwrap();
    assert_eq!(pending["status"]["phase"], "Pending");
    let cond = condition(pending, "DatasourceReady").unwrap();
    assert_eq!(cond["reason"], "VirtualDiskSnapshotNotReady");
    assert_eq!(cond["message"], "VirtualDiskSnapshot snap not ready.");
    // A snapshot still in progress changes nothing; a Ready one lets the image be made.
    let snapshot = |phase: &str| {
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDiskSnapshot",
        "metadata": {"name": "snap", "namespace": "dev"},
        "spec": {"virtualDiskName": "root", "requiredConsistency": true},
        "status": {"phase": phase, "volumeSnapshotName": "snap-vs", "consistent": true}})
    };
    emu.put_object(snapshot("InProgress"));
    let again = serde_json::to_value(images.get("from-snap").await.unwrap()).unwrap();
    assert_eq!(again["status"]["phase"], "Pending");
    emu.put_object(snapshot("Ready"));
    let seen = states(&images, "from-snap", |o| o["status"]["phase"] == "Ready").await;
    let done = seen.last().unwrap();
    assert_eq!(
        condition(done, "DatasourceReady").unwrap()["status"],
        "True"
    );
    assert_eq!(ready(done).unwrap()["reason"], "Ready");
}
