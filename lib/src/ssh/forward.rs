//! `-L [ADDR:]LPORT:HOST:RPORT`: local ports forwarded through the SSH connection.

use std::sync::Arc;

use super::client::Connection;

/// One `-L` forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalForward {
    /// Local bind address (default `127.0.0.1`).
    pub bind: String,
    /// Local port (0: any free port).
    pub local_port: u16,
    /// Host to connect to, as seen from the guest.
    pub host: String,
    /// Port on that host.
    pub remote_port: u16,
}

fn port(text: &str, spec: &str) -> Result<u16, String> {
    text.parse::<u16>()
        .map_err(|_| format!("invalid -L {spec:?}: {text:?} is not a port number"))
}

impl std::str::FromStr for LocalForward {
    type Err = String;
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        // An IPv6 host or bind address goes in brackets, like OpenSSH.
        let mut parts = Vec::new();
        let mut rest = spec;
        while !rest.is_empty() {
            if let Some(inner) = rest.strip_prefix('[') {
                let end = inner
                    .find(']')
                    .ok_or_else(|| format!("invalid -L {spec:?}: unclosed '['"))?;
                parts.push(&inner[..end]);
                rest = inner[end + 1..]
                    .strip_prefix(':')
                    .unwrap_or(&inner[end + 1..]);
            } else {
                let (part, tail) = rest.split_once(':').unwrap_or((rest, ""));
                parts.push(part);
                rest = tail;
            }
        }
        let (bind, lport, host, rport) = match parts[..] {
            [l, h, r] => ("127.0.0.1", l, h, r),
            [b, l, h, r] => (
                if b.is_empty() || b == "*" {
                    "0.0.0.0"
                } else {
                    b
                },
                l,
                h,
                r,
            ),
            _ => {
                return Err(format!(
                    "invalid -L {spec:?}: use [ADDRESS:]LOCAL_PORT:HOST:REMOTE_PORT"
                ));
            }
        };
        if host.is_empty() {
            return Err(format!("invalid -L {spec:?}: the host is empty"));
        }
        Ok(LocalForward {
            bind: bind.to_owned(),
            local_port: port(lport, spec)?,
            host: host.to_owned(),
            remote_port: port(rport, spec)?,
        })
    }
}

/// Bind the local listener of `forward`; the error names the address.
pub async fn bind(forward: &LocalForward) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind((forward.bind.as_str(), forward.local_port))
        .await
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot listen on {}:{}: {e}",
                    forward.bind, forward.local_port
                ),
            )
        })
}

/// Accept connections on `listener` until the task is dropped, each one forwarded through
/// its own `direct-tcpip` channel. `on_error` hears about refused channels.
pub async fn serve(
    connection: Arc<Connection>,
    listener: tokio::net::TcpListener,
    forward: LocalForward,
    on_error: Arc<dyn Fn(String) + Send + Sync>,
) {
    loop {
        let (mut socket, peer) = crate::port_forward::accept_retrying(|| listener.accept()).await;
        let _ = socket.set_nodelay(true);
        let connection = connection.clone();
        let forward = forward.clone();
        let on_error = on_error.clone();
        tokio::spawn(async move {
            match connection
                .open_tcp(&forward.host, forward.remote_port, peer)
                .await
            {
                Ok(mut channel) => {
                    let _ = tokio::io::copy_bidirectional(&mut socket, &mut channel).await;
                }
                Err(e) => on_error(e.to_string()),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_openssh() {
        let f: LocalForward = "8080:localhost:80".parse().unwrap();
        assert_eq!(
            f,
            LocalForward {
                bind: "127.0.0.1".into(),
                local_port: 8080,
                host: "localhost".into(),
                remote_port: 80
            }
        );
        let f: LocalForward = "0.0.0.0:5432:db:5432".parse().unwrap();
        assert_eq!((f.bind.as_str(), f.host.as_str()), ("0.0.0.0", "db"));
        let f: LocalForward = "[::1]:8080:[fd00::1]:80".parse().unwrap();
        assert_eq!((f.bind.as_str(), f.host.as_str()), ("::1", "fd00::1"));
        assert!("8080:80".parse::<LocalForward>().is_err());
        assert!("x:h:80".parse::<LocalForward>().is_err());
        assert!("1:h:70000".parse::<LocalForward>().is_err());
    }
}
