//! KubeVirt's VM snapshot and restore controllers, and what a volume snapshot holds.
//!
//! Snapshot (kubevirt `pkg/storage/snapshot/snapshot.go` `updateVMSnapshot`,
//! `updateSnapshotStatus`, `createContent`; `source.go` `Lock`): a VirtualMachineSnapshot of a
//! VM first locks the VM (`status.snapshotInProgress: <snapshot>`, Progressing True "Source
//! locked and operation in progress", the source's `indications`), then gets a
//! VirtualMachineSnapshotContent `vmsnapshot-content-<uid>` whose `spec.volumeBackups` name a
//! VolumeSnapshot `vmsnapshot-<uid>-volume-<volume>` per PVC/DataVolume volume and whose
//! `spec.source.virtualMachine` is the VM as it was; once the content is ready the snapshot is
//! `Succeeded`, `readyToUse`, Ready True "Ready", Progressing False "Operation complete", and
//! the VM is unlocked. Without the VM it stays `InProgress` with Progressing False "Source does
//! not exist" until `spec.failureDeadline` (default 5m) has passed: then `Failed` with Failure
//! True "snapshot deadline exceeded". The emulator does not serve VolumeSnapshot objects; the
//! volume snapshots are ready at once and their data is kept here (see [`capture`]). A claim
//! that is unbound or whose storage class has no VolumeSnapshotClass for its provisioner
//! ([`snapshot_class`], `getSnapshotPVC`) gets no backup; the snapshot still succeeds and
//! `status.snapshotVolumes` lists every volume of the VM as included or excluded
//! (`updateSnapshotSnapshotableVolumes`). The VM's `status.volumeSnapshotStatuses` (the reason
//! per volume) is not kept.
//!
//! Content deletion (`updateVMSnapshotContent`): a content whose snapshot is gone is deleted
//! (the default `deletionPolicy` is delete).
//!
//! Restore (`pkg/storage/snapshot/restore.go` `updateVMRestore`): the status starts with
//! `complete: false` and "Initializing VirtualMachineRestore"; the restore is owned by its
//! target VM; a target whose VMI exists is not ready, and `spec.targetReadinessPolicy`
//! decides (`WaitGracePeriod`, the default: wait, failing after 5 minutes;
//! `FailImmediate`: fail with "Restore target VMI must be powered off before restore
//! operation"; `StopTarget`: stop it; `WaitEventually`: wait). A missing or unready snapshot is
//! an error in the conditions. Restoring to another VM that already exists is refused ("restore
//! source and restore target are different but restore target already exists"); to a VM that
//! does not exist creates it, halted. Each volume gets a new PVC `restore-<restore uid>-<volume>`
//! from its VolumeSnapshot (labels `restore.kubevirt.io/source-vm-name|namespace`, annotation
//! `restore.kubevirt.io/name`); a DataVolume template is renamed to it and a pre-populated
//! DataVolume of that name made; the VM's spec becomes the snapshot's with the new volumes
//! (annotation `restore.kubevirt.io/lastRestoreUID: <name>-<uid>`, the target keeping its run
//! strategy); DataVolumes of the old templates are listed in `status.deletedDataVolumes` and
//! deleted; then `complete: true`, `restoreTime`, Ready True "Operation complete".

use crate::core::app::App;
use crate::core::store::{Key, Propagation};
use crate::core::util::{meta_str, now_rfc3339, now_unix, parse_rfc3339};
use crate::kubevirt::export_snapshot::{CONTENT_OF, SNAPSHOT_GROUP, content_pvc};
use serde_json::{Value, json};

/// Plural of VirtualMachineSnapshot.
pub const SNAPSHOTS: &str = "virtualmachinesnapshots";
/// Plural of VirtualMachineSnapshotContent.
pub const CONTENTS: &str = "virtualmachinesnapshotcontents";
/// Plural of VirtualMachineRestore.
pub const RESTORES: &str = "virtualmachinerestores";

/// `snapshotv1.DefaultFailureDeadline` and `DefaultGracePeriod`.
const DEFAULT_DEADLINE_SECS: i64 = 300;
const DEADLINE_EXCEEDED: &str = "snapshot deadline exceeded";
const NOT_READY_FAILURE: &str = "Restore target VMI must be powered off before restore operation";
const GRACE_EXCEEDED: &str = "Restore target failed to be ready within 5m0s. Please power off the target VM before attempting restore";
const WAIT_GRACE: &str = "Waiting for target VM to be powered off. Please stop the restore target to proceed with restore, or the operation will fail after 5m0s";
const WAIT_EVENTUALLY: &str = "Waiting for target VM to be powered off. Please stop the restore target to proceed with restore";
const STOP_TARGET: &str = "Automatically stopping restore target for restore operation";
const EXISTING_TARGET: &str =
    "restore source and restore target are different but restore target already exists";
const LAST_RESTORE: &str = "restore.kubevirt.io/lastRestoreUID";

/// Indication messages (`snapshotIndicationMessages`).
fn indication_message(indication: &str) -> &'static str {
    match indication {
        "Online" => {
            "Snapshot taken while the VM was running. Consistency depends on guest-agent quiescing."
        }
        "GuestAgent" => {
            "Guest agent was active and attempted to quiesce the filesystem for application consistency."
        }
        _ => {
            "Guest agent was not available. Snapshot is crash-consistent and may not be application-consistent."
        }
    }
}

fn text<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// A snapshot condition (`newReadyCondition` and friends: reason only, no message).
fn set_cond(status: &mut Value, type_: &str, state: bool, reason: &str) {
    crate::core::controllers::set_condition(status, type_, state, reason, "");
    if let Some(c) = status["conditions"]
        .as_array_mut()
        .and_then(|c| c.iter_mut().find(|c| c["type"] == type_))
        && let Some(m) = c.as_object_mut()
    {
        m.remove("message");
    }
}

/// Seconds in a Go duration such as `5m0s`, `90s`, `1h`.
fn go_duration_secs(s: &str) -> Option<i64> {
    let (mut total, mut num) = (0f64, String::new());
    for ch in s.chars() {
        if ch.is_ascii_digit() || ch == '.' {
            num.push(ch);
            continue;
        }
        let n: f64 = num.parse().ok()?;
        num.clear();
        total += n * match ch {
            'h' => 3600.0,
            'm' => 60.0,
            's' => 1.0,
            _ => return None,
        };
    }
    num.is_empty().then_some(total as i64)
}

/// Whether `deadline` seconds from `created` have passed at `now` (0: no deadline).
fn past_deadline(created: i64, deadline: i64, now: i64) -> bool {
    deadline > 0 && now >= created + deadline
}

fn vm_key(ns: &str, name: &str) -> Key {
    Key::new("kubevirt.io", "virtualmachines", ns, name)
}

/// The claims of a VM's volumes: `(volume, claim)` for PVC and DataVolume volumes
/// (`source.go` `PersistentVolumeClaims`).
fn claims(vm: &Value) -> Vec<(String, String)> {
    vm.pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let claim = v
                .pointer("/persistentVolumeClaim/claimName")
                .or_else(|| v.pointer("/dataVolume/name"))
                .and_then(Value::as_str)?;
            Some((text(v, "/name").to_string(), claim.to_string()))
        })
        .collect()
}

/// The VolumeSnapshotClass for storage class `sc` (`getVolumeSnapshotClass`): the one whose
/// `driver` is the class's provisioner, or among several the one annotated
/// `snapshot.storage.kubernetes.io/is-default-class`; none for an unknown class.
///
/// A claim without a class has the default one (on a real cluster the DefaultStorageClass
/// admission plugin writes it into the claim; the emulator leaves it out).
pub fn snapshot_class(app: &App, sc: &str) -> Option<String> {
    let (classes, _) = app.store.list("storage.k8s.io", "storageclasses", None);
    let class = classes.into_iter().find(|c| {
        if sc.is_empty() {
            c.pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class")
                .and_then(Value::as_str)
                == Some("true")
        } else {
            meta_str(c, "name") == sc
        }
    })?;
    let provisioner = text(&class, "/provisioner");
    let (all, _) = app
        .store
        .list("snapshot.storage.k8s.io", "volumesnapshotclasses", None);
    let matches: Vec<&Value> = all
        .iter()
        .filter(|c| text(c, "/driver") == provisioner)
        .collect();
    match matches.as_slice() {
        [] => None,
        [one] => Some(meta_str(one, "name").to_string()),
        many => many
            .iter()
            .find(|c| {
                c.pointer("/metadata/annotations/snapshot.storage.kubernetes.io~1is-default-class")
                    .is_some()
            })
            .map(|c| meta_str(c, "name").to_string()),
    }
}

/// What a VolumeSnapshot `id` of PVC `ns/pvc` holds: a copy of the PVC's written data, or (for
/// generated data, which never changes) the PVC whose data it is.
///
/// A claim that is a real guest's boot disk holds the guest's disk instead: a point-in-time
/// copy of it is kept (`qemu_guest::snapshot`; the guest's filesystems frozen through its agent
/// meanwhile, as `pkg/storage/snapshot/source.go` `Freeze` has virt-handler do).
pub fn capture(app: &App, ns: &str, pvc: &str, id: &str) -> String {
    if let Err(e) = app.guests.capture_claim(app, ns, pvc, id) {
        eprintln!("kubevm-emulator: snapshot of the guest disk of {ns}/{pvc}: {e}");
    }
    let source = content_pvc(app, ns, pvc);
    if let Some(path) = crate::kubevirt::upload::uploaded_file(app, ns, &source) {
        let _ = std::fs::copy(path, app.uploads.data_path(id));
    }
    source
}

/// Gives a new PVC the data of VolumeSnapshot `id` (taken of `source`, see [`capture`]).
/// A guest disk kept by [`capture`] becomes the new claim's.
pub fn materialize(app: &App, ns: &str, pvc: &str, id: &str) {
    let Some(obj) = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, pvc))
    else {
        return;
    };
    if let Err(e) = app.guests.restore_claim(app, ns, pvc, id) {
        eprintln!("kubevm-emulator: restore of a guest disk into {ns}/{pvc}: {e}");
    }
    let kept = app.uploads.data_path(id);
    if kept.exists() {
        let uid = meta_str(&obj, "uid");
        if std::fs::copy(&kept, app.uploads.data_path(uid)).is_ok() {
            app.uploads.finish(uid, Ok(()));
            // It holds its own data now, not a view of the source's.
            app.store
                .modify(&Key::of("", "persistentvolumeclaims", &obj), |o| {
                    if let Some(a) = o["metadata"]["annotations"].as_object_mut() {
                        a.remove(CONTENT_OF);
                    }
                });
        }
    }
}

/// The data ids of the volume snapshots existing snapshot contents name, and of Deckhouse's
/// existing VirtualDiskSnapshots (data kept under any other id belongs to a deleted snapshot).
pub fn live_data_ids(app: &App) -> std::collections::HashSet<String> {
    let mut ids = crate::deckhouse::snapshot::live_data_ids(app);
    if app.registry.find_plural(SNAPSHOT_GROUP, CONTENTS).is_none() {
        return ids;
    }
    let (contents, _) = app.store.list(SNAPSHOT_GROUP, CONTENTS, None);
    for c in &contents {
        let ns = meta_str(c, "namespace");
        for b in c
            .pointer("/spec/volumeBackups")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            ids.insert(data_id(ns, text(b, "/volumeSnapshotName")));
        }
    }
    ids
}

/// The id under which the data of a volume snapshot is kept.
fn data_id(ns: &str, volume_snapshot: &str) -> String {
    format!("vs-{ns}-{volume_snapshot}")
}

/// Test hook standing in for a guest that writes its disk: PVC `ns/pvc` now holds `data`.
pub fn write_volume(app: &App, ns: &str, pvc: &str, data: &[u8]) -> std::io::Result<()> {
    let obj = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, pvc))
        .ok_or_else(|| std::io::Error::other(format!("no PVC {ns}/{pvc}")))?;
    let uid = meta_str(&obj, "uid");
    std::fs::write(app.uploads.data_path(uid), data)?;
    app.uploads.finish(uid, Ok(()));
    Ok(())
}

/// VirtualMachineSnapshot reconciler.
pub fn vm_snapshot(app: &App, snap: &Value, _tick: bool) {
    let ns = meta_str(snap, "namespace");
    let name = meta_str(snap, "name");
    let uid = meta_str(snap, "uid");
    let key = Key::of(SNAPSHOT_GROUP, SNAPSHOTS, snap);
    let vm_name = text(snap, "/spec/source/name");
    let vm = (text(snap, "/spec/source/kind") == "VirtualMachine")
        .then(|| app.store.get(&vm_key(ns, vm_name)))
        .flatten();
    let unlock = || {
        app.store.modify(&vm_key(ns, vm_name), |o| {
            if o.pointer("/status/snapshotInProgress") == Some(&json!(name))
                && let Some(st) = o["status"].as_object_mut()
            {
                st.remove("snapshotInProgress");
            }
        });
    };
    match text(snap, "/status/phase") {
        "Succeeded" | "Failed" => {
            unlock();
            return;
        }
        _ => {}
    }
    let content_name = format!("vmsnapshot-content-{uid}");
    let Some(vm) = vm else {
        let deadline = snap
            .pointer("/spec/failureDeadline")
            .and_then(Value::as_str)
            .and_then(go_duration_secs)
            .unwrap_or(DEFAULT_DEADLINE_SECS);
        let created = parse_rfc3339(meta_str(snap, "creationTimestamp")).unwrap_or(now_unix());
        let exceeded = past_deadline(created, deadline, now_unix());
        app.store.modify(&key, |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["readyToUse"] = json!(false);
            if exceeded {
                st["phase"] = json!("Failed");
                set_cond(&mut st, "Failure", true, DEADLINE_EXCEEDED);
                set_cond(&mut st, "Progressing", false, "Operation failed");
            } else {
                st["phase"] = json!("InProgress");
                set_cond(&mut st, "Progressing", false, "Source does not exist");
            }
            set_cond(&mut st, "Ready", false, "Not ready");
            o["status"] = st;
        });
        return;
    };
    let locked_by = text(&vm, "/status/snapshotInProgress").to_string();
    if locked_by.is_empty() {
        // Lock the source and note how consistent the snapshot will be.
        let vmi = app.store.get(&Key::new(
            "kubevirt.io",
            "virtualmachineinstances",
            ns,
            vm_name,
        ));
        let mut indications = vec![];
        if let Some(vmi) = vmi.filter(|v| text(v, "/status/phase") == "Running") {
            indications.push("Online");
            let agent = vmi
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "AgentConnected" && c["status"] == "True")
                });
            indications.push(if agent { "GuestAgent" } else { "NoGuestAgent" });
        }
        app.store.modify(&vm_key(ns, vm_name), |o| {
            o["status"]["snapshotInProgress"] = json!(name);
        });
        app.store.modify(&key, |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["phase"] = json!("InProgress");
            st["readyToUse"] = json!(false);
            st["sourceUID"] = json!(meta_str(&vm, "uid"));
            set_cond(
                &mut st,
                "Progressing",
                true,
                "Source locked and operation in progress",
            );
            set_cond(&mut st, "Ready", false, "Not ready");
            if !indications.is_empty() {
                st["indications"] = json!(indications);
                st["sourceIndications"] = json!(
                    indications
                        .iter()
                        .map(|i| json!({"indication": i, "message": indication_message(i)}))
                        .collect::<Vec<_>>()
                );
            }
            o["status"] = st;
        });
        return;
    }
    if locked_by != name {
        app.store.modify(&key, |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            st["phase"] = json!("InProgress");
            st["readyToUse"] = json!(false);
            set_cond(
                &mut st,
                "Progressing",
                false,
                &format!("Source not locked snapshot {locked_by:?} in progress"),
            );
            set_cond(&mut st, "Ready", false, "Not ready");
            o["status"] = st;
        });
        return;
    }
    // Locked by us: the content, then done.
    let content_key = Key::new(SNAPSHOT_GROUP, CONTENTS, ns, &content_name);
    let now = now_rfc3339();
    if app.store.get(&content_key).is_none() {
        let mut backups = vec![];
        let mut statuses = vec![];
        for (volume, claim) in claims(&vm) {
            // `getSnapshotPVC`: an unbound claim, or one whose storage class has no
            // VolumeSnapshotClass, is left out of the content.
            let Some(pvc) = app
                .store
                .get(&Key::new("", "persistentvolumeclaims", ns, &claim))
                .filter(|p| text(p, "/status/phase") == "Bound")
                .filter(|p| snapshot_class(app, text(p, "/spec/storageClassName")).is_some())
            else {
                continue;
            };
            let vs = format!("vmsnapshot-{uid}-volume-{volume}");
            let source = capture(app, ns, &claim, &data_id(ns, &vs));
            let mut meta = json!({"name": claim, "namespace": ns});
            for f in ["labels", "annotations"] {
                if let Some(v) = pvc.pointer(&format!("/metadata/{f}")) {
                    meta[f] = v.clone();
                }
            }
            if source != claim {
                meta["annotations"][CONTENT_OF] = json!(source);
            }
            backups.push(json!({"volumeName": volume, "volumeSnapshotName": vs,
                "persistentVolumeClaim": {"metadata": meta, "spec": pvc["spec"]}}));
            statuses
                .push(json!({"volumeSnapshotName": vs, "creationTime": now, "readyToUse": true}));
        }
        let mut source_vm = json!({"metadata": {"name": vm_name, "namespace": ns},
            "spec": vm["spec"], "status": {}});
        for f in ["labels", "annotations", "uid", "generation"] {
            if let Some(v) = vm.pointer(&format!("/metadata/{f}")) {
                source_vm["metadata"][f] = v.clone();
            }
        }
        let content = json!({
            "apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshotContent",
            "metadata": {"name": content_name, "namespace": ns},
            "spec": {"virtualMachineSnapshotName": name, "source": {"virtualMachine": source_vm},
                "volumeBackups": backups},
            "status": {"creationTime": now, "readyToUse": true, "volumeSnapshotStatus": statuses},
        });
        let _ = app.store.create(SNAPSHOT_GROUP, CONTENTS, content);
    }
    let Some(content) = app.store.get(&content_key) else {
        return;
    };
    // `updateSnapshotSnapshotableVolumes`: every volume of the VM as the content keeps it is
    // included (it has a backup) or excluded (cloud-init and the like, and disks that could
    // not be snapshotted).
    let backed_up: Vec<&str> = content
        .pointer("/spec/volumeBackups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|b| b["volumeName"].as_str())
        .collect();
    let (mut included, mut excluded) = (vec![], vec![]);
    for v in content
        .pointer("/spec/source/virtualMachine/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = text(v, "/name");
        if backed_up.contains(&name) {
            included.push(name.to_string());
        } else {
            excluded.push(name.to_string());
        }
    }
    app.store.modify(&key, |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["phase"] = json!("Succeeded");
        st["readyToUse"] = json!(true);
        st["sourceUID"] = json!(meta_str(&vm, "uid"));
        st["creationTime"] = content["status"]["creationTime"].clone();
        st["virtualMachineSnapshotContentName"] = json!(content_name);
        let mut lists = json!({});
        if !included.is_empty() {
            lists["includedVolumes"] = json!(included);
        }
        if !excluded.is_empty() {
            lists["excludedVolumes"] = json!(excluded);
        }
        st["snapshotVolumes"] = lists;
        set_cond(&mut st, "Progressing", false, "Operation complete");
        set_cond(&mut st, "Ready", true, "Ready");
        o["status"] = st;
    });
    unlock();
}

/// VirtualMachineSnapshotContent reconciler: a content whose snapshot is gone goes too, with
/// the data its volume snapshots kept.
pub fn vm_snapshot_content(app: &App, content: &Value, _tick: bool) {
    let ns = meta_str(content, "namespace");
    let snap = text(content, "/spec/virtualMachineSnapshotName");
    if app
        .store
        .get(&Key::new(SNAPSHOT_GROUP, SNAPSHOTS, ns, snap))
        .is_some()
    {
        return;
    }
    for b in content
        .pointer("/spec/volumeBackups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let _ = std::fs::remove_file(
            app.uploads
                .data_path(&data_id(ns, text(b, "/volumeSnapshotName"))),
        );
    }
    app.store.delete(
        &Key::of(SNAPSHOT_GROUP, CONTENTS, content),
        Propagation::Cascade,
    );
}

/// Writes the restore's status; `fail` adds the Failure condition (`doUpdateErrorWithFailure`).
fn restore_error(app: &App, key: &Key, message: &str, fail: bool) {
    app.store.modify(key, |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        set_cond(&mut st, "Progressing", false, message);
        set_cond(&mut st, "Ready", false, message);
        if fail {
            set_cond(&mut st, "Failure", true, message);
        }
        o["status"] = st;
    });
}

fn has_true(obj: &Value, type_: &str) -> bool {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == type_ && c["status"] == "True")
        })
}

/// VirtualMachineRestore reconciler.
pub fn vm_restore(app: &App, restore: &Value, _tick: bool) {
    let ns = meta_str(restore, "namespace");
    let name = meta_str(restore, "name");
    let uid = meta_str(restore, "uid");
    let key = Key::of(SNAPSHOT_GROUP, RESTORES, restore);
    if restore.get("status").is_none_or(Value::is_null) {
        app.store.modify(&key, |o| {
            let mut st = json!({"complete": false});
            set_cond(
                &mut st,
                "Progressing",
                true,
                "Initializing VirtualMachineRestore",
            );
            set_cond(
                &mut st,
                "Ready",
                false,
                "Initializing VirtualMachineRestore",
            );
            o["status"] = st;
        });
        return;
    }
    if restore.pointer("/status/complete") == Some(&json!(true)) || has_true(restore, "Failure") {
        return;
    }
    let target_name = text(restore, "/spec/target/name");
    let target = app.store.get(&vm_key(ns, target_name));
    if let Some(vm) = &target
        && restore
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
    {
        app.store.modify(&key, |o| {
            o["metadata"]["ownerReferences"] = json!([crate::core::controllers::owner_ref(vm)]);
        });
        return;
    }
    let running = target.is_some()
        && app
            .store
            .get(&Key::new(
                "kubevirt.io",
                "virtualmachineinstances",
                ns,
                target_name,
            ))
            .is_some();
    if running {
        let created = parse_rfc3339(meta_str(restore, "creationTimestamp")).unwrap_or(now_unix());
        match text(restore, "/spec/targetReadinessPolicy") {
            "FailImmediate" => restore_error(app, &key, NOT_READY_FAILURE, true),
            "StopTarget" => {
                restore_error(app, &key, STOP_TARGET, false);
                // What the stop subresource does to an Always VM (lifecycle/).
                app.store.modify(&vm_key(ns, target_name), |o| {
                    o["spec"]["runStrategy"] = json!("Halted");
                    if let Some(s) = o["spec"].as_object_mut() {
                        s.remove("running");
                    }
                });
            }
            "WaitEventually" => restore_error(app, &key, WAIT_EVENTUALLY, false),
            _ if past_deadline(created, DEFAULT_DEADLINE_SECS, now_unix()) => {
                restore_error(app, &key, GRACE_EXCEEDED, true)
            }
            _ => restore_error(app, &key, WAIT_GRACE, false),
        }
        return;
    }
    let snap_name = text(restore, "/spec/virtualMachineSnapshotName");
    let Some(snap) = app
        .store
        .get(&Key::new(SNAPSHOT_GROUP, SNAPSHOTS, ns, snap_name))
    else {
        return restore_error(
            app,
            &key,
            &format!("VMSnapshot {ns}/{snap_name} does not exist"),
            false,
        );
    };
    if text(&snap, "/status/phase") == "Failed" {
        return restore_error(
            app,
            &key,
            &format!("VMSnapshot {ns}/{snap_name} failed and is invalid to use"),
            false,
        );
    }
    let content = (snap.pointer("/status/readyToUse") == Some(&json!(true)))
        .then(|| {
            app.store.get(&Key::new(
                SNAPSHOT_GROUP,
                CONTENTS,
                ns,
                text(&snap, "/status/virtualMachineSnapshotContentName"),
            ))
        })
        .flatten();
    let Some(content) = content else {
        return restore_error(
            app,
            &key,
            &format!("VMSnapshot {ns}/{snap_name} not ready"),
            false,
        );
    };
    let marker = format!("{name}-{uid}");
    let restored = |vm: &Value| {
        vm.pointer("/metadata/annotations")
            .and_then(|a| a.get(LAST_RESTORE))
            == Some(&json!(marker))
    };
    if let Some(vm) = &target
        && !restored(vm)
        && meta_str(vm, "uid") != text(&snap, "/status/sourceUID")
    {
        return restore_error(app, &key, EXISTING_TARGET, false);
    }
    if target.is_some() {
        app.store.modify(&vm_key(ns, target_name), |o| {
            o["status"]["restoreInProgress"] = json!(name);
        });
    }
    let backups: Vec<Value> = content
        .pointer("/spec/volumeBackups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let snap_vm = content
        .pointer("/spec/source/virtualMachine")
        .cloned()
        .unwrap_or(json!({}));
    let templates: Vec<String> = snap_vm
        .pointer("/spec/dataVolumeTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| text(t, "/metadata/name").to_string())
        .collect();
    let volumes = claims(&snap_vm);
    let has_template = |volume: &str| {
        volumes
            .iter()
            .any(|(v, c)| v == volume && templates.contains(c))
    };
    // 1. The restores list.
    if restore.pointer("/status/restores").is_none() {
        let restores: Vec<Value> = backups
            .iter()
            .map(|b| {
                let volume = text(b, "/volumeName");
                let pvc = format!("restore-{uid}-{volume}");
                let mut r = json!({"volumeName": volume, "persistentVolumeClaim": pvc,
                    "volumeSnapshotName": b["volumeSnapshotName"]});
                if has_template(volume) {
                    r["dataVolumeName"] = json!(pvc);
                }
                r
            })
            .collect();
        app.store.modify(&key, |o| {
            o["status"]["restores"] = json!(restores);
            set_cond(&mut o["status"], "Progressing", true, "Creating new PVCs");
            set_cond(&mut o["status"], "Ready", false, "Waiting for new PVCs");
        });
        return;
    }
    // 2. The new PVCs, with the snapshot's data.
    let mut created = false;
    for b in &backups {
        let volume = text(b, "/volumeName");
        let pvc_name = format!("restore-{uid}-{volume}");
        if app
            .store
            .get(&Key::new("", "persistentvolumeclaims", ns, &pvc_name))
            .is_some()
        {
            continue;
        }
        let vs = text(b, "/volumeSnapshotName");
        let source = b
            .pointer("/persistentVolumeClaim")
            .cloned()
            .unwrap_or_default();
        let mut labels = source
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or(json!({}));
        labels["restore.kubevirt.io/source-vm-name"] = snap_vm["metadata"]["name"].clone();
        labels["restore.kubevirt.io/source-vm-namespace"] = json!(ns);
        let mut annotations = json!({"restore.kubevirt.io/name": name, LAST_RESTORE: marker});
        let original = text(&source, "/metadata/name");
        let data_of = source
            .pointer(&format!(
                "/metadata/annotations/{}",
                CONTENT_OF.replace('/', "~1")
            ))
            .and_then(Value::as_str)
            .unwrap_or(original);
        annotations[CONTENT_OF] = json!(data_of);
        if has_template(volume) {
            annotations["cdi.kubevirt.io/storage.populatedFor"] = json!(pvc_name);
        }
        let size = source
            .pointer("/spec/resources/requests/storage")
            .cloned()
            .unwrap_or(json!("1Gi"));
        let mut spec = source.get("spec").cloned().unwrap_or(json!({}));
        if let Some(s) = spec.as_object_mut() {
            s.remove("volumeName");
            s.remove("dataSource");
            s.remove("dataSourceRef");
        }
        let vs_ref =
            json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": vs});
        spec["dataSource"] = vs_ref.clone();
        spec["dataSourceRef"] = vs_ref;
        let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": pvc_name, "namespace": ns, "labels": labels, "annotations": annotations},
            "spec": spec,
            "status": {"phase": "Bound", "accessModes": source["spec"]["accessModes"], "capacity": {"storage": size}}});
        if app.store.create("", "persistentvolumeclaims", pvc).is_ok() {
            materialize(app, ns, &pvc_name, &data_id(ns, vs));
            created = true;
        }
    }
    if created {
        app.store.modify(&key, |o| {
            set_cond(&mut o["status"], "Progressing", true, "Creating new PVCs");
            set_cond(&mut o["status"], "Ready", false, "Waiting for new PVCs");
        });
        return;
    }
    // 3. The target's spec.
    let target = app.store.get(&vm_key(ns, target_name));
    if target.as_ref().is_none_or(|vm| !restored(vm)) {
        let new_name = |volume: &str| format!("restore-{uid}-{volume}");
        let mut spec = snap_vm.get("spec").cloned().unwrap_or(json!({}));
        let mut new_templates = vec![];
        for t in spec
            .pointer("/dataVolumeTemplates")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
        {
            let old = text(&t, "/metadata/name").to_string();
            let mut t = t.clone();
            if let Some((volume, _)) = volumes.iter().find(|(_, c)| *c == old) {
                t["metadata"]["name"] = json!(new_name(volume));
            }
            new_templates.push(t);
        }
        if let Some(vols) = spec
            .pointer_mut("/template/spec/volumes")
            .and_then(Value::as_array_mut)
        {
            for v in vols.iter_mut() {
                let volume = text(v, "/name").to_string();
                if !backups.iter().any(|b| b["volumeName"] == json!(volume)) {
                    continue;
                }
                if v.get("dataVolume").is_some() && has_template(&volume) {
                    v["dataVolume"]["name"] = json!(new_name(&volume));
                } else if v.get("dataVolume").is_some() || v.get("persistentVolumeClaim").is_some()
                {
                    *v = json!({"name": volume, "persistentVolumeClaim": {"claimName": new_name(&volume)}});
                }
            }
        }
        if !new_templates.is_empty() {
            spec["dataVolumeTemplates"] = json!(new_templates);
        }
        // The DataVolumes of the renamed templates, pre-populated by the restored PVCs.
        for t in &new_templates {
            let dv = text(t, "/metadata/name");
            if !dv.starts_with(&format!("restore-{uid}-")) {
                continue;
            }
            let mut meta = t.get("metadata").cloned().unwrap_or(json!({}));
            meta["namespace"] = json!(ns);
            meta["annotations"]["restore.kubevirt.io/name"] = json!(name);
            meta["annotations"]["cdi.kubevirt.io/storage.prePopulated"] = json!("true");
            let _ = app.store.create(
                "cdi.kubevirt.io",
                "datavolumes",
                json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                    "metadata": meta, "spec": t["spec"]}),
            );
        }
        match &target {
            None => {
                if let Some(s) = spec.as_object_mut() {
                    if s.contains_key("running") {
                        s.insert("running".into(), json!(false));
                    } else {
                        s.insert("runStrategy".into(), json!("Halted"));
                    }
                }
                let mut meta = json!({"name": target_name, "namespace": ns,
                    "annotations": {LAST_RESTORE: marker}});
                if let Some(l) = snap_vm.pointer("/metadata/labels") {
                    meta["labels"] = l.clone();
                }
                if let Some(a) = snap_vm
                    .pointer("/metadata/annotations")
                    .and_then(Value::as_object)
                {
                    for (k, v) in a {
                        meta["annotations"][k] = v.clone();
                    }
                }
                let _ = app.store.create(
                    "kubevirt.io",
                    "virtualmachines",
                    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                        "metadata": meta, "spec": spec}),
                );
            }
            Some(vm) => {
                let strategy = crate::core::lifecycle::run_strategy(vm);
                app.store.modify(&vm_key(ns, target_name), |o| {
                    let mut spec = spec.clone();
                    if o.pointer("/spec/running").is_some() {
                        spec["running"] = json!(false);
                        if let Some(s) = spec.as_object_mut() {
                            s.remove("runStrategy");
                        }
                    } else {
                        spec["runStrategy"] = json!(strategy);
                        if let Some(s) = spec.as_object_mut() {
                            s.remove("running");
                        }
                    }
                    o["spec"] = spec;
                    o["metadata"]["annotations"][LAST_RESTORE] = json!(marker);
                });
            }
        }
        let keep: Vec<String> = new_templates
            .iter()
            .map(|t| text(t, "/metadata/name").to_string())
            .collect();
        let old_templates: Vec<String> = target
            .as_ref()
            .and_then(|vm| vm.pointer("/spec/dataVolumeTemplates"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|t| text(t, "/metadata/name").to_string())
            .filter(|n| !keep.contains(n))
            .collect();
        app.store.modify(&key, |o| {
            if !old_templates.is_empty() {
                o["status"]["deletedDataVolumes"] = json!(old_templates);
            }
            set_cond(
                &mut o["status"],
                "Progressing",
                true,
                "Updating target spec",
            );
            set_cond(
                &mut o["status"],
                "Ready",
                false,
                "Waiting for target update",
            );
        });
        return;
    }
    // 4. Obsolete DataVolumes go; done.
    for dv in restore
        .pointer("/status/deletedDataVolumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        app.store.delete(
            &Key::new("cdi.kubevirt.io", "datavolumes", ns, dv),
            Propagation::Cascade,
        );
    }
    app.store.modify(&vm_key(ns, target_name), |o| {
        if let Some(st) = o["status"].as_object_mut() {
            st.remove("restoreInProgress");
        }
    });
    app.store.modify(&key, |o| {
        let st = &mut o["status"];
        st["complete"] = json!(true);
        st["restoreTime"] = json!(now_rfc3339());
        set_cond(st, "Progressing", false, "Operation complete");
        set_cond(st, "Ready", true, "Operation complete");
    });
}

/// Test storage: the default storage class `local-path` can snapshot (a VolumeSnapshotClass
/// for its driver, the default one for it), `nfs` cannot.
#[cfg(test)]
pub(crate) fn snapshot_storage(app: &App) {
    for (name, driver, default) in [
        ("local-path", "rancher.io/local-path", "true"),
        ("nfs", "nfs.csi.k8s.io", "false"),
    ] {
        app.store
            .create(
                "storage.k8s.io",
                "storageclasses",
                json!({"apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass", "metadata": {"name": name, "annotations":
                    {"storageclass.kubernetes.io/is-default-class": default}},
                "provisioner": driver}),
            )
            .unwrap();
    }
    app.store
        .create(
            "snapshot.storage.k8s.io",
            "volumesnapshotclasses",
            json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": "local-path-snapshots", "annotations":
                {"snapshot.storage.kubernetes.io/is-default-class": "true"}},
            "driver": "rancher.io/local-path", "deletionPolicy": "Delete"}),
        )
        .unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServeFlavor;
    use crate::core::controllers::reconcile_all;
    use crate::core::registry::Registry;
    use std::time::Duration;

    fn app() -> App {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        snapshot_storage(&app);
        app
    }

    /// VM `web` with a DataVolume template `web-root` (blank) and a PVC volume `web-data`.
    fn vm(run: &str) -> Value {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"runStrategy": run,
                "dataVolumeTemplates": [{"metadata": {"name": "web-root"},
                    "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}],
                "template": {"spec": {"domain": {"devices": {}},
                    "volumes": [{"name": "rootdisk", "dataVolume": {"name": "web-root"}},
                                {"name": "data", "persistentVolumeClaim": {"claimName": "web-data"}}]}}}})
    }

    fn data_pvc() -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "web-data", "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Mi"}}})
    }

    fn get(app: &App, group: &str, plural: &str, name: &str) -> Option<Value> {
        app.store.get(&Key::new(group, plural, "default", name))
    }

    fn settle(app: &App) {
        for _ in 0..12 {
            reconcile_all(app, true);
        }
    }

    fn snapshot(name: &str, vm: &str) -> Value {
        json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshot",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": vm}}})
    }

    fn restore(name: &str, snap: &str, target: &str, policy: Option<&str>) -> Value {
        let mut r = json!({"apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineRestore",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"target": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": target},
                "virtualMachineSnapshotName": snap}});
        if let Some(p) = policy {
            r["spec"]["targetReadinessPolicy"] = json!(p);
        }
        r
    }

    fn reason(obj: &Value, type_: &str) -> String {
        obj["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == type_))
            .map(|c| c["reason"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    }

    fn data_of(app: &App, pvc: &str) -> Option<Vec<u8>> {
        crate::kubevirt::upload::uploaded_file(app, "default", pvc)
            .map(|p| std::fs::read(p).unwrap())
    }

    #[test]
    fn go_durations_and_deadlines() {
        assert_eq!(go_duration_secs("5m0s"), Some(300));
        assert_eq!(go_duration_secs("1h"), Some(3600));
        assert_eq!(go_duration_secs("1.5s"), Some(1));
        assert_eq!(go_duration_secs("5x"), None);
        assert_eq!(go_duration_secs("5"), None);
        assert!(!past_deadline(100, 300, 399));
        assert!(past_deadline(100, 300, 400));
        assert!(!past_deadline(100, 0, 10_000));
    }

    #[test]
    fn snapshot_of_a_running_vm_gets_content_and_unlocks_the_vm() {
        let app = app();
        app.store
            .create("", "persistentvolumeclaims", data_pvc())
            .unwrap();
        let vm = app
            .store
            .create("kubevirt.io", "virtualmachines", vm("Always"))
            .unwrap();
        settle(&app);
        assert!(get(&app, "kubevirt.io", "virtualmachineinstances", "web").is_some());
        let snap = app
            .store
            .create(SNAPSHOT_GROUP, SNAPSHOTS, snapshot("s1", "web"))
            .unwrap();
        // First pass: the VM is locked and the snapshot in progress.
        reconcile_all(&app, false);
        let vm_now = get(&app, "kubevirt.io", "virtualmachines", "web").unwrap();
        let s = get(&app, SNAPSHOT_GROUP, SNAPSHOTS, "s1").unwrap();
        if s["status"]["phase"] == "InProgress" {
            assert_eq!(vm_now["status"]["snapshotInProgress"], "s1");
            assert_eq!(
                reason(&s, "Progressing"),
                "Source locked and operation in progress"
            );
        }
        settle(&app);
        let s = get(&app, SNAPSHOT_GROUP, SNAPSHOTS, "s1").unwrap();
        assert_eq!(s["status"]["phase"], "Succeeded");
        assert_eq!(s["status"]["readyToUse"], true);
        assert_eq!(s["status"]["sourceUID"], vm["metadata"]["uid"]);
        assert_eq!(s["status"]["indications"], json!(["Online", "GuestAgent"]));
        assert_eq!(reason(&s, "Ready"), "Ready");
        assert_eq!(reason(&s, "Progressing"), "Operation complete");
        let content_name = format!(
            "vmsnapshot-content-{}",
            snap["metadata"]["uid"].as_str().unwrap()
        );
        assert_eq!(
            s["status"]["virtualMachineSnapshotContentName"],
            json!(content_name)
        );
        let content = get(&app, SNAPSHOT_GROUP, CONTENTS, &content_name).unwrap();
        let backups = content["spec"]["volumeBackups"].as_array().unwrap();
        let vs: Vec<_> = backups
            .iter()
            .map(|b| b["volumeSnapshotName"].as_str().unwrap())
            .collect();
        let uid = snap["metadata"]["uid"].as_str().unwrap();
        assert_eq!(
            vs,
            [
                format!("vmsnapshot-{uid}-volume-rootdisk"),
                format!("vmsnapshot-{uid}-volume-data")
            ]
        );
        assert_eq!(
            content["spec"]["source"]["virtualMachine"]["spec"],
            vm["spec"]
        );
        let vm_now = get(&app, "kubevirt.io", "virtualmachines", "web").unwrap();
        assert!(vm_now["status"].get("snapshotInProgress").is_none());
        // The data kept for each volume snapshot is in use while the content exists.
        let ids = |vs: &[&str]| -> std::collections::HashSet<String> {
            vs.iter().map(|v| format!("vs-default-{v}")).collect()
        };
        assert_eq!(live_data_ids(&app), ids(&vs));
        // Deleting the snapshot takes its content.
        app.store.delete(
            &Key::of(SNAPSHOT_GROUP, SNAPSHOTS, &snap),
            Propagation::Cascade,
        );
        settle(&app);
        assert!(get(&app, SNAPSHOT_GROUP, CONTENTS, &content_name).is_none());
        assert_eq!(live_data_ids(&app), ids(&[]));
    }

    /// KubeVirt `snapshot.go` `getSnapshotPVC`: a claim whose storage class has no
    /// VolumeSnapshotClass gets no backup, and the snapshot still succeeds, naming it in
    /// `status.snapshotVolumes.excludedVolumes` (`updateSnapshotSnapshotableVolumes`).
    #[test]
    fn a_volume_whose_class_cannot_snapshot_is_excluded() {
        let app = app();
        let mut pvc = data_pvc();
        pvc["spec"]["storageClassName"] = json!("nfs");
        app.store.create("", "persistentvolumeclaims", pvc).unwrap();
        app.store
            .create("kubevirt.io", "virtualmachines", vm("Halted"))
            .unwrap();
        settle(&app);
        let snap = app
            .store
            .create(SNAPSHOT_GROUP, SNAPSHOTS, snapshot("s1", "web"))
            .unwrap();
        settle(&app);
        let s = get(&app, SNAPSHOT_GROUP, SNAPSHOTS, "s1").unwrap();
        assert_eq!(s["status"]["phase"], "Succeeded", "{s}");
        assert_eq!(
            s["status"]["snapshotVolumes"],
            json!({"includedVolumes": ["rootdisk"], "excludedVolumes": ["data"]})
        );
        let uid = snap["metadata"]["uid"].as_str().unwrap();
        let content = get(
            &app,
            SNAPSHOT_GROUP,
            CONTENTS,
            &format!("vmsnapshot-content-{uid}"),
        )
        .unwrap();
        let volumes: Vec<&str> = content["spec"]["volumeBackups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["volumeName"].as_str().unwrap())
            .collect();
        assert_eq!(volumes, ["rootdisk"]);
    }

    #[test]
    fn snapshot_without_its_vm_waits_for_it() {
        let app = app();
        app.store
            .create(SNAPSHOT_GROUP, SNAPSHOTS, snapshot("s1", "gone"))
            .unwrap();
        settle(&app);
        let s = get(&app, SNAPSHOT_GROUP, SNAPSHOTS, "s1").unwrap();
        assert_eq!(s["status"]["phase"], "InProgress");
        assert_eq!(s["status"]["readyToUse"], false);
        assert_eq!(reason(&s, "Progressing"), "Source does not exist");
        assert_eq!(reason(&s, "Ready"), "Not ready");
    }

    #[test]
    fn restore_needs_a_stopped_vm_and_brings_back_the_data() {
        let app = app();
        app.store
            .create("", "persistentvolumeclaims", data_pvc())
            .unwrap();
        app.store
            .create("kubevirt.io", "virtualmachines", vm("Always"))
            .unwrap();
        settle(&app);
        write_volume(&app, "default", "web-data", b"before").unwrap();
        app.store
            .create(SNAPSHOT_GROUP, SNAPSHOTS, snapshot("s1", "web"))
            .unwrap();
        settle(&app);
        write_volume(&app, "default", "web-data", b"after").unwrap();

        // Running: FailImmediate fails with upstream's reason and changes nothing.
        let before = get(&app, "kubevirt.io", "virtualmachines", "web").unwrap();
        app.store
            .create(
                SNAPSHOT_GROUP,
                RESTORES,
                restore("r0", "s1", "web", Some("FailImmediate")),
            )
            .unwrap();
        settle(&app);
        let r0 = get(&app, SNAPSHOT_GROUP, RESTORES, "r0").unwrap();
        assert_eq!(reason(&r0, "Failure"), NOT_READY_FAILURE);
        assert_eq!(r0["status"]["complete"], false);
        let after = get(&app, "kubevirt.io", "virtualmachines", "web").unwrap();
        assert_eq!(after["spec"], before["spec"]);
        // The default policy waits with its message.
        app.store
            .create(SNAPSHOT_GROUP, RESTORES, restore("r1", "s1", "web", None))
            .unwrap();
        settle(&app);
        let r1 = get(&app, SNAPSHOT_GROUP, RESTORES, "r1").unwrap();
        assert_eq!(reason(&r1, "Ready"), WAIT_GRACE);
        app.store.delete(
            &Key::of(SNAPSHOT_GROUP, RESTORES, &r1),
            Propagation::Cascade,
        );

        // StopTarget stops it, then restores.
        let r = app
            .store
            .create(
                SNAPSHOT_GROUP,
                RESTORES,
                restore("r2", "s1", "web", Some("StopTarget")),
            )
            .unwrap();
        settle(&app);
        let r = get(&app, SNAPSHOT_GROUP, RESTORES, "r2").unwrap_or(r);
        assert_eq!(r["status"]["complete"], true, "{r:#}");
        assert_eq!(reason(&r, "Ready"), "Operation complete");
        assert!(r["status"]["restoreTime"].is_string());
        let uid = r["metadata"]["uid"].as_str().unwrap();
        let vm = get(&app, "kubevirt.io", "virtualmachines", "web").unwrap();
        assert_eq!(vm["spec"]["runStrategy"], "Halted");
        assert_eq!(
            vm["metadata"]["annotations"][LAST_RESTORE],
            format!("r2-{uid}")
        );
        assert_eq!(
            r["metadata"]["ownerReferences"][0]["uid"],
            vm["metadata"]["uid"]
        );
        let vols = &vm["spec"]["template"]["spec"]["volumes"];
        assert_eq!(
            vols[0]["dataVolume"]["name"],
            format!("restore-{uid}-rootdisk")
        );
        assert_eq!(
            vols[1]["persistentVolumeClaim"]["claimName"],
            format!("restore-{uid}-data")
        );
        assert_eq!(
            vm["spec"]["dataVolumeTemplates"][0]["metadata"]["name"],
            format!("restore-{uid}-rootdisk")
        );
        assert_eq!(r["status"]["deletedDataVolumes"], json!(["web-root"]));
        assert!(get(&app, "cdi.kubevirt.io", "datavolumes", "web-root").is_none());
        let dv = get(
            &app,
            "cdi.kubevirt.io",
            "datavolumes",
            &format!("restore-{uid}-rootdisk"),
        )
        .unwrap();
        assert_eq!(dv["status"]["phase"], "Succeeded");
        let pvc = get(
            &app,
            "",
            "persistentvolumeclaims",
            &format!("restore-{uid}-data"),
        )
        .unwrap();
        assert_eq!(
            pvc["metadata"]["labels"]["restore.kubevirt.io/source-vm-name"],
            "web"
        );
        assert_eq!(pvc["spec"]["dataSource"]["kind"], "VolumeSnapshot");
        assert_eq!(
            data_of(&app, &format!("restore-{uid}-data")).as_deref(),
            Some(&b"before"[..])
        );
        assert_eq!(data_of(&app, "web-data").as_deref(), Some(&b"after"[..]));
        assert!(vm["status"].get("restoreInProgress").is_none());
    }

    #[test]
    fn restore_to_another_name_creates_a_halted_vm_but_never_overwrites_one() {
        let app = app();
        app.store
            .create("", "persistentvolumeclaims", data_pvc())
            .unwrap();
        app.store
            .create("kubevirt.io", "virtualmachines", vm("Halted"))
            .unwrap();
        settle(&app);
        app.store
            .create(SNAPSHOT_GROUP, SNAPSHOTS, snapshot("s1", "web"))
            .unwrap();
        settle(&app);
        let mut other = vm("Halted");
        other["metadata"]["name"] = json!("other");
        other["spec"]["dataVolumeTemplates"][0]["metadata"]["name"] = json!("other-root");
        other["spec"]["template"]["spec"]["volumes"][0]["dataVolume"]["name"] = json!("other-root");
        app.store
            .create("kubevirt.io", "virtualmachines", other)
            .unwrap();
        app.store
            .create(SNAPSHOT_GROUP, RESTORES, restore("r1", "s1", "other", None))
            .unwrap();
        app.store
            .create(SNAPSHOT_GROUP, RESTORES, restore("r2", "s1", "copy", None))
            .unwrap();
        settle(&app);
        let r1 = get(&app, SNAPSHOT_GROUP, RESTORES, "r1").unwrap();
        assert_eq!(reason(&r1, "Ready"), EXISTING_TARGET);
        let r2 = get(&app, SNAPSHOT_GROUP, RESTORES, "r2").unwrap();
        assert_eq!(r2["status"]["complete"], true, "{r2:#}");
        let copy = get(&app, "kubevirt.io", "virtualmachines", "copy").unwrap();
        assert_eq!(copy["spec"]["runStrategy"], "Halted");
        let web = get(&app, "kubevirt.io", "virtualmachines", "web").unwrap();
        assert_eq!(
            web["spec"]["template"]["spec"]["volumes"][1]["persistentVolumeClaim"]["claimName"],
            "web-data"
        );
    }
}
