//! Sending the file: one POST with the whole file as a streamed body (1 MiB reads, so memory
//! stays constant whatever the size), sha256 computed over exactly the bytes sent. CDI's
//! upload server cannot resume (it takes one stream), so a retry starts from the beginning,
//! and says so.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, Method, header};
use http_body_util::BodyExt;
use hyper::body::Frame;
use sha2::Digest;

use super::Event;
use crate::error::{Error, Result};
use crate::export::http::{HttpClient, HttpError};

const CHUNK: usize = 1 << 20;
/// How often progress is reported while sending.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// One line for a failed attempt, in the words of `peer` ("the upload proxy", "the uploader")
/// where it answered (the shared client words its own failures for export servers).
pub(crate) fn describe(e: &HttpError, peer: &str) -> String {
    match e {
        HttpError::Status { code, message } if message.is_empty() => {
            format!("{peer} answered {code}")
        }
        HttpError::Status { code, message } => {
            format!("{peer} answered {code}: {message}")
        }
        other => other.to_string().replace("the export server", peer),
    }
}

/// Bytes of the file in flight between the reading thread and hyper: memory stays constant.
const QUEUE: usize = 4;

/// The file as a body of `total` bytes. A thread of its own reads it in 1 MiB chunks, hands
/// each chunk (shared, not copied) to hyper and then hashes it, so hashing overlaps the TLS
/// encryption and sending of the same chunk instead of adding to it (on one task it held
/// the upload to 0.66x of curl). The digest arrives on `digest` once the thread hashed the
/// last byte; a failed read (a file that shrank) fails the body; a dropped body (an error,
/// Ctrl-C) stops the thread at its next chunk.
fn body(
    file: std::fs::File,
    total: u64,
    sent: Arc<AtomicU64>,
) -> (
    impl hyper::body::Body<Data = Bytes, Error = std::io::Error> + Send + 'static,
    tokio::sync::oneshot::Receiver<String>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(QUEUE);
    let (digest_tx, digest_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut file = file;
        let mut hasher = sha2::Sha256::new();
        let mut done = 0u64;
        while done < total {
            let want = (total - done).min(CHUNK as u64) as usize;
            let mut buf = vec![0u8; want];
            if let Err(e) = std::io::Read::read_exact(&mut file, &mut buf) {
                let e = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    std::io::Error::new(e.kind(), "the file got shorter while it was sent")
                } else {
                    e
                };
                let _ = tx.blocking_send(Err(e));
                return;
            }
            let chunk = Bytes::from(buf);
            if tx.blocking_send(Ok(chunk.clone())).is_err() {
                return;
            }
            hasher.update(&chunk);
            done += want as u64;
        }
        let hex: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let _ = digest_tx.send(hex);
    });
    let stream = futures::stream::unfold(rx, move |mut rx| {
        let sent = sent.clone();
        async move {
            let chunk = rx.recv().await?;
            if let Ok(c) = &chunk {
                sent.fetch_add(c.len() as u64, Ordering::Relaxed);
            }
            Some((chunk.map(Frame::data), rx))
        }
    });
    (http_body_util::StreamBody::new(stream), digest_rx)
}

/// How [`send_file`] sends and retries.
pub struct Sending<'a> {
    /// Who answers, in messages ("the upload proxy").
    pub peer: &'a str,
    /// Attempts after the first.
    pub max_retries: u32,
    /// Delay before the first retry (doubles up to 8 s).
    pub first_delay: Duration,
}

/// Sends `path` to `url` (the client carries the token), retrying from the beginning on
/// errors worth retrying unless `before_retry`, given the error, says the target cannot take
/// a retry (its error ends the run). Returns the bytes sent and their sha256.
pub async fn send_file<F, Fut>(
    client: &HttpClient,
    url: &str,
    path: &Path,
    sending: &Sending<'_>,
    mut before_retry: F,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<(u64, String)>
where
    F: FnMut(&HttpError) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let (peer, max_retries) = (sending.peer, sending.max_retries);
    let total = std::fs::metadata(path)
        .map_err(|e| Error::Transfer(format!("cannot read {}: {e}", path.display())))?
        .len();
    let headers: Vec<(HeaderName, String)> = vec![
        (header::CONTENT_TYPE, "application/octet-stream".into()),
        (header::CONTENT_LENGTH, total.to_string()),
    ];
    let mut attempt = 0;
    let mut delay = sending.first_delay;
    loop {
        let file = std::fs::File::open(path)
            .map_err(|e| Error::Transfer(format!("cannot read {}: {e}", path.display())))?;
        let sent = Arc::new(AtomicU64::new(0));
        let (body, digest) = body(file, total, sent.clone());
        on_event(Event::Started { total });
        let started = Instant::now();
        let request = client.send_body(Method::POST, url, &headers, body, false);
        tokio::pin!(request);
        let mut ticker = tokio::time::interval(PROGRESS_EVERY);
        let result = loop {
            tokio::select! {
                r = &mut request => break r,
                _ = ticker.tick() => on_event(Event::Progress {
                    sent: sent.load(Ordering::Relaxed),
                    total,
                }),
            }
        };
        let result = match result {
            Ok(response) => {
                // The answer's body is empty or a note; read it so the connection ends cleanly.
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), response.into_body().collect())
                        .await;
                let sent = sent.load(Ordering::Relaxed);
                // The thread hashes the last chunk after handing it over: wait for that.
                match digest.await {
                    Ok(hex) if sent == total => Ok((sent, hex)),
                    _ => Err(HttpError::Body(format!(
                        "{peer} answered after {sent} of {total} bytes"
                    ))),
                }
            }
            Err(e) => Err(e),
        };
        match result {
            Ok((bytes, sha256)) => {
                on_event(Event::Progress { sent: bytes, total });
                on_event(Event::Sent {
                    bytes,
                    sha256: sha256.clone(),
                    secs: started.elapsed().as_secs_f64(),
                });
                return Ok((bytes, sha256));
            }
            Err(e) if e.retryable() && attempt < max_retries => {
                before_retry(&e).await?;
                attempt += 1;
                on_event(Event::Retrying {
                    attempt,
                    max: max_retries,
                    error: describe(&e, peer),
                    delay,
                });
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(8));
            }
            Err(e) => {
                let tries = if attempt > 0 {
                    format!(" (after {attempt} retries)")
                } else {
                    String::new()
                };
                return Err(Error::Transfer(format!(
                    "upload failed: {}{tries}",
                    describe(&e, peer)
                )));
            }
        }
    }
}
