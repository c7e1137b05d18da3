//! Deckhouse: `restore SNAPSHOT --new-vm NEW`, a VirtualMachineSnapshotOperation
//! `type: CreateVirtualMachine` (deckhouse/virtualization `crds/
//! virtualmachinesnapshotoperations.yaml`, `pkg/controller/vmsop/internal/handler/lifecycle.go`,
//! `internal/operation/create_virtual_machine.go`: the clone restorer run on the snapshot's VM).
//! Names as `clone` gives them (`createVirtualMachine.nameReplacement`): the VM becomes NEW and
//! each disk `OLD-x` becomes `NEW-x`; the disks are made from the snapshot's VirtualDiskSnapshots
//! and owned by NEW. A taken name is refused here before anything is made (the platform would
//! fail the operation too). Afterwards NEW and its disks are labelled as ours and the operation
//! is owned by NEW, so `delete NEW` removes it; the source VM and the snapshot are not touched.
//!
//! The provisioning Secret is renamed too (`SRC-cloudinit` → `NEW-cloudinit`): the restorer
//! creates it like a clone (`provisioner_restorer.go` `ProcessClone`: `Create`, so the source's
//! own name fails with AlreadyExists). A VM made by `create` keeps its SSH identity there; NEW
//! gets its own ([`crate::clone::identity`]: principals, a fresh host key and its certificate):
//! the Secret is made by us, marked with the operation's uid, as soon as the operation exists,
//! and the restorer takes it as made; if the restorer was first (it runs on the operation's
//! first reconcile), its copy is rewritten as soon as it appears, before NEW's disks are ready.
//! Either way it is labelled for NEW and owned by it. All or nothing: when the
//! operation fails, what it made for NEW (marked with its uid in
//! `virtualization.deckhouse.io/vmoprestore`) and the operation itself are deleted, each with
//! its uid as a precondition.

use serde_json::{Value, json};

use super::kubevirt::{create_obj, get, get_opt};
use super::{DryRun, Event, Options, Outcome, text};
use crate::api::{DECKHOUSE_VM, Kind, SECRET, VIRTUAL_DISK};
use crate::clone::{deckhouse::new_name, identity, label, our_labels};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::lifecycle::watch::{self, Watched};

/// Deckhouse's VirtualMachineSnapshotOperation.
pub const VMSOP: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualMachineSnapshotOperation",
    plural: "virtualmachinesnapshotoperations",
    namespaced: true,
};

/// The operation making `target` from snapshot `snap` of VM `source` with `disks` and the
/// provisioning `secret` renamed (`(old, new)`), labelled as ours for `target`.
pub fn operation_object(
    ns: &str,
    snap: &str,
    source: &str,
    target: &str,
    disks: &[(String, String)],
    secret: Option<(&str, &str)>,
    dry_run: bool,
) -> Value {
    let mut rules = vec![json!({"from": {"kind": "VirtualMachine", "name": source}, "to": target})];
    for (old, new) in disks {
        rules.push(json!({"from": {"kind": "VirtualDisk", "name": old}, "to": new}));
    }
    if let Some((old, new)) = secret {
        rules.push(json!({"from": {"kind": "Secret", "name": old}, "to": new}));
    }
    json!({
        "apiVersion": VMSOP.api_version(), "kind": VMSOP.kind,
        "metadata": {"generateName": format!("{snap}-new-vm-"), "namespace": ns,
            "labels": our_labels(target)},
        "spec": {
            "type": "CreateVirtualMachine",
            "virtualMachineSnapshotName": snap,
            "createVirtualMachine": {
                "mode": if dry_run { "DryRun" } else { "Strict" },
                "nameReplacement": rules,
            },
        },
    })
}

/// Refuses a taken name (nothing made yet).
async fn ensure_free(cluster: &Cluster, kind: Kind, ns: &str, name: &str) -> Result<()> {
    if get_opt(cluster, kind, ns, name).await?.is_some() {
        return Err(Error::NotOurs(format!(
            "{} {name:?} already exists in namespace {ns:?}; nothing was created (choose another name for --new-vm)",
            kind.kind.to_ascii_lowercase()
        )));
    }
    Ok(())
}

/// Object `key` of the snapshot's Secret `secret` (as read): deckhouse/virtualization
/// `service/restorer/secret_restorer.go` puts base64 of the JSON into `Data` (so base64 twice
/// in the API); once-encoded JSON is taken too.
fn kept_object(secret: &Value, key: &str) -> Option<Value> {
    use base64::Engine;
    let b64 = &base64::engine::general_purpose::STANDARD;
    let once = b64
        .decode(secret.pointer(&format!("/data/{key}"))?.as_str()?)
        .ok()?;
    serde_json::from_slice(&once)
        .ok()
        .or_else(|| serde_json::from_slice(&b64.decode(&once).ok()?).ok())
}

/// The snapshot's Secret (`status.virtualMachineSnapshotSecretName`), if it can be read.
async fn snapshot_secret(cluster: &Cluster, ns: &str, snap: &Value) -> Result<Option<Value>> {
    let secret = text(snap, "/status/virtualMachineSnapshotSecretName");
    if secret.is_empty() {
        return Ok(None);
    }
    get_opt(cluster, SECRET, ns, secret).await
}

/// The user data of the provisioning Secret snapshot `snap` keeps (key `provisioner`,
/// `secret_restorer.go` `setProvisioning`; the restorer makes the new VM's Secret from it,
/// `snapshot_resources.go` `Prepare`).
async fn kept_user_data(cluster: &Cluster, ns: &str, snap: &Value) -> Result<Option<String>> {
    Ok(snapshot_secret(cluster, ns, snap)
        .await?
        .and_then(|s| kept_object(&s, "provisioner"))
        .and_then(|p| identity::secret_user_data(&p)))
}

/// The VM snapshot `snap` keeps (in its Secret, key `vm`), else the live VM it was taken of;
/// `None` when neither can be read.
async fn kept_vm(cluster: &Cluster, ns: &str, snap: &Value) -> Result<Option<Value>> {
    if let Some(vm) = snapshot_secret(cluster, ns, snap)
        .await?
        .and_then(|s| kept_object(&s, "vm"))
    {
        return Ok(Some(vm));
    }
    get_opt(
        cluster,
        DECKHOUSE_VM,
        ns,
        text(snap, "/spec/virtualMachineName"),
    )
    .await
}

/// Restore snapshot `snap` (Ready, already read) as a new VM `target`.
pub async fn restore(
    cluster: &Cluster,
    platform: &crate::flavor::Platform,
    ns: &str,
    snap: &Value,
    target: &str,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let snap_name = text(snap, "/metadata/name").to_owned();
    let source = text(snap, "/spec/virtualMachineName").to_owned();
    let mut disks = vec![];
    for vds in snap
        .pointer("/status/virtualDiskSnapshotNames")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let vds = get(cluster, super::deckhouse::VD_SNAPSHOT, ns, vds).await?;
        let disk = text(&vds, "/spec/virtualDiskName").to_owned();
        let new = new_name(&source, target, &disk);
        disks.push((disk, new));
    }
    let secret = kept_vm(cluster, ns, snap)
        .await?
        .and_then(|vm| {
            vm.pointer("/spec/provisioning/userDataRef")
                .filter(|r| r["kind"] == "Secret")
                .and_then(|r| r["name"].as_str())
                .map(str::to_owned)
        })
        .map(|old| {
            let new = new_name(&source, target, &old);
            (old, new)
        });
    let secret_rule = secret.as_ref().map(|(o, n)| (o.as_str(), n.as_str()));
    let obj = operation_object(ns, &snap_name, &source, target, &disks, secret_rule, false);
    crate::clone::deckhouse::check_name_lengths(
        target,
        crate::clone::deckhouse::renames(&obj, "/spec/createVirtualMachine/nameReplacement"),
    )?;
    ensure_free(cluster, DECKHOUSE_VM, ns, target).await?;
    for (_, new) in &disks {
        ensure_free(cluster, VIRTUAL_DISK, ns, new).await?;
    }
    if let Some((_, new)) = &secret {
        ensure_free(cluster, SECRET, ns, new).await?;
    }
    // The user data the new VM gets: the copy the snapshot keeps (the source and its Secret
    // may be gone), else the source's Secret as it is; without either NEW would have no
    // identity of its own, so nothing is made.
    let mut user_data = None;
    if let Some((old, _)) = &secret {
        user_data = match kept_user_data(cluster, ns, snap).await? {
            Some(t) => Some(t),
            None => identity::read_secret(cluster, ns, old).await?,
        };
        if user_data.is_none() {
            return Err(Error::Platform(format!(
                "{target} cannot get its own SSH identity: {source}'s user data (secret {old:?}) is neither kept by snapshot {snap_name} nor in namespace {ns:?}; nothing was created"
            )));
        }
    }
    let mut outcome = Outcome {
        snapshot: snap_name.clone(),
        vm: format!("{target}.{ns}"),
        object_ref: VMSOP.object_ref(&format!("{snap_name}-new-vm-")),
        object: Some(obj.clone()),
        waited: false,
        no_agent: false,
        restarted: false,
    };
    match options.dry_run {
        DryRun::Client => return Ok(outcome),
        DryRun::Server => {
            outcome.object = Some(create_obj(cluster, VMSOP, ns, &obj, true).await?);
            return Ok(outcome);
        }
        DryRun::None => {}
    }
    // The copy's new identity, made before the operation so it is written as soon as the copy
    // exists.
    let mut new_text = None;
    if let Some(text) = &user_data
        && identity::has_platform_ssh(text)
    {
        let host = crate::create::checks::vm_host_keys(
            cluster,
            platform,
            crate::ca::DEFAULT_NAMESPACE,
            target,
            ns,
            &mut |w| on_event(Event::Notice(w)),
        )
        .await?;
        new_text =
            identity::reissue(text, &source, target, ns, host.as_ref()).map_err(Error::Platform)?;
    }
    let made = create_obj(cluster, VMSOP, ns, &obj, false).await?;
    let op_name = text(&made, "/metadata/name").to_owned();
    let op_uid = text(&made, "/metadata/uid").to_owned();
    outcome.object_ref = VMSOP.object_ref(&op_name);
    outcome.object = Some(made);
    on_event(Event::Created(format!(
        "virtualmachinesnapshotoperation/{op_name}"
    )));
    if new_text.is_some() && !options.wait {
        on_event(Event::Notice(format!(
            "waiting anyway: {target} gets its own SSH identity once it exists"
        )));
    }
    if !options.wait && new_text.is_none() {
        return Ok(outcome);
    }
    let copy = secret.as_ref().map(|(_, n)| n.as_str());
    // As for `clone` (crate::clone): the restorer creates its copy of the source's Secret and
    // then the VM with the source's runPolicy, so an AlwaysOn VM could boot with the source's
    // identity if that copy held it. The Secret the new VM refers to is made now, with its own
    // identity, marked with the operation's uid: the provisioner restorer takes it as made and
    // creates nothing (deckhouse/virtualization `service/restorer/restorers/
    // provisioner_restorer.go` ValidateClone/ProcessClone: `existed.Annotations[AnnVMOPRestore]
    // == restoreUID` returns nil). Only if the platform was first (409, its copy marked with the
    // uid too) is the copy rewritten in [`follow`].
    let mut pending = new_text.as_deref();
    if let (Some(name), Some(text)) = (copy, pending) {
        let mut made = identity::secret_object(crate::flavor::Flavor::Deckhouse, ns, target, text);
        made["metadata"]["name"] = json!(name);
        made["metadata"]["annotations"] = json!({ identity::MADE_BY_OPERATION: op_uid });
        match identity::create_secret(cluster, &made).await {
            Ok(_) => {
                on_event(Event::Notice(format!(
                    "secret/{name}: made with {target}'s own identity (principals, host key, host certificate) before the platform copies the source's"
                )));
                pending = None;
            }
            Err(Error::Conflict(_)) => {}
            Err(e) => {
                undo(
                    cluster, ns, &op_name, &op_uid, target, &disks, copy, on_event,
                )
                .await;
                return Err(e);
            }
        }
    }
    let result = follow(
        cluster, ns, &op_name, &op_uid, target, copy, pending, &snap_name, on_event,
    )
    .await;
    let done = match result {
        Ok(done) => done,
        Err(e) => {
            undo(
                cluster, ns, &op_name, &op_uid, target, &disks, copy, on_event,
            )
            .await;
            return Err(e);
        }
    };
    adopt(cluster, ns, target, &op_name, &disks, copy).await?;
    outcome.object = Some(done);
    outcome.waited = true;
    Ok(outcome)
}

/// Follows the operation to its end; the copied Secret `copy` gets `new_text` as soon as it
/// exists (the new VM cannot boot before its disks are ready).
#[allow(clippy::too_many_arguments)]
async fn follow(
    cluster: &Cluster,
    ns: &str,
    op_name: &str,
    op_uid: &str,
    target: &str,
    copy: Option<&str>,
    new_text: Option<&str>,
    snap_name: &str,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Value> {
    enum Step {
        Copied,
        Done(Value),
    }
    let mut pending = copy.zip(new_text);
    let mut watched = vec![Watched::new(VMSOP, ns, op_name)];
    if let Some((copy, _)) = pending {
        watched.push(Watched::new(SECRET, ns, copy));
    }
    let mut last = String::new();
    loop {
        let waiting_for_copy = pending.is_some();
        let step = watch::until(cluster, &watched, |objs| {
            // Only the copy this operation made (a stranger's Secret of that name fails it).
            if waiting_for_copy
                && objs
                    .get(1)
                    .and_then(Option::as_ref)
                    .is_some_and(|s| identity::made_by(s, op_uid))
            {
                return Some(Ok(Step::Copied));
            }
            let Some(op) = &objs[0] else {
                return Some(Err(Error::Platform(format!(
                    "virtualmachinesnapshotoperation {op_name} was deleted while restoring"
                ))));
            };
            let (phase, reason, end) = crate::clone::deckhouse::progress(op);
            let now = format!("{phase}\n{}", reason.clone().unwrap_or_default());
            if !phase.is_empty() && now != last {
                last = now;
                on_event(Event::Phase {
                    phase,
                    message: reason.unwrap_or_default(),
                });
            }
            match end? {
                Ok(()) => Some(Ok(Step::Done(op.clone()))),
                Err(why) => Some(Err(Error::Stuck(format!(
                    "restore of {snap_name} as {target}.{ns} failed: {why}"
                )))),
            }
        })
        .await?;
        match step {
            Step::Copied => {
                if let Some((copy, text)) = pending.take()
                    && identity::rewrite_secret(cluster, ns, copy, target, text, op_uid).await?
                {
                    on_event(Event::Notice(format!(
                        "secret/{copy}: the platform's part made {target}'s own (principals, host key, host certificate)"
                    )));
                }
                watched.truncate(1);
            }
            Step::Done(op) => {
                if let Some((copy, text)) = pending.take()
                    && !identity::rewrite_secret(cluster, ns, copy, target, text, op_uid).await?
                {
                    return Err(Error::NotOurs(format!(
                        "secret {copy:?} in namespace {ns:?} was not made by virtualmachinesnapshotoperation {op_name:?}"
                    )));
                }
                return Ok(op);
            }
        }
    }
}

/// All or nothing: delete what the failed operation `op_uid` made for `target` (marked with
/// its uid) and the operation itself, each with its uid as a precondition.
#[allow(clippy::too_many_arguments)]
async fn undo(
    cluster: &Cluster,
    ns: &str,
    op_name: &str,
    op_uid: &str,
    target: &str,
    disks: &[(String, String)],
    copy: Option<&str>,
    on_event: &(dyn Fn(Event) + Send + Sync),
) {
    let mut made: Vec<(Kind, String)> = vec![(DECKHOUSE_VM, target.to_owned())];
    made.extend(disks.iter().map(|(_, d)| (VIRTUAL_DISK, d.clone())));
    made.extend(copy.map(|c| (SECRET, c.to_owned())));
    for (kind, name) in made {
        let Ok(Some(obj)) = get_opt(cluster, kind, ns, &name).await else {
            continue;
        };
        if !identity::made_by(&obj, op_uid) {
            continue;
        }
        let uid = text(&obj, "/metadata/uid").to_owned();
        if delete_with_uid(cluster, kind, ns, &name, &uid).await {
            on_event(Event::Notice(format!(
                "deleted {}/{name}, made by the failed operation",
                kind.kind.to_ascii_lowercase()
            )));
        }
    }
    if delete_with_uid(cluster, VMSOP, ns, op_name, op_uid).await {
        on_event(Event::Notice(format!(
            "deleted virtualmachinesnapshotoperation/{op_name}"
        )));
    }
}

/// Delete `name` of `kind` if it still has `uid`; whether it was deleted.
async fn delete_with_uid(cluster: &Cluster, kind: Kind, ns: &str, name: &str, uid: &str) -> bool {
    let params = kube::api::DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    kind.api(&cluster.client, Some(ns))
        .delete(name, &params)
        .await
        .is_ok()
}

/// Labels the new VM and its disks as ours and makes it the owner of the operation.
async fn adopt(
    cluster: &Cluster,
    ns: &str,
    target: &str,
    op_name: &str,
    disks: &[(String, String)],
    copy: Option<&str>,
) -> Result<()> {
    label(cluster, &DECKHOUSE_VM, ns, target, our_labels(target)).await?;
    for (_, disk) in disks {
        label(cluster, &VIRTUAL_DISK, ns, disk, our_labels(target)).await?;
    }
    let vm = get(cluster, DECKHOUSE_VM, ns, target).await?;
    let owner = json!({
        "apiVersion": DECKHOUSE_VM.api_version(), "kind": "VirtualMachine",
        "name": target, "uid": vm.pointer("/metadata/uid").cloned().unwrap_or_default(),
    });
    crate::clone::deckhouse::add_owner(cluster, &VMSOP, ns, op_name, &owner).await?;
    if let Some(copy) = copy {
        label(cluster, &SECRET, ns, copy, our_labels(target)).await?;
        crate::clone::deckhouse::add_owner(cluster, &SECRET, ns, copy, &identity::owner_of(&vm))
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_objects_are_read_as_upstream_stores_them() {
        use base64::Engine;
        let b64 = &base64::engine::general_purpose::STANDARD;
        // `base64 -w0 <<< '...'` twice, as `secret_restorer.go` leaves it in the API.
        let provisioner =
            r#"{"metadata":{"name":"web-cloudinit"},"data":{"userData":"I2Nsb3VkLWNvbmZpZwo="}}"#;
        let twice = b64.encode(b64.encode(provisioner));
        let secret = json!({"data": {"provisioner": twice, "vm": b64.encode(r#"{"kind":"VirtualMachine"}"#)}});
        let kept = kept_object(&secret, "provisioner").unwrap();
        assert_eq!(
            identity::secret_user_data(&kept).as_deref(),
            Some("#cloud-config\n")
        );
        // Once-encoded JSON is read too.
        assert_eq!(
            kept_object(&secret, "vm").unwrap()["kind"],
            "VirtualMachine"
        );
        assert_eq!(kept_object(&secret, "vmip"), None);
    }

    #[test]
    fn the_operation_renames_the_vm_and_its_disks_and_is_ours() {
        let disks = [("web-root".to_owned(), new_name("web", "copy", "web-root"))];
        let op = operation_object(
            "ns",
            "s1",
            "web",
            "copy",
            &disks,
            Some(("web-cloudinit", "copy-cloudinit")),
            false,
        );
        assert_eq!(op["spec"]["type"], "CreateVirtualMachine");
        assert_eq!(op["spec"]["virtualMachineSnapshotName"], "s1");
        let spec = &op["spec"]["createVirtualMachine"];
        assert_eq!(spec["mode"], "Strict");
        assert_eq!(
            spec["nameReplacement"],
            json!([{"from": {"kind": "VirtualMachine", "name": "web"}, "to": "copy"},
                {"from": {"kind": "VirtualDisk", "name": "web-root"}, "to": "copy-root"},
                {"from": {"kind": "Secret", "name": "web-cloudinit"}, "to": "copy-cloudinit"}])
        );
        assert!(super::super::kubevirt::is_ours(&op));
    }
}
