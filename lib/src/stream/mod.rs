//! The one way to open a platform stream (serial console, VNC, port-forward): a websocket
//! upgrade sent through the kube client's own HTTP stack, so the kubeconfig's TLS (custom CA,
//! `--insecure-skip-tls-verify`, client certificates), auth (tokens, exec plugins, refreshed
//! credentials), impersonation and proxy apply exactly as to every other request.
//!
//! kube's `Client::connect` only negotiates the `*.channel.k8s.io` subprotocols, while the
//! platforms speak `plain.kubevirt.io` / `plain.virtualization.deckhouse.io` (KubeVirt FACTS §2.2,
//! Deckhouse FACTS §9), so the upgrade is done here with `Client::send` and
//! `hyper::upgrade::on`, and framed with tokio-tungstenite (the version kube uses).
//!
//! The result is a [`PlatformStream`]: a plain byte duplex ([`tokio::io::DuplexStream`],
//! `AsyncRead + AsyncWrite`, so ssh can run over it) plus a watch of how it ended. A pump task
//! owns the websocket: binary frames both ways, text frames skipped (as `binaryReader` in
//! KubeVirt's `websocket.go`), pings every [`StreamKind::ping_interval`] and pongs always.

mod pump;

use std::time::Duration;

use http::{HeaderValue, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use kube::client::Body;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};
use crate::flavor::{
    DECKHOUSE_SUBRESOURCES_GROUP, DECKHOUSE_VERSION, Flavor, KUBEVIRT_SUBRESOURCES_GROUP,
};

pub use pump::StreamEnd;

/// KubeVirt's only websocket subprotocol (`client-go/subresources/constants.go`).
pub const KUBEVIRT_SUBPROTOCOL: &str = "plain.kubevirt.io";
/// Deckhouse's websocket subprotocol (`api/client/kubeclient/websocket.go`).
pub const DECKHOUSE_SUBPROTOCOL: &str = "plain.virtualization.deckhouse.io";
/// The `User-Agent` of stream requests. Deckhouse records it as the session's client and
/// shows it to whoever is about to displace the session.
pub const USER_AGENT: &str = concat!("kubectl-vm/", env!("CARGO_PKG_VERSION"));

/// Which stream of a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamKind {
    /// The first serial console.
    Console,
    /// The VNC display.
    Vnc,
    /// A TCP or UDP port of the guest.
    PortForward {
        /// Guest port.
        port: u16,
        /// `tcp` or `udp`.
        protocol: String,
    },
}

impl StreamKind {
    /// The subresource name (`console`, `vnc`, `portforward`).
    pub fn subresource(&self) -> &'static str {
        match self {
            StreamKind::Console => "console",
            StreamKind::Vnc => "vnc",
            StreamKind::PortForward { .. } => "portforward",
        }
    }

    /// How often the client pings. virt-api relays console/VNC frames without keepalives,
    /// so an idle session through a proxy is cut after ~20 s (kubevirt#6493): ping every 15 s.
    /// Port-forward is pinged by virt-api itself every second, but a client ping costs nothing
    /// and detects a dead connection from this side too.
    pub fn ping_interval(&self) -> Duration {
        Duration::from_secs(15)
    }
}

/// A stream of one VM on one platform: everything needed to build the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTarget {
    /// The platform.
    pub flavor: Flavor,
    /// The VM's namespace.
    pub namespace: String,
    /// The VM's name (the VMI has the same name on KubeVirt).
    pub name: String,
    /// Which stream.
    pub kind: StreamKind,
    /// KubeVirt VNC's `preserveSession=true`: refuse instead of displacing an active session.
    pub preserve_session: bool,
}

impl StreamTarget {
    /// A target with default options.
    pub fn new(flavor: Flavor, namespace: &str, name: &str, kind: StreamKind) -> Self {
        StreamTarget {
            flavor,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            kind,
            preserve_session: false,
        }
    }

    /// The request path, as upstream clients build it. KubeVirt: console and VNC exist only on
    /// `virtualmachineinstances` (FACTS §2 "There is no console or vnc route on
    /// virtualmachines"); port-forward of a VM goes to `virtualmachines/{n}/portforward/{port}/{proto}`
    /// with the protocol always appended (`buildPortForwardResourcePath`). Deckhouse: everything on
    /// `virtualmachines/{n}/{sub}`, port-forward's port and protocol in the query.
    pub fn path(&self) -> String {
        let sub = self.kind.subresource();
        match self.flavor {
            Flavor::KubeVirt => {
                let base = format!(
                    "/apis/{KUBEVIRT_SUBRESOURCES_GROUP}/v1/namespaces/{}",
                    self.namespace
                );
                match &self.kind {
                    StreamKind::PortForward { port, protocol } => format!(
                        "{base}/virtualmachines/{}/portforward/{port}/{protocol}",
                        self.name
                    ),
                    _ => format!("{base}/virtualmachineinstances/{}/{sub}", self.name),
                }
            }
            Flavor::Deckhouse => format!(
                "/apis/{DECKHOUSE_SUBRESOURCES_GROUP}/{DECKHOUSE_VERSION}/namespaces/{}/virtualmachines/{}/{sub}",
                self.namespace, self.name
            ),
        }
    }

    /// The query string (without `?`), empty when there is none.
    pub fn query(&self) -> String {
        match (&self.flavor, &self.kind) {
            (Flavor::KubeVirt, StreamKind::Vnc) if self.preserve_session => {
                "preserveSession=true".into()
            }
            (Flavor::Deckhouse, StreamKind::PortForward { port, protocol }) => {
                format!("port={port}&protocol={protocol}")
            }
            _ => String::new(),
        }
    }

    /// Path plus query.
    pub fn uri(&self) -> String {
        let query = self.query();
        if query.is_empty() {
            self.path()
        } else {
            format!("{}?{query}", self.path())
        }
    }

    /// The platform's websocket subprotocol.
    pub fn subprotocol(&self) -> &'static str {
        match self.flavor {
            Flavor::KubeVirt => KUBEVIRT_SUBPROTOCOL,
            Flavor::Deckhouse => DECKHOUSE_SUBPROTOCOL,
        }
    }

    /// The request's [`Action`], so pre-upgrade errors read like every other API error.
    pub fn action(&self) -> Action {
        let (resource, kind) = match (&self.flavor, &self.kind) {
            (Flavor::KubeVirt, StreamKind::PortForward { .. }) => (
                format!("virtualmachines/portforward.{KUBEVIRT_SUBRESOURCES_GROUP}"),
                "virtualmachine",
            ),
            (Flavor::KubeVirt, kind) => (
                format!(
                    "virtualmachineinstances/{}.{KUBEVIRT_SUBRESOURCES_GROUP}",
                    kind.subresource()
                ),
                "virtualmachineinstance",
            ),
            (Flavor::Deckhouse, kind) => (
                format!(
                    "virtualmachines/{}.{DECKHOUSE_SUBRESOURCES_GROUP}",
                    kind.subresource()
                ),
                "virtualmachine",
            ),
        };
        Action::new("get", resource, kind)
            .named(&self.name)
            .in_namespace(Some(&self.namespace))
    }
}

/// An open platform stream.
#[derive(Debug)]
pub struct PlatformStream {
    /// The bytes of the stream, both ways. Shutting down the write side closes the websocket
    /// normally (close code 1000).
    pub io: tokio::io::DuplexStream,
    /// How the stream ended: `None` while it is open.
    pub end: tokio::sync::watch::Receiver<Option<StreamEnd>>,
    /// The subprotocol the server agreed to.
    pub protocol: String,
}

impl PlatformStream {
    /// How the stream ended, waiting for the pump to finish if it has not yet.
    pub async fn ended(&mut self) -> StreamEnd {
        let waited = self.end.wait_for(Option::is_some).await.map(|e| e.clone());
        let end = match waited {
            Ok(end) => end,
            Err(_) => self.end.borrow().clone(),
        };
        end.unwrap_or(StreamEnd::Local)
    }
}

/// Buffer of the byte duplex; KubeVirt's websocket buffer is 10240 (`WebsocketMessageBufferSize`).
const BUFFER: usize = 10240;

/// Opens `target` on `cluster`: one GET with the websocket upgrade headers and the platform's
/// subprotocol. Errors before the upgrade are the server's `Status`, classified like any other
/// API error; a 400 saying the VM is not running becomes [`Error::NotRunning`] (wait and retry).
pub async fn open(cluster: &Cluster, target: &StreamTarget) -> Result<PlatformStream> {
    let key = generate_key();
    let request = Request::get(target.uri())
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_VERSION, "13")
        .header(header::SEC_WEBSOCKET_KEY, &key)
        .header(header::SEC_WEBSOCKET_PROTOCOL, target.subprotocol())
        .header(header::USER_AGENT, USER_AGENT)
        .body(Body::empty())
        .map_err(|e| Error::Internal(format!("cannot build the stream request: {e}")))?;
    let action = target.action();
    let response = cluster
        .client
        .send(request)
        .await
        .map_err(|e| cluster.error(e, &action))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let code = response.status();
        let body = response
            .into_body()
            .collect_bytes()
            .await
            .unwrap_or_default();
        return Err(pre_upgrade_error(code, &body, &action, &cluster.server));
    }
    check_handshake(response.headers(), &key, target.subprotocol())?;
    let upgraded = hyper::upgrade::on(response)
        .await
        .map_err(|e| Error::Unreachable {
            server: cluster.server.clone(),
            cause: format!("the stream upgrade failed: {e}"),
        })?;
    let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await;
    Ok(start(ws, target.kind.ping_interval(), target.subprotocol()))
}

/// Hands a connected websocket to a pump task and returns the byte side.
pub fn start<S>(ws: WebSocketStream<S>, ping: Duration, protocol: &str) -> PlatformStream
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (user, inner) = tokio::io::duplex(BUFFER);
    let (end_tx, end) = tokio::sync::watch::channel(None);
    tokio::spawn(pump::run(ws, inner, ping, end_tx));
    PlatformStream {
        io: user,
        end,
        protocol: protocol.to_owned(),
    }
}

/// Checks the 101 answer as RFC 6455 asks, plus the subprotocol echo (upstream clients refuse
/// a server that does not agree to the platform's subprotocol).
fn check_handshake(headers: &http::HeaderMap, key: &str, protocol: &str) -> Result<()> {
    let bad = |what: &str| Error::Internal(format!("the stream upgrade failed: {what}"));
    let is = |name: header::HeaderName, want: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case(want))
    };
    if !is(header::UPGRADE, "websocket") {
        return Err(bad("the server did not switch to websocket"));
    }
    let accept = derive_accept_key(key.as_bytes());
    if headers.get(header::SEC_WEBSOCKET_ACCEPT) != HeaderValue::from_str(&accept).ok().as_ref() {
        return Err(bad("Sec-WebSocket-Accept does not match"));
    }
    if !is(header::SEC_WEBSOCKET_PROTOCOL, protocol) {
        return Err(bad(&format!(
            "the server did not agree to subprotocol {protocol}"
        )));
    }
    Ok(())
}

/// Turns a non-101 answer into the same one-line error as other API calls. virt-api and the
/// Deckhouse API answer with a `Status` JSON (FACTS §2.2); anything else is reported by code.
pub fn pre_upgrade_error(code: StatusCode, body: &[u8], action: &Action, server: &str) -> Error {
    #[derive(serde::Deserialize, Default)]
    struct Status {
        #[serde(default)]
        reason: String,
        #[serde(default)]
        message: String,
    }
    let status: Status = serde_json::from_slice(body).unwrap_or_else(|_| Status {
        // A 404 without a Status is the API server's answer for a path no API serves (virt-api
        // not registered): classified as such, like kube-rs' answers.
        reason: if code == StatusCode::NOT_FOUND {
            crate::error::NOT_A_STATUS.to_owned()
        } else {
            code.canonical_reason().unwrap_or("").replace(' ', "")
        },
        message: crate::error::one_line(&String::from_utf8_lossy(body)),
    });
    let message = if status.message.is_empty() {
        code.canonical_reason().unwrap_or("").to_owned()
    } else {
        status.message
    };
    // virtctl and d8 retry on these while the VM boots (`SerialConsole` in kubecli/vmi.go,
    // `ShouldWaitErr` in d8's console.go).
    if code == StatusCode::BAD_REQUEST && is_not_running(&message) {
        return Error::NotRunning(crate::error::one_line(&message));
    }
    Error::from_status(code.as_u16(), &status.reason, &message, action, server)
}

fn is_not_running(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("not running") || lower.contains("because phase is")
}

#[cfg(test)]
mod tests;
