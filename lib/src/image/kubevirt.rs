//! KubeVirt: golden images are CDI DataSources (`cdi.kubevirt.io/v1beta1`, FACTS §6) naming the
//! PVC a DataVolume filled.
//!
//! - A DataSource's condition `Ready` is `True` (reason `Ready`) once the DataVolume behind its
//!   `spec.source.pvc` is `Succeeded`; otherwise `False` with that DataVolume's phase as the
//!   reason, or `NotFound` (CDI `pkg/controller/datasource-controller.go`).
//! - A DataVolume importing reports `status.phase` (`ImportScheduled`, `ImportInProgress`,
//!   `Succeeded`, …) and `status.progress` (`"45.00%"`); a failing importer is restarted again
//!   and again: the DataVolume stays `ImportInProgress` with `status.restartCount` growing and
//!   a `Running` condition `False`, reason `Error`, carrying the importer's error (CDI
//!   `import-controller.go` `updateDvStatusFromPod`).
//! - `http.checksum` is `ALGO:HEX` (CDI v1.65); a registry source's `url` needs `docker://`.

use std::collections::HashMap;

use futures::FutureExt;
use futures::future::{BoxFuture, LocalBoxFuture};
use serde_json::{Value, json};

use super::{
    Catalog, CreateRequest, DEFAULT_SIZE, Deleted, DryRun, Event, Image, ImageKind, ImageName,
    OnEvent, OnPage, Options, Outcome, Source, condition, create_obj, delete_obj, get_opt, is_ours,
    labels, namespace_of, pages, quantity_text, text,
};
use crate::api::{DATA_VOLUME, KUBEVIRT_VM, Kind};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::lifecycle::watch::{self, Watched};

/// CDI DataSource.
pub const DATA_SOURCE: Kind = Kind {
    group: "cdi.kubevirt.io",
    version: "v1beta1",
    kind: "DataSource",
    plural: "datasources",
    namespaced: true,
};

/// CDI's annotation asking a DataVolume's PVC to bind without waiting for a consumer.
pub const IMMEDIATE_BINDING: &str = "cdi.kubevirt.io/storage.bind.immediate.requested";

/// What CDI's and KubeVirt's webhooks say when the user may not clone from another namespace
/// (CDI `authorize.go`).
const NO_CLONE_PERMISSION: &str = "insufficient permissions in clone source namespace ";

/// A refusal to clone across namespaces, with the permission CDI wants said: `create` on
/// `datavolumes/source` (group `cdi.kubevirt.io`) in the source namespace. Other messages are
/// returned as they are.
pub fn with_clone_permission_hint(message: String) -> String {
    let Some(at) = message.find(NO_CLONE_PERMISSION) else {
        return message;
    };
    let ns: String = message[at + NO_CLONE_PERMISSION.len()..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    format!(
        "{message} (cloning from namespace {ns} needs `create` on `datavolumes/source` in API group cdi.kubevirt.io there: a Role with that rule in {ns}, bound to you or the namespace's service accounts)"
    )
}

/// The KubeVirt catalog.
pub struct KubeVirt;

/// What a row needs of a DataVolume.
#[derive(Debug, Clone, Default, PartialEq)]
struct DvInfo {
    phase: String,
    progress: String,
    source: String,
    size: String,
    error: String,
    restarts: i64,
}

fn dv_info(dv: &Value) -> DvInfo {
    let running = condition(dv, "Running");
    let error = running
        // `Error`: the importer exited and is restarted; `ChecksumError`: CDI gave up
        // (import-controller.go marks a checksum mismatch fatal, the DataVolume `Failed`).
        .filter(|c| {
            c["status"] == "False"
                && matches!(c["reason"].as_str(), Some("Error" | "ChecksumError"))
        })
        .map(|c| text(c, "/message").to_owned())
        .unwrap_or_default();
    DvInfo {
        phase: text(dv, "/status/phase").to_owned(),
        progress: text(dv, "/status/progress").to_owned(),
        source: dv_source(dv),
        size: quantity_text(
            dv.pointer("/spec/storage/resources/requests/storage")
                .or_else(|| dv.pointer("/spec/pvc/resources/requests/storage")),
        ),
        error,
        restarts: dv
            .pointer("/status/restartCount")
            .and_then(Value::as_i64)
            .unwrap_or(0),
    }
}

/// Where a DataVolume's data comes from, as the SOURCE column says it.
fn dv_source(dv: &Value) -> String {
    let ns = text(dv, "/metadata/namespace");
    if let Some(src) = dv.pointer("/spec/source") {
        if let Some(url) = src.pointer("/http/url").and_then(Value::as_str) {
            return url.to_owned();
        }
        if let Some(url) = src.pointer("/registry/url").and_then(Value::as_str) {
            return format!("registry {}", url.trim_start_matches("docker://"));
        }
        if let Some(pvc) = src.get("pvc") {
            let pns = pvc["namespace"].as_str().unwrap_or(ns);
            return format!("pvc/{pns}/{}", text(pvc, "/name"));
        }
        if let Some(s) = src.get("snapshot") {
            let sns = s["namespace"].as_str().unwrap_or(ns);
            return format!("snapshot/{sns}/{}", text(s, "/name"));
        }
        if src.get("upload").is_some() {
            return "upload".into();
        }
        if src.get("blank").is_some() {
            return "blank".into();
        }
    }
    if let Some(r) = dv.pointer("/spec/sourceRef") {
        let rns = r["namespace"].as_str().unwrap_or(ns);
        return format!("ds/{rns}/{}", text(r, "/name"));
    }
    String::new()
}

/// The PVC (or snapshot) a DataSource names: (kind, namespace, name).
fn ds_target(ds: &Value) -> Option<(&'static str, String, String)> {
    let ns = text(ds, "/metadata/namespace");
    for (key, kind) in [("pvc", "pvc"), ("snapshot", "snapshot")] {
        if let Some(t) = ds.pointer(&format!("/spec/source/{key}")) {
            let tns = t["namespace"]
                .as_str()
                .filter(|s| !s.is_empty())
                .unwrap_or(ns);
            return Some((kind, tns.to_owned(), text(t, "/name").to_owned()));
        }
    }
    None
}

/// A DataSource as a catalog row, with the DataVolume behind it when there is one.
fn summarize(ds: &Value, dv: Option<&DvInfo>, whole: bool) -> Image {
    let ready_cond = condition(ds, "Ready");
    let ready = ready_cond.is_some_and(|c| c["status"] == "True");
    let target = ds_target(ds);
    let (phase, progress, message) = match (ready, dv) {
        (true, _) => ("Ready".to_owned(), String::new(), String::new()),
        (false, Some(dv)) if !dv.phase.is_empty() => (
            dv.phase.clone(),
            if dv.phase.ends_with("InProgress") {
                dv.progress.clone()
            } else {
                String::new()
            },
            if dv.error.is_empty() || dv.restarts == 0 {
                dv.error.clone()
            } else {
                format!("{} (importer restarts: {})", dv.error, dv.restarts)
            },
        ),
        (false, _) => (
            ready_cond
                .map(|c| text(c, "/reason").to_owned())
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "Pending".into()),
            String::new(),
            ready_cond
                .map(|c| text(c, "/message").to_owned())
                .unwrap_or_default(),
        ),
    };
    Image {
        kind: ImageKind::Ds,
        name: text(ds, "/metadata/name").to_owned(),
        namespace: text(ds, "/metadata/namespace").to_owned(),
        source: dv
            .map(|d| d.source.clone())
            .filter(|s| !s.is_empty())
            .or_else(|| target.as_ref().map(|(k, ns, n)| format!("{k}/{ns}/{n}")))
            .unwrap_or_default(),
        // CDI writes disk images to a PVC as raw (contentType kubevirt converts qcow2 etc.).
        format: match &target {
            Some(("pvc", _, _)) => "raw".into(),
            _ => String::new(),
        },
        size: dv.map(|d| d.size.clone()).unwrap_or_default(),
        phase,
        progress,
        ready,
        message,
        target: target
            .map(|(k, ns, n)| format!("{k}/{ns}/{n}"))
            .unwrap_or_default(),
        created: text(ds, "/metadata/creationTimestamp").to_owned(),
        ours: is_ours(ds),
        object: if whole { ds.clone() } else { Value::Null },
    }
}

/// The schedules of the DataImportCrons in scope, by (namespace, name). A cluster whose CDI
/// does not serve them (or a user who may not list them) shows no schedules.
async fn schedules(
    cluster: &Cluster,
    namespace: Option<&str>,
) -> HashMap<(String, String), String> {
    let mut found = HashMap::new();
    let _ = pages(
        cluster,
        &super::schedule::DATA_IMPORT_CRON,
        namespace,
        None,
        |items| {
            for cron in &items {
                found.insert(key(cron), text(cron, "/spec/schedule").to_owned());
            }
            Ok(())
        },
    )
    .await;
    found
}

/// A DataSource a DataImportCron manages says so in SOURCE: `cron(SCHEDULE) SOURCE`.
fn with_schedule(mut image: Image, schedules: &HashMap<(String, String), String>) -> Image {
    let label = format!(
        "/metadata/labels/{}",
        super::schedule::CRON_LABEL.replace('/', "~1")
    );
    let cron = text(&image.object, &label).to_owned();
    if let Some(schedule) = schedules.get(&(image.namespace.clone(), cron)) {
        image.source = format!("cron({schedule}) {}", image.source);
    }
    image
}

/// The rows of the DataSources naming DataVolume `dv`, after it changed.
fn rows_behind(
    sources: &HashMap<(String, String), Value>,
    dvs: &HashMap<(String, String), DvInfo>,
    dv: &(String, String),
) -> Vec<Image> {
    sources
        .values()
        .filter(|ds| ds_target(ds).is_some_and(|(t, ns, n)| t == "pvc" && ns == dv.0 && n == dv.1))
        .map(|ds| summarize(ds, behind(ds, dvs), true))
        .collect()
}

/// The DataVolume behind a DataSource, from those read.
fn behind<'a>(ds: &Value, dvs: &'a HashMap<(String, String), DvInfo>) -> Option<&'a DvInfo> {
    ds_target(ds)
        .filter(|(k, _, _)| *k == "pvc")
        .and_then(|(_, ns, n)| dvs.get(&(ns, n)))
}

fn key(obj: &Value) -> (String, String) {
    (
        text(obj, "/metadata/namespace").to_owned(),
        text(obj, "/metadata/name").to_owned(),
    )
}

impl Catalog for KubeVirt {
    fn list<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: Option<&'a str>,
        selector: Option<&'a str>,
        on_page: &'a mut OnPage<'a>,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            // The DataVolumes behind the DataSources, kept small (a few strings each), read
            // page by page beside the first DataSource page.
            let mut dvs: HashMap<(String, String), DvInfo> = HashMap::new();
            pages(cluster, &DATA_VOLUME, namespace, None, |items| {
                for dv in &items {
                    dvs.insert(key(dv), dv_info(dv));
                }
                Ok(())
            })
            .await?;
            let schedules = schedules(cluster, namespace).await;
            pages(cluster, &DATA_SOURCE, namespace, selector, |items| {
                let rows = items
                    .iter()
                    .map(|ds| {
                        let dv = ds_target(ds)
                            .filter(|(k, _, _)| *k == "pvc")
                            .and_then(|(_, ns, n)| dvs.get(&(ns, n)));
                        with_schedule(summarize(ds, dv, true), &schedules)
                    })
                    .collect();
                on_page(rows)
            })
            .await
            .map(|_| ())
        }
        .boxed()
    }

    fn watch<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: Option<&'a str>,
        selector: Option<&'a str>,
        on_page: &'a mut OnPage<'a>,
    ) -> BoxFuture<'a, Result<()>> {
        async move {
            use futures::StreamExt;
            loop {
                // Rows join two kinds: the DataSources in scope are kept (whole) to be shown
                // again when the DataVolume behind one changes.
                let mut dvs: HashMap<(String, String), DvInfo> = HashMap::new();
                let dv_version = pages(cluster, &DATA_VOLUME, namespace, None, |items| {
                    for dv in &items {
                        dvs.insert(key(dv), dv_info(dv));
                    }
                    Ok(())
                })
                .await?;
                let mut sources: HashMap<(String, String), Value> = HashMap::new();
                let ds_version = pages(cluster, &DATA_SOURCE, namespace, selector, |items| {
                    let rows = items
                        .iter()
                        .map(|ds| summarize(ds, behind(ds, &dvs), true))
                        .collect();
                    for ds in items {
                        sources.insert(key(&ds), ds);
                    }
                    on_page(rows)
                })
                .await?;
                let kinds = [
                    (DATA_VOLUME, namespace, dv_version),
                    (DATA_SOURCE, namespace, ds_version),
                ];
                // The selector applies to DataSources only: DataVolumes are watched whole.
                let mut changes = futures::stream::select_all([
                    super::feeds(cluster, &kinds[..1], None),
                    super::feeds(cluster, &kinds[1..], selector)
                        .map(|c| {
                            c.map(|c| match c {
                                super::Change::Changed(_, o) => super::Change::Changed(1, o),
                                super::Change::Deleted(_, o) => super::Change::Deleted(1, o),
                                super::Change::Expired => super::Change::Expired,
                            })
                        })
                        .boxed(),
                ]);
                while let Some(change) = changes.next().await {
                    match change? {
                        super::Change::Changed(0, dv) => {
                            dvs.insert(key(&dv), dv_info(&dv));
                            on_page(rows_behind(&sources, &dvs, &key(&dv)))?;
                        }
                        super::Change::Deleted(0, dv) => {
                            dvs.remove(&key(&dv));
                            on_page(rows_behind(&sources, &dvs, &key(&dv)))?;
                        }
                        super::Change::Changed(_, ds) => {
                            on_page(vec![summarize(&ds, behind(&ds, &dvs), true)])?;
                            sources.insert(key(&ds), ds);
                        }
                        super::Change::Deleted(_, ds) => {
                            sources.remove(&key(&ds));
                            let mut gone = summarize(&ds, behind(&ds, &dvs), true);
                            gone.phase = "Deleted".into();
                            gone.progress.clear();
                            on_page(vec![gone])?;
                        }
                        super::Change::Expired => break,
                    }
                }
            }
        }
        .boxed()
    }

    fn get<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: &'a str,
        name: &'a ImageName,
    ) -> BoxFuture<'a, Result<Image>> {
        async move {
            not_deckhouse_kind(name)?;
            let ns = namespace_of(name, namespace);
            let ds = get_opt(cluster, &DATA_SOURCE, ns, &name.name)
                .await?
                .ok_or_else(|| Error::NotFound {
                    kind: "datasource".into(),
                    name: name.name.clone(),
                    namespace: Some(ns.to_owned()),
                })?;
            let dv = match ds_target(&ds) {
                Some(("pvc", tns, tname)) => get_opt(cluster, &DATA_VOLUME, &tns, &tname)
                    .await?
                    .map(|dv| dv_info(&dv)),
                _ => None,
            };
            Ok(summarize(&ds, dv.as_ref(), true))
        }
        .boxed()
    }

    fn create<'a>(
        &'a self,
        cluster: &'a Cluster,
        request: &'a CreateRequest,
        options: &'a Options,
        on_event: &'a OnEvent<'a>,
    ) -> LocalBoxFuture<'a, Result<Outcome>> {
        async move {
            if let Some(schedule) = &request.schedule {
                return scheduled(cluster, request, schedule, options, on_event).await;
            }
            let (dv, ds) = manifests(request)?;
            if matches!(request.source, Source::Upload { .. }) {
                return super::upload::kubevirt(cluster, request, ds, options, on_event).await;
            }
            let ns = &request.namespace;
            let made_dv = create_obj(cluster, &DATA_VOLUME, ns, &dv, options.dry_run)
                .await
                .map_err(|e| match e {
                    Error::Invalid(m) => Error::Invalid(with_clone_permission_hint(m)),
                    e => e,
                })?;
            on_event(Event::Created(format!("datavolume/{}", request.name)));
            let made_ds = match create_obj(cluster, &DATA_SOURCE, ns, &ds, options.dry_run).await {
                Ok(made) => made,
                Err(e) => {
                    // All or nothing: the DataVolume made above goes again.
                    let _ = delete_obj(cluster, &DATA_VOLUME, &made_dv, options.dry_run).await;
                    return Err(e);
                }
            };
            on_event(Event::Created(format!("datasource/{}", request.name)));
            let object_ref = DATA_SOURCE.object_ref(&request.name);
            if options.dry_run != DryRun::None || !options.wait {
                return Ok(Outcome {
                    image: summarize(&made_ds, Some(&dv_info(&made_dv)), true),
                    object_ref,
                    waited: false,
                });
            }
            let image = super::bounded(
                options.timeout,
                wait_ready(cluster, ns, &request.name, on_event),
                &format!("image {} to be imported", request.name),
            )
            .await?;
            Ok(Outcome {
                image,
                object_ref,
                waited: true,
            })
        }
        .boxed_local()
    }

    fn delete<'a>(
        &'a self,
        cluster: &'a Cluster,
        namespace: &'a str,
        name: &'a ImageName,
        options: &'a Options,
    ) -> BoxFuture<'a, Result<Deleted>> {
        async move {
            not_deckhouse_kind(name)?;
            let ns = namespace_of(name, namespace);
            let ds = get_opt(cluster, &DATA_SOURCE, ns, &name.name)
                .await?
                .ok_or_else(|| Error::NotFound {
                    kind: "datasource".into(),
                    name: name.name.clone(),
                    namespace: Some(ns.to_owned()),
                })?;
            // A DataSource CDI manages for a DataImportCron (`--schedule`) is ours through the
            // cron: deleting the image deletes the cron and what CDI made for it.
            let cron = match cron_of(cluster, ns, &ds).await? {
                Some(cron) if is_ours(&cron) => Some(cron),
                _ if is_ours(&ds) => None,
                _ => {
                    return Err(Error::NotOurs(format!(
                        "datasource {:?} in namespace {ns:?} was not made by kubectl vm; it is left as it is (nothing was deleted)",
                        name.name
                    )));
                }
            };
            let target = ds_target(&ds);
            let dv = match &target {
                Some(("pvc", tns, tname)) => get_opt(cluster, &DATA_VOLUME, tns, tname)
                    .await?
                    .filter(is_ours),
                _ => None,
            };
            let users = users(cluster, ns, &name.name, target.as_ref()).await?;
            if !users.creating.is_empty() {
                return Err(Error::Platform(format!(
                    "image ds/{ns}/{} is being used to create {}: it is not deleted (try again once they are ready)",
                    name.name,
                    users.creating.join(", ")
                )));
            }
            if let Some(cron) = &cron {
                let object_refs =
                    delete_cron(cluster, ns, cron, &ds, options.dry_run).await?;
                return Ok(Deleted {
                    object_refs,
                    referenced_by: users.referencing,
                });
            }
            delete_obj(cluster, &DATA_SOURCE, &ds, options.dry_run).await?;
            let mut object_refs = vec![DATA_SOURCE.object_ref(&name.name)];
            if let Some(dv) = &dv {
                delete_obj(cluster, &DATA_VOLUME, dv, options.dry_run).await?;
                object_refs.push(DATA_VOLUME.object_ref(text(dv, "/metadata/name")));
            }
            Ok(Deleted {
                object_refs,
                referenced_by: users.referencing,
            })
        }
        .boxed()
    }
}

/// The DataImportCron that manages `ds` (CDI labels it `cdi.kubevirt.io/dataImportCron: CRON`
/// and the cron names it in `spec.managedDataSource`), if any.
async fn cron_of(cluster: &Cluster, ns: &str, ds: &Value) -> Result<Option<Value>> {
    use super::schedule::{CRON_LABEL, DATA_IMPORT_CRON};
    let cron_name = text(
        ds,
        &format!("/metadata/labels/{}", CRON_LABEL.replace('/', "~1")),
    );
    if cron_name.is_empty() {
        return Ok(None);
    }
    let cron = get_opt(cluster, &DATA_IMPORT_CRON, ns, cron_name).await?;
    Ok(cron.filter(|c| text(c, "/spec/managedDataSource") == text(ds, "/metadata/name")))
}

/// Deletes our DataImportCron `cron` and what CDI made for it: the DataSource `ds` it manages
/// and its DataVolumes (labelled with the cron; their PVCs are theirs). CDI deletes those
/// itself only under `retentionPolicy: None` (`dataimportcron-controller.go` `cleanup`; unset
/// or `All` keeps them), so they are deleted here, each with its uid as a precondition.
async fn delete_cron(
    cluster: &Cluster,
    ns: &str,
    cron: &Value,
    ds: &Value,
    dry_run: DryRun,
) -> Result<Vec<String>> {
    use super::schedule::{CRON_LABEL, DATA_IMPORT_CRON};
    let cron_name = text(cron, "/metadata/name").to_owned();
    let mut dvs = vec![];
    super::pages(
        cluster,
        &DATA_VOLUME,
        Some(ns),
        Some(&format!("{CRON_LABEL}={cron_name}")),
        |items| {
            dvs.extend(items);
            Ok(())
        },
    )
    .await?;
    // The cron first, so no import starts meanwhile.
    delete_obj(cluster, &DATA_IMPORT_CRON, cron, dry_run).await?;
    let mut refs = vec![DATA_IMPORT_CRON.object_ref(&cron_name)];
    delete_obj(cluster, &DATA_SOURCE, ds, dry_run).await?;
    refs.push(DATA_SOURCE.object_ref(text(ds, "/metadata/name")));
    for dv in &dvs {
        delete_obj(cluster, &DATA_VOLUME, dv, dry_run).await?;
        refs.push(DATA_VOLUME.object_ref(text(dv, "/metadata/name")));
    }
    Ok(refs)
}

/// `--schedule`: a DataImportCron, then the wait for the DataSource it manages.
async fn scheduled(
    cluster: &Cluster,
    request: &CreateRequest,
    schedule: &str,
    options: &Options,
    on_event: &OnEvent<'_>,
) -> Result<Outcome> {
    use super::schedule::{DATA_IMPORT_CRON, manifest, wait_ready};
    if request.cluster || request.storage.is_some() {
        return Err(Error::Usage(
            "--cluster-wide and --storage are Deckhouse's; a DataImportCron lives in a namespace (-n)".into(),
        ));
    }
    let cron = manifest(request, schedule)?;
    let ns = &request.namespace;
    create_obj(cluster, &DATA_IMPORT_CRON, ns, &cron, options.dry_run).await?;
    on_event(Event::Created(format!("dataimportcron/{}", request.name)));
    let object_ref = DATA_IMPORT_CRON.object_ref(&request.name);
    if options.dry_run != DryRun::None || !options.wait {
        // CDI makes the DataSource: as it is now (or not yet).
        let ds = match options.dry_run {
            DryRun::None => get_opt(cluster, &DATA_SOURCE, ns, &request.name).await?,
            _ => None,
        }
        .unwrap_or_else(|| json!({"metadata": {"name": request.name, "namespace": ns}}));
        return Ok(Outcome {
            image: summarize(&ds, None, true),
            object_ref,
            waited: false,
        });
    }
    let image = super::bounded(
        options.timeout,
        wait_ready(cluster, ns, &request.name, on_event, |ds| {
            summarize(ds, None, true)
        }),
        &format!("image {} to be imported", request.name),
    )
    .await?;
    Ok(Outcome {
        image,
        object_ref,
        waited: true,
    })
}

/// Deckhouse kinds named on KubeVirt: a usage error.
fn not_deckhouse_kind(name: &ImageName) -> Result<()> {
    match name.kind {
        None | Some(ImageKind::Ds) => Ok(()),
        Some(k) => Err(Error::Usage(format!(
            "image {}/{}: on KubeVirt images are DataSources (ds/NAME or ds/NAMESPACE/NAME)",
            k.short(),
            name.name
        ))),
    }
}

/// The DataVolume and the DataSource naming it.
fn manifests(request: &CreateRequest) -> Result<(Value, Value)> {
    if request.cluster {
        return Err(Error::Usage(
            "--cluster-wide makes a Deckhouse ClusterVirtualImage; on KubeVirt a DataSource lives in a namespace (-n)".into(),
        ));
    }
    if request.storage.is_some() {
        return Err(Error::Usage(
            "--storage is Deckhouse's choice between DVCR and a PVC; on KubeVirt an image is always a PVC".into(),
        ));
    }
    let ns = &request.namespace;
    let mut spec = json!({});
    match &request.source {
        Source::Url { url, checksum } => {
            let mut http = json!({"url": url});
            if let Some(c) = checksum {
                if !c.algo.supported_by_cdi() {
                    return Err(Error::Usage(format!(
                        "--checksum {}: CDI verifies md5, sha1, sha256 and sha512 only",
                        c.algo.as_str()
                    )));
                }
                // CDI's `http.checksum` is `ALGO:HEX` (v1.65).
                http["checksum"] = json!(c.to_string());
            }
            spec["source"] = json!({"http": http});
        }
        Source::Registry(image) => {
            let url = if image.contains("://") {
                image.clone()
            } else {
                format!("docker://{image}")
            };
            spec["source"] = json!({"registry": {"url": url}});
        }
        // The upload path makes its own DataVolume (crate::upload::kubevirt::data_volume).
        Source::Upload { .. } => spec["source"] = json!({"upload": {}}),
        Source::From(from) => match from.kind {
            Some(ImageKind::Pvc) | None => {
                spec["source"] = json!({"pvc": {
                    "namespace": namespace_of(from, ns), "name": from.name}});
            }
            Some(ImageKind::Ds) => {
                spec["sourceRef"] = json!({"kind": "DataSource",
                    "namespace": namespace_of(from, ns), "name": from.name});
            }
            Some(k) => {
                return Err(Error::Usage(format!(
                    "--from {}/{}: on KubeVirt an image is made from pvc/[NAMESPACE/]NAME or ds/[NAMESPACE/]NAME",
                    k.short(),
                    from.name
                )));
            }
        },
    }
    let clone = matches!(request.source, Source::From(_));
    let mut storage = json!({});
    match (&request.size, clone) {
        (Some(size), _) => storage["resources"] = json!({"requests": {"storage": size}}),
        // CDI sizes a clone from its source; an import needs a size.
        (None, true) => {}
        (None, false) => {
            storage["resources"] = json!({"requests": {"storage": DEFAULT_SIZE}});
        }
    }
    if let Some(class) = &request.storage_class {
        storage["storageClassName"] = json!(class);
    }
    spec["storage"] = storage;
    // A golden image has no consumer: bound at once even on WaitForFirstConsumer storage,
    // as CDI's DataImportCron asks for its imports (AnnImmediateBinding).
    let dv = json!({
        "apiVersion": DATA_VOLUME.api_version(), "kind": DATA_VOLUME.kind,
        "metadata": {"name": request.name, "namespace": ns, "labels": labels(),
            "annotations": {IMMEDIATE_BINDING: "true"}},
        "spec": spec,
    });
    let ds = json!({
        "apiVersion": DATA_SOURCE.api_version(), "kind": DATA_SOURCE.kind,
        "metadata": {"name": request.name, "namespace": ns, "labels": labels()},
        "spec": {"source": {"pvc": {"namespace": ns, "name": request.name}}},
    });
    Ok((dv, ds))
}

/// A DataSource just made, as a catalog row, with the DataVolume made for it.
pub(crate) fn summarize_made(ds: &Value, dv: &Value) -> Image {
    summarize(ds, Some(&dv_info(dv)), true)
}

/// Wait until the DataSource is ready, reporting the DataVolume's phase and progress; a
/// DataVolume `Failed`, or whose importer keeps failing, ends the wait with CDI's reason.
pub(crate) async fn wait_ready(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    on_event: &OnEvent<'_>,
) -> Result<Image> {
    let mut last = (String::new(), String::new());
    watch::until(
        cluster,
        &[
            Watched::new(DATA_VOLUME, ns, name),
            Watched::new(DATA_SOURCE, ns, name),
        ],
        |objs| {
            let dv = objs[0].as_ref().map(dv_info);
            if let Some(dv) = &dv {
                let now = (dv.phase.clone(), dv.progress.clone());
                if now != last && !dv.phase.is_empty() {
                    on_event(Event::Progress {
                        phase: now.0.clone(),
                        progress: if dv.phase.ends_with("InProgress") {
                            now.1.clone()
                        } else {
                            String::new()
                        },
                    });
                    last = now;
                }
                if dv.phase == "Failed" {
                    return Some(Err(Error::Stuck(format!(
                        "the import of image {name} failed: {} (CDI does not retry it; `kubectl vm image delete {name}` removes it)",
                        if dv.error.is_empty() { "DataVolume Failed" } else { &dv.error },
                    ))));
                }
                if !dv.error.is_empty() && dv.restarts > 0 {
                    return Some(Err(Error::Stuck(format!(
                        "the import of image {name} fails: {} (CDI restarted the importer {} times and keeps retrying; `kubectl vm image delete {name}` gives up)",
                        dv.error, dv.restarts
                    ))));
                }
            }
            match (&objs[0], &objs[1]) {
                (None, _) => Some(Err(Error::Platform(format!(
                    "DataVolume {name:?} was deleted while importing"
                )))),
                (_, None) => Some(Err(Error::Platform(format!(
                    "DataSource {name:?} was deleted while importing"
                )))),
                (_, Some(ds)) if condition(ds, "Ready").is_some_and(|c| c["status"] == "True") => {
                    Some(Ok(summarize(ds, dv.as_ref(), true)))
                }
                _ => None,
            }
        },
    )
    .await
}

/// Who uses a DataSource: DataVolumes still being filled from it (a VM being created), and
/// VMs that name it or its PVC.
struct Users {
    creating: Vec<String>,
    referencing: Vec<String>,
}

async fn users(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    target: Option<&(&'static str, String, String)>,
) -> Result<Users> {
    let pvc = target
        .filter(|(k, _, _)| *k == "pvc")
        .map(|(_, n, p)| (n.clone(), p.clone()));
    let names_it = |obj_ns: &str, spec: &Value| -> bool {
        let by_ref = spec.get("sourceRef").is_some_and(|r| {
            r["kind"] == "DataSource"
                && r["name"] == name
                && r["namespace"].as_str().unwrap_or(obj_ns) == ns
        });
        let by_pvc = spec.pointer("/source/pvc").is_some_and(|p| {
            pvc.as_ref().is_some_and(|(pns, pname)| {
                p["name"] == pname.as_str() && p["namespace"].as_str().unwrap_or(obj_ns) == pns
            })
        });
        by_ref || by_pvc
    };
    // Everywhere if allowed (a DataSource can be used from other namespaces), else here.
    let scope = match DATA_VOLUME
        .api(&cluster.client, None)
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => None,
        Err(_) => Some(ns),
    };
    let mut creating = vec![];
    super::pages(cluster, &DATA_VOLUME, scope, None, |items| {
        for dv in &items {
            let dns = text(dv, "/metadata/namespace");
            if names_it(dns, &dv["spec"]) && text(dv, "/status/phase") != "Succeeded" {
                creating.push(format!("datavolume {}/{}", dns, text(dv, "/metadata/name")));
            }
        }
        Ok(())
    })
    .await?;
    let mut referencing = vec![];
    super::pages(cluster, &KUBEVIRT_VM, scope, None, |items| {
        for vm in &items {
            let vns = text(vm, "/metadata/namespace");
            let templates = vm
                .pointer("/spec/dataVolumeTemplates")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let by_template = templates.iter().any(|t| names_it(vns, &t["spec"]));
            let by_volume = pvc.as_ref().is_some_and(|(pns, pname)| {
                vns == pns
                    && vm
                        .pointer("/spec/template/spec/volumes")
                        .and_then(Value::as_array)
                        .is_some_and(|vols| {
                            vols.iter().any(|v| {
                                v.pointer("/persistentVolumeClaim/claimName") == Some(&json!(pname))
                                    || v.pointer("/dataVolume/name") == Some(&json!(pname))
                            })
                        })
            });
            if by_template || by_volume {
                referencing.push(format!("{}.{vns}", text(vm, "/metadata/name")));
            }
        }
        Ok(())
    })
    .await?;
    Ok(Users {
        creating,
        referencing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::Storage;

    fn request(source: Source) -> CreateRequest {
        CreateRequest {
            name: "fedora".into(),
            namespace: "images".into(),
            cluster: false,
            source,
            storage: None,
            size: None,
            storage_class: None,
            schedule: None,
            imports_to_keep: None,
        }
    }

    #[test]
    fn a_url_image_is_a_data_volume_and_the_data_source_naming_it() {
        let (dv, ds) = manifests(&request(Source::Url {
            url: "https://example.org/f.qcow2".into(),
            checksum: Some(
                crate::image::parse_checksum(&format!("sha256:{}", "ab".repeat(32))).unwrap(),
            ),
        }))
        .unwrap();
        assert_eq!(
            dv["spec"]["source"]["http"]["url"],
            "https://example.org/f.qcow2"
        );
        assert_eq!(
            dv["spec"]["source"]["http"]["checksum"],
            format!("sha256:{}", "ab".repeat(32))
        );
        assert_eq!(
            dv["spec"]["storage"]["resources"]["requests"]["storage"],
            "10Gi"
        );
        assert_eq!(
            ds["spec"]["source"]["pvc"],
            json!({"namespace": "images", "name": "fedora"})
        );
        assert_eq!(
            ds["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "kubectl-vm"
        );
        let (dv, _) = manifests(&request(Source::Registry(
            "quay.io/containerdisks/fedora:41".into(),
        )))
        .unwrap();
        assert_eq!(
            dv["spec"]["source"]["registry"]["url"],
            "docker://quay.io/containerdisks/fedora:41"
        );
        let (dv, _) = manifests(&request(Source::From(
            ImageName::parse("pvc/golden/f41").unwrap(),
        )))
        .unwrap();
        assert_eq!(
            dv["spec"]["source"]["pvc"],
            json!({"namespace": "golden", "name": "f41"})
        );
        assert!(dv["spec"]["storage"].get("resources").is_none());
        let streebog = crate::image::parse_checksum(&format!("streebog256:{}", "ab".repeat(32)));
        assert!(matches!(
            manifests(&request(Source::Url {
                url: "https://x/y".into(),
                checksum: streebog.ok()
            })),
            Err(Error::Usage(_))
        ));
        let mut r = request(Source::Registry("x".into()));
        r.storage = Some(Storage::Pvc);
        assert!(matches!(manifests(&r), Err(Error::Usage(_))));
        assert!(matches!(
            manifests(&request(Source::From(ImageName::parse("vi/x").unwrap()))),
            Err(Error::Usage(_))
        ));
    }

    #[test]
    fn a_clone_refusal_says_which_permission_cdi_wants() {
        // The message of CDI's datavolume-validate webhook (authorize.go).
        let m = "admission webhook \"datavolume-validate.cdi.kubevirt.io\" denied the request:  User alice has insufficient permissions in clone source namespace golden";
        let hinted = with_clone_permission_hint(m.into());
        assert!(hinted.starts_with(m));
        assert!(hinted.contains("cloning from namespace golden needs `create` on `datavolumes/source` in API group cdi.kubevirt.io"), "{hinted}");
        assert_eq!(with_clone_permission_hint("other".into()), "other");
    }

    #[test]
    fn rows_show_the_data_volume_progress_and_the_importer_error() {
        let ds = json!({"metadata": {"name": "f", "namespace": "images", "creationTimestamp": "2026-12-05T08:00:00Z"},
            "spec": {"source": {"pvc": {"name": "f", "namespace": "images"}}},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "ImportInProgress",
                "message": "Import DataVolume phase ImportInProgress"}]}});
        let dv = json!({"metadata": {"name": "f", "namespace": "images"},
            "spec": {"source": {"http": {"url": "https://x/f.img"}}, "storage": {"resources": {"requests": {"storage": "2Gi"}}}},
            "status": {"phase": "ImportInProgress", "progress": "45.00%"}});
        let row = summarize(&ds, Some(&dv_info(&dv)), false);
        assert_eq!(row.phase_cell(), "ImportInProgress 45.00%");
        assert_eq!(row.source, "https://x/f.img");
        assert_eq!(row.size, "2Gi");
        assert_eq!(row.target, "pvc/images/f");
        let mut failing = dv.clone();
        failing["status"]["restartCount"] = json!(2);
        failing["status"]["conditions"] = json!([{"type": "Running", "status": "False", "reason": "Error", "message": "no such host"}]);
        assert_eq!(
            summarize(&ds, Some(&dv_info(&failing)), false).message,
            "no such host (importer restarts: 2)"
        );
        let mut ready = ds.clone();
        ready["status"]["conditions"][0] =
            json!({"type": "Ready", "status": "True", "reason": "Ready"});
        let row = summarize(&ready, Some(&dv_info(&dv)), false);
        assert!(row.ready);
        assert_eq!(row.phase_cell(), "Ready");
    }
}
