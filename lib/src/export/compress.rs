//! A file fetched raw but wanted gzip-compressed (`memory-dump download --format gzip`: the
//! export's `dir` link serves the dump raw only, so the server cannot compress it): the
//! complete, verified `FILE.partial` is gzipped into `FILE.partial.gz`, synced, renamed to
//! `FILE`, and only then is `FILE.partial` removed. The transfer itself stays raw, so it
//! resumes with Range like any raw download; an interrupted compression leaves no `FILE`.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

use super::checksum::{Algo, Hasher};
use super::output::create_private;

/// What compressing wrote: the compressed file's digest and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compressed {
    /// Digest of the gzip file, hex.
    pub hex: String,
    /// Its size.
    pub bytes: u64,
}

/// Writes everything through the hasher and counts it.
struct Tee<W> {
    inner: W,
    hasher: Hasher,
    bytes: u64,
}

impl<W: Write> Write for Tee<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Gzips `raw` into `path` (through `path`'s `.partial.gz`, renamed when complete) and
/// removes `raw`.
pub fn gzip_into(raw: &Path, path: &Path, algo: Algo) -> std::io::Result<Compressed> {
    let mut tmp = raw.as_os_str().to_owned();
    tmp.push(".gz");
    let tmp = std::path::PathBuf::from(tmp);
    let result = (|| {
        let out = create_private(&tmp, false)?;
        let tee = Tee {
            inner: BufWriter::with_capacity(1 << 20, out),
            hasher: algo.hasher(),
            bytes: 0,
        };
        // Level 6, gzip's default (`gzip -6`).
        let mut encoder = flate2::write::GzEncoder::new(tee, flate2::Compression::new(6));
        let mut input = BufReader::with_capacity(1 << 20, File::open(raw)?);
        std::io::copy(&mut input, &mut encoder)?;
        let mut tee = encoder.finish()?;
        tee.flush()?;
        let Tee {
            inner,
            hasher,
            bytes,
        } = tee;
        let file = inner.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(Compressed {
            hex: hasher.finish_hex(),
            bytes,
        })
    })();
    match result {
        Ok(done) => {
            std::fs::rename(&tmp, path)?;
            std::fs::remove_file(raw)?;
            Ok(done)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file decompresses (with the `gzip` tool, an independent reader) to the raw bytes,
    /// its digest is `sha256sum`'s, and the raw partial is gone.
    #[test]
    fn the_gzip_file_unpacks_to_the_raw_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("d.core.partial");
        let path = dir.path().join("d.core");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&raw, &data).unwrap();
        let done = gzip_into(&raw, &path, Algo::Sha256).unwrap();
        assert!(!raw.exists());
        assert!(!dir.path().join("d.core.partial.gz").exists());
        assert_eq!(done.bytes, std::fs::metadata(&path).unwrap().len());
        let out = std::process::Command::new("gzip")
            .arg("-dc")
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(out.stdout == data, "gzip -dc differs");
        let sum = std::process::Command::new("sha256sum")
            .arg(&path)
            .output()
            .unwrap();
        let sum = String::from_utf8(sum.stdout).unwrap();
        assert_eq!(sum.split_whitespace().next(), Some(done.hex.as_str()));
    }

    /// A raw file that cannot be read leaves neither the final file nor the temporary one.
    #[test]
    fn a_failure_leaves_no_file_under_the_final_name() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("missing.partial");
        let path = dir.path().join("missing");
        assert!(gzip_into(&raw, &path, Algo::Sha256).is_err());
        assert!(!path.exists());
        assert!(!dir.path().join("missing.partial.gz").exists());
    }
}
