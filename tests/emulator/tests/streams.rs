//! Console, VNC and the Deckhouse session probe, driven over real websockets through kube's
//! HTTP stack: subprotocols, Status errors before the upgrade, last-connect-wins without a
//! close frame, text frames skipped, a guest that outlives a connection and dies with its VM.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use kube::client::Body;
use kubevm_emulator::ServeFlavor;
use kubevm_emulator::core::expect::Unmatched;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::common;
use common::{Ws, dial, start};

/// A console websocket with the output read from it and not yet matched.
struct Console {
    ws: Ws,
    rest: Unmatched,
}

fn console(ws: Ws) -> Console {
    Console {
        ws,
        rest: Unmatched::default(),
    }
}

/// Reads binary frames until `text` has appeared; returns the output up to and including it
/// and keeps what followed for the next call.
async fn expect(c: &mut Console, text: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(seen) = c.rest.take_through(text) {
            return seen;
        }
        match tokio::time::timeout_at(deadline, c.ws.next()).await {
            Ok(Some(Ok(Message::Binary(b)))) => c.rest.push(&b),
            Ok(Some(Ok(_))) => {}
            other => panic!(
                "waiting for {text:?}: {other:?}; seen {:?}",
                c.rest.pending()
            ),
        }
    }
}

async fn send(c: &mut Console, text: &str) {
    c.ws.send(Message::Binary(text.as_bytes().to_vec().into()))
        .await
        .unwrap();
}

const KV_CONSOLE: &str =
    "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/web/console";
const DH_CONSOLE: &str = "/apis/subresources.virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualmachines/linux-vm/console";

/// Waits (20 s at most: a loaded machine is slow, a hang is still caught) for `ws` to be cut without a close frame (1006), as virt-handler cuts a
/// displaced or restarted console. Output the guest printed before the cut (a prompt after the
/// last command) may still arrive first and is skipped.
async fn expect_cut<S>(ws: &mut S)
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("the stream was not cut within 20 s")
        {
            Some(Err(_)) | None => return,
            Some(Ok(Message::Close(f))) => panic!("the stream ended with a close frame {f:?}"),
            Some(Ok(Message::Binary(_)))
            | Some(Ok(Message::Ping(_)))
            | Some(Ok(Message::Pong(_))) => {}
            Some(Ok(other)) => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn kubevirt_console_login_last_wins_and_restart() {
    let (emu, client) = start(ServeFlavor::KubeVirt).await;
    let (ws, echoed) = dial(&client, KV_CONSOLE, "plain.kubevirt.io")
        .await
        .unwrap();
    let mut first = console(ws);
    assert_eq!(echoed.as_deref(), Some("plain.kubevirt.io"));
    send(&mut first, "\r").await;
    expect(&mut first, "web login: ").await;
    // Text frames are skipped, binary ones typed.
    first
        .ws
        .send(Message::Text("ignored\r".into()))
        .await
        .unwrap();
    send(&mut first, "cloud\r").await;
    expect(&mut first, "Password: ").await;
    send(&mut first, "cloud\r").await;
    expect(&mut first, "cloud@web:~$ ").await;
    send(&mut first, "echo marker-$((20+22))\r").await;
    expect(&mut first, "marker-42").await;

    // A second connection takes over; the first is cut without a close frame (1006).
    let (ws, _) = dial(&client, KV_CONSOLE, "plain.kubevirt.io")
        .await
        .unwrap();
    let mut second = console(ws);
    expect_cut(&mut first.ws).await;
    // Same guest: still logged in.
    send(&mut second, "echo again-$((1+1))\r").await;
    expect(&mut second, "again-2").await;

    // The VM restarts (its VMI is replaced): the stream drops, the next one sees a new boot.
    let vmi = emu.objects("kubevirt.io", "virtualmachineinstances", Some("default"));
    let mut vmi = vmi
        .into_iter()
        .find(|v| v["metadata"]["name"] == "web")
        .unwrap();
    vmi["metadata"]["uid"] = "00000000-0000-0000-0000-00000000beef".into();
    emu.put_object(vmi);
    expect_cut(&mut second.ws).await;
    let (ws, _) = dial(&client, KV_CONSOLE, "plain.kubevirt.io")
        .await
        .unwrap();
    let mut third = console(ws);
    send(&mut third, "\r").await;
    expect(&mut third, "web login: ").await;
    emu.shutdown().await;
}

#[tokio::test]
async fn kubevirt_errors_before_the_upgrade_are_status_json() {
    let (emu, client) = start(ServeFlavor::KubeVirt).await;
    let missing = KV_CONSOLE.replace("/web/", "/nope/");
    let (code, status) = dial(&client, &missing, "plain.kubevirt.io")
        .await
        .err()
        .unwrap();
    assert_eq!(code, 404);
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["reason"], "NotFound");
    // A VMI that is not running: 400, which clients retry.
    let vmi = emu.objects("kubevirt.io", "virtualmachineinstances", Some("default"));
    let mut vmi = vmi
        .into_iter()
        .find(|v| v["metadata"]["name"] == "web")
        .unwrap();
    vmi["status"]["phase"] = "Scheduling".into();
    emu.put_object(vmi);
    let (code, status) = dial(&client, KV_CONSOLE, "plain.kubevirt.io")
        .await
        .err()
        .unwrap();
    assert_eq!(code, 400);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("phase is Scheduling"),
        "{status}"
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn kubevirt_vnc_preserve_session_and_rfb_handshake() {
    let (emu, client) = start(ServeFlavor::KubeVirt).await;
    let vnc = KV_CONSOLE.replace("/console", "/vnc");
    let (mut ws, _) = dial(&client, &vnc, "plain.kubevirt.io").await.unwrap();
    let version = match ws.next().await.unwrap().unwrap() {
        Message::Binary(b) => b,
        other => panic!("{other:?}"),
    };
    assert_eq!(&version[..], b"RFB 003.008\n");
    let (code, status) = dial(
        &client,
        &format!("{vnc}?preserveSession=true"),
        "plain.kubevirt.io",
    )
    .await
    .err()
    .unwrap();
    assert_eq!(code, 500);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("Active VNC connection. Request denied."),
        "{status}"
    );
    drop(ws);
    emu.shutdown().await;
}

#[tokio::test]
async fn deckhouse_probe_reports_the_holder_from_a_lease() {
    let (emu, client) = start(ServeFlavor::Deckhouse).await;
    let probe = |client: kube::Client| async move {
        let request = http::Request::get(format!("{DH_CONSOLE}?probe=true"))
            .body(Body::empty())
            .unwrap();
        let response = client.send(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect_bytes().await.unwrap();
        serde_json::from_slice::<Value>(&body).unwrap()
    };
    let empty = probe(client.clone()).await;
    assert_eq!(empty["kind"], "VirtualMachineSession");
    assert!(empty.get("holder").is_none(), "{empty}");

    let (ws, echoed) = dial(&client, DH_CONSOLE, "plain.virtualization.deckhouse.io")
        .await
        .unwrap();
    let mut ws = console(ws);
    assert_eq!(echoed.as_deref(), Some("plain.virtualization.deckhouse.io"));
    send(&mut ws, "\r").await;
    expect(&mut ws, "linux-vm login: ").await;
    let held = probe(client.clone()).await;
    assert_eq!(held["holder"], "admin");
    assert!(held["startTime"].as_str().unwrap().ends_with('Z'));
    let leases = emu.objects("coordination.k8s.io", "leases", Some("default"));
    let vm_uid = emu.objects(
        "virtualization.deckhouse.io",
        "virtualmachines",
        Some("default"),
    )[0]["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let lease = leases
        .iter()
        .find(|l| l["metadata"]["name"] == format!("d8v-vm-console-linux-vm-{vm_uid}"))
        .expect("session lease");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 30);

    // Displacing the holder: a Warning event on the VM.
    let (_second, _) = dial(&client, DH_CONSOLE, "plain.virtualization.deckhouse.io")
        .await
        .unwrap();
    let events = emu.objects("", "events", Some("default"));
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "ConsoleSessionPreempted" && e["type"] == "Warning"),
        "{events:?}"
    );
    // Not running: 400 with Deckhouse's message.
    let mut vm = emu.objects(
        "virtualization.deckhouse.io",
        "virtualmachines",
        Some("default"),
    )[0]
    .clone();
    vm["status"]["phase"] = "Stopped".into();
    emu.put_object(vm);
    let (code, status) = dial(&client, DH_CONSOLE, "plain.virtualization.deckhouse.io")
        .await
        .err()
        .unwrap();
    assert_eq!(
        (code, status["message"].as_str()),
        (400, Some("VirtualMachine is not Running or Migrating"))
    );
    emu.shutdown().await;
}
