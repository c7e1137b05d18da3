//! The signer service (`kubectl vm signer serve`): HTTPS with the serving certificate the
//! APIService's caBundle names, front-proxy authentication ([`requestheader`]), and the two
//! certificate subresources ([`issue`]).
//!
//! Only requests the API server proxied are honoured: every path but the health checks needs
//! a client certificate from the front-proxy CA with an allowed name. The CA private key is
//! read from its Secret for each issuance, so `ca rotate` reaches a running signer at once.

pub mod issue;
pub mod requestheader;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::cluster::Cluster;
use crate::flavor::Flavor;
use crate::signer::policy::Limits;
pub use requestheader::RequestHeaderConfig;

/// Largest request body accepted (a public key and a few fields).
const MAX_BODY: usize = 64 * 1024;
/// Time a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How the signer runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// PEM serving certificate (chain).
    pub tls_cert_file: PathBuf,
    /// PEM private key of the serving certificate.
    pub tls_key_file: PathBuf,
    /// Namespace of the CA Secret.
    pub ca_namespace: String,
    /// Lifetimes and the platform user.
    pub limits: Limits,
}

/// One audit record: every issuance and every refusal, as one JSON object.
pub type AuditSink = Arc<dyn Fn(serde_json::Value) + Send + Sync>;

/// What every request handler shares.
pub struct Signer {
    /// The signer's own cluster access (its ServiceAccount).
    pub cluster: Cluster,
    /// The platform the cluster serves.
    pub flavor: Flavor,
    /// The API server's front-proxy settings.
    pub requestheader: RequestHeaderConfig,
    /// Namespace of the CA Secret.
    pub ca_namespace: String,
    /// Lifetimes and the platform user.
    pub limits: Limits,
    /// Where audit records go.
    pub audit: AuditSink,
}

/// Why the signer could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ServeError(pub String);

fn tls_config(
    options: &ServeOptions,
    requestheader: &RequestHeaderConfig,
) -> Result<rustls::ServerConfig, ServeError> {
    let chain = CertificateDer::pem_file_iter(&options.tls_cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ServeError(format!("{}: {e}", options.tls_cert_file.display())))?;
    let key = PrivateKeyDer::from_pem_file(&options.tls_key_file)
        .map_err(|e| ServeError(format!("{}: {e}", options.tls_key_file.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in &requestheader.client_ca {
        roots
            .add(ca.clone())
            .map_err(|e| ServeError(format!("requestheader-client-ca-file: {e}")))?;
    }
    // Unauthenticated TLS is accepted so the refusal can be an API Status, not a TLS alert.
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| ServeError(format!("front-proxy CA: {e}")))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| ServeError(format!("serving certificate: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Bind the listener; [`Signer::serve`] then answers on it. Separate so callers (and tests)
/// learn the bound port before serving.
pub async fn bind(options: &ServeOptions) -> Result<TcpListener, ServeError> {
    TcpListener::bind(options.listen)
        .await
        .map_err(|e| ServeError(format!("cannot listen on {}: {e}", options.listen)))
}

impl Signer {
    /// Serve on `listener` until the task is dropped.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        options: &ServeOptions,
    ) -> Result<(), ServeError> {
        let acceptor = TlsAcceptor::from(Arc::new(tls_config(options, &self.requestheader)?));
        loop {
            let (tcp, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    // EMFILE and the like: wait instead of spinning.
                    (self.audit)(
                        serde_json::json!({"event": "accept-error", "error": e.to_string()}),
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let signer = self.clone();
            tokio::spawn(async move {
                let Ok(Ok(tls)) =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                else {
                    return;
                };
                let client_cn = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|cert| requestheader::common_name(cert));
                let client_cn = Arc::new(client_cn);
                let service = hyper::service::service_fn(move |req| {
                    let signer = signer.clone();
                    let client_cn = client_cn.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            signer.respond(client_cn.as_deref(), req).await,
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HANDSHAKE_TIMEOUT)
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    }

    async fn respond(
        &self,
        client_cn: Option<&str>,
        req: http::Request<Incoming>,
    ) -> http::Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body = match Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(_) => {
                return issue::status_response(
                    413,
                    "RequestEntityTooLarge",
                    &format!("request body over {MAX_BODY} bytes"),
                );
            }
        };
        self.handle(client_cn, &parts, &body).await
    }
}
