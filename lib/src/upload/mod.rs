//! `upload`: a local disk image into the cluster.
//!
//! [`plan`] reads the file before any request ([`format`]: magic bytes, virtual size) and
//! checks the size; [`kubevirt`] creates (or reuses, `--no-create`) a DataVolume with
//! `source.upload` and CDI's immediate-binding annotation, asks CDI's API for an upload token,
//! and sends the file to the upload proxy ([`transfer`]: streamed, sha256 computed while
//! sending, retried from the beginning on network errors since CDI cannot resume), then waits
//! for the DataVolume to succeed. [`deckhouse`] does the same with a VirtualImage,
//! ClusterVirtualImage or VirtualDisk with `dataSource.type: Upload`, its sha256 computed
//! before the object is created so the platform checks it. On failure or interruption what
//! the run created is deleted (uid precondition) unless `keep`.

pub mod deckhouse;
pub mod format;
pub mod kubevirt;
pub mod transfer;

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use format::{ImageFormat, ImageInfo};

/// Label on every object `upload` creates.
pub const MANAGED_BY: (&str, &str) = crate::export::MANAGED_BY;

/// Where the image goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// CDI DataVolume (`dv/NAME`).
    Dv(String),
    /// A PVC through CDI's upload (`pvc/NAME`): a DataVolume of that name owns it.
    Pvc(String),
    /// Deckhouse VirtualImage (`vi/NAME`).
    Vi(String),
    /// Deckhouse ClusterVirtualImage (`cvi/NAME`, cluster-scoped).
    Cvi(String),
    /// Deckhouse VirtualDisk (`vd/NAME`).
    Vd(String),
}

impl Target {
    /// Parses `dv/NAME`, `pvc/NAME`, `vi/NAME`, `cvi/NAME` or `vd/NAME` (a bare NAME is `dv/NAME`).
    pub fn parse(text: &str) -> Result<Target> {
        let bad =
            |why: String| Error::InvalidTarget(format!("invalid upload target {text:?}: {why}"));
        let (kind, name) = text.split_once('/').unwrap_or(("dv", text));
        crate::target::validate_name(name).map_err(bad)?;
        let name = name.to_string();
        match kind {
            "dv" | "datavolume" => Ok(Target::Dv(name)),
            "pvc" | "persistentvolumeclaim" => Ok(Target::Pvc(name)),
            "vi" | "virtualimage" => Ok(Target::Vi(name)),
            "cvi" | "clustervirtualimage" => Ok(Target::Cvi(name)),
            "vd" | "virtualdisk" => Ok(Target::Vd(name)),
            other => Err(bad(format!(
                "unknown kind {other:?}: use dv/ or pvc/ (KubeVirt), vi/, cvi/ or vd/ (Deckhouse)"
            ))),
        }
    }

    /// The object's name (for `pvc/`, the DataVolume's and its PVC's).
    pub fn name(&self) -> &str {
        match self {
            Target::Dv(n) | Target::Pvc(n) | Target::Vi(n) | Target::Cvi(n) | Target::Vd(n) => n,
        }
    }

    /// Whether the target is a Deckhouse virtualization object.
    pub fn is_deckhouse(&self) -> bool {
        matches!(self, Target::Vi(_) | Target::Cvi(_) | Target::Vd(_))
    }

    /// The platform that serves the target's kind.
    pub fn flavor(&self) -> crate::Flavor {
        match self {
            Target::Dv(_) | Target::Pvc(_) => crate::Flavor::KubeVirt,
            Target::Vi(_) | Target::Cvi(_) | Target::Vd(_) => crate::Flavor::Deckhouse,
        }
    }

    /// `kind/name`, as written.
    pub fn display(&self) -> String {
        let kind = match self {
            Target::Dv(_) => "dv",
            Target::Pvc(_) => "pvc",
            Target::Vi(_) => "vi",
            Target::Cvi(_) => "cvi",
            Target::Vd(_) => "vd",
        };
        format!("{kind}/{}", self.name())
    }
}

/// Everything an upload run needs.
#[derive(Debug, Clone)]
pub struct UploadOptions {
    /// The local image.
    pub file: PathBuf,
    /// Where it goes.
    pub target: Target,
    /// Namespace of the target.
    pub namespace: String,
    /// Volume size (`--size`); default the image's virtual size.
    pub size: Option<u64>,
    /// Take a file of no known format as raw (`--format raw`).
    pub force_raw: bool,
    /// Storage class of a created volume (a VirtualImage's only when it is kept on a PVC).
    pub storage_class: Option<String>,
    /// Deckhouse VirtualImage: keep it on a PVC (`storage: PersistentVolumeClaim`) rather than
    /// in DVCR.
    pub image_on_pvc: bool,
    /// Access mode of a created volume.
    pub access_mode: Option<String>,
    /// Volume mode of a created volume (`Filesystem` or `Block`).
    pub volume_mode: Option<String>,
    /// Use an existing DataVolume waiting for upload.
    pub no_create: bool,
    /// Keep what this run created when it fails.
    pub keep: bool,
    /// The upload proxy's URL (`--uploadproxy-url`); default CDIConfig's.
    pub uploadproxy_url: Option<String>,
    /// Do not verify the upload proxy's certificate.
    pub insecure: bool,
    /// How long to wait for the volume (ready for upload, then done).
    pub wait_timeout: Duration,
    /// Attempts after network errors (each from the beginning).
    pub max_retries: u32,
    /// Delay before the first retry (doubles up to 8 s).
    pub retry_delay: Duration,
}

/// A checked upload: the options and what the file is.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The options.
    pub options: UploadOptions,
    /// What [`format::inspect`] found.
    pub info: ImageInfo,
    /// The volume size to request: always set for KubeVirt; for Deckhouse only with `--size`
    /// (the platform sizes a disk from the unpacked image otherwise).
    pub size: Option<u64>,
}

/// Checks everything that can be checked locally: the file, its format, the size.
pub fn plan(options: UploadOptions) -> Result<Plan> {
    let info = format::inspect(&options.file, options.force_raw)?;
    if let (Some(size), Some(virtual_size)) = (options.size, info.virtual_size)
        && size < virtual_size
    {
        return Err(Error::Usage(format!(
            "--size {size} is smaller than the image's virtual size {virtual_size} ({} {}): the disk would not fit",
            info.format.name(),
            options.file.display()
        )));
    }
    let size = if options.target.is_deckhouse() {
        deckhouse_checks(&options)?;
        options.size
    } else {
        match (options.size, info.virtual_size) {
            (Some(size), _) => Some(size),
            (None, Some(virtual_size)) => Some(virtual_size),
            (None, None) => {
                return Err(Error::Usage(format!(
                    "{} is {}-compressed and its disk size is unknown until unpacked: give --size",
                    options.file.display(),
                    info.format.name()
                )));
            }
        }
    };
    if options.no_create && options.size.is_some() {
        return Err(Error::Usage(
            "--size applies to a volume this run creates, not with --no-create".into(),
        ));
    }
    if let Some(mode) = &options.volume_mode
        && mode != "Filesystem"
        && mode != "Block"
    {
        return Err(Error::Usage(format!(
            "--volume-mode {mode:?}: use Filesystem or Block"
        )));
    }
    if let Some(mode) = &options.access_mode
        && ![
            "ReadWriteOnce",
            "ReadOnlyMany",
            "ReadWriteMany",
            "ReadWriteOncePod",
        ]
        .contains(&mode.as_str())
    {
        return Err(Error::Usage(format!(
            "--access-mode {mode:?}: use ReadWriteOnce, ReadOnlyMany, ReadWriteMany or ReadWriteOncePod"
        )));
    }
    if let Some(url) = &options.uploadproxy_url {
        proxy_base(url)?;
    }
    Ok(Plan {
        options,
        info,
        size,
    })
}

/// Refuses a target the cluster's platform does not serve (a usage error naming the targets it
/// does), then what the target's platform needs before anything is created
/// ([`kubevirt::preflight`]: CDI's token API).
pub fn check_platform(plan: &Plan, platform: &crate::flavor::Platform) -> Result<()> {
    let target = &plan.options.target;
    if target.flavor() != platform.flavor {
        return Err(Error::Usage(format!(
            "upload to {} needs {}; this cluster runs {}: upload to {}",
            target.display(),
            crate::platform::of(target.flavor()).upload_service,
            platform.flavor.display_name(),
            crate::platform::of(platform.flavor).upload_targets,
        )));
    }
    if target.is_deckhouse() {
        Ok(())
    } else {
        kubevirt::preflight(plan, platform)
    }
}

/// Runs a checked upload on the platform its target belongs to (after [`check_platform`]).
pub async fn run(
    cluster: &crate::cluster::Cluster,
    plan: &Plan,
    interrupts: Option<tokio::sync::watch::Receiver<usize>>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    if plan.options.target.is_deckhouse() {
        deckhouse::run(cluster, plan, interrupts, on_event).await
    } else {
        kubevirt::run(cluster, plan, interrupts, on_event).await
    }
}

/// The uploaded object as `kubectl get -o name` writes it
/// (`datavolume.cdi.kubevirt.io/NAME`, `virtualdisk.virtualization.deckhouse.io/NAME`, ...).
pub fn resource_name(target: &Target) -> String {
    if target.is_deckhouse() {
        deckhouse::resource_name(target)
    } else {
        kubevirt::resource_name(target)
    }
}

/// Flags that mean nothing for a Deckhouse target (CDI's volume settings and proxy).
fn deckhouse_checks(options: &UploadOptions) -> Result<()> {
    let target = options.target.display();
    let refuse =
        |flag: &str, why: &str| Err(Error::Usage(format!("{flag} {why} (target {target})")));
    let disk = matches!(options.target, Target::Vd(_));
    if options.size.is_some() && !disk {
        return refuse(
            "--size",
            "applies to vd/ only: an image takes the size of what is uploaded",
        );
    }
    if options.storage_class.is_some() && !disk && !options.image_on_pvc {
        return refuse("--storage-class", "applies to vd/ only on Deckhouse");
    }
    if options.access_mode.is_some() || options.volume_mode.is_some() {
        return refuse(
            "--access-mode/--volume-mode",
            "are DataVolume settings: Deckhouse chooses them from the storage class",
        );
    }
    if options.uploadproxy_url.is_some() {
        return refuse(
            "--uploadproxy-url",
            "is CDI's upload proxy: Deckhouse publishes its upload URLs in the object's status",
        );
    }
    Ok(())
}

/// The proxy's base URL (`https://` added when no scheme is given, as virtctl does);
/// refuses plain HTTP, paths and unparsable URLs.
pub fn proxy_base(url: &str) -> Result<String> {
    let url = url.trim_end_matches('/');
    let with_scheme = if url.contains("://") {
        url.to_string()
    } else {
        format!("https://{url}")
    };
    let uri: http::Uri = with_scheme
        .parse()
        .map_err(|e| Error::Usage(format!("upload proxy URL {url:?}: {e}")))?;
    if uri.scheme_str() != Some("https") || uri.host().is_none() {
        return Err(Error::Usage(format!(
            "upload proxy URL {url:?}: must be https://HOST[:PORT]"
        )));
    }
    Ok(with_scheme)
}

/// Progress of an upload run.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// What the file is.
    Inspected {
        /// Format found.
        format: ImageFormat,
        /// Virtual size, when known.
        virtual_size: Option<u64>,
        /// Volume size requested (None: the platform's choice).
        size: Option<u64>,
    },
    /// The file is read once before the upload to compute the sha256 the server checks.
    Hashing {
        /// Bytes to read.
        total: u64,
    },
    /// Bytes hashed so far in the pre-pass.
    Hashed {
        /// Read so far.
        done: u64,
        /// Bytes to read.
        total: u64,
    },
    /// The sha256 of the file, computed before sending.
    Checksum {
        /// Hex digest.
        sha256: String,
    },
    /// An object was created.
    Created {
        /// Kind.
        kind: &'static str,
        /// Name.
        name: String,
    },
    /// Still waiting, in the platform's words.
    Waiting {
        /// What for.
        message: String,
    },
    /// How the upload proxy is reached.
    Route {
        /// One line.
        description: String,
    },
    /// Sending starts (again, after a retry).
    Started {
        /// Bytes to send.
        total: u64,
    },
    /// Bytes sent.
    Progress {
        /// Sent so far in this attempt.
        sent: u64,
        /// Bytes to send.
        total: u64,
    },
    /// A retryable failure; the upload starts again from the beginning after `delay`.
    Retrying {
        /// Attempt number (1-based).
        attempt: u32,
        /// Bound.
        max: u32,
        /// The error.
        error: String,
        /// Backoff.
        delay: Duration,
    },
    /// The whole file was sent and accepted.
    Sent {
        /// Bytes.
        bytes: u64,
        /// sha256 of the bytes sent, hex.
        sha256: String,
        /// Seconds the successful attempt took.
        secs: f64,
    },
    /// The platform reports the volume ready.
    Ready {
        /// `kind/name`.
        target: String,
    },
    /// What this run created was deleted.
    Deleted {
        /// Kind.
        kind: &'static str,
        /// Name.
        name: String,
    },
    /// What this run created is kept after a failure (`--keep`).
    Kept {
        /// Kind.
        kind: &'static str,
        /// Name.
        name: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flavor::{Flavor, Platform};

    fn plan_to(target: &str, no_create: bool) -> Plan {
        Plan {
            options: UploadOptions {
                file: PathBuf::from("disk.img"),
                target: Target::parse(target).unwrap(),
                namespace: "default".into(),
                size: None,
                force_raw: false,
                storage_class: None,
                image_on_pvc: false,
                access_mode: None,
                volume_mode: None,
                no_create,
                keep: false,
                uploadproxy_url: None,
                insecure: false,
                wait_timeout: Duration::from_secs(60),
                max_retries: 0,
                retry_delay: Duration::from_secs(1),
            },
            info: ImageInfo {
                format: ImageFormat::Raw,
                file_size: 1024,
                virtual_size: Some(1024),
            },
            size: Some(1024),
        }
    }

    /// Another platform's target is refused in these words (the e2e tests `upload::` and
    /// `upload_deckhouse::` check their middle).
    #[test]
    fn another_platforms_target_names_what_this_one_takes() {
        let err = check_platform(
            &plan_to("vi/d", false),
            &Platform::assumed(Flavor::KubeVirt),
        )
        .unwrap_err();
        assert!(matches!(err, Error::Usage(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "upload to vi/d needs Deckhouse virtualization; this cluster runs KubeVirt: upload to dv/NAME or pvc/NAME"
        );
        let err = check_platform(
            &plan_to("dv/d", false),
            &Platform::assumed(Flavor::Deckhouse),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "upload to dv/d needs KubeVirt's CDI; this cluster runs Deckhouse virtualization: upload to vi/NAME, cvi/NAME or vd/NAME"
        );
        for target in ["vi/a", "cvi/a", "vd/a"] {
            check_platform(
                &plan_to(target, false),
                &Platform::assumed(Flavor::Deckhouse),
            )
            .unwrap();
        }
    }

    /// A new DataVolume needs CDI's token API; an existing one (`--no-create`) is not checked.
    #[test]
    fn a_new_data_volume_needs_the_token_api() {
        let without_cdi = Platform {
            flavor: Flavor::KubeVirt,
            groups: vec![crate::flavor::ServedGroup {
                name: "kubevirt.io".into(),
                versions: vec!["v1".into()],
                preferred: Some("v1".into()),
            }],
        };
        let err = check_platform(&plan_to("dv/a", false), &without_cdi).unwrap_err();
        assert!(
            matches!(err, Error::NotServed { ref resource } if resource == "uploadtokenrequests.upload.cdi.kubevirt.io"),
            "{err:?}"
        );
        check_platform(&plan_to("dv/a", true), &without_cdi).unwrap();
        check_platform(
            &plan_to("pvc/a", false),
            &Platform::assumed(Flavor::KubeVirt),
        )
        .unwrap();
    }

    /// `-o name` prints what `kubectl get -o name` would.
    #[test]
    fn resource_names_are_kubectls() {
        for (target, want) in [
            ("dv/a", "datavolume.cdi.kubevirt.io/a"),
            ("pvc/a", "datavolume.cdi.kubevirt.io/a"),
            ("vi/a", "virtualimage.virtualization.deckhouse.io/a"),
            ("cvi/a", "clustervirtualimage.virtualization.deckhouse.io/a"),
            ("vd/a", "virtualdisk.virtualization.deckhouse.io/a"),
        ] {
            assert_eq!(resource_name(&Target::parse(target).unwrap()), want);
        }
    }
}
