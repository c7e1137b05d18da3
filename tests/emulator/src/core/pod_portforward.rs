//! `pods/NAME/portforward` as the API server and kubelet serve it.
//!
//! Upstream: `pkg/registry/core/pod/rest/subresources.go` (`PortForwardREST`, proxied to the
//! kubelet), `pkg/kubelet/cri/streaming/portforward/websocket.go`, `httpstream.go` and
//! `k8s.io/apimachinery/pkg/util/httpstream/wsstream/conn.go`:
//! - for the channel protocol the ports come from the query parameter `ports` (repeated or
//!   comma-separated); none is 400 `query parameter "port" is required` (SPDY names the port
//!   in each stream's headers instead); the pod must be on a node and running;
//! - WebSocket subprotocols `v4.channel.k8s.io` (binary) and `v4.base64.channel.k8s.io`; the
//!   server picks the first of the client's it supports (kube-rs offers v5 then v4: v4 is
//!   chosen, v5 is not a port-forward protocol);
//! - per requested port two channels: data `2i` and error `2i+1`; each message starts with its
//!   channel byte; the server's first message on each channel is the port number as two bytes,
//!   little-endian; then data flows both ways on the data channel, and a failure to reach the
//!   port is a text on the error channel;
//! - `SPDY/3.1+portforward.k8s.io` (kubectl ≥ 1.31: SPDY tunnelled in WebSocket binary
//!   messages, `PortForwardWebsockets`) is served by [`crate::core::spdy`].
//!
//! Only exporter pods (`export_pods.rs`) listen: a connection to their port is served by the
//! export server; any other port or pod is refused like a closed port (kubelet's
//! `failed to connect to localhost:PORT inside namespace …: connection refused`).

use crate::core::app::App;
use crate::core::auth::User;
use crate::core::status::ApiError;
use crate::kubevirt::export_pods::{PodTarget, target_of};
use axum::extract::FromRequestParts;
use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// Buffer of the in-memory connection between a forwarded port and the export server.
const PIPE: usize = 256 * 1024;
/// Largest data message sent to the client.
const FRAME: usize = 64 * 1024;

/// The WebSocket subprotocols served, in the server's order of preference.
pub const PROTOCOLS: [&str; 2] = [crate::core::spdy::TUNNEL_PROTOCOL, "v4.channel.k8s.io"];

/// The ports of a request (`ports=8443&ports=80` or `ports=8443,80`).
pub fn parse_ports(query: &str) -> Result<Vec<u16>, ApiError> {
    let mut ports = vec![];
    for (k, v) in url_pairs(query) {
        if k != "ports" {
            continue;
        }
        for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match p.parse::<u16>() {
                Ok(n) if n > 0 => ports.push(n),
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "unable to parse \"{p}\" as a port: port must be in the range 1-65535"
                    )));
                }
            }
        }
    }
    if ports.is_empty() {
        return Err(ApiError::bad_request(
            "query parameter \"port\" is required",
        ));
    }
    Ok(ports)
}

fn url_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let decode = |s: &str| {
                percent_decode(s)
                    .unwrap_or_else(|| s.to_string())
                    .replace('+', " ")
            };
            (decode(k), decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The kubelet's text for a port nothing listens on.
pub fn refused(pod: &Value, port: u16) -> String {
    format!(
        "error forwarding port {port} to pod {}, uid : failed to connect to localhost:{port} inside namespace \"{}\", IPv4: dial tcp4 127.0.0.1:{port}: connect: connection refused IPv6 dial tcp6: address localhost: no suitable address",
        crate::core::util::meta_str(pod, "uid"),
        crate::core::util::meta_str(pod, "name"),
    )
}

/// Opens a connection to `port` of `pod`: an in-memory stream served by the export server, or
/// the kubelet's refusal.
pub fn dial(app: &Arc<App>, pod: &Value, port: u16) -> Result<DuplexStream, String> {
    if crate::kubevirt::upload_server::is_proxy(pod, port) {
        let (client, server) = tokio::io::duplex(PIPE);
        tokio::spawn(crate::kubevirt::upload_server::serve_stream(
            app.clone(),
            server,
        ));
        return Ok(client);
    }
    if let Some(uid) = crate::deckhouse::upload::uploader_target(pod, port) {
        let (client, server) = tokio::io::duplex(PIPE);
        tokio::spawn(crate::deckhouse::upload::serve_pod_stream(
            app.clone(),
            server,
            uid,
        ));
        return Ok(client);
    }
    let target: PodTarget = target_of(pod, port).ok_or_else(|| refused(pod, port))?;
    let (client, server) = tokio::io::duplex(PIPE);
    tokio::spawn(crate::kubevirt::export_server::serve_pod_stream(
        app.clone(),
        server,
        target,
    ));
    Ok(client)
}

/// Serves one `pods/{name}/portforward` request.
pub async fn serve(
    app: &Arc<App>,
    parts: &mut http::request::Parts,
    user: &User,
    ns: &str,
    name: &str,
) -> Result<Response, ApiError> {
    let pod = crate::core::podexec::authorized_pod(app, user, ns, name, "portforward")?;
    // SPDY carries the port in each stream's headers; the channel protocol needs the query.
    let query = parts.uri.query().unwrap_or_default().to_string();
    crate::core::podexec::require_host(&pod, name)?;
    if pod["status"]["phase"] != "Running" {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade connection: pod {name} is not running"
        )));
    }
    let upgrade = WebSocketUpgrade::from_request_parts(parts, &())
        .await
        .map_err(|_| ApiError::bad_request("Upgrade request required"))?
        .protocols(PROTOCOLS);
    let protocol = upgrade
        .selected_protocol()
        .and_then(|p| p.to_str().ok())
        .map(String::from)
        .ok_or_else(|| {
            ApiError::bad_request(
                "unable to upgrade: no supported port-forward protocol (v4.channel.k8s.io, SPDY/3.1+portforward.k8s.io) offered",
            )
        })?;
    let app = app.clone();
    let upgrade = upgrade.max_message_size(16 << 20);
    if protocol == crate::core::spdy::TUNNEL_PROTOCOL {
        return Ok(
            upgrade.on_upgrade(move |socket| crate::core::spdy::serve_tunnel(app, socket, pod))
        );
    }
    let ports = parse_ports(&query)?;
    Ok(upgrade.on_upgrade(move |socket| channels(app, socket, pod, ports)))
}

/// The `v4.channel.k8s.io` protocol: two channels per port over one WebSocket.
async fn channels(
    app: Arc<App>,
    socket: axum::extract::ws::WebSocket,
    pod: Value,
    ports: Vec<u16>,
) {
    let (mut sink, mut source) = socket.split();
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    // The port number opens every channel.
    for (i, port) in ports.iter().enumerate() {
        for ch in [2 * i as u8, 2 * i as u8 + 1] {
            let mut m = vec![ch];
            m.extend_from_slice(&port.to_le_bytes());
            if sink.send(Message::Binary(m.into())).await.is_err() {
                return;
            }
        }
    }
    let mut writers: Vec<Option<tokio::io::WriteHalf<DuplexStream>>> = vec![];
    let mut open = 0usize;
    for (i, port) in ports.iter().enumerate() {
        match dial(&app, &pod, *port) {
            Ok(conn) => {
                let (mut r, w) = tokio::io::split(conn);
                writers.push(Some(w));
                open += 1;
                let tx = out_tx.clone();
                let ch = 2 * i as u8;
                tokio::spawn(async move {
                    let mut buf = vec![0u8; FRAME];
                    buf[0] = ch;
                    loop {
                        match r.read(&mut buf[1..]).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if tx.send(buf[..n + 1].to_vec()).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    // An empty message on the data channel marks this port done.
                    let _ = tx.send(vec![]).await;
                });
            }
            Err(message) => {
                writers.push(None);
                let mut m = vec![2 * i as u8 + 1];
                m.extend_from_slice(message.as_bytes());
                let _ = out_tx.send(m).await;
            }
        }
    }
    drop(out_tx);
    if open == 0 {
        while let Some(m) = out_rx.recv().await {
            let _ = sink.send(Message::Binary(m.into())).await;
        }
        let _ = sink.send(Message::Close(None)).await;
        return;
    }
    loop {
        tokio::select! {
            out = out_rx.recv() => match out {
                Some(m) if m.is_empty() => {
                    open -= 1;
                    if open == 0 {
                        break;
                    }
                }
                Some(m) => {
                    if sink.send(Message::Binary(m.into())).await.is_err() {
                        return;
                    }
                }
                None => break,
            },
            incoming = source.next() => match incoming {
                Some(Ok(Message::Binary(data))) if !data.is_empty() => {
                    let ch = data[0] as usize;
                    if ch.is_multiple_of(2)
                        && let Some(Some(w)) = writers.get_mut(ch / 2)
                        && w.write_all(&data[1..]).await.is_err()
                    {
                        writers[ch / 2] = None;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    // The client went away: close the forwarded connections.
                    for w in writers.iter_mut().flatten() {
                        let _ = w.shutdown().await;
                    }
                    return;
                }
                Some(Ok(_)) => {}
            },
        }
    }
    let _ = sink.send(Message::Close(None)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_like_the_kubelet() {
        assert_eq!(parse_ports("ports=8443").unwrap(), [8443]);
        assert_eq!(parse_ports("ports=80%2C443").unwrap(), [80, 443]);
        assert_eq!(parse_ports("ports=80&ports=81").unwrap(), [80, 81]);
        assert!(parse_ports("").is_err());
        assert!(parse_ports("ports=0").is_err());
        assert!(parse_ports("ports=x").is_err());
    }
}
