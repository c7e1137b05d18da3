//! The portforward subresource of both flavors: one websocket per connection to one guest port.
//!
//! Upstream (KubeVirt FACTS §2.2, `pkg/virt-api/rest/portforward.go`, `dialers.go`; Deckhouse
//! FACTS §4, §9, which proxies to KubeVirt):
//! - KubeVirt `virtualmachineinstances/{n}/portforward/{port}[/{protocol}]` and
//!   `virtualmachines/{n}/portforward/{port}[/{protocol}]`; Deckhouse
//!   `virtualmachines/{n}/portforward?port=P&protocol=tcp|udp`; protocol defaults to tcp;
//! - the guest is dialed before the upgrade: a paused VM gives 409 `VMI is paused`, a VM that
//!   does not run 400, a refused dial 500 `dialing VM: …`;
//! - virt-api terminates the websocket: binary frames both ways (text frames skipped), a ping
//!   every second, closed when no pong came for 60 s; one websocket = one TCP connection; for
//!   UDP every binary frame is one datagram and every datagram one frame.

use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use futures::{SinkExt, StreamExt};
use http::header;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::core::app::App;
use crate::core::guest::GuestConn;
use crate::core::handlers::{Query, ResourcePath};
use crate::core::status::ApiError;
use crate::core::store::Key;

const KUBEVIRT_SUB: &str = "subresources.kubevirt.io";
/// virt-api's ping period and pong deadline (`keepAliveTimeout`).
const PING_EVERY: Duration = Duration::from_secs(1);
const PONG_DEADLINE: Duration = Duration::from_secs(60);

/// Handles `portforward`; `None` for any other subresource.
pub async fn handle(
    app: &Arc<App>,
    rp: &ResourcePath,
    parts: &mut http::request::Parts,
    q: &Query,
) -> Option<Result<Response, ApiError>> {
    if rp.sub.first().map(String::as_str) != Some("portforward") {
        return None;
    }
    Some(open(app, rp, parts, q).await)
}

fn parse_target(rp: &ResourcePath, q: &Query) -> Result<(u16, String), ApiError> {
    let (port, protocol) = if rp.group == KUBEVIRT_SUB {
        (
            rp.sub.get(1).cloned().unwrap_or_default(),
            rp.sub.get(2).cloned().unwrap_or_else(|| "tcp".into()),
        )
    } else {
        (
            q.get("port").cloned().unwrap_or_default(),
            q.get("protocol").cloned().unwrap_or_else(|| "tcp".into()),
        )
    };
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request(format!("invalid port {port:?}")))?;
    if protocol != "tcp" && protocol != "udp" {
        return Err(ApiError::bad_request(format!(
            "unsupported protocol {protocol:?}"
        )));
    }
    Ok((port, protocol))
}

fn paused(app: &App, ns: &str, name: &str) -> bool {
    if app.ssh_switches.paused(ns, name) {
        return true;
    }
    let vmi = app.store.get(&Key::new(
        "kubevirt.io",
        "virtualmachineinstances",
        ns,
        name,
    ));
    let condition = vmi
        .as_ref()
        .and_then(|v| v.pointer("/status/conditions"))
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Paused")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        });
    let dh_phase = app
        .store
        .get(&Key::new(
            "virtualization.deckhouse.io",
            "virtualmachines",
            ns,
            name,
        ))
        .and_then(|v| {
            v.pointer("/status/phase")
                .and_then(Value::as_str)
                .map(str::to_owned)
        });
    condition || dh_phase.as_deref() == Some("Pause")
}

enum Conn {
    Tcp(GuestConn),
    Udp(tokio::net::UdpSocket),
}

async fn open(
    app: &Arc<App>,
    rp: &ResourcePath,
    parts: &mut http::request::Parts,
    q: &Query,
) -> Result<Response, ApiError> {
    let ns = rp.namespace.clone().unwrap_or_default();
    let name = rp.name.clone().unwrap_or_default();
    let deckhouse = rp.group != KUBEVIRT_SUB;
    let (port, protocol) = parse_target(rp, q)?;
    let upgrade = parts
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return Err(ApiError::bad_request("Upgrade request required"));
    }
    if paused(app, &ns, &name) {
        return Err(ApiError::new(409, "Conflict", "VMI is paused"));
    }
    let guest = app
        .guests
        .get_or_boot(app, &ns, &name)
        .map_err(|e| ApiError::internal(format!("cannot boot the guest: {e}")))?
        .ok_or_else(|| {
            ApiError::bad_request(if deckhouse {
                "VirtualMachine is not Running or Migrating".to_string()
            } else {
                format!("VirtualMachineInstance {name} is not running")
            })
        })?;
    let conn = if protocol == "tcp" {
        Conn::Tcp(
            guest
                .dial(port)
                .await
                .map_err(|e| ApiError::internal(format!("dialing VM: {e}")))?,
        )
    } else {
        let addr = guest
            .udp_addr(port)
            .await
            .map_err(|e| ApiError::internal(format!("dialing VM: {e}")))?;
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .map_err(|e| ApiError::internal(format!("dialing VM: {e}")))?;
        socket
            .connect(addr)
            .await
            .map_err(|e| ApiError::internal(format!("dialing VM: {e}")))?;
        Conn::Udp(socket)
    };
    let handshake = crate::core::streams::Handshake::check(parts, deckhouse)?;
    let on_upgrade = handshake.on_upgrade;
    let app = app.clone();
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            let ws = WebSocketStream::from_raw_socket(
                app.stream_faults
                    .wrap("portforward", TokioIo::new(upgraded)),
                Role::Server,
                None,
            )
            .await;
            match conn {
                Conn::Tcp(c) => pump_tcp(ws, c).await,
                Conn::Udp(s) => pump_udp(ws, s).await,
            }
        }
    });
    Ok(crate::core::streams::switching_protocols(
        &handshake.key,
        handshake.protocol,
    ))
}

type Ws = WebSocketStream<crate::core::faults::Faulty<TokioIo<hyper::upgrade::Upgraded>>>;

async fn pump_tcp(ws: Ws, conn: GuestConn) {
    let (mut sink, mut frames) = ws.split();
    let (mut rd, mut wr) = tokio::io::split(conn);
    let mut ping = tokio::time::interval(PING_EVERY);
    let mut last_pong = tokio::time::Instant::now();
    let mut buf = vec![0u8; 32 * 1024];
    let mut guest_open = true;
    loop {
        tokio::select! {
            _ = ping.tick() => {
                if last_pong.elapsed() > PONG_DEADLINE || sink.send(Message::Ping(Vec::new().into())).await.is_err() {
                    return;
                }
            }
            frame = frames.next() => match frame {
                Some(Ok(Message::Binary(data))) => {
                    if wr.write_all(&data).await.is_err() {
                        return;
                    }
                }
                Some(Ok(Message::Pong(_))) => last_pong = tokio::time::Instant::now(),
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    let _ = wr.shutdown().await;
                    let _ = sink.close().await;
                    return;
                }
                Some(Ok(_)) => {}
            },
            n = rd.read(&mut buf), if guest_open => match n {
                Ok(0) | Err(_) => {
                    guest_open = false;
                    // The guest closed: a normal close, as virt-api's copy ends.
                    let _ = sink.send(Message::Close(None)).await;
                }
                Ok(n) => {
                    if sink.send(Message::Binary(buf[..n].to_vec().into())).await.is_err() {
                        return;
                    }
                }
            },
        }
    }
}

async fn pump_udp(ws: Ws, socket: tokio::net::UdpSocket) {
    let (mut sink, mut frames) = ws.split();
    let mut ping = tokio::time::interval(PING_EVERY);
    let mut buf = vec![0u8; 65536];
    loop {
        tokio::select! {
            _ = ping.tick() => {
                if sink.send(Message::Ping(Vec::new().into())).await.is_err() {
                    return;
                }
            }
            frame = frames.next() => match frame {
                Some(Ok(Message::Binary(data))) => {
                    let _ = socket.send(&data).await;
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    let _ = sink.close().await;
                    return;
                }
                Some(Ok(_)) => {}
            },
            n = socket.recv(&mut buf) => {
                if let Ok(n) = n
                    && sink.send(Message::Binary(buf[..n].to_vec().into())).await.is_err()
                {
                    return;
                }
            }
        }
    }
}
