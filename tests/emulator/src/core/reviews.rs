//! The create-only review kinds that answer with the emulator's own authenticator and
//! authorizer: SelfSubjectReview (who am I), SubjectAccessReview (may this user do that: what
//! an aggregated API server's delegating authorizer asks) and TokenReview (who is this token).

use crate::core::app::App;
use crate::core::auth::{Attributes, User, authorize_fixed, rbac_allowed_by};
use crate::core::status::{ApiError, Cause};
use serde_json::{Value, json};

/// `status.userInfo`/`status.user` of a review.
pub fn user_info(user: &User) -> Value {
    let mut info = json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    info
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

/// Answers a SubjectAccessReview (pkg/registry/authorization/subjectaccessreview/rest.go):
/// validates that a user or group is named and exactly one of resourceAttributes and
/// nonResourceAttributes is set, then runs the authorizer for `spec.user`/`spec.groups` (no
/// `system:authenticated` is added: the review asks about exactly that user). `status.reason`
/// is RBAC's `RBAC: allowed by …` when a binding grants it; RBAC never denies, so `denied` is
/// never set.
pub fn subject_access_review(app: &App, mut obj: Value) -> Result<Value, ApiError> {
    let spec = obj["spec"].clone();
    let user = User {
        name: spec["user"].as_str().unwrap_or_default().into(),
        uid: spec["uid"].as_str().unwrap_or_default().into(),
        groups: strings(&spec["groups"]),
        extra: spec["extra"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), strings(v)))
            .collect(),
    };
    let invalid = |field: &str, message: &str| {
        ApiError::invalid(
            "authorization.k8s.io",
            "SubjectAccessReview",
            "",
            vec![Cause {
                reason: "FieldValueInvalid",
                field: field.into(),
                message: message.into(),
            }],
        )
    };
    // pkg/apis/authorization/validation ValidateSubjectAccessReviewSpec.
    let (res, non_res) = (&spec["resourceAttributes"], &spec["nonResourceAttributes"]);
    if res.is_object() == non_res.is_object() {
        return Err(invalid(
            "spec.resourceAttributes",
            &format!(
                "Invalid value: {}: exactly one of nonResourceAttributes or resourceAttributes must be specified",
                if res.is_object() {
                    res.to_string()
                } else {
                    "null".into()
                }
            ),
        ));
    }
    if user.name.is_empty() && user.groups.is_empty() {
        return Err(invalid(
            "spec.user",
            "Invalid value: \"\": at least one of user or group must be specified",
        ));
    }
    let (allowed, reason) = if res.is_object() {
        let s = |f: &str| res[f].as_str().unwrap_or_default().to_string();
        let attrs = Attributes {
            verb: s("verb"),
            group: s("group"),
            resource: s("resource"),
            subresource: s("subresource"),
            namespace: s("namespace"),
            name: s("name"),
        };
        match authorize_fixed(&user, &attrs) {
            Ok(()) => (true, None),
            Err(_) => match rbac_allowed_by(&app.store, &user, &attrs) {
                Some(reason) => (true, Some(reason)),
                None => (false, None),
            },
        }
    } else {
        // Non-resource URLs are open to every authenticated user (system:discovery,
        // system:public-info-viewer), as the emulator serves them.
        let ok = user
            .groups
            .iter()
            .any(|g| g == "system:authenticated" || g == "system:masters");
        (ok, None)
    };
    obj["metadata"] = json!({"creationTimestamp": null});
    obj["status"] = json!({"allowed": allowed});
    if let Some(reason) = reason {
        obj["status"]["reason"] = json!(reason);
    }
    Ok(obj)
}

/// Answers a TokenReview: the emulator's own tokens (admin, alice, ServiceAccount tokens).
pub fn token_review(app: &App, mut obj: Value) -> Value {
    let token = obj
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let bearer = format!("Bearer {token}");
    let user = app
        .tokens
        .authenticate(Some(&bearer))
        .or_else(|| app.sa_tokens.user_of(&app.store, &token));
    obj["metadata"] = json!({"creationTimestamp": null});
    obj["status"] = match user {
        Some(user) => json!({"authenticated": true, "user": user_info(&user),
            "audiences": [crate::core::sa_tokens::API_AUDIENCE]}),
        None => json!({"user": {}}),
    };
    obj
}
