//! The Deckhouse `sdn` module's additional networks (`network.deckhouse.io/v1alpha1`):
//! Network namespaced, ClusterNetwork cluster-scoped, as discovery lists them and as the
//! schema (schemas/deckhouse/sdn-networks.yaml, written from the module's documentation)
//! validates them; a KubeVirt cluster does not serve the group.

use http::Request;
use kube::client::Body;
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};

use crate::common::{client, fixture};

async fn send(client: &kube::Client, method: &str, path: &str, body: Value) -> (u16, Value) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let response = client.send(request).await.unwrap();
    let code = response.status().as_u16();
    let body = response.into_body().collect_bytes().await.unwrap();
    (code, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

const GV: &str = "/apis/network.deckhouse.io/v1alpha1";

#[tokio::test]
async fn deckhouse_serves_networks_and_cluster_networks() {
    let emu = Emulator::start(EmulatorOptions {
        flavor: ServeFlavor::Deckhouse,
        fixture_yaml: vec![fixture("deckhouse.yaml")],
        ..Default::default()
    })
    .await
    .unwrap();
    let client = client(&emu).await;
    let (code, list) = send(&client, "GET", GV, Value::Null).await;
    assert_eq!(code, 200, "{list}");
    let scope = |plural: &str| {
        list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == plural)
            .map(|r| (r["kind"].clone(), r["namespaced"].clone()))
    };
    assert_eq!(scope("networks"), Some((json!("Network"), json!(true))));
    assert_eq!(
        scope("clusternetworks"),
        Some((json!("ClusterNetwork"), json!(false)))
    );
    // The fixture's networks, where their scopes put them.
    let (code, _) = send(
        &client,
        "GET",
        &format!("{GV}/clusternetworks/corp-net"),
        Value::Null,
    )
    .await;
    assert_eq!(code, 200);
    let (code, _) = send(
        &client,
        "GET",
        &format!("{GV}/namespaces/default/networks/user-net"),
        Value::Null,
    )
    .await;
    assert_eq!(code, 200);
    // spec.type is VLAN or Access.
    let (code, status) = send(
        &client,
        "POST",
        &format!("{GV}/clusternetworks"),
        json!({"apiVersion": "network.deckhouse.io/v1alpha1", "kind": "ClusterNetwork",
            "metadata": {"name": "wan"}, "spec": {"type": "Bridge"}}),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("spec.type: Unsupported value: \"Bridge\""),
        "{status}"
    );
    let (code, created) = send(
        &client,
        "POST",
        &format!("{GV}/namespaces/dev/networks"),
        json!({"apiVersion": "network.deckhouse.io/v1alpha1", "kind": "Network",
            "metadata": {"name": "db-net"}, "spec": {"networkClass": "project-vlans", "vlan": {"id": 601}}}),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["metadata"]["namespace"], "dev");
}

#[tokio::test]
async fn kubevirt_does_not_serve_the_sdn_group() {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![fixture("kubevirt.yaml")],
        ..Default::default()
    })
    .await
    .unwrap();
    let client = client(&emu).await;
    let (code, _) = send(&client, "GET", GV, Value::Null).await;
    assert_eq!(code, 404);
}
