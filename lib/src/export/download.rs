//! Downloading one volume: raw with HTTP Range, resumed within a run after retryable errors
//! (bounded, with backoff) and across runs through `FILE.partial` (validated with If-Range on
//! the ETag or Last-Modified, and the size); the checksum is computed while streaming (over
//! the kept part first on resume). The file takes its final name only when complete and
//! verified. Memory stays bounded: each received chunk is copied at once, while still in
//! cache, into [`DownloadFile`](super::file::DownloadFile)'s aligned 1 MiB blocks (written with
//! `O_DIRECT` by its writer thread) and handed (shared, not copied) to a hashing thread through
//! a queue of four 512 KiB batches, so receiving, writing and hashing overlap
//! ([`super::output`]); how each answer is read is [`super::answer`].

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use http_body_util::BodyExt;

use super::answer::{self, Answer, Verdict};
use super::checksum::{Algo, Hasher};
use super::http::{HttpClient, HttpError};
use super::output::{Output, create_private};
use super::{Event, ExportOptions};
use crate::error::{Error, Result};

/// Read size when hashing the kept part of a partial download.
const READ_CHUNK: usize = 512 << 10;
/// A body that sends nothing for this long is broken.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Progress events at most this often.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// One volume to fetch.
#[derive(Debug, Clone)]
pub struct Job {
    /// Volume name (for messages).
    pub volume: String,
    /// URL of the volume.
    pub url: String,
    /// The URL serves gzip.
    pub gzip: bool,
    /// Unpack the gzip while writing.
    pub decompress: bool,
    /// Final file; `None` writes to stdout.
    pub path: Option<PathBuf>,
    /// Fetched raw, written gzip-compressed once complete ([`super::compress`]).
    pub compress: bool,
}

/// What a finished download produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// Bytes in the output.
    pub bytes: u64,
    /// Digest, hex.
    pub hex: String,
    /// Bytes received over the network in this run.
    pub fetched: u64,
}

pub use super::answer::PartialMeta;

/// `FILE.partial`.
pub fn partial_path(path: &Path) -> PathBuf {
    with_suffix(path, ".partial")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Hashes the first `len` bytes of a file with a bounded buffer.
fn hash_prefix(path: &Path, len: u64, algo: Algo) -> std::io::Result<Hasher> {
    let mut hasher = algo.hasher();
    let mut file = File::open(path)?.take(len);
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher)
}

fn read_meta(path: &Path) -> Option<PartialMeta> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn write_meta(path: &Path, meta: &PartialMeta) -> std::io::Result<()> {
    let mut f = create_private(path, false)?;
    f.write_all(&serde_json::to_vec(meta).unwrap_or_default())
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Transfer(format!("cannot {what} {}: {e}", path.display()))
}

/// Downloads one volume. Emits `VolumeStarted`, `Progress`, `Retrying`, `Notice` and
/// `VolumeFinished`.
pub async fn download(
    client: &HttpClient,
    job: &Job,
    options: &ExportOptions,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<Done> {
    let algo = options
        .expected
        .as_ref()
        .map(|e| e.algo)
        .unwrap_or(options.algo);
    // gzip cannot be fetched from an offset.
    let ranged = !job.gzip;
    let format = if job.gzip { "gzip" } else { "raw" }.to_string();
    let partial = job.path.as_deref().map(partial_path);
    let meta_path = partial.as_deref().map(|p| with_suffix(p, ".meta"));

    // What an earlier run left.
    let (mut offset, mut meta, hasher) = match (&partial, &meta_path) {
        (Some(partial), Some(meta_path)) => {
            resume_point(
                partial,
                meta_path,
                options.resume,
                ranged,
                &format,
                algo,
                on_event,
            )
            .await?
        }
        _ => (0, None, algo.hasher()),
    };
    if let Some(p) = &partial {
        // Emptied unless resuming; the kept part ends at `offset`.
        create_private(p, offset > 0).map_err(|e| io_err("create", p, e))?;
    }
    on_event(Event::VolumeStarted {
        volume: job.volume.clone(),
        path: job.path.clone(),
        total: meta.as_ref().map(|m| m.size),
        offset,
    });

    let write_error = |e: std::io::Error| match &partial {
        Some(p) => io_err("write", p, e),
        None => Error::Transfer(format!("cannot write to stdout: {e}")),
    };
    let mut output =
        Output::new(partial.clone(), offset, algo, hasher, job.decompress).map_err(write_error)?;
    let result = transfer(
        client,
        job,
        options,
        &mut output,
        &mut offset,
        &mut meta,
        meta_path.as_deref(),
        on_event,
    )
    .await;
    // Everything received so far is written even when the transfer failed: it is kept.
    let finished = output.finish();
    let fetched = result.map_err(|e| match e {
        TransferError::Write(e) => write_error(e),
        TransferError::Other(e) => e,
    })?;
    let (hex, bytes) = finished.map_err(write_error)?;

    if let Some(expected) = &options.expected {
        check_expected(job, expected, algo, &hex, partial.as_deref())?;
    }
    let checksum_file = match (&job.path, &partial) {
        (Some(path), Some(partial)) => {
            place_file(
                job,
                path,
                partial,
                meta_path.as_deref(),
                algo,
                &hex,
                on_event,
            )
            .await?
        }
        _ => None,
    };
    on_event(Event::VolumeFinished {
        volume: job.volume.clone(),
        path: job.path.clone(),
        bytes,
        algo,
        hex: hex.clone(),
        checksum_file,
        fetched,
    });
    Ok(Done {
        bytes,
        hex,
        fetched,
    })
}

/// `--checksum`: the data received must have the digest the user expects; on a mismatch the
/// data stays in its partial file (`partial`) and is not put in place.
fn check_expected(
    job: &Job,
    expected: &super::checksum::Expected,
    algo: Algo,
    hex: &str,
    partial: Option<&Path>,
) -> Result<()> {
    if expected.hex == hex {
        return Ok(());
    }
    let kept = partial
        .map(|p| format!("; the data is kept as {}", p.display()))
        .unwrap_or_default();
    Err(Error::Transfer(format!(
        "checksum mismatch for volume {}: expected {}:{}, got {algo}:{hex}{kept}",
        job.volume, expected.algo, expected.hex
    )))
}

/// Where an earlier run of this download stopped: the offset to continue from, the partial
/// file's metadata and the hash of the bytes kept. Resumes only with `--resume`, a ranged
/// (raw) transfer and a partial file that matches this export; says why otherwise.
async fn resume_point(
    partial: &Path,
    meta_path: &Path,
    resume: bool,
    ranged: bool,
    format: &str,
    algo: Algo,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<(u64, Option<PartialMeta>, Hasher)> {
    let mut offset = 0u64;
    let mut meta: Option<PartialMeta> = None;
    let mut hasher = algo.hasher();
    let existing = std::fs::metadata(partial).ok().map(|m| m.len());
    match (resume, existing) {
        (true, Some(len)) if len > 0 => match read_meta(meta_path) {
            Some(m) if ranged && m.format == format && len <= m.size => {
                let path = partial.to_path_buf();
                hasher = tokio::task::spawn_blocking(move || hash_prefix(&path, len, algo))
                    .await
                    .map_err(|e| Error::Internal(e.to_string()))?
                    .map_err(|e| io_err("read", partial, e))?;
                offset = len;
                meta = Some(m);
                on_event(Event::Notice {
                    message: format!(
                        "resuming {} at byte {offset} of {}",
                        partial.display(),
                        meta.as_ref().map(|m| m.size).unwrap_or(0)
                    ),
                });
            }
            _ if !ranged => on_event(Event::Notice {
                message: format!(
                    "{} cannot be resumed (the gzip format has no ranges): starting over",
                    partial.display()
                ),
            }),
            _ => on_event(Event::Notice {
                message: format!(
                    "{} does not match this export: starting over",
                    partial.display()
                ),
            }),
        },
        (true, _) => on_event(Event::Notice {
            message: format!(
                "no {} to resume: starting from the beginning",
                partial.display()
            ),
        }),
        (false, Some(_)) => on_event(Event::Notice {
            message: format!(
                "{} exists from an earlier run: starting over (--resume continues it)",
                partial.display()
            ),
        }),
        (false, None) => {}
    }
    Ok((offset, meta, hasher))
}

/// Puts the finished partial file under its final name (gzip-compressed with `--compress`)
/// and writes the checksum sidecar in `sha256sum` format; returns the sidecar's path when it
/// is the data's own checksum (not the compressed file's).
async fn place_file(
    job: &Job,
    path: &Path,
    partial: &Path,
    meta_path: Option<&Path>,
    algo: Algo,
    hex: &str,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<Option<PathBuf>> {
    // The sidecar holds the digest of the file it names (`sha256sum -c`).
    let file_hex = if job.compress {
        let (raw, dst) = (partial.to_path_buf(), path.to_path_buf());
        let packed =
            tokio::task::spawn_blocking(move || super::compress::gzip_into(&raw, &dst, algo))
                .await
                .map_err(|e| Error::Internal(e.to_string()))?
                .map_err(|e| io_err("gzip", partial, e))?;
        on_event(Event::Notice {
            message: format!(
                "{} is gzip-compressed: {} bytes, {algo}:{} (written to {}); the data's {algo} follows",
                path.display(),
                packed.bytes,
                packed.hex,
                with_suffix(path, &format!(".{algo}")).display()
            ),
        });
        packed.hex
    } else {
        std::fs::rename(partial, path).map_err(|e| io_err("rename", partial, e))?;
        hex.to_owned()
    };
    if let Some(m) = meta_path {
        let _ = std::fs::remove_file(m);
    }
    let sum_path = with_suffix(path, &format!(".{algo}"));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut f = create_private(&sum_path, false).map_err(|e| io_err("create", &sum_path, e))?;
    // The `sha256sum` format: digest, two spaces, file name (relative to the sum file).
    writeln!(f, "{file_hex}  {name}").map_err(|e| io_err("write", &sum_path, e))?;
    // Compressed, the sum file is the gzip file's, not that of the data reported.
    Ok((!job.compress).then_some(sum_path))
}

/// The request loop: returns bytes fetched over the network. Each answer is judged against
/// what is on disk ([`answer::judge`]); data that is not the source's any more is thrown
/// away and asked for again; a failed attempt is retried after [`answer::backoff`].
#[allow(clippy::too_many_arguments)]
async fn transfer(
    client: &HttpClient,
    job: &Job,
    options: &ExportOptions,
    output: &mut Output,
    offset: &mut u64,
    meta: &mut Option<PartialMeta>,
    meta_path: Option<&Path>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> std::result::Result<u64, TransferError> {
    let ranged = !job.gzip;
    let mut fetched = 0u64;
    let mut failures = 0u32;
    'requests: loop {
        let headers = answer::request_headers(ranged, *offset, meta.as_ref());
        let method = if answer::complete(meta.as_ref(), *offset) {
            Method::HEAD
        } else {
            Method::GET
        };
        let outcome: std::result::Result<(), HttpError> =
            match client.send(method.clone(), &job.url, &headers).await {
                Err(e) => Err(e),
                Ok(response) => 'answer: {
                    let answered = Answer::of(&response);
                    let total = match answer::judge(&answered, meta.as_ref(), *offset, job.gzip) {
                        Verdict::Complete => return Ok(fetched),
                        Verdict::Continue { total } => total,
                        Verdict::StartOver { total } => {
                            let discarded = start_over(job, options, output, offset, on_event)?;
                            *meta = None;
                            if answered.status != StatusCode::OK || method == Method::HEAD {
                                if discarded {
                                    continue 'requests;
                                }
                                // Nothing was thrown away, so starting over changes nothing: the
                                // answer itself is wrong (204, 416, a 206 for another range). It
                                // goes through the retry path: counted, delayed, bounded.
                                break 'answer Err(HttpError::Status {
                                    code: answered.status.as_u16(),
                                    message: "not the data asked for".into(),
                                });
                            }
                            total
                        }
                    };
                    if meta.is_none() {
                        *meta = Some(remember_source(job, &answered, total, meta_path)?);
                        on_event(Event::Progress {
                            volume: job.volume.clone(),
                            done: *offset,
                            total,
                        });
                    }
                    let before = *offset;
                    let r = stream_body(response, job, output, offset, total, on_event).await;
                    let progressed = *offset > before;
                    fetched += *offset - before;
                    if progressed {
                        failures = 0;
                    }
                    match r {
                        Ok(()) if total.is_none_or(|t| *offset >= t) => return Ok(fetched),
                        Ok(()) => Err(HttpError::Body(format!(
                            "the body ended at byte {offset} of {}",
                            total.unwrap_or(0)
                        ))),
                        Err(StreamError::Write(e)) => return Err(TransferError::Write(e)),
                        Err(StreamError::Http(e)) => Err(e),
                    }
                }
            };
        let Err(error) = outcome else { continue };
        failures += 1;
        let Some(delay) =
            answer::backoff(&error, failures, options.max_retries, options.retry_delay)
        else {
            let tries = if failures > 1 {
                format!(" (after {failures} attempts)")
            } else {
                String::new()
            };
            return Err(Error::Transfer(format!(
                "downloading volume {}: {error}{tries}",
                job.volume
            ))
            .into());
        };
        on_event(Event::Retrying {
            attempt: failures,
            max: options.max_retries,
            error: error.to_string(),
            offset: *offset,
            delay,
        });
        tokio::time::sleep(delay).await;
    }
}

/// The validators of the source a download starts (or starts over) from, kept beside the
/// partial file (`meta_path`; a ranged download only) so that a later run resumes only the
/// same data.
fn remember_source(
    job: &Job,
    answered: &Answer,
    total: Option<u64>,
    meta_path: Option<&Path>,
) -> Result<PartialMeta> {
    let m = PartialMeta {
        etag: answered.etag.clone(),
        last_modified: answered.last_modified.clone(),
        size: total.unwrap_or(0),
        format: if job.gzip { "gzip" } else { "raw" }.to_string(),
    };
    if let Some(p) = meta_path
        && !job.gzip
    {
        write_meta(p, &m).map_err(|e| io_err("write", p, e))?;
    }
    Ok(m)
}

/// Throws away what is on disk when the source's answer does not continue it (a changed
/// source, or a gzip stream that cannot resume): says so, and empties the output. Refused on
/// stdout, which cannot take back what it wrote. Whether anything was thrown away.
fn start_over(
    job: &Job,
    options: &ExportOptions,
    output: &mut Output,
    offset: &mut u64,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> std::result::Result<bool, TransferError> {
    if *offset == 0 {
        return Ok(false);
    }
    if options.output == super::Output::Stdout {
        return Err(Error::Transfer(
            "the source changed during the transfer and stdout cannot start over".into(),
        )
        .into());
    }
    on_event(Event::Notice {
        message: if job.gzip {
            "the gzip stream cannot continue from an offset: starting over".into()
        } else {
            "the source changed since the partial download: starting over".into()
        },
    });
    output.restart().map_err(TransferError::Write)?;
    *offset = 0;
    Ok(true)
}

/// Why the request loop stopped.
enum TransferError {
    /// Writing the output failed.
    Write(std::io::Error),
    Other(Error),
}

impl From<Error> for TransferError {
    fn from(e: Error) -> Self {
        TransferError::Other(e)
    }
}

enum StreamError {
    Http(HttpError),
    Write(std::io::Error),
}

/// Writes the body's chunks as they arrive, counting `offset` and reporting progress.
async fn stream_body(
    response: http::Response<hyper::body::Incoming>,
    job: &Job,
    output: &mut Output,
    offset: &mut u64,
    total: Option<u64>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> std::result::Result<(), StreamError> {
    let mut body = response.into_body();
    let mut last = Instant::now();
    // One idle timer re-armed at most once a second, not a timer per frame.
    let idle = tokio::time::sleep(IDLE_TIMEOUT);
    tokio::pin!(idle);
    let mut armed = Instant::now();
    let outcome = loop {
        let next = tokio::select! {
            biased;
            f = body.frame() => f,
            _ = &mut idle => break Err(StreamError::Http(HttpError::Body("no data for 60s".into()))),
        };
        let frame = match next {
            None => break Ok(()),
            Some(Err(e)) => break Err(StreamError::Http(HttpError::Body(e.to_string()))),
            Some(Ok(frame)) => frame,
        };
        if armed.elapsed() >= Duration::from_secs(1) {
            armed = Instant::now();
            idle.as_mut()
                .reset(tokio::time::Instant::now() + IDLE_TIMEOUT);
        }
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let n = data.len() as u64;
        if let Err(e) = output.write(data) {
            break Err(StreamError::Write(e));
        }
        *offset += n;
        if last.elapsed() >= PROGRESS_EVERY {
            last = Instant::now();
            on_event(Event::Progress {
                volume: job.volume.clone(),
                done: *offset,
                total,
            });
        }
    };
    on_event(Event::Progress {
        volume: job.volume.clone(),
        done: *offset,
        total,
    });
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_names() {
        assert_eq!(
            partial_path(Path::new("/tmp/disk.img")),
            PathBuf::from("/tmp/disk.img.partial")
        );
    }
}
