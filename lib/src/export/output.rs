//! Where a download's received bytes go: the partial file (through [`DownloadFile`]'s aligned
//! blocks) or stdout, optionally through a gzip decoder, with the checksum computed on a
//! hashing thread fed the same chunks; and the private (0600) files downloads write.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::checksum::{Algo, Hasher};
use super::file::DownloadFile;

/// Bytes of received chunks handed to the hashing thread at once.
const HASH_BATCH: usize = 512 << 10;
/// Batches in flight between the network side and the hashing thread.
const HASH_QUEUE: usize = 4;
/// Buffer in front of stdout (a pipe takes large writes best).
const STDOUT_BUFFER: usize = 512 << 10;

/// Opens a file for writing with mode 0600 (also when it already existed), emptied unless
/// `keep`.
pub fn create_private(path: &Path, keep: bool) -> std::io::Result<File> {
    let file = open_private(path)?;
    if !keep {
        file.set_len(0)?;
    }
    Ok(file)
}

fn open_private(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create(true);
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

/// Runs a blocking call (a file write) from async code: on a multi-threaded runtime through
/// `block_in_place` so other tasks move to another worker; on a current-thread runtime
/// directly, as the whole runtime serves this transfer.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
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
    Data(Vec<Bytes>),
    Reset(Hasher),
}

/// Hashes buffers on its own thread while the network side writes the same buffers (shared,
/// not copied): hashing then overlaps receiving and writing instead of adding to them.
struct HashThread {
    tx: std::sync::mpsc::SyncSender<HashMsg>,
    handle: std::thread::JoinHandle<Hasher>,
    /// Received chunks not yet handed over, sent in batches of `HASH_BATCH` bytes so the
    /// thread wakes up once per batch, not once per chunk.
    batch: Vec<Bytes>,
    batched: usize,
}

impl HashThread {
    fn start(mut hasher: Hasher) -> HashThread {
        let (tx, rx) = std::sync::mpsc::sync_channel::<HashMsg>(HASH_QUEUE);
        let handle = std::thread::spawn(move || {
            for msg in rx {
                match msg {
                    HashMsg::Data(chunks) => chunks.iter().for_each(|c| hasher.update(c)),
                    HashMsg::Reset(h) => hasher = h,
                }
            }
            hasher
        });
        HashThread {
            tx,
            handle,
            batch: Vec::new(),
            batched: 0,
        }
    }

    fn send(&self, msg: HashMsg) -> std::io::Result<()> {
        // Blocks only when the hashing thread is `HASH_QUEUE` batches behind: back-pressure
        // that keeps memory bounded.
        if blocking(|| self.tx.send(msg).is_ok()) {
            Ok(())
        } else {
            Err(std::io::Error::other("the hashing thread stopped"))
        }
    }

    fn push(&mut self, data: Bytes) -> std::io::Result<()> {
        self.batched += data.len();
        self.batch.push(data);
        if self.batched >= HASH_BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.batched = 0;
        let batch = std::mem::take(&mut self.batch);
        self.send(HashMsg::Data(batch))
    }

    fn reset(&mut self, hasher: Hasher) -> std::io::Result<()> {
        self.batch.clear();
        self.batched = 0;
        self.send(HashMsg::Reset(hasher))
    }

    fn finish(mut self) -> std::io::Result<Hasher> {
        self.flush()?;
        drop(self.tx);
        self.handle
            .join()
            .map_err(|_| std::io::Error::other("the hashing thread panicked"))
    }
}

/// Where received bytes go. Each chunk is written by the task that received it, right away,
/// while it is still in that CPU's cache (into [`DownloadFile`]'s staging buffer, or stdout's):
/// `perf` showed a separate writer thread spending most of its time copying buffers another
/// core had just filled. Hashing stays on its own thread, fed the same chunks.
pub(super) struct Output {
    /// The partial file; `None` is stdout.
    path: Option<PathBuf>,
    algo: Algo,
    kind: OutputKind,
}

#[allow(clippy::large_enum_variant)]
enum OutputKind {
    Plain(Sink, HashThread),
    Gunzip(Box<flate2::write::GzDecoder<Sink>>),
}

impl Output {
    /// Continues `path` after its first `written` bytes (which `hasher` has seen), or writes
    /// to stdout.
    pub(super) fn new(
        path: Option<PathBuf>,
        written: u64,
        algo: Algo,
        hasher: Hasher,
        decompress: bool,
    ) -> std::io::Result<Output> {
        let kind = if decompress {
            OutputKind::Gunzip(Box::new(flate2::write::GzDecoder::new(Self::sink(
                path.as_deref(),
                Some(hasher),
                written,
            )?)))
        } else {
            OutputKind::Plain(
                Self::sink(path.as_deref(), None, written)?,
                HashThread::start(hasher),
            )
        };
        Ok(Output { path, algo, kind })
    }

    fn sink(path: Option<&Path>, hasher: Option<Hasher>, written: u64) -> std::io::Result<Sink> {
        let out: Box<dyn Write + Send> = match path {
            Some(p) => Box::new(DownloadFile::open(p, written)?),
            None => Box::new(std::io::BufWriter::with_capacity(
                STDOUT_BUFFER,
                std::io::stdout(),
            )),
        };
        Ok(Sink {
            out,
            hasher,
            written,
        })
    }

    pub(super) fn write(&mut self, data: Bytes) -> std::io::Result<()> {
        match &mut self.kind {
            OutputKind::Plain(sink, hash) => {
                blocking(|| sink.write_all(&data))?;
                hash.push(data)
            }
            OutputKind::Gunzip(decoder) => blocking(|| decoder.write_all(&data)),
        }
    }

    /// Starts over: empties the file and resets the hash.
    pub(super) fn restart(&mut self) -> std::io::Result<()> {
        // Fresh sinks (and decoder): the old ones hold data of the abandoned stream. Replacing
        // a file sink drops it, which waits for its queued writes; only then is the file
        // emptied, so none of them lands after the truncation.
        match &mut self.kind {
            OutputKind::Plain(sink, hash) => {
                hash.reset(self.algo.hasher())?;
                *sink = Self::sink(self.path.as_deref(), None, 0)?;
            }
            OutputKind::Gunzip(decoder) => {
                **decoder = flate2::write::GzDecoder::new(Self::sink(
                    self.path.as_deref(),
                    Some(self.algo.hasher()),
                    0,
                )?);
            }
        }
        if let Some(p) = &self.path {
            File::options().write(true).open(p)?.set_len(0)?;
        }
        Ok(())
    }

    /// Flushes everything; returns the digest (hex) and the bytes in the output.
    pub(super) fn finish(self) -> std::io::Result<(String, u64)> {
        let (mut sink, hasher) = match self.kind {
            OutputKind::Plain(sink, hash) => (sink, hash.finish()?),
            OutputKind::Gunzip(decoder) => {
                let mut sink = blocking(|| decoder.finish())?;
                let hasher = sink.hasher.take().unwrap_or_else(|| self.algo.hasher());
                (sink, hasher)
            }
        };
        blocking(|| sink.flush())?;
        Ok((hasher.finish_hex(), sink.written))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
