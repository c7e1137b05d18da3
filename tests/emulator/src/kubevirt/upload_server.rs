//! CDI's upload proxy (`pkg/uploadproxy/uploadproxy.go`): HTTPS with its own CA (published
//! in ConfigMap `cdi/cdi-uploadproxy-signer-bundle`, key `ca-bundle.crt`, as CDI's operator
//! does), `POST|PUT /v1beta1/upload` and `/v1beta1/upload-async` with `Authorization: Bearer
//! TOKEN`, in front of the per-PVC upload servers (`pkg/uploadserver/uploadserver.go`), which
//! only the proxy may reach (mutual TLS), so the emulator merges the two.
//!
//! The proxy is reachable directly (CDIConfig `status.uploadProxyURL`, the way an ingress or
//! route publishes it) and through `pods/portforward` to its pod `cdi/cdi-uploadproxy-…`
//! (label `cdi.kubevirt.io: cdi-uploadproxy`, port 8443; certificate names
//! `cdi-uploadproxy`, `cdi-uploadproxy.cdi`, `cdi-uploadproxy.cdi.svc`).
//!
//! Fault switch: [`crate::kubevirt::upload::UploadFaults::cut_after`] cuts the first connection that
//! carries that many bytes, as a broken network does.

use crate::core::app::App;
use crate::kubevirt::upload::{CDI_NAMESPACE, PROXY_LABEL, PROXY_POD_PORT};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::Response;
use serde_json::json;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Names on the proxy's certificate.
const CERT_NAMES: &[&str] = &[
    "127.0.0.1",
    "localhost",
    "cdi-uploadproxy",
    "cdi-uploadproxy.cdi",
    "cdi-uploadproxy.cdi.svc",
];

/// Binds the proxy on 127.0.0.1, publishes it (CDIConfig, CA ConfigMap, proxy pod and
/// Service in namespace `cdi`) and serves until `shutdown`. Only where CDI is served.
pub async fn start(
    app: Arc<App>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    tasks: &mut JoinSet<()>,
) -> Result<(), crate::EmulatorError> {
    if app
        .registry
        .find_plural("cdi.kubevirt.io", "cdiconfigs")
        .is_none()
    {
        return Ok(());
    }
    let certs = crate::core::tls::generate_for(CERT_NAMES, "cdi-uploadproxy")
        .map_err(crate::EmulatorError::Tls)?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    let url = format!("https://127.0.0.1:{port}");
    *app.uploads
        .base_url
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = url.clone();
    *app.uploads.ca_pem.lock().unwrap_or_else(|e| e.into_inner()) = certs.ca_pem.clone();
    let mut tls = (*certs.server_config).clone();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = Arc::new(tls);
    let _ = app.uploads.server_config.set(tls.clone());
    publish(&app, &format!("127.0.0.1:{port}"), &certs.ca_pem)
        .map_err(crate::EmulatorError::Fixture)?;
    tasks.spawn(serve(listener, tls, app, shutdown));
    Ok(())
}

/// The objects CDI's operator makes for the proxy.
fn publish(app: &App, url: &str, ca_pem: &str) -> Result<(), String> {
    app.ensure_namespace(CDI_NAMESPACE);
    let ns = CDI_NAMESPACE;
    for obj in [
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDIConfig",
            "metadata": {"name": "config"},
            "spec": {"featureGates": ["HonorWaitForFirstConsumer"]},
            "status": {"uploadProxyURL": url, "scratchSpaceStorageClass": "local-path",
                "filesystemOverhead": {"global": "0.055"}}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cdi-uploadproxy-signer-bundle", "namespace": ns},
            "data": {"ca-bundle.crt": ca_pem}}),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "cdi-uploadproxy", "namespace": ns, "labels": {PROXY_LABEL.0: PROXY_LABEL.1}},
            "spec": {"type": "ClusterIP", "selector": {PROXY_LABEL.0: PROXY_LABEL.1},
                "ports": [{"protocol": "TCP", "port": 443, "targetPort": PROXY_POD_PORT}]}}),
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "cdi-uploadproxy-5b8f6c9d7-x2k4q", "namespace": ns,
                "labels": {PROXY_LABEL.0: PROXY_LABEL.1}},
            "spec": {"nodeName": crate::core::controllers::NODE, "containers": [{"name": "cdi-uploadproxy",
                "image": "quay.io/kubevirt/cdi-uploadproxy:v1.66.0",
                "ports": [{"containerPort": PROXY_POD_PORT, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": "10.244.0.40", "hostIP": "192.168.0.11",
                "containerStatuses": [{"name": "cdi-uploadproxy", "ready": true, "restartCount": 0}]}}),
    ] {
        app.put(obj)?;
    }
    Ok(())
}

/// Whether `pod` is the upload proxy and `port` its HTTPS port.
pub fn is_proxy(pod: &serde_json::Value, port: u16) -> bool {
    port == PROXY_POD_PORT
        && pod
            .pointer("/metadata/labels")
            .and_then(|l| l.get(PROXY_LABEL.0))
            .and_then(serde_json::Value::as_str)
            == Some(PROXY_LABEL.1)
}

/// A connection cut once it has carried as many bytes as the first pending cut says (that cut
/// is used up; connections that carry less, like a health probe, are left alone). The
/// Deckhouse uploader's connections go through it too.
pub(crate) struct Cut<S> {
    inner: S,
    app: Arc<App>,
    read: u64,
    cut: bool,
}

impl<S> Cut<S> {
    /// Wraps a fresh connection.
    pub(crate) fn new(inner: S, app: Arc<App>) -> Self {
        Cut {
            inner,
            app,
            read: 0,
            cut: false,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Cut<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.cut {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "injected cut",
            )));
        }
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        self.read += (buf.filled().len() - before) as u64;
        let read = self.read;
        let mut faults = self
            .app
            .uploads
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if faults.cut_after.first().is_some_and(|&at| read >= at) {
            faults.cut_after.remove(0);
            drop(faults);
            self.cut = true;
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Cut<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        // A cut network carries nothing either way: no answer reaches the client.
        if self.cut {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "injected cut",
            )));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves one connection (TCP or a port-forward stream), applying a pending cut.
pub async fn serve_stream<S>(app: Arc<App>, stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let Some(tls) = app.uploads.server_config.get().cloned() else {
        return;
    };
    let stream = Cut::new(app.stream_faults.wrap("upload", stream), app.clone());
    let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls).accept(stream).await else {
        return;
    };
    let router = axum::Router::new().fallback(handle).with_state(app);
    let service = hyper_util::service::TowerToHyperService::new(router);
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let _ = builder
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn serve(
    listener: TcpListener,
    _tls: Arc<rustls::ServerConfig>,
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
                conns.spawn(serve_stream(app.clone(), tcp));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

fn plain(status: StatusCode, text: &str) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(format!("{text}\n")))
        .expect("response")
}

async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let asynchronous = match path.as_str() {
        "/v1beta1/upload" | "/v1alpha1/upload" => false,
        "/v1beta1/upload-async" | "/v1alpha1/upload-async" => true,
        "/healthz" => return plain(StatusCode::OK, "OK"),
        _ => return plain(StatusCode::NOT_FOUND, "404 page not found"),
    };
    if req.method() != Method::POST && req.method() != Method::PUT {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    let Some((ns, pvc)) = token.and_then(|t| app.uploads.token_target(&t)) else {
        return plain(StatusCode::UNAUTHORIZED, "Unauthorized");
    };
    if let Some((code, message)) = crate::kubevirt::upload::not_ready(&app, &ns, &pvc) {
        return plain(
            StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            &message,
        );
    }
    let Some((uid, capacity)) = crate::kubevirt::upload::pvc_target(&app, &ns, &pvc) else {
        return plain(StatusCode::BAD_REQUEST, "PVC not found");
    };
    let received = app.uploads.scratch_path(&uid, "received");
    if let Err(e) = crate::kubevirt::upload::receive_body(&app, req.into_body(), &received).await {
        let (code, text) = e.answer();
        return plain(code, text);
    }
    let out = app.uploads.data_path(&uid);
    let work = {
        let received = received.clone();
        move || {
            let result = crate::kubevirt::upload::process(&received, &out, capacity);
            let _ = std::fs::remove_file(&received);
            result
        }
    };
    if asynchronous {
        let app = app.clone();
        tokio::task::spawn_blocking(move || {
            let result = work();
            app.uploads.finish(&uid, result);
        });
        return plain(StatusCode::OK, "");
    }
    let result = tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    app.uploads.finish(&uid, result.clone());
    match result {
        Ok(()) => plain(StatusCode::OK, ""),
        Err(message) => plain(StatusCode::BAD_REQUEST, &message),
    }
}
