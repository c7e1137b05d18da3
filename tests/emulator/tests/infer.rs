//! virt-api's VirtualMachine mutator infers the instancetype and preference from the labels
//! of the boot volume's DataSource or PVC (KubeVirt `pkg/instancetype/infer`), or denies the
//! VM with the inference error.

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
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

/// A VM booting from `ds/NAME` whose instancetype must be inferred and whose preference may be.
fn vm(name: &str, data_source: &str, volume: &str) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runStrategy": "Halted",
            "instancetype": {"inferFromVolume": volume},
            "preference": {"inferFromVolume": volume, "inferFromVolumeFailurePolicy": "Ignore"},
            "dataVolumeTemplates": [{"metadata": {"name": format!("{name}-root")},
                "spec": {"sourceRef": {"kind": "DataSource", "name": data_source}, "storage": {}}}],
            "template": {"spec": {"domain": {"devices": {"disks": [{"name": "rootdisk", "disk": {}}]}},
                "volumes": [{"name": "rootdisk", "dataVolume": {"name": format!("{name}-root")}}]}}}})
}

async fn create(api: &Api<DynamicObject>, object: Value) -> Result<Value, kube::Error> {
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .map(|o| serde_json::to_value(o).unwrap())
}

#[tokio::test]
async fn the_instancetype_and_preference_come_from_the_data_source_or_its_pvc() {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![common::fixture("kubevirt.yaml")],
        flavor: ServeFlavor::KubeVirt,
        ..Default::default()
    })
    .await
    .unwrap();
    let client = common::client(&emu).await;
    let sources = api(
        &client,
        "cdi.kubevirt.io",
        "v1beta1",
        "DataSource",
        "datasources",
    );
    let pvcs = api(
        &client,
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
    );
    let vms = api(
        &client,
        "kubevirt.io",
        "v1",
        "VirtualMachine",
        "virtualmachines",
    );
    // Labels on the DataSource itself (the names CDI's common-instancetypes use).
    create(&sources, json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora", "namespace": "default", "labels": {
            "instancetype.kubevirt.io/default-instancetype": "u1.medium",
            "instancetype.kubevirt.io/default-instancetype-kind": "VirtualMachineClusterInstancetype",
            "instancetype.kubevirt.io/default-preference": "fedora"}},
        "spec": {"source": {"pvc": {"name": "fedora-pvc", "namespace": "default"}}}}))
    .await
    .unwrap();
    let made = create(&vms, vm("a", "fedora", "rootdisk")).await.unwrap();
    assert_eq!(
        made["spec"]["instancetype"],
        json!({"name": "u1.medium", "kind": "VirtualMachineClusterInstancetype"})
    );
    assert_eq!(made["spec"]["preference"], json!({"name": "fedora"}));

    // No labels on the DataSource: its PVC's; no preference label there: the matcher goes
    // (policy Ignore).
    create(
        &pvcs,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "plain-pvc", "namespace": "default",
            "labels": {"instancetype.kubevirt.io/default-instancetype": "cx1.large"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await
    .unwrap();
    create(
        &sources,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "plain", "namespace": "default"},
        "spec": {"source": {"pvc": {"name": "plain-pvc", "namespace": "default"}}}}),
    )
    .await
    .unwrap();
    let made = create(&vms, vm("b", "plain", "rootdisk")).await.unwrap();
    assert_eq!(made["spec"]["instancetype"], json!({"name": "cx1.large"}));
    assert!(made["spec"].get("preference").is_none(), "{}", made["spec"]);

    // Nothing to infer the instancetype from (default policy Reject), or no such volume: denied.
    create(
        &pvcs,
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "bare-pvc", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await
    .unwrap();
    create(
        &sources,
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "bare", "namespace": "default"},
        "spec": {"source": {"pvc": {"name": "bare-pvc", "namespace": "default"}}}}),
    )
    .await
    .unwrap();
    for (vm, message) in [
        (
            vm("c", "bare", "rootdisk"),
            "unable to find required instancetype.kubevirt.io/default-instancetype label on the volume",
        ),
        (
            vm("d", "fedora", "bootdisk"),
            "unable to find volume bootdisk to infer defaults",
        ),
        (
            vm("e", "missing", "rootdisk"),
            "datasources.cdi.kubevirt.io \"missing\" not found",
        ),
    ] {
        let kube::Error::Api(status) = create(&vms, vm).await.unwrap_err() else {
            panic!("not an API error")
        };
        assert_eq!(status.code, 422);
        assert_eq!(
            status.message,
            format!(
                "admission webhook \"virtualmachines-mutator.kubevirt.io\" denied the request: {message}"
            )
        );
    }
    for name in ["c", "d", "e"] {
        assert!(
            vms.get_opt(name).await.unwrap().is_none(),
            "{name} was made"
        );
    }
}
