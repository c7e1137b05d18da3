//! The export server: HTTPS with its own CA, serving exported volumes like KubeVirt's
//! virt-exportserver (`pkg/storage/export/virt-exportserver/exportserver.go`: token from the
//! `x-kubevirt-export-token` header or query parameter, else 401; `disk.img` through Go's
//! `http.ServeContent`, so Range, If-Range, ETag and HEAD; `disk.img.gz` compressed on the
//! fly without Range) and Deckhouse's exporter (`GET|HEAD <url>/api/v1/block`, raw with Range,
//! the kubeconfig's credentials authorized for `dataexports/download` `create`).
//!
//! Fault switches ([`crate::kubevirt::export::ExportFaults`]) cut responses at given offsets, answer 503,
//! or serve slowly; `bytes_served` counts every body byte sent, for tests.

use crate::core::app::App;
use crate::core::auth::{Attributes, authorize};
use crate::core::store::Key;
use crate::core::util::meta_str;
use crate::kubevirt::export::{
    ExportState, KV_EXPORT_GROUP, SF_GROUP, data_export_target, fill, pvc_size,
};
use crate::kubevirt::export_pods::PodTarget;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::Response;
use base64::Engine;
use bytes::Bytes;
use serde_json::Value;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

const CHUNK: usize = 256 * 1024;
/// Fixed Last-Modified of every volume (content changes are visible through the ETag).
const LAST_MODIFIED: &str = "Mon, 02 Jan 2006 15:04:05 GMT";

/// Binds the export server on 127.0.0.1 with a fresh CA, records its URL and CA in
/// `app.exports`, and serves until `shutdown`.
pub async fn start(
    app: Arc<App>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> Result<(), crate::EmulatorError> {
    let certs = crate::core::tls::generate().map_err(crate::EmulatorError::Tls)?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    *app.exports
        .base_url
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = format!("https://127.0.0.1:{port}");
    *app.exports.ca_pem.lock().unwrap_or_else(|e| e.into_inner()) = certs.ca_pem;
    let router = axum::Router::new().fallback(handle).with_state(app.clone());
    // One volume per connection: HTTP/1.1 only (a cut then ends the connection, as a broken
    // network does).
    let mut tls = (*certs.server_config).clone();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    tasks.spawn(serve(app, listener, Arc::new(tls), router, shutdown));
    Ok(())
}

async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: axum::Router,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let router = router.clone();
                let tcp = app.stream_faults.wrap("export", tcp);
                conns.spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else { return };
                    let service = hyper_util::service::TowerToHyperService::new(router);
                    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Serves one connection that reached exporter pod `target` through pods/portforward: TLS
/// with the pod's certificate (signed by the export CA), HTTP/1.1, the internal paths.
pub async fn serve_pod_stream<S>(app: Arc<App>, stream: S, target: PodTarget)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let names = crate::kubevirt::export_pods::cert_names(&app, &target);
    let Ok(tls) = app.exports.internal_ca.server_config(&names) else {
        return;
    };
    let stream = app.stream_faults.wrap("export", stream);
    let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
        return;
    };
    let router = axum::Router::new()
        .fallback(handle)
        .layer(axum::Extension(target))
        .with_state(app);
    let service = hyper_util::service::TowerToHyperService::new(router);
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let _ = builder
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

fn plain(status: StatusCode, text: &str) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(format!("{text}\n")))
        .expect("response")
}

/// What a request resolved to.
struct Volume {
    ns: String,
    pvc: String,
    gzip: bool,
}

#[allow(clippy::result_large_err)]
async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let state = &app.exports;
    state
        .requests_seen
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if req.headers().contains_key(header::AUTHORIZATION) {
        state
            .authorization_seen
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // HTTP/1.1 names the host in `Host`; the port after the last `:` (IPv6 in brackets).
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        let host = match host.rsplit_once(':') {
            Some((name, port)) if !port.contains(']') => name,
            _ => host,
        };
        state
            .authorized_hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(host.to_string());
    }
    {
        let mut faults = state.faults.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(code) = faults.answer_status {
            let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return axum::response::IntoResponse::into_response((code, ""));
        }
        if faults.fail_5xx > 0 {
            faults.fail_5xx -= 1;
            return plain(StatusCode::SERVICE_UNAVAILABLE, "injected failure");
        }
    }
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let pod = req.extensions().get::<PodTarget>().cloned();
    let resolved = match (pod, parts.as_slice()) {
        // Inside an exporter pod (reached through pods/portforward): the internal paths.
        (Some(PodTarget::KubeVirt { ns, export }), rest) => {
            kubevirt(&app, req.headers(), &query, &ns, &export, rest, "internal")
        }
        (Some(PodTarget::Deckhouse { ns, export }), ["api", "v1", "block"]) => {
            let found = app
                .store
                .get(&Key::new(SF_GROUP, "dataexports", &ns, &export))
                .filter(|de| de.pointer("/status/phase").and_then(Value::as_str) == Some("Ready"));
            match found {
                Some(de) => deckhouse_volume(&app, req.headers(), &ns, &de),
                None => Err(plain(StatusCode::NOT_FOUND, "404 page not found")),
            }
        }
        (Some(PodTarget::Deckhouse { .. }), _) => {
            Err(plain(StatusCode::NOT_FOUND, "404 page not found"))
        }
        (None, parts) => match parts {
            // KubeVirt external link.
            [
                "api",
                "export.kubevirt.io",
                _,
                "namespaces",
                ns,
                "virtualmachineexports",
                name,
                rest @ ..,
            ] => kubevirt(&app, req.headers(), &query, ns, name, rest, "external"),
            // Deckhouse public URL: /<ns>/<pvc|vd|snap>/<name>/api/v1/block
            [ns, short, name, "api", "v1", "block"] => {
                deckhouse(&app, req.headers(), ns, short, name)
            }
            _ => Err(plain(StatusCode::NOT_FOUND, "404 page not found")),
        },
    };
    match resolved {
        Err(response) => response,
        Ok(Resolved::Manifest(text)) => Response::builder()
            .header(header::CONTENT_TYPE, "application/yaml")
            .body(Body::from(text))
            .expect("response"),
        Ok(Resolved::Volume(vol)) => serve_volume(&app, req.method(), req.headers(), vol),
        Ok(Resolved::Archive { ns, pvc }) => serve_archive(&app, req.method(), &ns, &pvc),
        Ok(Resolved::Dir { ns, pvc, path }) => {
            serve_dir(&app, req.method(), req.headers(), &ns, &pvc, &path)
        }
    }
}

enum Resolved {
    Volume(Volume),
    Manifest(String),
    /// A filesystem claim's `tar.gz`.
    Archive {
        ns: String,
        pvc: String,
    },
    /// A path under a filesystem claim's `dir/` (segments, decoded).
    Dir {
        ns: String,
        pvc: String,
        path: Vec<String>,
    },
}

/// The PVC behind volume `vol` of export `name`, if the export's `side` links list it.
fn listed_pvc(vme: &Value, side: &str, name: &str, vol: &str) -> Option<String> {
    let listed = vme
        .pointer(&format!("/status/links/{side}/volumes"))
        .and_then(Value::as_array)
        .is_some_and(|v| v.iter().any(|v| v["name"] == vol));
    if !listed {
        return None;
    }
    // A snapshot's volume is the restore PVC `<export>-<volume>`.
    Some(
        if vme.pointer("/spec/source/kind").and_then(Value::as_str)
            == Some("VirtualMachineSnapshot")
        {
            format!("{name}-{vol}")
        } else {
            vol.to_string()
        },
    )
}

/// `%XX` escapes of a URL path segment decoded (Go's `url.PathUnescape`).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[allow(clippy::result_large_err)] // an error is the response to send
fn kubevirt(
    app: &App,
    headers: &HeaderMap,
    query: &str,
    ns: &str,
    name: &str,
    rest: &[&str],
    side: &str,
) -> Result<Resolved, Response> {
    let not_found = || plain(StatusCode::NOT_FOUND, "404 page not found");
    let vme = app
        .store
        .get(&Key::new(
            KV_EXPORT_GROUP,
            "virtualmachineexports",
            ns,
            name,
        ))
        .filter(|o| o.pointer("/status/phase").and_then(Value::as_str) == Some("Ready"))
        .ok_or_else(not_found)?;
    // tokenChecker: header or query parameter, compared with the Secret's `token`.
    let secret_name = vme
        .pointer("/spec/tokenSecretRef")
        .and_then(Value::as_str)
        .unwrap_or("");
    let expected = app
        .store
        .get(&Key::new("", "secrets", ns, secret_name))
        .and_then(|s| {
            s.pointer("/data/token")
                .and_then(Value::as_str)
                .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
        });
    let given = headers
        .get("x-kubevirt-export-token")
        .map(|v| v.as_bytes().to_vec())
        .or_else(|| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix("x-kubevirt-export-token="))
                .map(|t| t.as_bytes().to_vec())
        });
    match (expected, given) {
        (Some(e), Some(g)) if !e.is_empty() && constant_time_eq(&e, &g) => {}
        _ => return Err(plain(StatusCode::UNAUTHORIZED, "Unauthorized")),
    }
    match rest {
        ["volumes", vol, "disk.tar.gz"] => {
            let pvc = listed_pvc(&vme, side, name, vol).ok_or_else(not_found)?;
            Ok(Resolved::Archive {
                ns: ns.to_string(),
                pvc,
            })
        }
        // `dirHandler`: `http.StripPrefix(".../dir/", http.FileServer(...))`; without the
        // slash StripPrefix answers 404.
        ["volumes", vol, "dir", path @ ..] if !path.is_empty() => {
            let pvc = listed_pvc(&vme, side, name, vol).ok_or_else(not_found)?;
            Ok(Resolved::Dir {
                ns: ns.to_string(),
                pvc,
                path: path.iter().map(|p| percent_decode(p)).collect(),
            })
        }
        ["volumes", vol, file @ ("disk.img" | "disk.img.gz")] => {
            let listed = vme
                .pointer(&format!("/status/links/{side}/volumes"))
                .and_then(Value::as_array)
                .is_some_and(|v| v.iter().any(|v| v["name"] == *vol));
            if !listed {
                return Err(not_found());
            }
            // A snapshot's volume is the restore PVC `<export>-<volume>`.
            let pvc = if vme.pointer("/spec/source/kind").and_then(Value::as_str)
                == Some("VirtualMachineSnapshot")
            {
                format!("{name}-{vol}")
            } else {
                vol.to_string()
            };
            Ok(Resolved::Volume(Volume {
                ns: ns.to_string(),
                pvc,
                gzip: *file == "disk.img.gz",
            }))
        }
        [s, "manifests", "all"] if *s == side => {
            let vm_name = vme
                .pointer("/status/virtualMachineName")
                .and_then(Value::as_str)
                .ok_or_else(not_found)?;
            let mut vm = app
                .store
                .get(&Key::new("kubevirt.io", "virtualmachines", ns, vm_name))
                .ok_or_else(not_found)?;
            // The manifest is for recreating the VM elsewhere: no status, no server fields.
            if let Some(o) = vm.as_object_mut() {
                o.remove("status");
            }
            if let Some(meta) = vm.get_mut("metadata").and_then(Value::as_object_mut) {
                for f in [
                    "uid",
                    "resourceVersion",
                    "generation",
                    "creationTimestamp",
                    "managedFields",
                ] {
                    meta.remove(f);
                }
            }
            let yaml = yaml_serde::to_string(&vm).map_err(|_| not_found())?;
            Ok(Resolved::Manifest(format!("---\n{yaml}")))
        }
        _ => Err(not_found()),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[allow(clippy::result_large_err)] // an error is the response to send
fn deckhouse(
    app: &App,
    headers: &HeaderMap,
    ns: &str,
    short: &str,
    name: &str,
) -> Result<Resolved, Response> {
    let not_found = || plain(StatusCode::NOT_FOUND, "404 page not found");
    let (exports, _) = app.store.list(SF_GROUP, "dataexports", Some(ns));
    let de = exports
        .into_iter()
        .find(|de| {
            de.pointer("/spec/targetRef/name").and_then(Value::as_str) == Some(name)
                && de.pointer("/status/phase").and_then(Value::as_str) == Some("Ready")
                && data_export_target(app, de).is_ok_and(|(s, _)| s == short)
        })
        .ok_or_else(not_found)?;
    deckhouse_volume(app, headers, ns, &de)
}

/// Authorizes a download from DataExport `de` and resolves its volume.
#[allow(clippy::result_large_err)] // an error is the response to send
fn deckhouse_volume(
    app: &App,
    headers: &HeaderMap,
    ns: &str,
    de: &Value,
) -> Result<Resolved, Response> {
    let not_found = || plain(StatusCode::NOT_FOUND, "404 page not found");
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let user = app
        .tokens
        .authenticate(auth)
        .ok_or_else(|| plain(StatusCode::UNAUTHORIZED, "Unauthorized"))?;
    let attrs = Attributes {
        verb: "create".into(),
        group: SF_GROUP.into(),
        resource: "dataexports".into(),
        subresource: "download".into(),
        namespace: ns.into(),
        name: meta_str(de, "name").into(),
    };
    if authorize(&app.store, &user, &attrs).is_err() {
        return Err(plain(StatusCode::FORBIDDEN, "Forbidden"));
    }
    app.exports
        .last_access
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(meta_str(de, "uid").to_string(), Instant::now());
    let (_, pvc) = data_export_target(app, de).map_err(|_| not_found())?;
    Ok(Resolved::Volume(Volume {
        ns: ns.to_string(),
        pvc,
        gzip: false,
    }))
}

/// Parses one `bytes=` range against `size` (Go's `parseRange` for a single range).
fn parse_range(value: &str, size: u64) -> Option<Result<(u64, u64), ()>> {
    let spec = value.strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None; // multipart ranges: serve the whole content
    }
    let (a, b) = spec.split_once('-')?;
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        (size.saturating_sub(n), size)
    } else {
        let start: u64 = a.parse().ok()?;
        let end = if b.is_empty() {
            size
        } else {
            b.parse::<u64>().ok()?.saturating_add(1).min(size)
        };
        (start, end)
    };
    if start >= size || start >= end {
        return Some(Err(()));
    }
    Some(Ok((start, end)))
}

fn serve_volume(app: &App, method: &Method, headers: &HeaderMap, vol: Volume) -> Response {
    let state = &app.exports;
    let Some(size) = pvc_size(app, &vol.ns, &vol.pvc) else {
        return plain(StatusCode::NOT_FOUND, "404 page not found");
    };
    let content_pvc = crate::kubevirt::export_snapshot::content_pvc(app, &vol.ns, &vol.pvc);
    let key = state.key(&vol.ns, &content_pvc);
    // An uploaded volume serves what the upload wrote (CDI's disk.img), else generated bytes.
    let (content, size) = match crate::kubevirt::upload::uploaded_file(app, &vol.ns, &content_pvc)
        .and_then(|p| std::fs::File::open(p).ok())
        .and_then(|f| Some((f.metadata().ok()?.len(), f)))
    {
        Some((len, file)) => (Content::File(Arc::new(file)), len),
        None => (Content::Generated(key), size),
    };
    let etag = format!("\"{key:016x}-{size:x}\"");
    if vol.gzip {
        let body = if method == Method::HEAD {
            Body::empty()
        } else {
            Body::from_stream(gzip_stream(app, content, size))
        };
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/gzip")
            .body(body)
            .expect("response");
    }
    serve_ranged(
        app,
        method,
        headers,
        content,
        size,
        Some(&etag),
        LAST_MODIFIED,
    )
}

/// Go's `http.ServeContent` of `content`: Range (one range), If-Range on the ETag (when there
/// is one) or Last-Modified, HEAD.
fn serve_ranged(
    app: &App,
    method: &Method,
    headers: &HeaderMap,
    content: Content,
    size: u64,
    etag: Option<&str>,
    last_modified: &str,
) -> Response {
    let mut range = (0, size);
    let mut partial = false;
    let if_range_ok = headers
        .get(header::IF_RANGE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|v| Some(v) == etag || v == last_modified);
    if let Some(value) = headers.get(header::RANGE).and_then(|v| v.to_str().ok())
        && if_range_ok
    {
        match parse_range(value, size) {
            Some(Ok(r)) => {
                range = r;
                partial = true;
            }
            Some(Err(())) => {
                return Response::builder()
                    .status(StatusCode::RANGE_NOT_SATISFIABLE)
                    .header(header::CONTENT_RANGE, format!("bytes */{size}"))
                    .body(Body::empty())
                    .expect("response");
            }
            None => {}
        }
    }
    let mut response = Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::LAST_MODIFIED, last_modified)
        .header(header::CONTENT_LENGTH, range.1 - range.0);
    if let Some(etag) = etag {
        response = response.header(header::ETAG, etag);
    }
    if partial {
        response = response.status(StatusCode::PARTIAL_CONTENT).header(
            header::CONTENT_RANGE,
            format!("bytes {}-{}/{size}", range.0, range.1 - 1),
        );
    }
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        Body::from_stream(raw_stream(app, content, range))
    };
    response.body(body).expect("response")
}

/// Takes the fault switches that apply to a response covering `[start, end)`: the cut point
/// inside it (consumed) and the rate.
fn faults_for(state: &ExportState, start: u64, end: u64) -> (Option<u64>, Option<u64>) {
    let mut faults = state.faults.lock().unwrap_or_else(|e| e.into_inner());
    faults.cut_at.sort_unstable();
    let cut = faults
        .cut_at
        .iter()
        .position(|&c| c > start && c < end)
        .map(|i| faults.cut_at.remove(i));
    // Cut points behind this response can no longer apply.
    faults.cut_at.retain(|&c| c > start);
    (cut, faults.bytes_per_sec)
}

type Chunk = Result<Bytes, std::io::Error>;

/// Where a volume's bytes come from.
#[derive(Clone)]
enum Content {
    /// The generator of [`fill`] with this key.
    Generated(u64),
    /// An uploaded volume's file (short reads past its end are zeros).
    File(Arc<std::fs::File>),
    /// A memory dump file.
    Core(Arc<crate::kubevirt::memory_core::Core>),
    /// A filesystem claim's tar archive.
    Tar(Arc<crate::kubevirt::memory_core::TarImage>),
}

impl Content {
    fn read(&self, pos: u64, buf: &mut [u8]) {
        match self {
            Content::Generated(key) => fill(*key, pos, buf),
            Content::File(file) => {
                use std::os::unix::fs::FileExt;
                if file.read_exact_at(buf, pos).is_err() {
                    buf.fill(0);
                }
            }
            Content::Core(core) => core.read(pos, buf),
            Content::Tar(tar) => tar.read(pos, buf),
        }
    }
}

fn raw_stream(
    app: &App,
    content: Content,
    (start, end): (u64, u64),
) -> impl futures::Stream<Item = Chunk> + Send + 'static {
    let (cut, rate) = faults_for(&app.exports, start, end);
    let stop = cut.unwrap_or(end);
    let counter = app_counter(app);
    futures::stream::unfold(start, move |pos| {
        let counter = counter.clone();
        let content = content.clone();
        async move {
            if pos >= stop {
                if cut.is_some() && pos < end {
                    return Some((
                        Err(std::io::Error::other("injected cut")),
                        end, // ends the stream after the error
                    ));
                }
                return None;
            }
            let n = (CHUNK as u64).min(stop - pos) as usize;
            let mut buf = vec![0u8; n];
            content.read(pos, &mut buf);
            if let Some(rate) = rate {
                tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
            }
            counter.fetch_add(n as u64, Ordering::Relaxed);
            Some((Ok(Bytes::from(buf)), pos + n as u64))
        }
    })
}

fn app_counter(app: &App) -> Arc<std::sync::atomic::AtomicU64> {
    app.exports.bytes_served.clone()
}

fn gzip_stream(
    app: &App,
    content: Content,
    size: u64,
) -> impl futures::Stream<Item = Chunk> + Send + 'static {
    let (cut, rate) = faults_for(&app.exports, 0, size);
    let counter = app_counter(app);
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    futures::stream::unfold((0u64, 0u64, Some(encoder)), move |(pos, sent, encoder)| {
        let counter = counter.clone();
        let content = content.clone();
        async move {
            let mut encoder = encoder?;
            if cut.is_some_and(|c| sent >= c) {
                return Some((
                    Err(std::io::Error::other("injected cut")),
                    (pos, sent, None),
                ));
            }
            let out = if pos < size {
                let n = (CHUNK as u64).min(size - pos) as usize;
                let mut buf = vec![0u8; n];
                content.read(pos, &mut buf);
                if encoder.write_all(&buf).is_err() {
                    return None;
                }
                let out = std::mem::take(encoder.get_mut());
                (out, pos + n as u64, Some(encoder))
            } else {
                match encoder.finish() {
                    Ok(out) if !out.is_empty() => (out, pos, None),
                    _ => return None,
                }
            };
            if let Some(rate) = rate {
                tokio::time::sleep(Duration::from_secs_f64(out.0.len() as f64 / rate as f64)).await;
            }
            counter.fetch_add(out.0.len() as u64, Ordering::Relaxed);
            let sent = sent + out.0.len() as u64;
            Some((Ok(Bytes::from(out.0)), (out.1, sent, out.2)))
        }
    })
}

/// `archiveHandler`: GET only (else 400), the claim's tar gzipped on the fly, no Range.
fn serve_archive(app: &App, method: &Method, ns: &str, pvc: &str) -> Response {
    if method != Method::GET {
        return axum::response::IntoResponse::into_response(StatusCode::BAD_REQUEST);
    }
    let Some(dump) = app.claim_files.get(ns, pvc) else {
        return axum::response::IntoResponse::into_response(StatusCode::INTERNAL_SERVER_ERROR);
    };
    let Ok(tar) = crate::kubevirt::memory_core::TarImage::new(&dump.name, dump.core, dump.modified)
    else {
        return axum::response::IntoResponse::into_response(StatusCode::INTERNAL_SERVER_ERROR);
    };
    let size = tar.len();
    // Go sniffs the first bytes written: gzip's magic.
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-gzip")
        .body(Body::from_stream(gzip_stream(
            app,
            Content::Tar(Arc::new(tar)),
            size,
        )))
        .expect("response")
}

/// `dirHandler`: Go's `http.FileServer` on the claim's root. `[""]` is the root's listing
/// (`dirList`: entries sorted by name, `lost+found` aside as the emulator has none), `[NAME]`
/// a file through `serveContent` (Last-Modified its mtime, no ETag), `[NAME, ""]` redirected to
/// `../NAME` (301), anything else 404.
fn serve_dir(
    app: &App,
    method: &Method,
    headers: &HeaderMap,
    ns: &str,
    pvc: &str,
    path: &[String],
) -> Response {
    let not_found = || plain(StatusCode::NOT_FOUND, "404 page not found");
    let Some(dump) = app.claim_files.get(ns, pvc) else {
        return not_found();
    };
    let last_modified = httpdate(dump.modified);
    match path {
        [root] if root.is_empty() => {
            let href: String = dump
                .name
                .bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                        (b as char).to_string()
                    }
                    b => format!("%{b:02X}"),
                })
                .collect();
            let text = dump
                .name
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('"', "&#34;")
                .replace('\'', "&#39;");
            let body = format!(
                "<!doctype html>\n<meta name=\"viewport\" content=\"width=device-width\">\n<pre>\n<a href=\"{href}\">{text}</a>\n</pre>\n"
            );
            Response::builder()
                .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
                .header(header::LAST_MODIFIED, &last_modified)
                .body(if method == Method::HEAD {
                    Body::empty()
                } else {
                    Body::from(body)
                })
                .expect("response")
        }
        [file] if *file == dump.name => {
            let size = dump.core.len();
            serve_ranged(
                app,
                method,
                headers,
                Content::Core(dump.core),
                size,
                None,
                &last_modified,
            )
        }
        [file, slash] if *file == dump.name && slash.is_empty() => Response::builder()
            .status(StatusCode::MOVED_PERMANENTLY)
            .header(header::LOCATION, format!("../{file}"))
            .body(Body::empty())
            .expect("response"),
        _ => not_found(),
    }
}

/// Unix seconds as an HTTP date (`http.TimeFormat`).
fn httpdate(unix: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let rfc = crate::core::util::format_rfc3339(unix as i64); // YYYY-MM-DDTHH:MM:SSZ
    let day = DAYS[((unix / 86400) % 7) as usize];
    let month = rfc[5..7].parse::<usize>().unwrap_or(1);
    format!(
        "{day}, {} {} {} {} GMT",
        &rfc[8..10],
        MONTHS[month - 1],
        &rfc[..4],
        &rfc[11..19]
    )
}

#[cfg(test)]
mod tests {
    use super::parse_range;

    #[test]
    fn ranges_like_go() {
        assert_eq!(parse_range("bytes=0-9", 100), Some(Ok((0, 10))));
        assert_eq!(parse_range("bytes=90-", 100), Some(Ok((90, 100))));
        assert_eq!(parse_range("bytes=-10", 100), Some(Ok((90, 100))));
        assert_eq!(parse_range("bytes=100-", 100), Some(Err(())));
        assert_eq!(parse_range("bytes=0-1,5-6", 100), None);
    }
}
