//! Requests in a namespace that does not exist, answered as the real API server does:
//! - a create (POST, or server-side apply of a new object) is refused by the NamespaceLifecycle
//!   admission plugin with NotFound for the *namespace*
//!   (k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go:
//!   `errors.NewNotFound(v1.Resource("namespaces"), a.GetNamespace())`);
//! - a GET of an object there is NotFound for the *object* (the registry only looks its key up,
//!   k8s.io/apiserver/pkg/registry/generic/registry/store.go `Get`).

use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kubevm_emulator::{Emulator, EmulatorOptions};
use serde_json::json;

use crate::common;
use common::client;

fn status(err: kube::Error) -> Box<kube::core::Status> {
    match err {
        kube::Error::Api(status) => status,
        other => panic!("not an API error: {other:?}"),
    }
}

#[tokio::test]
async fn missing_namespace_answers() {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let client = client(&emu).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    );
    let vms: Api<DynamicObject> = Api::namespaced_with(client, "nosuch", &ar);
    let vm: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "w", "namespace": "nosuch"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}
    }))
    .unwrap();

    let created = status(vms.create(&PostParams::default(), &vm).await.unwrap_err());
    assert_eq!((created.code, created.reason.as_str()), (404, "NotFound"));
    assert_eq!(created.message, "namespaces \"nosuch\" not found");
    let details = created.details.unwrap();
    assert_eq!(
        (details.kind.as_str(), details.name.as_str()),
        ("namespaces", "nosuch")
    );

    let applied = status(
        vms.patch("w", &PatchParams::apply("test"), &Patch::Apply(&vm))
            .await
            .unwrap_err(),
    );
    assert_eq!(applied.message, "namespaces \"nosuch\" not found");
    assert_eq!(applied.details.unwrap().kind, "namespaces");

    let got = status(vms.get("w").await.unwrap_err());
    assert_eq!((got.code, got.reason.as_str()), (404, "NotFound"));
    assert_eq!(got.message, "virtualmachines.kubevirt.io \"w\" not found");
    let details = got.details.unwrap();
    assert_eq!(
        (
            details.kind.as_str(),
            details.group.as_str(),
            details.name.as_str()
        ),
        ("virtualmachines", "kubevirt.io", "w")
    );
    emu.shutdown().await;
}
