//! VM clones: KubeVirt's VirtualMachineClone controller and Deckhouse's VirtualMachineOperation
//! `Clone`.
//!
//! KubeVirt (`pkg/virt-controller/watch/clone/clone.go`, `util.go`, `vm-target.go`): phases
//! `SnapshotInProgress` → `RestoreInProgress` → `CreatingTargetVM` → `Succeeded`, with the
//! conditions `Progressing`/`Ready` ("Still processing", then "Ready"). A missing source keeps
//! the clone pending (no phase; `Progressing False Pending`, `Ready False` with
//! "Source doesnt exist: VirtualMachine NS/NAME"). The target VM is the source with
//! `newMacAddresses` (else no MAC), `newSMBiosSerial` (else none) and no firmware UUID, labels
//! and annotations filtered by `labelFilters`/`annotationFilters` (and the template's), then
//! `spec.patches`; it is created halted (`pkg/storage/snapshot/restore.go`
//! `generateRestoredVMSpec`) with its own claims named `restore-<restore uid>-<volume>` (or
//! `<target>-<volume>` with `volumeNamePolicy: PrefixTargetName`), owned by the new VM.
//! A target name that is taken by a VM leaves the clone in `RestoreInProgress` for ever
//! (restore.go: "restore source and restore target are different but restore target already
//! exists" is reported on the restore, which does not fail). A succeeded clone whose target VM is
//! deleted is deleted too.
//!
//! Deckhouse (`pkg/controller/vmop/snapshot/internal/service/clone.go`,
//! `step/process_clone_step.go`, `service/restorer/`): the source may be Running or Stopped;
//! every resource (the provisioning Secret, the VirtualDisks, the VM) gets its name from
//! `clone.nameReplacement`, then `clone.customization` prefix/suffix. Validation fails the
//! operation when a name is taken ("VirtualMachine with name X already exists", "VirtualDisk
//! with name X already exists", listed in `status.resources`, the `Completed` condition
//! "Clone is failed: fail to validate the resources: check the status"). The VM is created with
//! no labels and the source's annotations plus `virtualization.deckhouse.io/vmoprestore`; the
//! disks keep their labels and are owned by the new VM; the operation completes once the disks
//! are ready. `DryRun` mode validates only.
//!
//! The one deliberate shortcut: upstream goes through a temporary VirtualMachineSnapshot and
//! VirtualMachineRestore (KubeVirt) or VirtualMachineSnapshot and VirtualDiskSnapshots
//! (Deckhouse). Those intermediate objects are not created here; the phases and end state are
//! produced directly. A new KubeVirt claim gets a copy of its source's written bytes at clone
//! time (as the VolumeSnapshot would hold them); generated data, which never changes, and a
//! Deckhouse clone's disks are views of the source claim through the [`CONTENT_OF`]
//! annotation (the emulator's model of a copied volume).

use serde_json::{Map, Value, json};

use crate::core::app::App;
use crate::core::controllers::{owner_ref, set_condition};
use crate::core::store::Key;
use crate::core::util::{meta_str, new_uid, random_suffix};
use crate::kubevirt::export_snapshot::{CONTENT_OF, content_pvc};

/// Group of the VirtualMachineClone kind.
pub const CLONE_GROUP: &str = "clone.kubevirt.io";
const KV: &str = "kubevirt.io";
const DH: &str = "virtualization.deckhouse.io";
/// Deckhouse's mark on what a clone or restore operation created (value: the operation's uid).
pub const VMOP_RESTORE: &str = "virtualization.deckhouse.io/vmoprestore";
/// The emulator keeps internal state in annotations under this prefix; a copy must not inherit it.
const EMULATOR_PREFIX: &str = "emulator.kubevm.io/";

/// Reconciles a VirtualMachineClone, one phase per tick.
pub fn kubevirt_clone(app: &App, clone: &Value, tick: bool) {
    let key = Key::of(CLONE_GROUP, "virtualmachineclones", clone);
    let ns = meta_str(clone, "namespace");
    let phase = clone
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if phase == "Failed" {
        return;
    }
    if phase == "Succeeded" {
        // clone.go execute(): the clone goes when its target VM does.
        let target = clone
            .pointer("/status/targetName")
            .and_then(Value::as_str)
            .unwrap_or("");
        if app
            .store
            .get(&Key::new(KV, "virtualmachines", ns, target))
            .is_none()
        {
            app.store
                .delete(&key, crate::core::store::Propagation::Cascade);
        }
        return;
    }
    let source_name = clone
        .pointer("/spec/source/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let source_kind = clone
        .pointer("/spec/source/kind")
        .and_then(Value::as_str)
        .unwrap_or("");
    let source = (source_kind == "VirtualMachine")
        .then(|| {
            app.store
                .get(&Key::new(KV, "virtualmachines", ns, source_name))
        })
        .flatten();
    let Some(source) = source else {
        let reason = format!("Source doesnt exist: {source_kind} {ns}/{source_name}");
        app.store.modify(&key, |o| {
            let mut st = status_of(o);
            set_condition(&mut st, "Progressing", false, "Pending", "");
            set_condition(&mut st, "Ready", false, &reason, "");
            o["status"] = st;
        });
        return;
    };
    let uid = meta_str(clone, "uid").to_string();
    let still = |st: &mut Value| {
        set_condition(st, "Progressing", true, "Still processing", "");
        set_condition(st, "Ready", false, "Still processing", "");
    };
    match phase {
        "" => {
            app.store.modify(&key, |o| {
                let mut st = status_of(o);
                st["phase"] = json!("SnapshotInProgress");
                st["snapshotName"] = json!(format!("tmp-snapshot-{uid}"));
                still(&mut st);
                o["status"] = st;
            });
        }
        "SnapshotInProgress" if tick => {
            app.store.modify(&key, |o| {
                let mut st = status_of(o);
                st["phase"] = json!("RestoreInProgress");
                st["restoreName"] = json!(format!("tmp-restore-{uid}"));
                still(&mut st);
                o["status"] = st;
            });
        }
        "RestoreInProgress" if tick => {
            let target = clone
                .pointer("/spec/target/name")
                .and_then(Value::as_str)
                .map(String::from)
                .unwrap_or_else(|| format!("{source_name}-clone-{}", random_suffix(5)));
            if app
                .store
                .get(&Key::new(KV, "virtualmachines", ns, &target))
                .is_some()
            {
                // restore.go: the restore reports the taken target and never completes.
                return;
            }
            if create_kubevirt_target(app, clone, &source, &target).is_err() {
                return;
            }
            app.store.modify(&key, |o| {
                let mut st = status_of(o);
                st["phase"] = json!("CreatingTargetVM");
                st["targetName"] = json!(target);
                still(&mut st);
                o["status"] = st;
            });
        }
        "CreatingTargetVM" if tick => {
            app.store.modify(&key, |o| {
                let mut st = status_of(o);
                st["phase"] = json!("Succeeded");
                // All claims bound: the temporary snapshot and restore are cleaned up.
                if let Some(m) = st.as_object_mut() {
                    m.remove("snapshotName");
                    m.remove("restoreName");
                }
                set_condition(&mut st, "Progressing", false, "Ready", "");
                set_condition(&mut st, "Ready", true, "Ready", "");
                o["status"] = st;
            });
        }
        _ => {}
    }
}

fn status_of(o: &Value) -> Value {
    match o.get("status") {
        Some(s) if s.is_object() => s.clone(),
        _ => json!({}),
    }
}

/// Whether `key` is kept by the filters (`vm-target.go` addRemovePatchesFromFilter: no filters
/// keep everything; `*` alone matches all; `!` negations win over matches).
pub fn kept_by_filters(key: &str, filters: Option<&Vec<Value>>) -> bool {
    let Some(filters) = filters else {
        return true;
    };
    let mut included = false;
    let mut excluded = false;
    for f in filters.iter().filter_map(Value::as_str) {
        let (negated, pattern) = match f.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, if f == "*" { ".*" } else { f }),
        };
        let matched = regex_match(pattern, key);
        if negated {
            excluded |= matched;
        } else {
            included |= matched;
        }
    }
    included && !excluded
}

/// Go's `regexp.MatchString` for the filter patterns the admitter allows (a literal with an
/// optional trailing `*`, or `.*`): an unanchored search.
fn regex_match(pattern: &str, s: &str) -> bool {
    if pattern == ".*" {
        return true;
    }
    // `abc*` as a regexp is `ab` followed by any number of `c`: it matches where `ab` occurs.
    match pattern.strip_suffix('*') {
        Some(stem) => {
            let stem = stem.strip_suffix(|_: char| true).unwrap_or(stem);
            s.contains(stem)
        }
        None => s.contains(pattern),
    }
}

fn filter_map(map: &Value, filters: Option<&Vec<Value>>) -> Value {
    let kept: Map<String, Value> = map
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| kept_by_filters(k, filters))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Value::Object(kept)
}

pub(crate) fn without_emulator_state(map: &Value) -> Value {
    let kept: Map<String, Value> = map
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(EMULATOR_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Value::Object(kept)
}

/// The target VM of a clone, as restore.go and vm-target.go make it.
pub fn kubevirt_target_vm(clone: &Value, source: &Value, target: &str, restore_uid: &str) -> Value {
    let spec = &clone["spec"];
    let filters = |p: &str| spec.pointer(p).and_then(Value::as_array);
    let mut labels = filter_map(&source["metadata"]["labels"], filters("/labelFilters"));
    let mut annotations = filter_map(
        &without_emulator_state(&source["metadata"]["annotations"]),
        filters("/annotationFilters"),
    );
    // setLastRestoreAnnotation: the restore that made it.
    annotations["restore.kubevirt.io/lastRestoreUID"] = json!(format!(
        "tmp-restore-{}-{restore_uid}",
        meta_str(clone, "uid")
    ));
    let mut vm_spec = source["spec"].clone();
    let tmpl_meta = vm_spec.pointer_mut("/template/metadata");
    if let Some(meta) = tmpl_meta {
        if meta.get("labels").is_some() {
            meta["labels"] = filter_map(&meta["labels"], filters("/template/labelFilters"));
        }
        if meta.get("annotations").is_some() {
            meta["annotations"] =
                filter_map(&meta["annotations"], filters("/template/annotationFilters"));
        }
    }
    if let Some(ifaces) = vm_spec
        .pointer_mut("/template/spec/domain/devices/interfaces")
        .and_then(Value::as_array_mut)
    {
        for iface in ifaces {
            let name = iface["name"].as_str().unwrap_or("").to_string();
            match spec
                .pointer("/newMacAddresses")
                .and_then(|m| m.get(&name))
                .and_then(Value::as_str)
            {
                Some(mac) if !mac.is_empty() => iface["macAddress"] = json!(mac),
                // An empty MAC: the cluster's MAC pool (or the network) picks one.
                _ => {
                    if let Some(m) = iface.as_object_mut() {
                        m.remove("macAddress");
                    }
                }
            }
        }
    }
    if let Some(fw) = vm_spec
        .pointer_mut("/template/spec/domain/firmware")
        .and_then(Value::as_object_mut)
    {
        fw.remove("uuid");
        match spec.pointer("/newSMBiosSerial").and_then(Value::as_str) {
            Some(serial) if !serial.is_empty() => {
                fw.insert("serial".into(), json!(serial));
            }
            _ => {
                fw.remove("serial");
            }
        }
    }
    // A new VM from a restore is halted (restore.go generateRestoredVMSpec).
    if vm_spec.get("running").is_some_and(|r| !r.is_null()) {
        vm_spec["running"] = json!(false);
    } else {
        vm_spec["runStrategy"] = json!("Halted");
    }
    // Claims of its own.
    let policy = spec
        .pointer("/volumeNamePolicy")
        .and_then(Value::as_str)
        .unwrap_or("RandomizeNames");
    let new_name = |volume: &str| match policy {
        "PrefixTargetName" => format!("{target}-{volume}"),
        _ => format!("restore-{restore_uid}-{volume}"),
    };
    let mut renamed_dvs: Vec<(String, String)> = vec![];
    if let Some(volumes) = vm_spec
        .pointer_mut("/template/spec/volumes")
        .and_then(Value::as_array_mut)
    {
        for v in volumes.iter_mut() {
            let vol = v["name"].as_str().unwrap_or("").to_string();
            if let Some(dv) = v.pointer_mut("/dataVolume/name") {
                let old = dv.as_str().unwrap_or("").to_string();
                *dv = json!(new_name(&vol));
                renamed_dvs.push((old, new_name(&vol)));
            } else if let Some(claim) = v.pointer_mut("/persistentVolumeClaim/claimName") {
                *claim = json!(new_name(&vol));
            }
        }
    }
    if let Some(templates) = vm_spec
        .pointer_mut("/dataVolumeTemplates")
        .and_then(Value::as_array_mut)
    {
        for t in templates {
            let old = t.pointer("/metadata/name").and_then(Value::as_str);
            if let Some((_, new)) = renamed_dvs.iter().find(|(o, _)| Some(o.as_str()) == old) {
                t["metadata"]["name"] = json!(new);
            }
        }
    }
    if labels.as_object().is_some_and(Map::is_empty) {
        labels = Value::Null;
    }
    let mut vm = json!({
        "apiVersion": source["apiVersion"], "kind": "VirtualMachine",
        "metadata": {"name": target, "namespace": meta_str(source, "namespace"),
            "annotations": annotations},
        "spec": vm_spec,
    });
    if !labels.is_null() {
        vm["metadata"]["labels"] = labels;
    }
    for p in spec
        .pointer("/patches")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if let Ok(op) = serde_json::from_str::<Value>(p) {
            let _ = crate::core::patch::apply(
                crate::core::patch::PatchType::Json,
                &mut vm,
                &json!([op]),
            );
        }
    }
    vm
}

/// The claim behind each of the source's disk volumes: `(volume, claim)`.
fn source_claims(source: &Value) -> Vec<(String, String)> {
    source
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let claim = v
                .pointer("/dataVolume/name")
                .or_else(|| v.pointer("/persistentVolumeClaim/claimName"))?
                .as_str()?;
            Some((v["name"].as_str()?.to_string(), claim.to_string()))
        })
        .collect()
}

fn create_kubevirt_target(
    app: &App,
    clone: &Value,
    source: &Value,
    target: &str,
) -> Result<(), ()> {
    let ns = meta_str(source, "namespace");
    let restore_uid = new_uid();
    let vm = kubevirt_target_vm(clone, source, target, &restore_uid);
    let created = app
        .store
        .create(KV, "virtualmachines", vm.clone())
        .map_err(|_| ())?;
    let new_claims = source_claims(&vm);
    for ((_, old), (_, new)) in source_claims(source).iter().zip(new_claims.iter()) {
        let Some(pvc) = app
            .store
            .get(&Key::new("", "persistentvolumeclaims", ns, old))
        else {
            continue;
        };
        let size = pvc
            .pointer("/status/capacity/storage")
            .or_else(|| pvc.pointer("/spec/resources/requests/storage"))
            .cloned()
            .unwrap_or(json!("1Gi"));
        let mut spec = pvc["spec"].clone();
        if let Some(m) = spec.as_object_mut() {
            m.remove("volumeName");
            m.remove("dataSource");
            m.remove("dataSourceRef");
        }
        spec["volumeName"] = json!(format!("pvc-{}", new_uid()));
        let _ = app.store.create(
            "",
            "persistentvolumeclaims",
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": new, "namespace": ns,
                    "annotations": {CONTENT_OF: content_pvc(app, ns, old),
                        "restore.kubevirt.io/name": format!("tmp-restore-{}", meta_str(clone, "uid"))},
                    "ownerReferences": [owner_ref(&created)]},
                "spec": spec,
                "status": {"phase": "Bound", "accessModes": pvc["spec"]["accessModes"].clone(),
                    "capacity": {"storage": size}}}),
        );
        // Upstream copies the volume through the VolumeSnapshot of the snapshot phase: the new
        // claim holds the source's bytes of that moment, not a view of what it holds later.
        let id = format!("clone-{}-{new}", meta_str(clone, "uid"));
        crate::kubevirt::vm_snapshot::capture(app, ns, old, &id);
        crate::kubevirt::vm_snapshot::materialize(app, ns, new, &id);
        let _ = std::fs::remove_file(app.uploads.data_path(&id));
        // A template's DataVolume is made pre-populated over the restored claim (restore.go
        // createDataVolume, cdi.kubevirt.io/storage.prePopulated).
        if let Some(t) = vm
            .pointer("/spec/dataVolumeTemplates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|t| t.pointer("/metadata/name").and_then(Value::as_str) == Some(new))
        {
            let mut meta = t["metadata"].clone();
            meta["namespace"] = json!(ns);
            meta["annotations"]["cdi.kubevirt.io/storage.prePopulated"] = json!(new);
            meta["annotations"]["restore.kubevirt.io/name"] =
                json!(format!("tmp-restore-{}", meta_str(clone, "uid")));
            meta["ownerReferences"] = json!([owner_ref(&created)]);
            let mut st = json!({"phase": "Succeeded", "progress": "100.0%", "claimName": new});
            set_condition(&mut st, "Bound", true, "Bound", "PVC bound");
            set_condition(&mut st, "Ready", true, "", "");
            let _ = app.store.create(
                "cdi.kubevirt.io",
                "datavolumes",
                json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                    "metadata": meta, "spec": t["spec"].clone(), "status": st}),
            );
        }
    }
    Ok(())
}

/// One resource of a Deckhouse clone: what it is and what it becomes.
struct Planned {
    kind: &'static str,
    plural: &'static str,
    group: &'static str,
    object: Value,
}

/// `name` after the `nameReplacement` rules, then the customization, of `clone` (the
/// operation's `spec.clone` or a snapshot operation's `spec.createVirtualMachine`).
fn rename(kind: &str, name: &str, clone: &Value) -> String {
    let mut out = name.to_string();
    for rule in clone["nameReplacement"].as_array().into_iter().flatten() {
        let from_kind = rule
            .pointer("/from/kind")
            .and_then(Value::as_str)
            .unwrap_or("");
        if (from_kind.is_empty() || from_kind == kind)
            && rule.pointer("/from/name").and_then(Value::as_str) == Some(name)
        {
            out = rule["to"].as_str().unwrap_or(name).to_string();
            break;
        }
    }
    let prefix = clone
        .pointer("/customization/namePrefix")
        .and_then(Value::as_str)
        .unwrap_or("");
    let suffix = clone
        .pointer("/customization/nameSuffix")
        .and_then(Value::as_str)
        .unwrap_or("");
    format!("{prefix}{out}{suffix}")
}

/// The resources a Deckhouse clone of `vm` makes (restorer: Secret, VirtualDisks, VM), named
/// by `spec` (see [`rename`]). `snapshot_uid`: `vm` is the one a VirtualMachineSnapshot kept and
/// its disks are made from that snapshot's VirtualDiskSnapshots (`<disk>-<uid>`), holding their
/// bytes at snapshot time; otherwise from the live disks.
fn deckhouse_plan(
    app: &App,
    op: &Value,
    vm: &Value,
    spec: &Value,
    snapshot_uid: Option<&str>,
    provisioner: Option<&Option<Value>>,
) -> Vec<Planned> {
    let ns = meta_str(vm, "namespace");
    let op_uid = meta_str(op, "uid");
    let op = spec;
    let mut out = vec![];
    let mut new_vm = json!({
        "apiVersion": vm["apiVersion"], "kind": "VirtualMachine",
        "metadata": {"name": rename("VirtualMachine", meta_str(vm, "name"), op), "namespace": ns,
            "annotations": without_emulator_state(&vm["metadata"]["annotations"])},
        "spec": vm["spec"].clone(),
    });
    // ProcessClone: no labels; Prepare: no IP address or MAC address claims of the source.
    new_vm["metadata"]["annotations"][VMOP_RESTORE] = json!(op_uid);
    if let Some(m) = new_vm["spec"].as_object_mut() {
        m.remove("virtualMachineIPAddressName");
    }
    for n in new_vm["spec"]["networks"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if let Some(m) = n.as_object_mut() {
            m.remove("virtualMachineMACAddressName");
        }
    }
    if let Some(secret) = vm
        .pointer("/spec/provisioning/userDataRef")
        .filter(|r| r["kind"] == "Secret")
        .and_then(|r| r["name"].as_str())
    {
        let new_name = rename("Secret", secret, op);
        new_vm["spec"]["provisioning"]["userDataRef"]["name"] = json!(new_name);
        // A clone copies the live Secret; a VM made from a snapshot gets the one the snapshot
        // keeps (`snapshot_resources.go` `Prepare`: `RestoreProvisioner`), even when the
        // source's is gone.
        let source = match provisioner {
            Some(kept) => kept.clone(),
            None => app.store.get(&Key::new("", "secrets", ns, secret)),
        };
        if let Some(s) = source {
            let mut annotations = without_emulator_state(&s["metadata"]["annotations"]);
            annotations[VMOP_RESTORE] = json!(op_uid);
            out.push(Planned {
                kind: "Secret",
                plural: "secrets",
                group: "",
                object: json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": new_name, "namespace": ns, "annotations": annotations,
                        "labels": s["metadata"]["labels"].clone()},
                    "type": s["type"].clone(), "data": s["data"].clone()}),
            });
        }
    }
    for r in new_vm["spec"]["blockDeviceRefs"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if r["kind"] != "VirtualDisk" {
            continue;
        }
        let old = r["name"].as_str().unwrap_or("").to_string();
        let new_name = rename("VirtualDisk", &old, op);
        r["name"] = json!(new_name);
        let vds_name = format!("{old}-{}", snapshot_uid.unwrap_or(op_uid));
        let live = app.store.get(&Key::new(DH, "virtualdisks", ns, &old));
        // From a snapshot the disk may be gone: its VirtualDiskSnapshot knows the size.
        let vds = snapshot_uid.and_then(|_| {
            app.store
                .get(&Key::new(DH, "virtualdisksnapshots", ns, &vds_name))
        });
        let Some(vd) = live.clone().or_else(|| {
            vds.as_ref().map(|s| {
                json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "metadata": {},
                    "status": {"capacity": s.pointer("/metadata/annotations/emulator.kubevm.io~1size")
                        .cloned().unwrap_or(json!("10Gi"))}})
            })
        }) else {
            continue;
        };
        let mut annotations = without_emulator_state(&vd["metadata"]["annotations"]);
        annotations[VMOP_RESTORE] = json!(op_uid);
        // Upstream the disk is made from a VirtualDiskSnapshot (for a clone not made here, see
        // above); the size and class are the source's.
        let mut spec = json!({"dataSource": {"type": "ObjectRef",
            "objectRef": {"kind": "VirtualDiskSnapshot", "name": vds_name}}});
        if let Some(pvc) = vd.pointer("/spec/persistentVolumeClaim") {
            spec["persistentVolumeClaim"] = pvc.clone();
        }
        if let Some(cap) = vd.pointer("/status/capacity") {
            spec["persistentVolumeClaim"]["size"] = cap.clone();
        }
        let mut object = json!({"apiVersion": vd["apiVersion"], "kind": "VirtualDisk",
            "metadata": {"name": new_name, "namespace": ns, "annotations": annotations},
            "spec": spec});
        if let Some(l) = vd.pointer("/metadata/labels") {
            object["metadata"]["labels"] = l.clone();
        }
        // Which claim holds the source's bytes (carried to the new disk's claim below); from a
        // snapshot the VirtualDisk controller gives the snapshot's bytes (dh_snapshot::disk_data).
        if snapshot_uid.is_none() {
            object["metadata"]["annotations"][CONTENT_OF] = json!(
                vd.pointer("/status/target/persistentVolumeClaimName")
                    .and_then(Value::as_str)
                    .map(|p| content_pvc(app, ns, p))
                    .unwrap_or_default()
            );
        }
        out.push(Planned {
            kind: "VirtualDisk",
            plural: "virtualdisks",
            group: DH,
            object,
        });
    }
    out.push(Planned {
        kind: "VirtualMachine",
        plural: "virtualmachines",
        group: DH,
        object: new_vm,
    });
    out
}

fn resource_status(kind: &str, name: &str, status: &str, message: &str) -> Value {
    json!({"apiVersion": "v1alpha2", "kind": kind, "name": name, "status": status, "message": message})
}

/// Validation of one planned resource (restorers' ValidateClone): a taken name fails.
fn validate(app: &App, op: &Value, p: &Planned) -> Result<(), String> {
    let ns = meta_str(&p.object, "namespace");
    let name = meta_str(&p.object, "name");
    let max = if p.kind == "VirtualMachine" { 63 } else { 253 };
    if name.len() > max {
        return Err(format!(
            "name {name:?} too long ({} > {max}): resource name exceeds maximum allowed length",
            name.len()
        ));
    }
    let Some(existing) = app.store.get(&Key::new(p.group, p.plural, ns, name)) else {
        return Ok(());
    };
    let ours = existing
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(VMOP_RESTORE))
        .and_then(Value::as_str)
        == Some(meta_str(op, "uid"));
    if ours {
        return Ok(());
    }
    match p.kind {
        "VirtualMachine" => Err(format!("VirtualMachine with name {name} already exists")),
        "VirtualDisk" => Err(format!("VirtualDisk with name {name} already exists")),
        // provisioner_restorer.go: an equal Secret passes validation.
        _ if existing["data"] == p.object["data"] => Ok(()),
        _ => Err(format!(
            "content of the secret {name} is different from that in the snapshot"
        )),
    }
}

/// One step of an InProgress Deckhouse `Clone` operation: `Err((reason, message))` fails it,
/// `Ok(true)` completes it.
pub fn deckhouse_clone(app: &App, op: &Value, vm: &Value) -> Result<bool, (Value, String)> {
    let plan = deckhouse_plan(app, op, vm, &op["spec"]["clone"], None, None);
    let mode = op
        .pointer("/spec/clone/mode")
        .and_then(Value::as_str)
        .unwrap_or("Strict");
    restore_plan(app, op, "virtualmachineoperations", "Clone", mode, &plan)
}

/// A VirtualMachineSnapshotOperation `CreateVirtualMachine` (dh_snapshot_op.rs): the VM
/// `kept` by the snapshot whose uid is `snapshot_uid` made again under the names of
/// `spec.createVirtualMachine` (`vmsop/internal/operation/create_virtual_machine.go`: the same
/// restorer as a clone). `Ok(_)` once processed (or validated, for DryRun).
pub fn deckhouse_from_snapshot(
    app: &App,
    op: &Value,
    kept: &Value,
    snapshot_uid: &str,
    provisioner: &Option<Value>,
) -> Result<bool, (Value, String)> {
    let spec = &op["spec"]["createVirtualMachine"];
    let plan = deckhouse_plan(app, op, kept, spec, Some(snapshot_uid), Some(provisioner));
    let mode = spec["mode"].as_str().unwrap_or("Strict");
    restore_plan(
        app,
        op,
        "virtualmachinesnapshotoperations",
        "CreateVirtualMachine",
        mode,
        &plan,
    )
}

/// Validates, then creates, the `plan` of the operation `op` (of `plural`, type `type_`).
fn restore_plan(
    app: &App,
    op: &Value,
    plural: &str,
    type_: &str,
    mode: &str,
    plan: &[Planned],
) -> Result<bool, (Value, String)> {
    let ns = meta_str(op, "namespace");
    let created = op
        .pointer("/status/resources")
        .and_then(Value::as_array)
        .is_some_and(|r| {
            !r.is_empty() && r.iter().all(|s| s["message"] == "Successfully processed")
        });
    if !created {
        let mut statuses = vec![];
        let mut failed = false;
        for p in plan {
            let name = meta_str(&p.object, "name");
            match validate(app, op, p) {
                Ok(()) => statuses.push(resource_status(
                    p.kind,
                    name,
                    "Completed",
                    &format!("{name} is valid for restore"),
                )),
                Err(message) => {
                    failed = true;
                    statuses.push(resource_status(p.kind, name, "Failed", &message));
                }
            }
        }
        if failed {
            return Err((
                json!(statuses),
                format!("{type_} is failed: fail to validate the resources: check the status"),
            ));
        }
        if mode == "DryRun" {
            set_resources(app, op, plural, json!(statuses));
            return Ok(true);
        }
        let mut statuses = vec![];
        let mut vm_created = None;
        for p in plan {
            let name = meta_str(&p.object, "name").to_string();
            // What already carries this operation's uid is taken as made, not created again
            // (deckhouse/virtualization `service/restorer/restorers/provisioner_restorer.go`
            // and `vm_restorer.go` ProcessClone: `existed.Annotations[AnnVMOPRestore] ==
            // restoreUID` returns nil before Create).
            let key = Key::new(p.group, p.plural, ns, &name);
            if let Some(existing) = app.store.get(&key).filter(|o| {
                o.pointer("/metadata/annotations")
                    .and_then(|a| a.get(VMOP_RESTORE))
                    .and_then(Value::as_str)
                    == Some(meta_str(op, "uid"))
            }) {
                if p.kind == "VirtualMachine" {
                    vm_created = Some(existing);
                }
                statuses.push(resource_status(
                    p.kind,
                    &name,
                    "Completed",
                    "Successfully processed",
                ));
                continue;
            }
            match app.store.create(p.group, p.plural, p.object.clone()) {
                Ok(obj) => {
                    if p.kind == "VirtualMachine" {
                        vm_created = Some(obj);
                    }
                    statuses.push(resource_status(
                        p.kind,
                        &name,
                        "Completed",
                        "Successfully processed",
                    ));
                }
                Err(e) => {
                    statuses.push(resource_status(
                        p.kind,
                        &name,
                        "Failed",
                        &format!("failed to create the `{}`: {e:?}", p.kind),
                    ));
                    return Err((
                        json!(statuses),
                        format!(
                            "{type_} is failed: fail to process the resources: check the status"
                        ),
                    ));
                }
            }
        }
        // The disks are owned by the new VM (snapshot_resources.go setOwnerRefOnVirtualDisk).
        if let Some(new_vm) = vm_created {
            for p in plan.iter().filter(|p| p.kind == "VirtualDisk") {
                let key = Key::new(DH, "virtualdisks", ns, meta_str(&p.object, "name"));
                app.store.modify(&key, |o| {
                    let mut r = owner_ref(&new_vm);
                    if let Some(m) = r.as_object_mut() {
                        m.remove("controller");
                        m.remove("blockOwnerDeletion");
                    }
                    o["metadata"]["ownerReferences"] = json!([r]);
                });
            }
        }
        set_resources(app, op, plural, json!(statuses));
        return Ok(false);
    }
    // WaitingDisksStep: done once every new disk is ready (or waits for its first consumer).
    let ready = plan.iter().filter(|p| p.kind == "VirtualDisk").all(|p| {
        app.store
            .get(&Key::new(
                DH,
                "virtualdisks",
                ns,
                meta_str(&p.object, "name"),
            ))
            .and_then(|vd| {
                vd.pointer("/status/phase")
                    .and_then(Value::as_str)
                    .map(String::from)
            })
            .is_some_and(|phase| matches!(phase.as_str(), "Ready" | "WaitForFirstConsumer"))
    });
    Ok(ready)
}

fn set_resources(app: &App, op: &Value, plural: &str, statuses: Value) {
    app.store.modify(&Key::of(DH, plural, op), |o| {
        o["status"]["resources"] = statuses;
    });
}

/// The claim a new VirtualDisk's controller makes holds its source's bytes: called before the
/// claim is created.
pub fn content_of_disk(vd: &Value) -> Option<String> {
    vd.pointer("/metadata/annotations")
        .and_then(|a| a.get(CONTENT_OF))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_follow_vm_target_go() {
        let f = |v: Value| v.as_array().cloned();
        assert!(kept_by_filters("anything", None));
        let all_but = f(json!(["*", "!kubevm.io/vm"]));
        assert!(kept_by_filters("app", all_but.as_ref()));
        assert!(!kept_by_filters("kubevm.io/vm", all_but.as_ref()));
        let only = f(json!(["app*"]));
        assert!(kept_by_filters("app.kubernetes.io/name", only.as_ref()));
        assert!(!kept_by_filters("tier", only.as_ref()));
        assert!(!kept_by_filters("x", Some(&vec![])));
    }

    #[test]
    fn target_vm_gets_new_identity_and_claims() {
        let source = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "src", "namespace": "default", "labels": {"a": "1"},
                "annotations": {"emulator.kubevm.io/power": "on", "note": "x"}},
            "spec": {"runStrategy": "Always",
                "dataVolumeTemplates": [{"metadata": {"name": "src-root"}, "spec": {}}],
                "template": {"spec": {"domain": {"devices": {"interfaces": [
                        {"name": "default", "macAddress": "02:00:00:00:00:01"}, {"name": "b", "macAddress": "02:00:00:00:00:02"}]},
                        "firmware": {"uuid": "u", "serial": "s"}},
                    "volumes": [{"name": "root", "dataVolume": {"name": "src-root"}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
                        {"name": "ci", "cloudInitNoCloud": {}}]}}}});
        let clone = json!({"metadata": {"uid": "c1"}, "spec": {"newMacAddresses": {"b": "02:00:00:00:00:99"},
            "newSMBiosSerial": "new", "patches": ["{\"op\":\"add\",\"path\":\"/metadata/labels/b\",\"value\":\"2\"}"]}});
        let vm = kubevirt_target_vm(&clone, &source, "dst", "r1");
        assert_eq!(vm["metadata"]["name"], "dst");
        assert_eq!(vm["metadata"]["labels"], json!({"a": "1", "b": "2"}));
        assert_eq!(vm["metadata"]["annotations"]["note"], "x");
        assert!(
            vm["metadata"]["annotations"]
                .get("emulator.kubevm.io/power")
                .is_none()
        );
        assert_eq!(vm["spec"]["runStrategy"], "Halted");
        let ifaces = &vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"];
        assert!(ifaces[0].get("macAddress").is_none());
        assert_eq!(ifaces[1]["macAddress"], "02:00:00:00:00:99");
        assert_eq!(
            vm["spec"]["template"]["spec"]["domain"]["firmware"],
            json!({"serial": "new"})
        );
        let vols = &vm["spec"]["template"]["spec"]["volumes"];
        assert_eq!(vols[0]["dataVolume"]["name"], "restore-r1-root");
        assert_eq!(
            vols[1]["persistentVolumeClaim"]["claimName"],
            "restore-r1-data"
        );
        assert_eq!(
            vm["spec"]["dataVolumeTemplates"][0]["metadata"]["name"],
            "restore-r1-root"
        );
        let prefixed =
            json!({"metadata": {"uid": "c1"}, "spec": {"volumeNamePolicy": "PrefixTargetName"}});
        let vm = kubevirt_target_vm(&prefixed, &source, "dst", "r1");
        assert_eq!(
            vm["spec"]["template"]["spec"]["volumes"][0]["dataVolume"]["name"],
            "dst-root"
        );
    }

    #[test]
    fn deckhouse_names_follow_replacement_then_customization() {
        let op = json!({"spec": {"clone": {"nameReplacement": [
            {"from": {"kind": "VirtualDisk", "name": "root"}, "to": "root2"},
            {"from": {"name": "vm"}, "to": "vm2"}],
            "customization": {"namePrefix": "p-", "nameSuffix": "-s"}}}});
        assert_eq!(
            rename("VirtualDisk", "root", &op["spec"]["clone"]),
            "p-root2-s"
        );
        assert_eq!(
            rename("VirtualMachine", "root", &op["spec"]["clone"]),
            "p-root-s"
        );
        assert_eq!(
            rename("VirtualMachine", "vm", &op["spec"]["clone"]),
            "p-vm2-s"
        );
    }

    fn app(flavor: crate::ServeFlavor) -> App {
        App::new(
            crate::core::registry::Registry::new(flavor),
            std::time::Duration::from_secs(1),
        )
    }

    fn ticks(app: &App, n: usize) {
        for _ in 0..n {
            crate::core::controllers::reconcile_all(app, true);
        }
    }

    fn clone_phase(app: &App) -> Value {
        app.store
            .get(&Key::new(
                CLONE_GROUP,
                "virtualmachineclones",
                "default",
                "c",
            ))
            .map(|c| c["status"].clone())
            .unwrap_or(Value::Null)
    }

    #[test]
    fn kubevirt_clone_waits_for_its_source_then_goes_through_the_phases() {
        let app = app(crate::ServeFlavor::KubeVirt);
        app.store
            .create(CLONE_GROUP, "virtualmachineclones", json!({"apiVersion": "clone.kubevirt.io/v1beta1",
                "kind": "VirtualMachineClone", "metadata": {"name": "c", "namespace": "default"},
                "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "src"},
                    "target": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "dst"}}}))
            .unwrap();
        ticks(&app, 2);
        let st = clone_phase(&app);
        assert!(st.get("phase").is_none(), "{st}");
        let ready = st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap();
        assert_eq!(
            ready["reason"],
            "Source doesnt exist: VirtualMachine default/src"
        );
        app.store
            .create("", "persistentvolumeclaims", json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "src-root", "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}}))
            .unwrap();
        crate::kubevirt::vm_snapshot::write_volume(
            &app,
            "default",
            "src-root",
            b"before the clone",
        )
        .unwrap();
        app.store
            .create(KV, "virtualmachines", json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "src", "namespace": "default"},
                "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}},
                    "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "src-root"}}]}}}}))
            .unwrap();
        let mut seen = vec![];
        for _ in 0..6 {
            crate::core::controllers::reconcile_all(&app, false);
            if let Some(p) = clone_phase(&app)["phase"].as_str()
                && seen.last().map(String::as_str) != Some(p)
            {
                seen.push(p.to_owned());
            }
            crate::core::controllers::reconcile_all(&app, true);
            if let Some(p) = clone_phase(&app)["phase"].as_str()
                && seen.last().map(String::as_str) != Some(p)
            {
                seen.push(p.to_owned());
            }
        }
        assert_eq!(
            seen,
            [
                "SnapshotInProgress",
                "RestoreInProgress",
                "CreatingTargetVM",
                "Succeeded"
            ]
        );
        let dst = app
            .store
            .get(&Key::new(KV, "virtualmachines", "default", "dst"))
            .unwrap();
        assert_eq!(dst["spec"]["runStrategy"], "Halted");
        let claim =
            dst["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
                .as_str()
                .unwrap()
                .to_owned();
        assert!(claim.starts_with("restore-"), "{claim}");
        // The clone has its own copy: the source written afterwards does not show through.
        crate::kubevirt::vm_snapshot::write_volume(&app, "default", "src-root", b"after").unwrap();
        let data = |pvc: &str| {
            std::fs::read(crate::kubevirt::upload::uploaded_file(&app, "default", pvc).unwrap())
                .unwrap()
        };
        assert_eq!(data(&claim), b"before the clone");
        assert_eq!(data("src-root"), b"after");
        // Deleting the target VM deletes the succeeded clone.
        app.store.delete(
            &Key::new(KV, "virtualmachines", "default", "dst"),
            crate::core::store::Propagation::Cascade,
        );
        ticks(&app, 1);
        assert!(clone_phase(&app).is_null());
    }

    /// provisioner_restorer.go ProcessClone: a Secret under the replaced name that carries the
    /// operation's uid (`vmoprestore`) is the operation's own: the clone completes with it, as
    /// it was, and the new VM (created with the source's runPolicy, AlwaysOn) refers to it.
    /// Without one, the copy of the source's Secret is made before the VM.
    #[test]
    fn deckhouse_clone_takes_a_secret_marked_with_its_uid_as_its_own() {
        for premade in [true, false] {
            let app = app(crate::ServeFlavor::Deckhouse);
            app.store
                .create(
                    DH,
                    "virtualdisks",
                    json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                    "kind": "VirtualDisk", "metadata": {"name": "src-root", "namespace": "default"},
                    "spec": {"persistentVolumeClaim": {"size": "1Gi"}}}),
                )
                .unwrap();
            app.store
                .create(
                    "",
                    "secrets",
                    json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "src-cloudinit", "namespace": "default"},
                    "data": {"userData": "c291cmNl"}}),
                )
                .unwrap();
            app.store
                .create(DH, "virtualmachines", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                    "kind": "VirtualMachine", "metadata": {"name": "src", "namespace": "default"},
                    "spec": {"runPolicy": "AlwaysOn",
                        "provisioning": {"type": "UserDataRef", "userDataRef": {"kind": "Secret", "name": "src-cloudinit"}},
                        "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "src-root"}]}}))
                .unwrap();
            let rules = json!([{"from": {"kind": "VirtualMachine", "name": "src"}, "to": "dst"},
                {"from": {"kind": "VirtualDisk", "name": "src-root"}, "to": "dst-root"},
                {"from": {"kind": "Secret", "name": "src-cloudinit"}, "to": "dst-cloudinit"}]);
            let op = app
                .store
                .create(DH, "virtualmachineoperations", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                    "kind": "VirtualMachineOperation", "metadata": {"name": "op", "namespace": "default"},
                    "spec": {"type": "Clone", "virtualMachineName": "src",
                        "clone": {"mode": "Strict", "nameReplacement": rules}}}))
                .unwrap();
            if premade {
                app.store
                    .create(
                        "",
                        "secrets",
                        json!({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "dst-cloudinit", "namespace": "default",
                            "annotations": {VMOP_RESTORE: op["metadata"]["uid"]}},
                        "data": {"userData": "bmV3"}}),
                    )
                    .unwrap();
            }
            ticks(&app, 8);
            let op = app
                .store
                .get(&Key::new(DH, "virtualmachineoperations", "default", "op"))
                .unwrap();
            // Processed (the disks' readiness, which ends the operation, is not modelled here).
            let resources = op["status"]["resources"].as_array().unwrap();
            assert_eq!(resources.len(), 3, "{op}");
            assert!(
                resources
                    .iter()
                    .all(|r| r["message"] == "Successfully processed"),
                "{op}"
            );
            let secret = app
                .store
                .get(&Key::new("", "secrets", "default", "dst-cloudinit"))
                .unwrap();
            let expected = if premade { "bmV3" } else { "c291cmNl" };
            assert_eq!(secret["data"]["userData"], expected, "{secret}");
            let vm = app
                .store
                .get(&Key::new(DH, "virtualmachines", "default", "dst"))
                .unwrap();
            assert_eq!(vm["spec"]["runPolicy"], "AlwaysOn");
            assert_eq!(
                vm["spec"]["provisioning"]["userDataRef"]["name"],
                "dst-cloudinit"
            );
            // The restorer handles the Secret before the VM (snapshot_resources.go Prepare).
            let order: Vec<&str> = op["status"]["resources"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|r| r["kind"].as_str())
                .collect();
            let at = |k| order.iter().position(|o| *o == k).unwrap();
            assert!(at("Secret") < at("VirtualMachine"), "{order:?}");
        }
    }

    #[test]
    fn deckhouse_clone_fails_on_a_taken_disk_name_and_creates_nothing() {
        let app = app(crate::ServeFlavor::Deckhouse);
        for (name, disk) in [("src", "src-root"), ("other", "dst-root")] {
            app.store
                .create(
                    DH,
                    "virtualdisks",
                    json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                    "kind": "VirtualDisk", "metadata": {"name": disk, "namespace": "default"},
                    "spec": {"persistentVolumeClaim": {"size": "1Gi"}}}),
                )
                .unwrap();
            app.store
                .create(DH, "virtualmachines", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                    "kind": "VirtualMachine", "metadata": {"name": name, "namespace": "default"},
                    "spec": {"runPolicy": "Manual", "blockDeviceRefs": [{"kind": "VirtualDisk", "name": disk}]}}))
                .unwrap();
        }
        let rules = json!([{"from": {"kind": "VirtualMachine", "name": "src"}, "to": "dst"},
            {"from": {"kind": "VirtualDisk", "name": "src-root"}, "to": "dst-root"}]);
        app.store
            .create(DH, "virtualmachineoperations", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                "kind": "VirtualMachineOperation", "metadata": {"name": "op", "namespace": "default"},
                "spec": {"type": "Clone", "virtualMachineName": "src",
                    "clone": {"mode": "Strict", "nameReplacement": rules}}}))
            .unwrap();
        ticks(&app, 6);
        let op = app
            .store
            .get(&Key::new(DH, "virtualmachineoperations", "default", "op"))
            .unwrap();
        assert_eq!(op["status"]["phase"], "Failed", "{op}");
        let completed = &op["status"]["conditions"][0];
        assert_eq!(completed["reason"], "OperationFailed");
        assert_eq!(
            completed["message"],
            "Clone is failed: fail to validate the resources: check the status"
        );
        let failed: Vec<&Value> = op["status"]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] == "Failed")
            .collect();
        assert_eq!(failed.len(), 1);
        assert_eq!(
            failed[0]["message"],
            "VirtualDisk with name dst-root already exists"
        );
        assert!(
            app.store
                .get(&Key::new(DH, "virtualmachines", "default", "dst"))
                .is_none()
        );
    }
}
