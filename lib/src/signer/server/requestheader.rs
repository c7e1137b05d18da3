//! Front-proxy authentication, as an aggregated API server does it (k8s.io/apiserver's
//! `headerrequest` authenticator): the client certificate must chain to the
//! `requestheader-client-ca-file` and, when `requestheader-allowed-names` is not empty, have one
//! of those common names; only then are the `X-Remote-*` headers believed.

use std::collections::BTreeMap;

use http::HeaderMap;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::cluster::Cluster;
use crate::signer::policy::Caller;

/// Namespace and name of the ConfigMap the API server publishes its front-proxy settings in.
pub const AUTHENTICATION_CONFIGMAP: (&str, &str) =
    ("kube-system", "extension-apiserver-authentication");

/// The front-proxy settings of the API server.
#[derive(Debug, Clone, Default)]
pub struct RequestHeaderConfig {
    /// CA certificates (DER) the front-proxy client certificate must chain to.
    pub client_ca: Vec<CertificateDer<'static>>,
    /// Common names allowed to assert identities; empty allows any certificate of the CA.
    pub allowed_names: Vec<String>,
    /// Headers carrying the user name, first non-empty wins.
    pub username_headers: Vec<String>,
    /// Headers carrying the user's UID, first non-empty wins (kube 1.32+).
    pub uid_headers: Vec<String>,
    /// Headers carrying groups, every value one group.
    pub group_headers: Vec<String>,
    /// Prefixes of headers carrying extra attributes.
    pub extra_prefixes: Vec<String>,
}

/// Who a proxied request is for, as the front proxy asserted it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Authenticated {
    /// User name, groups and extra attributes.
    pub caller: Caller,
    /// The user's UID, when the API server sends one.
    pub uid: Option<String>,
}

/// A JSON list of non-empty strings under `key`, `default` when the key is absent. Anything
/// else is an error: a list that does not parse must not turn into "no restriction".
fn json_list(
    data: &BTreeMap<String, String>,
    key: &str,
    default: &[&str],
) -> Result<Vec<String>, String> {
    let Some(text) = data.get(key) else {
        return Ok(default.iter().map(|s| s.to_string()).collect());
    };
    let list: Vec<String> = serde_json::from_str(text)
        .map_err(|e| format!("{key} is not a JSON list of strings ({e}): {text:?}"))?;
    if list.iter().any(|s| s.trim().is_empty()) {
        return Err(format!("{key} has an empty entry: {text:?}"));
    }
    Ok(list)
}

impl RequestHeaderConfig {
    /// Parse the ConfigMap's data. Malformed lists, a missing or empty CA and an empty list of
    /// user name headers are errors (the signer then refuses to serve).
    pub fn from_data(data: &BTreeMap<String, String>) -> Result<Self, String> {
        let pem = data.get("requestheader-client-ca-file").ok_or_else(|| {
            "the API server publishes no requestheader-client-ca-file: is the aggregation layer enabled (--requestheader-client-ca-file)?".to_string()
        })?;
        let client_ca = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("requestheader-client-ca-file: {e}"))?;
        if client_ca.is_empty() {
            return Err("requestheader-client-ca-file holds no certificate".into());
        }
        let username_headers =
            json_list(data, "requestheader-username-headers", &["X-Remote-User"])?;
        if username_headers.is_empty() {
            return Err("requestheader-username-headers is empty".into());
        }
        let mut config = RequestHeaderConfig {
            client_ca,
            allowed_names: json_list(data, "requestheader-allowed-names", &[])?,
            username_headers,
            uid_headers: json_list(data, "requestheader-uid-headers", &[])?,
            group_headers: json_list(data, "requestheader-group-headers", &["X-Remote-Group"])?,
            extra_prefixes: json_list(
                data,
                "requestheader-extra-headers-prefix",
                &["X-Remote-Extra-"],
            )?,
        };
        // Header names are matched lower-case.
        for list in [
            &mut config.username_headers,
            &mut config.uid_headers,
            &mut config.group_headers,
            &mut config.extra_prefixes,
        ] {
            for name in list.iter_mut() {
                *name = name.to_ascii_lowercase();
            }
        }
        Ok(config)
    }

    /// Read the settings from the cluster (at start: an error stops the signer).
    pub async fn load(cluster: &Cluster) -> Result<(Self, Option<String>), String> {
        let (settings, version) = Self::read(cluster).await?;
        Ok((settings?, version))
    }

    /// Read the ConfigMap: the outer error is a failed read, the inner one unusable settings;
    /// with the ConfigMap's resourceVersion.
    pub async fn read(cluster: &Cluster) -> Result<(Result<Self, String>, Option<String>), String> {
        let (namespace, name) = AUTHENTICATION_CONFIGMAP;
        let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), namespace);
        let config_map = api
            .get(name)
            .await
            .map_err(|e| format!("reading ConfigMap {namespace}/{name}: {e}"))?;
        Ok((
            Self::from_data(&config_map.data.unwrap_or_default()),
            config_map.metadata.resource_version,
        ))
    }

    /// The caller a request asserts, given the common name of its verified client certificate
    /// (`None`: no certificate, or one that does not chain to the CA).
    pub fn authenticate(
        &self,
        client_cn: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<Authenticated, String> {
        let Some(cn) = client_cn else {
            return Err("requests must come through the Kubernetes API server (no verified front-proxy client certificate)".into());
        };
        if !self.allowed_names.is_empty() && !self.allowed_names.iter().any(|n| n == cn) {
            return Err(format!(
                "client certificate CN {cn:?} is not one of the API server's requestheader-allowed-names"
            ));
        }
        let values = |name: &str| {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let user = self
            .username_headers
            .iter()
            .flat_map(|h| values(h))
            .find(|u| !u.is_empty())
            .ok_or("the API server sent no user name")?;
        let uid = self
            .uid_headers
            .iter()
            .flat_map(|h| values(h))
            .find(|u| !u.is_empty());
        let groups = self.group_headers.iter().flat_map(|h| values(h)).collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            let name = name.as_str();
            for prefix in &self.extra_prefixes {
                if let Some(key) = name.strip_prefix(prefix.as_str())
                    && let Ok(value) = value.to_str()
                {
                    extra
                        .entry(percent_decode(key))
                        .or_default()
                        .push(value.to_owned());
                }
            }
        }
        Ok(Authenticated {
            caller: Caller {
                user,
                groups,
                extra,
            },
            uid,
        })
    }
}

/// Extra keys travel percent-encoded in header names (client-go `headerKeyEscape`).
fn percent_decode(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&key[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The subject common name of a DER certificate (the first CN of the subject, as a
/// UTF8String, PrintableString or IA5String), walked with `der`'s decoder:
/// `Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber,
/// signature, issuer, validity, subject, ... }, ... }` (RFC 5280 §4.1).
pub fn common_name(der_bytes: &[u8]) -> Option<String> {
    use der::asn1::{AnyRef, ObjectIdentifier};
    use der::{Decode, Reader, SliceReader, Tag, TagNumber, Tagged};
    const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");

    /// The elements of a constructed value (SEQUENCE, SET), in order.
    fn elements(value: AnyRef<'_>) -> Option<Vec<AnyRef<'_>>> {
        let mut reader = SliceReader::new(value.value()).ok()?;
        let mut out = Vec::new();
        while !reader.is_finished() {
            out.push(AnyRef::decode(&mut reader).ok()?);
        }
        Some(out)
    }

    let certificate = AnyRef::from_der(der_bytes).ok()?;
    let tbs = *elements(certificate)?.first()?;
    let fields = elements(tbs)?;
    let version = Tag::ContextSpecific {
        constructed: true,
        number: TagNumber(0),
    };
    let skip = usize::from(fields.first()?.tag() == version);
    // serialNumber, signature, issuer, validity, subject
    let subject = *fields.get(skip + 4)?;
    for relative_name in elements(subject)? {
        for attribute in elements(relative_name)? {
            let [kind, value] = elements(attribute)?[..] else {
                return None;
            };
            if kind.decode_as::<ObjectIdentifier>().ok()? != COMMON_NAME {
                continue;
            }
            return match value.tag() {
                Tag::Utf8String | Tag::PrintableString | Tag::Ia5String => {
                    std::str::from_utf8(value.value()).ok().map(str::to_owned)
                }
                _ => None,
            };
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(allowed: &[&str]) -> RequestHeaderConfig {
        RequestHeaderConfig {
            client_ca: Vec::new(),
            allowed_names: allowed.iter().map(|s| s.to_string()).collect(),
            username_headers: vec!["x-remote-user".into()],
            uid_headers: vec!["x-remote-uid".into()],
            group_headers: vec!["x-remote-group".into()],
            extra_prefixes: vec!["x-remote-extra-".into()],
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn headers_count_only_with_an_allowed_certificate() {
        let h = headers(&[
            ("x-remote-user", "alice"),
            ("x-remote-group", "dev"),
            ("x-remote-group", "system:authenticated"),
            ("x-remote-extra-scopes%2fa", "x"),
        ]);
        let c = config(&["front-proxy-client"]);
        let who = c.authenticate(Some("front-proxy-client"), &h).unwrap();
        assert_eq!(who.uid, None);
        let caller = who.caller;
        assert_eq!(caller.user, "alice");
        assert_eq!(caller.groups, ["dev", "system:authenticated"]);
        assert_eq!(caller.extra["scopes/a"], ["x"]);
        assert!(c.authenticate(None, &h).unwrap_err().contains("API server"));
        assert!(c.authenticate(Some("mallory"), &h).is_err());
        assert!(config(&[]).authenticate(Some("anyone"), &h).is_ok());
        assert!(
            c.authenticate(Some("front-proxy-client"), &HeaderMap::new())
                .is_err()
        );
    }

    #[test]
    fn configmap_lists_are_json() {
        let mut data = BTreeMap::new();
        assert!(RequestHeaderConfig::from_data(&data).is_err());
        data.insert(
            "requestheader-allowed-names".into(),
            r#"["front-proxy-client"]"#.into(),
        );
        data.insert(
            "requestheader-username-headers".into(),
            r#"["X-Remote-User"]"#.into(),
        );
        let ca = rcgen::generate_simple_self_signed(vec!["ca".into()]).unwrap();
        data.insert("requestheader-client-ca-file".into(), ca.cert.pem());
        let c = RequestHeaderConfig::from_data(&data).unwrap();
        assert_eq!(c.allowed_names, ["front-proxy-client"]);
        assert_eq!(c.group_headers, ["x-remote-group"]);
        assert_eq!(c.client_ca.len(), 1);
        assert_eq!(
            common_name(&c.client_ca[0]).as_deref(),
            Some("rcgen self signed cert")
        );
    }

    fn valid_data() -> BTreeMap<String, String> {
        let ca = rcgen::generate_simple_self_signed(vec!["ca".into()]).unwrap();
        let mut data = BTreeMap::new();
        data.insert("requestheader-client-ca-file".into(), ca.cert.pem());
        data.insert(
            "requestheader-allowed-names".into(),
            r#"["front-proxy-client"]"#.into(),
        );
        data
    }

    /// Issue 32 item 7: a malformed list used to become "no restriction" (any CN of the CA).
    #[test]
    fn malformed_settings_fail_closed() {
        assert!(RequestHeaderConfig::from_data(&valid_data()).is_ok());
        for (key, value, expected) in [
            (
                "requestheader-allowed-names",
                "front-proxy-client",
                "not a JSON list",
            ),
            (
                "requestheader-allowed-names",
                r#"["front-proxy-client""#,
                "not a JSON list",
            ),
            (
                "requestheader-allowed-names",
                r#"{"a":1}"#,
                "not a JSON list",
            ),
            ("requestheader-allowed-names", "[1]", "not a JSON list"),
            ("requestheader-allowed-names", r#"[""]"#, "empty entry"),
            (
                "requestheader-group-headers",
                "X-Remote-Group",
                "not a JSON list",
            ),
            (
                "requestheader-extra-headers-prefix",
                "null",
                "not a JSON list",
            ),
            ("requestheader-uid-headers", "[\"\"]", "empty entry"),
            (
                "requestheader-username-headers",
                "[]",
                "username-headers is empty",
            ),
            ("requestheader-client-ca-file", "", "holds no certificate"),
            (
                "requestheader-client-ca-file",
                "-----BEGIN CERTIFICATE-----\nAAAA",
                "client-ca-file",
            ),
        ] {
            let mut data = valid_data();
            data.insert(key.into(), value.into());
            let err = RequestHeaderConfig::from_data(&data).unwrap_err();
            assert!(err.contains(expected), "{key}={value:?}: {err}");
        }
        // Absent lists take kube's defaults; an explicit [] allowed-names means any CN.
        let mut data = valid_data();
        data.insert("requestheader-allowed-names".into(), "[]".into());
        data.insert(
            "requestheader-uid-headers".into(),
            r#"["X-Remote-Uid"]"#.into(),
        );
        let c = RequestHeaderConfig::from_data(&data).unwrap();
        assert!(c.allowed_names.is_empty());
        assert_eq!(c.username_headers, ["x-remote-user"]);
        let h = headers(&[("X-Remote-User", "alice"), ("X-Remote-Uid", "u-1")]);
        let who = c.authenticate(Some("any"), &h).unwrap();
        assert_eq!(
            (who.caller.user.as_str(), who.uid.as_deref()),
            ("alice", Some("u-1"))
        );
    }

    #[test]
    fn common_name_is_read_from_the_subject_not_the_issuer() {
        // Issuer CN "issuing-ca", subject O and CN (a PrintableString and a UTF8String).
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "issuing-ca");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        for value in [
            rcgen::DnValue::PrintableString("front-proxy-client".try_into().unwrap()),
            rcgen::DnValue::Utf8String("front-proxy-client".into()),
        ] {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, "system:masters");
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, value);
            let cert = params.signed_by(&key, &issuer).unwrap();
            assert_eq!(
                common_name(cert.der()).as_deref(),
                Some("front-proxy-client")
            );
        }
        assert_eq!(common_name(ca.der()).as_deref(), Some("issuing-ca"));
        assert_eq!(common_name(b"not a certificate"), None);
        assert_eq!(common_name(&ca.der()[..40]), None);
    }
}

/// Properties of reading the front proxy's identity (issue 37): `PROPTEST_CASES=100000 cargo
/// test -p kubevm --lib signer::server::requestheader::properties` for a long run.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// client-go `headerKeyEscape` as its documentation states it: every byte of the key's
    /// UTF-8 that is not an HTTP token character, and `%` itself, becomes `%XX`.
    fn header_key_escape(key: &str) -> String {
        key.bytes()
            .map(|b| {
                let token = b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b);
                if token && b != b'%' {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    fn tests_config() -> RequestHeaderConfig {
        RequestHeaderConfig {
            client_ca: Vec::new(),
            allowed_names: vec!["front-proxy-client".into()],
            username_headers: vec!["x-remote-user".into()],
            uid_headers: vec!["x-remote-uid".into()],
            group_headers: vec!["x-remote-group".into()],
            extra_prefixes: vec!["x-remote-extra-".into()],
        }
    }

    proptest! {
        /// An extra key the API server escaped into a header name comes back as the key it
        /// sent (header names are case-insensitive, so the API server lower-cases keys too).
        #[test]
        fn extra_keys_round_trip(key in "\\PC{1,12}|[a-zA-Z0-9%./:-]{1,12}", value in "[ -~]{0,16}") {
            let name = format!("x-remote-extra-{}", header_key_escape(&key));
            let mut headers = HeaderMap::new();
            headers.insert(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_str(&value).unwrap(),
            );
            headers.insert("x-remote-user", http::HeaderValue::from_static("alice"));
            let who = tests_config().authenticate(Some("front-proxy-client"), &headers).unwrap();
            let expected = key.to_ascii_lowercase();
            prop_assert_eq!(who.caller.extra.get(&expected), Some(&vec![value]));
            prop_assert_eq!(who.caller.extra.len(), 1);
        }

        /// Whatever headers arrive, only a certificate the config allows makes them count,
        /// and reading them never panics.
        #[test]
        fn headers_count_only_behind_the_proxy(
            pairs in prop::collection::vec(("x-remote-(user|uid|group|extra-[a-z%0-9]{0,6})|[a-z-]{1,10}", "[ -~]{0,12}"), 0..8),
            cn in proptest::option::of("front-proxy-client|[a-z-]{1,10}"),
        ) {
            let mut headers = HeaderMap::new();
            for (name, value) in &pairs {
                headers.append(
                    http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    http::HeaderValue::from_str(value).unwrap(),
                );
            }
            let result = tests_config().authenticate(cn.as_deref(), &headers);
            if cn.as_deref() != Some("front-proxy-client") {
                prop_assert!(result.is_err());
            } else if let Ok(who) = result {
                let first_user = pairs.iter().find(|(n, v)| n == "x-remote-user" && !v.is_empty());
                prop_assert_eq!(Some(&who.caller.user), first_user.map(|(_, v)| v));
            }
        }
    }
}
