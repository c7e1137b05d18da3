//! `export`: copy disks, snapshots and PVCs out of the cluster.
//!
//! The platform modules create the export object ([`kubevirt`]: VirtualMachineExport with its
//! token Secret; [`deckhouse`]: DataExport), wait for it, and describe the volumes to fetch;
//! [`download`] fetches each one over HTTPS ([`http`]) with Range resume, bounded retries and
//! a checksum computed while streaming ([`checksum`]). Progress is reported as [`Event`]s;
//! the export object is deleted only after every volume arrived (and only if this run, or an
//! earlier kubectl-vm run that failed, created it).

mod answer;
pub mod checksum;
pub mod compress;
pub mod deckhouse;
pub mod download;
pub mod file;
pub mod http;
pub mod kubevirt;
pub mod object;
mod output;
pub mod route;

use std::path::PathBuf;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::{Flavor, Platform};

pub use checksum::{Algo, Expected};

/// Label on every object `export` creates.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "kubectl-vm");
/// Label naming the export an object belongs to.
pub const EXPORT_LABEL: &str = "kubevm.io/export";

/// What to export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// KubeVirt VirtualMachine (`vm/NAME`): every volume, or `--volume`.
    Vm(String),
    /// KubeVirt VirtualMachineSnapshot (`vmsnapshot/NAME`).
    VmSnapshot(String),
    /// A PersistentVolumeClaim (`pvc/NAME`), both platforms.
    Pvc(String),
    /// Deckhouse VirtualDisk (`vd/NAME`).
    Vd(String),
    /// Deckhouse VirtualDiskSnapshot (`vds/NAME`).
    Vds(String),
}

impl Source {
    /// Parses `KIND/NAME` or a bare `NAME`; a bare name is resolved per platform by
    /// [`Source::for_flavor`]. Only the syntax is checked here (before any request).
    pub fn parse(text: &str) -> Result<(Option<&'static str>, String)> {
        let bad =
            |why: String| Error::InvalidTarget(format!("invalid export target {text:?}: {why}"));
        let (prefix, name) = match text.split_once('/') {
            Some((prefix, name)) => {
                let kind = match prefix {
                    "vm" | "virtualmachine" => "vm",
                    "vmsnapshot" | "vmsnapshots" | "virtualmachinesnapshot" => "vmsnapshot",
                    "pvc" | "persistentvolumeclaim" => "pvc",
                    "vd" | "virtualdisk" => "vd",
                    "vds" | "virtualdisksnapshot" => "vds",
                    other => {
                        return Err(bad(format!(
                            "unknown kind {other:?}: use vm/, vmsnapshot/ or pvc/ (KubeVirt), vd/, vds/ or pvc/ (Deckhouse)"
                        )));
                    }
                };
                (Some(kind), name)
            }
            None => (None, text),
        };
        crate::target::validate_name(name).map_err(bad)?;
        Ok((prefix, name.to_string()))
    }

    /// The source a parsed target means on `flavor` (a bare name is `vm/` on KubeVirt and
    /// `vd/` on Deckhouse).
    pub fn for_flavor(prefix: Option<&str>, name: &str, flavor: Flavor) -> Result<Source> {
        let name = name.to_string();
        let source = match (flavor, prefix) {
            (Flavor::KubeVirt, None | Some("vm")) => Source::Vm(name),
            (Flavor::KubeVirt, Some("vmsnapshot")) => Source::VmSnapshot(name),
            (_, Some("pvc")) => Source::Pvc(name),
            (Flavor::Deckhouse, None | Some("vd")) => Source::Vd(name),
            (Flavor::Deckhouse, Some("vds")) => Source::Vds(name),
            (flavor, Some(prefix)) => {
                let allowed = match flavor {
                    Flavor::KubeVirt => "vm/, vmsnapshot/ or pvc/",
                    Flavor::Deckhouse => "vd/, vds/ or pvc/",
                };
                return Err(Error::InvalidTarget(format!(
                    "{prefix}/ targets are not exported on {}: use {allowed}",
                    flavor.display_name()
                )));
            }
        };
        Ok(source)
    }

    /// `kind/name`, as the user would write it.
    pub fn display(&self) -> String {
        match self {
            Source::Vm(n) => format!("vm/{n}"),
            Source::VmSnapshot(n) => format!("vmsnapshot/{n}"),
            Source::Pvc(n) => format!("pvc/{n}"),
            Source::Vd(n) => format!("vd/{n}"),
            Source::Vds(n) => format!("vds/{n}"),
        }
    }

    /// Short kind and name, for export object names.
    fn short(&self) -> (&'static str, &str) {
        match self {
            Source::Vm(n) => ("vm", n),
            Source::VmSnapshot(n) => ("vmsnapshot", n),
            Source::Pvc(n) => ("pvc", n),
            Source::Vd(n) => ("vd", n),
            Source::Vds(n) => ("vds", n),
        }
    }
}

/// The wire format to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Raw disk image (HTTP Range, resumable).
    #[default]
    Raw,
    /// The server's gzip stream (compressed on the fly; not resumable).
    Gzip,
}

/// Where the data goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A file (one volume) or a directory (several volumes).
    Path(PathBuf),
    /// Standard output (one volume only).
    Stdout,
    /// Print the VM's manifest instead of downloading disks (KubeVirt).
    Manifest,
}

/// Everything an export run needs.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// What to export.
    pub source: Source,
    /// Namespace of the source.
    pub namespace: String,
    /// Where to write.
    pub output: Output,
    /// Only this volume (KubeVirt VMs with several volumes).
    pub volume: Option<String>,
    /// Wire format.
    pub format: Format,
    /// Fetch gzip and unpack it on the fly.
    pub decompress: bool,
    /// Algorithm of the checksum computed while streaming.
    pub algo: Algo,
    /// Checksum to verify.
    pub expected: Option<Expected>,
    /// Keep the export object after success.
    pub keep: bool,
    /// Use this existing export object instead of creating one.
    pub reuse: Option<String>,
    /// Continue `FILE.partial` from an earlier run.
    pub resume: bool,
    /// TTL of a created export.
    pub ttl: Duration,
    /// Do not verify the export server's certificate.
    pub insecure: bool,
    /// How long to wait for the export to become ready.
    pub wait_timeout: Duration,
    /// Bounded retries per volume for errors worth retrying.
    pub max_retries: u32,
    /// The first retry's delay (doubles up to 8 s).
    pub retry_delay: Duration,
    /// Fetch this one file of a filesystem claim through its `dir` link (KubeVirt serves a
    /// claim not holding a disk image as `dir` and `tar.gz`), raw with Range: a memory dump.
    /// One normal path component (checked).
    pub dir_file: Option<String>,
    /// The command the resume hint names (default `kubectl vm export SOURCE`).
    pub resume_command: Option<String>,
    /// Fetch raw (resumable) and write the file gzip-compressed once complete: for data the
    /// server serves raw only (a `dir_file`). The checksum reported is the data's; the
    /// `FILE.sha256` next to it is the compressed file's.
    pub compress: bool,
}

/// Progress of an export run.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The export object was created.
    Created {
        /// Kind of the object.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// An existing export object is used (`--reuse`).
    Reusing {
        /// Its name.
        name: String,
    },
    /// Still waiting; says for what.
    Waiting {
        /// What the export waits for, in the platform's words.
        message: String,
    },
    /// The export is ready.
    Ready {
        /// Its name.
        name: String,
    },
    /// How the export server is reached (one line).
    Route {
        /// E.g. "the external link https://…".
        description: String,
    },
    /// A volume transfer starts.
    VolumeStarted {
        /// Volume name.
        volume: String,
        /// Final file (None for stdout).
        path: Option<PathBuf>,
        /// Size, when known.
        total: Option<u64>,
        /// Bytes already on disk (resume).
        offset: u64,
    },
    /// Bytes arrived.
    Progress {
        /// Volume name.
        volume: String,
        /// Bytes of the volume on disk so far.
        done: u64,
        /// Size, when known.
        total: Option<u64>,
    },
    /// Something worth telling that does not stop the run.
    Notice {
        /// One line.
        message: String,
    },
    /// A retryable error; the transfer continues after `delay` from `offset`.
    Retrying {
        /// Attempt number (1-based).
        attempt: u32,
        /// Bound on attempts.
        max: u32,
        /// The error, one line.
        error: String,
        /// Where it continues.
        offset: u64,
        /// Backoff before the retry.
        delay: Duration,
    },
    /// A volume is complete (and verified when a checksum was given).
    VolumeFinished {
        /// Volume name.
        volume: String,
        /// Final file (None for stdout).
        path: Option<PathBuf>,
        /// Bytes written.
        bytes: u64,
        /// Checksum algorithm.
        algo: Algo,
        /// Digest, hex.
        hex: String,
        /// The `sha256sum`-format file written next to it.
        checksum_file: Option<PathBuf>,
        /// Bytes received over the network in this run.
        fetched: u64,
    },
    /// The manifest was fetched (`--manifest`).
    Manifest {
        /// The YAML text.
        text: String,
    },
    /// An object this run created (or a failed earlier run created) was deleted.
    Deleted {
        /// Kind.
        kind: &'static str,
        /// Name.
        name: String,
    },
    /// The export object is kept.
    Kept {
        /// Kind.
        kind: &'static str,
        /// Name.
        name: String,
        /// Why (`--keep`, reused, …).
        why: String,
    },
}

/// A random lower-case suffix of `n` letters and digits.
pub(crate) fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut bytes = vec![0u8; n];
    // Only names depend on it; a failing source degrades to the clock.
    if getrandom::fill(&mut bytes).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (t >> (i * 5)) as u8;
        }
    }
    bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// The name of a new export object: `<prefix>-<kind>-<name>-<suffix>`, within 63 characters.
pub(crate) fn export_name(prefix: &str, source: &Source) -> String {
    let (kind, name) = source.short();
    let suffix = random_suffix(5);
    let mut base = format!("{prefix}-{kind}-{name}");
    base.truncate(63 - 6);
    let base = base.trim_end_matches(['-', '.']);
    format!("{base}-{suffix}")
}

/// One volume to download.
#[derive(Debug, Clone)]
pub struct VolumeLink {
    /// Volume name (the PVC name on KubeVirt, the target name on Deckhouse).
    pub name: String,
    /// Full URL.
    pub url: String,
    /// Whether the URL serves gzip.
    pub gzip: bool,
}

/// Runs an export: create or reuse the export object, wait, download, clean up.
pub async fn run(
    cluster: &Cluster,
    platform: &Platform,
    options: &ExportOptions,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    match platform.flavor {
        Flavor::KubeVirt => kubevirt::run(cluster, platform, options, on_event).await,
        Flavor::Deckhouse => deckhouse::run(cluster, platform, options, on_event).await,
    }
}

/// Refuses a volume name from the server that is not one normal path component (`../x`,
/// `/x`, `a/b`, `..`, empty): it becomes a file name under `-o DIR`.
pub(crate) fn check_volume_name(name: &str) -> Result<()> {
    if crate::validate::is_single_file_name(name) {
        Ok(())
    } else {
        Err(Error::Transfer(format!(
            "refusing the volume name {name:?} from the export: not a single file name"
        )))
    }
}

/// The path each volume goes to: `-o FILE` for one volume, `DIR/<volume>.img[.gz]` for several.
pub(crate) fn volume_paths(
    output: &Output,
    volumes: &[VolumeLink],
    gzip_out: bool,
) -> Result<Vec<Option<PathBuf>>> {
    match output {
        Output::Stdout if volumes.len() > 1 => Err(Error::Transfer(format!(
            "the export has {} volumes ({}); -o - takes one: pick it with --volume",
            volumes.len(),
            volumes
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
        Output::Stdout | Output::Manifest => Ok(vec![None; volumes.len()]),
        // `-o DIR` (an existing directory, or a path ending in `/`) for one volume: the
        // volume's file goes inside it, as for several.
        Output::Path(path)
            if volumes.len() == 1
                && !path.is_dir()
                && !path.as_os_str().to_string_lossy().ends_with('/') =>
        {
            Ok(vec![Some(path.clone())])
        }
        Output::Path(dir) => {
            if dir.exists() && !dir.is_dir() {
                return Err(Error::Transfer(format!(
                    "the export has {} volumes: -o {} must be a directory",
                    volumes.len(),
                    dir.display()
                )));
            }
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Transfer(format!("cannot create {}: {e}", dir.display())))?;
            let ext = if gzip_out { "img.gz" } else { "img" };
            Ok(volumes
                .iter()
                .map(|v| Some(dir.join(format!("{}.{ext}", v.name))))
                .collect())
        }
    }
}

/// Downloads every volume; on failure the error says the export object is kept and how to
/// resume.
pub(crate) async fn download_all(
    client: &http::HttpClient,
    volumes: &[VolumeLink],
    options: &ExportOptions,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    for volume in volumes {
        check_volume_name(&volume.name)?;
    }
    let gzip_out = volumes.iter().any(|v| v.gzip) && !options.decompress;
    let paths = volume_paths(&options.output, volumes, gzip_out)?;
    for (volume, path) in volumes.iter().zip(paths) {
        let job = download::Job {
            volume: volume.name.clone(),
            url: volume.url.clone(),
            gzip: volume.gzip,
            decompress: options.decompress,
            path,
            compress: options.compress,
        };
        download::download(client, &job, options, on_event).await?;
    }
    Ok(())
}

/// The hint added to an error when the export object is kept for a later `--resume`.
pub(crate) fn resume_hint(kind: &str, name: &str, options: &ExportOptions) -> String {
    let output = match &options.output {
        Output::Path(p) => p.display().to_string(),
        Output::Stdout => "-".into(),
        Output::Manifest => String::new(),
    };
    let command = options
        .resume_command
        .clone()
        .unwrap_or_else(|| format!("kubectl vm export {}", options.source.display()));
    format!(
        "; the {kind} {name:?} was kept: resume with `{command} -n {} -o {output} --reuse {name} --resume`",
        options.namespace
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_per_flavor() {
        let (p, n) = Source::parse("web").unwrap();
        assert_eq!(
            Source::for_flavor(p, &n, Flavor::KubeVirt).unwrap(),
            Source::Vm("web".into())
        );
        assert_eq!(
            Source::for_flavor(p, &n, Flavor::Deckhouse).unwrap(),
            Source::Vd("web".into())
        );
        let (p, n) = Source::parse("vds/snap-1").unwrap();
        assert!(Source::for_flavor(p, &n, Flavor::KubeVirt).is_err());
        assert!(Source::parse("disk/x").is_err());
        assert!(Source::parse("vm/Bad_Name").is_err());
    }

    #[test]
    fn volume_names_are_one_component() {
        for good in ["exp-root", "a.b", "..a"] {
            assert!(check_volume_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "../x", "/x", "a/b", "a/", "./a"] {
            assert!(check_volume_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn export_names_fit_a_label() {
        let long = "a".repeat(63);
        let name = export_name("export", &Source::Vm(long));
        assert!(name.len() <= 63, "{name}");
        assert!(name.starts_with("export-vm-aaa"));
    }
}
