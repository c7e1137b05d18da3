//! A plain HTTP file server on 127.0.0.1 for tests: the web server an image is imported from.
//!
//! `GET /PATH` answers 200 with the file added under that path (streamed from disk, with
//! `Content-Length`), 404 otherwise. A path can be held: its body stops after N bytes until
//! the test releases it, so a test sees an import in progress by waiting on the platform's
//! progress, not on time.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};

#[derive(Default)]
struct State {
    files: HashMap<String, PathBuf>,
    holds: HashMap<String, u64>,
    hits: HashMap<String, u32>,
    closed: bool,
}

/// The server; it stops answering held bodies (releases them) when dropped.
pub struct FileServer {
    port: u16,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl FileServer {
    /// Listens on a free port of 127.0.0.1.
    pub fn start() -> FileServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let port = listener.local_addr().expect("local address").port();
        let state: Arc<(Mutex<State>, Condvar)> = Arc::default();
        let shared = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let _ = serve(stream, &shared);
                });
            }
        });
        FileServer { port, state }
    }

    /// `http://127.0.0.1:PORT/PATH`.
    pub fn url(&self, path: &str) -> String {
        format!(
            "http://127.0.0.1:{}/{}",
            self.port,
            path.trim_start_matches('/')
        )
    }

    /// Serves `file` as `/PATH`.
    pub fn add(&self, path: &str, file: impl Into<PathBuf>) {
        self.lock().files.insert(key(path), file.into());
    }

    /// Bodies of `/PATH` stop after `offset` bytes until [`FileServer::release`].
    pub fn hold_after(&self, path: &str, offset: u64) {
        self.lock().holds.insert(key(path), offset);
    }

    /// Lets held bodies of `/PATH` finish.
    pub fn release(&self, path: &str) {
        self.lock().holds.remove(&key(path));
        self.state.1.notify_all();
    }

    /// How many requests asked for `/PATH`.
    pub fn hits(&self, path: &str) -> u32 {
        self.lock().hits.get(&key(path)).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        let mut state = self.lock();
        state.closed = true;
        state.holds.clear();
        drop(state);
        self.state.1.notify_all();
    }
}

fn key(path: &str) -> String {
    format!("/{}", path.trim_start_matches('/'))
}

fn serve(stream: TcpStream, shared: &(Mutex<State>, Condvar)) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split(' ').nth(1).unwrap_or("/").to_string();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim_end().is_empty() {
            break;
        }
    }
    let mut out = stream;
    let file = {
        let mut state = shared.0.lock().unwrap_or_else(|e| e.into_inner());
        *state.hits.entry(path.clone()).or_default() += 1;
        state.files.get(&path).cloned()
    };
    let Some(file) = file.and_then(|f| std::fs::File::open(f).ok()) else {
        let body = "404 page not found\n";
        return write!(
            out,
            "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    };
    let len = file.metadata()?.len();
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    )?;
    let mut file = file;
    let mut sent = 0u64;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // Wait while this body is held at or before the bytes sent so far.
        let mut limit = u64::MAX;
        {
            let mut state = shared.0.lock().unwrap_or_else(|e| e.into_inner());
            while let Some(&at) = state.holds.get(&path) {
                if sent < at || state.closed {
                    limit = at;
                    break;
                }
                state = shared.1.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        }
        let want = buf.len().min((limit - sent) as usize);
        let n = file.read(&mut buf[..want])?;
        if n == 0 {
            break;
        }
        out.write_all(&buf[..n])?;
        out.flush()?;
        sent += n as u64;
    }
    Ok(())
}
