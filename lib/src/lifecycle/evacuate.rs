//! Stopping what drains a node: `evacuate-cancel` (KubeVirt's `evacuate/cancel` subresource
//! on a VM, a VMI, or every VMI a node evacuates) and `migrate --cancel --all-on-node NODE`
//! (every migration leaving NODE deleted, as `migrate --cancel` deletes one).
//!
//! KubeVirt (`pkg/virt-api/api.go` routes `vm-evacuatecancel`/`vmi-evacuatecancel`, since
//! v1.8.0; handler `pkg/virt-api/rest/evacuate_cancel.go`): `PUT
//! /apis/subresources.kubevirt.io/v1/namespaces/NS/{virtualmachines|virtualmachineinstances}/NAME/evacuate/cancel`
//! with `EvacuateCancelOptions{evacuationNodeName, dryRun}`. The server removes the VMI's
//! `status.evacuationNodeName` after a JSON patch `test` that it still names the body's node;
//! a VMI without one answers 200 unchanged. virtctl's `evacuate-cancel` sends the VMI's
//! `status.nodeName` (`pkg/virtctl/vm/evacuate_cancel.go`); for a node, the VMIs whose
//! `status.evacuationNodeName` is that node are each cancelled with it. Removing the mark
//! stops the evacuation controller from starting new migrations for a drain; a migration
//! already running goes on unless it is cancelled too (`--all-on-node` does both).

use kube::api::ListParams;
use serde_json::{Value, json};

use super::kubevirt::subresource_path;
use super::migrations::{self, Migration};
use super::{DryRun, Event, Options, VmRef, text};
use crate::api::{KUBEVIRT_VMI, Kind};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;

/// What `evacuate-cancel` acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvacuateTarget {
    /// A VM (its VMI).
    Vm(VmRef),
    /// A VMI.
    Vmi(VmRef),
    /// Every VMI evacuated from a node.
    Node(String),
}

/// One VMI whose evacuation was cancelled (or would be, in a dry run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancelled {
    /// The VMI (or VM) the request went to.
    pub vmi: VmRef,
    /// The node named in the request.
    pub node: String,
    /// Whether the VMI was marked for evacuation (without a mark the server changes nothing).
    pub was_marked: bool,
}

/// Refuse on a platform without the subresource (exit 2, before any further request).
pub fn check(flavor: Flavor) -> Result<()> {
    match crate::platform::of(flavor).evacuate_cancel.reason() {
        None => Ok(()),
        Some(why) => Err(Error::InvalidTarget(why.to_owned())),
    }
}

/// Cancel the evacuation of `target`.
pub async fn evacuate_cancel(
    cluster: &Cluster,
    flavor: Flavor,
    target: &EvacuateTarget,
    dry_run: DryRun,
) -> Result<Vec<Cancelled>> {
    check(flavor)?;
    match target {
        EvacuateTarget::Vm(vm) => {
            let vmi = get_vmi(cluster, vm).await?;
            let node = running_node(&vmi, "VM", vm)?;
            let was_marked = !text(&vmi, "/status/evacuationNodeName").is_empty();
            put(cluster, "virtualmachines", vm, &node, dry_run).await?;
            Ok(vec![Cancelled {
                vmi: vm.clone(),
                node,
                was_marked,
            }])
        }
        EvacuateTarget::Vmi(vm) => {
            let vmi = get_vmi(cluster, vm).await?;
            let node = running_node(&vmi, "VMI", vm)?;
            let was_marked = !text(&vmi, "/status/evacuationNodeName").is_empty();
            put(cluster, "virtualmachineinstances", vm, &node, dry_run).await?;
            Ok(vec![Cancelled {
                vmi: vm.clone(),
                node,
                was_marked,
            }])
        }
        EvacuateTarget::Node(node) => {
            let mut done = vec![];
            for vmi in evacuated_from(cluster, node).await? {
                put(cluster, "virtualmachineinstances", &vmi, node, dry_run).await?;
                done.push(Cancelled {
                    vmi,
                    node: node.clone(),
                    was_marked: true,
                });
            }
            Ok(done)
        }
    }
}

async fn get_vmi(cluster: &Cluster, vm: &VmRef) -> Result<Value> {
    KUBEVIRT_VMI
        .api(&cluster.client, Some(&vm.namespace))
        .get(&vm.name)
        .await
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .map_err(|e| {
            cluster.error(
                e,
                &KUBEVIRT_VMI
                    .action("get", Some(&vm.namespace))
                    .named(&vm.name),
            )
        })
}

fn running_node(vmi: &Value, what: &str, vm: &VmRef) -> Result<String> {
    match text(vmi, "/status/nodeName") {
        "" => Err(Error::Platform(format!(
            "{what} {vm} reports no node: it is not running, so nothing evacuates it"
        ))),
        node => Ok(node.to_owned()),
    }
}

/// The VMIs (all namespaces) marked for evacuation from `node`, sorted.
async fn evacuated_from(cluster: &Cluster, node: &str) -> Result<Vec<VmRef>> {
    let list = KUBEVIRT_VMI
        .api(&cluster.client, None)
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.error(e, &KUBEVIRT_VMI.action("list", None)))?;
    let mut vmis: Vec<VmRef> = list
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .filter(|v| text(v, "/status/evacuationNodeName") == node)
        .map(|v| VmRef {
            namespace: text(&v, "/metadata/namespace").to_owned(),
            name: text(&v, "/metadata/name").to_owned(),
        })
        .collect();
    vmis.sort();
    Ok(vmis)
}

async fn put(
    cluster: &Cluster,
    plural: &str,
    vm: &VmRef,
    node: &str,
    dry_run: DryRun,
) -> Result<()> {
    if dry_run == DryRun::Client {
        return Ok(());
    }
    let mut body = json!({"evacuationNodeName": node});
    if dry_run == DryRun::Server {
        body["dryRun"] = json!(["All"]);
    }
    let request = http::Request::put(subresource_path(plural, vm, "evacuate/cancel"))
        .header("content-type", "application/json")
        .body(body.to_string().into_bytes())
        .map_err(|e| Error::Internal(e.to_string()))?;
    let kind = if plural == "virtualmachines" {
        crate::api::KUBEVIRT_VM
    } else {
        KUBEVIRT_VMI
    };
    cluster
        .client
        .request_text(request)
        .await
        .map(drop)
        .map_err(|e| {
            cluster.error(
                e,
                &kind.action("update", Some(&vm.namespace)).named(&vm.name),
            )
        })
}

/// What `--all-on-node` found and did.
#[derive(Debug, Clone, Default)]
pub struct NodeCancel {
    /// Evacuations cancelled (KubeVirt: VMIs whose mark was removed first, so the drain does
    /// not start their migrations again).
    pub evacuations: Vec<Cancelled>,
    /// Migrations deleted, with their rows as they were.
    pub migrations: Vec<Migration>,
}

/// `migrate --cancel --all-on-node NODE`: on platforms with `evacuate/cancel`, the
/// evacuations from NODE are cancelled; then every migration leaving NODE (all namespaces)
/// is deleted with its uid as a precondition (Deckhouse: deleting an evacuation operation is
/// how its evacuation controller learns to cancel the evacuation, `evacuation.go`
/// `cancelEvacuationForTerminatingVMOPs`).
pub async fn cancel_on_node(
    cluster: &Cluster,
    flavor: Flavor,
    node: &str,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<NodeCancel> {
    let mut done = NodeCancel::default();
    if check(flavor).is_ok() {
        done.evacuations = evacuate_cancel(
            cluster,
            flavor,
            &EvacuateTarget::Node(node.to_owned()),
            options.dry_run,
        )
        .await?;
    }
    let kind: Kind = migrations::kind(flavor);
    let list = migrations::list(cluster, flavor, None, None).await?;
    for m in list
        .items
        .into_iter()
        .filter(|m| !m.finished && m.source == node)
    {
        let vm = VmRef {
            namespace: m.namespace.clone(),
            name: m.vm.clone(),
        };
        let blank = super::Done {
            vm: vm.clone(),
            waited: false,
            migrated: None,
            object: None,
        };
        super::cancel_migration(cluster, kind, &vm, &m.object, options, on_event, blank).await?;
        done.migrations.push(m);
    }
    Ok(done)
}
