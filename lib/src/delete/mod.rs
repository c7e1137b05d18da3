//! Deleting a VM with the disks kubectl-vm created for it, or keeping those disks so the VM
//! can be recreated from the same declaration with its data.
//!
//! Which disks belong to a VM:
//! - KubeVirt: the DataVolumes of `spec.dataVolumeTemplates` that the VM owns (garbage
//!   collected with it) and DataVolumes labelled with [`companion_selector`] (the standalone
//!   boot DataVolume `create` makes for `--url` with a checksum).
//! - Deckhouse: VirtualDisks labelled with [`companion_selector`] (not owned by the VM).
//!
//! Disks the user brought (not labelled, not templates) are never touched. Secrets owned by
//! the VM always go with it. Keeping owned DataVolumes means an Orphan delete of the VM (the
//! garbage collector removes just the VM's ownerReference) followed by deleting the VMI and
//! Secrets the collector would otherwise have taken.

pub mod pool;

use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, ListParams};
use serde_json::Value;

use crate::api::{Kind, SECRET};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Platform;
use crate::names::companion_selector;

/// An object that goes (or stays) with the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Companion {
    /// Its kind.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// Whether the VM owns it (an ownerReference with the VM's uid): the garbage collector
    /// deletes it with the VM.
    pub owned: bool,
    /// Its uid as read (deletes carry it as a precondition); empty when unknown.
    pub uid: String,
}

impl Companion {
    /// `kind.group "name"`, as kubectl names objects in `deleted` lines.
    pub fn display(&self) -> String {
        quoted_ref(&self.kind, &self.name)
    }
}

/// `virtualmachine.kubevirt.io "web"`, `secret "web-cloudinit"`.
pub fn quoted_ref(kind: &Kind, name: &str) -> String {
    let kind_name = kind.kind.to_ascii_lowercase();
    if kind.group.is_empty() {
        format!("{kind_name} {name:?}")
    } else {
        format!("{kind_name}.{} {name:?}", kind.group)
    }
}

/// What deleting one VM involves.
#[derive(Debug, Clone)]
pub struct DeletePlan {
    /// The VM kind of the platform.
    pub vm_kind: Kind,
    /// The platform's instance kind, when a running VM has one apart from the VM (KubeVirt's
    /// VirtualMachineInstance, which the VM owns).
    pub instance_kind: Option<Kind>,
    /// VM name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// VM uid (guards the delete against a VM recreated meanwhile).
    pub uid: String,
    /// Disks created for the VM.
    pub disks: Vec<Companion>,
    /// Whether the disks stay.
    pub keep_disks: bool,
    /// Secrets owned by the VM (they always go with it).
    pub secrets: Vec<Companion>,
    /// Deckhouse: the disk attachments (VMBDAs) `disk attach` made for the VM; they always go
    /// with it (the disks they attach follow `keep_disks`).
    pub attachments: Vec<Companion>,
    /// Deckhouse: the VirtualMachineIPAddress `create --ip` made for the VM (it names it in
    /// `spec.virtualMachineIPAddressName`, kubectl-vm's labels on it); it goes with the VM
    /// unless `keep_ip`.
    pub ips: Vec<Companion>,
    /// Whether the VM's address object stays (`--keep-ip`), so a VM created again with the
    /// same name gets the same address.
    pub keep_ip: bool,
    /// The VirtualMachinePool controlling the VM, if it is a KubeVirt pool's replica (the
    /// pool would make it again).
    pub pool: Option<String>,
}

impl DeletePlan {
    /// The VM as kubectl names it: `virtualmachine.kubevirt.io "web"`.
    pub fn vm_display(&self) -> String {
        quoted_ref(&self.vm_kind, &self.name)
    }
}

/// The Secrets of `list` owned by the object with `uid`, as companions to report.
pub(crate) fn owned_secrets(
    list: impl IntoIterator<Item = DynamicObject>,
    uid: &str,
) -> Vec<Companion> {
    list.into_iter()
        .map(to_value)
        .filter(|s| owned_by(s, uid))
        .map(|s| Companion {
            kind: SECRET,
            name: s["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            owned: true,
            uid: s["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}

/// Whether `object` has an ownerReference with `uid`.
pub(crate) fn owned_by(object: &Value, uid: &str) -> bool {
    object
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
}

pub(crate) fn to_value(object: DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or_default()
}

/// Find the VM and what goes with it. NotFound names the VM.
pub async fn plan(
    cluster: &Cluster,
    platform: &Platform,
    name: &str,
    namespace: &str,
    keep_disks: bool,
) -> Result<DeletePlan> {
    let vm_kind = Kind::vm(platform.flavor);
    let vm = match vm_kind
        .api(&cluster.client, Some(namespace))
        .get(name)
        .await
    {
        Ok(vm) => to_value(vm),
        Err(e) => {
            let err = cluster.error(e, &vm_kind.action("get", Some(namespace)).named(name));
            return Err(cluster.explain_not_found(err, namespace).await);
        }
    };
    let uid = vm["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let caps = crate::platform::of(platform.flavor);
    let selector = ListParams::default().labels(&companion_selector(name));
    let disks = disks(cluster, caps, &vm, namespace, &selector).await?;
    // Owned Secrets go with the VM anyway; listing them only makes the output complete, so a
    // user who may not list Secrets still deletes the VM.
    let secrets = match SECRET
        .api(&cluster.client, Some(namespace))
        .list(&selector)
        .await
    {
        Ok(list) => owned_secrets(list, &uid),
        Err(_) => Vec::new(),
    };
    let attachments = match caps.attachments {
        Some(vmbda) => attachments(cluster, vmbda, name, namespace, &selector).await?,
        None => Vec::new(),
    };
    let ips = fixed_ip(cluster, &vm, namespace)
        .await?
        .into_iter()
        .collect();
    let pool = vm
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|r| r["controller"] == true && r["kind"] == "VirtualMachinePool")
        .and_then(|r| r["name"].as_str())
        .map(str::to_owned);
    Ok(DeletePlan {
        vm_kind,
        instance_kind: caps.instance,
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        uid,
        disks,
        keep_disks,
        secrets,
        attachments,
        ips,
        keep_ip: false,
        pool,
    })
}

/// The VM's disks, each once: those its disk templates made (only while the VM owns them) and
/// those labelled as its companions. KubeVirt without CDI serves no DataVolumes: then the VM
/// has no disks of its own.
async fn disks(
    cluster: &Cluster,
    caps: &crate::platform::Capabilities,
    vm: &Value,
    namespace: &str,
    selector: &ListParams,
) -> Result<Vec<Companion>> {
    let uid = vm["metadata"]["uid"].as_str().unwrap_or_default();
    let disk_kind = caps.disk;
    let mut disks: Vec<Companion> = Vec::new();
    let add = |disks: &mut Vec<Companion>, object: &Value| {
        let disk_name = object["metadata"]["name"].as_str().unwrap_or_default();
        if !disk_name.is_empty() && !disks.iter().any(|d| d.name == disk_name) {
            disks.push(Companion {
                kind: disk_kind,
                name: disk_name.to_owned(),
                owned: owned_by(object, uid),
                uid: object["metadata"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            });
        }
    };
    let disk_api = disk_kind.api(&cluster.client, Some(namespace));
    if let Some(pointer) = caps.disk_templates {
        let templates = vm
            .pointer(pointer)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|t| t.pointer("/metadata/name").and_then(Value::as_str));
        for dv_name in templates {
            let found = disk_api.get_opt(dv_name).await.map_err(|e| {
                cluster.error(e, &disk_kind.action("get", Some(namespace)).named(dv_name))
            })?;
            // Only a disk the VM owns is its template's disk; one that replaced it (neither
            // owned nor labelled as ours, which the list below finds) is not ours.
            if let Some(dv) = found.map(to_value).filter(|dv| owned_by(dv, uid)) {
                add(&mut disks, &dv);
            }
        }
    }
    let labelled = match disk_api.list(selector).await {
        Ok(list) => list.items,
        Err(e) => match cluster.error(e, &disk_kind.action("list", Some(namespace))) {
            Error::NotServed { .. } => Vec::new(),
            other => return Err(other),
        },
    };
    for disk in labelled {
        add(&mut disks, &to_value(disk));
    }
    Ok(disks)
}

/// The VM's disk attachments where they are objects of their own (`vmbda`, Deckhouse): they
/// name the VM and would otherwise outlive it.
async fn attachments(
    cluster: &Cluster,
    vmbda: Kind,
    name: &str,
    namespace: &str,
    selector: &ListParams,
) -> Result<Vec<Companion>> {
    let list = vmbda
        .api(&cluster.client, Some(namespace))
        .list(selector)
        .await
        .map_err(|e| cluster.error(e, &vmbda.action("list", Some(namespace))))?;
    Ok(list
        .items
        .into_iter()
        .map(to_value)
        .filter(|b| {
            b.pointer("/spec/virtualMachineName")
                .and_then(Value::as_str)
                == Some(name)
        })
        .map(|b| Companion {
            kind: vmbda,
            name: b["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            owned: false,
            uid: b["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
        })
        .collect())
}

/// The fixed address the VM names (Deckhouse's VirtualMachineIPAddress), only when
/// kubectl-vm made it for this VM: one the user brought stays.
async fn fixed_ip(cluster: &Cluster, vm: &Value, namespace: &str) -> Result<Option<Companion>> {
    let Some(ip_name) = vm
        .pointer("/spec/virtualMachineIPAddressName")
        .and_then(Value::as_str)
    else {
        return Ok(None);
    };
    let name = vm["metadata"]["name"].as_str().unwrap_or_default();
    let uid = vm["metadata"]["uid"].as_str().unwrap_or_default();
    let kind = crate::api::VIRTUAL_MACHINE_IP_ADDRESS;
    let found = kind
        .api(&cluster.client, Some(namespace))
        .get_opt(ip_name)
        .await
        .map_err(|e| cluster.error(e, &kind.action("get", Some(namespace)).named(ip_name)))?
        .map(to_value);
    Ok(found
        .filter(|o| {
            let labels = &o["metadata"]["labels"];
            labels[crate::names::VM_LABEL] == name
                && labels[crate::names::MANAGED_BY_LABEL] == crate::names::MANAGED_BY
        })
        .map(|ip| Companion {
            kind,
            name: ip_name.to_owned(),
            owned: owned_by(&ip, uid),
            uid: ip["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        }))
}

/// Delete parameters with a uid precondition (none when `uid` is empty).
pub(crate) fn guarded(mut params: DeleteParams, uid: &str, server_dry_run: bool) -> DeleteParams {
    params.dry_run = server_dry_run;
    params.preconditions = (!uid.is_empty()).then(|| kube::api::Preconditions {
        uid: Some(uid.to_owned()),
        resource_version: None,
    });
    params
}

/// Carry out the plan: delete the VM; without `keep_disks`, then the disks the VM does not
/// own (owned ones are garbage collected). Every delete carries the uid read by [`plan`], so
/// an object replaced meanwhile is never removed. `server_dry_run` sends `dryRun=All`.
///
/// With `keep_disks` and disks the VM owns, the VM is deleted with propagationPolicy
/// Orphan: the garbage collector then removes only the VM's ownerReference from its
/// dependents (other owners stay), and while the VM is being deleted KubeVirt no longer
/// adopts the disks (releasing them before the delete raced with that adoption). What the
/// collector would have taken (the VMI, the owned Secrets) is deleted here instead.
pub async fn execute(cluster: &Cluster, plan: &DeletePlan, server_dry_run: bool) -> Result<()> {
    let ns = Some(plan.namespace.as_str());
    let orphan = plan.keep_disks && plan.disks.iter().any(|d| d.owned);
    let mut dependents: Vec<Companion> = Vec::new();
    if orphan {
        if let Some(instance) = plan.instance_kind {
            let vmi = instance
                .api(&cluster.client, ns)
                .get_opt(&plan.name)
                .await
                .map_err(|e| {
                    cluster.error(e, &instance.action("get", ns).named(plan.name.as_str()))
                })?
                .map(to_value);
            if let Some(vmi) = vmi.filter(|v| owned_by(v, &plan.uid)) {
                dependents.push(Companion {
                    kind: instance,
                    name: plan.name.clone(),
                    owned: true,
                    uid: vmi["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                });
            }
        }
        dependents.extend(plan.secrets.iter().cloned());
    }
    let propagation = if orphan {
        DeleteParams::orphan()
    } else {
        DeleteParams::background()
    };
    plan.vm_kind
        .api(&cluster.client, ns)
        .delete(&plan.name, &guarded(propagation, &plan.uid, server_dry_run))
        .await
        .map_err(|e| {
            cluster.error(
                e,
                &plan.vm_kind.action("delete", ns).named(plan.name.as_str()),
            )
        })?;
    let mut rest: Vec<&Companion> = dependents.iter().collect();
    rest.extend(plan.attachments.iter());
    if !plan.keep_ip {
        rest.extend(plan.ips.iter());
    }
    if !plan.keep_disks {
        rest.extend(plan.disks.iter().filter(|d| !d.owned));
    }
    for object in rest {
        let params = guarded(DeleteParams::background(), &object.uid, server_dry_run);
        match object
            .kind
            .api(&cluster.client, ns)
            .delete(&object.name, &params)
            .await
        {
            Ok(_) => {}
            // Gone already, or replaced by an object that is not ours.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(e) => {
                return Err(cluster.error(
                    e,
                    &object.kind.action("delete", ns).named(object.name.as_str()),
                ));
            }
        }
    }
    Ok(())
}

/// Wait until the VM, its VMI (KubeVirt) and the deleted disks are gone, polling. On
/// timeout the error names what is still there.
pub async fn wait_gone(
    cluster: &Cluster,
    platform: &Platform,
    plan: &DeletePlan,
    timeout: Duration,
) -> Result<()> {
    let ns = plan.namespace.as_str();
    let mut watched: Vec<(Kind, String)> = vec![(plan.vm_kind, plan.name.clone())];
    if let Some(instance) = crate::platform::of(platform.flavor).instance {
        watched.push((instance, plan.name.clone()));
    }
    if !plan.keep_disks {
        watched.extend(plan.disks.iter().map(|d| (d.kind, d.name.clone())));
    }
    poll_until_gone(timeout, Duration::from_millis(250), || {
        let watched = &watched;
        async move {
            let mut present = Vec::new();
            for (kind, name) in watched {
                let found = kind
                    .api(&cluster.client, Some(ns))
                    .get_opt(name)
                    .await
                    .map_err(|e| cluster.error(e, &kind.action("get", Some(ns)).named(name)))?;
                // A VM recreated under the same name meanwhile is not waited for.
                let same = found.is_some_and(|o| {
                    kind != &plan.vm_kind || o.metadata.uid.as_deref() == Some(plan.uid.as_str())
                });
                if same {
                    present.push(quoted_ref(kind, name));
                }
            }
            Ok(present)
        }
    })
    .await
}

/// Probe every `interval` until the probe finds nothing remaining, or fail with
/// [`Error::Timeout`] naming what remained.
pub async fn poll_until_gone<F, Fut>(
    timeout: Duration,
    interval: Duration,
    mut probe: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<String>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let remaining = probe().await?;
        if remaining.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() + interval > deadline {
            return Err(Error::Timeout(format!(
                "{} to be deleted",
                remaining.join(", ")
            )));
        }
        tokio::time::sleep(interval).await;
    }
}

/// What deleting the VM as `plan` says leaves in place, from its dependency graph
/// ([`crate::deps`]): objects it used that are not deleted with it (Secrets, ConfigMaps, disks
/// the user brought) and objects made from it or pointing at it (snapshots, exports,
/// Services). One `kind.group "name" (why)` per object; kept disks are reported already.
pub fn stays_behind(plan: &DeletePlan, graph: &crate::deps::Graph) -> Vec<String> {
    let goes = |kind: &str, name: &str| {
        plan.disks
            .iter()
            .chain(&plan.secrets)
            .chain(&plan.attachments)
            .any(|c| c.kind.kind == kind && c.name == name)
    };
    let line = |n: &crate::deps::Node, why: &str| {
        let r = &n.object_reference;
        let kind = r.kind.to_ascii_lowercase();
        let shown = if r.api_group.is_empty() {
            format!("{kind} {:?}", r.name)
        } else {
            format!("{kind}.{} {:?}", r.api_group, r.name)
        };
        format!("{shown} ({why})")
    };
    // The instance, its pod and the claims of disks that go are collected with the VM;
    // optional cluster-wide things (classes, instance types) are not the VM's to mention.
    const WITH_VM: &[&str] = &[
        "VirtualMachineInstance",
        "Pod",
        "ControllerRevision",
        "VirtualMachineIPAddress",
    ];
    let mut lines: Vec<String> = graph
        .depends_on
        .iter()
        .filter(|n| n.exists && !n.optional)
        .filter(|n| !WITH_VM.contains(&n.object_reference.kind.as_str()))
        .filter(|n| !goes(&n.object_reference.kind, &n.object_reference.name))
        .map(|n| line(n, "used by the VM, not deleted with it"))
        .collect();
    lines.extend(
        graph
            .dependents
            .iter()
            .map(|n| line(n, "refers to the VM, not deleted with it")),
    );
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DATA_VOLUME, VIRTUAL_DISK};
    use serde_json::json;

    #[tokio::test]
    async fn polling_times_out_naming_what_remains() {
        let err = poll_until_gone(
            Duration::from_millis(60),
            Duration::from_millis(20),
            || async { Ok(vec![quoted_ref(&DATA_VOLUME, "web-root")]) },
        )
        .await
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "timed out waiting for datavolume.cdi.kubevirt.io \"web-root\" to be deleted"
        );
    }

    #[tokio::test]
    async fn polling_ends_when_everything_is_gone() {
        let mut rounds = 0;
        poll_until_gone(Duration::from_secs(5), Duration::from_millis(1), || {
            rounds += 1;
            let left = if rounds < 3 {
                vec!["x".to_owned()]
            } else {
                vec![]
            };
            async move { Ok(left) }
        })
        .await
        .unwrap();
        assert_eq!(rounds, 3);
    }

    #[test]
    fn refs_like_kubectl() {
        assert_eq!(quoted_ref(&SECRET, "s"), "secret \"s\"");
        assert_eq!(
            quoted_ref(&VIRTUAL_DISK, "web-root"),
            "virtualdisk.virtualization.deckhouse.io \"web-root\""
        );
        let vm = json!({"metadata": {"ownerReferences": [{"uid": "u1"}]}});
        assert!(owned_by(&vm, "u1") && !owned_by(&vm, "u2"));
    }

    #[test]
    fn what_stays_is_what_the_delete_does_not_take() {
        use crate::deps::{Graph, Node, ObjectRef};
        let plan = DeletePlan {
            vm_kind: crate::api::KUBEVIRT_VM,
            instance_kind: None,
            name: "web".into(),
            namespace: "dev".into(),
            uid: "u".into(),
            disks: vec![],
            keep_disks: false,
            secrets: vec![Companion {
                kind: SECRET,
                name: "web-cloudinit".into(),
                owned: true,
                uid: String::new(),
            }],
            attachments: vec![],
            ips: vec![],
            keep_ip: false,
            pool: None,
        };
        let graph = Graph {
            object_reference: ObjectRef {
                api_group: "kubevirt.io".into(),
                kind: "VirtualMachine".into(),
                name: "web".into(),
                namespace: Some("dev".into()),
            },
            depends_on: vec![
                Node::new("kubevirt.io", "VirtualMachineInstance", "web", Some("dev")),
                Node::new("", "Secret", "web-cloudinit", Some("dev")),
                Node::new("", "Secret", "keys", Some("dev")),
            ],
            dependents: vec![Node::new("", "Service", "web-ssh", Some("dev"))],
            owned_by: vec![],
        };
        assert_eq!(
            stays_behind(&plan, &graph),
            [
                "secret \"keys\" (used by the VM, not deleted with it)",
                "service \"web-ssh\" (refers to the VM, not deleted with it)",
            ]
        );
    }
}
