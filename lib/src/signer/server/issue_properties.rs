//! Properties of the signer's request decoding: the body of a certificate request and the
//! path it came on, as the API server proxies them from any caller.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use proptest::prelude::*;
use serde_json::json;

use super::{decode_request, parse_path};

/// An `ssh-ed25519` public key blob written out from RFC 8709 §4 (string "ssh-ed25519", string
/// of the 32 key bytes; RFC 4251 strings are a u32 length and the bytes), not by the decoder's
/// crate.
fn ed25519_blob(key: &[u8; 32]) -> Vec<u8> {
    let mut blob = vec![];
    for part in [&b"ssh-ed25519"[..], &key[..]] {
        blob.extend_from_slice(&(part.len() as u32).to_be_bytes());
        blob.extend_from_slice(part);
    }
    blob
}

fn body(public_key: &str) -> Vec<u8> {
    json!({"apiVersion": "ssh.kubevm.io/v1alpha1", "kind": "SSHCertificateRequest",
        "spec": {"publicKey": public_key}})
    .to_string()
    .into_bytes()
}

/// The refusal's status code, or 0 for a decoded request.
fn code(body: &[u8]) -> u16 {
    match decode_request(body, 2048) {
        Ok(_) => 0,
        Err(failure) => failure.code,
    }
}

proptest! {
    /// Any body is decoded or refused as 400 (not a request) or 422 (its key), never a panic.
    #[test]
    fn any_body_is_decoded_or_refused_as_400_or_422(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        prop_assert!(matches!(code(&bytes), 0 | 400 | 422));
    }

    /// A well-formed request whose key is any string is decoded or refused as 422 (the key),
    /// never as a malformed body.
    #[test]
    fn any_key_string_is_decoded_or_refused_as_invalid(key in ".{0,200}") {
        prop_assert!(matches!(code(&body(&key)), 0 | 422));
    }

    /// Any ed25519 key, with any comment and surrounding whitespace, decodes to exactly its 32
    /// bytes.
    #[test]
    fn an_ed25519_key_decodes_to_itself(
        key in any::<[u8; 32]>(),
        comment in "[ -~]{0,40}",
        before in "[ \t\n]{0,3}",
        after in "[ \t\n]{0,3}",
    ) {
        let line = format!("{before}ssh-ed25519 {} {comment}{after}", STANDARD.encode(ed25519_blob(&key)));
        let decoded = decode_request(&body(&line), 2048).map(|(_, k)| k);
        let Ok(decoded) = decoded else {
            return Err(TestCaseError::fail(format!("refused: {line:?}")));
        };
        let ed = decoded.key_data().ed25519().map(|k| k.0);
        prop_assert_eq!(ed, Some(key));
    }

    /// A key blob cut anywhere short of its end is refused as 422.
    #[test]
    fn a_cut_key_is_refused(key in any::<[u8; 32]>(), cut in 0usize..50) {
        let blob = ed25519_blob(&key);
        let cut = cut.min(blob.len() - 1);
        let line = format!("ssh-ed25519 {}", STANDARD.encode(&blob[..cut]));
        prop_assert_eq!(code(&body(&line)), 422);
    }

    /// A path of the certificate subresources gives back exactly its namespace, name and
    /// subresource; one more segment, or an empty namespace or name, is not one.
    #[test]
    fn a_path_gives_back_its_parts(ns in "[^/]{0,20}", name in "[^/]{0,20}", sub in "[^/]{0,20}", extra in "[^/]{0,5}") {
        let base = "/apis/ssh.kubevm.io/v1alpha1/namespaces";
        let path = format!("{base}/{ns}/virtualmachines/{name}/{sub}");
        let expected = (!ns.is_empty() && !name.is_empty()).then_some((ns.as_str(), name.as_str(), sub.as_str()));
        prop_assert_eq!(parse_path(&path), expected);
        let longer = format!("{path}/{extra}");
        prop_assert_eq!(parse_path(&longer), None);
    }
}
