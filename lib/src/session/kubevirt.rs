//! KubeVirt has no record of who holds a console or VNC stream, so `kubectl vm` keeps one: a
//! coordination.k8s.io Lease `kubectl-vm-<kind>-<vm>` in the VM's namespace while connected
//! (holder = the user from a SelfSubjectReview, the client, the start time; renewed every 10 s,
//! valid for 30 s, released on exit). It is advisory: without the rights to read or write
//! Leases the user still connects.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

use super::Holder;
use crate::cluster::Cluster;
use crate::error::{Action, Result};
use crate::stream::StreamTarget;

/// Seconds a Lease stays valid without renewal.
pub const LEASE_SECONDS: i32 = 30;
/// How often a held Lease is renewed.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// Annotation with the holder's random session id.
pub const SESSION_ANNOTATION: &str = "kubevm.io/session-id";
/// Annotation with the holder's client.
pub const CLIENT_ANNOTATION: &str = "kubevm.io/session-client";

/// The Lease name for a stream of a VM.
pub fn lease_name(target: &StreamTarget) -> String {
    format!("kubectl-vm-{}-{}", target.kind.subresource(), target.name)
}

fn action(verb: &'static str, target: &StreamTarget) -> Action {
    Action::new(verb, "leases.coordination.k8s.io", "lease")
        .named(lease_name(target))
        .in_namespace(Some(&target.namespace))
}

/// The current holder, `None` if the Lease is absent, released or expired.
pub async fn current(cluster: &Cluster, target: &StreamTarget) -> Result<Option<Holder>> {
    let api: Api<Lease> = Api::namespaced(cluster.client.clone(), &target.namespace);
    let lease = api
        .get_opt(&lease_name(target))
        .await
        .map_err(|e| cluster.error(e, &action("get", target)))?;
    Ok(lease.and_then(|l| holder_of(&l, jiff::Timestamp::now())))
}

/// The holder a Lease names, if it is still valid at `now`.
pub fn holder_of(lease: &Lease, now: jiff::Timestamp) -> Option<Holder> {
    let spec = lease.spec.as_ref()?;
    let user = spec.holder_identity.clone().filter(|u| !u.is_empty())?;
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let valid = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
    if renewed.as_second() + valid < now.as_second() {
        return None;
    }
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    Some(Holder {
        user,
        since: spec.acquire_time.as_ref().map(|t| t.0),
        client: annotations
            .get(CLIENT_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
        session: annotations
            .get(SESSION_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
    })
}

/// A Lease this process holds.
pub struct HeldLease {
    api: Api<Lease>,
    name: String,
    session: String,
    renew: tokio::task::JoinHandle<()>,
}

impl HeldLease {
    /// Takes the Lease for `user` (creating or replacing it), and renews it in the background.
    pub async fn acquire(
        cluster: &Cluster,
        target: &StreamTarget,
        user: &str,
    ) -> Result<HeldLease> {
        let api: Api<Lease> = Api::namespaced(cluster.client.clone(), &target.namespace);
        let name = lease_name(target);
        let session = random_session();
        let now = MicroTime(jiff::Timestamp::now());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(target.namespace.clone()),
                labels: Some(
                    [
                        (
                            "app.kubernetes.io/managed-by".to_owned(),
                            "kubectl-vm".to_owned(),
                        ),
                        ("kubevm.io/vm".to_owned(), target.name.clone()),
                    ]
                    .into(),
                ),
                annotations: Some(
                    [
                        (SESSION_ANNOTATION.to_owned(), session.clone()),
                        (
                            CLIENT_ANNOTATION.to_owned(),
                            crate::stream::USER_AGENT.to_owned(),
                        ),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(user.to_owned()),
                lease_duration_seconds: Some(LEASE_SECONDS),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..Default::default()
            }),
        };
        match api.get_opt(&name).await {
            Ok(Some(existing)) => {
                let mut lease = lease;
                lease.metadata.resource_version = existing.metadata.resource_version.clone();
                let transitions = existing
                    .spec
                    .as_ref()
                    .and_then(|s| s.lease_transitions)
                    .unwrap_or(0);
                if let Some(spec) = lease.spec.as_mut() {
                    spec.lease_transitions = Some(transitions + 1);
                }
                api.replace(&name, &PostParams::default(), &lease).await
            }
            Ok(None) => api.create(&PostParams::default(), &lease).await,
            Err(e) => Err(e),
        }
        .map_err(|e| cluster.error(e, &action("update", target)))?;
        let renew = tokio::spawn(renew(api.clone(), name.clone(), session.clone()));
        Ok(HeldLease {
            api,
            name,
            session,
            renew,
        })
    }

    /// Whether the Lease still names this session (someone else took over otherwise).
    pub async fn still_ours(&self) -> Option<bool> {
        let lease = self.api.get_opt(&self.name).await.ok()?;
        Some(lease.is_some_and(|l| session_of(&l) == Some(self.session.as_str())))
    }

    /// Releases the Lease if it is still ours (uid precondition: never delete a successor's).
    pub async fn release(self) {
        self.renew.abort();
        if let Ok(Some(lease)) = self.api.get_opt(&self.name).await
            && session_of(&lease) == Some(self.session.as_str())
        {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: lease.metadata.uid.clone(),
                    resource_version: lease.metadata.resource_version.clone(),
                }),
                ..Default::default()
            };
            let _ = self.api.delete(&self.name, &params).await;
        }
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.renew.abort();
    }
}

fn session_of(lease: &Lease) -> Option<&str> {
    lease
        .metadata
        .annotations
        .as_ref()?
        .get(SESSION_ANNOTATION)
        .map(String::as_str)
}

async fn renew(api: Api<Lease>, name: String, session: String) {
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Ok(Some(mut lease)) = api.get_opt(&name).await else {
            return;
        };
        if session_of(&lease) != Some(session.as_str()) {
            return;
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        }
        let _ = api.replace(&name, &PostParams::default(), &lease).await;
    }
}

fn random_session() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(jiff::Timestamp::now().as_nanosecond() as u128);
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                annotations: Some([(SESSION_ANNOTATION.to_owned(), "s1".to_owned())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(30),
                acquire_time: Some(MicroTime("2026-11-30T14:00:00Z".parse().unwrap())),
                renew_time: Some(MicroTime(renewed.parse().unwrap())),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn expired_or_empty_leases_hold_nothing() {
        let now: jiff::Timestamp = "2026-11-30T14:10:00Z".parse().unwrap();
        let held = holder_of(&lease("bob", "2026-11-30T14:09:50Z"), now).unwrap();
        assert_eq!((held.user.as_str(), held.session.as_str()), ("bob", "s1"));
        assert!(holder_of(&lease("bob", "2026-11-30T14:09:00Z"), now).is_none());
        assert!(holder_of(&lease("", "2026-11-30T14:09:50Z"), now).is_none());
    }
}
