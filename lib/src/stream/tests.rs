use super::*;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

fn kv(kind: StreamKind) -> StreamTarget {
    StreamTarget::new(Flavor::KubeVirt, "prod", "web", kind)
}

fn dh(kind: StreamKind) -> StreamTarget {
    StreamTarget::new(Flavor::Deckhouse, "prod", "web", kind)
}

// Expected paths from KubeVirt FACTS §2 (routes table, `buildPortForwardResourcePath`) and
// Deckhouse FACTS §9 (URL template, portforward query).
#[test]
fn kubevirt_paths_and_subprotocol() {
    assert_eq!(
        kv(StreamKind::Console).uri(),
        "/apis/subresources.kubevirt.io/v1/namespaces/prod/virtualmachineinstances/web/console"
    );
    let mut vnc = kv(StreamKind::Vnc);
    assert_eq!(
        vnc.uri(),
        "/apis/subresources.kubevirt.io/v1/namespaces/prod/virtualmachineinstances/web/vnc"
    );
    vnc.preserve_session = true;
    assert_eq!(vnc.query(), "preserveSession=true");
    let pf = kv(StreamKind::PortForward {
        port: 22,
        protocol: "tcp".into(),
    });
    assert_eq!(
        pf.uri(),
        "/apis/subresources.kubevirt.io/v1/namespaces/prod/virtualmachines/web/portforward/22/tcp"
    );
    assert_eq!(pf.subprotocol(), "plain.kubevirt.io");
}

#[test]
fn deckhouse_paths_and_subprotocol() {
    assert_eq!(
        dh(StreamKind::Console).uri(),
        "/apis/subresources.virtualization.deckhouse.io/v1alpha2/namespaces/prod/virtualmachines/web/console"
    );
    let mut vnc = dh(StreamKind::Vnc);
    vnc.preserve_session = true; // KubeVirt only: not sent to Deckhouse
    assert_eq!(vnc.query(), "");
    let pf = dh(StreamKind::PortForward {
        port: 22,
        protocol: "tcp".into(),
    });
    assert_eq!(
        pf.uri(),
        "/apis/subresources.virtualization.deckhouse.io/v1alpha2/namespaces/prod/virtualmachines/web/portforward?port=22&protocol=tcp"
    );
    assert_eq!(pf.subprotocol(), "plain.virtualization.deckhouse.io");
}

#[test]
fn pre_upgrade_errors_read_like_api_errors() {
    let target = dh(StreamKind::Console);
    let status = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"virtualmachines.virtualization.deckhouse.io \"web\" not found","reason":"NotFound","code":404}"#;
    let err = pre_upgrade_error(StatusCode::NOT_FOUND, status, &target.action(), "");
    assert!(err.is_not_found());
    assert_eq!(
        err.to_string(),
        "virtualmachine \"web\" not found in namespace \"prod\""
    );
    // virt-api's 400 while the VMI boots (FACTS §2.2) means wait and retry.
    let status = br#"{"kind":"Status","status":"Failure","message":"Unable to connect to VirtualMachineInstance because phase is Scheduling instead of Running or Scheduled","reason":"BadRequest","code":400}"#;
    let err = pre_upgrade_error(
        StatusCode::BAD_REQUEST,
        status,
        &kv(StreamKind::Console).action(),
        "",
    );
    assert!(matches!(err, Error::NotRunning(_)), "{err:?}");
    let status = br#"{"kind":"Status","message":"VirtualMachine is not Running or Migrating","reason":"BadRequest","code":400}"#;
    assert!(matches!(
        pre_upgrade_error(StatusCode::BAD_REQUEST, status, &target.action(), ""),
        Error::NotRunning(_)
    ));
    // Other 400s are final.
    let status = br#"{"kind":"Status","message":"No serial consoles are present.","reason":"BadRequest","code":400}"#;
    let err = pre_upgrade_error(StatusCode::BAD_REQUEST, status, &target.action(), "");
    assert_eq!(
        err.to_string(),
        "the server answered 400 BadRequest: No serial consoles are present."
    );
    // A body that is not a Status still gives one line.
    let err = pre_upgrade_error(
        StatusCode::BAD_GATEWAY,
        b"upstream\nconnect error",
        &target.action(),
        "",
    );
    assert_eq!(
        err.to_string(),
        "the server answered 502 BadGateway: upstream connect error"
    );
}

/// A connected client/server websocket pair over an in-memory pipe.
async fn pair(ping: Duration) -> (PlatformStream, WebSocketStream<tokio::io::DuplexStream>) {
    let (a, b) = tokio::io::duplex(65536);
    let client = WebSocketStream::from_raw_socket(a, Role::Client, None).await;
    let server = WebSocketStream::from_raw_socket(b, Role::Server, None).await;
    (start(client, ping, KUBEVIRT_SUBPROTOCOL), server)
}

#[tokio::test]
async fn binary_both_ways_text_skipped_close_code_kept() {
    let (mut stream, mut server) = pair(Duration::from_secs(15)).await;
    stream.io.write_all(b"uname\r").await.unwrap();
    let got = server.next().await.unwrap().unwrap();
    assert_eq!(got, Message::Binary(b"uname\r".to_vec().into()));
    server.send(Message::Text("ignored".into())).await.unwrap();
    server
        .send(Message::Binary(b"Linux\r\n".to_vec().into()))
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let n = stream.io.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"Linux\r\n");
    server
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Away,
            reason: "displaced".into(),
        })))
        .await
        .unwrap();
    assert_eq!(
        stream.io.read(&mut buf).await.unwrap(),
        0,
        "EOF after close"
    );
    let end = stream.ended().await;
    assert_eq!(
        end,
        StreamEnd::Closed {
            code: 1001,
            reason: "displaced".into()
        }
    );
    assert!(end.describe().contains("another user connected"));
}

use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

#[tokio::test]
async fn dropped_connection_is_abnormal() {
    let (mut stream, server) = pair(Duration::from_secs(15)).await;
    drop(server);
    let mut buf = [0u8; 8];
    assert_eq!(stream.io.read(&mut buf).await.unwrap(), 0);
    let end = stream.ended().await;
    assert_eq!(end.code(), 1006, "{end:?}");
}

#[tokio::test]
async fn pings_are_sent_and_server_pings_answered() {
    let (stream, mut server) = pair(Duration::from_millis(300)).await;
    server
        .send(Message::Ping(b"hi".to_vec().into()))
        .await
        .unwrap();
    // The client's pong to our ping, then its own ping after the interval.
    let first = server.next().await.unwrap().unwrap();
    assert_eq!(first, Message::Pong(b"hi".to_vec().into()));
    let second = tokio::time::timeout(Duration::from_secs(5), server.next())
        .await
        .expect("a ping within the interval")
        .unwrap()
        .unwrap();
    assert!(matches!(second, Message::Ping(_)), "{second:?}");
    drop(stream);
}

#[tokio::test]
async fn local_shutdown_closes_normally() {
    let (mut stream, mut server) = pair(Duration::from_secs(15)).await;
    stream.io.shutdown().await.unwrap();
    match server.next().await.unwrap().unwrap() {
        Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Normal),
        other => panic!("expected a close frame, got {other:?}"),
    }
    drop(server);
    assert_eq!(stream.ended().await, StreamEnd::Local);
}

/// A local reader that stalls longer than the liveness limit (three pings) must not make a
/// healthy server look dead: the time the pump waits for the reader is not server silence.
#[tokio::test(start_paused = true)]
async fn a_stalled_reader_does_not_kill_a_healthy_stream() {
    let (mut stream, server) = pair(Duration::from_millis(100)).await;
    let (mut sink, mut frames) = server.split();
    // More than the duplex holds in one frame: the pump blocks writing it.
    let big = vec![7u8; 64 * 1024];
    sink.send(Message::Binary(big.clone().into()))
        .await
        .unwrap();
    // The server keeps reading (answering pings) all along.
    let server = tokio::spawn(async move {
        while let Some(Ok(m)) = frames.next().await {
            if m.is_close() {
                break;
            }
        }
        sink
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut got = vec![0u8; big.len()];
    stream.io.read_exact(&mut got).await.unwrap();
    assert_eq!(got, big);
    // Several ping intervals later the stream is still up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(*stream.end.borrow(), None, "declared dead");
    stream.io.shutdown().await.unwrap();
    assert_eq!(stream.ended().await, StreamEnd::Local);
    drop(server.await.unwrap());
}

/// Data the server sends after our close frame (it was on its way) reaches the reader.
#[tokio::test]
async fn frames_during_the_close_wait_are_delivered() {
    let (mut stream, mut server) = pair(Duration::from_secs(15)).await;
    let (mut rd, mut wr) = tokio::io::split(stream.io);
    wr.write_all(b"req").await.unwrap();
    wr.shutdown().await.unwrap();
    assert_eq!(
        server.next().await.unwrap().unwrap(),
        Message::Binary(b"req".to_vec().into())
    );
    // The reply leaves before the server reads our close frame (then answers it).
    server
        .send(Message::Binary(b"reply".to_vec().into()))
        .await
        .unwrap();
    assert!(server.next().await.unwrap().unwrap().is_close());
    let _ = server.close(None).await;
    let mut got = Vec::new();
    rd.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"reply");
    stream.io = rd.unsplit(wr);
    assert_eq!(stream.ended().await, StreamEnd::Local);
}

/// A reader stalled past the server's keep-alive deadline (virt-api drops a connection whose
/// pong is a minute late) keeps its session: the pump holds what arrives meanwhile and answers
/// pings. Found by bench/soak.sh (issue 37): an ssh session whose output was not read for 60 s
/// died with 4 MiB of 64 delivered.
#[tokio::test]
async fn pings_are_answered_while_the_reader_is_stalled() {
    let (mut stream, mut server) = pair(Duration::from_secs(15)).await;
    // Far more than the pump's duplex holds: before, the pump blocked writing it and read no
    // more frames, so the server's ping went unanswered.
    let chunk = vec![5u8; 32 * 1024];
    let sent = tokio::time::timeout(Duration::from_secs(5), async {
        for _ in 0..64 {
            server
                .send(Message::Binary(chunk.clone().into()))
                .await
                .unwrap();
        }
        server
            .send(Message::Ping(b"alive?".to_vec().into()))
            .await
            .unwrap();
    })
    .await;
    assert!(sent.is_ok(), "the pump stopped reading the server");
    let pong = tokio::time::timeout(Duration::from_secs(5), server.next())
        .await
        .expect("a pong while nobody reads")
        .unwrap()
        .unwrap();
    assert_eq!(pong, Message::Pong(b"alive?".to_vec().into()));
    // Everything arrives, in order, once the reader reads.
    let mut got = vec![0u8; 64 * chunk.len()];
    stream.io.read_exact(&mut got).await.unwrap();
    assert!(got.iter().all(|&b| b == 5));
    drop(server);
    let mut rest = Vec::new();
    stream.io.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
}

/// What the server sent before it dropped the connection still reaches a slow reader.
#[tokio::test]
async fn held_data_is_delivered_when_the_server_drops() {
    let (mut stream, mut server) = pair(Duration::from_secs(15)).await;
    let chunk = vec![9u8; 32 * 1024];
    for _ in 0..8 {
        server
            .send(Message::Binary(chunk.clone().into()))
            .await
            .unwrap();
    }
    server.flush().await.unwrap();
    drop(server);
    let mut got = Vec::new();
    stream.io.read_to_end(&mut got).await.unwrap();
    assert_eq!(got.len(), 8 * chunk.len());
    assert_eq!(stream.ended().await.code(), 1006);
}
