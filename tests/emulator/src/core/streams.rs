//! The websocket subresources: serial console and VNC on both flavors, and Deckhouse's
//! `?probe=true` session probe.
//!
//! Upstream behaviour (KubeVirt FACTS §2.2, Deckhouse FACTS §2.1 and §9):
//! - subprotocol `plain.kubevirt.io` / `plain.virtualization.deckhouse.io`, echoed when offered;
//! - payload in binary frames, text frames skipped, pings answered, no server pings on console;
//! - errors before the upgrade as a `Status` JSON (404 no such VMI/VM, 400 not running);
//! - last connect wins: a new connection closes the old one **without a close frame**
//!   (virt-handler's `newStopChan` closes the TCP connection, the old client sees 1006);
//! - KubeVirt VNC `preserveSession=true` with an active session: 500 Status carrying
//!   virt-handler's `Active VNC connection. Request denied.` (virt-api ≥ v1.8 `EnrichError`);
//! - Deckhouse records the holder in a Lease `d8v-vm-<kind>-<vm>-<uid>` (30 s, renewed),
//!   answers `GET …/console?probe=true` without upgrade with a `VirtualMachineSession`, and
//!   records a displacement as a Warning event `ConsoleSessionPreempted`/`VNCSessionPreempted`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::core::app::App;
use crate::core::auth::User;
use crate::core::guest::Guest;
use crate::core::handlers::{Query, ResourcePath, json_response};
use crate::core::status::ApiError;
use crate::core::store::Key;
use crate::core::util::{meta_str, now_unix, random_token};

const KUBEVIRT_SUB: &str = "subresources.kubevirt.io";
const DECKHOUSE: &str = "virtualization.deckhouse.io";
/// Seconds a Deckhouse session Lease is valid without renewal.
const LEASE_SECONDS: i64 = 30;

/// One open stream: how to end it, and who holds it.
struct Session {
    id: u64,
    kill: watch::Sender<bool>,
}

/// The open console/VNC streams of an emulator, one per VM and kind.
#[derive(Default)]
pub struct Sessions {
    open: Mutex<HashMap<(String, String, &'static str), Session>>,
    next: AtomicU64,
}

impl Sessions {
    /// Ends every stream of VM `namespace/name` without a close frame, as a network failure or
    /// a live migration does; the guest keeps running.
    pub fn drop_streams(&self, namespace: &str, name: &str) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(ns, n, _), session| {
            let hit = ns == namespace && n == name;
            if hit {
                let _ = session.kill.send(true);
            }
            !hit
        });
    }

    fn active(&self, key: &(String, String, &'static str)) -> bool {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(key)
    }

    /// Registers a new stream, ending the previous holder's without a close frame.
    fn take_over(&self, key: (String, String, &'static str)) -> (u64, watch::Receiver<bool>, bool) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (kill, killed) = watch::channel(false);
        let old = self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, Session { id, kill });
        let displaced = old.is_some();
        if let Some(old) = old {
            let _ = old.kill.send(true);
        }
        (id, killed, displaced)
    }

    fn release(&self, key: &(String, String, &'static str), id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.get(key).is_some_and(|s| s.id == id) {
            open.remove(key);
        }
    }
}

/// Handles `console`, `vnc` (and the Deckhouse probe) on an existing object; `None` for any
/// other subresource.
pub async fn handle(
    app: &Arc<App>,
    user: &User,
    rp: &ResourcePath,
    parts: &mut http::request::Parts,
    q: &Query,
) -> Option<Result<Response, ApiError>> {
    let kind: &'static str = match (rp.sub.first().map(String::as_str), rp.sub.len()) {
        (Some("console"), 1) => "console",
        (Some("vnc"), 1) => "vnc",
        // KubeVirt's `vnc/screenshot`: a PNG of the display of a running VMI.
        (Some("vnc"), 2) if rp.sub[1] == "screenshot" && rp.group == KUBEVIRT_SUB => {
            let ns = rp.namespace.clone().unwrap_or_default();
            let name = rp.name.clone().unwrap_or_default();
            if crate::core::guest::boot_id(app, &ns, &name).is_none() {
                return Some(Err(ApiError::bad_request("VMI is not running")));
            }
            let body = app
                .stream_faults
                .body("screenshot", crate::core::rfb::screenshot_png());
            let mut response = Response::new(body);
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("image/png"));
            return Some(Ok(response));
        }
        _ => return None,
    };
    Some(open(app, user, rp, parts, q, kind).await)
}

async fn open(
    app: &Arc<App>,
    user: &User,
    rp: &ResourcePath,
    parts: &mut http::request::Parts,
    q: &Query,
    kind: &'static str,
) -> Result<Response, ApiError> {
    let ns = rp.namespace.clone().unwrap_or_default();
    let name = rp.name.clone().unwrap_or_default();
    let deckhouse = rp.group != KUBEVIRT_SUB;
    let upgrade = is_upgrade(&parts.headers);
    if deckhouse && !upgrade && q.get("probe").is_some_and(|p| p == "true") {
        return Ok(probe(app, &ns, &name, kind));
    }
    if !upgrade {
        // What both servers answer to a plain GET (d8's probe treats it as "old server").
        return Err(ApiError::bad_request("Upgrade request required"));
    }
    if crate::core::guest::boot_id(app, &ns, &name).is_none() {
        return Err(ApiError::bad_request(if deckhouse {
            "VirtualMachine is not Running or Migrating".to_string()
        } else {
            let phase = app
                .store
                .get(&Key::new(
                    "kubevirt.io",
                    "virtualmachineinstances",
                    &ns,
                    &name,
                ))
                .and_then(|v| {
                    v.pointer("/status/phase")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| "Pending".into());
            format!(
                "Unable to connect to VirtualMachineInstance because phase is {phase} instead of Running or Scheduled"
            )
        }));
    }
    let key = (ns.clone(), name.clone(), kind);
    if !deckhouse
        && kind == "vnc"
        && q.get("preserveSession").is_some_and(|p| p == "true")
        && app.sessions.active(&key)
    {
        return Err(ApiError::internal(
            "Can't connect to websocket (503): Active VNC connection. Request denied.",
        ));
    }
    let guest = app
        .guests
        .get_or_boot(app, &ns, &name)
        .map_err(|e| ApiError::internal(format!("cannot boot the guest: {e}")))?
        .ok_or_else(|| ApiError::bad_request("VMI is not running"))?;
    let handshake = Handshake::check(parts, deckhouse)?;
    let on_upgrade = handshake.on_upgrade;
    let (id, killed, displaced) = app.sessions.take_over(key.clone());
    let lease = deckhouse.then(|| {
        let client = parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        hold_lease(app, &ns, &name, kind, &user.name, &client, displaced)
    });
    let app = app.clone();
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            let ws = WebSocketStream::from_raw_socket(
                app.stream_faults.wrap(kind, TokioIo::new(upgraded)),
                Role::Server,
                None,
            )
            .await;
            let renew = lease
                .clone()
                .map(|l| tokio::spawn(renew_lease(app.clone(), l)));
            match kind {
                "console" => console(ws, guest, killed).await,
                _ => vnc(ws, guest, killed, &format!("{}/{}", key.0, key.1)).await,
            }
            if let Some(r) = renew {
                r.abort();
            }
        }
        app.sessions.release(&key, id);
        if let Some(lease) = lease {
            release_lease(&app, &lease);
        }
    });
    Ok(switching_protocols(&handshake.key, handshake.protocol))
}

/// A websocket upgrade request to a platform stream, checked as virt-api's (gorilla) Upgrader
/// checks it; shared by console, VNC and port-forward.
pub(crate) struct Handshake {
    /// `Sec-WebSocket-Key`.
    pub(crate) key: HeaderValue,
    /// The connection, once the 101 is sent.
    pub(crate) on_upgrade: hyper::upgrade::OnUpgrade,
    /// The platform's subprotocol, when the client offered it (gorilla echoes only an offered one).
    pub(crate) protocol: Option<&'static str>,
}

impl Handshake {
    /// Checks the upgrade headers and takes the connection out of the request.
    pub(crate) fn check(
        parts: &mut http::request::Parts,
        deckhouse: bool,
    ) -> Result<Handshake, ApiError> {
        let Some(key) = parts.headers.get(header::SEC_WEBSOCKET_KEY).cloned() else {
            return Err(ApiError::bad_request(
                "websocket: not a websocket handshake: 'Sec-WebSocket-Key' header is missing or blank",
            ));
        };
        let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            return Err(ApiError::internal("the connection cannot be upgraded"));
        };
        let protocol = if deckhouse {
            "plain.virtualization.deckhouse.io"
        } else {
            "plain.kubevirt.io"
        };
        let offered = parts
            .headers
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| p.trim() == protocol);
        Ok(Handshake {
            key,
            on_upgrade,
            protocol: offered.then_some(protocol),
        })
    }
}

/// The 101 answer to a checked [`Handshake`].
pub(crate) fn switching_protocols(key: &HeaderValue, protocol: Option<&'static str>) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(v) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    if let Some(protocol) = protocol {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(protocol),
        );
    }
    response
}

/// Resolves once the flag is true (or its sender is gone).
async fn flipped(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|v| *v).await;
}

fn is_upgrade(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

type Ws = WebSocketStream<crate::core::faults::Faulty<TokioIo<hyper::upgrade::Upgraded>>>;

/// Serial console: guest output to binary frames, binary frames to guest input. Returning
/// drops the connection without a close frame, except when the client closed first.
async fn console(mut ws: Ws, guest: Arc<dyn Guest>, mut killed: watch::Receiver<bool>) {
    let serial = guest.serial();
    // Attached, not subscribed: a client that stops reading holds the guest's output back
    // instead of losing it (guest.rs `ConsoleTaps`).
    let mut output = serial.consoles.attach();
    let mut stopped = guest.stopped();
    loop {
        tokio::select! {
            _ = flipped(&mut killed) => return,
            _ = flipped(&mut stopped) => return,
            frame = ws.next() => match frame {
                Some(Ok(Message::Binary(data))) => {
                    let _ = serial.input.send(Bytes::from(data.to_vec()));
                }
                Some(Ok(Message::Close(_))) => {
                    let _ = ws.close(None).await;
                    return;
                }
                Some(Ok(_)) => {}
                _ => return,
            },
            out = output.recv() => match out {
                Some(bytes) => {
                    if ws.send(Message::Binary(bytes.to_vec().into())).await.is_err() {
                        return;
                    }
                }
                None => return,
            },
        }
    }
}

/// VNC: an RFB server per connection, its bytes in binary frames.
async fn vnc(mut ws: Ws, guest: Arc<dyn Guest>, mut killed: watch::Receiver<bool>, name: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut local, remote) = tokio::io::duplex(1 << 16);
    let name = name.to_owned();
    let server = tokio::spawn(async move { crate::core::rfb::serve(remote, &name).await });
    let mut stopped = guest.stopped();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        tokio::select! {
            _ = flipped(&mut killed) => break,
            _ = flipped(&mut stopped) => break,
            frame = ws.next() => match frame {
                Some(Ok(Message::Binary(data))) => {
                    if local.write_all(&data).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) => {
                    let _ = ws.close(None).await;
                    break;
                }
                Some(Ok(_)) => {}
                _ => break,
            },
            n = local.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if ws.send(Message::Binary(buf[..n].to_vec().into())).await.is_err() {
                        break;
                    }
                }
            },
        }
    }
    server.abort();
}

/// The Deckhouse session Lease of one stream.
#[derive(Clone)]
struct Lease {
    key: Key,
    session_id: String,
}

fn lease_name(app: &App, ns: &str, name: &str, kind: &str) -> String {
    let uid = app
        .store
        .get(&Key::new(DECKHOUSE, "virtualmachines", ns, name))
        .map(|vm| meta_str(&vm, "uid").to_owned())
        .unwrap_or_default();
    format!("d8v-vm-{kind}-{name}-{uid}")
}

/// A MicroTime (`2026-11-30T14:32:00.123456Z`): `secs`, with the current microseconds.
fn micro_time(secs: i64) -> String {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_micros())
        .unwrap_or(0);
    crate::core::util::format_rfc3339(secs).replace('Z', &format!(".{micros:06}Z"))
}

/// Records the holder (V `pkg/apiserver/registry/vm/rest/session.go`), and the preemption
/// event when someone held it.
fn hold_lease(
    app: &App,
    ns: &str,
    name: &str,
    kind: &str,
    user: &str,
    client: &str,
    displaced: bool,
) -> Lease {
    let lease_name = lease_name(app, ns, name, kind);
    let key = Key::new("coordination.k8s.io", "leases", ns, &lease_name);
    let previous = app.store.get(&key);
    let session_id = random_token();
    let now = micro_time(now_unix());
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": lease_name,
            "namespace": ns,
            "labels": {"virtualization.deckhouse.io/session": kind},
            "annotations": {
                "virtualization.deckhouse.io/session-id": session_id,
                "virtualization.deckhouse.io/session-client": client,
            },
        },
        "spec": {
            "holderIdentity": user,
            "leaseDurationSeconds": LEASE_SECONDS,
            "acquireTime": now,
            "renewTime": now,
        },
    });
    let _ = app.put(lease);
    if displaced {
        let old_holder = previous
            .as_ref()
            .and_then(|l| l.pointer("/spec/holderIdentity").and_then(Value::as_str))
            .unwrap_or("another user")
            .to_owned();
        let (reason, what) = if kind == "console" {
            ("ConsoleSessionPreempted", "serial console")
        } else {
            ("VNCSessionPreempted", "VNC")
        };
        preempted_event(
            app,
            ns,
            name,
            reason,
            &format!("{user} took over the {what} session of {old_holder}"),
        );
    }
    Lease { key, session_id }
}

fn preempted_event(app: &App, ns: &str, vm: &str, reason: &str, message: &str) {
    let uid = app
        .store
        .get(&Key::new(DECKHOUSE, "virtualmachines", ns, vm))
        .map(|v| meta_str(&v, "uid").to_owned())
        .unwrap_or_default();
    let now = crate::core::util::now_rfc3339();
    let event = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": format!("{vm}.{}", crate::core::util::random_suffix(10)), "namespace": ns},
        "involvedObject": {"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine", "name": vm, "namespace": ns, "uid": uid},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "count": 1,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "source": {"component": "virtualization-api"},
    });
    let _ = app.put(event);
}

async fn renew_lease(app: Arc<App>, lease: Lease) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(10));
    tick.tick().await;
    loop {
        tick.tick().await;
        app.store.modify(&lease.key, |l| {
            if session_of(l) == lease.session_id {
                l["spec"]["renewTime"] = json!(micro_time(now_unix()));
            }
        });
    }
}

fn session_of(lease: &Value) -> &str {
    lease
        .pointer("/metadata/annotations/virtualization.deckhouse.io~1session-id")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Releases the Lease if this session still holds it (a displaced session must not release
/// its successor's).
fn release_lease(app: &App, lease: &Lease) {
    if app
        .store
        .get(&lease.key)
        .is_some_and(|l| session_of(&l) == lease.session_id)
    {
        app.store
            .delete(&lease.key, crate::core::store::Propagation::Cascade);
    }
}

/// `GET …/{console,vnc}?probe=true`: the current holder from the Lease, or an empty session.
fn probe(app: &App, ns: &str, name: &str, kind: &str) -> Response {
    let key = Key::new(
        "coordination.k8s.io",
        "leases",
        ns,
        &lease_name(app, ns, name, kind),
    );
    let mut session = json!({
        "kind": "VirtualMachineSession",
        "apiVersion": "subresources.virtualization.deckhouse.io/v1alpha2",
    });
    if let Some(lease) = app.store.get(&key) {
        let renewed = lease
            .pointer("/spec/renewTime")
            .and_then(Value::as_str)
            .and_then(crate::core::util::parse_rfc3339)
            .unwrap_or(0);
        if renewed + LEASE_SECONDS >= now_unix() {
            session["holder"] = lease["spec"]["holderIdentity"].clone();
            session["startTime"] = lease["spec"]["acquireTime"].clone();
            session["client"] = lease
                .pointer("/metadata/annotations/virtualization.deckhouse.io~1session-client")
                .cloned()
                .unwrap_or(json!(""));
        }
    }
    json_response(StatusCode::OK, &session, &[])
}
