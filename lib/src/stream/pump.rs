//! The task that owns a platform websocket and copies bytes between it and the caller's duplex.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, WriteHalf};
use tokio::sync::watch;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// How a stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEnd {
    /// The server sent a close frame.
    Closed {
        /// The close code (1000 normal, 1001 going away, …).
        code: u16,
        /// The close reason text, possibly empty.
        reason: String,
    },
    /// The connection broke without a close frame (1006): the server dropped it (KubeVirt does
    /// this to a console session another user displaced, and when the VM stops or moves),
    /// or the network failed.
    Abnormal(String),
    /// This side closed the stream.
    Local,
}

impl StreamEnd {
    /// The close code as the websocket RFC numbers it (1006 for an abnormal end).
    pub fn code(&self) -> u16 {
        match self {
            StreamEnd::Closed { code, .. } => *code,
            StreamEnd::Abnormal(_) => 1006,
            StreamEnd::Local => 1000,
        }
    }

    /// A short reason for users.
    pub fn describe(&self) -> String {
        let known = match self.code() {
            1000 => "the server closed the stream",
            1001 => "the server is going away (another user connected, or the server restarts)",
            1006 => "the connection was lost",
            1008 => "the server refused the stream (policy violation)",
            1011 => "the server failed (internal error)",
            1012 => "the server is restarting",
            _ => "the stream was closed",
        };
        match self {
            StreamEnd::Closed { reason, .. } if !reason.is_empty() => format!("{known}: {reason}"),
            StreamEnd::Abnormal(cause) if !cause.is_empty() => format!("{known}: {cause}"),
            _ => known.to_owned(),
        }
    }
}

/// Missed pongs tolerated: with no frame at all from the server for this many ping intervals the
/// connection counts as lost.
const DEAD_AFTER_PINGS: u32 = 3;
/// How long to wait for the server's answer to our close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Bytes from the server held for a local reader that does not keep up. The pump reads on
/// meanwhile, and so answers the server's pings: virt-api drops a connection whose pong is a
/// minute late (`keepAliveTimeout`), so a reader stalled that long (a paused pager, a full pipe)
/// would otherwise lose its session. An ssh session has at most its channel window (2 MiB)
/// plus socket buffers in flight, well under this; past it the pump stops reading and the
/// server's flow control takes over.
pub(super) const HELD_FOR_SLOW_READER: usize = 16 << 20;

/// Frames from the server not yet written to the caller, oldest first.
#[derive(Default)]
struct Held {
    frames: VecDeque<Bytes>,
    bytes: usize,
}

impl Held {
    fn push(&mut self, data: Bytes) {
        self.bytes += data.len();
        self.frames.push_back(data);
    }

    /// `n` bytes of the oldest frame were written.
    fn consume(&mut self, n: usize) {
        self.bytes -= n;
        if let Some(front) = self.frames.front_mut() {
            if n >= front.len() {
                self.frames.pop_front();
            } else {
                *front = front.slice(n..);
            }
        }
    }

    fn front(&self) -> &[u8] {
        self.frames.front().map_or(&[], |b| &b[..])
    }

    /// Writes everything held (the stream is ending: what came before the end is delivered).
    async fn deliver(&mut self, local: &mut WriteHalf<DuplexStream>) {
        while let Some(data) = self.frames.pop_front() {
            if local.write_all(&data).await.is_err() {
                break;
            }
        }
        self.bytes = 0;
    }
}

pub(super) async fn run<S>(
    mut ws: WebSocketStream<S>,
    local: DuplexStream,
    ping: Duration,
    end: watch::Sender<Option<StreamEnd>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut local_rd, mut local_wr) = tokio::io::split(local);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + ping, ping);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_heard = tokio::time::Instant::now();
    let mut buf = vec![0u8; super::BUFFER];
    let mut held = Held::default();
    let result = loop {
        let reading = held.bytes < HELD_FOR_SLOW_READER;
        tokio::select! {
            frame = ws.next(), if reading => {
                last_heard = tokio::time::Instant::now();
                match frame {
                    Some(Ok(Message::Binary(data))) => held.push(data),
                    // Text and other frames are skipped; pings are answered by tungstenite.
                    Some(Ok(Message::Close(frame))) => {
                        let (code, reason) = frame
                            .map(|f| (u16::from(f.code), f.reason.to_string()))
                            .unwrap_or((1005, String::new()));
                        let _ = ws.flush().await;
                        held.deliver(&mut local_wr).await;
                        break StreamEnd::Closed { code, reason };
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        held.deliver(&mut local_wr).await;
                        break StreamEnd::Abnormal(describe(&e));
                    }
                    None => {
                        held.deliver(&mut local_wr).await;
                        break StreamEnd::Abnormal(String::new());
                    }
                }
            }
            written = local_wr.write(held.front()), if held.bytes > 0 => match written {
                Ok(n) if n > 0 => held.consume(n),
                // The caller dropped its side: close normally.
                _ => break close(&mut ws, &mut local_wr, &mut Held::default()).await,
            },
            n = local_rd.read(&mut buf) => match n {
                Ok(0) | Err(_) => break close(&mut ws, &mut local_wr, &mut held).await,
                Ok(n) => {
                    if let Err(e) = ws.send(Message::Binary(buf[..n].to_vec().into())).await {
                        break StreamEnd::Abnormal(describe(&e));
                    }
                }
            },
            _ = ticker.tick() => {
                if !reading {
                    // A slow local reader is not a silent server: while the pump does not
                    // read, the server's silence is not counted.
                    last_heard = tokio::time::Instant::now();
                } else if last_heard.elapsed() > ping * DEAD_AFTER_PINGS {
                    break StreamEnd::Abnormal(format!(
                        "no answer from the server for {} s", last_heard.elapsed().as_secs()
                    ));
                }
                if let Err(e) = ws.send(Message::Ping(Vec::new().into())).await {
                    break StreamEnd::Abnormal(describe(&e));
                }
            }
        }
    };
    // Publish the end before the caller sees end-of-file, so it can tell why.
    let _ = end.send(Some(result));
    let _ = local_wr.shutdown().await;
}

/// Sends a normal close and waits for the server's close: what is held and data frames that
/// arrive meanwhile still reach `local` (the server may have sent them before it saw our
/// close); the wait ends after [`CLOSE_WAIT`] without any frame.
async fn close<S>(
    ws: &mut WebSocketStream<S>,
    local: &mut WriteHalf<DuplexStream>,
    held: &mut Held,
) -> StreamEnd
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    held.deliver(local).await;
    let frame = CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    };
    if ws.send(Message::Close(Some(frame))).await.is_ok() {
        let mut local_open = true;
        while let Ok(Some(Ok(m))) = tokio::time::timeout(CLOSE_WAIT, ws.next()).await {
            match m {
                Message::Close(_) => break,
                Message::Binary(data) if local_open => {
                    local_open = local.write_all(&data).await.is_ok();
                }
                _ => {}
            }
        }
    }
    StreamEnd::Local
}

fn describe(err: &WsError) -> String {
    match err {
        WsError::Protocol(
            tokio_tungstenite::tungstenite::error::ProtocolError::ResetWithoutClosingHandshake,
        ) => "closed without a close frame".into(),
        WsError::Io(e) => e.to_string(),
        other => other.to_string(),
    }
}
