//! Which VNC viewer `vnc` launches, and with which arguments.
//!
//! The search order is virtctl's (`pkg/virtctl/vnc/vnc.go`): on macOS the newest TigerVNC
//! app, Chicken, RealVNC, then `remote-viewer` from PATH; elsewhere `remote-viewer` and then
//! `vncviewer` from PATH. Unlike virtctl, the macOS apps are also looked for in
//! `~/Applications` (where a user without admin rights installs them), and the user can name
//! the viewer (`--viewer`, `KUBECTL_VM_VNC_VIEWER`).

use std::path::{Path, PathBuf};

/// Environment variable naming the viewer when `--viewer` is not given.
pub const VIEWER_ENV: &str = "KUBECTL_VM_VNC_VIEWER";

/// The viewer families whose command lines differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewerKind {
    /// virt-viewer's `remote-viewer`: takes a `vnc://HOST:PORT` URI.
    RemoteViewer,
    /// TigerVNC's `vncviewer` (or its macOS app): takes `HOST:PORT`.
    Tiger,
    /// Chicken (macOS): takes `HOST:PORT`.
    Chicken,
    /// RealVNC Viewer: `HOST:PORT` plus flags that silence its prompts about an unencrypted,
    /// shared connection (the connection is a local loopback into an encrypted tunnel).
    Real,
}

/// A viewer to launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Viewer {
    /// The executable.
    pub program: PathBuf,
    /// How it wants its arguments.
    pub kind: ViewerKind,
}

impl Viewer {
    /// The arguments that make it connect to `127.0.0.1:port`.
    pub fn args(&self, port: u16) -> Vec<String> {
        let address = format!("127.0.0.1:{port}");
        match self.kind {
            ViewerKind::RemoteViewer => vec![format!("vnc://{address}")],
            ViewerKind::Tiger | ViewerKind::Chicken => vec![address],
            ViewerKind::Real => vec![
                address,
                "-WarnUnencrypted=0".into(),
                "-Shared=0".into(),
                "-ShareFiles=0".into(),
            ],
        }
    }
}

/// Where the search looks: PATH, the home directory and the operating system, so that tests
/// can describe a Mac without being one.
#[derive(Debug, Clone, Default)]
pub struct SearchPlaces {
    /// The directories of PATH, in order.
    pub path: Vec<PathBuf>,
    /// The user's home directory (for `~/Applications`).
    pub home: Option<PathBuf>,
    /// Whether to look for the macOS applications.
    pub macos: bool,
    /// The root that `/Applications` is under (`/` outside tests).
    pub root: PathBuf,
}

impl SearchPlaces {
    /// The places of this process: its PATH, HOME and operating system.
    pub fn of_this_process() -> Self {
        Self {
            path: std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect())
                .unwrap_or_default(),
            home: std::env::var_os("HOME").map(PathBuf::from),
            macos: cfg!(target_os = "macos"),
            root: PathBuf::from("/"),
        }
    }

    fn in_path(&self, name: &str) -> Option<PathBuf> {
        self.path
            .iter()
            .map(|dir| dir.join(name))
            .find(|candidate| is_executable(candidate))
    }

    /// The application folders of macOS, system-wide first.
    fn application_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.root.join("Applications")];
        if let Some(home) = &self.home {
            dirs.push(home.join("Applications"));
        }
        dirs
    }
}

/// The kind a viewer named `name` (a file name, without its directory) has.
fn kind_of(name: &str) -> ViewerKind {
    let lower = name.to_ascii_lowercase();
    if lower.contains("remote-viewer") {
        ViewerKind::RemoteViewer
    } else if lower.contains("chicken") {
        ViewerKind::Chicken
    } else if lower.contains("tigervnc") {
        ViewerKind::Tiger
    } else if lower == "vncviewer" {
        // TigerVNC's and RealVNC's Linux binaries share this name; TigerVNC's is the packaged one.
        ViewerKind::Tiger
    } else if lower.contains("realvnc") || lower.contains("vnc viewer") {
        ViewerKind::Real
    } else {
        ViewerKind::Tiger
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Why no viewer could be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewerError {
    /// The viewer the user named is not an executable file nor in PATH.
    #[error("VNC viewer {0:?} not found (give a path, or a program name in PATH)")]
    NotFound(String),
}

/// The viewer the user asked for: a path (used as it is) or a program name looked up in PATH.
pub fn named(requested: &str, places: &SearchPlaces) -> Result<Viewer, ViewerError> {
    let as_path = Path::new(requested);
    let program = if requested.contains('/') {
        is_executable(as_path).then(|| as_path.to_path_buf())
    } else {
        places.in_path(requested)
    }
    .ok_or_else(|| ViewerError::NotFound(requested.to_string()))?;
    // A macOS app bundle's binary is named after the app: judge by the whole path.
    let kind = kind_of(
        &program
            .to_string_lossy()
            .replace(".app/Contents/MacOS/", " "),
    );
    let kind = match kind {
        ViewerKind::Tiger if program.to_string_lossy().contains("VNC Viewer.app") => {
            ViewerKind::Real
        }
        other => other,
    };
    Ok(Viewer { program, kind })
}

/// The first viewer found in virtctl's order (see the module documentation).
pub fn discover(places: &SearchPlaces) -> Option<Viewer> {
    if places.macos {
        for apps in places.application_dirs() {
            if let Some(viewer) = macos_apps_in(&apps) {
                return Some(viewer);
            }
        }
        return places.in_path("remote-viewer").map(|program| Viewer {
            program,
            kind: ViewerKind::RemoteViewer,
        });
    }
    if let Some(program) = places.in_path("remote-viewer") {
        return Some(Viewer {
            program,
            kind: ViewerKind::RemoteViewer,
        });
    }
    places.in_path("vncviewer").map(|program| Viewer {
        program,
        kind: ViewerKind::Tiger,
    })
}

/// TigerVNC (the newest of `TigerVNC Viewer*.app`), Chicken, RealVNC in one applications folder.
fn macos_apps_in(apps: &Path) -> Option<Viewer> {
    let mut tiger: Vec<PathBuf> = std::fs::read_dir(apps)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.starts_with("TigerVNC Viewer") && name.ends_with(".app")
        })
        .map(|entry| entry.path().join("Contents/MacOS/TigerVNC Viewer"))
        .filter(|binary| is_executable(binary))
        .collect();
    // Versions in the name ("TigerVNC Viewer 1.13.1.app"): compared as versions, not text,
    // so that 1.10 is newer than 1.9.
    tiger.sort_by_key(|path| version_key(path));
    if let Some(program) = tiger.pop() {
        return Some(Viewer {
            program,
            kind: ViewerKind::Tiger,
        });
    }
    let chicken = apps.join("Chicken.app/Contents/MacOS/Chicken");
    if is_executable(&chicken) {
        return Some(Viewer {
            program: chicken,
            kind: ViewerKind::Chicken,
        });
    }
    let real = apps.join("VNC Viewer.app/Contents/MacOS/vncviewer");
    if is_executable(&real) {
        return Some(Viewer {
            program: real,
            kind: ViewerKind::Real,
        });
    }
    None
}

/// The numbers in an app bundle's name, for ordering versions.
fn version_key(binary: &Path) -> Vec<u64> {
    let bundle = binary
        .ancestors()
        .find(|p| p.extension().is_some_and(|e| e == "app"))
        .and_then(|p| p.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    bundle
        .split(|c: char| !c.is_ascii_digit())
        .filter(|part| !part.is_empty())
        .filter_map(|part| part.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn executable(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn mac(root: &Path) -> SearchPlaces {
        SearchPlaces {
            path: vec![root.join("bin")],
            home: Some(root.join("home")),
            macos: true,
            root: root.to_path_buf(),
        }
    }

    #[test]
    fn linux_prefers_remote_viewer_then_vncviewer() {
        let dir = tempfile::tempdir().unwrap();
        let places = SearchPlaces {
            path: vec![dir.path().join("a"), dir.path().join("b")],
            ..SearchPlaces::default()
        };
        assert_eq!(discover(&places), None);
        executable(&dir.path().join("a/vncviewer"));
        let found = discover(&places).unwrap();
        assert_eq!(found.kind, ViewerKind::Tiger);
        assert_eq!(found.args(5901), ["127.0.0.1:5901"]);
        executable(&dir.path().join("b/remote-viewer"));
        let found = discover(&places).unwrap();
        assert_eq!(found.program, dir.path().join("b/remote-viewer"));
        assert_eq!(found.args(5901), ["vnc://127.0.0.1:5901"]);
    }

    #[test]
    fn a_file_without_execute_permission_is_not_a_viewer() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("remote-viewer"), "").unwrap();
        let places = SearchPlaces {
            path: vec![dir.path().to_path_buf()],
            ..SearchPlaces::default()
        };
        assert_eq!(discover(&places), None);
    }

    #[test]
    fn macos_takes_the_newest_tigervnc_then_chicken_then_realvnc() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let places = mac(root);
        executable(&root.join("bin/remote-viewer"));
        assert_eq!(discover(&places).unwrap().kind, ViewerKind::RemoteViewer);
        executable(&root.join("home/Applications/VNC Viewer.app/Contents/MacOS/vncviewer"));
        let real = discover(&places).unwrap();
        assert_eq!(real.kind, ViewerKind::Real);
        assert_eq!(
            real.args(7),
            [
                "127.0.0.1:7",
                "-WarnUnencrypted=0",
                "-Shared=0",
                "-ShareFiles=0"
            ]
        );
        executable(&root.join("Applications/Chicken.app/Contents/MacOS/Chicken"));
        assert_eq!(discover(&places).unwrap().kind, ViewerKind::Chicken);
        for version in ["1.9.0", "1.13.1", "1.10.0"] {
            executable(&root.join(format!(
                "Applications/TigerVNC Viewer {version}.app/Contents/MacOS/TigerVNC Viewer"
            )));
        }
        let tiger = discover(&places).unwrap();
        assert_eq!(tiger.kind, ViewerKind::Tiger);
        assert!(
            tiger
                .program
                .to_string_lossy()
                .contains("TigerVNC Viewer 1.13.1.app"),
            "{}",
            tiger.program.display()
        );
    }

    #[test]
    fn a_named_viewer_is_a_path_or_a_program_in_path() {
        let dir = tempfile::tempdir().unwrap();
        let places = SearchPlaces {
            path: vec![dir.path().join("bin")],
            ..SearchPlaces::default()
        };
        executable(&dir.path().join("bin/remote-viewer"));
        let by_name = named("remote-viewer", &places).unwrap();
        assert_eq!(by_name.kind, ViewerKind::RemoteViewer);
        let app = dir
            .path()
            .join("Applications/VNC Viewer.app/Contents/MacOS/vncviewer");
        executable(&app);
        let by_path = named(app.to_str().unwrap(), &places).unwrap();
        assert_eq!(by_path.kind, ViewerKind::Real);
        assert_eq!(
            named("tigervnc", &places),
            Err(ViewerError::NotFound("tigervnc".into()))
        );
        assert!(named("/nonexistent/vncviewer", &places).is_err());
    }
}
