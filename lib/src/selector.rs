//! Label selectors checked before they are sent.

use crate::error::{Error, Result};

/// The longest label selector sent. A selector travels in the request line
/// (`?labelSelector=…`); the smallest limit such a line commonly meets on its way to an API
/// server is 8 KiB (nginx's `large_client_header_buffers 4 8k`, the default of ingress and
/// proxy setups in front of clusters), and over 64 KiB even the URI parser of hyper-based servers
/// refuses it ("uri too long"). Legitimate selectors are a few hundred bytes.
pub const MAX_SELECTOR_BYTES: usize = 8 * 1024;

/// Refuse a selector too long to send, before any request.
pub fn check_length(selector: &str) -> Result<()> {
    if selector.len() > MAX_SELECTOR_BYTES {
        return Err(Error::InvalidTarget(format!(
            "label selector is {} bytes long; at most {MAX_SELECTOR_BYTES} fit in a request (select by fewer or shorter labels)",
            selector.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_selectors_are_refused() {
        assert!(check_length("app=web,tier!=db").is_ok());
        assert!(check_length(&"a".repeat(MAX_SELECTOR_BYTES)).is_ok());
        let err = check_length(&"a".repeat(MAX_SELECTOR_BYTES + 1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "label selector is 8193 bytes long; at most 8192 fit in a request (select by fewer or shorter labels)"
        );
    }
}
