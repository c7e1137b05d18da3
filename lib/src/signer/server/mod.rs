//! The signer service (`kubectl vm signer serve`): HTTPS with the serving certificate the
//! APIService's caBundle names, front-proxy authentication ([`requestheader`]), and the two
//! certificate subresources ([`issue`]).
//!
//! Only requests the API server proxied are honoured: every path but the health checks needs
//! a client certificate from the front-proxy CA with an allowed name. The CA private key is
//! read from its Secret for each issuance, so `ca rotate` reaches a running signer at once.

pub mod issue;
pub mod requestheader;
pub mod review;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::cluster::Cluster;
use crate::flavor::Flavor;
use crate::signer::policy::Limits;
pub use requestheader::RequestHeaderConfig;

/// Largest request body accepted (a public key and a few fields); larger is 413.
pub const MAX_BODY: usize = 64 * 1024;

/// What a connection may cost the signer before and after it proves who it is.
///
/// A client without a verified front-proxy certificate gets at most `handshake + headers`:
/// its request is answered (401, or the health check) from the headers alone, without reading
/// a byte of its body, and the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Time to complete the TLS handshake.
    pub handshake: Duration,
    /// Time to send a request's headers, counted from the end of the previous response on a
    /// kept-alive connection (so it is also the idle timeout).
    pub headers: Duration,
    /// Time to send the whole body, once the headers are in.
    pub body: Duration,
    /// Time from the headers to the response, the body and the signer's own API calls included.
    pub request: Duration,
    /// Connections served at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            handshake: Duration::from_secs(5),
            headers: Duration::from_secs(5),
            body: Duration::from_secs(5),
            request: Duration::from_secs(15),
            max_connections: 512,
        }
    }
}

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
    /// Deadlines and the connection cap.
    pub connections: ConnectionLimits,
    /// Smallest RSA modulus certified, in bits.
    pub min_rsa_bits: u32,
    /// How often the front-proxy settings are re-read (a change applies without a restart).
    pub requestheader_resync: Duration,
}

/// One audit record: every issuance and every refusal, as one JSON object.
pub type AuditSink = Arc<dyn Fn(serde_json::Value) + Send + Sync>;

/// The front-proxy trust in force: the settings and the TLS acceptor built from their CA, or
/// why the settings are unusable (then every request but the health checks is refused).
struct Trust {
    settings: Result<RequestHeaderConfig, String>,
    acceptor: TlsAcceptor,
    resource_version: Option<String>,
}

/// What every request handler shares.
pub struct Signer {
    /// The signer's own cluster access (its ServiceAccount).
    pub cluster: Cluster,
    /// The platform the cluster serves.
    pub flavor: Flavor,
    /// Namespace of the CA Secret.
    pub ca_namespace: String,
    /// Lifetimes and the platform user.
    pub limits: Limits,
    /// Smallest RSA modulus certified, in bits.
    pub min_rsa_bits: u32,
    /// Where audit records go.
    pub audit: AuditSink,
    options: ServeOptions,
    trust: RwLock<Arc<Trust>>,
    reviews: review::ReviewCache,
}

/// Why the signer could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ServeError(pub String);

/// The TLS settings: the serving certificate, and client certificates verified against the
/// front-proxy CA when the settings are usable (none asked for otherwise).
fn tls_config(
    options: &ServeOptions,
    settings: &Result<RequestHeaderConfig, String>,
) -> Result<rustls::ServerConfig, ServeError> {
    let chain = CertificateDer::pem_file_iter(&options.tls_cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ServeError(format!("{}: {e}", options.tls_cert_file.display())))?;
    let key = PrivateKeyDer::from_pem_file(&options.tls_key_file)
        .map_err(|e| ServeError(format!("{}: {e}", options.tls_key_file.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ServeError(e.to_string()))?;
    let builder = match settings {
        Ok(settings) => builder.with_client_cert_verifier(client_verifier(settings)?),
        Err(_) => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| ServeError(format!("serving certificate: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A verifier of front-proxy client certificates. Unauthenticated TLS is accepted so the
/// refusal can be an API Status (and the health checks answer), but such a connection never
/// has its body read.
fn client_verifier(
    settings: &RequestHeaderConfig,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, ServeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in &settings.client_ca {
        roots
            .add(ca.clone())
            .map_err(|e| ServeError(format!("requestheader-client-ca-file: {e}")))?;
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| ServeError(format!("front-proxy CA: {e}")))
}

/// Bind the listener; [`Signer::serve`] then answers on it. Separate so callers (and tests)
/// learn the bound port before serving.
pub async fn bind(options: &ServeOptions) -> Result<TcpListener, ServeError> {
    TcpListener::bind(options.listen)
        .await
        .map_err(|e| ServeError(format!("cannot listen on {}: {e}", options.listen)))
}

/// Aborts a background task when dropped (the signer's resync loop ends with `serve`).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A response that ends the connection after it is written.
fn closing(mut response: http::Response<Full<Bytes>>) -> http::Response<Full<Bytes>> {
    response.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}

impl Signer {
    /// A signer trusting the front proxy as `requestheader` says (`resource_version`: of the
    /// ConfigMap it was read from, when known). Fails when the serving certificate or the
    /// front-proxy CA cannot be used.
    pub fn new(
        cluster: Cluster,
        flavor: Flavor,
        requestheader: RequestHeaderConfig,
        resource_version: Option<String>,
        options: ServeOptions,
        audit: AuditSink,
    ) -> Result<Self, ServeError> {
        let settings = Ok(requestheader);
        let acceptor = TlsAcceptor::from(Arc::new(tls_config(&options, &settings)?));
        Ok(Signer {
            cluster,
            flavor,
            ca_namespace: options.ca_namespace.clone(),
            limits: options.limits.clone(),
            min_rsa_bits: options.min_rsa_bits,
            audit,
            trust: RwLock::new(Arc::new(Trust {
                settings,
                acceptor,
                resource_version,
            })),
            reviews: review::ReviewCache::default(),
            options,
        })
    }

    fn trust(&self) -> Arc<Trust> {
        self.trust.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Re-read the front-proxy settings when their ConfigMap changed. Unusable settings
    /// (malformed lists, no CA) replace the trust too: the signer then refuses every request
    /// until they are fixed, rather than keep trusting what the API server stopped vouching for.
    async fn resync(&self) {
        let current = self.trust();
        let (settings, version) =
            match requestheader::RequestHeaderConfig::read(&self.cluster).await {
                Ok(read) => read,
                Err(e) => {
                    // Unreadable (API server away): keep the last good settings.
                    (self.audit)(json!({"event": "requestheader-unreadable", "error": e}));
                    return;
                }
            };
        if version.is_some() && version == current.resource_version {
            return;
        }
        let built = settings.and_then(|s| {
            let ok = Ok(s);
            tls_config(&self.options, &ok)
                .map(|config| (ok, config))
                .map_err(|e| e.0)
        });
        let (settings, config) = match built {
            Ok(built) => built,
            Err(why) => {
                let settings = Err(why);
                match tls_config(&self.options, &settings) {
                    Ok(config) => (settings, config),
                    Err(e) => {
                        (self.audit)(json!({"event": "requestheader-unusable", "error": e.0}));
                        return;
                    }
                }
            }
        };
        (self.audit)(match &settings {
            Ok(_) => json!({"event": "requestheader-reloaded", "resourceVersion": version}),
            Err(why) => json!({"event": "requestheader-invalid", "resourceVersion": version,
                "error": why, "effect": "every request is refused until the settings are fixed"}),
        });
        *self.trust.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Trust {
            settings,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            resource_version: version,
        });
    }

    /// Serve on `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> Result<(), ServeError> {
        let _resync = {
            let signer = self.clone();
            AbortOnDrop(tokio::spawn(async move {
                let mut tick = tokio::time::interval(signer.options.requestheader_resync);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    signer.resync().await;
                }
            }))
        };
        let slots = Arc::new(Semaphore::new(self.options.connections.max_connections));
        loop {
            let (tcp, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    // EMFILE and the like: wait instead of spinning.
                    (self.audit)(json!({"event": "accept-error", "error": e.to_string()}));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Answers are small and written in more than one piece (TLS records, headers and
            // body): without TCP_NODELAY, Nagle's algorithm holds the last piece for the
            // peer's delayed ACK (40 ms on Linux).
            let _ = tcp.set_nodelay(true);
            // Over the cap: closed at once (the API server's transport retries elsewhere).
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                drop(tcp);
                continue;
            };
            let signer = self.clone();
            tokio::spawn(async move {
                signer.connection(tcp).await;
                drop(slot);
            });
        }
    }

    async fn connection(self: Arc<Self>, tcp: tokio::net::TcpStream) {
        let limits = self.options.connections.clone();
        let trust = self.trust();
        let Ok(Ok(tls)) = tokio::time::timeout(limits.handshake, trust.acceptor.accept(tcp)).await
        else {
            return;
        };
        // The chain the handshake verified (only requested when the settings are usable).
        let chain: Arc<Vec<CertificateDer<'static>>> = Arc::new(
            tls.get_ref()
                .1
                .peer_certificates()
                .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                .unwrap_or_default(),
        );
        let service = hyper::service::service_fn(move |req| {
            let signer = self.clone();
            let handshake_trust = trust.clone();
            let chain = chain.clone();
            async move {
                let current = signer.trust();
                let verified = if Arc::ptr_eq(&current, &handshake_trust) {
                    !chain.is_empty()
                } else {
                    // The settings changed since the handshake: the certificate must chain
                    // to the CA in force now.
                    reverify(&current, &chain)
                };
                let client_cn = chain
                    .first()
                    .filter(|_| verified)
                    .and_then(|cert| requestheader::common_name(cert));
                let deadline = signer.options.connections.request;
                let response = tokio::time::timeout(
                    deadline,
                    signer.respond(&current, client_cn.as_deref(), req),
                )
                .await
                .unwrap_or_else(|_| {
                    closing(issue::status_response(
                        504,
                        "Timeout",
                        &format!(
                            "the request did not complete within {}s",
                            deadline.as_secs()
                        ),
                    ))
                });
                Ok::<_, std::convert::Infallible>(response)
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.headers)
            .max_buf_size(MAX_BODY)
            .serve_connection(TokioIo::new(tls), service)
            .await;
    }

    async fn respond(
        &self,
        trust: &Trust,
        client_cn: Option<&str>,
        req: http::Request<Incoming>,
    ) -> http::Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let path = parts.uri.path();
        match path {
            "/healthz" | "/livez" => {
                return closing(http::Response::new(Full::new(Bytes::from_static(b"ok"))));
            }
            "/readyz" => {
                return closing(match &trust.settings {
                    Ok(_) => http::Response::new(Full::new(Bytes::from_static(b"ok"))),
                    Err(why) => issue::status_response(
                        503,
                        "ServiceUnavailable",
                        &format!("the front-proxy settings are unusable: {why}"),
                    ),
                });
            }
            _ => {}
        }
        // Who is asking, from the headers alone: nothing more of an unauthenticated request
        // is read, and its connection ends with the answer.
        let who = match &trust.settings {
            Ok(settings) => settings.authenticate(client_cn, &parts.headers),
            Err(why) => Err(format!(
                "the signer refuses to serve: the API server's front-proxy settings (ConfigMap kube-system/extension-apiserver-authentication) are unusable: {why}"
            )),
        };
        let who = match who {
            Ok(who) => who,
            Err(why) => {
                (self.audit)(json!({"event": "unauthenticated", "path": path, "reason": why}));
                return closing(issue::status_response(
                    401,
                    "Unauthorized",
                    &format!("Unauthorized: {why}"),
                ));
            }
        };
        let too_large = || {
            closing(issue::status_response(
                413,
                "RequestEntityTooLarge",
                &format!("request body over {MAX_BODY} bytes"),
            ))
        };
        if body
            .size_hint()
            .lower()
            .try_into()
            .is_ok_and(|len: usize| len > MAX_BODY)
        {
            return too_large();
        }
        let deadline = self.options.connections.body;
        let body =
            match tokio::time::timeout(deadline, Limited::new(body, MAX_BODY).collect()).await {
                Ok(Ok(collected)) => collected.to_bytes(),
                Ok(Err(e)) if e.is::<LengthLimitError>() => return too_large(),
                Ok(Err(e)) => {
                    return closing(issue::status_response(
                        400,
                        "BadRequest",
                        &format!("reading the request body: {e}"),
                    ));
                }
                Err(_) => {
                    return closing(issue::status_response(
                        408,
                        "Timeout",
                        &format!(
                            "the request body did not arrive within {}s",
                            deadline.as_secs()
                        ),
                    ));
                }
            };
        self.handle(&who, &parts, &body).await
    }
}

/// Whether `chain` (end entity first) chains to the front-proxy CA of `trust` now.
fn reverify(trust: &Trust, chain: &[CertificateDer<'static>]) -> bool {
    let (Ok(settings), Some((end_entity, intermediates))) = (&trust.settings, chain.split_first())
    else {
        return false;
    };
    let Ok(verifier) = client_verifier(settings) else {
        return false;
    };
    verifier
        .verify_client_cert(end_entity, intermediates, rustls_pki_types::UnixTime::now())
        .is_ok()
}
