use super::*;

#[test]
fn durations_read_like_flags() {
    assert_eq!(human(Duration::from_secs(300)), "5m");
    assert_eq!(human(Duration::from_secs(90)), "90s");
}

#[tokio::test]
async fn escape_byte_ends_the_session_and_only_what_came_before_is_sent() {
    let (a, b) = tokio::io::duplex(1024);
    let client = tokio_tungstenite::WebSocketStream::from_raw_socket(
        a,
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    let mut server = tokio_tungstenite::WebSocketStream::from_raw_socket(
        b,
        tokio_tungstenite::tungstenite::protocol::Role::Server,
        None,
    )
    .await;
    let mut stream = crate::stream::start(client, Duration::from_secs(15), "plain.kubevirt.io");
    let plan = ConsolePlan::new(Flavor::KubeVirt, "default", "web", Duration::from_secs(1));
    assert_eq!(send(&plan, &mut stream, b"ls\r").await, None);
    assert_eq!(
        send(&plan, &mut stream, b"ab\x1dcd").await,
        Some(ConsoleEnd::Escaped)
    );
    use futures::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    // The byte pipe may coalesce writes; what counts is the bytes, then a normal close.
    let mut got = Vec::new();
    loop {
        match server.next().await.unwrap().unwrap() {
            Message::Binary(b) => got.extend_from_slice(&b),
            Message::Close(_) => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, b"ls\rab");
    // Piped sessions have no escape byte.
    let mut piped = plan.clone();
    piped.escape = None;
    let (a, _b) = tokio::io::duplex(1024);
    let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
        a,
        tokio_tungstenite::tungstenite::protocol::Role::Client,
        None,
    )
    .await;
    let mut stream = crate::stream::start(ws, Duration::from_secs(15), "plain.kubevirt.io");
    assert_eq!(send(&piped, &mut stream, b"\x1d").await, None);
}
