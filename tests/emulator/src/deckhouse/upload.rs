//! Deckhouse virtualization uploads: VirtualImage, ClusterVirtualImage and VirtualDisk with
//! `spec.dataSource.type: Upload`.
//!
//! Upstream facts (deckhouse/virtualization):
//! - `images/virtualization-artifact/pkg/controller/{vi,cvi,vd}/.../source/upload*.go`: the
//!   object waits in `Pending`/`Provisioning` until its uploader pod, Service and Ingress are
//!   ready, then `WaitForUserUpload` (condition Ready=False, reason `WaitForUserUpload`,
//!   "Waiting for the user upload.") with `status.imageUploadURLs {external, inCluster}`; once
//!   the upload has started `Provisioning`, then `Ready`; a failed import is `Failed`.
//! - `pkg/controller/uploader/uploader_ingress.go`: the external URL is
//!   `https://<host>/upload/<32 alphanumerics>` (the path is the secret), rewritten to
//!   `/upload` on the uploader Service, `proxy-body-size: 0`.
//! - `pkg/controller/uploader/uploader_service.go`: a ClusterIP Service in front of the
//!   uploader pod's port 8444; the in-cluster URL is plain HTTP to that Service.
//! - `images/dvcr-artifact/pkg/uploader/uploader.go`: `POST` or `PUT /upload` (anything else
//!   404), one upload at a time (a concurrent one is 503), the body processed as CDI's upload
//!   data source does; a processing error answers 500.
//! - `images/dvcr-artifact/pkg/registry/checksum.go`, `pkg/errors/errors.go`: every checksum of
//!   `spec.dataSource.upload.checksum` is computed over the bytes received, before conversion;
//!   a mismatch fails the import with reason `BadImageChecksum` and the message
//!   `<algorithm> sum mismatch: <expected> != <actual>`.
//!
//! The emulator converts what it receives to a raw disk as it does for CDI
//! ([`crate::kubevirt::upload::process`]); for a VirtualDisk the result is its PVC's data, so an export
//! of the disk returns the converted bytes. The uploader pod's port 8444 is reachable through
//! `pods/portforward` (plain HTTP, as upstream serves it without TLS key).
//!
//! Fault switches ([`crate::kubevirt::upload::UploadFaults`]): `cut_after` cuts an uploader connection
//! as a broken network does (the uploader takes the next try, as the restarted pod would);
//! `flip_byte_at` damages the received bytes so the checksum check fails.

use crate::core::app::App;
use crate::core::controllers::set_condition;
use crate::core::store::Key;
use crate::core::util::meta_str;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

const DH: &str = "virtualization.deckhouse.io";
/// The uploader pod's upload port.
pub const UPLOADER_PORT: u16 = 8444;
/// Label naming the object an uploader pod serves (`<plural>/<ns>/<name>`, `/` as `.`).
const TARGET_LABEL: &str = "virtualization.deckhouse.io/upload-target-uid";
/// Namespace of a ClusterVirtualImage's uploader.
const CVI_NAMESPACE: &str = "d8-virtualization";

/// An object taking an upload.
#[derive(Debug, Clone)]
struct Slot {
    plural: &'static str,
    ns: String,
    name: String,
    uid: String,
    /// An upload is running or done.
    started: bool,
    /// How processing ended (`Err` is the uploader's message).
    result: Option<Result<(), String>>,
}

/// The uploader side's state.
#[derive(Default)]
pub struct DhUploads {
    /// `https://127.0.0.1:PORT` of the "ingress".
    base_url: Mutex<String>,
    /// Its CA (tests trust it explicitly, as a cluster's ingress certificate is trusted).
    ca_pem: Mutex<String>,
    tls: OnceLock<Arc<rustls::ServerConfig>>,
    /// By object uid.
    slots: Mutex<HashMap<String, Slot>>,
    /// External secret path → object uid.
    paths: Mutex<HashMap<String, String>>,
}

impl DhUploads {
    fn slot(&self, uid: &str) -> Option<Slot> {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }
    fn update(&self, uid: &str, f: impl FnOnce(&mut Slot)) {
        if let Some(s) = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(uid)
        {
            f(s);
        }
    }
}

/// Binds the external endpoint where Deckhouse virtualization is served.
pub async fn start(
    app: Arc<App>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> Result<(), crate::EmulatorError> {
    if app.registry.find_plural(DH, "virtualimages").is_none() {
        return Ok(());
    }
    let certs =
        crate::core::tls::generate_for(&["127.0.0.1", "localhost"], "virtualization-ingress")
            .map_err(crate::EmulatorError::Tls)?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    let state = &app.uploads.deckhouse;
    *state.base_url.lock().unwrap_or_else(|e| e.into_inner()) = format!("https://127.0.0.1:{port}");
    *state.ca_pem.lock().unwrap_or_else(|e| e.into_inner()) = certs.ca_pem.clone();
    let mut tls = (*certs.server_config).clone();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let _ = state.tls.set(Arc::new(tls));
    tasks.spawn(serve(listener, app.clone(), shutdown));
    Ok(())
}

async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let app = app.clone();
                conns.spawn(async move {
                    let Some(tls) = app.uploads.deckhouse.tls.get().cloned() else { return };
                    let tcp = crate::kubevirt::upload_server::Cut::new(tcp, app.clone());
                    let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(tcp).await else {
                        return;
                    };
                    serve_http(app, stream, None).await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Serves HTTP on `stream`: the external endpoint (`target` None: the path names the
/// object) or an uploader pod's port (`target` its object's uid, path `/upload`).
async fn serve_http<S>(app: Arc<App>, stream: S, target: Option<String>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let router = axum::Router::new()
        .fallback(handle)
        .with_state((app, target));
    let service = hyper_util::service::TowerToHyperService::new(router);
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let _ = builder
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// Whether `pod` is an uploader and `port` its upload port; the uid of its object.
pub fn uploader_target(pod: &Value, port: u16) -> Option<String> {
    if port != UPLOADER_PORT {
        return None;
    }
    pod.pointer("/metadata/labels")
        .and_then(|l| l.get(TARGET_LABEL))
        .and_then(Value::as_str)
        .map(String::from)
}

/// Serves a port-forward stream to an uploader pod.
pub async fn serve_pod_stream<S>(app: Arc<App>, stream: S, uid: String)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let stream = crate::kubevirt::upload_server::Cut::new(stream, app.clone());
    serve_http(app, stream, Some(uid)).await
}

fn plain(status: StatusCode, text: &str) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(if text.is_empty() {
            String::new()
        } else {
            format!("{text}\n")
        }))
        .expect("response")
}

async fn handle(State((app, target)): State<(Arc<App>, Option<String>)>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let uid = match &target {
        Some(uid) if path == "/upload" => Some(uid.clone()),
        Some(_) => None,
        None => path.strip_prefix("/upload/").and_then(|secret| {
            app.uploads
                .deckhouse
                .paths
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(secret)
                .cloned()
        }),
    };
    // nginx answers an unknown path 404; so does the uploader (and for a wrong method).
    let Some(slot) = uid.and_then(|u| app.uploads.deckhouse.slot(&u)) else {
        return plain(StatusCode::NOT_FOUND, "404 page not found");
    };
    if req.method() != Method::POST && req.method() != Method::PUT {
        return plain(StatusCode::NOT_FOUND, "");
    }
    if slot.started {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "");
    }
    app.uploads
        .deckhouse
        .update(&slot.uid, |s| s.started = true);
    let scratch = app.uploads.scratch_path(&slot.uid, "dh-received");
    if let Err(e) = crate::kubevirt::upload::receive_body(&app, req.into_body(), &scratch).await {
        // The uploader fails and the controller starts a new one: the next try is taken.
        app.uploads
            .deckhouse
            .update(&slot.uid, |s| s.started = false);
        let (code, text) = e.answer();
        return plain(code, text);
    }
    let flip = app
        .uploads
        .faults
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .flip_byte_at
        .take();
    if let Some(offset) = flip
        && let Err(e) = flip_byte(&scratch, offset)
    {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string());
    }
    let object = app.store.get(&key(&slot));
    let app2 = app.clone();
    let result = tokio::task::spawn_blocking(move || {
        let r = object
            .ok_or_else(|| "the object is gone".to_string())
            .and_then(|o| import(&app2, &o, &scratch));
        let _ = std::fs::remove_file(&scratch);
        r
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    app.uploads
        .deckhouse
        .update(&slot.uid, |s| s.result = Some(result.clone()));
    match result {
        Ok(()) => plain(StatusCode::OK, ""),
        Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, ""),
    }
}

/// Inverts the byte at `offset` of `path` (the fault switch [`crate::kubevirt::upload::UploadFaults::flip_byte_at`]).
fn flip_byte(path: &std::path::Path, offset: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let mut byte = [0u8; 1];
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(&mut byte)?;
    byte[0] = !byte[0];
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(&byte)
}

fn key(slot: &Slot) -> Key {
    Key::new(DH, slot.plural, &slot.ns, &slot.name)
}

/// Hex digest of `path` by a coreutils tool (`sha256sum` etc.).
fn digest(tool: &str, path: &std::path::Path) -> Result<String, String> {
    let out = Command::new(tool)
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run {tool}: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(String::from)
        .ok_or_else(|| format!("{tool} failed"))
}

/// Checks the checksums, then converts to raw: into the VirtualDisk's PVC data, or the
/// image's own store.
fn import(app: &App, obj: &Value, received: &std::path::Path) -> Result<(), String> {
    let sums = obj
        .pointer("/spec/dataSource/upload/checksum")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut algorithms: Vec<&String> = sums.keys().collect();
    algorithms.sort();
    for algorithm in algorithms {
        let tool = match algorithm.as_str() {
            "md5" => "md5sum",
            "sha1" => "sha1sum",
            "sha256" => "sha256sum",
            "sha512" => "sha512sum",
            // Streebog has no coreutils tool; the emulator does not check it.
            _ => continue,
        };
        let expected = sums[algorithm].as_str().unwrap_or("").to_ascii_lowercase();
        let actual = digest(tool, received)?;
        if actual != expected {
            return Err(format!("{algorithm} sum mismatch: {expected} != {actual}"));
        }
    }
    let uid = meta_str(obj, "uid");
    let out = app.uploads.scratch_path(uid, "dh-converted");
    // A disk's size, when given, bounds the image; otherwise the disk takes the image's size.
    let requested = obj
        .pointer("/spec/persistentVolumeClaim/size")
        .and_then(Value::as_str)
        .and_then(crate::kubevirt::export::parse_bytes)
        .unwrap_or(0);
    let bound = if requested > 0 { requested } else { u64::MAX };
    crate::kubevirt::upload::process(received, &out, bound)?;
    let size = std::fs::metadata(&out).map_err(|e| e.to_string())?.len();
    if obj["kind"] == "VirtualDisk" {
        let pvc_name = vd_pvc_name(obj);
        let capacity = requested.max(size);
        let class = obj
            .pointer("/spec/persistentVolumeClaim/storageClassName")
            .and_then(Value::as_str)
            .map(String::from);
        crate::core::controllers::ensure_pvc_for(app, obj, &pvc_name, &capacity.to_string(), class);
        let pvc = app
            .store
            .get(&Key::new(
                "",
                "persistentvolumeclaims",
                meta_str(obj, "namespace"),
                &pvc_name,
            ))
            .ok_or("the disk's PVC is gone")?;
        let pvc_uid = meta_str(&pvc, "uid").to_string();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&out)
            .map_err(|e| e.to_string())?;
        file.set_len(capacity).map_err(|e| e.to_string())?;
        std::fs::rename(&out, app.uploads.data_path(&pvc_uid)).map_err(|e| e.to_string())?;
        app.uploads.finish(&pvc_uid, Ok(()));
    } else {
        std::fs::rename(&out, app.uploads.data_path(uid)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The PVC of a VirtualDisk (as [`crate::core::controllers`] names it).
pub fn vd_pvc_name(vd: &Value) -> String {
    format!(
        "vd-{}-{}",
        meta_str(vd, "name"),
        meta_str(vd, "uid").get(..8).unwrap_or("00000000")
    )
}

/// Whether `obj` takes an upload.
pub fn is_upload(obj: &Value) -> bool {
    obj.pointer("/spec/dataSource/type").and_then(Value::as_str) == Some("Upload")
}

/// The controller side: `Pending` → (tick: uploader pod and Service made) `WaitForUserUpload`
/// with the URLs → (upload started) `Provisioning` → (processed) `Ready`, or `Failed` with
/// the uploader's message.
pub fn reconcile(app: &App, obj: &Value, plural: &'static str, tick: bool) {
    let phase = obj
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if matches!(phase, "Ready" | "Failed") {
        return;
    }
    let uid = meta_str(obj, "uid").to_string();
    let state = &app.uploads.deckhouse;
    let slot = state.slot(&uid);
    let obj_key = Key::of(DH, plural, obj);
    let set = |phase: &str, ready: bool, reason: &str, message: &str, urls: Option<Value>| {
        app.store.modify(&obj_key, |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["phase"] = json!(phase);
            if let Some(urls) = &urls {
                st["imageUploadURLs"] = urls.clone();
            }
            set_condition(&mut st, "Ready", ready, reason, message);
            st["observedGeneration"] = o["metadata"]["generation"].clone();
            o["status"] = st;
        });
    };
    match (phase, slot) {
        ("", _) => set("Pending", false, "ProvisioningNotStarted", "", None),
        ("Pending", None) if tick => {
            let ns = if plural == "clustervirtualimages" {
                app.ensure_namespace(CVI_NAMESPACE);
                CVI_NAMESPACE.to_string()
            } else {
                meta_str(obj, "namespace").to_string()
            };
            let prefix = match plural {
                "virtualdisks" => "vd",
                "virtualimages" => "vi",
                _ => "cvi",
            };
            let base = format!("d8v-{prefix}-uploader-{}", &uid[..uid.len().min(8)]);
            let cluster_ip = format!("10.96.{}.{}", uid_byte(&uid, 0), uid_byte(&uid, 1));
            // The uploader's objects are the object's (upstream service/uploader/uploader.go:
            // `metav1.NewControllerRef(obj, ...)`), so deleting it takes them along.
            let owner = crate::core::controllers::owner_ref(obj);
            let _ = app.store.create(
                "",
                "pods",
                json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": base, "namespace": ns,
                        "labels": {"app": "dvcr-uploader", "service": base, TARGET_LABEL: uid},
                        "ownerReferences": [owner.clone()]},
                    "spec": {"nodeName": crate::core::controllers::NODE, "containers": [{"name": "uploader",
                        "image": "registry.deckhouse.io/virtualization/dvcr-uploader",
                        "command": ["/usr/local/bin/dvcr-uploader"],
                        "ports": [{"name": "metrics", "containerPort": 8443, "protocol": "TCP"}]}]},
                    "status": {"phase": "Running", "podIP": format!("10.244.{}.{}", uid_byte(&uid, 2), uid_byte(&uid, 3)),
                        "containerStatuses": [{"name": "uploader", "ready": true, "restartCount": 0}]}}),
            );
            let _ = app.store.create(
                "",
                "services",
                json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": base, "namespace": ns, "ownerReferences": [owner]},
                    "spec": {"type": "ClusterIP", "clusterIP": cluster_ip, "selector": {"service": base},
                        "ports": [{"name": "uploader", "protocol": "TCP", "port": 80, "targetPort": UPLOADER_PORT}]}}),
            );
            let secret = crate::core::util::random_suffix(32);
            state
                .paths
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(secret.clone(), uid.clone());
            state
                .slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    uid.clone(),
                    Slot {
                        plural,
                        ns: meta_str(obj, "namespace").to_string(),
                        name: meta_str(obj, "name").to_string(),
                        uid: uid.clone(),
                        started: false,
                        result: None,
                    },
                );
            let base_url = state
                .base_url
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            let urls = json!({"external": format!("{base_url}/upload/{secret}"),
                "inCluster": format!("http://{cluster_ip}/upload")});
            set(
                "WaitForUserUpload",
                false,
                "WaitForUserUpload",
                "Waiting for the user upload.",
                Some(urls),
            );
        }
        (_, Some(slot)) => match (&slot.result, slot.started) {
            (Some(Ok(())), _) if tick => finish_ready(app, obj, plural),
            (Some(Err(message)), _) => {
                let message = message.clone();
                app.store.modify(&obj_key, |o| {
                    let mut st = o.get("status").cloned().unwrap_or(json!({}));
                    st["phase"] = json!("Failed");
                    set_condition(&mut st, "Ready", false, "ProvisioningFailed", &message);
                    o["status"] = st;
                });
            }
            (None, true) if phase == "WaitForUserUpload" => set(
                "Provisioning",
                false,
                "Provisioning",
                "Import is in the process of provisioning to DVCR.",
                None,
            ),
            // The uploader failed mid-upload (a cut connection) and its successor waits for
            // the next try: the phase follows the uploader, as it did before the first one.
            (None, false) if phase == "Provisioning" => set(
                "WaitForUserUpload",
                false,
                "WaitForUserUpload",
                "Waiting for the user upload.",
                None,
            ),
            _ => {}
        },
        _ => {}
    }
}

fn uid_byte(uid: &str, i: usize) -> u8 {
    let hex: String = uid.chars().filter(char::is_ascii_hexdigit).collect();
    u8::from_str_radix(hex.get(i * 2..i * 2 + 2).unwrap_or("07"), 16).unwrap_or(7) % 250 + 2
}

/// `Ready`: a VirtualDisk's capacity and PVC, an image's DVCR location and sizes.
fn finish_ready(app: &App, obj: &Value, plural: &'static str) {
    let uid = meta_str(obj, "uid");
    let obj_key = Key::of(DH, plural, obj);
    if plural == "virtualdisks" {
        let pvc_name = vd_pvc_name(obj);
        let size = crate::kubevirt::export::pvc_size(app, meta_str(obj, "namespace"), &pvc_name)
            .unwrap_or(0);
        app.store.modify(&obj_key, |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["phase"] = json!("Ready");
            st["progress"] = json!("100%");
            st["capacity"] = json!(size.to_string());
            st["target"] = json!({"persistentVolumeClaimName": pvc_name});
            st.as_object_mut().map(|m| m.remove("imageUploadURLs"));
            set_condition(&mut st, "DatasourceReady", true, "DatasourceReady", "");
            set_condition(&mut st, "Ready", true, "Ready", "");
            o["status"] = st;
        });
        return;
    }
    let size = std::fs::metadata(app.uploads.data_path(uid))
        .map(|m| m.len())
        .unwrap_or(0);
    let target = crate::core::controllers::deckhouse::image_target(obj);
    app.store.modify(&obj_key, |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!("Ready");
        st["progress"] = json!("100%");
        st["format"] = json!("raw");
        st["cdrom"] = json!(false);
        st["size"] = json!({"unpacked": size.to_string(), "unpackedBytes": size.to_string(),
            "stored": size.to_string(), "storedBytes": size.to_string()});
        st["target"] = target.clone();
        st.as_object_mut().map(|m| m.remove("imageUploadURLs"));
        set_condition(&mut st, "Ready", true, "Ready", "");
        o["status"] = st;
    });
}

impl crate::Handle {
    /// Makes objects created from now on publish `base` (`https://HOST:PORT`) as their
    /// external upload URL's base: tests point it where nothing listens to force the
    /// in-cluster route.
    pub fn set_deckhouse_upload_base(&self, base: &str) {
        *self
            .app
            .uploads
            .deckhouse
            .base_url
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = base.to_string();
    }

    /// The converted data of an uploaded VirtualImage or ClusterVirtualImage (by uid), as
    /// DVCR would hold it.
    pub fn uploaded_image(&self, uid: &str) -> Option<std::path::PathBuf> {
        let path = self.app.uploads.data_path(uid);
        path.exists().then_some(path)
    }

    /// PEM of the CA of the Deckhouse upload endpoint's certificate.
    pub fn deckhouse_upload_ca_pem(&self) -> String {
        self.app
            .uploads
            .deckhouse
            .ca_pem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl crate::Handle {
    /// The converted data a Deckhouse upload left in PVC `ns/pvc` (a VirtualDisk's), if any.
    pub fn uploaded_data(&self, ns: &str, pvc: &str) -> Option<std::path::PathBuf> {
        crate::kubevirt::upload::uploaded_file(&self.app, ns, pvc)
    }
}
