//! The task that owns a platform websocket and copies bytes between it and the caller's duplex.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
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

pub(super) async fn run<S>(
    mut ws: WebSocketStream<S>,
    mut local: DuplexStream,
    ping: Duration,
    end: watch::Sender<Option<StreamEnd>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + ping, ping);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_heard = tokio::time::Instant::now();
    let mut buf = vec![0u8; super::BUFFER];
    let result = loop {
        tokio::select! {
            frame = ws.next() => {
                last_heard = tokio::time::Instant::now();
                match frame {
                    Some(Ok(Message::Binary(data))) => {
                        if local.write_all(&data).await.is_err() {
                            // The caller dropped its side: close normally.
                            break close(&mut ws, &mut local).await;
                        }
                        // A slow local reader is not a silent server: the time spent
                        // waiting for it does not count toward the liveness limit.
                        last_heard = tokio::time::Instant::now();
                    }
                    // Text and other frames are skipped; pings are answered by tungstenite.
                    Some(Ok(Message::Close(frame))) => {
                        let (code, reason) = frame
                            .map(|f| (u16::from(f.code), f.reason.to_string()))
                            .unwrap_or((1005, String::new()));
                        let _ = ws.flush().await;
                        break StreamEnd::Closed { code, reason };
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => break StreamEnd::Abnormal(describe(&e)),
                    None => break StreamEnd::Abnormal(String::new()),
                }
            }
            n = local.read(&mut buf) => match n {
                Ok(0) | Err(_) => break close(&mut ws, &mut local).await,
                Ok(n) => {
                    if let Err(e) = ws.send(Message::Binary(buf[..n].to_vec().into())).await {
                        break StreamEnd::Abnormal(describe(&e));
                    }
                }
            },
            _ = ticker.tick() => {
                if last_heard.elapsed() > ping * DEAD_AFTER_PINGS {
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
    let _ = local.shutdown().await;
}

/// Sends a normal close and waits for the server's close: data frames that arrive meanwhile
/// still reach `local` (the server may have sent them before it saw our close); the wait ends
/// after [`CLOSE_WAIT`] without any frame.
async fn close<S>(ws: &mut WebSocketStream<S>, local: &mut DuplexStream) -> StreamEnd
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
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
