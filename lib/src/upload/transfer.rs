//! Sending the file: one POST with the whole file as a streamed body (1 MiB reads, so memory
//! stays constant whatever the size), sha256 computed over exactly the bytes sent. CDI's
//! upload server cannot resume (it takes one stream), so a retry starts from the beginning,
//! and says so.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, Method, header};
use http_body_util::BodyExt;
use hyper::body::Frame;
use sha2::Digest;
use tokio::io::AsyncReadExt;

use super::Event;
use crate::error::{Error, Result};
use crate::export::http::{HttpClient, HttpError};

const CHUNK: usize = 1 << 20;
/// How often progress is reported while sending.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// One line for a failed attempt, in the upload proxy's words where it answered (the shared
/// client words its own failures for export servers).
pub(crate) fn describe(e: &HttpError) -> String {
    match e {
        HttpError::Status { code, message } if message.is_empty() => {
            format!("the upload proxy answered {code}")
        }
        HttpError::Status { code, message } => {
            format!("the upload proxy answered {code}: {message}")
        }
        other => other
            .to_string()
            .replace("the export server", "the upload proxy"),
    }
}

/// The file as a body of `total` bytes: chunks read as hyper asks for them, counted in
/// `sent`, hashed; the digest lands in `digest` with the last byte (hyper stops asking once
/// Content-Length bytes went out). A file that shrank fails the body.
fn body(
    file: tokio::fs::File,
    total: u64,
    sent: Arc<AtomicU64>,
    digest: Arc<Mutex<Option<String>>>,
) -> impl hyper::body::Body<Data = Bytes, Error = std::io::Error> + Send + 'static {
    let state = (file, Some(sha2::Sha256::new()), 0u64);
    let stream = futures::stream::unfold(state, move |(mut file, hasher, done)| {
        let sent = sent.clone();
        let digest = digest.clone();
        async move {
            let mut hasher = hasher?;
            if done >= total {
                return None;
            }
            let want = (total - done).min(CHUNK as u64) as usize;
            let mut buf = vec![0u8; want];
            let mut filled = 0;
            // Fill the chunk (reads may return less).
            while filled < want {
                match file.read(&mut buf[filled..]).await {
                    Ok(0) => {
                        let e = std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "the file got shorter while it was sent",
                        );
                        return Some((Err(e), (file, None, done)));
                    }
                    Ok(n) => filled += n,
                    Err(e) => return Some((Err(e), (file, None, done))),
                }
            }
            hasher.update(&buf);
            let done = done + filled as u64;
            sent.fetch_add(filled as u64, Ordering::Relaxed);
            if done == total {
                let hex: String = std::mem::take(&mut hasher)
                    .finalize()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                *digest.lock().unwrap_or_else(|e| e.into_inner()) = Some(hex);
            }
            Some((
                Ok(Frame::data(Bytes::from(buf))),
                (file, Some(hasher), done),
            ))
        }
    });
    http_body_util::StreamBody::new(stream)
}

/// Sends `path` to `url` (the client carries the token), retrying from the beginning on errors worth retrying.
/// Returns the bytes sent and their sha256.
#[allow(clippy::too_many_arguments)]
pub async fn send_file(
    client: &HttpClient,
    url: &str,
    path: &Path,
    max_retries: u32,
    first_delay: Duration,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<(u64, String)> {
    let total = std::fs::metadata(path)
        .map_err(|e| Error::Transfer(format!("cannot read {}: {e}", path.display())))?
        .len();
    let headers: Vec<(HeaderName, String)> = vec![
        (header::CONTENT_TYPE, "application/octet-stream".into()),
        (header::CONTENT_LENGTH, total.to_string()),
    ];
    let mut attempt = 0;
    let mut delay = first_delay;
    loop {
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| Error::Transfer(format!("cannot read {}: {e}", path.display())))?;
        let sent = Arc::new(AtomicU64::new(0));
        let digest = Arc::new(Mutex::new(None));
        on_event(Event::Started { total });
        let started = Instant::now();
        let request = client.send_body(
            Method::POST,
            url,
            &headers,
            body(file, total, sent.clone(), digest.clone()),
            false,
        );
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
                let hex = digest.lock().unwrap_or_else(|e| e.into_inner()).take();
                match hex {
                    Some(hex) if sent == total => Ok((sent, hex)),
                    _ => Err(HttpError::Body(format!(
                        "the upload proxy answered after {sent} of {total} bytes"
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
                attempt += 1;
                on_event(Event::Retrying {
                    attempt,
                    max: max_retries,
                    error: describe(&e),
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
                    describe(&e)
                )));
            }
        }
    }
}
