//! An SFTP server in memory that answers what a test tells it, hostile directory listings
//! included (a real sshd cannot list a file named `../x`), and SFTP v3 renames that refuse an
//! existing target or fail. The client side is the real
//! `russh_sftp` client over an in-process pipe.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use russh_sftp::client::SftpSession;
use russh_sftp::protocol::{
    Attrs, Data, File, FileAttributes, Handle, Name, OpenFlags, Status, StatusCode,
};

/// A file or directory of the fake server.
#[derive(Debug, Clone)]
pub enum Node {
    /// A directory and the names its listing returns (any text, as a hostile server sends).
    Dir { mode: u32, names: Vec<String> },
    /// A regular file.
    File { mode: u32, data: Vec<u8> },
}

#[derive(Debug, Default)]
struct Inner {
    nodes: BTreeMap<String, Node>,
    /// Plain SFTP renames fail (as a full disk or a quota would make them fail).
    fail_rename: bool,
    /// Requests that change something, in order: `remove P`, `rename A B`.
    log: Vec<String>,
}

/// The server's state, shared with the test.
#[derive(Debug, Clone, Default)]
pub struct FakeFs(Arc<Mutex<Inner>>);

impl FakeFs {
    /// Adds a directory whose listing returns `names`.
    pub fn dir(&self, path: &str, mode: u32, names: &[&str]) {
        self.0.lock().unwrap().nodes.insert(
            path.into(),
            Node::Dir {
                mode,
                names: names.iter().map(|n| n.to_string()).collect(),
            },
        );
    }

    /// Adds a regular file.
    pub fn file(&self, path: &str, mode: u32, data: &[u8]) {
        self.0.lock().unwrap().nodes.insert(
            path.into(),
            Node::File {
                mode,
                data: data.to_vec(),
            },
        );
    }

    /// The node at `path`.
    pub fn get(&self, path: &str) -> Option<Node> {
        self.0.lock().unwrap().nodes.get(path).cloned()
    }

    /// Make plain SFTP renames fail.
    pub fn fail_renames(&self) {
        self.0.lock().unwrap().fail_rename = true;
    }

    /// The changing requests so far.
    pub fn log(&self) -> Vec<String> {
        self.0.lock().unwrap().log.clone()
    }

    /// A client session talking to this server.
    pub async fn session(&self) -> SftpSession {
        let (client, server) = tokio::io::duplex(1 << 20);
        russh_sftp::server::run(
            server,
            Server {
                fs: self.clone(),
                handles: HashMap::new(),
                next: 0,
            },
        )
        .await;
        SftpSession::new(client).await.expect("SFTP init")
    }
}

enum Open {
    Dir { path: String, listed: bool },
    File { path: String },
}

struct Server {
    fs: FakeFs,
    handles: HashMap<String, Open>,
    next: u64,
}

fn ok(id: u32) -> Status {
    Status {
        id,
        status_code: StatusCode::Ok,
        error_message: "Ok".into(),
        language_tag: "en-US".into(),
    }
}

fn attrs_of(node: &Node) -> FileAttributes {
    let mut a = FileAttributes::empty();
    match node {
        Node::Dir { mode, .. } => a.permissions = Some(0o040000 | mode),
        Node::File { mode, data } => {
            a.permissions = Some(0o100000 | mode);
            a.size = Some(data.len() as u64);
        }
    }
    a.atime = Some(1_000_000_000);
    a.mtime = Some(1_000_000_000);
    a
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

impl Server {
    fn handle(&mut self, open: Open) -> String {
        self.next += 1;
        let h = self.next.to_string();
        self.handles.insert(h.clone(), open);
        h
    }

    /// SFTP v3 rename: refuses an existing target.
    fn rename(&self, id: u32, from: &str, to: &str) -> Result<Status, StatusCode> {
        let mut fs = self.fs.0.lock().unwrap();
        fs.log.push(format!("rename {from} {to}"));
        if fs.fail_rename || fs.nodes.contains_key(to) {
            return Err(StatusCode::Failure);
        }
        let node = fs.nodes.remove(from).ok_or(StatusCode::NoSuchFile)?;
        fs.nodes.insert(to.into(), node);
        Ok(ok(id))
    }
}

impl russh_sftp::server::Handler for Server {
    type Error = StatusCode;

    fn unimplemented(&self) -> Self::Error {
        StatusCode::OpUnsupported
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let node = self.fs.get(&path).ok_or(StatusCode::NoSuchFile)?;
        Ok(Attrs {
            id,
            attrs: attrs_of(&node),
        })
    }

    async fn lstat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        self.stat(id, path).await
    }

    async fn opendir(&mut self, id: u32, path: String) -> Result<Handle, Self::Error> {
        match self.fs.get(&path) {
            Some(Node::Dir { .. }) => Ok(Handle {
                id,
                handle: self.handle(Open::Dir {
                    path,
                    listed: false,
                }),
            }),
            _ => Err(StatusCode::NoSuchFile),
        }
    }

    async fn readdir(&mut self, id: u32, handle: String) -> Result<Name, Self::Error> {
        let Some(Open::Dir { path, listed }) = self.handles.get_mut(&handle) else {
            return Err(StatusCode::Failure);
        };
        if *listed {
            return Err(StatusCode::Eof);
        }
        *listed = true;
        let path = path.clone();
        let Some(Node::Dir { names, .. }) = self.fs.get(&path) else {
            return Err(StatusCode::NoSuchFile);
        };
        let files = names
            .iter()
            .map(|n| {
                let attrs = self
                    .fs
                    .get(&join(&path, n))
                    .map_or_else(FileAttributes::empty, |node| attrs_of(&node));
                File::new(n.clone(), attrs)
            })
            .collect();
        Ok(Name { id, files })
    }

    async fn open(
        &mut self,
        id: u32,
        filename: String,
        pflags: OpenFlags,
        _attrs: FileAttributes,
    ) -> Result<Handle, Self::Error> {
        let exists = matches!(self.fs.get(&filename), Some(Node::File { .. }));
        if pflags.contains(OpenFlags::CREATE) && (!exists || pflags.contains(OpenFlags::TRUNCATE)) {
            self.fs.file(&filename, 0o644, b"");
        } else if !exists {
            return Err(StatusCode::NoSuchFile);
        }
        Ok(Handle {
            id,
            handle: self.handle(Open::File { path: filename }),
        })
    }

    async fn read(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        len: u32,
    ) -> Result<Data, Self::Error> {
        let Some(Open::File { path }) = self.handles.get(&handle) else {
            return Err(StatusCode::Failure);
        };
        let Some(Node::File { data, .. }) = self.fs.get(path) else {
            return Err(StatusCode::NoSuchFile);
        };
        let from = (offset as usize).min(data.len());
        if from == data.len() {
            return Err(StatusCode::Eof);
        }
        let to = (from + len as usize).min(data.len());
        Ok(Data {
            id,
            data: data[from..to].to_vec(),
        })
    }

    async fn write(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        bytes: Vec<u8>,
    ) -> Result<Status, Self::Error> {
        let Some(Open::File { path }) = self.handles.get(&handle) else {
            return Err(StatusCode::Failure);
        };
        let mut fs = self.fs.0.lock().unwrap();
        let Some(Node::File { data, .. }) = fs.nodes.get_mut(path) else {
            return Err(StatusCode::NoSuchFile);
        };
        let end = offset as usize + bytes.len();
        if data.len() < end {
            data.resize(end, 0);
        }
        data[offset as usize..end].copy_from_slice(&bytes);
        Ok(ok(id))
    }

    async fn close(&mut self, id: u32, handle: String) -> Result<Status, Self::Error> {
        self.handles.remove(&handle);
        Ok(ok(id))
    }

    async fn setstat(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        let mut fs = self.fs.0.lock().unwrap();
        match (fs.nodes.get_mut(&path), attrs.permissions) {
            (None, _) => Err(StatusCode::NoSuchFile),
            (Some(Node::File { mode, .. } | Node::Dir { mode, .. }), Some(p)) => {
                *mode = p & 0o7777;
                Ok(ok(id))
            }
            (Some(_), None) => Ok(ok(id)),
        }
    }

    async fn mkdir(
        &mut self,
        id: u32,
        path: String,
        _attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        if self.fs.get(&path).is_some() {
            return Err(StatusCode::Failure);
        }
        self.fs.dir(&path, 0o755, &[]);
        Ok(ok(id))
    }

    async fn remove(&mut self, id: u32, filename: String) -> Result<Status, Self::Error> {
        let mut fs = self.fs.0.lock().unwrap();
        fs.log.push(format!("remove {filename}"));
        match fs.nodes.remove(&filename) {
            Some(_) => Ok(ok(id)),
            None => Err(StatusCode::NoSuchFile),
        }
    }

    async fn rename(
        &mut self,
        id: u32,
        oldpath: String,
        newpath: String,
    ) -> Result<Status, Self::Error> {
        Server::rename(self, id, &oldpath, &newpath)
    }
}
