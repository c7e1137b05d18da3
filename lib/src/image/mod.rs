//! The image catalog: golden images to create VMs from, listed, made, and deleted.
//!
//! KubeVirt ([`kubevirt`]): a golden image is a CDI DataSource (`cdi.kubevirt.io/v1beta1`)
//! naming the PVC a DataVolume imported (CDI `datasource-controller.go`: condition `Ready`
//! `True`, reason `Ready`, once that DataVolume is `Succeeded`; else `False` with the
//! DataVolume's phase as reason). `image create` makes the DataVolume (HTTP, registry or a
//! clone of a PVC) and the DataSource naming it.
//!
//! Deckhouse ([`deckhouse`]): a VirtualImage (namespaced; stored in DVCR or on a PVC) or a
//! ClusterVirtualImage, whose `status.phase` goes `Pending → Provisioning` (`status.progress`
//! `NN%`) `→ Ready` or `Failed` (condition `Ready` `False`, reason `ProvisioningFailed`, with
//! the importer's error), with `status.format` and `status.size` once imported.
//!
//! The platform is picked once, in [`catalog`]; everything else goes through [`Catalog`].
//! Listing reads a page at a time ([`crate::vm::PAGE_SIZE`] per request, like kubectl) and
//! hands each page to the caller as it arrives. Deleting only touches images kubectl-vm made
//! (the managed-by label), with the uid read as a precondition.

pub mod deckhouse;
pub mod kubevirt;
pub mod schedule;
mod upload;

use std::time::Duration;

use futures::future::{BoxFuture, LocalBoxFuture};
use kube::api::{ListParams, Preconditions};
use kube::core::Request;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::api::DryRun;
use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL};

/// What kind of catalog entry an image is (the KIND column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ImageKind {
    /// Deckhouse VirtualImage (namespaced).
    Vi,
    /// Deckhouse ClusterVirtualImage.
    Cvi,
    /// CDI DataSource.
    Ds,
    /// A PersistentVolumeClaim (as a clone source).
    Pvc,
    /// Deckhouse VirtualDisk (as a source only).
    Vd,
    /// Deckhouse VirtualDiskSnapshot (as a source only).
    Vds,
}

impl ImageKind {
    /// The short name users type and the table shows: `vi`, `cvi`, `ds`, `pvc`, `vd`.
    pub fn short(self) -> &'static str {
        match self {
            ImageKind::Vi => "vi",
            ImageKind::Cvi => "cvi",
            ImageKind::Ds => "ds",
            ImageKind::Pvc => "pvc",
            ImageKind::Vd => "vd",
            ImageKind::Vds => "vds",
        }
    }

    fn parse(word: &str) -> Option<ImageKind> {
        Some(match word {
            "vi" | "virtualimage" => ImageKind::Vi,
            "cvi" | "clustervirtualimage" => ImageKind::Cvi,
            "ds" | "das" | "datasource" => ImageKind::Ds,
            "pvc" | "persistentvolumeclaim" => ImageKind::Pvc,
            "vd" | "virtualdisk" => ImageKind::Vd,
            "vds" | "virtualdisksnapshot" => ImageKind::Vds,
            _ => return None,
        })
    }
}

/// An image named on the command line: `NAME`, `KIND/NAME` or `KIND/NAMESPACE/NAME`
/// (KIND `vi`, `cvi`, `ds`, `pvc`, `vd`, `vds`; a namespace only for namespaced kinds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageName {
    /// The kind, when given.
    pub kind: Option<ImageKind>,
    /// The namespace, when given (else the current one).
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl ImageName {
    /// Parse and check a reference locally (a usage error on bad input).
    pub fn parse(text: &str) -> Result<ImageName> {
        let usage = |why: String| Error::Usage(format!("image {text:?}: {why}"));
        let parts: Vec<&str> = text.split('/').collect();
        let (kind, namespace, name) = match parts.as_slice() {
            [name] => (None, None, *name),
            [kind, name] => (Some(*kind), None, *name),
            [kind, ns, name] => (Some(*kind), Some(*ns), *name),
            _ => {
                return Err(usage(
                    "expected NAME, KIND/NAME or KIND/NAMESPACE/NAME".into(),
                ));
            }
        };
        let kind = match kind {
            None => None,
            Some(k) => Some(ImageKind::parse(k).ok_or_else(|| {
                usage(format!(
                    "unknown kind {k:?} (one of vi, cvi, ds, pvc, vd, vds)"
                ))
            })?),
        };
        if namespace.is_some() && kind == Some(ImageKind::Cvi) {
            return Err(usage("a ClusterVirtualImage has no namespace".into()));
        }
        if let Some(ns) = namespace {
            crate::validate::dns_label("namespace", ns).map_err(|e| usage(e.to_string()))?;
        }
        crate::validate::dns_subdomain("image", name).map_err(|e| usage(e.to_string()))?;
        Ok(ImageName {
            kind,
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
        })
    }
}

/// One catalog entry, as listed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    /// Its kind.
    pub kind: ImageKind,
    /// Its name.
    pub name: String,
    /// Its namespace ("" for a ClusterVirtualImage).
    pub namespace: String,
    /// Where it comes from: a URL, `registry IMAGE`, `vi/NAME`, `pvc/NS/NAME`, `upload`, ….
    pub source: String,
    /// Its format (`qcow2`, `raw`, `iso`, …) where the platform says.
    pub format: String,
    /// Its size where known.
    pub size: String,
    /// The platform's phase (`Ready`, `Provisioning`, `ImportInProgress`, `Failed`, …).
    pub phase: String,
    /// Import progress while importing (`45%`), else "".
    pub progress: String,
    /// Whether it can be booted from.
    pub ready: bool,
    /// Why it is not ready, as the platform says (a failed import's error), else "".
    pub message: String,
    /// Where it is stored: a DVCR URL, `pvc/NS/NAME`, `snapshot/NS/NAME`.
    pub target: String,
    /// `metadata.creationTimestamp`.
    pub created: String,
    /// Whether kubectl-vm made it.
    pub ours: bool,
    /// The object itself (for `-o yaml|json`).
    #[serde(skip)]
    pub object: Value,
}

impl Image {
    /// The PHASE column: the phase, with the progress while importing (`ImportInProgress 45%`).
    pub fn phase_cell(&self) -> String {
        if self.progress.is_empty() || self.ready {
            self.phase.clone()
        } else {
            format!("{} {}", self.phase, self.progress)
        }
    }
}

pub use crate::validate::Checksum;

/// Parse `--checksum ALGO:HEX` (md5, sha1, sha256, sha512; streebog256/512 on Deckhouse).
pub fn parse_checksum(text: &str) -> Result<Checksum> {
    text.parse::<Checksum>()
        .map_err(|e| Error::Usage(e.to_string()))
}

/// Where a new image's data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// An HTTP(S) URL, with an optional checksum.
    Url {
        /// The URL (checked by [`check_url`]).
        url: String,
        /// What the download must hash to.
        checksum: Option<Checksum>,
    },
    /// A container registry image holding a disk image (`/disk/*` in the image).
    Registry(String),
    /// Another image, disk or PVC.
    From(ImageName),
    /// A local disk image, streamed through the upload path ([`crate::upload`]).
    Upload {
        /// The file.
        file: std::path::PathBuf,
        /// Take a file of no recognised format as a raw disk (`--format raw`).
        raw: bool,
    },
}

/// Where a Deckhouse VirtualImage keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// The platform's registry (`ContainerRegistry`, the default).
    Dvcr,
    /// A PersistentVolumeClaim (`PersistentVolumeClaim`).
    Pvc,
}

/// An image to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    /// Its name.
    pub name: String,
    /// Its namespace (ignored for a cluster-wide image).
    pub namespace: String,
    /// Cluster-wide (Deckhouse ClusterVirtualImage).
    pub cluster: bool,
    /// Where its data comes from.
    pub source: Source,
    /// Deckhouse: DVCR or a PVC (None: the platform's default).
    pub storage: Option<Storage>,
    /// The volume size (KubeVirt DataVolume; default [`DEFAULT_SIZE`]).
    pub size: Option<String>,
    /// The StorageClass of the volume, if not the default.
    pub storage_class: Option<String>,
    /// KubeVirt: import on this cron schedule (a CDI DataImportCron) instead of once.
    pub schedule: Option<String>,
    /// With `schedule`: how many imports CDI keeps (default 3).
    pub imports_to_keep: Option<u32>,
}

/// The size of a KubeVirt import's volume when none is given (CDI needs one for imports).
pub const DEFAULT_SIZE: &str = "10Gi";

/// How to run a change.
#[derive(Debug, Clone)]
pub struct Options {
    /// Dry run strategy.
    pub dry_run: DryRun,
    /// Wait for the end state.
    pub wait: bool,
    /// How long to wait.
    pub timeout: Duration,
    /// Ctrl-C presses (an upload stops and removes what it made); None: not watched.
    pub interrupts: Option<tokio::sync::watch::Receiver<usize>>,
}

/// Progress of a change.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// An object was made (or would be, with a dry run): `kind/name`.
    Created(String),
    /// The import moved on: phase and progress (`45%` or "").
    Progress {
        /// The platform's phase.
        phase: String,
        /// Its progress.
        progress: String,
    },
    /// Something worth telling.
    Notice(String),
    /// A step of the upload of a local file ([`Source::Upload`]).
    Upload(crate::upload::Event),
}

/// What a create did.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The image as listed after the change (with a client dry run: as it would be sent).
    pub image: Image,
    /// `kind.group/name` of the image object, for `-o name`.
    pub object_ref: String,
    /// Whether the wait ran to the end state.
    pub waited: bool,
}

/// What a delete did.
#[derive(Debug, Clone, PartialEq)]
pub struct Deleted {
    /// `kind.group/name` of each object deleted (or that would be).
    pub object_refs: Vec<String>,
    /// VMs that still name the image (they keep their disks; said to the user).
    pub referenced_by: Vec<String>,
}

/// A page of images handed to the caller.
pub type OnPage<'a> = dyn FnMut(Vec<Image>) -> Result<()> + Send + 'a;
/// Progress callback.
pub type OnEvent<'a> = dyn Fn(Event) + Send + Sync + 'a;

/// What each platform's catalog does (picked once by [`catalog`]).
pub trait Catalog: Sync {
    /// List the images in `namespace` (all namespaces when `None`; cluster-wide images
    /// always), page by page, matching `selector`.
    fn list<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: Option<&'a str>,
        selector: Option<&'a str>,
        on_page: &'a mut OnPage<'a>,
    ) -> BoxFuture<'a, Result<()>>;

    /// List as [`Catalog::list`] does, then watch: each image that changes afterwards is
    /// handed over as a page of one (a deleted one with phase `Deleted`). Runs until the
    /// watch fails; when the server has compacted the resource version (410) it lists again.
    fn watch<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: Option<&'a str>,
        selector: Option<&'a str>,
        on_page: &'a mut OnPage<'a>,
    ) -> BoxFuture<'a, Result<()>>;

    /// One image (`name.namespace` in `namespace` unless it names its own).
    fn get<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: &'a str,
        name: &'a ImageName,
    ) -> BoxFuture<'a, Result<Image>>;

    /// Make an image and, with `options.wait`, wait until it is ready or has failed. Not
    /// `Send`: an upload ([`Source::Upload`]) streams the file on the caller's task.
    fn create<'a>(
        &'a self,
        cluster: &'a Cluster,
        request: &'a CreateRequest,
        options: &'a Options,
        on_event: &'a OnEvent<'a>,
    ) -> LocalBoxFuture<'a, Result<Outcome>>;

    /// Delete an image kubectl-vm made, refusing while a VM is being created from it.
    fn delete<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: &'a str,
        name: &'a ImageName,
        options: &'a Options,
    ) -> BoxFuture<'a, Result<Deleted>>;
}

/// The catalog of a platform: the one place the platform is chosen.
pub fn catalog(flavor: Flavor) -> &'static dyn Catalog {
    match flavor {
        Flavor::KubeVirt => &kubevirt::KubeVirt,
        Flavor::Deckhouse => &deckhouse::Deckhouse,
    }
}

/// Check a URL locally: `http://` or `https://`, a host, no spaces or control characters.
pub fn check_url(url: &str) -> Result<()> {
    let usage = |why: &str| Error::Usage(format!("--url {url:?}: {why}"));
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| usage("the URL must start with http:// or https://"))?;
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(usage("the URL has spaces or control characters"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    let host = if host.starts_with('[') {
        host.split(']').next().unwrap_or("").trim_start_matches('[')
    } else {
        host.split(':').next().unwrap_or("")
    };
    if host.is_empty() {
        return Err(usage("the URL has no host"));
    }
    if let Some((_, port)) = authority.rsplit_once(':')
        && !authority.ends_with(']')
        && port.parse::<u16>().is_err()
    {
        return Err(usage("the port is not a number from 0 to 65535"));
    }
    Ok(())
}

/// Check a create request locally (names, URL, checksum, size). One line, exit 2.
pub fn check(request: &CreateRequest) -> Result<()> {
    crate::validate::dns_subdomain("image", &request.name)
        .map_err(|e| Error::Usage(e.to_string()))?;
    if let Source::Url { url, .. } = &request.source {
        check_url(url)?;
    }
    if let Source::Upload { file, raw } = &request.source {
        // The upload's own sniffing: a missing file or one of no disk image format is
        // refused here, before any request.
        crate::upload::format::inspect(file, *raw)?;
    }
    if let Source::Registry(image) = &request.source
        && (image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()))
    {
        return Err(Error::Usage(format!(
            "--registry {image:?}: not an image reference"
        )));
    }
    if let Some(schedule) = &request.schedule {
        schedule::check_schedule(schedule)?;
        if !matches!(request.source, Source::Registry(_)) {
            return Err(Error::Usage(
                "--schedule imports from a registry (--registry IMAGE): CDI's DataImportCron takes no other source".into(),
            ));
        }
    } else if request.imports_to_keep.is_some() {
        return Err(Error::Usage(
            "--imports-to-keep applies to a scheduled import (--schedule)".into(),
        ));
    }
    if let Some(size) = &request.size {
        crate::quantity::Quantity::parse(size)
            .map_err(|e| Error::Usage(format!("--size {size:?}: {e}")))?;
    }
    if let Some(class) = &request.storage_class {
        crate::validate::dns_subdomain("storage class", class)
            .map_err(|e| Error::Usage(e.to_string()))?;
    }
    Ok(())
}

/// The namespace a reference means (its own, else `current`).
pub(crate) fn namespace_of<'a>(name: &'a ImageName, current: &'a str) -> &'a str {
    name.namespace.as_deref().unwrap_or(current)
}

/// Whether kubectl-vm made `obj` (its managed-by label).
pub(crate) fn is_ours(obj: &Value) -> bool {
    text(
        obj,
        &format!("/metadata/labels/{}", MANAGED_BY_LABEL.replace('/', "~1")),
    ) == MANAGED_BY
}

/// `s` at `pointer` in `obj`, or "".
pub(crate) fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// A quantity or string field as text.
pub(crate) fn quantity_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// A condition of `obj` by type.
pub(crate) fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

#[derive(Debug, Deserialize)]
struct ListMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
    #[serde(rename = "resourceVersion", default)]
    resource_version: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Page {
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<Value>,
}

/// List `kind` a page at a time (500 per request, `continue` tokens), handing each page's
/// objects to `on_page` as it arrives.
pub(crate) async fn pages(
    cluster: &Cluster,
    kind: &Kind,
    ns: Option<&str>,
    selector: Option<&str>,
    mut on_page: impl FnMut(Vec<Value>) -> Result<()>,
) -> Result<String> {
    let api = kind.api(&cluster.client, ns);
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(crate::vm::PAGE_SIZE);
        if let Some(selector) = selector {
            params = params.labels(selector);
        }
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let request = Request::new(api.resource_url())
            .list(&params)
            .map_err(|e| cluster.error(kube::Error::BuildRequest(e), &kind.action("list", ns)))?;
        let page: Page = cluster
            .client
            .request(request)
            .await
            .map_err(|e| cluster.error(e, &kind.action("list", ns)))?;
        on_page(page.items)?;
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(t) => token = Some(t),
            None => return Ok(page.metadata.resource_version.unwrap_or_default()),
        }
    }
}

/// What a watch of one of several kinds reported.
pub(crate) enum Change {
    /// The object (index of the kind watched) was added or modified.
    Changed(usize, Value),
    /// The object was deleted.
    Deleted(usize, Value),
    /// The resource version is gone (410): list again.
    Expired,
}

/// Watch several kinds from their resource versions, as one stream of [`Change`]s.
pub(crate) fn feeds<'a>(
    cluster: &'a Cluster,
    kinds: &[(Kind, Option<&'a str>, String)],
    selector: Option<&'a str>,
) -> futures::stream::BoxStream<'a, Result<Change>> {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let streams = kinds.iter().enumerate().map(|(i, (kind, ns, version))| {
        let mut params = WatchParams::default().timeout(290);
        if let Some(selector) = selector {
            params = params.labels(selector);
        }
        let kind = *kind;
        let ns = *ns;
        crate::vm::restartable_watch(kind.api(&cluster.client, ns), params, version.clone())
            .map(move |event| match event {
                Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => Ok(Some(Change::Changed(
                    i,
                    serde_json::to_value(o).unwrap_or_default(),
                ))),
                Ok(WatchEvent::Deleted(o)) => Ok(Some(Change::Deleted(
                    i,
                    serde_json::to_value(o).unwrap_or_default(),
                ))),
                Ok(WatchEvent::Bookmark(_)) => Ok(None),
                Ok(WatchEvent::Error(status)) if status.code == 410 => Ok(Some(Change::Expired)),
                Ok(WatchEvent::Error(status)) => Err(Error::from_status(
                    status.code,
                    &status.reason,
                    &status.message,
                    &kind.action("watch", ns),
                    &cluster.server,
                )),
                Err(kube::Error::Api(s)) if s.code == 410 => Ok(Some(Change::Expired)),
                Err(e) => Err(cluster.error(e, &kind.action("watch", ns))),
            })
            .filter_map(|r| async move { r.transpose() })
            .boxed()
    });
    futures::stream::select_all(streams).boxed()
}

/// One object, or None when it does not exist.
pub(crate) async fn get_opt(
    cluster: &Cluster,
    kind: &Kind,
    ns: &str,
    name: &str,
) -> Result<Option<Value>> {
    kind.api(&cluster.client, Some(ns))
        .get_opt(name)
        .await
        .map(|o| o.map(|o| serde_json::to_value(o).unwrap_or_default()))
        .map_err(|e| cluster.error(e, &kind.action("get", Some(ns)).named(name)))
}

/// Create `obj` with create semantics (an existing object of that name is left alone).
pub(crate) async fn create_obj(
    cluster: &Cluster,
    kind: &Kind,
    ns: &str,
    obj: &Value,
    dry_run: DryRun,
) -> Result<Value> {
    if dry_run == DryRun::Client {
        return Ok(obj.clone());
    }
    let name = text(obj, "/metadata/name").to_owned();
    let dynamic: kube::api::DynamicObject =
        serde_json::from_value(obj.clone()).map_err(|e| Error::Internal(e.to_string()))?;
    let params = kube::api::PostParams {
        dry_run: dry_run == DryRun::Server,
        field_manager: Some(crate::names::FIELD_MANAGER.into()),
    };
    kind.api(&cluster.client, Some(ns))
        .create(&params, &dynamic)
        .await
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists" => {
                Error::NotOurs(format!(
                    "{} {name:?} already exists{}; it is left as it is (nothing was changed)",
                    kind.kind,
                    if kind.namespaced {
                        format!(" in namespace {ns:?}")
                    } else {
                        String::new()
                    }
                ))
            }
            e => cluster.error(e, &kind.action("create", Some(ns)).named(&name)),
        })
}

/// Delete `obj` of `kind` with its uid as a precondition (a newer object of the same name is
/// never deleted).
pub(crate) async fn delete_obj(
    cluster: &Cluster,
    kind: &Kind,
    obj: &Value,
    dry_run: DryRun,
) -> Result<()> {
    if dry_run == DryRun::Client {
        return Ok(());
    }
    let ns = text(obj, "/metadata/namespace");
    let name = text(obj, "/metadata/name");
    let params = kube::api::DeleteParams {
        dry_run: dry_run == DryRun::Server,
        preconditions: Some(Preconditions {
            uid: Some(text(obj, "/metadata/uid").to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match kind
        .api(&cluster.client, Some(ns).filter(|n| !n.is_empty()))
        .delete(name, &params)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(cluster.error(e, &kind.action("delete", Some(ns)).named(name))),
    }
}

/// Run `work` within the timeout.
pub(crate) async fn bounded<T>(
    timeout: Duration,
    work: impl Future<Output = Result<T>>,
    what: &str,
) -> Result<T> {
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(format!(
            "{what} (after {}s; raise --timeout, or pass --no-wait)",
            timeout.as_secs()
        ))),
    }
}

/// The labels every object kubectl-vm makes for an image carries.
pub(crate) fn labels() -> Value {
    serde_json::json!({ MANAGED_BY_LABEL: MANAGED_BY })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_bad_ones_are_usage_errors() {
        assert_eq!(
            ImageName::parse("ds/os-images/fedora").unwrap(),
            ImageName {
                kind: Some(ImageKind::Ds),
                namespace: Some("os-images".into()),
                name: "fedora".into()
            }
        );
        assert_eq!(ImageName::parse("debian").unwrap().kind, None);
        assert_eq!(
            ImageName::parse("cvi/ubuntu").unwrap().kind,
            Some(ImageKind::Cvi)
        );
        for bad in ["cvi/ns/x", "xx/name", "vi/Bad_Name", "a/b/c/d", "vi/"] {
            assert!(
                matches!(ImageName::parse(bad), Err(Error::Usage(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn checksums_take_the_algorithms_and_lengths_the_platforms_take() {
        // The digest of nothing, as `sha256sum` and `md5sum` print it.
        let sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(parse_checksum(&format!("sha256:{sha}")).unwrap().hex, sha);
        assert!(parse_checksum("md5:d41d8cd98f00b204e9800998ecf8427e").is_ok());
        for bad in [
            "sha256:abc",
            "sha256",
            "crc32:00000000",
            &format!("sha256:{}", "g".repeat(64)),
        ] {
            assert!(matches!(parse_checksum(bad), Err(Error::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn urls_need_a_scheme_and_a_host() {
        for good in [
            "https://cloud.debian.org/images/debian-12.qcow2",
            "http://127.0.0.1:8080/x.img",
            "http://[::1]:80/x",
        ] {
            assert!(check_url(good).is_ok(), "{good}");
        }
        for bad in [
            "ftp://host/x",
            "https:///x",
            "cloud.debian.org/x",
            "http://host:99999/x",
            "http://host/a b",
        ] {
            assert!(matches!(check_url(bad), Err(Error::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn the_phase_cell_carries_progress_while_importing() {
        let mut image = Image {
            kind: ImageKind::Vi,
            name: "x".into(),
            namespace: "ns".into(),
            source: String::new(),
            format: String::new(),
            size: String::new(),
            phase: "Provisioning".into(),
            progress: "45%".into(),
            ready: false,
            message: String::new(),
            target: String::new(),
            created: String::new(),
            ours: true,
            object: Value::Null,
        };
        assert_eq!(image.phase_cell(), "Provisioning 45%");
        image.ready = true;
        image.phase = "Ready".into();
        assert_eq!(image.phase_cell(), "Ready");
    }
}
