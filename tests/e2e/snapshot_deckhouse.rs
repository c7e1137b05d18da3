//! `snapshot create|list|delete|restore` end to end on Deckhouse (FACTS §10; deckhouse
//! virtualization `VirtualMachineSnapshot`, `VirtualMachineOperation` `Restore`). The disk's
//! data is written through the emulator's stand-in for a guest writing its disk; what comes
//! back after a restore is read with `kubectl vm export vd/NAME` and compared with `sha256sum`
//! of the bytes written. Listings are compared with real kubectl's view.

use serde_json::Value;

use crate::common::{Env, changes, fails, ok, stderr, stdout, table};
use crate::export::sha256_of;
use crate::lifecycle::eventually;
use kubevm_emulator::ServeFlavor;

const MIB: usize = 1 << 20;
const DH: &str = "/apis/virtualization.deckhouse.io/v1alpha2/namespaces/default";

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

/// A running VM `db` with one blank 1 MiB disk; returns the env and the disk's name.
fn running_db() -> (Env, String) {
    let env = Env::with_step(
        ServeFlavor::Deckhouse,
        "deckhouse.yaml",
        std::time::Duration::from_millis(100),
    );
    // --wait: without it the phase below was read before the controller had started the VM
    // (it failed when the machine was busy).
    ok(env.vm(&[
        "create",
        "db",
        "--blank",
        "1Mi",
        "--no-platform-ssh",
        "--wait",
    ]));
    let vm = kubectl_json(
        &env,
        &["get", "virtualmachines.virtualization.deckhouse.io", "db"],
    );
    assert_eq!(vm["status"]["phase"], "Running");
    let disk = vm["spec"]["blockDeviceRefs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["kind"] == "VirtualDisk")
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned();
    (env, disk)
}

fn claim_of(env: &Env, disk: &str) -> String {
    kubectl_json(env, &["get", "vd", disk])["status"]["target"]["persistentVolumeClaimName"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `fill` bytes as the disk's content, written to a file for sha256sum too.
fn write_disk(env: &Env, disk: &str, fill: u8) -> String {
    let data = vec![fill; MIB];
    env.emulator
        .write_volume("default", &claim_of(env, disk), &data)
        .unwrap();
    let file = env.dir.path().join(format!("expected-{fill}"));
    std::fs::write(&file, &data).unwrap();
    sha256_of(&file)
}

fn exported_sha(env: &Env, disk: &str) -> String {
    let file = env.dir.path().join(format!("{disk}.img"));
    let _ = std::fs::remove_file(&file);
    let out = crate::export::export(env, &[&format!("vd/{disk}"), "-o", file.to_str().unwrap()]);
    assert!(out.status.success(), "export vd/{disk}: {}", stderr(&out));
    sha256_of(&file)
}

#[test]
fn deckhouse_create_list_restore_brings_the_data_back() {
    let (env, disk) = running_db();
    let before = write_disk(&env, &disk, b'A');
    env.emulator.clear_requests();

    // create: one POST of the snapshot, labelled as ours, asking for consistency (the agent is
    // ready), then a watch until it is Ready.
    let out = env.vm(&["snapshot", "create", "db", "before"]);
    assert_eq!(
        stdout(&out),
        "snapshot before of db.default created; ready\n",
        "{}",
        stderr(&out)
    );
    let wire = changes(&env);
    assert_eq!(wire.len(), 1, "{wire:#?}");
    assert_eq!(
        (wire[0].0.as_str(), wire[0].1.as_str()),
        ("POST", format!("{DH}/virtualmachinesnapshots").as_str())
    );
    let body = wire[0].2.clone().unwrap();
    assert_eq!(body["spec"]["virtualMachineName"], "db");
    assert_eq!(body["spec"]["requiredConsistency"], true);
    assert_eq!(body["spec"]["keepIPAddress"], "Never");
    assert_eq!(
        body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kubectl-vm"
    );
    let snap = kubectl_json(&env, &["get", "vmsnapshot", "before"]);
    assert_eq!(snap["status"]["phase"], "Ready");
    assert_eq!(snap["status"]["consistent"], true);
    let vds = snap["status"]["virtualDiskSnapshotNames"][0]
        .as_str()
        .unwrap();
    let vds_obj = kubectl_json(&env, &["get", "vdsnapshot", vds]);
    assert_eq!(vds_obj["spec"]["virtualDiskName"], disk.as_str());
    assert_eq!(vds_obj["status"]["phase"], "Ready");

    // list: the same snapshots kubectl sees.
    ok(env.vm(&["snapshot", "create", "db", "second"]));
    let rows = table(&ok(env.vm(&["snapshot", "list", "db"])));
    assert_eq!(rows[0], ["NAME", "VM", "PHASE", "READY", "SIZE", "AGE"]);
    let kubectl_rows = table(&ok(env.kubectl(&[
        "get",
        "vmsnapshot",
        "-o",
        "custom-columns=NAME:.metadata.name,VM:.spec.virtualMachineName,PHASE:.status.phase",
    ])));
    assert_eq!(rows.len(), kubectl_rows.len());
    for (mine, theirs) in rows.iter().zip(&kubectl_rows).skip(1) {
        assert_eq!(mine[..3], theirs[..3]);
        assert_eq!(mine[3], "true");
    }
    assert_eq!(
        ok(env.vm(&["snapshot", "list", "-o", "name"])),
        "virtualmachinesnapshot.virtualization.deckhouse.io/before\nvirtualmachinesnapshot.virtualization.deckhouse.io/second\n"
    );
    let wide = table(&ok(env.vm(&["snapshot", "list", "-A", "-o", "wide"])));
    assert_eq!(wide[1][0], "default");
    assert_eq!(wide[1][7], "Consistent");

    // The guest changes its disk.
    let after = write_disk(&env, &disk, b'B');
    assert_ne!(before, after);

    // A running VM without --stop: one line, exit 2, nothing sent that changes anything.
    let rv = |env: &Env| {
        kubectl_json(
            env,
            &["get", "virtualmachines.virtualization.deckhouse.io", "db"],
        )["metadata"]["resourceVersion"]
            .clone()
    };
    let rv_before = rv(&env);
    env.emulator.clear_requests();
    let err = fails(&env, &["snapshot", "restore", "before"], 2);
    assert!(err.contains("is Running"), "{err}");
    assert!(err.contains("--stop"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
    assert_eq!(rv(&env), rv_before);
    assert!(
        kubectl_json(&env, &["get", "vmop"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["spec"]["type"] != "Restore")
    );

    // --stop: the platform stops it, restores, starts it again; the disk holds the snapshot's
    // bytes.
    let old_claim = claim_of(&env, &disk);
    env.emulator.clear_requests();
    let out = env.vm(&["snapshot", "restore", "before", "--stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "db.default restored from snapshot before; it was stopped for the restore and started again\n"
    );
    let wire = changes(&env);
    assert_eq!(wire.len(), 1, "{wire:#?}");
    assert_eq!(wire[0].1, format!("{DH}/virtualmachineoperations"));
    let op = wire[0].2.clone().unwrap();
    assert_eq!(op["spec"]["type"], "Restore");
    assert_eq!(op["spec"]["virtualMachineName"], "db");
    assert_eq!(op["spec"]["restore"]["mode"], "Strict");
    assert_eq!(
        op["spec"]["restore"]["virtualMachineSnapshotName"],
        "before"
    );
    let vm = kubectl_json(
        &env,
        &["get", "virtualmachines.virtualization.deckhouse.io", "db"],
    );
    assert_eq!(vm["status"]["phase"], "Running");
    assert_ne!(claim_of(&env, &disk), old_claim, "the disk was made again");
    assert_eq!(exported_sha(&env, &disk), before);

    // The debug bundle knows the snapshots and the restore operation.
    let (archive, _) = crate::debug_info::collect(&env, &["db"]);
    let files = crate::debug_info::listing(&archive);
    assert!(
        files.contains(&"virtualmachinesnapshot/before.yaml".to_string()),
        "{files:?}"
    );
    assert!(
        files
            .iter()
            .any(|f| f.starts_with("virtualmachineoperation/before-restore-")),
        "{files:?}"
    );
}

#[test]
fn deckhouse_delete_only_ours_with_the_uid_and_bad_names() {
    let (env, _disk) = running_db();
    ok(env.vm(&["snapshot", "create", "db", "mine"]));
    env.emulator.put_object(serde_json::json!({
        "apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachineSnapshot",
        "metadata": {"name": "theirs", "namespace": "default"},
        "spec": {"virtualMachineName": "db", "requiredConsistency": true, "keepIPAddress": "Never"}
    }));
    env.emulator.clear_requests();
    let err = fails(&env, &["snapshot", "delete", "mine", "theirs"], 1);
    assert!(err.contains("theirs was not made by kubectl vm"), "{err}");
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
    let snap = kubectl_json(&env, &["get", "vmsnapshot", "mine"]);
    let vds = snap["status"]["virtualDiskSnapshotNames"][0]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        ok(env.vm(&["snapshot", "delete", "mine"])),
        "virtualmachinesnapshot.virtualization.deckhouse.io \"mine\" deleted\n"
    );
    let wire = changes(&env);
    assert_eq!(wire.len(), 1, "{wire:#?}");
    assert_eq!(
        (wire[0].0.as_str(), wire[0].1.as_str()),
        (
            "DELETE",
            format!("{DH}/virtualmachinesnapshots/mine").as_str()
        )
    );
    assert_eq!(
        wire[0].2.as_ref().unwrap()["preconditions"]["uid"],
        snap["metadata"]["uid"]
    );
    // Its disk snapshots go with it (owned by the snapshot).
    eventually("the disk snapshot goes", || {
        env.emulator
            .objects(
                "virtualization.deckhouse.io",
                "virtualdisksnapshots",
                Some("default"),
            )
            .iter()
            .all(|d| d["metadata"]["name"] != vds.as_str())
    });
    ok(env.vm(&["snapshot", "delete", "theirs", "--force"]));

    // Unknown names: one line, nothing changed.
    env.emulator.clear_requests();
    let err = fails(&env, &["snapshot", "create", "nope"], 1);
    assert!(err.contains("nope"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let err = fails(&env, &["snapshot", "restore", "nope", "--stop"], 1);
    assert!(err.contains("nope"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
}

/// Deckhouse makes each disk's VolumeSnapshot without a class; on storage whose driver has no
/// default VolumeSnapshotClass the disk's snapshot fails and with it the VM's
/// (`vmsnapshot/internal/life_cycle.go` `ensureVirtualDiskSnapshots`): `snapshot create` names
/// the disk and gives the platform's reason.
#[test]
fn deckhouse_snapshot_names_the_disk_that_cannot_be_snapshotted() {
    let env = Env::deckhouse();
    let file = env.dir.path().join("vm.yaml");
    // The fixture's `nfs` class: no VolumeSnapshotClass has its driver.
    std::fs::write(
        &file,
        "apiVersion: virtualization.deckhouse.io/v1alpha2\nkind: VirtualDisk\nmetadata: {name: scratch, namespace: default}\nspec:\n  persistentVolumeClaim: {size: 1Gi, storageClassName: nfs}\n---\napiVersion: virtualization.deckhouse.io/v1alpha2\nkind: VirtualMachine\nmetadata: {name: vm, namespace: default}\nspec:\n  runPolicy: AlwaysOff\n  virtualMachineClassName: generic\n  cpu: {cores: 1}\n  memory: {size: 1Gi}\n  blockDeviceRefs:\n  - {kind: VirtualDisk, name: scratch}\n",
    )
    .unwrap();
    ok(env.kubectl(&["apply", "-f", file.to_str().unwrap()]));
    ok(env.kubectl(&[
        "wait",
        "--for=jsonpath={.status.phase}=Stopped",
        "virtualmachine.virtualization.deckhouse.io/vm",
        "--timeout=5s",
    ]));
    let out = env.vm(&["snapshot", "create", "vm", "s1"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let snap = kubectl_json(&env, &["get", "vmsnapshot", "s1"]);
    assert_eq!(snap["status"]["phase"], "Failed");
    let vds = snap["status"]["virtualDiskSnapshotNames"][0]
        .as_str()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(
        err.lines().last().unwrap(),
        format!(
            "Error: snapshot s1 of vm.default failed: disk scratch cannot be snapshotted (VirtualDiskSnapshot {vds}, VirtualDiskSnapshotFailed: VolumeSnapshot \"vs-{vds}\" has an error: Failed to set default snapshot class with error cannot find default snapshot class)"
        ),
        "{err}"
    );
    // `snapshot list -o wide` shows the disk in its last column, LEFT OUT.
    let listing = table(&ok(env.vm(&["snapshot", "list", "-o", "wide"])));
    let row = listing.iter().find(|r| r[0] == "s1").unwrap();
    assert_eq!(
        (row[2].as_str(), row.last().unwrap().as_str()),
        ("Failed", "scratch"),
        "{listing:?}"
    );
}

mod new_vm;
