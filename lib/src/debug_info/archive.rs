//! The tar.gz archive, written on its own thread as files arrive: small files come as bytes,
//! logs as spooled temporary files, so the whole bundle is never held in memory.
//! `manifest.json` (every file with what it is) is written last.

use std::io::{Read, Seek, SeekFrom, Write};
use std::thread::JoinHandle;

use flate2::Compression;
use flate2::write::GzEncoder;
use serde::Serialize;
use tokio::sync::mpsc;

/// What a file holds.
pub enum Content {
    /// Small content held in memory.
    Bytes(Vec<u8>),
    /// A spooled temporary file (a log), read back when archived.
    File(std::fs::File),
}

/// One file for the archive.
pub struct Entry {
    /// Path inside the archive's top folder, e.g. `pod/virt-launcher-web-x7k2p.yaml`.
    pub path: String,
    /// What the file is, for the manifest.
    pub description: String,
    /// Its content.
    pub content: Content,
}

/// One line of `manifest.json`.
#[derive(Debug, Clone, Serialize)]
pub struct ManifestEntry {
    /// Path inside the archive.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// What the file is.
    pub description: String,
}

/// What the writer reports when done.
#[derive(Debug)]
pub struct Written {
    /// Files written, `manifest.json` excluded.
    pub files: Vec<ManifestEntry>,
    /// Compressed bytes written.
    pub bytes: u64,
}

/// The sending side: entries go to the writer thread in order of arrival.
#[derive(Clone)]
pub struct Sink {
    tx: mpsc::Sender<Entry>,
}

impl Sink {
    /// Hand a file to the writer. Fails when the writer stopped (its error comes from
    /// [`Writer::finish`]).
    pub async fn put(&self, entry: Entry) -> bool {
        self.tx.send(entry).await.is_ok()
    }
}

/// The writer thread.
pub struct Writer {
    handle: JoinHandle<std::io::Result<Written>>,
}

struct Counting<W> {
    inner: W,
    bytes: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Start writing an archive to `out`, every file under the folder `top`.
pub fn start<W: Write + Send + 'static>(out: W, top: String) -> (Sink, Writer) {
    // A few entries in flight at most: producers wait rather than pile up memory.
    let (tx, mut rx) = mpsc::channel::<Entry>(8);
    let handle = std::thread::spawn(move || -> std::io::Result<Written> {
        let gz = GzEncoder::new(
            Counting {
                inner: out,
                bytes: 0,
            },
            Compression::default(),
        );
        let mut tar = tar::Builder::new(gz);
        let mtime = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut files = Vec::new();
        let append = |tar: &mut tar::Builder<_>, path: &str, size: u64, data: &mut dyn Read| {
            let mut header = tar::Header::new_gnu();
            header.set_size(size);
            header.set_mode(0o644);
            header.set_mtime(mtime);
            header.set_entry_type(tar::EntryType::Regular);
            tar.append_data(&mut header, format!("{top}/{path}"), data)
        };
        while let Some(entry) = rx.blocking_recv() {
            let size = match entry.content {
                Content::Bytes(bytes) => {
                    append(
                        &mut tar,
                        &entry.path,
                        bytes.len() as u64,
                        &mut bytes.as_slice(),
                    )?;
                    bytes.len() as u64
                }
                Content::File(mut file) => {
                    let size = file.seek(SeekFrom::End(0))?;
                    file.seek(SeekFrom::Start(0))?;
                    append(&mut tar, &entry.path, size, &mut (&mut file).take(size))?;
                    size
                }
            };
            files.push(ManifestEntry {
                path: entry.path,
                size,
                description: entry.description,
            });
        }
        let mut manifest_files = files.clone();
        manifest_files.sort_by(|a, b| a.path.cmp(&b.path));
        let manifest = serde_json::to_vec_pretty(&serde_json::json!({
            "generator": concat!("kubectl-vm ", env!("CARGO_PKG_VERSION"), " collect-debug-info"),
            "files": manifest_files,
        }))
        .map_err(std::io::Error::other)?;
        append(
            &mut tar,
            "manifest.json",
            manifest.len() as u64,
            &mut manifest.as_slice(),
        )?;
        let gz = tar.into_inner()?;
        let mut counting = gz.finish()?;
        counting.flush()?;
        Ok(Written {
            files,
            bytes: counting.bytes,
        })
    });
    (Sink { tx }, Writer { handle })
}

impl Writer {
    /// Wait for the writer to finish (every [`Sink`] must be dropped first).
    pub fn finish(self) -> std::io::Result<Written> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("archive writer panicked")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_then_manifest() {
        let path = tempfile::NamedTempFile::new().unwrap();
        let out = std::fs::File::create(path.path()).unwrap();
        let (sink, writer) = start(out, "top".into());
        assert!(
            sink.put(Entry {
                path: "a/one.txt".into(),
                description: "one".into(),
                content: Content::Bytes(b"hello\n".to_vec()),
            })
            .await
        );
        let mut spooled = tempfile::tempfile().unwrap();
        spooled.write_all(b"log line\n").unwrap();
        assert!(
            sink.put(Entry {
                path: "b/two.log".into(),
                description: "two".into(),
                content: Content::File(spooled),
            })
            .await
        );
        drop(sink);
        let written = tokio::task::spawn_blocking(move || writer.finish())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(written.files.len(), 2);
        // Read back with the system tar, an independent reader.
        let listing = std::process::Command::new("tar")
            .arg("tzvf")
            .arg(path.path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&listing.stdout);
        assert!(text.contains("top/a/one.txt"), "{text}");
        assert!(text.contains("top/b/two.log"), "{text}");
        assert!(text.contains("top/manifest.json"), "{text}");
        assert!(text.contains("-rw-r--r--"), "{text}");
    }
}
