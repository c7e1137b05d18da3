//! The emulator against kube-rs (what kubectl-vm itself uses): TLS with the generated CA, list,
//! then watch from the list's resourceVersion (the watcher pattern), and errors as `Status`.

use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams, WatchEvent,
    WatchParams,
};
use kubevm_emulator::{Emulator, EmulatorOptions};
use serde_json::json;

use crate::common;
use common::client;

fn fixture() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/kubevirt.yaml"
    ))
    .unwrap()
}

#[tokio::test]
async fn list_then_watch_from_resource_version() {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![fixture()],
        ..Default::default()
    })
    .await
    .unwrap();
    let client = client(&emu).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    );
    let vms: Api<DynamicObject> = Api::namespaced_with(client.clone(), "dev", &ar);
    let list = vms.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 2);
    let rv = list.metadata.resource_version.clone().unwrap();

    let mut stream = vms
        .watch(&WatchParams::default().timeout(10), &rv)
        .await
        .unwrap()
        .boxed();
    let mut vm = emu
        .objects("kubevirt.io", "virtualmachines", Some("dev"))
        .into_iter()
        .find(|v| v["metadata"]["name"] == "batch")
        .unwrap();
    vm["metadata"]["labels"]["x"] = json!("y");
    emu.put_object(vm);
    match stream.try_next().await.unwrap().unwrap() {
        WatchEvent::Modified(o) => assert_eq!(o.metadata.name.as_deref(), Some("batch")),
        other => panic!("unexpected {other:?}"),
    }

    // Errors come back as Status objects kube-rs understands.
    let err = vms.get("nope").await.unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 404);
            assert_eq!(s.message, r#"virtualmachines.kubevirt.io "nope" not found"#);
        }
        other => panic!("{other:?}"),
    }
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, "nowhere");
    let pod = serde_json::from_value(
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )
    .unwrap();
    let err = pods.create(&PostParams::default(), &pod).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 404 && s.message == r#"namespaces "nowhere" not found"#),
        "{err:?}"
    );
    emu.shutdown().await;
}
