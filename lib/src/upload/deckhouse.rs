//! Deckhouse virtualization: VirtualImage, ClusterVirtualImage or VirtualDisk with
//! `spec.dataSource.type: Upload`.
//!
//! Facts (deckhouse/virtualization `crds/{virtualimages,clustervirtualimages,virtualdisks}.yaml`,
//! `images/virtualization-artifact/pkg/controller/{vi,cvi,vd}/internal/source/upload.go`,
//! `pkg/controller/uploader/uploader_{ingress,service}.go`,
//! `images/dvcr-artifact/pkg/uploader/uploader.go`, `pkg/registry/checksum.go`):
//! - the object waits in `Pending`/`Provisioning`, then `WaitForUserUpload` with
//!   `status.imageUploadURLs {external, inCluster}`; `Provisioning` once data arrives, then
//!   `Ready`, or `Failed` with the `Ready` condition's message;
//! - `external` is `https://<ingress host>/upload/<secret>` (the path is the credential; the
//!   certificate is the cluster ingress's, checked like `curl -T` does: system CAs);
//!   `inCluster` is `http://<uploader Service IP>/upload`, a ClusterIP Service in front of
//!   the uploader pod's port 8444 (in the object's namespace; `d8-virtualization` for a
//!   ClusterVirtualImage);
//! - the uploader takes one `POST`/`PUT` of the file and answers once it is processed (500
//!   when processing fails); `spec.dataSource.upload.checksum` is checked over the bytes
//!   received, a mismatch fails the object with `sha256 sum mismatch: A != B`.
//!
//! The sha256 is computed in a streaming pass before the object is created so the platform
//! can check it; the sending pass computes it again, and a difference (the file changed)
//! fails the run.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use sha2::Digest;
use tokio::sync::watch;

use super::{Event, MANAGED_BY, Plan, Target, transfer};
use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};
use crate::export::http::{Credentials, HttpClient, HttpError, Route};
use crate::export::route::{self, PodSelector};

/// Group of the upload targets.
pub const GROUP: &str = "virtualization.deckhouse.io";
/// Their version.
pub const VERSION: &str = "v1alpha2";
/// Where a ClusterVirtualImage's uploader runs.
pub const CVI_UPLOADER_NAMESPACE: &str = "d8-virtualization";
/// Who answers uploads, in messages.
const PEER: &str = "the uploader";
const POLL: Duration = Duration::from_millis(500);
/// How long an uploader's 500 waits for the object to fail before the upload is retried.
const VERDICT_WAIT: Duration = Duration::from_secs(10);
/// How often the checksum pre-pass reports progress.
const HASH_PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// Kind, plural and scope of a Deckhouse target.
fn kind_of(target: &Target) -> (&'static str, &'static str, bool) {
    match target {
        Target::Vi(_) => ("VirtualImage", "virtualimages", true),
        Target::Cvi(_) => ("ClusterVirtualImage", "clustervirtualimages", false),
        _ => ("VirtualDisk", "virtualdisks", true),
    }
}

/// `kind.group/NAME`, as `-o name` prints it.
pub fn resource_name(target: &Target) -> String {
    let (kind, _, _) = kind_of(target);
    format!("{}.{GROUP}/{}", kind.to_ascii_lowercase(), target.name())
}

fn api(cluster: &Cluster, plan: &Plan) -> Api<DynamicObject> {
    let (kind, plural, namespaced) = kind_of(&plan.options.target);
    let resource = ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.into(),
        plural: plural.into(),
    };
    if namespaced {
        Api::namespaced_with(cluster.client.clone(), &plan.options.namespace, &resource)
    } else {
        Api::all_with(cluster.client.clone(), &resource)
    }
}

fn action(verb: &'static str, plan: &Plan) -> Action {
    let (kind, plural, namespaced) = kind_of(&plan.options.target);
    let action = Action::new(verb, format!("{plural}.{GROUP}"), kind.to_ascii_lowercase())
        .named(plan.options.target.name());
    if namespaced {
        action.in_namespace(Some(&plan.options.namespace))
    } else {
        action
    }
}

/// The object this run creates, with the file's sha256 for the platform to check.
pub fn object(plan: &Plan, sha256: &str) -> Value {
    let o = &plan.options;
    let (kind, _, namespaced) = kind_of(&o.target);
    let mut metadata = json!({"name": o.target.name(), "labels": {MANAGED_BY.0: MANAGED_BY.1}});
    if namespaced {
        metadata["namespace"] = json!(o.namespace);
    }
    let data_source = json!({"type": "Upload", "upload": {"checksum": {"sha256": sha256}}});
    let spec = match &o.target {
        Target::Vd(_) => {
            let mut pvc = json!({});
            if let Some(size) = plan.size {
                pvc["size"] = json!(size.to_string());
            }
            if let Some(class) = &o.storage_class {
                pvc["storageClassName"] = json!(class);
            }
            json!({"persistentVolumeClaim": pvc, "dataSource": data_source})
        }
        Target::Vi(_) if o.image_on_pvc => {
            let mut spec = json!({"storage": "PersistentVolumeClaim", "dataSource": data_source});
            if let Some(class) = &o.storage_class {
                spec["persistentVolumeClaim"] = json!({"storageClassName": class});
            }
            spec
        }
        Target::Vi(_) => json!({"storage": "ContainerRegistry", "dataSource": data_source}),
        _ => json!({"dataSource": data_source}),
    };
    json!({"apiVersion": format!("{GROUP}/{VERSION}"), "kind": kind, "metadata": metadata, "spec": spec})
}

/// sha256 of `path`, read once in 1 MiB chunks on a thread of its own (constant memory),
/// with progress events.
pub async fn sha256_file(path: &Path, on_event: &mut (dyn FnMut(Event) + Send)) -> Result<String> {
    let unreadable =
        |e: std::io::Error| Error::Transfer(format!("cannot read {}: {e}", path.display()));
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let total = file.metadata().map_err(unreadable)?.len();
    on_event(Event::Hashing { total });
    let done = Arc::new(AtomicU64::new(0));
    let counter = done.clone();
    let work = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut hasher = sha2::Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = std::io::Read::read(&mut file, &mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            counter.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect())
    });
    tokio::pin!(work);
    let mut ticker = tokio::time::interval(HASH_PROGRESS_EVERY);
    let hex = loop {
        tokio::select! {
            r = &mut work => break r.map_err(|e| Error::Internal(e.to_string()))?.map_err(unreadable)?,
            _ = ticker.tick() => on_event(Event::Hashed { done: done.load(Ordering::Relaxed), total }),
        }
    };
    on_event(Event::Checksum {
        sha256: hex.clone(),
    });
    Ok(hex)
}

/// Runs the upload; deletes what it created on failure or interruption unless `keep`.
pub async fn run(
    cluster: &Cluster,
    plan: &Plan,
    interrupts: Option<watch::Receiver<usize>>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    let o = &plan.options;
    let (kind, _, _) = kind_of(&o.target);
    let name = o.target.name().to_string();
    let mut interrupted = interrupts;
    let interrupt = |rx: &mut Option<watch::Receiver<usize>>| {
        let rx = rx.clone();
        async move {
            match rx {
                Some(mut rx) => {
                    let _ = rx.changed().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
    };
    // The checksum first: the object carries it, so the platform checks what arrives.
    let expected = if o.no_create {
        None
    } else {
        let hashing = sha256_file(&o.file, on_event);
        tokio::select! {
            r = hashing => Some(r?),
            _ = interrupt(&mut interrupted) => return Err(Error::Transfer("interrupted".into())),
        }
    };
    let created = match &expected {
        Some(sha256) => {
            let uid = create(cluster, plan, sha256).await?;
            on_event(Event::Created {
                kind,
                name: name.clone(),
            });
            Some(uid)
        }
        None => None,
    };
    let result = tokio::select! {
        r = upload(cluster, plan, expected.as_deref(), on_event) => r,
        _ = interrupt(&mut interrupted) => Err(Error::Transfer("interrupted".into())),
    };
    if let Err(e) = result {
        if let Some(uid) = created {
            if o.keep {
                on_event(Event::Kept {
                    kind,
                    name: name.clone(),
                });
            } else {
                delete(cluster, plan, &uid).await?;
                on_event(Event::Deleted {
                    kind,
                    name: name.clone(),
                });
            }
        }
        return Err(e);
    }
    on_event(Event::Ready {
        target: o.target.display(),
    });
    Ok(())
}

async fn create(cluster: &Cluster, plan: &Plan, sha256: &str) -> Result<String> {
    let o = &plan.options;
    let obj: DynamicObject = serde_json::from_value(object(plan, sha256))
        .map_err(|e| Error::Internal(format!("building the upload target: {e}")))?;
    match api(cluster, plan)
        .create(&PostParams::default(), &obj)
        .await
    {
        Ok(created) => Ok(created.metadata.uid.unwrap_or_default()),
        Err(kube::Error::Api(s)) if s.code == 409 => Err(Error::NotOurs(format!(
            "{} already exists{}: upload into it with --no-create if it waits for an upload, or pick another name",
            o.target.display(),
            in_namespace(plan)
        ))),
        Err(e) => Err(cluster.error(e, &action("create", plan))),
    }
}

fn in_namespace(plan: &Plan) -> String {
    match plan.options.target {
        Target::Cvi(_) => String::new(),
        _ => format!(" in namespace {:?}", plan.options.namespace),
    }
}

async fn delete(cluster: &Cluster, plan: &Plan, uid: &str) -> Result<()> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api(cluster, plan)
        .delete(plan.options.target.name(), &params)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(cluster.error(e, &action("delete", plan))),
    }
}

async fn get(cluster: &Cluster, plan: &Plan) -> Result<Value> {
    let obj = api(cluster, plan)
        .get(plan.options.target.name())
        .await
        .map_err(|e| cluster.error(e, &action("get", plan)))?;
    serde_json::to_value(obj).map_err(|e| Error::Internal(e.to_string()))
}

fn phase(obj: &Value) -> &str {
    obj.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The platform's words for the object's state: the `Ready` condition's message or reason.
fn ready_message(obj: &Value) -> String {
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(String::from);
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| text(&c["message"]).or_else(|| text(&c["reason"])))
        .unwrap_or_else(|| match phase(obj) {
            "" => "the virtualization controller to pick it up".into(),
            p => format!("phase {p}"),
        })
}

/// The failure the object reports, if it failed.
fn failure(plan: &Plan, obj: &Value) -> Option<Error> {
    (phase(obj) == "Failed").then(|| {
        Error::Platform(format!(
            "{} failed: {}",
            plan.options.target.display(),
            ready_message(obj)
        ))
    })
}

/// Polls the object until `done`, failing with its message when it fails.
async fn wait(
    cluster: &Cluster,
    plan: &Plan,
    done: impl Fn(&Value) -> bool,
    what: &str,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<Value> {
    let target = plan.options.target.display();
    let work = async {
        let mut last = None;
        loop {
            let obj = get(cluster, plan).await?;
            if done(&obj) {
                return Ok(obj);
            }
            if let Some(e) = failure(plan, &obj) {
                return Err(e);
            }
            let message = ready_message(&obj);
            if last.as_ref() != Some(&message) {
                on_event(Event::Waiting {
                    message: format!("{target} {what} ({message})"),
                });
                last = Some(message);
            }
            tokio::time::sleep(POLL).await;
        }
    };
    match tokio::time::timeout(plan.options.wait_timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout(format!(
            "{target}{} {what}",
            in_namespace(plan)
        ))),
    }
}

fn upload_urls(obj: &Value) -> Option<(String, String)> {
    let url = |k: &str| {
        obj.pointer(&format!("/status/imageUploadURLs/{k}"))
            .and_then(Value::as_str)
            .filter(|u| !u.is_empty())
            .map(String::from)
    };
    (phase(obj) == "WaitForUserUpload").then_some(())?;
    Some((url("external").unwrap_or_default(), url("inCluster")?))
}

async fn upload(
    cluster: &Cluster,
    plan: &Plan,
    expected: Option<&str>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<()> {
    let o = &plan.options;
    let target = o.target.display();
    if o.no_create {
        let obj = get(cluster, plan).await?;
        if obj.pointer("/spec/dataSource/type").and_then(Value::as_str) != Some("Upload") {
            return Err(Error::Platform(format!(
                "{target} does not take uploads (its dataSource.type is not Upload)"
            )));
        }
        if !matches!(
            phase(&obj),
            "" | "Pending" | "Provisioning" | "WaitForUserUpload"
        ) || (phase(&obj) == "Provisioning" && obj.pointer("/status/imageUploadURLs").is_some())
        {
            return Err(Error::Platform(format!(
                "{target} is not waiting for an upload (phase {})",
                phase(&obj)
            )));
        }
    }
    let obj = wait(
        cluster,
        plan,
        |obj| upload_urls(obj).is_some(),
        "to wait for the upload",
        on_event,
    )
    .await?;
    let (external, in_cluster) = upload_urls(&obj).unwrap_or_default();
    let (client, url) = uploader_client(cluster, plan, &external, &in_cluster, on_event).await?;
    let sending = transfer::Sending {
        peer: PEER,
        max_retries: o.max_retries,
        first_delay: o.retry_delay,
    };
    // A 500 is the uploader's verdict on what it received (a checksum or conversion failure).
    // The controller learns it from the uploader pod and fails the object a moment later, so
    // that wait comes before any retry; other errors (a cut connection) look once.
    let not_failed = |e: &HttpError| {
        let processing = matches!(e, HttpError::Status { code: 500, .. });
        async move {
            let deadline = tokio::time::Instant::now()
                + if processing {
                    VERDICT_WAIT
                } else {
                    Duration::ZERO
                };
            loop {
                if let Some(e) = failure(plan, &get(cluster, plan).await?) {
                    return Err(e);
                }
                if tokio::time::Instant::now() >= deadline {
                    return Ok(());
                }
                tokio::time::sleep(POLL).await;
            }
        }
    };
    let sent = transfer::send_file(&client, &url, &o.file, &sending, not_failed, on_event).await;
    let (_, sha256) = match sent {
        Ok(sent) => sent,
        Err(e) => {
            // The object's own reason beats the uploader's status code.
            return Err(
                match get(cluster, plan)
                    .await
                    .ok()
                    .and_then(|obj| failure(plan, &obj))
                {
                    Some(failed) => failed,
                    None => e,
                },
            );
        }
    };
    if let Some(expected) = expected
        && expected != sha256
    {
        return Err(Error::Transfer(format!(
            "{} changed while it was uploaded (sha256 {expected} before, {sha256} sent)",
            o.file.display()
        )));
    }
    wait(
        cluster,
        plan,
        |obj| phase(obj) == "Ready",
        "to be ready",
        on_event,
    )
    .await?;
    Ok(())
}

/// A client for the uploader: the external URL when it answers, else the in-cluster one
/// through a port-forward to the uploader pod.
async fn uploader_client(
    cluster: &Cluster,
    plan: &Plan,
    external: &str,
    in_cluster: &str,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<(HttpClient, String)> {
    let o = &plan.options;
    if !external.is_empty() {
        let client = HttpClient::with_system_roots(
            &cluster.config,
            "",
            o.insecure,
            Credentials::None,
            Route::Direct,
        )?;
        // Any answer means reachable (the uploader answers GET with 404); only a failure to
        // connect sends us through the API server.
        match client.send(http::Method::GET, external, &[]).await {
            Ok(_) | Err(HttpError::Status { .. }) => {
                on_event(Event::Route {
                    description: format!(
                        "uploading to the external upload URL {}",
                        redact(external)
                    ),
                });
                return Ok((client, external.to_string()));
            }
            Err(
                e @ HttpError::Connect {
                    retryable: false, ..
                },
            ) => {
                return Err(Error::Transfer(format!(
                    "the upload URL {}: {}",
                    redact(external),
                    transfer::describe(&e, PEER)
                )));
            }
            Err(e) => on_event(Event::Route {
                description: format!(
                    "the external upload URL {} is not reachable ({e})",
                    redact(external)
                ),
            }),
        }
    }
    let (route, pod, ns) = uploader_route(cluster, plan, in_cluster).await?;
    let client = HttpClient::new(&cluster.config, "", false, Credentials::None, route)?;
    on_event(Event::Route {
        description: format!(
            "uploading through the API server: {in_cluster} by a port-forward to the uploader pod {ns}/{pod}"
        ),
    });
    Ok((client, in_cluster.to_string()))
}

/// The URL without its secret path (`/upload/<secret>` → `/upload/…`).
fn redact(url: &str) -> String {
    match url.split_once("/upload/") {
        Some((base, _)) => format!("{base}/upload/…"),
        None => url.to_string(),
    }
}

/// The uploader pod behind the in-cluster URL's Service: the Service whose cluster IP the URL
/// names, its selector, and the target port of the URL's port.
async fn uploader_route(
    cluster: &Cluster,
    plan: &Plan,
    in_cluster: &str,
) -> Result<(Route, String, String)> {
    let unusable =
        |why: &str| Error::Transfer(format!("the in-cluster upload URL {in_cluster:?} {why}"));
    let uri: http::Uri = in_cluster.parse().map_err(|_| unusable("is unreadable"))?;
    let ip = uri
        .host()
        .unwrap_or_default()
        .trim_matches(['[', ']'])
        .to_string();
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    });
    let ns = match plan.options.target {
        Target::Cvi(_) => CVI_UPLOADER_NAMESPACE.to_string(),
        _ => plan.options.namespace.clone(),
    };
    let services: Api<Service> = Api::namespaced(cluster.client.clone(), &ns);
    let list = services.list(&ListParams::default()).await.map_err(|e| {
        cluster.error(
            e,
            &Action::new("list", "services", "service").in_namespace(Some(&ns)),
        )
    })?;
    let spec = list
        .items
        .into_iter()
        .filter_map(|s| s.spec)
        .find(|s| s.cluster_ip.as_deref() == Some(ip.as_str()))
        .ok_or_else(|| unusable(&format!("names no Service in namespace {ns}")))?;
    let selector = spec
        .selector
        .filter(|s| !s.is_empty())
        .ok_or_else(|| unusable("names a Service without a selector"))?;
    let mut labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    let target_port = spec
        .ports
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.port == i32::from(port))
        .map(|p| match p.target_port {
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => {
                u16::try_from(n).ok()
            }
            None => Some(port),
            // A named port would need the pod's container ports; the uploader's is numeric.
            Some(_) => None,
        })
        .ok_or_else(|| unusable(&format!("names a Service without port {port}")))?
        .ok_or_else(|| unusable("names a Service with a named target port"))?;
    let (route, pod) = route::port_forward(
        cluster,
        &ns,
        &PodSelector::Label(labels.join(",")),
        target_port,
    )
    .await?;
    Ok((route, pod, ns))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upload::UploadOptions;
    use crate::upload::format::{ImageFormat, ImageInfo};

    fn plan(target: Target, size: Option<u64>) -> Plan {
        Plan {
            options: UploadOptions {
                file: "disk.qcow2".into(),
                target,
                namespace: "ns".into(),
                size,
                force_raw: false,
                storage_class: Some("fast".into()),
                image_on_pvc: false,
                access_mode: None,
                volume_mode: None,
                no_create: false,
                keep: false,
                uploadproxy_url: None,
                insecure: false,
                wait_timeout: Duration::from_secs(1),
                max_retries: 0,
                retry_delay: Duration::from_secs(1),
            },
            info: ImageInfo {
                format: ImageFormat::Qcow2,
                file_size: 1 << 20,
                virtual_size: Some(1 << 20),
            },
            size,
        }
    }

    /// Field names and required fields from the CRDs (`crds/virtualdisks.yaml` etc.).
    #[test]
    fn objects_match_the_crds() {
        let sum = "ab".repeat(32);
        let vd = object(&plan(Target::Vd("d".into()), Some(1 << 30)), &sum);
        assert_eq!(vd["kind"], "VirtualDisk");
        assert_eq!(vd["metadata"]["namespace"], "ns");
        assert_eq!(vd["spec"]["persistentVolumeClaim"]["size"], "1073741824");
        assert_eq!(
            vd["spec"]["persistentVolumeClaim"]["storageClassName"],
            "fast"
        );
        assert_eq!(vd["spec"]["dataSource"]["type"], "Upload");
        assert_eq!(
            vd["spec"]["dataSource"]["upload"]["checksum"]["sha256"],
            sum
        );
        assert_eq!(vd["metadata"]["labels"][MANAGED_BY.0], MANAGED_BY.1);
        let unsized_vd = object(&plan(Target::Vd("d".into()), None), &sum);
        assert!(
            unsized_vd["spec"]["persistentVolumeClaim"]
                .get("size")
                .is_none()
        );
        let vi = object(&plan(Target::Vi("i".into()), None), &sum);
        assert_eq!(vi["spec"]["storage"], "ContainerRegistry");
        let cvi = object(&plan(Target::Cvi("c".into()), None), &sum);
        assert_eq!(cvi["kind"], "ClusterVirtualImage");
        assert!(cvi["metadata"].get("namespace").is_none());
        assert_eq!(
            resource_name(&Target::Cvi("c".into())),
            "clustervirtualimage.virtualization.deckhouse.io/c"
        );
    }

    #[test]
    fn urls_are_taken_only_while_waiting_for_the_upload() {
        let waiting = json!({"status": {"phase": "WaitForUserUpload", "imageUploadURLs":
            {"external": "https://h/upload/s3cr3t", "inCluster": "http://10.0.0.1/upload"}}});
        assert_eq!(
            upload_urls(&waiting),
            Some((
                "https://h/upload/s3cr3t".into(),
                "http://10.0.0.1/upload".into()
            ))
        );
        let pending = json!({"status": {"phase": "Pending"}});
        assert_eq!(upload_urls(&pending), None);
        assert_eq!(redact("https://h/upload/s3cr3t"), "https://h/upload/…");
        let failed = json!({"status": {"phase": "Failed", "conditions": [{"type": "Ready",
            "status": "False", "reason": "ProvisioningFailed", "message": "sha256 sum mismatch: a != b"}]}});
        let p = plan(Target::Vi("i".into()), None);
        assert_eq!(
            failure(&p, &failed).unwrap().to_string(),
            "vi/i failed: sha256 sum mismatch: a != b"
        );
    }
}
