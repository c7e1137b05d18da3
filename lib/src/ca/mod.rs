//! The platform SSH certificate authority, the part that needs no cluster access.
//!
//! The CA lives in Kubernetes as two objects in [`DEFAULT_NAMESPACE`]: the Secret
//! [`SECRET_NAME`] holds the private keys (readable by administrators only) and the ConfigMap
//! [`CONFIGMAP_NAME`] publishes the public keys, which every authenticated user may read (see
//! [`objects`]) so guests can trust them and clients can verify host certificates.
//!
//! [`CaBundle`] generates, rotates and (de)serialises the keys; [`HostKeys`] is a VM's host
//! key with a certificate signed by the CA. User certificates for `kubectl vm ssh` will be
//! issued from [`CaBundle::signing_key`] too.

mod bundle;
mod host;
pub mod krl;
pub mod migrate;
pub mod objects;
pub mod propagate;
pub mod renew;
pub mod store;

pub use bundle::{CaBundle, fingerprint, trusted_keys_from_configmap};
pub use host::{DEFAULT_HOST_CERT_VALIDITY, HostKeys, host_principals};

use thiserror::Error;

/// Namespace that holds the CA unless configured otherwise.
pub const DEFAULT_NAMESPACE: &str = crate::names::CA_NAMESPACE;
/// Name of the Secret with the CA private keys.
pub const SECRET_NAME: &str = "kubevm-ssh-ca";
/// Name of the ConfigMap with the CA public keys.
pub const CONFIGMAP_NAME: &str = "kubevm-ssh-ca";
/// Secret key holding the private keys, OpenSSH format, oldest first, concatenated.
pub const PRIVATE_KEYS_KEY: &str = "ca.keys";
/// ConfigMap key holding the public keys, one OpenSSH line each, oldest first.
pub const PUBLIC_KEYS_KEY: &str = "ca.pub";
/// ConfigMap key holding revoked host keys, one OpenSSH public key line each (`ca revoke`):
/// published with the CA keys, honoured by `kubectl vm ssh`/`scp` and printed as `@revoked`
/// lines by `ssh-known-hosts` for OpenSSH.
pub const REVOKED_KEYS_KEY: &str = "revoked.pub";

/// A CA operation that failed.
#[derive(Debug, Error)]
pub enum CaError {
    /// ssh-key could not generate, encode or sign.
    #[error("SSH key operation failed: {0}")]
    Key(#[from] ssh_key::Error),
    /// The stored CA is missing a field.
    #[error(
        "{object} has no {key:?} entry: it was not written by kubectl vm; recreate it with `kubectl vm ca init`"
    )]
    Missing {
        /// Which object (`Secret kubevm-system/kubevm-ssh-ca`).
        object: String,
        /// The missing data key.
        key: &'static str,
    },
    /// The stored CA cannot be read.
    #[error("{object} is damaged: {reason}")]
    Damaged {
        /// Which object.
        object: String,
        /// What is wrong, one line.
        reason: String,
    },
}
