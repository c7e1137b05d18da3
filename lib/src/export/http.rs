//! A small HTTPS client for export servers, on the same hyper/rustls stack kube uses: TLS
//! verified against the export's CA merged with the kubeconfig's (or not at all with
//! `--insecure`), credentials as the platform wants them (KubeVirt's per-export token header,
//! or the kubeconfig's own credentials for Deckhouse), one connection per request (a request
//! is a whole volume or the rest of it).
//!
//! The kubeconfig's credentials are sent directly only to the API server's own host (a URL an
//! export object names is not trusted with them), through `pods/portforward` only to the
//! exporter pod, and never without TLS verification: `--insecure` is refused with them.
//!
//! Plain `http://` URLs (Deckhouse's in-cluster upload URL) are spoken only through
//! `pods/portforward` (the API server connection is TLS; the clear text stays inside the
//! cluster) and never with credentials.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use kube::client::ConfigExt;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tower::ServiceExt;

/// Time to connect and get response headers.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// Connecting, TLS or the request failed before a response (retryable unless TLS
    /// verification failed).
    Connect {
        /// One line.
        message: String,
        /// Worth retrying.
        retryable: bool,
    },
    /// The server answered with an error status.
    Status {
        /// HTTP status.
        code: u16,
        /// The body's first line.
        message: String,
    },
    /// The connection broke while reading the body (retryable).
    Body(String),
}

impl HttpError {
    /// Whether retrying could help: network errors, 5xx, 408 and 429.
    pub fn retryable(&self) -> bool {
        match self {
            HttpError::Connect { retryable, .. } => *retryable,
            HttpError::Status { code, .. } => *code >= 500 || *code == 408 || *code == 429,
            HttpError::Body(_) => true,
        }
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Connect { message, .. } => f.write_str(message),
            HttpError::Status { code, message } => {
                let reason = StatusCode::from_u16(*code)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("");
                write!(f, "the export server answered {code} {reason}")?;
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            HttpError::Body(m) => write!(f, "the transfer broke off: {m}"),
        }
    }
}

/// How requests are authenticated.
#[derive(Clone)]
pub enum Credentials {
    /// A fixed header (KubeVirt: `x-kubevirt-export-token`).
    Header(HeaderName, HeaderValue),
    /// The kubeconfig's credentials (bearer token, basic, exec plugin, client certificate).
    Kube(Box<kube::Config>),
    /// None: the URL itself is the secret (Deckhouse's upload URLs).
    None,
}

/// How the export server is reached.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Route {
    /// Connect to the URL's host directly.
    Direct,
    /// Through a port-forward to a pod (`pods/portforward`), TLS still to the URL's host name.
    PortForward {
        /// Pods API in the export's namespace.
        pods: kube::Api<k8s_openapi::api::core::v1::Pod>,
        /// The export server's pod.
        pod: String,
        /// Its port.
        port: u16,
    },
}

/// Why `--insecure` is refused where the kubeconfig's credentials would be sent.
pub const INSECURE_WITH_CREDENTIALS: &str = "--insecure cannot be used here: the export server \
takes your cluster credentials, and kubectl vm does not send them to an unverified server (the \
export's CA is trusted without it)";

/// A client for one export server.
#[derive(Clone)]
pub struct HttpClient {
    tls: Arc<rustls::ClientConfig>,
    credentials: Credentials,
    route: Route,
    /// The API server's host (lowercase, without brackets): the only host the kubeconfig's
    /// credentials go to directly.
    api_host: String,
}

/// A URL host as compared: lowercase, IPv6 brackets removed.
fn host_key(host: &str) -> String {
    host.trim_matches(['[', ']']).to_ascii_lowercase()
}

/// Whether `url` is served on the API server's own host: the only host the kubeconfig's
/// credentials go to directly. Unreadable URLs are not.
pub fn on_api_server_host(config: &kube::Config, url: &str) -> bool {
    let api_host = host_key(config.cluster_url.host().unwrap_or_default());
    url.parse::<Uri>()
        .ok()
        .and_then(|uri| uri.host().map(host_key))
        .is_some_and(|host| host == api_host)
}

impl HttpClient {
    /// A client trusting `ca_pem` (the export's CA) plus the kubeconfig's CA, or nothing at
    /// all when `insecure`.
    pub fn new(
        config: &kube::Config,
        ca_pem: &str,
        insecure: bool,
        credentials: Credentials,
        route: Route,
    ) -> crate::Result<HttpClient> {
        HttpClient::build(config, ca_pem, insecure, credentials, route, false)
    }

    /// [`HttpClient::new`] also trusting the system's CAs (`SSL_CERT_FILE`/`SSL_CERT_DIR` or the
    /// usual bundle), as `curl` does: for an ingress whose certificate no cluster object
    /// publishes.
    pub fn with_system_roots(
        config: &kube::Config,
        ca_pem: &str,
        insecure: bool,
        credentials: Credentials,
        route: Route,
    ) -> crate::Result<HttpClient> {
        HttpClient::build(config, ca_pem, insecure, credentials, route, true)
    }

    fn build(
        config: &kube::Config,
        ca_pem: &str,
        insecure: bool,
        credentials: Credentials,
        route: Route,
        system_roots: bool,
    ) -> crate::Result<HttpClient> {
        if insecure && matches!(credentials, Credentials::Kube(_)) {
            return Err(crate::Error::Usage(INSECURE_WITH_CREDENTIALS.into()));
        }
        let api_host = host_key(config.cluster_url.host().unwrap_or_default());
        let mut config = config.clone();
        let mut roots = config.root_cert.clone().unwrap_or_default();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| {
                crate::Error::Transfer(format!("the export's CA certificate is unreadable: {e}"))
            })?;
            roots.push(cert.to_vec());
        }
        if system_roots {
            // Unreadable system certificates are skipped, as curl skips them.
            let native = rustls_native_certs::load_native_certs();
            roots.extend(native.certs.iter().map(|c| c.to_vec()));
        }
        config.root_cert = (!roots.is_empty()).then_some(roots);
        config.root_cert_file = None;
        config.accept_invalid_certs = insecure;
        let mut tls = config.rustls_client_config().map_err(|e| {
            crate::Error::Transfer(format!("cannot set up TLS for the export server: {e}"))
        })?;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(HttpClient {
            tls: Arc::new(tls),
            credentials,
            route,
            api_host,
        })
    }

    /// The credentials' headers, fetched anew for every request (exec plugins refresh).
    async fn auth_headers(&self) -> Result<Vec<(HeaderName, HeaderValue)>, HttpError> {
        match &self.credentials {
            Credentials::Header(name, value) => Ok(vec![(name.clone(), value.clone())]),
            Credentials::None => Ok(vec![]),
            Credentials::Kube(config) => {
                let layer = config.auth_layer().map_err(|e| HttpError::Connect {
                    message: format!("cannot get credentials: {e}"),
                    retryable: false,
                })?;
                let Some(layer) = layer else {
                    return Ok(vec![]);
                };
                // Run the layer over a service that just returns the headers it was given.
                let probe = tower::service_fn(|req: Request<Empty<Bytes>>| async move {
                    Ok::<_, tower::BoxError>(Response::new(req.headers().clone()))
                });
                let headers: HeaderMap = tower::Layer::layer(&layer, probe)
                    .oneshot(Request::new(Empty::new()))
                    .await
                    .map(Response::into_body)
                    .map_err(|e| HttpError::Connect {
                        message: format!("cannot get credentials: {e}"),
                        retryable: false,
                    })?;
                Ok(headers
                    .iter()
                    .filter(|(n, _)| *n == http::header::AUTHORIZATION)
                    .map(|(n, v)| (n.clone(), v.clone()))
                    .collect())
            }
        }
    }

    /// Sends one request on a new connection and returns the response headers with a body to
    /// read.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, String)],
    ) -> Result<Response<Incoming>, HttpError> {
        self.send_body(method, url, headers, Empty::<Bytes>::new(), true)
            .await
    }

    /// [`HttpClient::send`] with a request body (streamed as it is produced). With
    /// `header_timeout` the response must begin within 30 s; without, the server may take as
    /// long as it needs (an upload answered only once the data is processed).
    pub async fn send_body<B>(
        &self,
        method: Method,
        url: &str,
        headers: &[(HeaderName, String)],
        body: B,
        header_timeout: bool,
    ) -> Result<Response<Incoming>, HttpError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let uri: Uri = url.parse().map_err(|e| HttpError::Connect {
            message: format!("bad URL {url:?}: {e}"),
            retryable: false,
        })?;
        let host = uri.host().unwrap_or_default().to_string();
        let plain = uri.scheme_str() == Some("http");
        let port = uri.port_u16().unwrap_or(if plain { 80 } else { 443 });
        self.check_destination(url, &host, plain)?;
        let stream = self.open_stream(&host, port).await?;
        let mut sender = self.http_connection(stream, &host, plain).await?;
        let path = uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(
                http::header::HOST,
                uri.authority().map(|a| a.as_str()).unwrap_or(&host),
            )
            .header(
                http::header::USER_AGENT,
                concat!("kubectl-vm/", env!("CARGO_PKG_VERSION")),
            );
        for (name, value) in self.auth_headers().await? {
            request = request.header(name, value);
        }
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request.body(body).map_err(|e| HttpError::Connect {
            message: format!("cannot build the request: {e}"),
            retryable: false,
        })?;
        let limit = if header_timeout {
            CONNECT_TIMEOUT
        } else {
            Duration::from_secs(365 * 24 * 3600)
        };
        let response = tokio::time::timeout(limit, sender.send_request(request))
            .await
            .map_err(|_| connect_err(format!("{host} sent no response in time")))?
            .map_err(|e| connect_err(format!("request to {host} failed: {e}")))?;
        if response.status().is_success() || response.status() == StatusCode::RANGE_NOT_SATISFIABLE
        {
            return Ok(response);
        }
        let code = response.status().as_u16();
        let message = first_line(response).await;
        Err(HttpError::Status { code, message })
    }

    /// Refuses plain HTTP except through a port-forward without credentials, and cluster
    /// credentials for any host but the API server's.
    fn check_destination(&self, url: &str, host: &str, plain: bool) -> Result<(), HttpError> {
        if plain
            && (!matches!(self.route, Route::PortForward { .. })
                || !matches!(self.credentials, Credentials::None))
        {
            return Err(HttpError::Connect {
                message: format!(
                    "{url} is plain HTTP: kubectl vm speaks it only through a port-forward and without credentials"
                ),
                retryable: false,
            });
        }
        if matches!(self.credentials, Credentials::Kube(_))
            && matches!(self.route, Route::Direct)
            && host_key(host) != self.api_host
        {
            return Err(HttpError::Connect {
                message: format!(
                    "the export is served at {host}, which is not the API server's host ({}): \
                     kubectl vm sends your cluster credentials only to the API server",
                    self.api_host
                ),
                retryable: false,
            });
        }
        Ok(())
    }

    /// A byte stream to `host:port`: a TCP connection, or a port-forward to the pod.
    async fn open_stream(&self, host: &str, port: u16) -> Result<Box<dyn Io>, HttpError> {
        Ok(match &self.route {
            Route::Direct => {
                let tcp = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port)),
                )
                .await
                .map_err(|_| connect_err(format!("connecting to {host}:{port} timed out")))?
                .map_err(|e| connect_err(format!("cannot connect to {host}:{port}: {e}")))?;
                let _ = tcp.set_nodelay(true);
                Box::new(tcp)
            }
            Route::PortForward { pods, pod, port } => {
                let mut forwarder = pods.portforward(pod, &[*port]).await.map_err(|e| {
                    connect_err(format!("cannot port-forward to pod {pod}:{port}: {e}"))
                })?;
                let stream = forwarder.take_stream(*port).ok_or_else(|| {
                    connect_err(format!("the port-forward to pod {pod} gave no stream"))
                })?;
                // The forwarder's task lives as long as the stream is used.
                tokio::spawn(async move {
                    let _ = forwarder.join().await;
                });
                Box::new(stream)
            }
        })
    }

    /// An HTTP/1.1 connection over `stream`, through TLS verified against the client's
    /// roots unless `plain`.
    async fn http_connection<B>(
        &self,
        stream: Box<dyn Io>,
        host: &str,
        plain: bool,
    ) -> Result<SendRequest<B>, HttpError>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if plain {
            handshake(stream, host).await
        } else {
            let server_name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                .map_err(|e| HttpError::Connect {
                    message: format!("bad host name {host:?}: {e}"),
                    retryable: false,
                })?;
            let connector = tokio_rustls::TlsConnector::from(self.tls.clone());
            let tls = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(server_name, stream))
                .await
                .map_err(|_| connect_err(format!("TLS handshake with {host} timed out")))?
                .map_err(|e| {
                    let certificate = e
                        .get_ref()
                        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                        .is_some_and(|r| matches!(r, rustls::Error::InvalidCertificate(_)));
                    HttpError::Connect {
                        message: if certificate {
                            format!(
                                "the export server's certificate is not trusted: {e} (--insecure skips verification)"
                            )
                        } else {
                            format!("TLS handshake with {host} failed: {e}")
                        },
                        retryable: !certificate,
                    }
                })?;
            handshake(tls, host).await
        }
    }
}

/// A connection failure worth retrying (a timeout, a refused or broken connection).
fn connect_err(message: String) -> HttpError {
    HttpError::Connect {
        message,
        retryable: true,
    }
}

/// An HTTP/1.1 connection over `io` (its task runs until the connection ends).
async fn handshake<T, B>(io: T, host: &str) -> Result<SendRequest<B>, HttpError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (sender, connection) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(1 << 20)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| HttpError::Connect {
            message: format!("HTTP handshake with {host} failed: {e}"),
            retryable: true,
        })?;
    tokio::spawn(async move {
        // Errors surface on the response body.
        let _ = connection.await;
    });
    Ok(sender)
}

/// A byte stream a TLS connection can run over.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The first line of an error body (at most 64 KiB read).
async fn first_line(response: Response<Incoming>) -> String {
    use http_body_util::BodyExt;
    let limited = http_body_util::Limited::new(response.into_body(), 64 * 1024);
    let bytes = tokio::time::timeout(Duration::from_secs(5), limited.collect())
        .await
        .ok()
        .and_then(Result::ok)
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    String::from_utf8_lossy(&bytes)
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .chars()
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain HTTP is refused before any connection unless it goes through a port-forward
    /// without credentials.
    #[tokio::test]
    async fn plain_http_only_through_a_port_forward_and_without_credentials() {
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let direct = HttpClient::new(&config, "", false, Credentials::None, Route::Direct).unwrap();
        let kube_creds = HttpClient::new(
            &config,
            "",
            false,
            Credentials::Kube(Box::new(config.clone())),
            Route::Direct,
        )
        .unwrap();
        for client in [direct, kube_creds] {
            match client
                .send(Method::GET, "http://127.0.0.1:6443/upload", &[])
                .await
            {
                Err(HttpError::Connect { message, retryable }) => {
                    assert!(message.contains("plain HTTP"), "{message}");
                    assert!(!retryable);
                }
                other => panic!("{:?}", other.map(|r| r.status())),
            }
        }
    }
}
