//! `kubectl vm ssh`: short-lived user certificates signed by the platform CA (through the
//! [`Signer`] seam), host verification by host certificate or known_hosts, and an SSH client
//! (russh) that runs over any byte stream, such as the platform's portforward websocket.

pub mod cert;
pub mod client;
pub mod config;
pub mod escape;
pub mod files;
pub mod forward;
pub mod hostkey;
pub mod vm;

pub use cert::{CaSigner, CertRequest, Signer, UserIdentity};
pub use client::{Auth, Connection, ExitOutcome, PtyRequest, SessionIo, SessionRequest};
pub use escape::{EscapeChar, EscapeEvent, EscapeFilter};
pub use hostkey::{HostRejection, HostTrust, HostVerifier, StrictHostKeyChecking};

use thiserror::Error;

/// An SSH operation that failed.
#[derive(Debug, Error)]
pub enum SshError {
    /// Bad input found before connecting.
    #[error("{0}")]
    Usage(String),
    /// ssh-key could not generate, encode or sign.
    #[error("SSH key operation failed: {0}")]
    Key(#[from] russh::keys::ssh_key::Error),
    /// The host was not trusted.
    #[error("{0}")]
    Host(HostRejection),
    /// The guest's sshd refused our credentials.
    #[error("{0}")]
    AuthRefused(String),
    /// The connection failed or broke.
    #[error("{0}")]
    Transport(String),
    /// A local file or stream failed.
    #[error("{0}")]
    Io(String),
    /// Something that should not happen.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<std::io::Error> for SshError {
    fn from(e: std::io::Error) -> Self {
        SshError::Io(e.to_string())
    }
}

#[cfg(test)]
mod tests;
