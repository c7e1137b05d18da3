//! Power actions and live migration: `start`, `stop`, `restart`, `pause`, `unpause`,
//! `soft-reboot`, `reset`, `evict`, `migrate` (and cancelling a migration), for one VM at a time.
//!
//! KubeVirt: PUTs on `subresources.kubevirt.io/v1` (see [`kubevirt`]); Deckhouse: a
//! VirtualMachineOperation (see [`deckhouse`]). Waiting watches the objects involved (never
//! polls) and ends early with the platform's reason when the VM cannot get there. Progress
//! is reported as [`Event`]s; the caller renders them.

pub mod deckhouse;
pub mod evacuate;
pub mod kubevirt;
pub mod migrations;
pub(crate) mod watch;

pub use crate::api::DryRun;
use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::ListParams;
use serde_json::Value;

use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::{Flavor, Platform};

/// What to do to a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start it (KubeVirt: optionally paused).
    Start {
        /// Start with the guest paused (KubeVirt only).
        paused: bool,
    },
    /// Stop it.
    Stop {
        /// Shutdown grace period in seconds (KubeVirt).
        grace_period: Option<i64>,
        /// Stop at once.
        force: bool,
    },
    /// Restart it.
    Restart {
        /// Restart at once (KubeVirt: `gracePeriodSeconds: 0`; Deckhouse: `spec.force`).
        force: bool,
    },
    /// Pause the guest (KubeVirt only).
    Pause,
    /// Resume a paused guest (KubeVirt only).
    Unpause,
    /// Ask the guest to reboot (KubeVirt only).
    SoftReboot,
    /// Reset the virtual machine like its reset button: no ACPI and no guest agent needed,
    /// nothing is flushed (KubeVirt only).
    Reset,
    /// Move it off its node (Deckhouse: Evict; KubeVirt: a migration to any other node).
    Evict {
        /// Deckhouse: allow AutoConverge (CPU throttling).
        force: bool,
    },
    /// Live-migrate it.
    Migrate {
        /// Node labels the target must have (`--target-node` becomes
        /// `kubernetes.io/hostname`).
        node_selector: BTreeMap<String, String>,
        /// Deckhouse: allow AutoConverge (CPU throttling).
        force: bool,
    },
    /// Cancel its running migration.
    CancelMigration,
}

impl Action {
    /// The command's name: `start`, `soft-reboot`, …
    pub fn verb(&self) -> &'static str {
        match self {
            Action::Start { .. } => "start",
            Action::Stop { .. } => "stop",
            Action::Restart { .. } => "restart",
            Action::Pause => "pause",
            Action::Unpause => "unpause",
            Action::SoftReboot => "soft-reboot",
            Action::Reset => "reset",
            Action::Evict { .. } => "evict",
            Action::Migrate { .. } => "migrate",
            Action::CancelMigration => "cancel the migration of",
        }
    }

    /// The word in result lines: `started`, `migration cancelled`, …
    pub fn past(&self) -> &'static str {
        match self {
            Action::Start { .. } => "started",
            Action::Stop { .. } => "stopped",
            Action::Restart { .. } => "restarted",
            Action::Pause => "paused",
            Action::Unpause => "unpaused",
            Action::SoftReboot => "soft-rebooted",
            Action::Reset => "reset",
            Action::Evict { .. } => "evicted",
            Action::Migrate { .. } => "migrated",
            Action::CancelMigration => "migration cancelled",
        }
    }

    /// Whether progress is a migration (a bar rather than a spinner).
    pub fn is_migration(&self) -> bool {
        matches!(self, Action::Evict { .. } | Action::Migrate { .. })
    }

    /// Check the action against the platform before any request; the error is a usage
    /// error (one line, exit 2).
    pub fn check(&self, flavor: Flavor, dry_run: DryRun) -> Result<()> {
        let caps = crate::platform::of(flavor);
        let refuse = |support: crate::platform::Support, say: &dyn Fn(&str) -> String| {
            support
                .reason()
                .map_or(Ok(()), |why| Err(Error::InvalidTarget(say(why))))
        };
        match self {
            Action::Pause | Action::Unpause | Action::SoftReboot | Action::Reset => {
                refuse(caps.guest_power, &|why| format!("{} {why}", self.verb()))?;
                if dry_run == DryRun::Server && matches!(self, Action::SoftReboot | Action::Reset) {
                    let name = if *self == Action::Reset {
                        "reset"
                    } else {
                        "softreboot"
                    };
                    refuse(caps.guest_power_server_dry_run, &|why| {
                        format!("{}'s {name} {why}", flavor.display_name())
                    })?;
                }
                Ok(())
            }
            Action::Start { paused: true } => refuse(caps.start_paused, &str::to_owned),
            Action::Stop {
                grace_period: Some(_),
                ..
            } => refuse(caps.stop_grace_period, &str::to_owned),
            Action::Migrate { force: true, .. } | Action::Evict { force: true } => {
                refuse(caps.migration_force, &str::to_owned)
            }
            _ => Ok(()),
        }
    }
}

/// How to run an action.
#[derive(Debug, Clone)]
pub struct Options {
    /// Dry run strategy.
    pub dry_run: DryRun,
    /// Wait for the end state.
    pub wait: bool,
    /// How long to wait.
    pub timeout: Duration,
    /// Read the VM once more at the end (for `-o json`).
    pub want_object: bool,
}

/// One VM.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct VmRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for VmRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Progress of one action.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The platform accepted the request (`detail` names what it created, if anything).
    Accepted {
        /// The VM.
        vm: VmRef,
        /// e.g. `virtualmachineoperation web-x7k2p`.
        detail: Option<String>,
    },
    /// Something worth telling (a runStrategy change, …).
    Notice {
        /// The VM.
        vm: VmRef,
        /// One sentence.
        message: String,
    },
    /// The VM (or its operation) is in a new phase.
    Phase {
        /// The VM.
        vm: VmRef,
        /// Phase as the platform names it.
        phase: String,
    },
    /// A migration moved on.
    Migration {
        /// The VM.
        vm: VmRef,
        /// Phase (KubeVirt migration phase, Deckhouse operation phase).
        phase: String,
        /// Percent done: Deckhouse `progress`; KubeVirt: how far through its phases.
        percent: f64,
        /// Mode, nodes, … (one line).
        detail: String,
    },
}

/// How an action ended.
#[derive(Debug, Clone)]
pub struct Done {
    /// The VM.
    pub vm: VmRef,
    /// Whether it waited for the end state.
    pub waited: bool,
    /// For a migration that ended: source node, target node, duration.
    pub migrated: Option<(String, String, Duration)>,
    /// The VM after the action (when [`Options::want_object`]).
    pub object: Option<Value>,
}

/// Which VMs a bulk action works on.
#[derive(Debug, Clone)]
pub enum Selection {
    /// Named VMs.
    Names(Vec<VmRef>),
    /// VMs matching a label selector in `namespace` (all namespaces when `None`).
    Selector {
        /// Label selector.
        selector: String,
        /// Namespace, or all.
        namespace: Option<String>,
    },
    /// Every VM in `namespace` (all namespaces when `None`).
    All {
        /// Namespace, or all.
        namespace: Option<String>,
    },
}

/// The VMs a selection names, sorted. Named VMs are taken as given (a missing one fails
/// when acted on); selectors and `--all` list the VMs.
pub async fn select(
    cluster: &Cluster,
    flavor: Flavor,
    selection: &Selection,
) -> Result<Vec<VmRef>> {
    let (selector, namespace) = match selection {
        Selection::Names(names) => return Ok(names.clone()),
        Selection::Selector {
            selector,
            namespace,
        } => (Some(selector.as_str()), namespace.as_deref()),
        Selection::All { namespace } => (None, namespace.as_deref()),
    };
    let kind = Kind::vm(flavor);
    let mut params = ListParams::default();
    if let Some(s) = selector {
        params = params.labels(s);
    }
    let list = kind
        .api(&cluster.client, namespace)
        .list(&params)
        .await
        .map_err(|e| cluster.error(e, &kind.action("list", namespace)))?;
    let mut vms: Vec<VmRef> = list
        .items
        .into_iter()
        .map(|o| VmRef {
            namespace: o.metadata.namespace.unwrap_or_default(),
            name: o.metadata.name.unwrap_or_default(),
        })
        .collect();
    vms.sort();
    Ok(vms)
}

/// Run `action` on one VM, reporting progress through `on_event`.
pub async fn run(
    cluster: &Cluster,
    platform: &Platform,
    action: &Action,
    vm: &VmRef,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Done> {
    let work = async {
        match platform.flavor {
            Flavor::KubeVirt => kubevirt::run(cluster, action, vm, options, on_event).await,
            Flavor::Deckhouse => deckhouse::run(cluster, action, vm, options, on_event).await,
        }
    };
    // The timeout bounds the whole action; without --wait it only guards the requests.
    match tokio::time::timeout(options.timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout(format!(
            "virtual machine {vm} to be {} (after {}s; raise --timeout, or pass --no-wait)",
            action.past(),
            options.timeout.as_secs()
        ))),
    }
}

/// `migrate --cancel`: deletes the active migration object `migration` (a KubeVirt
/// VirtualMachineInstanceMigration or a Deckhouse Migrate/Evict operation) with its uid as a
/// precondition, so a newer object of the same name is never removed, then waits for it to go
/// when asked. Dry runs return before anything is deleted (client) or after the server checked
/// the delete (server).
pub(crate) async fn cancel_migration(
    cluster: &Cluster,
    kind: Kind,
    vm: &VmRef,
    migration: &Value,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
    mut done: Done,
) -> Result<Done> {
    let name = text(migration, "/metadata/name").to_owned();
    if options.dry_run == DryRun::Client {
        return Ok(done);
    }
    let uid = text(migration, "/metadata/uid");
    let params = kube::api::DeleteParams {
        dry_run: options.dry_run == DryRun::Server,
        preconditions: (!uid.is_empty()).then(|| kube::api::Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    kind.api(&cluster.client, Some(&vm.namespace))
        .delete(&name, &params)
        .await
        .map_err(|e| cluster.error(e, &kind.action("delete", Some(&vm.namespace)).named(&name)))?;
    if options.dry_run == DryRun::Server {
        return Ok(done);
    }
    on_event(Event::Accepted {
        vm: vm.clone(),
        detail: Some(format!("{} {name} deleted", kind.kind.to_lowercase())),
    });
    if options.wait {
        let w = watch::Watched::new(kind, &vm.namespace, &name);
        watch::until(cluster, &[w], |objs| objs[0].is_none().then_some(Ok(()))).await?;
        done.waited = true;
    }
    Ok(done)
}

/// Read VM `vm` (NotFound names it).
pub(crate) async fn get_vm(cluster: &Cluster, flavor: Flavor, vm: &VmRef) -> Result<Value> {
    let kind = Kind::vm(flavor);
    kind.api(&cluster.client, Some(&vm.namespace))
        .get(&vm.name)
        .await
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .map_err(|e| cluster.error(e, &kind.action("get", Some(&vm.namespace)).named(&vm.name)))
}

/// `--target-node NODE` must name a node (d8 checks this too). Users who may not read nodes
/// (a 403) are not stopped: the migration then fails with the platform's reason.
pub(crate) async fn check_target_node(cluster: &Cluster, action: &Action) -> Result<()> {
    let Action::Migrate { node_selector, .. } = action else {
        return Ok(());
    };
    let Some(node) = node_selector.get("kubernetes.io/hostname") else {
        return Ok(());
    };
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(cluster.client.clone());
    match api.get_metadata_opt(node).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(Error::Platform(format!(
            "there is no node named {node:?} in the cluster; `kubectl get nodes` lists them"
        ))),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        Err(e) => Err(cluster.error(
            e,
            &crate::error::Action::new("get", "nodes", "node").named(node),
        )),
    }
}

/// A string at `pointer`, or "".
pub(crate) fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The condition `type_` of an object, if present.
pub(crate) fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
}

/// Parse `k=v,k2=v2` (a node selector) locally; the error is a usage error.
pub fn parse_node_selector(text: &str) -> Result<BTreeMap<String, String>> {
    let mut map = BTreeMap::new();
    for pair in text.split(',').filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(Error::InvalidTarget(format!(
                "invalid --node-selector {text:?}: expected key=value[,key=value...]"
            )));
        };
        if k.is_empty() {
            return Err(Error::InvalidTarget(format!(
                "invalid --node-selector {text:?}: empty label key"
            )));
        }
        map.insert(k.to_owned(), v.to_owned());
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_selectors_parse() {
        let m = parse_node_selector("a=1,kubernetes.io/hostname=node-2").unwrap();
        assert_eq!(m["kubernetes.io/hostname"], "node-2");
        assert_eq!(m.len(), 2);
        assert!(parse_node_selector("a").is_err());
        assert!(parse_node_selector("=1").is_err());
    }

    #[test]
    fn deckhouse_refuses_kubevirt_only_actions() {
        for a in [
            Action::Pause,
            Action::Unpause,
            Action::SoftReboot,
            Action::Reset,
        ] {
            let e = a.check(Flavor::Deckhouse, DryRun::None).unwrap_err();
            assert!(e.to_string().contains("not supported by Deckhouse"), "{e}");
            assert!(a.check(Flavor::KubeVirt, DryRun::None).is_ok());
        }
        assert!(
            Action::SoftReboot
                .check(Flavor::KubeVirt, DryRun::Server)
                .is_err()
        );
    }
}
