//! ServiceAccount tokens: the TokenRequest subresource (`POST
//! /api/v1/namespaces/NS/serviceaccounts/NAME/token`, what `kubectl create token` sends) and
//! authentication with the tokens it issued.
//!
//! Tokens are JWT-shaped (the claims of pkg/serviceaccount/claims.go: `aud`, `exp`, `iat`,
//! `iss`, `jti`, `kubernetes.io.{namespace,serviceaccount}`, `nbf`, `sub`) with a random
//! signature; the emulator remembers what it issued instead of verifying signatures. As on a
//! real cluster a token authenticates as `system:serviceaccount:NS:NAME` (uid: the
//! ServiceAccount's) in `system:serviceaccounts`, `system:serviceaccounts:NS` and
//! `system:authenticated`, with extra `authentication.kubernetes.io/credential-id: JTI=<jti>`,
//! only while it has not expired, its audiences include the API server's and the
//! ServiceAccount still exists with the same uid.

use crate::core::app::App;
use crate::core::auth::User;
use crate::core::status::{ApiError, Cause};
use crate::core::store::{Key, Store};
use crate::core::util::{
    format_rfc3339, meta_str, new_uid, now_unix, parse_yaml_or_json, random_bytes,
};
use base64::Engine;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// The API server's audience and service-account issuer (kubeadm's default
/// `--service-account-issuer`, which `--api-audiences` defaults to).
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// `TokenRequestSpec.expirationSeconds` default (pkg/apis/authentication/v1/defaults.go).
const DEFAULT_EXPIRATION: i64 = 3600;

#[derive(Debug, Clone)]
struct Issued {
    namespace: String,
    name: String,
    sa_uid: String,
    jti: String,
    audiences: Vec<String>,
    expires: i64,
}

/// The tokens issued so far.
#[derive(Debug, Default)]
pub struct ServiceAccountTokens {
    issued: Mutex<HashMap<String, Issued>>,
}

impl ServiceAccountTokens {
    /// Issues a token for ServiceAccount `sa` (a stored object); returns it and its expiry
    /// (Unix seconds).
    pub fn issue(
        &self,
        sa: &Value,
        audiences: &[String],
        expiration_seconds: i64,
    ) -> (String, i64) {
        let now = now_unix();
        let exp = now + expiration_seconds;
        let (namespace, name, uid) = (
            meta_str(sa, "namespace"),
            meta_str(sa, "name"),
            meta_str(sa, "uid"),
        );
        let jti = new_uid();
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = json!({"alg": "RS256", "kid": "kubevm-emulator"});
        let claims = json!({
            "aud": audiences, "exp": exp, "iat": now, "iss": API_AUDIENCE, "jti": jti,
            "kubernetes.io": {"namespace": namespace, "serviceaccount": {"name": name, "uid": uid}},
            "nbf": now, "sub": format!("system:serviceaccount:{namespace}:{name}"),
        });
        let token = format!(
            "{}.{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims.to_string()),
            b64.encode(random_bytes(256))
        );
        let issued = Issued {
            namespace: namespace.into(),
            name: name.into(),
            sa_uid: uid.into(),
            jti,
            audiences: audiences.to_vec(),
            expires: exp,
        };
        self.issued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(token.clone(), issued);
        (token, exp)
    }

    /// The ServiceAccount user a bearer token stands for, if it is one of ours and still valid.
    pub fn authenticate(&self, store: &Store, authorization: Option<&str>) -> Option<User> {
        let token = authorization?.strip_prefix("Bearer ")?.trim();
        self.user_of(store, token)
    }

    /// The user of a raw token (TokenReview), if valid.
    pub fn user_of(&self, store: &Store, token: &str) -> Option<User> {
        let issued = self
            .issued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
            .cloned()?;
        if now_unix() >= issued.expires || !issued.audiences.iter().any(|a| a == API_AUDIENCE) {
            return None;
        }
        let sa = store.get(&Key::new(
            "",
            "serviceaccounts",
            &issued.namespace,
            &issued.name,
        ))?;
        if meta_str(&sa, "uid") != issued.sa_uid {
            return None;
        }
        Some(service_account_user(
            &issued.namespace,
            &issued.name,
            &issued.sa_uid,
            &issued.jti,
        ))
    }
}

/// The user a ServiceAccount token authenticates as
/// (k8s.io/apiserver/pkg/authentication/serviceaccount `UserInfo`).
pub fn service_account_user(namespace: &str, name: &str, uid: &str, jti: &str) -> User {
    let mut extra = BTreeMap::new();
    extra.insert(
        "authentication.kubernetes.io/credential-id".to_string(),
        vec![format!("JTI={jti}")],
    );
    User {
        name: format!("system:serviceaccount:{namespace}:{name}"),
        uid: uid.into(),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".into(),
        ],
        extra,
    }
}

/// Answers a TokenRequest for ServiceAccount `namespace/name` (pkg/registry/core/serviceaccount/
/// storage/token.go): 404 without the ServiceAccount, audiences default to the API server's,
/// `expirationSeconds` to 3600 and at least 600.
pub fn token_request(
    app: &App,
    namespace: &str,
    name: &str,
    content_type: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let req = if content_type.contains("protobuf") {
        crate::core::protobuf::decode("TokenRequest", body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?
    } else {
        parse_yaml_or_json(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?
    };
    let sa = app
        .store
        .get(&Key::new("", "serviceaccounts", namespace, name))
        .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?;
    if req
        .pointer("/spec/boundObjectRef")
        .is_some_and(|b| !b.is_null())
    {
        return Err(ApiError::bad_request(
            "the emulator does not bind tokens to objects (spec.boundObjectRef)",
        ));
    }
    let mut audiences: Vec<String> = req
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect();
    if audiences.is_empty() {
        audiences.push(API_AUDIENCE.into());
    }
    let seconds = req
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(DEFAULT_EXPIRATION);
    // pkg/apis/authentication/validation ValidateTokenRequest.
    let problem = if seconds < 600 {
        Some("may not specify a duration less than 10 minutes")
    } else if seconds > 1 << 32 {
        Some("may not specify a duration larger than 2^32 seconds")
    } else {
        None
    };
    if let Some(message) = problem {
        return Err(ApiError::invalid(
            "authentication.k8s.io",
            "TokenRequest",
            name,
            vec![Cause {
                reason: "FieldValueInvalid",
                field: "spec.expirationSeconds".into(),
                message: format!("Invalid value: {seconds}: {message}"),
            }],
        ));
    }
    let (token, exp) = app.sa_tokens.issue(&sa, &audiences, seconds);
    Ok(json!({
        "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": null},
        "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": null},
        "status": {"token": token, "expirationTimestamp": format_rfc3339(exp)},
    }))
}
