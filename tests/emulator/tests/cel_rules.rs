//! The CRDs' CEL rules (`x-kubernetes-validations`) are evaluated like kube-apiserver does
//! (apiextensions-apiserver `pkg/apiserver/schema/cel/validation.go`): a failed rule is a 422
//! `Invalid` whose cause is `field.Invalid(<path of the rule's schema>, <schema type>,
//! <message>)`; transition rules (`oldSelf`) only apply to updates.

use crate::common;

use kube::client::Body;
use kubevm_emulator::ServeFlavor;
use serde_json::{Value, json};

const VMOPS: &str =
    "/apis/virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualmachineoperations";

async fn send(client: &kube::Client, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(
            "content-type",
            if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            },
        )
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect_bytes().await.unwrap();
    (code, serde_json::from_slice(&bytes).unwrap())
}

fn clone_op(name: &str, to: &str) -> Value {
    json!({
        "apiVersion": "virtualization.deckhouse.io/v1alpha2",
        "kind": "VirtualMachineOperation",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "Clone", "virtualMachineName": "linux-vm",
            "clone": {"mode": "DryRun", "nameReplacement": [
                {"from": {"kind": "VirtualMachine", "name": "linux-vm"}, "to": to}]}},
    })
}

/// deckhouse/virtualization `crds/virtualmachineoperations.yaml`: `spec.clone.nameReplacement`
/// has `self.all(nr, has(nr.to) && size(nr.to) >= 1 && size(nr.to) <= 59)`.
#[tokio::test]
async fn a_name_replacement_over_59_characters_is_invalid() {
    let (_emu, client) = common::start(ServeFlavor::Deckhouse).await;
    let (code, _) = send(&client, "POST", VMOPS, &clone_op("ok", &"a".repeat(59))).await;
    assert_eq!(code, 201);
    let (code, status) = send(&client, "POST", VMOPS, &clone_op("long", &"a".repeat(60))).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["status"], "Failure");
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["details"]["kind"], "VirtualMachineOperation");
    assert_eq!(status["details"]["group"], "virtualization.deckhouse.io");
    assert_eq!(
        status["details"]["causes"],
        json!([{
            "reason": "FieldValueInvalid",
            "field": "spec.clone.nameReplacement",
            "message": "Invalid value: \"array\": Each nameReplacement.to must be between 1 and 59 characters",
        }])
    );
    assert_eq!(
        status["message"],
        "VirtualMachineOperation.virtualization.deckhouse.io \"long\" is invalid: spec.clone.nameReplacement: Invalid value: \"array\": Each nameReplacement.to must be between 1 and 59 characters"
    );
    // A rule on the object: `self.type == 'Clone' ? has(self.clone) : true`.
    let mut op = clone_op("noclone", "x");
    op["spec"].as_object_mut().unwrap().remove("clone");
    let (code, status) = send(&client, "POST", VMOPS, &op).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["details"]["causes"][0]["message"],
        "Invalid value: \"object\": Clone requires clone field."
    );
    assert_eq!(status["details"]["causes"][0]["field"], "spec");
}

/// `.spec is immutable` (`self == oldSelf`) is a transition rule: a create passes it, an
/// update that changes the spec does not, one that changes only labels does.
#[tokio::test]
async fn transition_rules_apply_to_updates_only() {
    let (_emu, client) = common::start(ServeFlavor::Deckhouse).await;
    let (code, made) = send(&client, "POST", VMOPS, &clone_op("op", "copy")).await;
    assert_eq!(code, 201, "{made}");
    assert_eq!(made["metadata"]["name"], "op");
    // Merge patches: the controller moves the status on meanwhile.
    let changed = json!({"spec": {"clone": {"nameReplacement": [
        {"from": {"kind": "VirtualMachine", "name": "linux-vm"}, "to": "other"}]}}});
    let (code, status) = send(&client, "PATCH", &format!("{VMOPS}/op"), &changed).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "FieldValueInvalid", "field": "spec",
            "message": "Invalid value: \"object\": .spec is immutable"}])
    );
    let labelled = json!({"metadata": {"labels": {"a": "b"}}});
    let (code, status) = send(&client, "PATCH", &format!("{VMOPS}/op"), &labelled).await;
    assert_eq!(code, 200, "{status}");
}
