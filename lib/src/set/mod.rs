//! `kubectl vm set …`: changing a VM after it exists, in the shape of `kubectl set`.
//!
//! Every verb is a [`Change`] applied by one read-modify-write ([`run`]): the VM is read, the
//! change is applied to that object, and the result is written back with a PUT that carries
//! the VM's `metadata.resourceVersion`. A 409 Conflict (someone else changed the VM between
//! the read and the write) reads the VM again and applies the change to the fresh object, at
//! most [`ATTEMPTS`] times: another writer's change is never overwritten. Then, unless told
//! not to wait, the VM is watched until its controller has seen the new generation and the
//! platform's own verdict is read: applied live, waiting for a restart (KubeVirt
//! `RestartRequired`, Deckhouse `AwaitingRestartToApplyConfiguration` with
//! `status.restartAwaitingChanges`), or taking effect at the next start of a stopped VM.
//!
//! The platforms differ behind [`SetPlatform`] (`kubevirt.rs`, `deckhouse.rs`), picked in
//! [`platform`]. Verbs: [`resources`] (CPU, memory, instancetype), [`policy`] (run and
//! eviction policy, grace period, labels and annotations), [`placement`] (node selector,
//! tolerations, priority class), [`network`] (secondary networks).

mod deckhouse;
mod kubevirt;
pub mod network;
pub mod placement;
pub mod policy;
pub mod resources;

use std::time::Duration;

use futures::StreamExt;
use kube::api::{PostParams, WatchEvent, WatchParams};
use serde_json::Value;

pub use crate::api::DryRun;
use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::{Flavor, Platform};
use crate::lifecycle::{self, Action, VmRef};

/// How many times a write that met a conflict is tried on a fresh read.
pub const ATTEMPTS: u32 = 5;

/// A change to one VM, applied to the object as read (and again to a fresh read after a
/// conflict). Errors are the refusals of this VM as it is (a usage error, exit 2).
pub trait Change: Send + Sync {
    /// Checks made before any request that need only the platform (flags a platform lacks).
    fn check(&self, platform: &dyn SetPlatform) -> Result<()>;
    /// Edit `vm` in place.
    fn apply(&self, platform: &dyn SetPlatform, vm: &mut Value) -> Result<()>;
    /// Checks of the edited VM against other cluster objects (Deckhouse: the class's sizing
    /// policy); the default has none.
    fn verify<'a>(
        &'a self,
        _platform: &'a dyn SetPlatform,
        _cluster: &'a Cluster,
        _edited: &'a Value,
    ) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

/// What differs between the platforms for `set`.
pub trait SetPlatform: Send + Sync {
    /// The flavor this implements.
    fn flavor(&self) -> Flavor;
    /// Apply a resources request to a VM object.
    fn resources(&self, request: &resources::Resources, vm: &mut Value) -> Result<()>;
    /// Refuse resources flags the platform has no field for.
    fn check_resources(&self, request: &resources::Resources) -> Result<()>;
    /// Apply a policy request to a VM object.
    fn policy(&self, request: &policy::Policy, vm: &mut Value) -> Result<()>;
    /// Refuse policy values the platform does not know.
    fn check_policy(&self, request: &policy::Policy) -> Result<()>;
    /// The VM's class, when its sizing policy limits CPU and memory (Deckhouse).
    fn sizing_class<'a>(&self, _vm: &'a Value) -> Option<&'a str> {
        None
    }
    /// Refuse network requests the platform cannot express (before any request).
    fn check_networks(&self, request: &network::Networks) -> Result<()>;
    /// Apply a network request to a VM object.
    fn networks(&self, request: &network::Networks, vm: &mut Value) -> Result<()>;
    /// The network objects the request attaches to, which must exist (KubeVirt's
    /// NetworkAttachmentDefinitions, Deckhouse's Networks and ClusterNetworks).
    fn network_objects(
        &self,
        request: &network::Networks,
        vm: &Value,
    ) -> Result<Vec<crate::network::spec::NetworkObject>>;
    /// What the platform reports about a VM its controller has observed.
    fn verdict(&self, vm: &Value) -> Applies;
    /// A move the platform makes to apply `changes` but reports apart from the VM (Deckhouse:
    /// the workload updater's operation after a placement change), waited for when it is
    /// bound to come; `None`: the VM's own verdict stands.
    fn follow_move<'a>(
        &'a self,
        _cluster: &'a Cluster,
        _vm: &'a VmRef,
        _changes: &'a [FieldChange],
        _observed: &'a Value,
    ) -> futures::future::BoxFuture<'a, Result<Option<Applies>>> {
        Box::pin(async { Ok(None) })
    }
}

/// The implementation for `flavor`: the one place the platforms are told apart.
pub fn platform(flavor: Flavor) -> &'static dyn SetPlatform {
    match flavor {
        Flavor::KubeVirt => &kubevirt::KubeVirt,
        Flavor::Deckhouse => &deckhouse::Deckhouse,
    }
}

/// One changed field: `spec.cpu.cores: 1 → 2`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldChange {
    /// Dotted path (`metadata.labels[app.kubernetes.io/name]` where a key has dots).
    pub field: String,
    /// Before (None: absent).
    pub old: Option<String>,
    /// After (None: removed).
    pub new: Option<String>,
}

impl std::fmt::Display for FieldChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".into());
        write!(
            f,
            "{}: {} → {}",
            self.field,
            show(&self.old),
            show(&self.new)
        )
    }
}

/// When the platform applies the change, as it reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applies {
    /// Nothing waits: the running VM has it (or it needs none).
    Live,
    /// The platform moves the running VM by a live migration to apply it.
    Migrating {
        /// What the platform says (the condition's message or reason).
        message: String,
    },
    /// It waits for a restart; the platform's message and the fields it names.
    AtRestart {
        /// The condition's message.
        message: String,
        /// Pending fields (Deckhouse `status.restartAwaitingChanges` paths).
        pending: Vec<String>,
    },
    /// The VM does not run: it has the change when it starts.
    AtStart,
    /// Not observed: a dry run, `--no-wait`, or a platform that does not report
    /// `status.observedGeneration`.
    NotObserved,
}

/// How to run a change.
#[derive(Debug, Clone)]
pub struct Options {
    /// Dry run strategy.
    pub dry_run: DryRun,
    /// Wait for the platform's verdict.
    pub wait: bool,
    /// Restart the VM when the change waits for a restart (and wait for it when `wait`).
    pub restart: bool,
    /// How long to wait.
    pub timeout: Duration,
}

/// Progress worth telling.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The write met a conflict and is tried again on a fresh read.
    Conflict {
        /// The attempt that failed (1-based).
        attempt: u32,
    },
    /// The VM is being restarted to apply the change.
    Restarting,
    /// Progress of the restart.
    Lifecycle(lifecycle::Event),
}

/// How a change ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The VM.
    pub vm: VmRef,
    /// `kind.group/name`.
    pub object_ref: String,
    /// What changed (empty: nothing to change, nothing written).
    pub changes: Vec<FieldChange>,
    /// The VM after the change (client dry run: as it would be written).
    pub object: Value,
    /// The platform's verdict.
    pub applies: Applies,
    /// How many writes it took (1 without conflicts).
    pub attempts: u32,
    /// Whether `--restart` restarted the VM.
    pub restarted: bool,
}

/// Apply `change` to VM `vm`: read, change, write with its resourceVersion (retrying on a
/// conflict), then report what the platform says.
pub async fn run(
    cluster: &Cluster,
    platform_info: &Platform,
    change: &dyn Change,
    vm: &VmRef,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let flavor = platform_info.flavor;
    let set = platform(flavor);
    change.check(set)?;
    let kind = Kind::vm(flavor);
    let api = kind.api(&cluster.client, Some(&vm.namespace));
    let action = |verb| kind.action(verb, Some(&vm.namespace)).named(&vm.name);
    let mut attempt = 0;
    let (changes, written) = loop {
        attempt += 1;
        let current = api
            .get(&vm.name)
            .await
            .map_err(|e| cluster.error(e, &action("get")))?;
        let current = serde_json::to_value(current).unwrap_or_default();
        let mut edited = current.clone();
        change.apply(set, &mut edited)?;
        let changes = diff(&current, &edited);
        if changes.is_empty() || options.dry_run == DryRun::Client {
            if !changes.is_empty() {
                change.verify(set, cluster, &edited).await?;
            }
            let mut outcome = Outcome {
                vm: vm.clone(),
                object_ref: kind.object_ref(&vm.name),
                changes,
                applies: if options.dry_run == DryRun::None {
                    set.verdict(&current)
                } else {
                    Applies::NotObserved
                },
                object: edited,
                attempts: attempt,
                restarted: false,
            };
            // Nothing to write, but an earlier change may still wait for the restart asked for.
            if options.dry_run == DryRun::None {
                restart_if_needed(cluster, platform_info, vm, options, on_event, &mut outcome)
                    .await?;
            }
            return Ok(outcome);
        }
        change.verify(set, cluster, &edited).await?;
        let params = PostParams {
            dry_run: options.dry_run == DryRun::Server,
            field_manager: Some(crate::names::FIELD_MANAGER.to_owned()),
        };
        let body: kube::api::DynamicObject = serde_json::from_value(edited)
            .map_err(|e| Error::Internal(format!("the edited VM does not serialize: {e}")))?;
        match api.replace(&vm.name, &params, &body).await {
            Ok(o) => break (changes, serde_json::to_value(o).unwrap_or_default()),
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < ATTEMPTS => {
                on_event(Event::Conflict { attempt });
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                return Err(Error::Conflict(format!(
                    "{} {vm} kept changing under us ({ATTEMPTS} attempts, the last: {}); try again",
                    kind.kind.to_lowercase(),
                    s.message
                )));
            }
            Err(e) => return Err(cluster.error(e, &action("update"))),
        }
    };
    let mut outcome = Outcome {
        vm: vm.clone(),
        object_ref: kind.object_ref(&vm.name),
        changes,
        applies: Applies::NotObserved,
        object: written,
        attempts: attempt,
        restarted: false,
    };
    if options.dry_run == DryRun::Server || !(options.wait || options.restart) {
        return Ok(outcome);
    }
    observe_applies(cluster, set, kind, vm, options, &mut outcome).await?;
    restart_if_needed(cluster, platform_info, vm, options, on_event, &mut outcome).await?;
    Ok(outcome)
}

/// Wait until the platform has observed the written change, then say how it applies
/// (`SetPlatform::verdict`), and for a live change of placement follow the VM's move; the
/// outcome's object becomes the VM as observed.
async fn observe_applies(
    cluster: &Cluster,
    set: &dyn SetPlatform,
    kind: Kind,
    vm: &VmRef,
    options: &Options,
    outcome: &mut Outcome,
) -> Result<()> {
    let observed = tokio::time::timeout(options.timeout, observe(cluster, kind, vm, &outcome.object))
        .await
        .map_err(|_| {
            Error::Timeout(format!(
                "the platform to observe the change of {vm} (after {}s; raise --timeout, or pass --no-wait)",
                options.timeout.as_secs()
            ))
        })??;
    outcome.applies = match &observed {
        Some(o) => set.verdict(o),
        None => Applies::NotObserved,
    };
    if let (Applies::Live, Some(o)) = (&outcome.applies, &observed) {
        let moved = tokio::time::timeout(
            options.timeout,
            set.follow_move(cluster, vm, &outcome.changes, o),
        )
        .await
        .map_err(|_| {
            Error::Timeout(format!(
                "the platform to start moving {vm} to its new placement (after {}s; raise --timeout, or pass --no-wait)",
                options.timeout.as_secs()
            ))
        })??;
        if let Some(applies) = moved {
            outcome.applies = applies;
        }
    }
    if let Some(o) = observed {
        outcome.object = o;
    }
    Ok(())
}

/// `--restart`: restart the VM when the platform says the change waits for it, then take the
/// platform's verdict again (when waited for).
async fn restart_if_needed(
    cluster: &Cluster,
    platform_info: &Platform,
    vm: &VmRef,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
    outcome: &mut Outcome,
) -> Result<()> {
    let set = platform(platform_info.flavor);
    if options.restart && matches!(outcome.applies, Applies::AtRestart { .. }) {
        on_event(Event::Restarting);
        let lifecycle_options = lifecycle::Options {
            dry_run: DryRun::None,
            wait: options.wait,
            timeout: options.timeout,
            want_object: true,
        };
        let done = lifecycle::run(
            cluster,
            platform_info,
            &Action::Restart { force: false },
            vm,
            &lifecycle_options,
            &|e| on_event(Event::Lifecycle(e)),
        )
        .await?;
        outcome.restarted = true;
        if let Some(o) = done.object {
            if done.waited {
                outcome.applies = set.verdict(&o);
            }
            outcome.object = o;
        }
    }
    Ok(())
}

fn generation(o: &Value, pointer: &str) -> Option<i64> {
    o.pointer(pointer).and_then(Value::as_i64)
}

/// Whether the platform's controller has seen the object's current generation.
fn is_observed(o: &Value) -> bool {
    match (
        generation(o, "/metadata/generation"),
        generation(o, "/status/observedGeneration"),
    ) {
        (Some(g), Some(seen)) => seen >= g,
        _ => false,
    }
}

/// Watch the written VM from its resourceVersion until its controller observed the
/// generation written; `None` when the platform does not report `observedGeneration`.
async fn observe(
    cluster: &Cluster,
    kind: Kind,
    vm: &VmRef,
    written: &Value,
) -> Result<Option<Value>> {
    if is_observed(written) {
        return Ok(Some(written.clone()));
    }
    if written.pointer("/status/observedGeneration").is_none() {
        return Ok(None);
    }
    let api = kind.api(&cluster.client, Some(&vm.namespace));
    let rv = written
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("0")
        .to_owned();
    let params = WatchParams::default()
        .fields(&format!("metadata.name={}", vm.name))
        .timeout(290);
    let mut feed = crate::vm::restartable_watch(api, params, rv).boxed();
    while let Some(event) = feed.next().await {
        match event.map_err(|e| cluster.error(e, &kind.action("watch", Some(&vm.namespace))))? {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                let o = serde_json::to_value(o).unwrap_or_default();
                if is_observed(&o) {
                    return Ok(Some(o));
                }
            }
            WatchEvent::Deleted(_) => {
                return Err(Error::Platform(format!(
                    "{} {vm} was deleted",
                    kind.kind.to_lowercase()
                )));
            }
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(status) => {
                return Err(Error::from_status(
                    status.code,
                    &status.reason,
                    &status.message,
                    &kind.action("watch", Some(&vm.namespace)),
                    &cluster.server,
                ));
            }
        }
    }
    Err(Error::Internal("the watch ended unexpectedly".into()))
}

/// The fields that differ between two objects, sorted by path; `status` and the
/// server-managed metadata are left out. Arrays are compared whole.
pub fn diff(old: &Value, new: &Value) -> Vec<FieldChange> {
    let mut out = Vec::new();
    walk("", old, new, &mut out);
    out.sort_by(|a, b| a.field.cmp(&b.field));
    out.retain(|c| {
        !(c.field == "status"
            || c.field.starts_with("status.")
            || c.field.starts_with("metadata.managedFields")
            || c.field == "metadata.resourceVersion"
            || c.field == "metadata.generation")
    });
    out
}

fn join(prefix: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match (prefix.is_empty(), plain) {
        (true, _) => key.to_owned(),
        (false, true) => format!("{prefix}.{key}"),
        (false, false) => format!("{prefix}[{key}]"),
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn walk(path: &str, old: &Value, new: &Value, out: &mut Vec<FieldChange>) {
    if old == new {
        return;
    }
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                walk(&join(path, k), va, b.get(k).unwrap_or(&Value::Null), out);
            }
            for (k, vb) in b.iter().filter(|(k, _)| !a.contains_key(*k)) {
                walk(&join(path, k), &Value::Null, vb, out);
            }
        }
        // A map that appears or goes: one line per key.
        (Value::Null, Value::Object(_)) => walk(path, &Value::Object(Default::default()), new, out),
        (Value::Object(_), Value::Null) => walk(path, old, &Value::Object(Default::default()), out),
        (Value::Null, b) => out.push(FieldChange {
            field: path.to_owned(),
            old: None,
            new: Some(show(b)),
        }),
        (a, Value::Null) => out.push(FieldChange {
            field: path.to_owned(),
            old: Some(show(a)),
            new: None,
        }),
        (a, b) => out.push(FieldChange {
            field: path.to_owned(),
            old: Some(show(a)),
            new: Some(show(b)),
        }),
    }
}

/// Whether a condition `type_` of `vm` is `True`, and its message.
pub(crate) fn true_condition<'a>(vm: &'a Value, type_: &str) -> Option<&'a str> {
    lifecycle::condition(vm, type_)
        .filter(|c| c["status"] == "True")
        .map(|c| c["message"].as_str().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_names_each_changed_leaf() {
        let old = json!({"metadata": {"labels": {"a": "1", "app.kubernetes.io/name": "x"}, "resourceVersion": "1"},
            "spec": {"cpu": {"cores": 1}}, "status": {"phase": "Running"}});
        let new = json!({"metadata": {"labels": {"b": "2", "app.kubernetes.io/name": "y"}, "resourceVersion": "2"},
            "spec": {"cpu": {"cores": 2}}, "status": {"phase": "Stopped"}});
        let lines: Vec<String> = diff(&old, &new).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            lines,
            [
                "metadata.labels.a: 1 → (none)",
                "metadata.labels.b: (none) → 2",
                "metadata.labels[app.kubernetes.io/name]: x → y",
                "spec.cpu.cores: 1 → 2",
            ]
        );
    }

    #[test]
    fn observed_means_the_controller_saw_this_generation() {
        assert!(is_observed(
            &json!({"metadata": {"generation": 3}, "status": {"observedGeneration": 3}})
        ));
        assert!(!is_observed(
            &json!({"metadata": {"generation": 4}, "status": {"observedGeneration": 3}})
        ));
        assert!(!is_observed(&json!({"metadata": {"generation": 4}})));
    }

    #[test]
    fn object_at_makes_the_path() {
        let mut vm = json!({"spec": {}});
        crate::placement::object_at(&mut vm, "/spec/template/metadata/labels")
            .insert("a".into(), json!("1"));
        assert_eq!(vm["spec"]["template"]["metadata"]["labels"]["a"], "1");
    }
}
