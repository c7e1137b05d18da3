//! The signer's own authorization: a SubjectAccessReview (`authorization.k8s.io/v1`) for the
//! caller the front proxy named, as every aggregated server built on k8s.io/apiserver makes
//! (its delegating authorizer, `authorizerfactory.DelegatingAuthorizerConfig`). Answers are
//! cached for [`CACHE_TTL`], keyed on the whole caller and the whole question, as that
//! authorizer's webhook cache does (10 s for allowed and for denied answers by default).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;

use super::Signer;
use super::requestheader::Authenticated;

/// How long an answer is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// Entries kept at most; expired ones are dropped when this is reached.
const CACHE_MAX: usize = 4096;

/// Recent answers, keyed on the serialized review spec (user, uid, groups, extra, attributes).
#[derive(Default)]
pub struct ReviewCache {
    answers: Mutex<HashMap<String, (Instant, bool)>>,
}

impl ReviewCache {
    fn get(&self, key: &str, now: Instant) -> Option<bool> {
        let answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers
            .get(key)
            .filter(|(at, _)| now.duration_since(*at) < CACHE_TTL)
            .map(|(_, allowed)| *allowed)
    }

    fn put(&self, key: String, now: Instant, allowed: bool) {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        if answers.len() >= CACHE_MAX {
            answers.retain(|_, (at, _)| now.duration_since(*at) < CACHE_TTL);
            if answers.len() >= CACHE_MAX {
                answers.clear();
            }
        }
        answers.insert(key, (now, allowed));
    }
}

/// The review spec asking whether `who` may do `attributes`.
pub fn review_spec(who: &Authenticated, attributes: ResourceAttributes) -> SubjectAccessReviewSpec {
    SubjectAccessReviewSpec {
        user: Some(who.caller.user.clone()),
        uid: who.uid.clone(),
        groups: Some(who.caller.groups.clone()),
        extra: (!who.caller.extra.is_empty()).then(|| who.caller.extra.clone()),
        resource_attributes: Some(attributes),
        ..Default::default()
    }
}

impl Signer {
    /// Whether the API server's authorizer allows `who` to do `attributes` (cached briefly).
    pub async fn access_review(
        &self,
        who: &Authenticated,
        attributes: ResourceAttributes,
    ) -> Result<bool, String> {
        let spec = review_spec(who, attributes);
        let key = serde_json::to_string(&spec).map_err(|e| e.to_string())?;
        if let Some(allowed) = self.reviews.get(&key, Instant::now()) {
            return Ok(allowed);
        }
        let api: Api<SubjectAccessReview> = Api::all(self.cluster.client.clone());
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("SubjectAccessReview: {e}"))?;
        let allowed = answer
            .status
            .is_some_and(|s| s.allowed && !s.denied.unwrap_or(false));
        self.reviews.put(key, Instant::now(), allowed);
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(user: &str, groups: &[&str], uid: Option<&str>) -> Authenticated {
        Authenticated {
            caller: crate::signer::policy::Caller {
                user: user.into(),
                groups: groups.iter().map(|g| g.to_string()).collect(),
                ..Default::default()
            },
            uid: uid.map(str::to_owned),
        }
    }

    fn attrs(verb: &str, name: &str) -> ResourceAttributes {
        ResourceAttributes {
            verb: Some(verb.into()),
            group: Some("ssh.kubevm.io".into()),
            resource: Some("logins".into()),
            namespace: Some("dev".into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    fn key(who: &Authenticated, a: ResourceAttributes) -> String {
        serde_json::to_string(&review_spec(who, a)).unwrap()
    }

    #[test]
    fn the_cache_key_is_the_whole_caller_and_question_and_expires() {
        let cache = ReviewCache::default();
        let now = Instant::now();
        let alice = who("alice", &["dev"], Some("u1"));
        cache.put(key(&alice, attrs("use", "root")), now, true);
        assert_eq!(
            cache.get(&key(&alice, attrs("use", "root")), now),
            Some(true)
        );
        // Any difference in who or what is another question.
        for other in [
            key(
                &who("alice", &["dev", "ops"], Some("u1")),
                attrs("use", "root"),
            ),
            key(&who("alice", &["dev"], Some("u2")), attrs("use", "root")),
            key(&who("alice", &["dev"], None), attrs("use", "root")),
            key(&who("bob", &["dev"], Some("u1")), attrs("use", "root")),
            key(&alice, attrs("use", "admin")),
            key(&alice, attrs("create", "root")),
        ] {
            assert_eq!(cache.get(&other, now), None, "{other}");
        }
        assert_eq!(
            cache.get(&key(&alice, attrs("use", "root")), now + CACHE_TTL),
            None
        );
        // The spec carries exactly the caller's identity (what the API server authorizes).
        let spec = review_spec(&alice, attrs("use", "root"));
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            serde_json::json!({"user": "alice", "uid": "u1", "groups": ["dev"],
                "resourceAttributes": {"verb": "use", "group": "ssh.kubevm.io",
                    "resource": "logins", "namespace": "dev", "name": "root"}})
        );
    }
}
