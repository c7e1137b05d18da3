//! `kubectl vm port-forward`: local TCP and UDP ports forwarded to a VM's guest ports, one
//! portforward websocket per accepted TCP connection and per UDP client address (as virtctl
//! does: the platforms do not multiplex), or one port on stdin/stdout (`--stdio`, for
//! OpenSSH's `ProxyCommand`).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::cluster::Cluster;
use crate::flavor::Flavor;
use crate::ssh::vm::{ConnectError, open_port};

/// `tcp` or `udp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// TCP (the default).
    Tcp,
    /// UDP.
    Udp,
}

impl Protocol {
    /// The name in the API path.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// One `[tcp/|udp/]LOCAL[:REMOTE]` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    /// Protocol.
    pub protocol: Protocol,
    /// Local port (0: any free port).
    pub local: u16,
    /// Guest port.
    pub remote: u16,
}

impl std::str::FromStr for PortSpec {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| format!("invalid port {text:?}: {why}");
        let (protocol, rest) = match text.split_once('/') {
            Some(("tcp", rest)) => (Protocol::Tcp, rest),
            Some(("udp", rest)) => (Protocol::Udp, rest),
            Some((other, _)) => {
                return Err(bad(&format!(
                    "unknown protocol {other:?}; use tcp/ or udp/"
                )));
            }
            None => (Protocol::Tcp, text),
        };
        let number = |s: &str| {
            s.parse::<u16>()
                .map_err(|_| bad(&format!("{s:?} is not a port number")))
        };
        let (local, remote) = match rest.split_once(':') {
            Some((l, r)) => (number(l)?, number(r)?),
            None => {
                let p = number(rest)?;
                (p, p)
            }
        };
        if remote == 0 {
            return Err(bad("the VM port must not be 0"));
        }
        Ok(PortSpec {
            protocol,
            local,
            remote,
        })
    }
}

/// The VM a forward goes to.
#[derive(Debug, Clone)]
pub struct ForwardTarget {
    /// The platform.
    pub flavor: Flavor,
    /// VM namespace.
    pub namespace: String,
    /// VM name.
    pub vm: String,
}

/// What happens while forwarding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardEvent {
    /// A port listens.
    Listening {
        /// The local address.
        local: SocketAddr,
        /// The forward.
        spec: PortSpec,
    },
    /// One connection could not be forwarded (the port keeps listening).
    ConnectionFailed {
        /// The forward.
        spec: PortSpec,
        /// Why, one line.
        reason: String,
    },
}

/// Event sink.
pub type Events = Arc<dyn Fn(ForwardEvent) + Send + Sync>;

/// Bind every port, then forward until the future is dropped. Binding errors come back
/// before anything is forwarded.
pub async fn run(
    cluster: &Cluster,
    target: &ForwardTarget,
    address: &str,
    specs: &[PortSpec],
    events: Events,
) -> Result<(), ConnectError> {
    let mut tasks = tokio::task::JoinSet::new();
    for spec in specs {
        let unreachable = |e: std::io::Error| {
            ConnectError::Unreachable(format!("cannot listen on {address}:{}: {e}", spec.local))
        };
        match spec.protocol {
            Protocol::Tcp => {
                let listener = tokio::net::TcpListener::bind((address, spec.local))
                    .await
                    .map_err(unreachable)?;
                events(ForwardEvent::Listening {
                    local: listener.local_addr().map_err(unreachable)?,
                    spec: *spec,
                });
                tasks.spawn(serve_tcp(
                    cluster.clone(),
                    target.clone(),
                    listener,
                    *spec,
                    events.clone(),
                ));
            }
            Protocol::Udp => {
                let socket = tokio::net::UdpSocket::bind((address, spec.local))
                    .await
                    .map_err(unreachable)?;
                events(ForwardEvent::Listening {
                    local: socket.local_addr().map_err(unreachable)?,
                    spec: *spec,
                });
                tasks.spawn(serve_udp(
                    cluster.clone(),
                    target.clone(),
                    socket,
                    *spec,
                    events.clone(),
                ));
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

async fn serve_tcp(
    cluster: Cluster,
    target: ForwardTarget,
    listener: tokio::net::TcpListener,
    spec: PortSpec,
    events: Events,
) {
    loop {
        let (socket, _) = accept_retrying(|| listener.accept()).await;
        let _ = socket.set_nodelay(true);
        let (cluster, target, events) = (cluster.clone(), target.clone(), events.clone());
        tokio::spawn(async move {
            match open_port(
                &cluster,
                target.flavor,
                &target.namespace,
                &target.vm,
                spec.remote,
                "tcp",
            )
            .await
            {
                Ok(stream) => {
                    let (local_rd, local_wr) = socket.into_split();
                    relay(local_rd, local_wr, stream.io).await;
                }
                Err(e) => events(ForwardEvent::ConnectionFailed {
                    spec,
                    reason: e.to_string(),
                }),
            }
        });
    }
}

/// One websocket per client address. The stream layer is a byte stream, so a datagram is
/// written as one chunk and every chunk read back is sent as one datagram.
async fn serve_udp(
    cluster: Cluster,
    target: ForwardTarget,
    socket: tokio::net::UdpSocket,
    spec: PortSpec,
    events: Events,
) {
    let socket = Arc::new(socket);
    let mut clients = UdpClients::default();
    let mut buf = vec![0u8; 65536];
    let mut told_full = false;
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let datagram = buf[..n].to_vec();
        let datagram = match clients.send(from, datagram) {
            Ok(()) => continue,
            Err(datagram) => datagram,
        };
        let Some(mut rx) = clients.add(from) else {
            // Every slot holds a live client: drop the datagram, as a full socket buffer
            // would, and say so once.
            if !told_full {
                told_full = true;
                events(ForwardEvent::ConnectionFailed {
                    spec,
                    reason: format!(
                        "{MAX_UDP_CLIENTS} UDP clients are being forwarded already; datagrams from new addresses are dropped until one is idle for {}s",
                        UDP_IDLE.as_secs()
                    ),
                });
            }
            continue;
        };
        told_full = false;
        let _ = clients.send(from, datagram);
        let (cluster, target, events, socket) = (
            cluster.clone(),
            target.clone(),
            events.clone(),
            socket.clone(),
        );
        tokio::spawn(async move {
            let stream = match open_port(
                &cluster,
                target.flavor,
                &target.namespace,
                &target.vm,
                spec.remote,
                "udp",
            )
            .await
            {
                Ok(s) => s,
                Err(e) => {
                    events(ForwardEvent::ConnectionFailed {
                        spec,
                        reason: e.to_string(),
                    });
                    return;
                }
            };
            let (mut rd, mut wr) = tokio::io::split(stream.io);
            // A client that sends nothing for UDP_IDLE is done (DNS clients use a new
            // port per query): its websocket closes and its slot frees.
            let up = async move {
                while let Ok(Some(d)) = tokio::time::timeout(UDP_IDLE, rx.recv()).await {
                    if wr.write_all(&d).await.is_err() || wr.flush().await.is_err() {
                        break;
                    }
                }
            };
            let down = async move {
                let mut buf = vec![0u8; 65536];
                while let Ok(n) = rd.read(&mut buf).await {
                    if n == 0 || socket.send_to(&buf[..n], from).await.is_err() {
                        break;
                    }
                }
            };
            // Either direction ending ends the client (the other is dropped with the stream).
            tokio::select! {
                _ = up => {}
                _ = down => {}
            }
        });
    }
}

/// How long a UDP client may send nothing before its websocket is closed.
pub const UDP_IDLE: Duration = Duration::from_secs(60);
/// How many UDP clients one forwarded port serves at once.
pub const MAX_UDP_CLIENTS: usize = 256;

/// The UDP clients of one forwarded port: a sender to each one's websocket task, pruned of
/// finished (idle) clients and bounded by [`MAX_UDP_CLIENTS`].
#[derive(Default)]
struct UdpClients {
    clients: HashMap<SocketAddr, mpsc::UnboundedSender<Vec<u8>>>,
}

impl UdpClients {
    /// Hand `datagram` to `from`'s task; gives it back when there is no live task.
    fn send(&mut self, from: SocketAddr, datagram: Vec<u8>) -> Result<(), Vec<u8>> {
        match self.clients.get(&from) {
            Some(tx) => tx.send(datagram).map_err(|e| e.0),
            None => Err(datagram),
        }
    }

    /// A slot for a new client `from`: its task's receiver, or `None` when every slot holds a
    /// live client.
    fn add(&mut self, from: SocketAddr) -> Option<mpsc::UnboundedReceiver<Vec<u8>>> {
        self.clients.retain(|_, tx| !tx.is_closed());
        if self.clients.len() >= MAX_UDP_CLIENTS {
            return None;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        self.clients.insert(from, tx);
        Some(rx)
    }
}

/// `accept` until it succeeds, waiting after each failure (100 ms, doubling to 1 s): errors
/// such as EMFILE do not go away at once, and retrying at once would spin a core.
pub async fn accept_retrying<T, F, Fut>(mut accept: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<T>>,
{
    let mut wait = Duration::from_millis(100);
    loop {
        match accept().await {
            Ok(accepted) => return accepted,
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// `--stdio`: one TCP connection to `port` on stdin/stdout, until either side ends.
pub async fn stdio(
    cluster: &Cluster,
    target: &ForwardTarget,
    port: u16,
) -> Result<(), ConnectError> {
    let stream = open_port(
        cluster,
        target.flavor,
        &target.namespace,
        &target.vm,
        port,
        "tcp",
    )
    .await?;
    relay(tokio::io::stdin(), tokio::io::stdout(), stream.io).await;
    Ok(())
}

/// Copies a local connection (or stdin/stdout) and a platform stream both ways until the
/// remote side ends. The local side's end of input is not passed on as a close: a websocket
/// has no half-close, and a server that sees the close drops what is still on its way, so
/// `printf req | … port-forward --stdio VM PORT` would lose the reply. As with `nc -N` or
/// OpenSSH, the answer still arrives after our input ended; the session ends when the remote
/// side ends it (or the local side stops reading). ssh as a ProxyCommand keeps its end open.
async fn relay<R, W>(mut local_rd: R, mut local_wr: W, io: tokio::io::DuplexStream)
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let up = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match local_rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if wr.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Input ended: keep the stream open for the answer; the other direction decides.
        std::future::pending::<()>().await
    };
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0
                || local_wr.write_all(&buf[..n]).await.is_err()
                || local_wr.flush().await.is_err()
            {
                break;
            }
        }
        let _ = local_wr.shutdown().await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(start_paused = true)]
    async fn accept_errors_back_off_instead_of_spinning() {
        let calls = AtomicUsize::new(0);
        let started = tokio::time::Instant::now();
        let got = accept_retrying(|| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 5 {
                    Err(std::io::Error::from_raw_os_error(24)) // EMFILE
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!((got, calls.load(Ordering::SeqCst)), (5, 6));
        // 100 + 200 + 400 + 800 + 1000 ms of waiting, not a tight loop.
        assert_eq!(started.elapsed(), Duration::from_millis(2500));
    }

    #[test]
    fn udp_clients_are_bounded_and_finished_ones_free_their_slot() {
        let mut clients = UdpClients::default();
        let addr = |i: usize| SocketAddr::from(([127, 0, 0, 1], 10_000 + i as u16));
        let mut live = Vec::new();
        for i in 0..MAX_UDP_CLIENTS {
            live.push(clients.add(addr(i)).expect("a free slot"));
        }
        assert!(clients.add(addr(MAX_UDP_CLIENTS)).is_none(), "bounded");
        assert!(clients.send(addr(0), b"q".to_vec()).is_ok());
        // A client whose task ended (idle) frees its slot; its address gets a new one.
        drop(live.remove(0));
        assert_eq!(clients.send(addr(0), b"q".to_vec()), Err(b"q".to_vec()));
        assert!(clients.add(addr(MAX_UDP_CLIENTS)).is_some());
        assert_eq!(clients.clients.len(), MAX_UDP_CLIENTS);
    }

    use super::*;

    #[test]
    fn port_specs_like_virtctl() {
        let p: PortSpec = "8080".parse().unwrap();
        assert_eq!((p.protocol, p.local, p.remote), (Protocol::Tcp, 8080, 8080));
        let p: PortSpec = "2222:22".parse().unwrap();
        assert_eq!((p.local, p.remote), (2222, 22));
        let p: PortSpec = "udp/5353:53".parse().unwrap();
        assert_eq!((p.protocol, p.local, p.remote), (Protocol::Udp, 5353, 53));
        let p: PortSpec = "0:80".parse().unwrap();
        assert_eq!(p.local, 0);
        assert!("sctp/1".parse::<PortSpec>().is_err());
        assert!("x".parse::<PortSpec>().is_err());
        assert!("80:0".parse::<PortSpec>().is_err());
        assert!("70000".parse::<PortSpec>().is_err());
    }
}

/// Properties of the port syntax (issue 37).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `[tcp/|udp/]LOCAL[:REMOTE]` with decimal ports (as virtctl reads them) parses to
        /// exactly those numbers; a VM port 0 or out of range is refused in one line.
        #[test]
        fn ports_parse_to_their_numbers(proto in prop::sample::select(vec!["", "tcp/", "udp/"]), local in 0u32..70_000, remote in proptest::option::of(0u32..70_000)) {
            let text = match remote {
                Some(r) => format!("{proto}{local}:{r}"),
                None => format!("{proto}{local}"),
            };
            let remote = remote.unwrap_or(local);
            match text.parse::<PortSpec>() {
                Ok(p) => {
                    prop_assert!(local <= 65535 && (1..=65535).contains(&remote));
                    prop_assert_eq!((u32::from(p.local), u32::from(p.remote)), (local, remote));
                    prop_assert_eq!(p.protocol, if proto == "udp/" { Protocol::Udp } else { Protocol::Tcp });
                }
                Err(e) => {
                    prop_assert!(local > 65535 || remote > 65535 || remote == 0, "{} refused: {}", text, e);
                    prop_assert!(!e.contains('\n'));
                }
            }
        }
    }
}
