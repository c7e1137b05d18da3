//! CDI uploads: `UploadTokenRequest`, DataVolumes with `source.upload`, and what the upload
//! server makes of the bytes it receives (the server itself is in `upload_server.rs`).
//!
//! Upstream facts (containerized-data-importer):
//! - `pkg/apiserver/apiserver.go`: `POST /apis/upload.cdi.kubevirt.io/v1beta1/namespaces/NS/
//!   uploadtokenrequests` with `spec.pvcName` answers `status.token`, a token naming that PVC
//!   (and namespace) that the upload proxy verifies; it is not stored.
//! - `pkg/uploadproxy/uploadproxy.go`: `POST /v1beta1/upload` (sync: answered once the data is
//!   processed) and `/v1beta1/upload-async` (answered once received), `Authorization: Bearer
//!   TOKEN`; a bad token is 401; the PVC the token names must exist and carry
//!   `cdi.kubevirt.io/storage.pod.ready: "true"` (its upload server runs), else 503.
//! - `pkg/controller/upload-controller.go`: a PVC annotated `cdi.kubevirt.io/storage.upload.target`
//!   gets an upload server pod `cdi-upload-<pvc>`; the DataVolume controller mirrors it as
//!   `UploadScheduled` → `UploadReady` → `Succeeded`.
//! - `pkg/importer/data-processor.go`: the received stream is decompressed (gz, xz), converted
//!   to raw with `qemu-img convert` (qcow2, vmdk, vhd, vhdx), refused when its virtual size is
//!   larger than the volume ("Virtual image size X is larger than the reported available
//!   storage Y. A larger PVC is required."), and resized to fill the volume.
//! - `pkg/controller/common/util.go` `AnnImmediateBinding`
//!   (`cdi.kubevirt.io/storage.bind.immediate.requested`): WaitForFirstConsumer storage binds
//!   without waiting for a consumer.

use crate::core::app::App;
use crate::core::controllers::set_condition;
use crate::core::store::Key;
use crate::core::util::meta_str;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

/// API group of UploadTokenRequest.
pub const UPLOAD_GROUP: &str = "upload.cdi.kubevirt.io";
/// Namespace the emulator runs CDI's upload proxy in.
pub const CDI_NAMESPACE: &str = "cdi";
/// The upload proxy's port in its pod.
pub const PROXY_POD_PORT: u16 = 8443;
/// Label of the upload proxy pods (`cdi.kubevirt.io: cdi-uploadproxy`).
pub const PROXY_LABEL: (&str, &str) = ("cdi.kubevirt.io", "cdi-uploadproxy");
/// CDI's immediate-binding annotation.
pub const IMMEDIATE_BIND: &str = "cdi.kubevirt.io/storage.bind.immediate.requested";
/// CDI's upload-target annotation on a PVC.
pub const UPLOAD_TARGET: &str = "cdi.kubevirt.io/storage.upload.target";
/// CDI's "upload server ready" annotation on a PVC.
pub const POD_READY: &str = "cdi.kubevirt.io/storage.pod.ready";

/// Test switches of the upload proxy.
#[derive(Debug, Clone, Default)]
pub struct UploadFaults {
    /// The first connection that carries this many bytes is cut there (one per entry, in
    /// order).
    pub cut_after: Vec<u64>,
    /// The next body a Deckhouse uploader receives has the byte at this offset inverted, as
    /// a damaging proxy or disk would, so the platform's checksum check fails (used up once).
    pub flip_byte_at: Option<u64>,
}

/// The upload proxy's state.
#[derive(Default)]
pub struct UploadState {
    /// `https://127.0.0.1:PORT`.
    pub base_url: Mutex<String>,
    /// PEM of the proxy's CA (ConfigMap `cdi-uploadproxy-signer-bundle`).
    pub ca_pem: Mutex<String>,
    /// The proxy's TLS configuration (set at start).
    pub server_config: std::sync::OnceLock<std::sync::Arc<rustls::ServerConfig>>,
    /// Issued tokens → `(namespace, pvc)`.
    tokens: Mutex<HashMap<String, (String, String)>>,
    /// Fault switches.
    pub faults: Mutex<UploadFaults>,
    /// Where volumes' data goes (by PVC uid).
    dir: std::sync::OnceLock<tempfile::TempDir>,
    /// Processing results by PVC uid (`Err` is CDI's message).
    results: Mutex<HashMap<String, Result<(), String>>>,
    /// Body bytes received, for tests.
    pub bytes_received: AtomicU64,
    /// Deckhouse virtualization's uploaders.
    pub deckhouse: crate::deckhouse::upload::DhUploads,
}

impl UploadState {
    fn dir(&self) -> &Path {
        self.dir
            .get_or_init(|| tempfile::tempdir().expect("a temporary directory"))
            .path()
    }

    /// The file holding the uploaded (converted) data of the PVC with `uid`.
    pub fn data_path(&self, uid: &str) -> PathBuf {
        self.dir().join(format!("{uid}.img"))
    }

    /// A scratch file for a transfer into the PVC with `uid`.
    pub fn scratch_path(&self, uid: &str, what: &str) -> PathBuf {
        self.dir().join(format!("{uid}.{what}"))
    }

    /// Records a new token for `ns/pvc`.
    pub fn issue(&self, ns: &str, pvc: &str) -> String {
        let token = format!(
            "cdi-upload.{}.{}",
            crate::core::util::random_suffix(16),
            crate::core::util::random_suffix(16)
        );
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.clone(), (ns.into(), pvc.into()));
        token
    }

    /// The PVC a token was issued for.
    pub fn token_target(&self, token: &str) -> Option<(String, String)> {
        self.tokens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()
    }

    /// Records how processing the upload into PVC `uid` ended.
    pub fn finish(&self, uid: &str, result: Result<(), String>) {
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.into(), result);
    }

    fn result(&self, uid: &str) -> Option<Result<(), String>> {
        self.results
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }
}

/// The uploaded data of PVC `ns/pvc`, if an upload into it succeeded.
pub fn uploaded_file(app: &App, ns: &str, pvc: &str) -> Option<PathBuf> {
    let obj = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, pvc))?;
    let uid = meta_str(&obj, "uid");
    matches!(app.uploads.result(uid), Some(Ok(()))).then(|| app.uploads.data_path(uid))
}

/// Answers an UploadTokenRequest (create-only, never stored).
pub fn token_request(
    app: &App,
    ns: &str,
    mut obj: Value,
) -> Result<Value, crate::core::status::ApiError> {
    let pvc = obj
        .pointer("/spec/pvcName")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
        .ok_or_else(|| {
            crate::core::status::ApiError::bad_request(
                "UploadTokenRequest: spec.pvcName is required",
            )
        })?
        .to_string();
    let token = app.uploads.issue(ns, &pvc);
    obj["status"] = json!({"token": token});
    Ok(obj)
}

/// DataVolume with `source.upload`: `PendingPopulation` while WaitForFirstConsumer storage has
/// no consumer (unless immediate binding is requested) → `UploadScheduled` (PVC and upload
/// server pod made) → `UploadReady` (the pod runs; the PVC is marked ready) → `Succeeded` once
/// the upload was processed.
pub fn data_volume(app: &App, dv: &Value, tick: bool, size: &str, class: Option<String>) {
    let ns = meta_str(dv, "namespace");
    let name = meta_str(dv, "name");
    let key = Key::of("cdi.kubevirt.io", "datavolumes", dv);
    let phase = dv
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    let set = |phase: &str, progress: &str, f: &dyn Fn(&mut Value)| {
        app.store.modify(&key, |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["phase"] = json!(phase);
            st["progress"] = json!(progress);
            f(&mut st);
            o["status"] = st;
        });
    };
    let immediate = dv
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(IMMEDIATE_BIND))
        .and_then(Value::as_str)
        == Some("true");
    match phase {
        "" | "PendingPopulation" => {
            if !immediate
                && crate::core::storage::waits_for_first_consumer(app, class.as_deref())
                && !crate::core::storage::kubevirt_consumer(app, dv)
            {
                if phase.is_empty() {
                    set("PendingPopulation", "N/A", &|st| {
                        set_condition(st, "Bound", false, "Pending", "PVC is pending");
                        set_condition(st, "Ready", false, "PendingPopulation", "");
                    });
                }
                return;
            }
            crate::core::controllers::ensure_pvc_for(app, dv, name, size, class);
            let pvc_key = Key::new("", "persistentvolumeclaims", ns, name);
            app.store.modify(&pvc_key, |p| {
                p["metadata"]["annotations"][UPLOAD_TARGET] = json!("");
            });
            ensure_upload_pod(app, dv);
            set("UploadScheduled", "N/A", &|st| {
                st["claimName"] = json!(name);
                set_condition(st, "Bound", true, "Bound", "PVC bound");
                set_condition(st, "Running", false, "Pending", "");
                set_condition(st, "Ready", false, "", "");
            });
        }
        "UploadScheduled" if tick => {
            let pvc_key = Key::new("", "persistentvolumeclaims", ns, name);
            app.store.modify(&pvc_key, |p| {
                p["metadata"]["annotations"][POD_READY] = json!("true");
                p["metadata"]["annotations"]["cdi.kubevirt.io/storage.pod.phase"] =
                    json!("Running");
            });
            set("UploadReady", "N/A", &|st| {
                set_condition(st, "Running", true, "Pod is running", "");
            });
        }
        "UploadReady" => {
            let Some(pvc) = app
                .store
                .get(&Key::new("", "persistentvolumeclaims", ns, name))
            else {
                return;
            };
            match app.uploads.result(meta_str(&pvc, "uid")) {
                Some(Ok(())) => {
                    let pvc_key = Key::of("", "persistentvolumeclaims", &pvc);
                    app.store.modify(&pvc_key, |p| {
                        p["metadata"]["annotations"][POD_READY] = json!("false");
                        p["metadata"]["annotations"]["cdi.kubevirt.io/storage.pod.phase"] =
                            json!("Succeeded");
                    });
                    let pod = Key::new("", "pods", ns, &upload_pod_name(name));
                    if app.store.get(&pod).is_some() {
                        app.store
                            .delete(&pod, crate::core::store::Propagation::Cascade);
                    }
                    set("Succeeded", "100.0%", &|st| {
                        set_condition(st, "Running", false, "Completed", "");
                        set_condition(st, "Ready", true, "", "");
                    });
                }
                Some(Err(message)) => {
                    let already = dv
                        .pointer("/status/conditions")
                        .and_then(Value::as_array)
                        .is_some_and(|c| {
                            c.iter()
                                .any(|c| c["type"] == "Running" && c["message"] == message)
                        });
                    if !already {
                        set("UploadReady", "N/A", &|st| {
                            set_condition(st, "Running", false, "Error", &message);
                        });
                    }
                }
                None => {}
            }
        }
        _ => {}
    }
}

/// `cdi-upload-<pvc>` (upload-controller.go `naming.GetResourceName("cdi-upload", pvc)`).
pub fn upload_pod_name(pvc: &str) -> String {
    let mut name = format!("cdi-upload-{pvc}");
    name.truncate(63);
    name
}

fn ensure_upload_pod(app: &App, dv: &Value) {
    let ns = meta_str(dv, "namespace");
    let pvc = meta_str(dv, "name");
    let name = upload_pod_name(pvc);
    if app.store.get(&Key::new("", "pods", ns, &name)).is_some() {
        return;
    }
    let owner_key = Key::of("cdi.kubevirt.io", "datavolumes", dv);
    crate::core::gc::create_dependent(
        app,
        &owner_key,
        dv,
        "",
        "pods",
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns,
                "labels": {"app": "containerized-data-importer", "cdi.kubevirt.io": "cdi-upload-server",
                    "cdi.kubevirt.io/uploadTarget": meta_str(dv, "uid")},
                "ownerReferences": [crate::core::controllers::owner_ref(dv)]},
            "spec": {"nodeName": crate::core::controllers::NODE, "containers": [{"name": "cdi-upload-server",
                "image": "quay.io/kubevirt/cdi-uploadserver:v1.66.0",
                "volumeMounts": [{"name": "cdi-data-vol", "mountPath": "/data"}]}],
                "volumes": [{"name": "cdi-data-vol", "persistentVolumeClaim": {"claimName": pvc}}]},
            "status": {"phase": "Running", "podIP": "10.244.0.77",
                "containerStatuses": [{"name": "cdi-upload-server", "ready": true, "restartCount": 0}]}}),
    );
}

/// Why the PVC `ns/pvc` does not take an upload now (the proxy's 503), if it does not.
pub fn not_ready(app: &App, ns: &str, pvc: &str) -> Option<(u16, String)> {
    let Some(obj) = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, pvc))
    else {
        return Some((
            400,
            format!("persistentvolumeclaims \"{pvc}\" not found in namespace {ns}"),
        ));
    };
    let annotations = obj.pointer("/metadata/annotations");
    let ann = |k: &str| annotations.and_then(|a| a.get(k)).and_then(Value::as_str);
    if ann(UPLOAD_TARGET).is_none() {
        return Some((400, format!("PVC {pvc} is not an upload target")));
    }
    if ann(POD_READY) != Some("true") {
        return Some((503, format!("upload server for PVC {pvc} is not ready")));
    }
    None
}

/// The PVC's uid and the bytes it holds (`status.capacity`, else the request).
pub fn pvc_target(app: &App, ns: &str, pvc: &str) -> Option<(String, u64)> {
    let obj = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, pvc))?;
    let size = crate::kubevirt::export::pvc_size(app, ns, pvc)?;
    Some((meta_str(&obj, "uid").to_string(), size))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        return Ok(());
    }
    Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
}

/// Why a request body did not arrive whole (the partial file is already removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// The client went away: both CDI's upload server and Deckhouse's uploader drop what they
    /// had and answer 400.
    Interrupted,
    /// The scratch file could not be written.
    Write,
}

impl BodyError {
    /// The status and text the upload servers answer.
    pub fn answer(self) -> (axum::http::StatusCode, &'static str) {
        match self {
            BodyError::Interrupted => (axum::http::StatusCode::BAD_REQUEST, "upload interrupted"),
            BodyError::Write => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "write error"),
        }
    }
}

/// Streams an upload's body into `path` (counted in [`UploadState::bytes_received`]).
pub async fn receive_body(app: &App, body: axum::body::Body, path: &Path) -> Result<(), BodyError> {
    use futures::StreamExt;
    use std::io::Write;
    let mut file = std::fs::File::create(path).map_err(|_| BodyError::Write)?;
    let mut body = body.into_data_stream();
    while let Some(chunk) = body.next().await {
        let failed = match chunk {
            Err(_) => Some(BodyError::Interrupted),
            Ok(chunk) => file
                .write_all(&chunk)
                .err()
                .map(|_| BodyError::Write)
                .or_else(|| {
                    app.uploads
                        .bytes_received
                        .fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    None
                }),
        };
        if let Some(e) = failed {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
    }
    Ok(())
}

/// What CDI's data processor does with a received stream: decompress, convert to raw, check
/// the virtual size against the volume, resize to fill it. Writes `out`. A `capacity` of
/// `u64::MAX` is no volume yet (a Deckhouse image, a disk without a size): no check, no resize.
pub fn process(received: &Path, out: &Path, capacity: u64) -> Result<(), String> {
    let mut magic = [0u8; 6];
    {
        use std::io::Read;
        let mut f = std::fs::File::open(received).map_err(|e| e.to_string())?;
        let _ = f.read(&mut magic).map_err(|e| e.to_string())?;
    }
    let plain = out.with_extension("plain");
    let decompress = |tool: &str| -> Result<(), String> {
        let target = std::fs::File::create(&plain).map_err(|e| e.to_string())?;
        run(Command::new(tool)
            .args(["-dc"])
            .arg(received)
            .stdout(target))
        .map_err(|e| format!("Unable to process data: {tool}: {e}"))
    };
    let source = if magic.starts_with(&[0x1f, 0x8b]) {
        decompress("gzip")?;
        plain.clone()
    } else if magic == [0xfd, b'7', b'z', b'X', b'Z', 0] {
        decompress("xz")?;
        plain.clone()
    } else {
        received.to_path_buf()
    };
    let info = Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(&source)
        .output()
        .map_err(|e| format!("cannot run qemu-img: {e}"))?;
    if !info.status.success() {
        return Err(format!(
            "Unable to process data: {}",
            String::from_utf8_lossy(&info.stderr).trim()
        ));
    }
    let info: Value = serde_json::from_slice(&info.stdout).map_err(|e| e.to_string())?;
    let format = info["format"].as_str().unwrap_or("raw").to_string();
    let virtual_size = info["virtual-size"].as_u64().unwrap_or(0);
    if virtual_size > capacity {
        let _ = std::fs::remove_file(&plain);
        return Err(format!(
            "Virtual image size {virtual_size} is larger than the reported available storage {capacity}. A larger PVC is required."
        ));
    }
    if format == "raw" {
        std::fs::rename(&source, out).map_err(|e| e.to_string())?;
    } else {
        run(Command::new("qemu-img")
            .args(["convert", "-q", "-f", &format, "-O", "raw"])
            .arg(&source)
            .arg(out))
        .map_err(|e| format!("Unable to convert source data to target format: {e}"))?;
    }
    let _ = std::fs::remove_file(&plain);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(out)
        .map_err(|e| e.to_string())?;
    if capacity != u64::MAX && file.metadata().map_err(|e| e.to_string())?.len() < capacity {
        file.set_len(capacity).map_err(|e| e.to_string())?;
    }
    Ok(())
}

impl crate::Handle {
    /// `https://127.0.0.1:PORT` of the upload proxy.
    pub fn upload_proxy_url(&self) -> String {
        self.app
            .uploads
            .base_url
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// PEM of the upload proxy's CA.
    pub fn upload_proxy_ca_pem(&self) -> String {
        self.app
            .uploads
            .ca_pem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the fault switches of the upload proxy and the Deckhouse uploaders.
    pub fn set_upload_faults(&self, faults: UploadFaults) {
        *self
            .app
            .uploads
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = faults;
    }

    /// Upload body bytes received so far.
    pub fn upload_bytes_received(&self) -> u64 {
        self.app
            .uploads
            .bytes_received
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Points CDIConfig's `status.uploadProxyURL` at `url` (e.g. an address nothing listens
    /// on, as when the proxy is not reachable from outside the cluster).
    pub fn set_upload_proxy_url(&self, url: &str) {
        let key = Key::new("cdi.kubevirt.io", "cdiconfigs", "", "config");
        self.app.store.modify(&key, |o| {
            o["status"]["uploadProxyURL"] = json!(url);
        });
    }
}

#[cfg(test)]
mod tests;
