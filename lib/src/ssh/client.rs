//! The SSH client: connect over any byte stream, authenticate, run a command or a shell,
//! forward local ports, open SFTP.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::client::{self, Handle};
use russh::keys::agent::AgentIdentity;
use russh::keys::agent::client::AgentClient;
use russh::keys::{Algorithm, PrivateKey, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::{ChannelMsg, Disconnect, Preferred};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::SshError;
use super::cert::UserIdentity;
use super::hostkey::{HostRejection, HostTrust, HostVerifier};

/// How to authenticate.
#[derive(Clone)]
pub enum Auth {
    /// A CA-signed certificate with its in-memory key.
    Certificate(Box<UserIdentity>),
    /// A private key from `-i FILE`.
    Key(Arc<PrivateKey>),
    /// Every identity of the ssh-agent at `SSH_AUTH_SOCK`.
    Agent,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Certificate(id) => write!(f, "Certificate({id:?})"),
            Auth::Key(_) => f.write_str("Key"),
            Auth::Agent => f.write_str("Agent"),
        }
    }
}

type Outcome = Arc<Mutex<Option<Result<HostTrust, HostRejection>>>>;

/// russh callbacks: host verification only.
struct ClientHandler {
    verifier: HostVerifier,
    outcome: Outcome,
}

impl client::Handler for ClientHandler {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        presented: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        let verifier = self.verifier.clone();
        let presented = match presented {
            PublicKeyOrCertificate::Certificate(c) => {
                PublicKeyOrCertificate::Certificate(c.clone())
            }
            PublicKeyOrCertificate::PublicKey { key, hash_alg } => {
                PublicKeyOrCertificate::PublicKey {
                    key: key.clone(),
                    hash_alg: *hash_alg,
                }
            }
        };
        // The check may prompt on the terminal: keep it off the async workers.
        let result = tokio::task::spawn_blocking(move || verifier.check(&presented))
            .await
            .unwrap_or_else(|e| Err(HostRejection::File(e.to_string())));
        let ok = result.is_ok();
        *self.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        Ok(ok)
    }
}

/// How long the SSH handshake, and then the login, may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

fn handshake_timed_out() -> SshError {
    SshError::Transport(format!(
        "no SSH handshake within {}s: is sshd on that port, and is the guest up?",
        HANDSHAKE_TIMEOUT.as_secs()
    ))
}

/// The client configuration: Ed25519 host certificates preferred, Nagle off (it costs
/// ~40 ms per round trip), keepalives so a dead tunnel is noticed.
fn config() -> Arc<client::Config> {
    Arc::new(client::Config {
        nodelay: true,
        inactivity_timeout: None,
        keepalive_interval: Some(Duration::from_secs(30)),
        keepalive_max: 3,
        preferred: Preferred {
            host_key_certificates: Cow::Borrowed(&[Algorithm::Ed25519]),
            ..Default::default()
        },
        ..Default::default()
    })
}

/// An authenticated SSH connection.
pub struct Connection {
    handle: Handle<ClientHandler>,
    /// How the host was trusted.
    pub trust: HostTrust,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("trust", &self.trust)
            .finish_non_exhaustive()
    }
}

/// A pseudo-terminal request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtyRequest {
    /// `TERM`.
    pub term: String,
    /// Columns.
    pub cols: u32,
    /// Rows.
    pub rows: u32,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionRequest {
    /// A command, or `None` for a login shell.
    pub command: Option<String>,
    /// A terminal, if wanted.
    pub pty: Option<PtyRequest>,
}

/// The local ends of a session.
pub struct SessionIo {
    /// Sent to the remote side; its end becomes EOF.
    pub stdin: Box<dyn AsyncRead + Send + Unpin>,
    /// Remote standard output.
    pub stdout: Box<dyn AsyncWrite + Send + Unpin>,
    /// Remote standard error.
    pub stderr: Box<dyn AsyncWrite + Send + Unpin>,
    /// New window sizes (columns, rows).
    pub resize: Option<mpsc::UnboundedReceiver<(u32, u32)>>,
}

/// How the remote side ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitOutcome {
    /// It exited with a status.
    Status(u32),
    /// It was killed by a signal.
    Signal(String),
    /// The channel closed without saying.
    Unknown,
    /// The connection ended before the channel closed: the link to the guest was lost
    /// (OpenSSH: "Connection to HOST closed by remote host."). Output may be missing even when
    /// the command's exit status came first (a server may send it before the last output).
    Lost {
        /// The exit status, if it arrived before the link went.
        status: Option<u32>,
    },
}

impl ExitOutcome {
    /// The exit code OpenSSH would give: the status, else 255.
    pub fn code(&self) -> i32 {
        match self {
            ExitOutcome::Status(s) => (*s & 0xff) as i32,
            _ => 255,
        }
    }
}

fn transport(e: impl std::fmt::Display) -> SshError {
    SshError::Transport(format!("SSH connection failed: {e}"))
}

impl Connection {
    /// Run the SSH handshake over `stream`, verify the host, and log in as `user`.
    pub async fn connect<S>(
        stream: S,
        verifier: HostVerifier,
        user: &str,
        auth: &Auth,
    ) -> Result<Connection, SshError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        Self::connect_with(stream, verifier, user, auth, |_| {}).await
    }

    /// Like [`Connection::connect`], telling `on_host` how the host was trusted as soon as it
    /// is (before authentication, which may still fail).
    pub async fn connect_with<S>(
        stream: S,
        verifier: HostVerifier,
        user: &str,
        auth: &Auth,
        on_host: impl FnOnce(&HostTrust),
    ) -> Result<Connection, SshError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let outcome: Outcome = Arc::default();
        let handler = ClientHandler {
            verifier,
            outcome: outcome.clone(),
        };
        // A port that accepts and never speaks SSH must not hang the command: the handshake
        // and the login get HANDSHAKE_TIMEOUT, as OpenSSH's ConnectTimeout bounds its own.
        let connected = match tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            client::connect_stream(config(), stream, handler),
        )
        .await
        {
            Ok(connected) => connected,
            Err(_) => return Err(handshake_timed_out()),
        };
        let recorded = outcome.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (mut handle, trust) = match (connected, recorded) {
            (Ok(handle), Some(Ok(trust))) => (handle, trust),
            (Ok(_), _) => return Err(SshError::Internal("the host key was never checked".into())),
            (Err(_), Some(Err(rejection))) => return Err(SshError::Host(rejection)),
            (Err(russh::Error::Disconnect), _) | (Err(russh::Error::IO(_)), None) => {
                return Err(SshError::Transport(
                    "the connection closed before the SSH handshake finished: is sshd running on that port?".into(),
                ));
            }
            (Err(e), _) => return Err(transport(e)),
        };
        on_host(&trust);
        tokio::time::timeout(HANDSHAKE_TIMEOUT, authenticate(&mut handle, user, auth))
            .await
            .map_err(|_| handshake_timed_out())??;
        Ok(Connection { handle, trust })
    }

    /// Run a command or a shell, streaming `io`, until the remote side closes.
    pub async fn run(
        &self,
        request: &SessionRequest,
        io: SessionIo,
    ) -> Result<ExitOutcome, SshError> {
        let channel = self.open_session(request).await?;
        let SessionIo {
            stdin,
            mut stdout,
            mut stderr,
            resize,
        } = io;
        let (mut read, write) = channel.split();
        let write = Arc::new(write);
        let input = send_input(stdin, write.clone());
        let resizer = resize.map(|rx| send_resizes(rx, write.clone()));
        let result = relay_output(&mut read, &mut stdout, &mut stderr).await;
        input.abort();
        if let Some(r) = resizer {
            r.abort();
        }
        result
    }

    /// A session channel with a terminal when asked for (the guest may refuse one), running
    /// the command, or a login shell.
    async fn open_session(
        &self,
        request: &SessionRequest,
    ) -> Result<russh::Channel<client::Msg>, SshError> {
        let mut channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(transport)?;
        if let Some(pty) = &request.pty {
            channel
                .request_pty(true, &pty.term, pty.cols, pty.rows, 0, 0, &[])
                .await
                .map_err(transport)?;
            match channel.wait().await {
                Some(ChannelMsg::Success) => {}
                _ => {
                    return Err(SshError::AuthRefused(
                        "the guest refused a terminal (certificate without permit-pty?)".into(),
                    ));
                }
            }
        }
        match &request.command {
            Some(command) => channel.exec(true, command.as_str()).await,
            None => channel.request_shell(true).await,
        }
        .map_err(transport)?;
        Ok(channel)
    }

    /// Open a `direct-tcpip` channel to `host:port` as seen from the guest (`-L`).
    pub async fn open_tcp(
        &self,
        host: &str,
        port: u16,
        origin: std::net::SocketAddr,
    ) -> Result<impl AsyncRead + AsyncWrite + Unpin + Send + use<>, SshError> {
        let channel = self
            .handle
            .channel_open_direct_tcpip(
                host,
                u32::from(port),
                origin.ip().to_string(),
                u32::from(origin.port()),
            )
            .await
            .map_err(|e| {
                SshError::Transport(format!(
                    "the guest refused forwarding to {host}:{port}: {e}"
                ))
            })?;
        Ok(channel.into_stream())
    }

    /// Start the SFTP subsystem on a new channel.
    pub async fn sftp(&self) -> Result<russh_sftp::client::SftpSession, SshError> {
        let channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(transport)?;
        channel
            .request_subsystem(true, "sftp")
            .await
            .map_err(transport)?;
        russh_sftp::client::SftpSession::new(channel.into_stream())
            .await
            .map_err(|e| SshError::Transport(format!("SFTP failed to start: {e}")))
    }

    /// Close the connection politely.
    pub async fn close(&self) {
        let _ = self
            .handle
            .disconnect(Disconnect::ByApplication, "", "en")
            .await;
    }
}

type ChannelWrite = Arc<russh::ChannelWriteHalf<client::Msg>>;

/// Local input to the remote side, then EOF when it ends.
fn send_input(
    mut stdin: Box<dyn AsyncRead + Send + Unpin>,
    write: ChannelWrite,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if write.data_bytes(buf[..n].to_vec()).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = write.eof().await;
    })
}

/// New local window sizes to the remote terminal.
fn send_resizes(
    mut rx: mpsc::UnboundedReceiver<(u32, u32)>,
    write: ChannelWrite,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some((cols, rows)) = rx.recv().await {
            if write.window_change(cols, rows, 0, 0).await.is_err() {
                break;
            }
        }
    })
}

/// The remote side's output to `stdout` and `stderr` until the channel closes, and how it
/// ended; a connection that ends first is [`ExitOutcome::Lost`].
async fn relay_output(
    read: &mut russh::ChannelReadHalf,
    stdout: &mut Box<dyn AsyncWrite + Send + Unpin>,
    stderr: &mut Box<dyn AsyncWrite + Send + Unpin>,
) -> Result<ExitOutcome, SshError> {
    let mut exit = ExitOutcome::Unknown;
    let mut closed = false;
    let mut result = Ok(());
    while let Some(msg) = read.wait().await {
        match msg {
            ChannelMsg::Data { data } => {
                if let Err(e) = write_flush(stdout, &data).await {
                    result = Err(e);
                    break;
                }
            }
            ChannelMsg::ExtendedData { data, ext: 1 } => {
                if let Err(e) = write_flush(stderr, &data).await {
                    result = Err(e);
                    break;
                }
            }
            ChannelMsg::ExitStatus { exit_status } => exit = ExitOutcome::Status(exit_status),
            ChannelMsg::ExitSignal { signal_name, .. } => {
                exit = ExitOutcome::Signal(format!("{signal_name:?}"))
            }
            ChannelMsg::Failure => {
                result = Err(SshError::Transport(
                    "the guest refused the session request".into(),
                ));
            }
            ChannelMsg::Close => {
                closed = true;
                break;
            }
            _ => {}
        }
    }
    if !closed && result.is_ok() {
        exit = ExitOutcome::Lost {
            status: match exit {
                ExitOutcome::Status(s) => Some(s),
                _ => None,
            },
        };
    }
    result.map(|()| exit)
}

async fn write_flush(
    out: &mut (dyn AsyncWrite + Send + Unpin),
    data: &[u8],
) -> Result<(), SshError> {
    out.write_all(data).await?;
    out.flush().await?;
    Ok(())
}

fn refused(user: &str, how: &str) -> SshError {
    SshError::AuthRefused(format!("the guest refused {how} for user {user:?}"))
}

async fn authenticate(
    handle: &mut Handle<ClientHandler>,
    user: &str,
    auth: &Auth,
) -> Result<(), SshError> {
    match auth {
        Auth::Certificate(id) => {
            let result = handle
                .authenticate_openssh_cert(user, id.key.clone(), id.certificate.clone())
                .await
                .map_err(transport)?;
            if result.success() {
                Ok(())
            } else {
                Err(refused(user, "the platform certificate"))
            }
        }
        Auth::Key(key) => {
            let hash = handle
                .best_supported_rsa_hash()
                .await
                .map_err(transport)?
                .flatten();
            let result = handle
                .authenticate_publickey(user, PrivateKeyWithHashAlg::new(key.clone(), hash))
                .await
                .map_err(transport)?;
            if result.success() {
                Ok(())
            } else {
                Err(refused(user, "the key"))
            }
        }
        Auth::Agent => {
            let mut agent = AgentClient::connect_env().await.map_err(|e| {
                SshError::AuthRefused(format!("no usable ssh-agent (SSH_AUTH_SOCK): {e}"))
            })?;
            let identities = agent
                .request_identities()
                .await
                .map_err(|e| SshError::AuthRefused(format!("ssh-agent: {e}")))?;
            for identity in identities {
                let result = match identity {
                    AgentIdentity::PublicKey { key, .. } => {
                        handle
                            .authenticate_publickey_with(user, key, None, &mut agent)
                            .await
                    }
                    AgentIdentity::Certificate { certificate, .. } => {
                        handle
                            .authenticate_certificate_with(user, certificate, None, &mut agent)
                            .await
                    }
                };
                if matches!(result, Ok(r) if r.success()) {
                    return Ok(());
                }
            }
            Err(refused(user, "every ssh-agent key"))
        }
    }
}
