//! A fresh CA and a serving certificate for 127.0.0.1/localhost, generated at every start, and
//! the rustls server configuration (HTTP/2 and HTTP/1.1 via ALPN, like kube-apiserver).

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::sync::Arc;

/// The generated certificates.
pub struct Certs {
    /// PEM of the CA certificate (goes into the kubeconfig).
    pub ca_pem: String,
    /// TLS server configuration using the serving certificate.
    pub server_config: Arc<rustls::ServerConfig>,
}

/// A fresh self-signed CA named `common_name` and the issuer to sign with it.
fn new_ca(common_name: &str) -> Result<(rcgen::Certificate, Issuer<'static, KeyPair>), String> {
    let err = |e: rcgen::Error| e.to_string();
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
    Ok((ca_cert, Issuer::new(ca_params, ca_key)))
}

/// Generates the CA and serving certificate.
pub fn generate() -> Result<Certs, String> {
    generate_for(&["127.0.0.1", "localhost"], "kube-apiserver")
}

/// A fresh CA and a serving certificate for `names` (IP addresses become IP SANs) with
/// common name `common_name`.
pub fn generate_for(names: &[&str], common_name: &str) -> Result<Certs, String> {
    let err = |e: rcgen::Error| e.to_string();
    let (ca_cert, issuer) = new_ca("kubevm-emulator-ca")?;

    // rcgen turns "127.0.0.1" into an IP SAN.
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .map_err(err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let key = KeyPair::generate().map_err(err)?;
    let cert = params.signed_by(&key, &issuer).map_err(err)?;

    let chain = vec![CertificateDer::from(cert.der().to_vec())];
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(chain, key_der)
    .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Certs {
        ca_pem: ca_cert.pem(),
        server_config: Arc::new(config),
    })
}

/// The front-proxy identity the aggregator presents to aggregated API servers (what kubeadm
/// generates as `front-proxy-ca` and `front-proxy-client`, kube-apiserver's
/// `--requestheader-client-ca-file` and `--proxy-client-cert-file`/`--proxy-client-key-file`).
#[derive(Clone)]
pub struct FrontProxy {
    /// PEM of the front-proxy CA (published as `requestheader-client-ca-file`).
    pub ca_pem: String,
    /// PEM of the client certificate, `CN=front-proxy-client`, signed by the front-proxy CA.
    pub client_cert_pem: String,
    /// PEM (PKCS#8) of the client certificate's key.
    pub client_key_pem: String,
    /// DER of the client certificate.
    pub client_cert_der: CertificateDer<'static>,
    /// DER (PKCS#8) of its key.
    pub client_key_der: Vec<u8>,
}

/// The common name the aggregator's client certificate carries (`requestheader-allowed-names`).
pub const FRONT_PROXY_CLIENT_CN: &str = "front-proxy-client";

/// Generates a front-proxy CA and its `front-proxy-client` client certificate.
pub fn generate_front_proxy() -> Result<FrontProxy, String> {
    use rcgen::ExtendedKeyUsagePurpose;
    let err = |e: rcgen::Error| e.to_string();
    let (ca_cert, issuer) = new_ca("front-proxy-ca")?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, FRONT_PROXY_CLIENT_CN);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().map_err(err)?;
    let cert = params.signed_by(&key, &issuer).map_err(err)?;
    Ok(FrontProxy {
        ca_pem: ca_cert.pem(),
        client_cert_pem: cert.pem(),
        client_key_pem: key.serialize_pem(),
        client_cert_der: CertificateDer::from(cert.der().to_vec()),
        client_key_der: key.serialize_der(),
    })
}
