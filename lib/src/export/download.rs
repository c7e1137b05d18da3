//! Downloading one volume: raw with HTTP Range, resumed within a run after retryable errors
//! (bounded, with backoff) and across runs through `FILE.partial` (validated with If-Range on
//! the ETag or Last-Modified, and the size); the checksum is computed while streaming (over
//! the kept part first on resume). The file takes its final name only when complete and
//! verified. Memory stays bounded: the network side coalesces into 512 KiB buffers handed to a
//! writer thread through a channel of four; the writer writes each buffer while a hashing
//! thread hashes the same (shared) buffer, so hashing and writing overlap (measured with
//! `perf`: one thread doing both was the bottleneck, the page-cache copy and sha256 each
//! taking about as long as the network side).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderName, Method, StatusCode, header};
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};

use super::checksum::{Algo, Hasher};
use super::http::{HttpClient, HttpError};
use super::{Event, ExportOptions};
use crate::error::{Error, Result};

/// Size of the buffers handed to the writer (large sequential writes).
const WRITE_CHUNK: usize = 512 << 10;
/// Buffers in flight between network and disk.
const QUEUE: usize = 4;
/// Buffers in flight between the writer and the hashing thread.
const HASH_QUEUE: usize = 2;
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

/// Validators of a partial download, kept next to it in `FILE.partial.meta`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartialMeta {
    /// The server's ETag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// The server's Last-Modified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<String>,
    /// The complete size.
    pub size: u64,
    /// The URL's volume and format, so a different export of the same data still resumes.
    pub format: String,
}

impl PartialMeta {
    fn validator(&self) -> Option<&str> {
        self.etag
            .as_deref()
            .filter(|e| !e.starts_with("W/"))
            .or(self.last_modified.as_deref())
    }
}

/// `FILE.partial`.
pub fn partial_path(path: &Path) -> PathBuf {
    with_suffix(path, ".partial")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Opens a file for appending with mode 0600 (also when it already existed), emptied unless
/// `keep`. Appending keeps writes sequential after a restart that empties it.
pub fn create_private(path: &Path, keep: bool) -> std::io::Result<File> {
    let file = open_private(path)?;
    if !keep {
        file.set_len(0)?;
    }
    Ok(file)
}

fn open_private(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.append(true).create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(0o600);
        let file = options.open(path)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        Ok(file)
    }
    #[cfg(not(unix))]
    options.open(path)
}

enum Msg {
    Data(Bytes),
    /// Start over: empty the file, reset the hash.
    Restart,
}

/// The output side: a file or stdout, optionally behind a gzip decoder; when it hashes what it
/// writes (decompressed output) `hasher` is set, else the hashing thread does it.
struct Sink {
    out: Box<dyn Write + Send>,
    hasher: Option<Hasher>,
    written: u64,
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

enum HashMsg {
    Data(Bytes),
    Reset(Hasher),
}

/// Hashes buffers on its own thread while the writer writes the same buffers (shared, not
/// copied): hashing and the page-cache copy of `write` then overlap instead of adding up.
struct HashThread {
    tx: std::sync::mpsc::SyncSender<HashMsg>,
    handle: std::thread::JoinHandle<Hasher>,
}

impl HashThread {
    fn start(mut hasher: Hasher) -> HashThread {
        let (tx, rx) = std::sync::mpsc::sync_channel::<HashMsg>(HASH_QUEUE);
        let handle = std::thread::spawn(move || {
            for msg in rx {
                match msg {
                    HashMsg::Data(b) => hasher.update(&b),
                    HashMsg::Reset(h) => hasher = h,
                }
            }
            hasher
        });
        HashThread { tx, handle }
    }

    fn send(&self, msg: HashMsg) -> std::io::Result<()> {
        self.tx
            .send(msg)
            .map_err(|_| std::io::Error::other("the hashing thread stopped"))
    }

    fn finish(self) -> std::io::Result<Hasher> {
        drop(self.tx);
        self.handle
            .join()
            .map_err(|_| std::io::Error::other("the hashing thread panicked"))
    }
}

/// The writer thread: writes buffers as they come, hashing them on a second thread (or inline
/// after decompression).
fn writer(
    mut rx: tokio::sync::mpsc::Receiver<Msg>,
    file: Option<File>,
    algo: Algo,
    hasher: Hasher,
    decompress: bool,
) -> std::io::Result<(String, u64)> {
    let open = |file: &Option<File>| -> std::io::Result<Box<dyn Write + Send>> {
        Ok(match file {
            Some(f) => Box::new(f.try_clone()?),
            None => Box::new(std::io::BufWriter::with_capacity(
                WRITE_CHUNK,
                std::io::stdout(),
            )),
        })
    };
    let new_sink = |hasher: Option<Hasher>, written: u64| -> std::io::Result<Sink> {
        Ok(Sink {
            out: open(&file)?,
            hasher,
            written,
        })
    };
    #[allow(clippy::large_enum_variant)]
    enum Out {
        Plain(Sink, HashThread),
        Gunzip(Box<flate2::write::GzDecoder<Sink>>),
    }
    let written = file
        .as_ref()
        .map(|f| f.metadata().map(|m| m.len()))
        .transpose()?
        .unwrap_or(0);
    let start = |hasher: Hasher, written: u64| -> std::io::Result<Out> {
        Ok(if decompress {
            Out::Gunzip(Box::new(flate2::write::GzDecoder::new(new_sink(
                Some(hasher),
                written,
            )?)))
        } else {
            Out::Plain(new_sink(None, written)?, HashThread::start(hasher))
        })
    };
    let mut out = start(hasher, written)?;
    while let Some(msg) = rx.blocking_recv() {
        match msg {
            Msg::Data(bytes) => match &mut out {
                Out::Plain(s, h) => {
                    h.send(HashMsg::Data(bytes.clone()))?;
                    s.write_all(&bytes)?;
                }
                Out::Gunzip(d) => d.write_all(&bytes)?,
            },
            Msg::Restart => {
                if let Some(f) = &file {
                    f.set_len(0)?;
                }
                match &mut out {
                    Out::Plain(s, h) => {
                        h.send(HashMsg::Reset(algo.hasher()))?;
                        *s = new_sink(None, 0)?;
                    }
                    Out::Gunzip(_) => out = start(algo.hasher(), 0)?,
                }
            }
        }
    }
    let (mut sink, hasher) = match out {
        Out::Plain(s, h) => (s, h.finish()?),
        Out::Gunzip(d) => {
            let mut s = d.finish()?;
            let h = s.hasher.take().unwrap_or_else(|| algo.hasher());
            (s, h)
        }
    };
    sink.flush()?;
    Ok((hasher.finish_hex(), sink.written))
}

/// Hashes the first `len` bytes of a file with a bounded buffer.
fn hash_prefix(path: &Path, len: u64, algo: Algo) -> std::io::Result<Hasher> {
    let mut hasher = algo.hasher();
    let mut file = File::open(path)?.take(len);
    let mut buf = vec![0u8; WRITE_CHUNK];
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

fn header_str(
    response: &http::Response<hyper::body::Incoming>,
    name: HeaderName,
) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

/// `Content-Range: bytes START-END/SIZE` → (START, SIZE).
fn content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let rest = value.strip_prefix("bytes ")?;
    let (range, size) = rest.split_once('/')?;
    let (start, _) = range.split_once('-')?;
    Some((start.parse().ok()?, size.parse().ok()))
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
    let mut offset = 0u64;
    let mut meta: Option<PartialMeta> = None;
    let mut hasher = algo.hasher();
    if let (Some(partial), Some(meta_path)) = (&partial, &meta_path) {
        let existing = std::fs::metadata(partial).ok().map(|m| m.len());
        match (options.resume, existing) {
            (true, Some(len)) if len > 0 => match read_meta(meta_path) {
                Some(m) if ranged && m.format == format && len <= m.size => {
                    let path = partial.clone();
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
    }
    let file = match &partial {
        Some(p) => Some(create_private(p, offset > 0).map_err(|e| io_err("create", p, e))?),
        None => None,
    };
    on_event(Event::VolumeStarted {
        volume: job.volume.clone(),
        path: job.path.clone(),
        total: meta.as_ref().map(|m| m.size),
        offset,
    });

    let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(QUEUE);
    let decompress = job.decompress;
    let writer_file = file;
    let writer_task = std::thread::spawn(move || writer(rx, writer_file, algo, hasher, decompress));

    let result = transfer(
        client,
        job,
        options,
        &tx,
        &mut offset,
        &mut meta,
        meta_path.as_deref(),
        on_event,
    )
    .await;
    drop(tx);
    let written = writer_task
        .join()
        .map_err(|_| Error::Internal("the writer thread panicked".into()))?;
    let fetched = result?;
    let (hex, bytes) = written.map_err(|e| match &partial {
        Some(p) => io_err("write", p, e),
        None => Error::Transfer(format!("cannot write to stdout: {e}")),
    })?;

    if let Some(expected) = &options.expected
        && expected.hex != hex
    {
        let kept = partial
            .as_ref()
            .map(|p| format!("; the data is kept as {}", p.display()))
            .unwrap_or_default();
        return Err(Error::Transfer(format!(
            "checksum mismatch for volume {}: expected {}:{}, got {algo}:{hex}{kept}",
            job.volume, expected.algo, expected.hex
        )));
    }
    let mut checksum_file = None;
    if let (Some(path), Some(partial)) = (&job.path, &partial) {
        std::fs::rename(partial, path).map_err(|e| io_err("rename", partial, e))?;
        if let Some(m) = &meta_path {
            let _ = std::fs::remove_file(m);
        }
        let sum_path = with_suffix(path, &format!(".{algo}"));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut f = create_private(&sum_path, false).map_err(|e| io_err("create", &sum_path, e))?;
        // The `sha256sum` format: digest, two spaces, file name (relative to the sum file).
        writeln!(f, "{hex}  {name}").map_err(|e| io_err("write", &sum_path, e))?;
        checksum_file = Some(sum_path);
    }
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

/// The request loop: returns bytes fetched over the network.
#[allow(clippy::too_many_arguments)]
async fn transfer(
    client: &HttpClient,
    job: &Job,
    options: &ExportOptions,
    tx: &tokio::sync::mpsc::Sender<Msg>,
    offset: &mut u64,
    meta: &mut Option<PartialMeta>,
    meta_path: Option<&Path>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<u64> {
    let ranged = !job.gzip;
    let format = if job.gzip { "gzip" } else { "raw" }.to_string();
    let mut fetched = 0u64;
    let mut failures = 0u32;
    let closed = || Error::Transfer("the writer stopped (disk full or output closed?)".into());
    loop {
        let mut headers: Vec<(HeaderName, String)> = vec![];
        if ranged && *offset > 0 {
            headers.push((header::RANGE, format!("bytes={offset}-")));
            if let Some(v) = meta.as_ref().and_then(|m| m.validator()) {
                headers.push((header::IF_RANGE, v.to_string()));
            }
        }
        let complete = meta
            .as_ref()
            .is_some_and(|m| *offset == m.size && m.size > 0);
        let method = if complete { Method::HEAD } else { Method::GET };
        let outcome: std::result::Result<(), HttpError> = match client
            .send(method.clone(), &job.url, &headers)
            .await
        {
            Err(e) => Err(e),
            Ok(response) => {
                let status = response.status();
                let etag = header_str(&response, header::ETAG);
                let last_modified = header_str(&response, header::LAST_MODIFIED);
                let length: Option<u64> =
                    header_str(&response, header::CONTENT_LENGTH).and_then(|v| v.parse().ok());
                let same_source = |m: &PartialMeta| {
                    (m.etag.is_some() && m.etag == etag)
                        || (m.etag.is_none()
                            && m.last_modified.is_some()
                            && m.last_modified == last_modified)
                };
                let mut restart = false;
                let mut total = meta.as_ref().map(|m| m.size);
                if complete {
                    // Everything is on disk already: only check it is still the same data.
                    if status == StatusCode::OK
                        && meta
                            .as_ref()
                            .is_some_and(|m| same_source(m) && Some(m.size) == length)
                    {
                        return Ok(fetched);
                    }
                    restart = true;
                } else if status == StatusCode::PARTIAL_CONTENT {
                    let range = header_str(&response, header::CONTENT_RANGE)
                        .as_deref()
                        .and_then(content_range);
                    match range {
                        Some((start, size)) if start == *offset && size == total => {}
                        _ => restart = true,
                    }
                } else if status == StatusCode::OK {
                    restart = *offset > 0;
                    total = if job.gzip { None } else { length };
                } else {
                    // 416 and anything unexpected: the data is not what we have.
                    restart = true;
                }
                if restart {
                    if *offset > 0 {
                        if options.output == super::Output::Stdout {
                            return Err(Error::Transfer(
                                "the source changed during the transfer and stdout cannot start over".into(),
                            ));
                        }
                        on_event(Event::Notice {
                            message: if job.gzip {
                                "the gzip stream cannot continue from an offset: starting over"
                                    .into()
                            } else {
                                "the source changed since the partial download: starting over"
                                    .into()
                            },
                        });
                        tx.send(Msg::Restart).await.map_err(|_| closed())?;
                        *offset = 0;
                    }
                    *meta = None;
                    if status != StatusCode::OK || method == Method::HEAD {
                        continue;
                    }
                }
                if meta.is_none() {
                    let m = PartialMeta {
                        etag: etag.clone(),
                        last_modified: last_modified.clone(),
                        size: total.unwrap_or(0),
                        format: format.clone(),
                    };
                    if let Some(p) = meta_path
                        && ranged
                    {
                        write_meta(p, &m).map_err(|e| io_err("write", p, e))?;
                    }
                    *meta = Some(m);
                    on_event(Event::Progress {
                        volume: job.volume.clone(),
                        done: *offset,
                        total,
                    });
                }
                let before = *offset;
                let r = stream_body(response, job, tx, offset, total, on_event).await;
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
                    Err(StreamError::Closed) => return Err(closed()),
                    Err(StreamError::Http(e)) => Err(e),
                }
            }
        };
        let Err(error) = outcome else { continue };
        failures += 1;
        if !error.retryable() || failures > options.max_retries {
            let tries = if failures > 1 {
                format!(" (after {failures} attempts)")
            } else {
                String::new()
            };
            return Err(Error::Transfer(format!(
                "downloading volume {}: {error}{tries}",
                job.volume
            )));
        }
        if job.gzip && *offset > 0 {
            // Start the stream over; the restart is announced on the next response.
        }
        let delay = options
            .retry_delay
            .saturating_mul(1 << (failures - 1).min(4))
            .min(Duration::from_secs(8));
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

enum StreamError {
    Http(HttpError),
    Closed,
}

/// Reads the body into 1 MiB buffers for the writer, counting `offset` and reporting progress.
async fn stream_body(
    response: http::Response<hyper::body::Incoming>,
    job: &Job,
    tx: &tokio::sync::mpsc::Sender<Msg>,
    offset: &mut u64,
    total: Option<u64>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> std::result::Result<(), StreamError> {
    let mut body = response.into_body();
    let mut buf = BytesMut::with_capacity(WRITE_CHUNK);
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
        if data.is_empty() {
            continue;
        }
        if buf.is_empty() && data.len() >= WRITE_CHUNK {
            let n = data.len() as u64;
            if tx.send(Msg::Data(data)).await.is_err() {
                break Err(StreamError::Closed);
            }
            *offset += n;
        } else {
            buf.extend_from_slice(&data);
            if buf.len() >= WRITE_CHUNK {
                let n = buf.len() as u64;
                if tx.send(Msg::Data(buf.split().freeze())).await.is_err() {
                    break Err(StreamError::Closed);
                }
                *offset += n;
                buf.reserve(WRITE_CHUNK);
            }
        }
        if last.elapsed() >= PROGRESS_EVERY {
            last = Instant::now();
            on_event(Event::Progress {
                volume: job.volume.clone(),
                done: *offset + buf.len() as u64,
                total,
            });
        }
    };
    // What arrived before an error is good data: keep it.
    if !buf.is_empty() {
        let n = buf.len() as u64;
        if tx.send(Msg::Data(buf.freeze())).await.is_err() {
            return Err(StreamError::Closed);
        }
        *offset += n;
    }
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
    fn content_range_parses() {
        assert_eq!(content_range("bytes 100-199/1000"), Some((100, Some(1000))));
        assert_eq!(content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(content_range("items 1-2/3"), None);
    }

    #[test]
    fn partial_names() {
        assert_eq!(
            partial_path(Path::new("/tmp/disk.img")),
            PathBuf::from("/tmp/disk.img.partial")
        );
    }

    #[test]
    fn private_files_are_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        create_private(&path, true).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}
