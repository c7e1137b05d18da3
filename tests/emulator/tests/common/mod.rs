//! What the emulator's integration tests share: an emulator with a kube client, a raw
//! websocket upgrade through kube's HTTP stack, and real kubectl (`kubectl`).
// Each test binary uses a part of this module.
#![allow(dead_code)]

pub mod kubectl;

use hyper_util::rt::TokioIo;
use kube::client::Body;
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use serde_json::Value;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::protocol::Role;

pub type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

pub fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

pub async fn start(flavor: ServeFlavor) -> (Emulator, kube::Client) {
    let file = match flavor {
        ServeFlavor::Deckhouse => "deckhouse.yaml",
        _ => "kubevirt.yaml",
    };
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![fixture(file)],
        flavor,
        ..Default::default()
    })
    .await
    .unwrap();
    let client = client(&emu).await;
    (emu, client)
}

/// An emulator serving fixture `fixture_name` whose imports (CDI, Deckhouse images and disks)
/// move one step every 20 ms, with a kube client.
pub async fn start_importing(flavor: ServeFlavor, fixture_name: &str) -> (Emulator, kube::Client) {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![fixture(fixture_name)],
        flavor,
        import_step: std::time::Duration::from_millis(20),
        ..Default::default()
    })
    .await
    .unwrap();
    let client = client(&emu).await;
    (emu, client)
}

/// Creates `object` through `api`; panics on any refusal.
pub async fn create(api: &kube::Api<kube::api::DynamicObject>, object: Value) {
    let object: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
    api.create(&Default::default(), &object).await.unwrap();
}

/// A kube client for the emulator's kubeconfig (its current context: admin, namespace default).
pub async fn client(emu: &Emulator) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&emu.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// Upgrades `path` with `protocol`; Err((status, body)) when the server refuses.
pub async fn dial(
    client: &kube::Client,
    path: &str,
    protocol: &str,
) -> Result<(Ws, Option<String>), (u16, Value)> {
    let request = http::Request::get(path)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", generate_key())
        .header("sec-websocket-protocol", protocol)
        .body(Body::empty())
        .unwrap();
    let response = client.send(request).await.unwrap();
    if response.status() != 101 {
        let code = response.status().as_u16();
        let body = response.into_body().collect_bytes().await.unwrap();
        return Err((code, serde_json::from_slice(&body).unwrap_or(Value::Null)));
    }
    let echoed = response
        .headers()
        .get("sec-websocket-protocol")
        .map(|v| v.to_str().unwrap().to_owned());
    let upgraded = hyper::upgrade::on(response).await.unwrap();
    let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await;
    Ok((ws, echoed))
}
