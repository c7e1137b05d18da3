//! The portforward subresource over real websockets through kube's HTTP stack: KubeVirt's
//! path form and Deckhouse's query form, TCP and UDP to the sshd guest's services, server
//! pings, 500 on a refused dial, 409 when paused, 400 on bad ports and protocols.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use kubevm_emulator::ServeFlavor;
use tokio_tungstenite::tungstenite::Message;

use crate::common;
use common::{Ws, dial, start};

const KV_PF: &str =
    "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/web/portforward";
const DH_PF: &str = "/apis/subresources.virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualmachines/linux-vm/portforward";

/// Reads binary frames until `n` bytes arrived, counting pings.
async fn read_n(ws: &mut Ws, n: usize) -> (Vec<u8>, usize) {
    let mut data = Vec::new();
    let mut pings = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while data.len() < n {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => data.extend_from_slice(&b),
            Ok(Some(Ok(Message::Ping(_)))) => pings += 1,
            Ok(Some(Ok(_))) => {}
            other => panic!("waiting for {n} bytes: {other:?}; got {data:?}"),
        }
    }
    (data, pings)
}

/// Reads frames until `n` pings arrived (no data expected meanwhile); returns how many came.
async fn read_pings(ws: &mut Ws, n: usize) -> usize {
    let mut pings = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pings < n {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Ping(_)))) => pings += 1,
            Ok(Some(Ok(Message::Pong(_)))) => {}
            other => panic!("waiting for {n} pings after {pings}: {other:?}"),
        }
    }
    pings
}

#[tokio::test]
async fn portforward_echo_sshd_ping_and_errors_kubevirt() {
    assert!(
        kubevm_emulator::core::sshd_guest::available(),
        "sshd guests need root, unshare and /usr/sbin/sshd (tests/tools/install-test-deps.sh)"
    );
    let (emu, client) = start(ServeFlavor::KubeVirt).await;
    // The protocol is always in the path; tcp to the echo port.
    let (mut ws, echoed) = dial(&client, &format!("{KV_PF}/7/tcp"), "plain.kubevirt.io")
        .await
        .unwrap();
    assert_eq!(echoed.as_deref(), Some("plain.kubevirt.io"));
    ws.send(Message::Binary(b"hello".to_vec().into()))
        .await
        .unwrap();
    let (data, _) = read_n(&mut ws, 5).await;
    assert_eq!(data, b"hello");
    // virt-api pings every second: two pings arrive on an idle stream.
    let pings = read_pings(&mut ws, 2).await;
    assert_eq!(pings, 2);
    // The stream still carries data after them.
    ws.send(Message::Binary(b"x".to_vec().into()))
        .await
        .unwrap();
    let (data, _) = read_n(&mut ws, 1).await;
    assert_eq!(data, b"x");
    // Port 22 is the guest's sshd.
    let (mut ssh, _) = dial(&client, &format!("{KV_PF}/22/tcp"), "plain.kubevirt.io")
        .await
        .unwrap();
    let (banner, _) = read_n(&mut ssh, 8).await;
    assert_eq!(&banner[..8], b"SSH-2.0-");
    // Nothing listens: 500 before the upgrade.
    let (code, status) = dial(&client, &format!("{KV_PF}/81/tcp"), "plain.kubevirt.io")
        .await
        .err()
        .unwrap();
    assert_eq!(code, 500);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("dialing VM: "),
        "{status}"
    );
    // Paused: 409.
    emu.set_guest_paused("default", "web", true);
    let (code, status) = dial(&client, &format!("{KV_PF}/22/tcp"), "plain.kubevirt.io")
        .await
        .err()
        .unwrap();
    assert_eq!(
        (code, status["message"].as_str()),
        (409, Some("VMI is paused"))
    );
}

#[tokio::test]
async fn portforward_query_and_udp_deckhouse() {
    assert!(
        kubevm_emulator::core::sshd_guest::available(),
        "sshd guests need root, unshare and /usr/sbin/sshd (tests/tools/install-test-deps.sh)"
    );
    let (_emu, client) = start(ServeFlavor::Deckhouse).await;
    let proto = "plain.virtualization.deckhouse.io";
    let (mut ws, _) = dial(&client, &format!("{DH_PF}?port=7&protocol=udp"), proto)
        .await
        .unwrap();
    ws.send(Message::Binary(b"dgram".to_vec().into()))
        .await
        .unwrap();
    let (data, _) = read_n(&mut ws, 5).await;
    assert_eq!(data, b"dgram");
    let (code, _) = dial(&client, &format!("{DH_PF}?port=0&protocol=tcp"), proto)
        .await
        .err()
        .unwrap();
    assert_eq!(code, 400);
    let (code, _) = dial(&client, &format!("{DH_PF}?port=7&protocol=sctp"), proto)
        .await
        .err()
        .unwrap();
    assert_eq!(code, 400);
}
