//! The importers' HTTP download, done for real for URLs on this machine.
//!
//! CDI's importer (`pkg/importer/http-datasource.go`) and Deckhouse's `dvcr-importer` (which
//! builds CDI's HTTP data source: `images/dvcr-artifact/pkg/importer/importer.go`
//! `newDataSource`) GET the URL, refuse any status but 200 (`expected status code 200, got
//! 404. Status: 404 Not Found`), stream the body through the checksum hashers
//! (CDI `pkg/importer/checksum.go`, Deckhouse `pkg/registry/checksum.go`) and the format
//! readers into the volume (CDI `data-processor.go`: decompress, convert to raw). Progress is
//! the bytes read over the body's length (CDI's importer publishes it as a metric the
//! controller copies into `status.progress`; Deckhouse's stat service reads it from the pod).
//!
//! Here a download runs on its own thread: the body goes to a scratch file 64 KiB at a time
//! (never whole in memory), the checksums are taken of that file by coreutils, and
//! [`crate::kubevirt::upload::process`] converts it as the upload path does. Only `http://` URLs whose
//! host is a loopback address (`127.0.0.0/8`, `::1`, `localhost`) are fetched: the emulator
//! has no other network, so other hosts keep the emulator's timed import (and `.invalid` hosts
//! fail, [`crate::core::storage::import_error`]). Each platform words the outcome as its importer
//! and controller do (see [`Failure::cdi_message`], [`Failure::deckhouse_message`]).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::core::app::App;

/// How a download ended badly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The request failed or the server answered other than 200: the data source could
    /// not be made (the importer exits non-zero; CDI restarts it).
    Connect(String),
    /// A checksum did not match: `(algorithm, expected, actual)`. Permanent on both
    /// platforms (CDI `import-controller.go` marks it fatal; Deckhouse's
    /// `BadImageChecksumError.Permanent`).
    Checksum(String, String, String),
    /// The data could not be processed (not an image qemu-img reads, too large).
    Process(String),
}

impl Failure {
    /// The importer pod's termination message on CDI (`cmd/cdi-importer/importer.go`:
    /// `Unable to connect to http data source: …`, `Unable to process data: …`).
    pub fn cdi_message(&self) -> String {
        match self {
            Failure::Connect(e) => format!("Unable to connect to http data source: {e}"),
            Failure::Checksum(algo, expected, actual) => format!(
                "Unable to process data: checksum validation failed: checksum mismatch: expected {algo}:{expected}, calculated {algo}:{actual}"
            ),
            Failure::Process(e) => format!("Unable to process data: {e}"),
        }
    }

    /// Whether CDI gives up (`Failed`) instead of restarting the importer.
    pub fn permanent(&self) -> bool {
        matches!(self, Failure::Checksum(..))
    }

    /// The error the dvcr-importer reports in its termination message
    /// (`importer.go`: `error creating data source: error creating HTTP data source: …`;
    /// `errors.go` `BadImageChecksumError`: `<algo> sum mismatch: <expected> != <actual>`).
    pub fn deckhouse_message(&self) -> String {
        match self {
            Failure::Connect(e) => {
                format!("error creating data source: error creating HTTP data source: {e}")
            }
            Failure::Checksum(algo, expected, actual) => {
                format!("{algo} sum mismatch: {expected} != {actual}")
            }
            Failure::Process(e) => e.clone(),
        }
    }
}

/// What a finished download left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The converted (raw) data.
    pub path: PathBuf,
    /// The format qemu-img saw in the download (`qcow2`, `raw`, …).
    pub format: String,
    /// Bytes downloaded.
    pub received: u64,
    /// Bytes of the converted data.
    pub size: u64,
}

/// One download's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Job {
    /// Body bytes read so far.
    pub received: u64,
    /// The body's length, when the server said it.
    pub total: Option<u64>,
    /// How it ended, once it has.
    pub outcome: Option<Result<Imported, Failure>>,
}

impl Job {
    /// Percent of the body read (0 while the length is unknown).
    pub fn percent(&self) -> f64 {
        match self.total {
            Some(t) if t > 0 => (self.received as f64 * 100.0 / t as f64).min(100.0),
            _ => 0.0,
        }
    }
}

/// The downloads, by the uid of the object importing.
#[derive(Default)]
pub struct Imports {
    jobs: Arc<Mutex<HashMap<String, Job>>>,
}

/// What a download checks and where its data may go.
pub struct Request {
    /// The URL (one [`fetched`] accepts).
    pub url: String,
    /// `(algorithm, hex)` pairs the body must hash to.
    pub checksums: Vec<(String, String)>,
    /// The volume's size (bounds and fills the converted data), `u64::MAX` for none.
    pub capacity: u64,
}

/// Whether the emulator downloads `url` itself: `http://` on a loopback host.
pub fn fetched(url: &str) -> bool {
    parse(url).is_some()
}

/// `(host, port, path)` of a fetched URL.
fn parse(url: &str) -> Option<(String, u16, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, tail) = v6.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => 80,
        };
        (h.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None => (authority.to_string(), 80),
        }
    };
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback.then(|| (host, port, path.to_string()))
}

impl Imports {
    /// The download of object `uid`, if one was started.
    pub fn job(&self, uid: &str) -> Option<Job> {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }

    /// Forgets a download (its importer is restarted, or the object is gone).
    pub fn forget(&self, uid: &str) {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }
}

/// Starts downloading for object `uid` unless a download is under way or done.
pub fn start(app: &App, uid: &str, request: Request) {
    let jobs = app.imports.jobs.clone();
    {
        let mut map = jobs.lock().unwrap_or_else(|e| e.into_inner());
        if map.contains_key(uid) {
            return;
        }
        map.insert(uid.to_string(), Job::default());
    }
    let scratch = app.uploads.scratch_path(uid, "http");
    let out = app.uploads.scratch_path(uid, "http-converted");
    let uid = uid.to_string();
    std::thread::spawn(move || {
        let update = |f: &dyn Fn(&mut Job)| {
            if let Some(job) = jobs.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&uid) {
                f(job);
            }
        };
        let outcome = download(&request, &scratch, &update)
            .and_then(|received| finish(&request, &scratch, &out, received));
        let _ = std::fs::remove_file(&scratch);
        update(&|job| job.outcome = Some(outcome.clone()));
    });
}

/// Applies a change to the download's [`Job`].
type Update<'a> = &'a dyn Fn(&dyn Fn(&mut Job));

/// GETs the URL into `file`; the body bytes read.
fn download(request: &Request, file: &Path, update: Update<'_>) -> Result<u64, Failure> {
    let (host, port, path) = parse(&request.url)
        .ok_or_else(|| Failure::Connect(format!("unable to parse endpoint {:?}", request.url)))?;
    // Go's net/http wording for a refused connection.
    let refused = |e: std::io::Error| {
        Failure::Connect(format!(
            "HTTP request errored: Get \"{}\": dial tcp {host}:{port}: {e}",
            request.url
        ))
    };
    let mut stream = TcpStream::connect((host.as_str(), port)).map_err(refused)?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: cdi-importer\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n"
    )
    .map_err(refused)?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).map_err(refused)?;
    let mut parts = status_line.trim_end().splitn(3, ' ');
    let _version = parts.next();
    let code: u16 = parts.next().and_then(|c| c.parse().ok()).unwrap_or(0);
    let text = parts.next().unwrap_or("");
    let mut length = None;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).map_err(refused)? == 0 {
            break;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim();
            match name.to_ascii_lowercase().as_str() {
                "content-length" => length = value.parse::<u64>().ok(),
                "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
                _ => {}
            }
        }
    }
    if code != 200 {
        // http-datasource.go createHTTPReader.
        return Err(Failure::Connect(format!(
            "expected status code 200, got {code}. Status: {code} {text}"
        )));
    }
    update(&|job| job.total = length);
    let mut out = std::fs::File::create(file).map_err(|e| Failure::Process(e.to_string()))?;
    let mut received = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    let cut = |e: std::io::Error| Failure::Connect(format!("unexpected EOF: {e}"));
    let mut copy = |reader: &mut dyn Read, limit: Option<u64>| -> Result<u64, Failure> {
        let mut n_total = 0u64;
        loop {
            let want = match limit {
                Some(l) if l - n_total == 0 => break,
                Some(l) => buf.len().min((l - n_total) as usize),
                None => buf.len(),
            };
            let n = reader.read(&mut buf[..want]).map_err(cut)?;
            if n == 0 {
                if limit.is_some() {
                    return Err(Failure::Connect("unexpected EOF".into()));
                }
                break;
            }
            out.write_all(&buf[..n])
                .map_err(|e| Failure::Process(e.to_string()))?;
            n_total += n as u64;
            received += n as u64;
            let r = received;
            update(&|job| job.received = r);
        }
        Ok(n_total)
    };
    if chunked {
        loop {
            let mut size_line = String::new();
            reader.read_line(&mut size_line).map_err(cut)?;
            let size = u64::from_str_radix(size_line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| Failure::Connect("malformed chunked encoding".into()))?;
            if size == 0 {
                break;
            }
            copy(&mut reader, Some(size))?;
            let mut crlf = String::new();
            reader.read_line(&mut crlf).map_err(cut)?;
        }
    } else {
        copy(&mut reader, length)?;
    }
    out.flush().map_err(|e| Failure::Process(e.to_string()))?;
    Ok(received)
}

/// Checks the checksums of the downloaded file, then converts it.
fn finish(request: &Request, file: &Path, out: &Path, received: u64) -> Result<Imported, Failure> {
    let mut sums = request.checksums.clone();
    sums.sort();
    for (algo, expected) in &sums {
        let tool = match algo.as_str() {
            "md5" => "md5sum",
            "sha1" => "sha1sum",
            "sha256" => "sha256sum",
            "sha512" => "sha512sum",
            // Streebog has no coreutils tool; the emulator does not check it.
            _ => continue,
        };
        let output = Command::new(tool)
            .arg(file)
            .output()
            .map_err(|e| Failure::Process(format!("cannot run {tool}: {e}")))?;
        let actual = String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string();
        let expected = expected.to_ascii_lowercase();
        if actual != expected {
            return Err(Failure::Checksum(algo.clone(), expected, actual));
        }
    }
    let format = Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(file)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v["format"].as_str().map(String::from))
        .unwrap_or_else(|| "raw".into());
    crate::kubevirt::upload::process(file, out, request.capacity).map_err(|e| {
        Failure::Process(
            e.strip_prefix("Unable to process data: ")
                .unwrap_or(&e)
                .to_string(),
        )
    })?;
    let size = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(Imported {
        path: out.to_path_buf(),
        format,
        received,
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_on_loopback_hosts_is_fetched() {
        for url in [
            "http://127.0.0.1:8080/a.img",
            "http://localhost/a.img",
            "http://[::1]:9/x",
            "http://127.1.2.3:1",
        ] {
            assert!(fetched(url), "{url}");
        }
        for url in [
            "https://127.0.0.1/a.img",
            "http://images.example/a.img",
            "http://10.0.0.1/a",
            "http://127.0.0.1:notaport/a",
        ] {
            assert!(!fetched(url), "{url}");
        }
        assert_eq!(
            parse("http://127.0.0.1:81"),
            Some(("127.0.0.1".into(), 81, "/".into()))
        );
    }

    #[test]
    fn each_platform_words_a_failure_as_its_importer_does() {
        let f = Failure::Checksum("sha256".into(), "aa".into(), "bb".into());
        assert!(f.permanent());
        assert_eq!(
            f.cdi_message(),
            "Unable to process data: checksum validation failed: checksum mismatch: expected sha256:aa, calculated sha256:bb"
        );
        assert_eq!(f.deckhouse_message(), "sha256 sum mismatch: aa != bb");
        let f = Failure::Connect("expected status code 200, got 404. Status: 404 Not Found".into());
        assert!(!f.permanent());
        assert_eq!(
            f.cdi_message(),
            "Unable to connect to http data source: expected status code 200, got 404. Status: 404 Not Found"
        );
    }
}
