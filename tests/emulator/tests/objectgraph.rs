//! KubeVirt's `objectgraph` subresource as upstream builds it (kubevirt
//! `pkg/virt-api/rest/objectgraph.go`): refused without the ObjectGraph feature gate, then
//! the reference tree of a VM, optional nodes dropped only when asked.

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kubevm_emulator::ServeFlavor;
use serde_json::{Value, json};

use crate::common;

async fn graph(client: &kube::Client, body: &str) -> Result<Value, kube::Error> {
    let request = http::Request::get(
        "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/app/objectgraph",
    )
    .header("content-type", "application/json")
    .body(body.as_bytes().to_vec())
    .unwrap();
    client.request::<Value>(request).await
}

#[tokio::test]
async fn objectgraph_of_a_vm() {
    let (emu, client) = common::start(ServeFlavor::KubeVirt).await;
    let vms: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "kubevirt.io",
            "v1",
            "VirtualMachine",
        )),
    );
    let vm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "app", "namespace": "default"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {
            "domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}},
            "networks": [{"name": "pod", "pod": {}}, {"name": "lan", "multus": {"networkName": "infra/lan"}}],
            "volumes": [
                {"name": "root", "dataVolume": {"name": "app-root"}},
                {"name": "ci", "cloudInitNoCloud": {"secretRef": {"name": "app-cloudinit"}}}
            ]}}}
    }))
    .unwrap();
    vms.create(&PostParams::default(), &vm).await.unwrap();

    // No feature gate: upstream's 400.
    let err = graph(&client, "{}").await.unwrap_err();
    assert!(
        err.to_string()
            .contains("ObjectGraph feature gate not enabled: Unable to return object graph."),
        "{err}"
    );
    let kvs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "kubevirt",
        &ApiResource::from_gvk(&GroupVersionKind::gvk("kubevirt.io", "v1", "KubeVirt")),
    );
    kvs.patch(
        "kubevirt",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"configuration": {"developerConfiguration": {
            "featureGates": ["Snapshot", "HotplugVolumes", "ObjectGraph"]}}}}),
        ),
    )
    .await
    .unwrap();

    let g = graph(&client, "{}").await.unwrap();
    assert_eq!(g["objectReference"]["kind"], "VirtualMachine");
    assert_eq!(g["labels"]["kubevirt.io/dependency-type"], "compute");
    let children = g["children"].as_array().unwrap();
    let refs: Vec<(String, String, String)> = children
        .iter()
        .map(|c| {
            let r = &c["objectReference"];
            (
                r["kind"].as_str().unwrap().into(),
                r["name"].as_str().unwrap().into(),
                r["namespace"].as_str().unwrap().into(),
            )
        })
        .collect();
    // A stopped VM has no VMI node; references are nodes whether or not the objects exist.
    assert_eq!(
        refs,
        [
            ("DataVolume".into(), "app-root".into(), "default".into()),
            ("Secret".into(), "app-cloudinit".into(), "default".into()),
            (
                "NetworkAttachmentDefinition".into(),
                "lan".into(),
                "infra".into()
            ),
        ]
    );
    assert_eq!(
        children[0]["children"][0]["objectReference"]["kind"],
        "PersistentVolumeClaim"
    );
    assert_eq!(
        children[0]["labels"]["kubevirt.io/dependency-type"],
        "storage"
    );
    assert_eq!(children[2]["optional"], true);
    // Optional nodes go only when asked; a label selector keeps matching nodes.
    let g = graph(&client, r#"{"includeOptionalNodes": false}"#)
        .await
        .unwrap();
    assert_eq!(g["children"].as_array().unwrap().len(), 2);
    let g = graph(
        &client,
        r#"{"labelSelector": {"matchLabels": {"kubevirt.io/dependency-type": "config"}}}"#,
    )
    .await
    .unwrap();
    let only: Vec<&Value> = g["children"].as_array().unwrap().iter().collect();
    assert_eq!(only.len(), 1);
    assert_eq!(only[0]["objectReference"]["kind"], "Secret");
    emu.shutdown().await;
}
