//! A small aggregated API server for the aggregation tests: HTTPS with an rcgen serving
//! certificate for `NAME.NAMESPACE.svc`, client certificates required and verified against
//! the front-proxy CA (`requestheader-client-ca-file`), and every request echoed back as JSON
//! (method, path, query, headers, body) except the discovery document of its group/version.

use axum::body::Bytes;
use axum::extract::Request;
use axum::response::IntoResponse;
use base64::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use std::sync::Arc;

pub const GROUP: &str = "ssh.kubevm.io";
pub const VERSION: &str = "v1alpha1";

pub struct Backend {
    pub port: u16,
    /// base64 of the PEM of the CA that signed the serving certificate (for `caBundle`).
    pub ca_bundle: String,
    task: tokio::task::JoinHandle<()>,
}

impl Backend {
    /// Serves until [`Backend::stop`]; `client_ca_pem` verifies the aggregator's certificate.
    pub async fn start(service: &str, namespace: &str, client_ca_pem: &str) -> Backend {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("{service}-ca"));
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::from_params(&ca_params, &ca_key);
        let params = CertificateParams::new(vec![format!("{service}.{namespace}.svc")]).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.into(),
            provider.clone(),
        )
        .build()
        .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let router = axum::Router::new().fallback(echo);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let router = router.clone();
                tokio::spawn(async move {
                    // A client without a certificate from the front-proxy CA fails here.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(router);
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Backend {
            port,
            ca_bundle: base64::engine::general_purpose::STANDARD.encode(ca.pem()),
            task,
        }
    }

    /// Stops listening (new connections are refused).
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn echo(req: Request) -> axum::response::Response {
    let (parts, body) = req.into_parts();
    if parts.uri.path() == format!("/apis/{GROUP}/{VERSION}") {
        return axum::Json(json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"),
            "resources": [{"name": "virtualmachines/sshcertificate", "singularName": "", "namespaced": true,
                "kind": "SSHCertificate", "verbs": ["create"]}]
        }))
        .into_response();
    }
    let body: Bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let headers: Vec<Value> = parts
        .headers
        .iter()
        .map(|(k, v)| json!([k.as_str(), v.to_str().unwrap_or("")]))
        .collect();
    axum::Json(json!({
        "method": parts.method.as_str(), "path": parts.uri.path(), "query": parts.uri.query(),
        "headers": headers, "body": String::from_utf8_lossy(&body),
    }))
    .into_response()
}

/// Every value of header `name` in an echo.
pub fn header_values(echo: &Value, name: &str) -> Vec<String> {
    echo["headers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h[0] == name)
        .map(|h| h[1].as_str().unwrap().to_string())
        .collect()
}
