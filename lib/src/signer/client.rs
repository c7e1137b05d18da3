//! Asking the signer for certificates, through the API server like any other request, and
//! telling whether the cluster has a signer at all.

use russh::keys::PublicKey;
use russh::keys::ssh_key::Certificate;

use super::{
    APISERVICE_NAME, CertificateRequest, CertificateRequestSpec, GROUP, HOST_CERTIFICATE, KIND,
    USER_CERTIFICATE, VERSION,
};
use crate::cluster::Cluster;
use crate::error::{Action, Error};
use crate::flavor::Platform;

/// Where certificates come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The signer's APIService is registered: certificates come from it, and the CA Secret is
    /// never read.
    Signer,
    /// No signer: whoever may read the CA Secret signs with it (the unsafe mode).
    Direct,
}

/// The notice printed when the direct mode is used.
pub const DIRECT_MODE_NOTICE: &str = "this cluster has no SSH signer, so the CA private key was read from its Secret (the unsafe mode: anyone who can read it can sign for any VM); install the signer with `kubectl vm ca init --signer --image IMAGE`";

/// Why the signer gave no certificate.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    /// The API server could not reach the signer (503 and friends).
    #[error(
        "the SSH certificate signer (APIService {APISERVICE_NAME}) is unavailable: {message} ({code}); an administrator can check `kubectl get apiservice {APISERVICE_NAME}` and the signer pods"
    )]
    Unavailable {
        /// HTTP status.
        code: u16,
        /// The API server's message.
        message: String,
    },
    /// The API server (RBAC) or the signer (policy) refused: their message and reason.
    #[error("{reason}: {message}")]
    Refused {
        /// HTTP status.
        code: u16,
        /// Status reason (`Forbidden`, `Invalid`, `NotFound`, …).
        reason: String,
        /// The server's own message.
        message: String,
    },
    /// The answer held no usable certificate.
    #[error("the SSH certificate signer answered without a usable certificate: {0}")]
    BadAnswer(String),
    /// Any other failure reaching the API server.
    #[error(transparent)]
    Api(#[from] Error),
}

impl SignerError {
    fn from_kube(err: kube::Error, cluster: &Cluster, action: &Action) -> Self {
        match err {
            kube::Error::Api(status) if matches!(status.code, 502..=504) => {
                SignerError::Unavailable {
                    code: status.code,
                    message: crate::error::one_line(status.message.trim()),
                }
            }
            kube::Error::Api(status) => SignerError::Refused {
                code: status.code,
                reason: if status.reason.is_empty() {
                    status.code.to_string()
                } else {
                    status.reason.clone()
                },
                message: crate::error::one_line(status.message.trim()),
            },
            other => SignerError::Api(cluster.error(other, action)),
        }
    }
}

/// Whether the cluster has a signer: its group in the discovery `platform` already read, or
/// (without discovery data) one GET of the group.
pub async fn mode(cluster: &Cluster, platform: Option<&Platform>) -> Result<Mode, Error> {
    if let Some(platform) = platform.filter(|p| !p.groups.is_empty()) {
        return Ok(if platform.group(GROUP).is_some() {
            Mode::Signer
        } else {
            Mode::Direct
        });
    }
    let request = http::Request::get(format!("/apis/{GROUP}"))
        .body(Vec::new())
        .map_err(|e| Error::Internal(e.to_string()))?;
    match cluster.client.request_text(request).await {
        Ok(_) => Ok(Mode::Signer),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Mode::Direct),
        Err(e) => Err(cluster.error(e, &Action::discovery())),
    }
}

/// The pauses between the client's tries of an issuance that failed in a way another signer
/// replica may not ([`is_transient`]): 0.25 s doubling to 2 s, five tries over about 4 s. The API
/// server picks an endpoint at random for each request and never retries itself
/// (kube-aggregator's proxy answers 503 for a dead replica), and a replica that has just gone
/// stays listed until its pod is marked not ready and the endpoints controller drops it (a
/// second or two for a killed container, longer for a hung one): with two replicas each try
/// has an even chance of meeting the dead one, so one retry a second later left a quarter of
/// those issuances failed while the endpoint stayed.
pub const RETRY_PAUSES: [std::time::Duration; 4] = [
    std::time::Duration::from_millis(250),
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(2),
];

/// Whether an issuance that failed with `err` is worth one more request: the aggregator could
/// not reach the replica it chose or lost it mid-answer (502, 503, 504: a dead or restarting
/// replica, which another replica may not be), or the connection carrying the request broke.
/// Refusals (RBAC, the signer's policy, bad input) and other errors are final.
pub fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => matches!(status.code, 502..=504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

async fn post(
    cluster: &Cluster,
    namespace: &str,
    vm: &str,
    subresource: &str,
    spec: CertificateRequestSpec,
) -> Result<CertificateRequest, SignerError> {
    let body = CertificateRequest {
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.into(),
        spec,
        status: None,
    };
    let body = serde_json::to_vec(&body).map_err(|e| Error::Internal(e.to_string()))?;
    let request = || {
        http::Request::post(format!(
            "/apis/{GROUP}/{VERSION}/namespaces/{namespace}/virtualmachines/{vm}/{subresource}"
        ))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.clone())
        .map_err(|e| Error::Internal(e.to_string()))
    };
    let action = Action::new(
        "create",
        format!("virtualmachines/{subresource}.{GROUP}"),
        "virtualmachine",
    )
    .named(vm)
    .in_namespace(Some(namespace));
    // Issuing twice is harmless (two certificates for the same key, each audited), so a
    // transient failure is tried again after each pause; the last answer is final.
    let mut answer = cluster
        .client
        .request::<CertificateRequest>(request()?)
        .await;
    for pause in RETRY_PAUSES {
        match &answer {
            Err(e) if is_transient(e) => {
                tokio::time::sleep(pause).await;
                answer = cluster
                    .client
                    .request::<CertificateRequest>(request()?)
                    .await;
            }
            _ => break,
        }
    }
    answer.map_err(|e| SignerError::from_kube(e, cluster, &action))
}

fn certificate_of(answer: CertificateRequest, key: &PublicKey) -> Result<Certificate, SignerError> {
    let status = answer
        .status
        .ok_or_else(|| SignerError::BadAnswer("no status".into()))?;
    let certificate = Certificate::from_openssh(status.certificate.trim())
        .map_err(|e| SignerError::BadAnswer(e.to_string()))?;
    if certificate.public_key() != key.key_data() {
        return Err(SignerError::BadAnswer(
            "the certificate is for another key".into(),
        ));
    }
    Ok(certificate)
}

/// A user certificate for `key` to log in to VM `vm` in `namespace`, as `spec` asks.
pub async fn user_certificate(
    cluster: &Cluster,
    namespace: &str,
    vm: &str,
    key: &PublicKey,
    mut spec: CertificateRequestSpec,
) -> Result<Certificate, SignerError> {
    spec.public_key = key
        .to_openssh()
        .map_err(|e| Error::Internal(e.to_string()))?;
    let answer = post(cluster, namespace, vm, USER_CERTIFICATE, spec).await?;
    certificate_of(answer, key)
}

/// A host certificate for the host key `key` of VM `vm` in `namespace`.
pub async fn host_certificate(
    cluster: &Cluster,
    namespace: &str,
    vm: &str,
    key: &PublicKey,
) -> Result<Certificate, SignerError> {
    let spec = CertificateRequestSpec {
        public_key: key
            .to_openssh()
            .map_err(|e| Error::Internal(e.to_string()))?,
        ..Default::default()
    };
    let answer = post(cluster, namespace, vm, HOST_CERTIFICATE, spec).await?;
    certificate_of(answer, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("m", reason)
                .with_code(code)
                .boxed(),
        )
    }

    /// Only what another replica (or another connection) may not fail again is retried: the
    /// aggregator's 502/503/504; never a refusal or a malformed answer.
    #[test]
    fn only_unreachable_replicas_are_retried() {
        for code in [502, 503, 504] {
            assert!(is_transient(&api(code, "ServiceUnavailable")), "{code}");
        }
        for (code, reason) in [
            (400, "BadRequest"),
            (401, "Unauthorized"),
            (403, "Forbidden"),
            (404, "NotFound"),
            (422, "Invalid"),
            (429, "TooManyRequests"),
            (500, "InternalError"),
        ] {
            assert!(!is_transient(&api(code, reason)), "{code}");
        }
        let parse = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        assert!(!is_transient(&kube::Error::SerdeError(parse)));
    }
}
