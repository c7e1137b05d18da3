//! The aggregator's proxy to an aggregated API server (handler_proxy.go and the
//! UpgradeAwareHandler it uses): HTTPS verified against the APIService's `caBundle` for
//! `NAME.NAMESPACE.svc`, the front-proxy client certificate, the caller's identity in
//! `X-Remote-*` headers (client-go transport `SetAuthProxyHeaders`) instead of its credentials,
//! and the response streamed back as it comes.

use super::Backend;
use crate::core::auth::User;
use crate::core::tls::FrontProxy;
use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use std::sync::Arc;
use std::time::Duration;

/// Where a proxied request goes.
pub struct Target {
    /// `IP:PORT` of the endpoint.
    pub addr: String,
    /// TLS server name to verify.
    pub server_name: String,
    /// TLS client configuration.
    pub tls: Arc<rustls::ClientConfig>,
}

/// What Go's `http.Error` writes: the text and a newline, `text/plain; charset=utf-8`,
/// `X-Content-Type-Options: nosniff`.
pub fn http_error(code: StatusCode, text: &str) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{text}\n"),
    )
        .into_response()
}

/// The TLS client configuration for `backend`: its `caBundle` as roots (none verified when
/// `insecure`), presenting the front-proxy client certificate when given.
pub fn client_config(
    backend: &Backend,
    front_proxy: Option<&FrontProxy>,
    insecure: bool,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&backend.ca_bundle).flatten() {
            roots.add(cert).map_err(|e| e.to_string())?;
        }
        builder.with_root_certificates(roots)
    };
    let mut config = match front_proxy {
        Some(fp) => builder
            .with_client_auth_cert(
                vec![fp.client_cert_der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(fp.client_key_der.clone())),
            )
            .map_err(|e| e.to_string())?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// `insecureSkipTLSVerify` (and the availability check, which never verifies): any server
/// certificate, signatures still checked.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Hop-by-hop headers net/http/httputil.ReverseProxy drops in both directions.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// client-go `headerKeyEscape`: bytes that are not legal in a header name, and `%`, become
/// `%XX`.
pub fn header_key_escape(key: &str) -> String {
    let legal = |b: u8| b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b);
    key.bytes()
        .map(|b| {
            if legal(b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The headers sent to the backend: the client's, minus hop-by-hop headers, its credentials
/// (the API server's authentication and impersonation filters remove `Authorization` and
/// `Impersonate-*`) and any `X-Remote-User`/`-Uid`/`-Group`/`-Extra-*` it sent, plus the
/// caller's identity as `SetAuthProxyHeaders` sets it (`X-Remote-Uid` only for a user with a
/// uid: the RemoteRequestHeaderUID gate is on by default since 1.33).
pub fn outgoing_headers(client: &HeaderMap, user: &User, host: &str) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in client {
        let n = name.as_str();
        let identity = n == "authorization"
            || n.starts_with("impersonate-")
            || matches!(n, "x-remote-user" | "x-remote-uid" | "x-remote-group")
            || n.starts_with("x-remote-extra-");
        if identity || HOP_BY_HOP.contains(&n) || n == "host" || n == "content-length" {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    set_auth_proxy_headers(&mut out, user);
    out.insert(
        header::HOST,
        HeaderValue::from_str(host).unwrap_or(HeaderValue::from_static("localhost")),
    );
    // ReverseProxy appends the client's address; every client of the emulator is local.
    out.insert("x-forwarded-for", HeaderValue::from_static("127.0.0.1"));
    out
}

/// `SetAuthProxyHeaders` (client-go transport/round_trippers.go).
pub fn set_auth_proxy_headers(headers: &mut HeaderMap, user: &User) {
    let value = |v: &str| HeaderValue::from_str(v).ok();
    if let Some(v) = value(&user.name) {
        headers.insert("x-remote-user", v);
    }
    if let Some(v) = value(&user.uid).filter(|_| !user.uid.is_empty()) {
        headers.insert("x-remote-uid", v);
    }
    for g in &user.groups {
        if let Some(v) = value(g) {
            headers.append("x-remote-group", v);
        }
    }
    for (key, values) in &user.extra {
        let name = format!("x-remote-extra-{}", header_key_escape(key)).to_ascii_lowercase();
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        for v in values.iter().filter_map(|v| value(v)) {
            headers.append(name.clone(), v);
        }
    }
}

/// Go's wording of a failed dial or TLS handshake (what `http.Transport.RoundTrip` returns and
/// the proxy's responder writes).
fn dial_error(addr: &str, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::ConnectionRefused {
        return format!("dial tcp {addr}: connect: connection refused");
    }
    if let Some(tls) = e.get_ref().and_then(|r| r.downcast_ref::<rustls::Error>()) {
        let why = match tls {
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                "x509: certificate signed by unknown authority".to_string()
            }
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            ) => "x509: certificate is not valid for the requested name".to_string(),
            rustls::Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. },
            ) => "x509: certificate has expired or is not yet valid".to_string(),
            other => other.to_string(),
        };
        return format!("tls: failed to verify certificate: {why}");
    }
    format!("dial tcp {addr}: {e}")
}

/// Sends one request to `target`; the response head, or the transport error as Go words it.
pub async fn round_trip(
    target: &Target,
    request: http::Request<Body>,
    timeout: Option<Duration>,
) -> Result<http::Response<hyper::body::Incoming>, String> {
    let work = async {
        let tcp = tokio::net::TcpStream::connect(&target.addr)
            .await
            .map_err(|e| dial_error(&target.addr, &e))?;
        // Go's net package sets TCP_NODELAY on every TCP connection (net/tcpsock.go
        // newTCPConn → setNoDelay(fd, true)), so kube-aggregator's proxy never waits on
        // Nagle's algorithm.
        let _ = tcp.set_nodelay(true);
        let name = ServerName::try_from(target.server_name.clone()).map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(target.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| dial_error(&target.addr, &e))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        sender.send_request(request).await.map_err(|e| {
            if e.is_incomplete_message() || e.is_closed() {
                "EOF".to_string()
            } else {
                e.to_string()
            }
        })
    };
    match timeout {
        Some(t) => tokio::time::timeout(t, work).await.map_err(|_| {
            "context deadline exceeded (Client.Timeout exceeded while awaiting headers)".to_string()
        })?,
        None => work.await,
    }
}

/// Proxies the request: method, path, query (re-encoded as `url.Values.Encode` does), body and
/// headers (see [`outgoing_headers`]); the backend's status, headers and body come back as
/// they stream. A transport failure is the responder's answer: `503` with the error text
/// (handler_proxy.go `responder.Error`: `http.Error(w, err.Error(), 503)`).
pub async fn forward(
    target: &Target,
    parts: &http::request::Parts,
    user: &User,
    body: Bytes,
) -> Response {
    let mut path = parts.uri.path().to_string();
    if let Some(q) = parts
        .uri
        .query()
        .map(encode_query)
        .filter(|q| !q.is_empty())
    {
        path.push('?');
        path.push_str(&q);
    }
    let mut request = http::Request::builder()
        .method(parts.method.clone())
        .uri(path)
        .body(Body::from(body))
        .expect("a valid request");
    *request.headers_mut() = outgoing_headers(&parts.headers, user, &target.addr);
    match round_trip(target, request, None).await {
        Ok(resp) => {
            let (mut head, incoming) = resp.into_parts();
            for h in HOP_BY_HOP {
                head.headers.remove(*h);
            }
            Response::from_parts(head, Body::new(incoming))
        }
        Err(e) => http_error(StatusCode::SERVICE_UNAVAILABLE, &e),
    }
}

/// Go's `url.Values.Encode` of a raw query: keys sorted, values in order, `QueryEscape`d.
pub fn encode_query(raw: &str) -> String {
    let mut pairs: Vec<(String, String)> = raw
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (unescape(k), unescape(v))
        })
        .collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", query_escape(k), query_escape(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b' ' => "+".to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_header_escaping() {
        assert_eq!(
            encode_query("watch=1&b=x%20y&a=%2Fp"),
            "a=%2Fp&b=x+y&watch=1"
        );
        assert_eq!(
            header_key_escape("authentication.kubernetes.io/credential-id"),
            "authentication.kubernetes.io%2Fcredential-id"
        );
        assert_eq!(header_key_escape("a%b"), "a%25b");
    }
}
