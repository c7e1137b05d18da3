//! KubeVirt: disks from the VM template and the VMI's `status.volumeStatus`; hotplug through
//! `PUT …/virtualmachines/NAME/addvolume|removevolume` (`AddVolumeOptions{name, disk,
//! volumeSource, dryRun}` / `RemoveVolumeOptions{name, dryRun}`, FACTS §2). virt-api keeps the
//! request in the VM's `status.volumeRequests`; virt-controller writes it into the template
//! (persisted) and the running VMI; the VMI's volume goes `Pending → Bound → AttachedToNode →
//! MountedToPod → Ready` (`api/core/v1/types.go` `VolumePhase`).

use std::collections::BTreeMap;

use kube::api::PostParams;
use serde_json::{Value, json};

use super::{
    AttachRequest, Disk, DryRun, Event, GuestSees, Options, Outcome, Resized, SourceKind,
    check_expandable, check_growth, quantity_of, quantity_text, text,
};
use crate::api::{DATA_VOLUME, KUBEVIRT_VM, KUBEVIRT_VMI, PVC};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::lifecycle::VmRef;
use crate::lifecycle::watch::{self, Watched};
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};
use crate::quantity::Quantity;

async fn get_opt(
    cluster: &Cluster,
    kind: crate::api::Kind,
    ns: &str,
    name: &str,
) -> Result<Option<Value>> {
    kind.api(&cluster.client, Some(ns))
        .get_opt(name)
        .await
        .map(|o| o.map(|o| serde_json::to_value(o).unwrap_or_default()))
        .map_err(|e| cluster.error(e, &kind.action("get", Some(ns)).named(name)))
}

async fn get_vm(cluster: &Cluster, ns: &str, name: &str) -> Result<Value> {
    crate::lifecycle::get_vm(
        cluster,
        Flavor::KubeVirt,
        &VmRef {
            namespace: ns.to_owned(),
            name: name.to_owned(),
        },
    )
    .await
}

fn array<'a>(obj: &'a Value, pointer: &str) -> impl Iterator<Item = &'a Value> {
    obj.pointer(pointer)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

/// `pvc/NAME`, `dv/NAME`, or the volume type.
fn source_of(volume: &Value) -> String {
    if let Some(n) = volume
        .pointer("/persistentVolumeClaim/claimName")
        .and_then(Value::as_str)
    {
        return format!("pvc/{n}");
    }
    if let Some(n) = volume.pointer("/dataVolume/name").and_then(Value::as_str) {
        return format!("dv/{n}");
    }
    volume
        .as_object()
        .and_then(|m| m.keys().find(|k| *k != "name").cloned())
        .unwrap_or_default()
}

/// The claim behind a volume (a DataVolume's PVC has its name).
fn claim_of(volume: &Value) -> Option<&str> {
    volume
        .pointer("/persistentVolumeClaim/claimName")
        .or_else(|| volume.pointer("/dataVolume/name"))
        .and_then(Value::as_str)
}

fn hotpluggable(volume: &Value) -> bool {
    volume.pointer("/persistentVolumeClaim/hotpluggable") == Some(&json!(true))
        || volume.pointer("/dataVolume/hotpluggable") == Some(&json!(true))
}

/// One row of the listing from a volume, its disk and what the VMI says.
fn disk_row(volume: &Value, disk: Option<&Value>, vmi: Option<&Value>, size: String) -> Disk {
    let name = text(volume, "/name").to_owned();
    let disk = disk.cloned().unwrap_or_default();
    let bus = ["disk", "lun"]
        .iter()
        .find_map(|t| disk.pointer(&format!("/{t}/bus")).and_then(Value::as_str))
        .map(str::to_owned)
        .or_else(|| {
            disk.get("cdrom")
                .map(|c| format!("cdrom ({})", text(c, "/bus")))
        })
        .unwrap_or_default();
    let status = vmi.and_then(|v| array(v, "/status/volumeStatus").find(|s| s["name"] == name));
    let in_vmi = vmi.is_some_and(|v| array(v, "/spec/volumes").any(|x| x["name"] == name));
    let state = match (vmi, status.and_then(|s| s["phase"].as_str())) {
        (None, _) => "-".to_owned(),
        (Some(_), Some(p)) => p.to_owned(),
        (Some(_), None) if in_vmi => "Attached".to_owned(),
        // In the template, not in the running VMI: applied at the next start.
        (Some(_), None) => "RestartRequired".to_owned(),
    };
    Disk {
        source: source_of(volume),
        bus,
        size,
        serial: text(&disk, "/serial").to_owned(),
        target: status
            .map(|s| text(s, "/target").to_owned())
            .unwrap_or_default(),
        hotplugged: hotpluggable(volume),
        read_only: disk.pointer("/disk/readonly") == Some(&json!(true))
            || disk.get("cdrom").is_some()
            || volume.pointer("/persistentVolumeClaim/readOnly") == Some(&json!(true)),
        state,
        name,
    }
}

/// The disks of VM `name` (template volumes, then volumes only the VMI has).
pub async fn list(cluster: &Cluster, ns: &str, name: &str) -> Result<Vec<Disk>> {
    let vm = get_vm(cluster, ns, name).await?;
    let vmi = get_opt(cluster, KUBEVIRT_VMI, ns, name)
        .await?
        .filter(|v| !matches!(text(v, "/status/phase"), "Succeeded" | "Failed"));
    let mut volumes: Vec<(Value, Option<Value>)> = array(&vm, "/spec/template/spec/volumes")
        .map(|v| {
            let d = array(&vm, "/spec/template/spec/domain/devices/disks")
                .find(|d| d["name"] == v["name"])
                .cloned();
            (v.clone(), d)
        })
        .collect();
    if let Some(vmi) = &vmi {
        for v in array(vmi, "/spec/volumes") {
            if !volumes.iter().any(|(x, _)| x["name"] == v["name"]) {
                let d = array(vmi, "/spec/domain/devices/disks")
                    .find(|d| d["name"] == v["name"])
                    .cloned();
                volumes.push((v.clone(), d));
            }
        }
    }
    let mut out = Vec::with_capacity(volumes.len());
    for (v, d) in &volumes {
        let size = match claim_of(v) {
            Some(claim) => get_opt(cluster, PVC, ns, claim)
                .await?
                .map(|p| {
                    let cap = quantity_text(p.pointer("/status/capacity/storage"));
                    if cap.is_empty() {
                        quantity_text(p.pointer("/spec/resources/requests/storage"))
                    } else {
                        cap
                    }
                })
                .unwrap_or_default(),
            None => quantity_text(v.pointer("/emptyDisk/capacity")),
        };
        let mut row = disk_row(v, d.as_ref(), vmi.as_ref(), size);
        let requested = array(&vm, "/status/volumeRequests")
            .any(|r| r.pointer("/addVolumeOptions/name") == Some(&v["name"]));
        if requested {
            row.state = "Requested".into();
        }
        out.push(row);
    }
    Ok(out)
}

/// Which VM (other than `except`) has a volume on claim or DataVolume `claim`.
async fn used_by(cluster: &Cluster, ns: &str, claim: &str, except: &str) -> Result<Option<String>> {
    let api = KUBEVIRT_VM.api(&cluster.client, Some(ns));
    let list = api
        .list(&Default::default())
        .await
        .map_err(|e| cluster.error(e, &KUBEVIRT_VM.action("list", Some(ns))))?;
    Ok(list
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .filter(|vm| text(vm, "/metadata/name") != except)
        .find(|vm| array(vm, "/spec/template/spec/volumes").any(|v| claim_of(v) == Some(claim)))
        .map(|vm| text(&vm, "/metadata/name").to_owned()))
}

/// A blank DataVolume for a new disk, ours and owned by the VM (so deleting the VM deletes it,
/// as it does the disks `create` makes).
pub fn blank_data_volume(vm: &Value, name: &str, request: &AttachRequest) -> Value {
    let mut storage = json!({"resources": {"requests": {"storage": request.size.map(|s| s.to_string()).unwrap_or_default()}}});
    if let Some(class) = &request.storage_class {
        storage["storageClassName"] = json!(class);
    }
    json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {
            "name": name,
            "namespace": text(vm, "/metadata/namespace"),
            "labels": BTreeMap::from([
                (MANAGED_BY_LABEL, MANAGED_BY),
                (VM_LABEL, text(vm, "/metadata/name")),
            ]),
            "ownerReferences": [{
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "name": text(vm, "/metadata/name"), "uid": text(vm, "/metadata/uid"),
            }],
        },
        "spec": {"source": {"blank": {}}, "storage": storage},
    })
}

/// The `AddVolumeOptions` body.
pub fn add_volume_body(request: &AttachRequest, data_volume: bool, dry_run: bool) -> Value {
    let volume = request.volume_name();
    let mut disk = json!({"name": volume, "disk": {"bus": request.bus.as_str()}});
    if request.read_only {
        disk["disk"]["readonly"] = json!(true);
    }
    if let Some(serial) = request.serial() {
        disk["serial"] = json!(serial);
    }
    let source = if data_volume {
        json!({"dataVolume": {"name": request.name}})
    } else {
        let mut pvc = json!({"claimName": request.name});
        if request.read_only {
            pvc["readOnly"] = json!(true);
        }
        json!({"persistentVolumeClaim": pvc})
    };
    let mut body = json!({"name": volume, "disk": disk, "volumeSource": source});
    if dry_run {
        body["dryRun"] = json!(["All"]);
    }
    body
}

async fn put(cluster: &Cluster, ns: &str, name: &str, sub: &str, body: &Value) -> Result<()> {
    let path =
        format!("/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/{sub}");
    let request = http::Request::put(&path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body.to_string().into_bytes())
        .map_err(|e| Error::Internal(e.to_string()))?;
    match cluster.client.request_text(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if matches!(s.code, 400 | 409) => Err(Error::Platform(format!(
            "cannot {} {name}.{ns} (KubeVirt: {})",
            if sub == "addvolume" {
                format!("attach {} to", body["name"].as_str().unwrap_or(""))
            } else {
                format!("detach {} from", body["name"].as_str().unwrap_or(""))
            },
            s.message
        ))),
        Err(e) => Err(cluster.error(
            e,
            &crate::error::Action::new(
                "update",
                "virtualmachines.subresources.kubevirt.io",
                "virtualmachine",
            )
            .named(name)
            .in_namespace(Some(ns)),
        )),
    }
}

fn running(vmi: &Option<Value>) -> bool {
    vmi.as_ref()
        .is_some_and(|v| text(v, "/status/phase") == "Running")
}

/// Attach `request` to VM `name`.
pub async fn attach(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    request: &AttachRequest,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let vm = get_vm(cluster, ns, name).await?;
    let volume = request.volume_name().to_owned();
    if let Some(v) = array(&vm, "/spec/template/spec/volumes")
        .find(|v| v["name"] == volume || claim_of(v) == Some(&request.name))
    {
        return Err(Error::Usage(format!(
            "{name}.{ns} already has disk {} ({}); nothing was changed",
            text(v, "/name"),
            source_of(v)
        )));
    }
    let dv = get_opt(cluster, DATA_VOLUME, ns, &request.name).await?;
    let data_volume = source_is_data_volume(cluster, ns, request, dv.as_ref()).await?;
    if request.size.is_none()
        && let Some(other) = used_by(cluster, ns, &request.name, name).await?
    {
        return Err(Error::Usage(format!(
            "{} is in use by VM {other} in namespace {ns:?}; detach it there first (nothing was changed)",
            request.name
        )));
    }
    let server_dry = options.dry_run == DryRun::Server;
    let vmi = get_opt(cluster, KUBEVIRT_VMI, ns, name).await?;
    let live = running(&vmi);
    let mut outcome = Outcome {
        vm: format!("{name}.{ns}"),
        disk: volume.clone(),
        object_ref: KUBEVIRT_VM.object_ref(name),
        object: None,
        waited: false,
        live,
    };
    let mut created_uid = None;
    if request.size.is_some() {
        if options.dry_run != DryRun::Client {
            created_uid = create_blank(cluster, ns, &vm, request, server_dry).await?;
        }
        on_event(Event::Created(format!("datavolume/{}", request.name)));
    }
    let body = add_volume_body(request, data_volume, server_dry);
    if options.dry_run != DryRun::None {
        // A dry run shows the request (the VM is not changed).
        outcome.object = Some(body.clone());
    }
    if options.dry_run == DryRun::Client {
        return Ok(outcome);
    }
    if let Err(e) = put(cluster, ns, name, "addvolume", &body).await {
        // All or nothing: the new DataVolume goes again when the VM did not take it.
        if let Some(uid) = &created_uid {
            super::remove_created(cluster, DATA_VOLUME, ns, &request.name, uid).await?;
            on_event(Event::Removed(format!("datavolume/{}", request.name)));
        }
        return Err(e);
    }
    if server_dry {
        return Ok(outcome);
    }
    on_event(Event::Accepted(format!("addvolume {volume}")));
    if options.wait {
        wait_for(cluster, ns, name, &volume, true, live, on_event).await?;
        outcome.waited = true;
    }
    outcome.object = Some(get_vm(cluster, ns, name).await?);
    Ok(outcome)
}

/// Whether the source is a DataVolume (else a bare claim), refusing what `--size` or the
/// source's kind does not allow: a new disk over an existing DataVolume, or a missing source.
async fn source_is_data_volume(
    cluster: &Cluster,
    ns: &str,
    request: &AttachRequest,
    dv: Option<&Value>,
) -> Result<bool> {
    let missing = |what: &str| {
        Err(Error::Usage(format!(
            "no {what} {:?} in namespace {ns:?}; nothing was changed (a new disk needs --size)",
            request.name
        )))
    };
    Ok(if request.size.is_some() {
        if let Some(existing) = &dv {
            let ours = existing
                .pointer("/metadata/labels")
                .and_then(|l| l.get(MANAGED_BY_LABEL))
                == Some(&json!(MANAGED_BY));
            return Err(Error::Usage(format!(
                "DataVolume {:?} exists in namespace {ns:?}{}; attach it without --size, or pick another name",
                request.name,
                if ours { "" } else { " and is not kubectl vm's" }
            )));
        }
        true
    } else {
        match request.kind {
            SourceKind::DataVolume if dv.is_none() => return missing("DataVolume"),
            SourceKind::DataVolume => true,
            SourceKind::Auto if dv.is_some() => true,
            kind => {
                if get_opt(cluster, PVC, ns, &request.name).await?.is_none() {
                    return missing(if kind == SourceKind::Pvc {
                        "PersistentVolumeClaim"
                    } else {
                        "DataVolume or PersistentVolumeClaim"
                    });
                }
                false
            }
        }
    })
}

/// Creates the blank DataVolume of `--size` for `vm`; its uid, to remove it again if the VM
/// does not take it (none on a server dry run).
async fn create_blank(
    cluster: &Cluster,
    ns: &str,
    vm: &Value,
    request: &AttachRequest,
    server_dry: bool,
) -> Result<Option<String>> {
    let dv_obj = blank_data_volume(vm, &request.name, request);
    let obj: kube::api::DynamicObject =
        serde_json::from_value(dv_obj).map_err(|e| Error::Internal(e.to_string()))?;
    let params = PostParams {
        dry_run: server_dry,
        ..Default::default()
    };
    let made = DATA_VOLUME
        .api(&cluster.client, Some(ns))
        .create(&params, &obj)
        .await
        .map_err(|e| {
            cluster.error(
                e,
                &DATA_VOLUME.action("create", Some(ns)).named(&request.name),
            )
        })?;
    Ok(made.metadata.uid.filter(|_| !server_dry))
}

/// Watch until volume `volume` is attached (`attach`) or gone: on the VMI when `live`, else in
/// the VM template.
async fn wait_for(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    volume: &str,
    attach: bool,
    live: bool,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<()> {
    let mut last = String::new();
    let objects = [
        Watched::new(KUBEVIRT_VM, ns, name),
        Watched::new(KUBEVIRT_VMI, ns, name),
    ];
    watch::until(cluster, &objects, |objs| {
        let vm = objs[0].as_ref()?;
        let pending = array(vm, "/status/volumeRequests").next().is_some();
        let in_template = array(vm, "/spec/template/spec/volumes").any(|v| v["name"] == volume);
        if !live {
            return (!pending && in_template == attach).then_some(Ok(()));
        }
        let Some(vmi) = objs[1].as_ref() else {
            return Some(Err(Error::Platform(format!(
                "{name}.{ns} stopped while its disk {volume} was being {}",
                if attach { "attached" } else { "detached" }
            ))));
        };
        let status = array(vmi, "/status/volumeStatus").find(|s| s["name"] == volume);
        let in_spec = array(vmi, "/spec/volumes").any(|v| v["name"] == volume);
        let phase = status.map(|s| text(s, "/phase")).unwrap_or("");
        if !phase.is_empty() && phase != last {
            last = phase.to_owned();
            on_event(Event::Phase {
                phase: phase.to_owned(),
                message: status
                    .map(|s| text(s, "/message").to_owned())
                    .unwrap_or_default(),
            });
        }
        if attach {
            (phase == "Ready").then_some(Ok(()))
        } else {
            (!pending && !in_template && !in_spec && status.is_none()).then_some(Ok(()))
        }
    })
    .await
}

/// Detach disk `disk` (volume name or claim name) from VM `name`.
pub async fn detach(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    disk: &str,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let vm = get_vm(cluster, ns, name).await?;
    let vmi = get_opt(cluster, KUBEVIRT_VMI, ns, name).await?;
    let found = array(&vm, "/spec/template/spec/volumes")
        .chain(vmi.iter().flat_map(|v| array(v, "/spec/volumes")))
        .find(|v| v["name"] == disk || claim_of(v) == Some(disk))
        .cloned();
    let Some(volume) = found else {
        return Err(Error::Usage(format!(
            "{name}.{ns} has no disk {disk:?} (see `kubectl vm disk list {name}.{ns}`)"
        )));
    };
    let volume_name = text(&volume, "/name").to_owned();
    let live = running(&vmi);
    let mut outcome = Outcome {
        vm: format!("{name}.{ns}"),
        disk: volume_name.clone(),
        object_ref: KUBEVIRT_VM.object_ref(name),
        object: None,
        waited: false,
        live,
    };
    let server_dry = options.dry_run == DryRun::Server;
    let mut body = json!({"name": volume_name});
    if server_dry {
        body["dryRun"] = json!(["All"]);
    }
    if options.dry_run != DryRun::None {
        outcome.object = Some(body.clone());
    }
    if options.dry_run == DryRun::Client {
        return Ok(outcome);
    }
    put(cluster, ns, name, "removevolume", &body).await?;
    if server_dry {
        return Ok(outcome);
    }
    on_event(Event::Accepted(format!("removevolume {volume_name}")));
    if options.wait {
        wait_for(cluster, ns, name, &volume_name, false, live, on_event).await?;
        outcome.waited = true;
    }
    outcome.object = Some(get_vm(cluster, ns, name).await?);
    Ok(outcome)
}

/// The KubeVirt CR's feature gates include `gate` (false when it cannot be read).
async fn feature_gate(cluster: &Cluster, gate: &str) -> bool {
    let kind = crate::api::Kind {
        group: "kubevirt.io",
        version: "v1",
        kind: "KubeVirt",
        plural: "kubevirts",
        namespaced: true,
    };
    let Ok(list) = kind
        .api(&cluster.client, None)
        .list(&Default::default())
        .await
    else {
        return false;
    };
    list.items.into_iter().any(|k| {
        let k = serde_json::to_value(k).unwrap_or_default();
        array(
            &k,
            "/spec/configuration/developerConfiguration/featureGates",
        )
        .any(|g| g == gate)
    })
}

/// The merge patch that grows a claim to `size`; `resource_version` makes it fail rather than
/// overwrite a change made since we read the claim.
pub fn claim_growth_patch(size: Quantity, resource_version: &str) -> Value {
    json!({"metadata": {"resourceVersion": resource_version},
        "spec": {"resources": {"requests": {"storage": size.to_string()}}}})
}

/// Grow the claim behind disk `disk` of VM `name` to `size`.
pub async fn resize(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    disk: &str,
    size: Quantity,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Resized> {
    let vm = get_vm(cluster, ns, name).await?;
    let vmi = get_opt(cluster, KUBEVIRT_VMI, ns, name).await?;
    let found = array(&vm, "/spec/template/spec/volumes")
        .chain(vmi.iter().flat_map(|v| array(v, "/spec/volumes")))
        .find(|v| v["name"] == disk || claim_of(v) == Some(disk))
        .cloned();
    let Some(volume) = found else {
        return Err(Error::Usage(format!(
            "{name}.{ns} has no disk {disk:?} (see `kubectl vm disk list {name}.{ns}`)"
        )));
    };
    let volume_name = text(&volume, "/name").to_owned();
    let Some(claim) = claim_of(&volume).map(str::to_owned) else {
        return Err(Error::Usage(format!(
            "disk {volume_name} of {name}.{ns} is a {}, not a PersistentVolumeClaim or DataVolume: it cannot grow",
            source_of(&volume)
        )));
    };
    let Some(pvc) = get_opt(cluster, PVC, ns, &claim).await? else {
        return Err(Error::Usage(format!(
            "disk {volume_name} of {name}.{ns}: no PersistentVolumeClaim {claim:?} in namespace {ns:?} (not provisioned yet?); nothing was changed"
        )));
    };
    let from = quantity_of(pvc.pointer("/status/capacity/storage"))
        .or_else(|| quantity_of(pvc.pointer("/spec/resources/requests/storage")))
        .unwrap_or(Quantity::from_bytes(0));
    check_growth(&volume_name, from, size)?;
    if text(&pvc, "/status/phase") != "Bound" {
        return Err(Error::Usage(format!(
            "disk {volume_name} cannot grow: its claim {claim} is not Bound (phase {}); nothing was changed",
            text(&pvc, "/status/phase")
        )));
    }
    check_expandable(cluster, &volume_name, text(&pvc, "/spec/storageClassName")).await?;
    let running = running(&vmi);
    let guest = if !running {
        GuestSees::AtNextStart
    } else if feature_gate(cluster, "ExpandDisks").await {
        // virt-handler grows the running domain's disk when ExpandDisks is on.
        GuestSees::Now
    } else {
        GuestSees::AfterRestart
    };
    let patch = claim_growth_patch(size, text(&pvc, "/metadata/resourceVersion"));
    let mut outcome = Resized {
        vm: format!("{name}.{ns}"),
        disk: volume_name,
        object_ref: PVC.object_ref(&claim),
        object: None,
        from,
        to: size,
        waited: false,
        guest,
        pending: None,
    };
    if options.dry_run == DryRun::Client {
        outcome.object = Some(patch);
        return Ok(outcome);
    }
    outcome.object =
        Some(super::send_growth_patch(cluster, PVC, ns, &claim, &patch, options.dry_run).await?);
    if options.dry_run == DryRun::Server {
        return Ok(outcome);
    }
    on_event(Event::Accepted(format!(
        "persistentvolumeclaim/{claim} asks for {size}"
    )));
    if options.wait {
        let grown = super::growth::wait_claim(
            cluster,
            ns,
            &claim,
            size,
            guest == GuestSees::AtNextStart,
            on_event,
        )
        .await?;
        outcome.object = Some(grown.claim);
        outcome.pending = grown.pending;
        outcome.waited = true;
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::super::Bus;
    use super::*;

    #[test]
    fn add_volume_body_is_kubevirt_shaped() {
        let req = AttachRequest {
            kind: SourceKind::Auto,
            name: "data".into(),
            size: Some(Quantity::parse("1Gi").unwrap()),
            storage_class: None,
            volume: None,
            bus: Bus::Scsi,
            serial: None,
            read_only: false,
        };
        assert_eq!(
            add_volume_body(&req, true, true),
            json!({"name": "data", "disk": {"name": "data", "disk": {"bus": "scsi"}, "serial": "data"},
                "volumeSource": {"dataVolume": {"name": "data"}}, "dryRun": ["All"]})
        );
        let ro = AttachRequest {
            size: None,
            read_only: true,
            bus: Bus::Virtio,
            serial: Some("ISO1".into()),
            ..req
        };
        assert_eq!(
            add_volume_body(&ro, false, false),
            json!({"name": "data", "disk": {"name": "data", "disk": {"bus": "virtio", "readonly": true}, "serial": "ISO1"},
                "volumeSource": {"persistentVolumeClaim": {"claimName": "data", "readOnly": true}}})
        );
    }

    #[test]
    fn rows_show_what_the_vmi_says() {
        let v = json!({"name": "data", "persistentVolumeClaim": {"claimName": "pvc1", "hotpluggable": true}});
        let d = json!({"name": "data", "disk": {"bus": "scsi"}, "serial": "data"});
        let vmi = json!({"spec": {"volumes": [v]}, "status": {"volumeStatus": [{"name": "data", "phase": "MountedToPod", "target": "sda"}]}});
        let row = disk_row(&v, Some(&d), Some(&vmi), "1Gi".into());
        assert_eq!(
            (
                row.source.as_str(),
                row.bus.as_str(),
                row.state.as_str(),
                row.target.as_str()
            ),
            ("pvc/pvc1", "scsi", "MountedToPod", "sda")
        );
        assert!(row.hotplugged);
        assert_eq!(disk_row(&v, Some(&d), None, String::new()).state, "-");
    }
}
