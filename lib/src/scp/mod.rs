//! `kubectl vm scp`: copy files and directory trees to or from a VM over SFTP on the same
//! authenticated SSH session `ssh` uses. Files are written under a temporary name next to the
//! destination and renamed when complete, so a broken copy never leaves a half file under
//! the real name.

use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use russh_sftp::client::SftpSession;
use russh_sftp::protocol::FileAttributes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::ssh::SshError;
use crate::target::Target;

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A local path.
    Local(PathBuf),
    /// `[USER@]TARGET:PATH`.
    Remote {
        /// The VM (and login).
        target: Target,
        /// Path in the guest (relative to the login's home when not absolute).
        path: String,
    },
}

/// Parse `SRC` or `DST`: remote when a `:` comes before any `/` (or after a `vm/…` target).
pub fn parse_location(text: &str) -> crate::Result<Location> {
    let remote_split = if text.starts_with('/') || text.starts_with('.') {
        None
    } else if text.starts_with("vm/") || text.starts_with("vmi/") || text.contains("@vm") {
        text.split_once(':')
    } else {
        text.split_once(':').filter(|(t, _)| !t.contains('/'))
    };
    match remote_split {
        Some((target, path)) => Ok(Location::Remote {
            target: Target::parse(target, true)?,
            path: if path.is_empty() {
                ".".into()
            } else {
                path.into()
            },
        }),
        None => Ok(Location::Local(PathBuf::from(text))),
    }
}

/// Which way the copy goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direction {
    /// Local to VM.
    Upload {
        /// Local source.
        local: PathBuf,
        /// Remote destination.
        remote: String,
    },
    /// VM to local.
    Download {
        /// Remote source.
        remote: String,
        /// Local destination.
        local: PathBuf,
    },
}

/// A checked copy request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The VM side's target.
    pub target: Target,
    /// Direction and paths.
    pub direction: Direction,
    /// `-r`.
    pub recursive: bool,
    /// `-p`: keep modes and times.
    pub preserve: bool,
}

/// Check `SRC DST` before any request: exactly one side remote.
pub fn plan(src: &str, dst: &str, recursive: bool, preserve: bool) -> crate::Result<Plan> {
    let (target, direction) = match (parse_location(src)?, parse_location(dst)?) {
        (Location::Local(local), Location::Remote { target, path }) => (
            target,
            Direction::Upload {
                local,
                remote: path,
            },
        ),
        (Location::Remote { target, path }, Location::Local(local)) => (
            target,
            Direction::Download {
                remote: path,
                local,
            },
        ),
        (Location::Remote { .. }, Location::Remote { .. }) => {
            return Err(crate::Error::InvalidTarget(
                "copying from one VM to another is not supported: copy through a local directory"
                    .into(),
            ));
        }
        (Location::Local(_), Location::Local(_)) => {
            return Err(crate::Error::InvalidTarget(
                "neither side is on a VM: write one as [USER@]VM:PATH".into(),
            ));
        }
    };
    Ok(Plan {
        target,
        direction,
        recursive,
        preserve,
    })
}

/// Progress of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScpEvent {
    /// A file starts.
    File {
        /// Its destination path.
        path: String,
        /// Its size.
        size: u64,
    },
    /// Bytes of the current file copied so far.
    Progress {
        /// Bytes done.
        done: u64,
    },
}

fn sftp_err(what: &str, e: impl std::fmt::Display) -> SshError {
    SshError::Io(format!("{what}: {e}"))
}

const CHUNK: usize = 255 * 1024;

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn temp_name(dest: &str) -> String {
    let (dir, base) = dest.rsplit_once('/').map_or((".", dest), |(d, b)| (d, b));
    let dir = if dir.is_empty() { "/" } else { dir };
    join(dir, &format!(".{base}.kubevm-tmp-{}", std::process::id()))
}

async fn remote_is_dir(sftp: &SftpSession, path: &str) -> bool {
    sftp.metadata(path).await.is_ok_and(|m| m.is_dir())
}

/// Run the copy on an SFTP session. Returns the bytes copied.
pub async fn execute(
    sftp: &SftpSession,
    plan: &Plan,
    events: &(dyn Fn(ScpEvent) + Send + Sync),
) -> Result<u64, SshError> {
    match &plan.direction {
        Direction::Upload { local, remote } => {
            let meta =
                std::fs::metadata(local).map_err(|e| sftp_err(&local.display().to_string(), e))?;
            let name = local
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| ".".into());
            let dest = if remote_is_dir(sftp, remote).await {
                join(remote, &name)
            } else {
                remote.clone()
            };
            if meta.is_dir() {
                if !plan.recursive {
                    return Err(SshError::Usage(format!(
                        "{} is a directory: use -r",
                        local.display()
                    )));
                }
                Box::pin(upload_tree(sftp, local, &dest, plan.preserve, events)).await
            } else {
                upload_file(sftp, local, &dest, plan.preserve, events).await
            }
        }
        Direction::Download { remote, local } => {
            let meta = sftp
                .metadata(remote.as_str())
                .await
                .map_err(|e| sftp_err(remote, e))?;
            let name = remote
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .unwrap_or(remote);
            let dest = if local.is_dir() {
                local.join(name)
            } else {
                local.clone()
            };
            if meta.is_dir() {
                if !plan.recursive {
                    return Err(SshError::Usage(format!("{remote} is a directory: use -r")));
                }
                Box::pin(download_tree(sftp, remote, &dest, plan.preserve, events)).await
            } else {
                download_file(sftp, remote, &meta, &dest, plan.preserve, events).await
            }
        }
    }
}

fn times(meta: &std::fs::Metadata) -> (u32, u32) {
    let secs = |t: std::io::Result<std::time::SystemTime>| {
        t.ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs() as u32)
    };
    (secs(meta.accessed()), secs(meta.modified()))
}

async fn upload_file(
    sftp: &SftpSession,
    local: &Path,
    dest: &str,
    preserve: bool,
    events: &(dyn Fn(ScpEvent) + Send + Sync),
) -> Result<u64, SshError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(local).map_err(|e| sftp_err(&local.display().to_string(), e))?;
    events(ScpEvent::File {
        path: dest.to_owned(),
        size: meta.len(),
    });
    let tmp = temp_name(dest);
    let mut src = tokio::fs::File::open(local)
        .await
        .map_err(|e| sftp_err(&local.display().to_string(), e))?;
    let mut file = sftp
        .create(tmp.as_str())
        .await
        .map_err(|e| sftp_err(dest, e))?;
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    loop {
        let n = src.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        file.write_all(&buf[..n])
            .await
            .map_err(|e| sftp_err(dest, e))?;
        done += n as u64;
        events(ScpEvent::Progress { done });
    }
    file.shutdown().await.map_err(|e| sftp_err(dest, e))?;
    drop(file);
    let mut attrs = FileAttributes::empty();
    // New files get the source's permission bits, like scp; -p adds the times.
    attrs.permissions = Some(meta.permissions().mode() & 0o7777);
    if preserve {
        let (atime, mtime) = times(&meta);
        attrs.atime = Some(atime);
        attrs.mtime = Some(mtime);
    }
    sftp.set_metadata(tmp.as_str(), attrs)
        .await
        .map_err(|e| sftp_err(dest, e))?;
    put_in_place(sftp, &tmp, dest).await?;
    Ok(done)
}

/// Renames the uploaded `tmp` to `dest`. SFTP v3 rename refuses an existing target, so an
/// existing file is first moved aside and removed only once the new one is in place; if the
/// new one cannot be put in place the old one goes back. The old file is never removed
/// before its replacement is there.
async fn put_in_place(sftp: &SftpSession, tmp: &str, dest: &str) -> Result<(), SshError> {
    let first = match sftp.rename(tmp, dest).await {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    if sftp.symlink_metadata(dest).await.is_err() {
        let _ = sftp.remove_file(tmp).await;
        return Err(sftp_err(dest, first));
    }
    let aside = format!("{tmp}.old");
    if let Err(e) = sftp.rename(dest, aside.as_str()).await {
        let _ = sftp.remove_file(tmp).await;
        return Err(sftp_err(
            dest,
            format!("cannot replace the existing file: {e}"),
        ));
    }
    match sftp.rename(tmp, dest).await {
        Ok(()) => {
            let _ = sftp.remove_file(aside.as_str()).await;
            Ok(())
        }
        Err(e) => {
            let _ = sftp.rename(aside.as_str(), dest).await;
            let _ = sftp.remove_file(tmp).await;
            Err(sftp_err(dest, e))
        }
    }
}

async fn upload_tree(
    sftp: &SftpSession,
    local: &Path,
    dest: &str,
    preserve: bool,
    events: &(dyn Fn(ScpEvent) + Send + Sync),
) -> Result<u64, SshError> {
    use std::os::unix::fs::PermissionsExt;
    if !remote_is_dir(sftp, dest).await {
        sftp.create_dir(dest).await.map_err(|e| sftp_err(dest, e))?;
    }
    let mut total = 0;
    let mut entries: Vec<_> = std::fs::read_dir(local)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let target = join(dest, &name);
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += Box::pin(upload_tree(sftp, &path, &target, preserve, events)).await?;
        } else if kind.is_file() {
            total += upload_file(sftp, &path, &target, preserve, events).await?;
        }
    }
    if preserve {
        let meta = std::fs::metadata(local)?;
        let mut attrs = FileAttributes::empty();
        let (atime, mtime) = times(&meta);
        attrs.permissions = Some(meta.permissions().mode() & 0o7777);
        attrs.atime = Some(atime);
        attrs.mtime = Some(mtime);
        sftp.set_metadata(dest, attrs)
            .await
            .map_err(|e| sftp_err(dest, e))?;
    }
    Ok(total)
}

/// The process's umask, from `/proc/self/status` (Linux ≥ 4.7); where that cannot be read,
/// 022 (no group or world write), the usual default.
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// The local mode for a mode a guest reports: permission bits only (no setuid, setgid or
/// sticky from a guest) and through the local umask, with `-p` as without it (OpenSSH's sftp
/// takes `perm & 0777`; without `-p` the owner can always write, as there).
fn local_mode(remote: u32, preserve: bool, umask: u32) -> u32 {
    let mode = remote & 0o777;
    let mode = if preserve { mode } else { mode | 0o200 };
    mode & !umask
}

fn apply_local(path: &Path, attrs: &FileAttributes, preserve: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(mode) = attrs.permissions {
        let mode = local_mode(mode, preserve, umask());
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    if preserve {
        let at = |s: Option<u32>| UNIX_EPOCH + Duration::from_secs(u64::from(s.unwrap_or(0)));
        let times = std::fs::FileTimes::new()
            .set_accessed(at(attrs.atime))
            .set_modified(at(attrs.mtime));
        std::fs::File::options()
            .write(true)
            .open(path)
            .or_else(|_| std::fs::File::open(path))?
            .set_times(times)?;
    }
    Ok(())
}

async fn download_file(
    sftp: &SftpSession,
    remote: &str,
    meta: &FileAttributes,
    dest: &Path,
    preserve: bool,
    events: &(dyn Fn(ScpEvent) + Send + Sync),
) -> Result<u64, SshError> {
    let shown = dest.display().to_string();
    events(ScpEvent::File {
        path: shown.clone(),
        size: meta.size.unwrap_or(0),
    });
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{base}.kubevm-tmp-{}", std::process::id()));
    let mut src = sftp.open(remote).await.map_err(|e| sftp_err(remote, e))?;
    let mut out = tokio::fs::File::create(&tmp)
        .await
        .map_err(|e| sftp_err(&shown, e))?;
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    let result: Result<(), SshError> = async {
        loop {
            let n = src.read(&mut buf).await.map_err(|e| sftp_err(remote, e))?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n]).await?;
            done += n as u64;
            events(ScpEvent::Progress { done });
        }
        out.flush().await?;
        Ok(())
    }
    .await;
    drop(out);
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    apply_local(&tmp, meta, preserve)?;
    std::fs::rename(&tmp, dest).map_err(|e| sftp_err(&shown, e))?;
    Ok(done)
}

async fn download_tree(
    sftp: &SftpSession,
    remote: &str,
    dest: &Path,
    preserve: bool,
    events: &(dyn Fn(ScpEvent) + Send + Sync),
) -> Result<u64, SshError> {
    if !dest.is_dir() {
        std::fs::create_dir(dest).map_err(|e| sftp_err(&dest.display().to_string(), e))?;
    }
    let mut entries: Vec<_> = sftp
        .read_dir(remote)
        .await
        .map_err(|e| sftp_err(remote, e))?
        .filter(|e| e.file_name() != "." && e.file_name() != "..")
        .collect();
    entries.sort_by_key(|e| e.file_name());
    // The whole listing is checked before anything of it is written.
    if let Some(bad) = entries
        .iter()
        .find(|e| !crate::validate::is_single_file_name(&e.file_name()))
    {
        return Err(SshError::Io(format!(
            "{remote}: refusing the name {:?} from the guest's directory listing: not a single file name",
            bad.file_name()
        )));
    }
    let mut total = 0;
    for entry in entries {
        let name = entry.file_name();
        let path = join(remote, &name);
        let meta = entry.metadata();
        if meta.is_dir() {
            total += Box::pin(download_tree(
                sftp,
                &path,
                &dest.join(&name),
                preserve,
                events,
            ))
            .await?;
        } else if meta.is_regular() {
            total += download_file(sftp, &path, &meta, &dest.join(&name), preserve, events).await?;
        }
    }
    if preserve {
        let meta = sftp
            .metadata(remote)
            .await
            .map_err(|e| sftp_err(remote, e))?;
        apply_local(dest, &meta, true)?;
    }
    Ok(total)
}

#[cfg(test)]
mod fake_sftp;
#[cfg(test)]
mod sftp_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        assert!(matches!(
            parse_location("./a:b").unwrap(),
            Location::Local(_)
        ));
        assert!(matches!(
            parse_location("/tmp/x").unwrap(),
            Location::Local(_)
        ));
        assert!(matches!(
            parse_location("dir/a:b").unwrap(),
            Location::Local(_)
        ));
        match parse_location("admin@web.prod:/etc/hosts").unwrap() {
            Location::Remote { target, path } => {
                assert_eq!(
                    (target.user.as_deref(), target.name.as_str()),
                    (Some("admin"), "web")
                );
                assert_eq!(path, "/etc/hosts");
            }
            other => panic!("{other:?}"),
        }
        match parse_location("vm/web/prod:x").unwrap() {
            Location::Remote { target, path } => {
                assert_eq!(
                    (target.namespace.as_deref(), path.as_str()),
                    (Some("prod"), "x")
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(plan("a", "b", false, false).is_err());
        assert!(plan("web:a", "db:b", false, false).is_err());
        assert!(matches!(
            plan("f", "web:", false, false).unwrap().direction,
            Direction::Upload { ref remote, .. } if remote == "."
        ));
        assert_eq!(
            temp_name("/tmp/x"),
            format!("/tmp/.x.kubevm-tmp-{}", std::process::id())
        );
        assert_eq!(
            temp_name("x"),
            format!("./.x.kubevm-tmp-{}", std::process::id())
        );
    }

    #[test]
    fn names_and_modes_from_a_guest() {
        for good in ["a", "a.b", ".hidden", "..a", "a b", "ä"] {
            assert!(crate::validate::is_single_file_name(good), "{good:?}");
        }
        for bad in ["", ".", "..", "../x", "/abs", "a/b", "a/", "./a", "/"] {
            assert!(!crate::validate::is_single_file_name(bad), "{bad:?}");
        }
        assert_eq!(local_mode(0o104755, true, 0o022), 0o755);
        assert_eq!(local_mode(0o6777, true, 0o002), 0o775);
        assert_eq!(local_mode(0o444, false, 0o022), 0o644);
        assert_eq!(local_mode(0o444, true, 0o022), 0o444);
    }
}
