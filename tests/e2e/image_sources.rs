//! Images from other sources: a Deckhouse VirtualImage from a VirtualDiskSnapshot waits for the
//! snapshot as the platform does (`DatasourceReady` `False`, `VirtualDiskSnapshotNotReady`),
//! then is Ready; KubeVirt has no such kind and refuses it without changing anything.

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
