//! `kubectl vm vnc`: a local TCP listener whose clients are piped to the VM's VNC websocket.
//!
//! Like virtctl (KubeVirt FACTS §3.4), the websocket is opened first, so a refused stream fails
//! before anything listens; each accepted client gets its own stream (the first one reuses
//! the stream opened up front), because every VNC client starts its own RFB handshake.

pub mod viewer;

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::Flavor;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::platform::{self, SessionArbitration};
use crate::session::kubevirt::HeldLease;
use crate::stream::{self, PlatformStream, StreamKind, StreamTarget};

/// What a VNC proxy does.
#[derive(Debug, Clone)]
pub struct VncPlan {
    /// The VM's VNC stream.
    pub target: StreamTarget,
    /// Where to listen.
    pub listen: SocketAddr,
    /// Serve one client and stop (`false`: serve clients one after another until stopped).
    pub once: bool,
    /// The user the cluster knows us as, to record in the KubeVirt Lease.
    pub me: Option<String>,
}

impl VncPlan {
    /// A plan for the VNC display of `name` in `namespace`.
    pub fn new(flavor: Flavor, namespace: &str, name: &str, listen: SocketAddr) -> Self {
        VncPlan {
            target: StreamTarget::new(flavor, namespace, name, StreamKind::Vnc),
            listen,
            once: true,
            me: None,
        }
    }
}

/// Progress of a VNC proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VncEvent {
    /// Listening on this address.
    Listening(SocketAddr),
    /// A client connected.
    ClientConnected(SocketAddr),
    /// The client's session ended (`reason` from the stream).
    ClientDone(String),
    /// Something worth knowing that does not stop the proxy.
    Warning(String),
}

/// An opened VNC proxy, before serving.
pub struct VncProxy {
    listener: TcpListener,
    first: Option<PlatformStream>,
    lease: Option<HeldLease>,
}

impl VncProxy {
    /// Takes the KubeVirt session Lease out of the proxy, so the caller can release it after
    /// stopping [`serve`] from outside (Ctrl-C ends a `--proxy-only` proxy).
    pub fn take_lease(&mut self) -> Option<HeldLease> {
        self.lease.take()
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| Error::Internal(format!("listener: {e}")))
    }
}

/// Opens the VNC stream, then the listener.
pub async fn open(
    cluster: &Cluster,
    plan: &VncPlan,
    on_event: &mut (dyn FnMut(VncEvent) + Send),
) -> Result<VncProxy> {
    let lease = if platform::of(plan.target.flavor).sessions == SessionArbitration::Lease {
        match HeldLease::acquire(
            cluster,
            &plan.target,
            plan.me.as_deref().unwrap_or("unknown"),
        )
        .await
        {
            Ok(lease) => Some(lease),
            Err(e) => {
                on_event(VncEvent::Warning(format!(
                    "cannot record this session, so others will not see you connected: {e}"
                )));
                None
            }
        }
    } else {
        None
    };
    let first = match open_stream(cluster, plan).await {
        Ok(stream) => stream,
        Err(e) => {
            if let Some(lease) = lease {
                lease.release().await;
            }
            return Err(e);
        }
    };
    let listener = TcpListener::bind(plan.listen)
        .await
        .map_err(|e| Error::Config(format!("cannot listen on {}: {e}", plan.listen)))?;
    Ok(VncProxy {
        listener,
        first: Some(first),
        lease,
    })
}

/// Opens one VNC stream. KubeVirt's `preserveSession=true` refusal (virt-handler's 503
/// `Active VNC connection. Request denied.`, passed on by virt-api as a 500) reads as a conflict.
pub async fn open_stream(cluster: &Cluster, plan: &VncPlan) -> Result<PlatformStream> {
    stream::open(cluster, &plan.target).await.map_err(|e| match e {
        Error::Api { message, .. } if message.contains("Active VNC connection") => Error::Conflict(
            format!(
                "another VNC session is active on {} (--preserve-session refuses to take it over)",
                plan.target.name
            ),
        ),
        other => other,
    })
}

/// Serves clients: one (`plan.once`) or one after another until the future is dropped.
pub async fn serve(
    cluster: &Cluster,
    plan: &VncPlan,
    mut proxy: VncProxy,
    on_event: &mut (dyn FnMut(VncEvent) + Send),
) -> Result<()> {
    on_event(VncEvent::Listening(proxy.local_addr()?));
    let result = loop {
        let (mut client, peer) = match proxy.listener.accept().await {
            Ok(c) => c,
            Err(e) => break Err(Error::Internal(format!("accepting a VNC client: {e}"))),
        };
        on_event(VncEvent::ClientConnected(peer));
        let mut stream = match proxy.first.take() {
            Some(stream) => stream,
            None => match open_stream(cluster, plan).await {
                Ok(stream) => stream,
                Err(e) => break Err(e),
            },
        };
        let _ = tokio::io::copy_bidirectional(&mut client, &mut stream.io).await;
        drop(client);
        let reason = match stream.end.borrow().clone() {
            Some(end) => end.describe(),
            None => "the client disconnected".to_owned(),
        };
        on_event(VncEvent::ClientDone(reason));
        if plan.once {
            break Ok(());
        }
    };
    if let Some(lease) = proxy.lease.take() {
        lease.release().await;
    }
    result
}

/// KubeVirt's `vnc/screenshot` (FACTS §2): a PNG of the VM's display. `move_cursor` asks
/// virt-handler to move the pointer first (wakes a blanked screen).
pub async fn screenshot(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    name: &str,
    move_cursor: bool,
) -> Result<Vec<u8>> {
    platform::of(flavor).vnc_screenshot.check()?;
    let target = StreamTarget::new(flavor, namespace, name, StreamKind::Vnc);
    let mut uri = format!("{}/screenshot", target.path());
    if move_cursor {
        uri.push_str("?moveCursor=true");
    }
    let request = http::Request::get(uri)
        .header(http::header::ACCEPT, "image/png")
        .body(kube::client::Body::empty())
        .map_err(|e| Error::Internal(e.to_string()))?;
    let mut action = target.action();
    action.resource = format!(
        "virtualmachineinstances/vnc/screenshot.{}",
        crate::flavor::KUBEVIRT_SUBRESOURCES_GROUP
    );
    let response = cluster
        .client
        .send(request)
        .await
        .map_err(|e| cluster.error(e, &action))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect_bytes()
        .await
        .map_err(|e| cluster.error(e, &action))?;
    if !status.is_success() {
        return Err(stream::pre_upgrade_error(
            status,
            &body,
            &action,
            &cluster.server,
        ));
    }
    if !body.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Err(Error::Internal("the screenshot is not a PNG image".into()));
    }
    Ok(body.to_vec())
}
