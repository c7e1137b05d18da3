//! Images from other sources: a Deckhouse VirtualImage from a VirtualDiskSnapshot waits for the
//! snapshot as the platform does (`DatasourceReady` `False`, `VirtualDiskSnapshotNotReady`),
//! then is Ready; KubeVirt has no such kind and refuses it without changing anything. On
//! KubeVirt `create --infer-from-image` sizes a VM from the labels of its DataSource.

use serde_json::{Value, json};

use crate::common::{Env, fails, ok, stderr, table};
use crate::lifecycle::eventually;

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

fn condition(obj: &Value, type_: &str) -> Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
fn deckhouse_image_from_a_disk_snapshot_waits_for_it_then_is_ready() {
    let env = Env::deckhouse();
    let out = env.vm(&[
        "image",
        "create",
        "golden",
        "--from",
        "vds/root-snap",
        "--no-wait",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // No snapshot yet: the platform's reason, read with kubectl.
    eventually("waiting for the snapshot", || {
        let vi = kubectl_json(&env, &["get", "virtualimage", "golden"]);
        vi["status"]["phase"] == "Pending"
            && condition(&vi, "DatasourceReady")["reason"] == "VirtualDiskSnapshotNotReady"
    });
    let vi = kubectl_json(&env, &["get", "virtualimage", "golden"]);
    assert_eq!(
        vi["spec"]["dataSource"],
        json!({"type": "ObjectRef", "objectRef": {"kind": "VirtualDiskSnapshot", "name": "root-snap"}})
    );
    assert_eq!(
        condition(&vi, "DatasourceReady")["message"],
        "VirtualDiskSnapshot root-snap not ready."
    );
    let list = ok(env.vm(&["image", "list"]));
    let row = table(&list)
        .into_iter()
        .find(|r| r.first().map(String::as_str) == Some("golden"))
        .unwrap();
    assert_eq!(row[1..3], ["vi", "vds/root-snap"]);
    assert_eq!(row[5], "Pending");
    // The snapshot is taken: the image is made from it.
    env.emulator.put_object(
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDiskSnapshot",
        "metadata": {"name": "root-snap", "namespace": "default"},
        "spec": {"virtualDiskName": "linux-disk", "requiredConsistency": true},
        "status": {"phase": "Ready", "volumeSnapshotName": "root-snap-vs", "consistent": true}}),
    );
    eventually("ready", || {
        kubectl_json(&env, &["get", "virtualimage", "golden"])["status"]["phase"] == "Ready"
    });
    let vi = kubectl_json(&env, &["get", "virtualimage", "golden"]);
    assert_eq!(condition(&vi, "DatasourceReady")["status"], "True");
}

#[test]
fn kubevirt_refuses_a_disk_snapshot_source_without_changing_anything() {
    let env = Env::kubevirt();
    let err = fails(
        &env,
        &["image", "create", "golden", "--from", "vds/root-snap"],
        2,
    );
    assert_eq!(
        err,
        "Error: --from vds/root-snap: on KubeVirt an image is made from pvc/[NAMESPACE/]NAME or ds/[NAMESPACE/]NAME"
    );
    assert!(
        env.emulator.requests().iter().all(|r| r.method == "GET"),
        "{:?}",
        env.emulator.requests()
    );
}

#[test]
fn kubevirt_create_infers_the_sizes_from_the_data_source_labels() {
    let env = Env::kubevirt();
    env.emulator.put_object(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "golden", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}));
    env.emulator.put_object(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "golden", "namespace": "default", "labels": {
            "instancetype.kubevirt.io/default-instancetype": "u1.medium",
            "instancetype.kubevirt.io/default-instancetype-kind": "VirtualMachineClusterInstancetype"}},
        "spec": {"source": {"pvc": {"name": "golden", "namespace": "default"}}}}));
    let out = env.vm(&[
        "create",
        "sized",
        "--image",
        "ds/golden",
        "--infer-from-image",
        "--stopped",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // virt-api put the labels' instancetype in the VM; no preference label, no preference.
    let vm = kubectl_json(&env, &["get", "vm", "sized"]);
    assert_eq!(
        vm["spec"]["instancetype"],
        json!({"name": "u1.medium", "kind": "VirtualMachineClusterInstancetype"})
    );
    assert!(vm["spec"].get("preference").is_none(), "{}", vm["spec"]);
    assert!(
        vm["spec"]["template"]["spec"]["domain"]
            .get("memory")
            .is_none()
    );
    // Sizes given as well, or no DataSource to read: refused before any change.
    for (args, message) in [
        (
            vec![
                "create",
                "x",
                "--image",
                "ds/golden",
                "--infer-from-image",
                "--memory",
                "2Gi",
            ],
            "--infer-from-image cannot be used with --memory: the instancetype sets CPU and memory",
        ),
        (
            vec![
                "create",
                "x",
                "--image",
                "quay.io/containerdisks/fedora:41",
                "--infer-from-image",
            ],
            "--infer-from-image reads the labels of a DataSource: boot from one with --image ds/[NAMESPACE/]NAME",
        ),
    ] {
        let out = env.vm(&args);
        assert!(!out.status.success());
        assert!(stderr(&out).contains(message), "{}", stderr(&out));
    }
    // A DataSource without the instancetype label: virt-api's refusal, and nothing is left.
    env.emulator.put_object(
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "bare", "namespace": "default"},
        "spec": {"source": {"pvc": {"name": "golden", "namespace": "default"}}}}),
    );
    let out = env.vm(&[
        "create",
        "y",
        "--image",
        "ds/bare",
        "--infer-from-image",
        "--stopped",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unable to find required instancetype.kubevirt.io/default-instancetype label on the volume"),
        "{}",
        stderr(&out)
    );
    assert!(!env.kubectl(&["get", "vm", "y"]).status.success());
}
