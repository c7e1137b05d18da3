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

#[test]
fn deckhouse_restore_as_a_new_vm_keeps_the_source() {
    let (env, disk) = running_db();
    let before = write_disk(&env, &disk, b'C');
    ok(env.vm(&["snapshot", "create", "db", "s1"]));
    let after = write_disk(&env, &disk, b'D');
    let source_rv = kubectl_json(
        &env,
        &["get", "virtualmachines.virtualization.deckhouse.io", "db"],
    )["metadata"]["resourceVersion"]
        .clone();

    // A taken name (the source's own, or a disk's): one line, nothing written.
    env.emulator.clear_requests();
    let err = fails(&env, &["snapshot", "restore", "s1", "--new-vm", "db"], 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("\"db\" already exists"), "{err}");
    let new_disk = disk.replacen("db-", "copy-", 1);
    env.emulator.put_object(serde_json::json!({
        "apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
        "metadata": {"name": new_disk, "namespace": "default"},
        "spec": {"persistentVolumeClaim": {"size": "1Mi"}}}));
    env.emulator.clear_requests();
    let err = fails(&env, &["snapshot", "restore", "s1", "--new-vm", "copy"], 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("virtualdisk \"{new_disk}\" already exists"))
            && err.contains("nothing was created"),
        "{err}"
    );
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
    ok(env.kubectl(&["delete", "vd", &new_disk, "--wait"]));
    env.emulator.clear_requests();

    // Client dry run: nothing sent; the disks and the VM it would make, the VM last.
    let out = env.vm(&[
        "snapshot",
        "restore",
        "s1",
        "--new-vm",
        "copy",
        "--dry-run=client",
        "-o",
        "json",
    ]);
    let list: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(list["kind"], "List");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items[0]["kind"], "VirtualDisk");
    assert_eq!(items[0]["metadata"]["name"], new_disk.as_str());
    assert_eq!(
        items[0]["spec"]["dataSource"]["objectRef"]["kind"],
        "VirtualDiskSnapshot"
    );
    let last = items.last().unwrap();
    assert_eq!(
        (&last["kind"], &last["metadata"]["name"]),
        (
            &serde_json::json!("VirtualMachine"),
            &serde_json::json!("copy")
        )
    );
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
    // Server dry run: each object is sent with dryRun and nothing is kept.
    ok(env.vm(&[
        "snapshot",
        "restore",
        "s1",
        "--new-vm",
        "copy",
        "--dry-run=server",
    ]));
    let dry: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| {
            r.method == "POST"
                && ["/virtualdisks", "/secrets", "/virtualmachines"]
                    .iter()
                    .any(|p| r.path.ends_with(p))
        })
        .collect();
    assert!(
        !dry.is_empty() && dry.iter().all(|r| r.query.contains("dryRun=All")),
        "{:?}",
        dry.iter().map(|r| (&r.path, &r.query)).collect::<Vec<_>>()
    );
    assert!(
        env.emulator
            .objects(
                "virtualization.deckhouse.io",
                "virtualmachines",
                Some("default")
            )
            .iter()
            .all(|v| v["metadata"]["name"] != "copy")
    );
    env.emulator.clear_requests();

    // The new VM: its disk from the disk snapshot first, the VM last, all labelled as ours.
    let out = env.vm(&["snapshot", "restore", "s1", "--new-vm", "copy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "copy.default restored from snapshot s1\n",
        "{}",
        stderr(&out)
    );
    let wire = changes(&env);
    let posts: Vec<_> = wire.iter().filter(|w| w.0 == "POST").collect();
    assert_eq!(posts[0].1, format!("{DH}/virtualdisks"), "{wire:#?}");
    let body = posts[0].2.clone().unwrap();
    assert_eq!(body["metadata"]["name"], new_disk.as_str());
    let vds =
        kubectl_json(&env, &["get", "vmsnapshot", "s1"])["status"]["virtualDiskSnapshotNames"][0]
            .clone();
    assert_eq!(
        body["spec"],
        serde_json::json!({"dataSource": {"type": "ObjectRef",
            "objectRef": {"kind": "VirtualDiskSnapshot", "name": vds}}})
    );
    assert_eq!(
        posts.last().unwrap().1,
        format!("{DH}/virtualmachines"),
        "{wire:#?}"
    );
    let vm = kubectl_json(
        &env,
        &["get", "virtualmachines.virtualization.deckhouse.io", "copy"],
    );
    assert_eq!(vm["spec"]["blockDeviceRefs"][0]["name"], new_disk.as_str());
    assert_eq!(
        vm["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kubectl-vm"
    );
    let vd = kubectl_json(&env, &["get", "vd", &new_disk]);
    assert_eq!(
        vd["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kubectl-vm"
    );
    assert_eq!(vd["metadata"]["ownerReferences"][0]["name"], "copy");
    eventually("the new disk is ready", || {
        kubectl_json(&env, &["get", "vd", &new_disk])["status"]["phase"] == "Ready"
    });
    // Its disk holds the snapshot-time bytes; the source's disk and spec are as they were.
    assert_eq!(exported_sha(&env, &new_disk), before);
    assert_eq!(exported_sha(&env, &disk), after);
    assert_eq!(
        kubectl_json(
            &env,
            &["get", "virtualmachines.virtualization.deckhouse.io", "db"]
        )["metadata"]["resourceVersion"],
        source_rv
    );

    // No operation: kubectl vm made it all.
    assert!(
        env.emulator
            .objects(
                "virtualization.deckhouse.io",
                "virtualmachinesnapshotoperations",
                Some("default"),
            )
            .is_empty()
    );
    // delete copy takes its disk; the source and the snapshot stay.
    ok(env.vm(&["delete", "copy"]));
    eventually("the disk goes with the new VM", || {
        env.emulator
            .objects(
                "virtualization.deckhouse.io",
                "virtualdisks",
                Some("default"),
            )
            .iter()
            .all(|d| d["metadata"]["name"] != new_disk.as_str())
    });
    kubectl_json(
        &env,
        &["get", "virtualmachines.virtualization.deckhouse.io", "db"],
    );
    kubectl_json(&env, &["get", "vd", &disk]);
    assert_eq!(
        kubectl_json(&env, &["get", "vmsnapshot", "s1"])["status"]["phase"],
        "Ready"
    );

    // A snapshot that keeps no VM spec (its Secret's `vm` removed): one line, nothing made.
    let kept = kubectl_json(&env, &["get", "vmsnapshot", "s1"])["status"]
        ["virtualMachineSnapshotSecretName"]
        .as_str()
        .unwrap()
        .to_owned();
    ok(env.kubectl(&[
        "patch",
        "secret",
        &kept,
        "--type",
        "json",
        "-p",
        r#"[{"op": "remove", "path": "/data/vm"}]"#,
    ]));
    env.emulator.clear_requests();
    let err = fails(&env, &["snapshot", "restore", "s1", "--new-vm", "copy"], 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("snapshot s1 keeps no VM spec") && err.contains("nothing was created"),
        "{err}"
    );
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
}

/// The issue's case: `restore --new-vm` of a VM made by `create` (its user data in the Secret
/// `orig-cloudinit`) used to fail with AlreadyExists and leave the operation behind. Now the
/// copy of the Secret is `copy-cloudinit` with copy's own identity, owned by copy.
#[test]
fn deckhouse_restore_as_a_new_vm_of_a_created_vm_has_its_own_identity() {
    use crate::clone::{cloudinit_secret, keygen_list, platform_identity, ssh_with_cert};
    let env = Env::deckhouse();
    let _signer = crate::signer::start_signer(&env, &[]);
    crate::ssh::vm_with_ca(&env, "orig", &[]);
    let (orig_text, orig_secret) = cloudinit_secret(&env, "orig-cloudinit");
    let (orig_key, _, _) = keygen_list(&env, &platform_identity(&orig_text).1);
    ok(env.vm(&["snapshot", "create", "orig", "s1"]));
    ok(env.vm(&["ssh-cert", "orig.default.vm"]));

    let out = env.vm(&["snapshot", "restore", "s1", "--new-vm", "copy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (text, secret) = cloudinit_secret(&env, "copy-cloudinit");
    assert!(!text.contains("orig"), "{text}");
    let (principals, cert) = platform_identity(&text);
    assert_eq!(principals, ["kubevm@copy.default"]);
    let (key, cert_principals, listed) = keygen_list(&env, &cert);
    assert_ne!(key, orig_key, "{listed}");
    assert_eq!(
        cert_principals,
        kubevm::ca::host_principals("copy", "default"),
        "{listed}"
    );
    let copy = kubectl_json(
        &env,
        &["get", "virtualmachines.virtualization.deckhouse.io", "copy"],
    );
    assert_eq!(
        copy["spec"]["provisioning"]["userDataRef"]["name"],
        "copy-cloudinit"
    );
    assert!(
        secret["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["uid"] == copy["metadata"]["uid"]),
        "{secret}"
    );
    let (_, orig_after) = cloudinit_secret(&env, "orig-cloudinit");
    assert_eq!(
        orig_after["metadata"]["resourceVersion"],
        orig_secret["metadata"]["resourceVersion"]
    );
    // It runs (the source's runPolicy): the sshd it booted refuses orig's certificate and
    // takes its own.
    eventually("the copy runs", || {
        kubectl_json(
            &env,
            &["get", "virtualmachines.virtualization.deckhouse.io", "copy"],
        )["status"]["phase"]
            == "Running"
    });
    let orig_cert = env
        .dir
        .path()
        .join(".kube/kubectl-vm/ssh/certs/kubevm@orig.default.vm-cert.pub");
    let out = ssh_with_cert(&env, "copy", &orig_cert);
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    let out = env.vm(&["ssh", "copy", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // All or nothing: the VM's name taken while the restore is on its way (after the checks,
    // before the VM, the last object, is created): the disks and the Secret it made are
    // deleted (uid preconditions), and the stranger's VM is left as it is.
    env.emulator.hold("create", "virtualmachines");
    let child = env.spawn(&["snapshot", "restore", "s1", "--new-vm", "copy2"]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while env.emulator.held() < 1 {
        assert!(std::time::Instant::now() < deadline, "never held");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let made_secret = kubectl_json(&env, &["get", "secret", "copy2-cloudinit"]);
    assert_eq!(made_secret["metadata"]["labels"]["kubevm.io/vm"], "copy2");
    env.emulator.put_object(serde_json::json!({
        "apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
        "metadata": {"name": "copy2", "namespace": "default"},
        "spec": {"runPolicy": "AlwaysOff", "virtualMachineClassName": "generic",
            "cpu": {"cores": 1}, "memory": {"size": "1Gi"}, "blockDeviceRefs": []}}));
    let stranger_uid = kubectl_json(
        &env,
        &[
            "get",
            "virtualmachines.virtualization.deckhouse.io",
            "copy2",
        ],
    )["metadata"]["uid"]
        .clone();
    env.emulator.release_held();
    let output = child.wait_with_output().unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.contains("\"copy2\" already exists")
            && err.contains("deleted secret/copy2-cloudinit, made by the failed restore")
            && err.contains("deleted virtualdisk/copy2-"),
        "{err}"
    );
    assert_eq!(
        kubectl_json(
            &env,
            &[
                "get",
                "virtualmachines.virtualization.deckhouse.io",
                "copy2"
            ],
        )["metadata"]["uid"],
        stranger_uid
    );
    assert!(
        !env.emulator
            .objects("", "secrets", Some("default"))
            .iter()
            .any(|s| s["metadata"]["name"] == "copy2-cloudinit")
    );
    assert!(
        env.emulator
            .objects(
                "virtualization.deckhouse.io",
                "virtualdisks",
                Some("default")
            )
            .iter()
            .all(|d| !d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .starts_with("copy2-"))
    );
}

/// `restore --new-vm` names: kubectl vm makes the objects itself, so the 59 characters
/// Deckhouse's CEL rule allowed the operation's renames (`createVirtualMachine.nameReplacement
/// []. to`, `crds/virtualmachinesnapshotoperations.yaml`) no longer apply: a disk name longer
/// than that is made (a VirtualDisk's name is a DNS subdomain, deckhouse/virtualization
/// `pkg/common/validate/validate.go` keeps a limit, 63, only for VMs).
#[test]
fn deckhouse_restore_as_a_new_vm_with_long_names_makes_them() {
    let (env, disk) = running_db();
    ok(env.vm(&["snapshot", "create", "db", "s1"]));
    // `db-x` becomes `NEW-x`: 56 + the suffix is over 59, the VM's name alone is not.
    let target = "n".repeat(56);
    let suffix = disk.strip_prefix("db-").unwrap_or(&disk);
    let new_disk = format!("{target}-{suffix}");
    assert!(new_disk.len() > 59);
    ok(env.vm(&["snapshot", "restore", "s1", "--new-vm", &target]));
    let vm = kubectl_json(
        &env,
        &[
            "get",
            "virtualmachines.virtualization.deckhouse.io",
            &target,
        ],
    );
    assert_eq!(vm["spec"]["blockDeviceRefs"][0]["name"], new_disk.as_str());
    kubectl_json(&env, &["get", "vd", &new_disk]);
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

/// `ssh-keygen -lf` of a public key line: its SHA256 fingerprint.
fn fingerprint(env: &Env, key: &str) -> String {
    let path = env.dir.path().join("fingerprinted.pub");
    std::fs::write(&path, format!("{key}\n")).unwrap();
    let out = std::process::Command::new("ssh-keygen")
        .arg("-lf")
        .arg(&path)
        .output()
        .expect("ssh-keygen not found: install openssh-client");
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out).split_whitespace().nth(1).unwrap().to_owned()
}

/// The ed25519 host public key in user data `text` (`ssh_keys.ed25519_public`).
fn host_key(text: &str) -> String {
    let doc: Value = yaml_serde::from_str(text).unwrap();
    doc["ssh_keys"]["ed25519_public"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Issue 32: a VM made from a snapshot of an AlwaysOn VM gets the source's runPolicy, so it
/// would boot as soon as it exists. kubectl vm makes NEW's disks, then its Secret with NEW's
/// own identity, then NEW, last: the Secret is older than the VM (request order,
/// resourceVersion and creationTimestamp), it is never written again, and nothing of orig's
/// identity (principals, host key by its `ssh-keygen` fingerprint) is in NEW's objects; the VM,
/// never restarted, boots with its own identity.
#[test]
fn deckhouse_restore_as_a_new_always_on_vm_boots_with_its_own_identity() {
    let env = Env::deckhouse();
    let _signer = crate::signer::start_signer(&env, &[]);
    crate::ssh::vm_with_ca(&env, "orig", &["--run-strategy", "Always"]);
    let (orig_text, _) = crate::clone::cloudinit_secret(&env, "orig-cloudinit");
    let orig_key = host_key(&orig_text);
    let orig_print = fingerprint(&env, &orig_key);
    ok(env.vm(&["snapshot", "create", "orig", "s1"]));
    env.emulator.clear_requests();
    let out = env.vm(&["snapshot", "restore", "s1", "--new-vm", "copy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let requests = env.emulator.requests();
    let log = || {
        requests
            .iter()
            .map(|r| format!("{} {} {}", r.method, r.path, r.status))
            .collect::<Vec<_>>()
    };
    let secrets = "/api/v1/namespaces/default/secrets";
    let posted = |path: &str, name: &str| {
        requests
            .iter()
            .position(|r| {
                r.method == "POST"
                    && r.path == path
                    && r.status == 201
                    && r.body.contains(&format!("\"{name}\""))
            })
            .unwrap_or_else(|| panic!("no POST of {name}: {:?}", log()))
    };
    let disk_at = requests
        .iter()
        .position(|r| {
            r.method == "POST"
                && r.path == format!("{DH}/virtualdisks")
                && r.status == 201
                && r.body.contains("\"name\":\"copy-")
        })
        .unwrap_or_else(|| panic!("no POST of copy's disk: {:?}", log()));
    let secret_at = posted(secrets, "copy-cloudinit");
    let vm_at = posted(&format!("{DH}/virtualmachines"), "copy");
    assert!(disk_at < secret_at && secret_at < vm_at, "{:?}", log());
    // Never written again (no PUT or PATCH of its data: only its owner was added, by merge
    // patch carrying ownerReferences alone).
    for r in requests
        .iter()
        .filter(|r| r.path == format!("{secrets}/copy-cloudinit") && r.method != "GET")
    {
        assert_eq!(r.method, "PATCH", "{:?}", log());
        let body: Value = serde_json::from_str(&r.body).unwrap();
        assert!(body.get("data").is_none(), "{}", r.body);
    }
    assert!(
        env.emulator
            .objects(
                "virtualization.deckhouse.io",
                "virtualmachinesnapshotoperations",
                Some("default"),
            )
            .is_empty()
    );
    let copy = kubectl_json(
        &env,
        &["get", "virtualmachines.virtualization.deckhouse.io", "copy"],
    );
    let (text, secret) = crate::clone::cloudinit_secret(&env, "copy-cloudinit");
    // The Secret existed before the VM: its POST was answered 201 before the VM's was sent
    // (kubectl vm waits for each), and it is no younger.
    let vm_created: Value = serde_json::from_str(&requests[vm_at].body).unwrap();
    assert_eq!(vm_created["metadata"]["name"], "copy");
    assert!(
        secret["metadata"]["creationTimestamp"].as_str().unwrap()
            <= copy["metadata"]["creationTimestamp"].as_str().unwrap()
    );
    assert_eq!(copy["spec"]["runPolicy"], "AlwaysOn");
    assert_eq!(
        copy["spec"]["provisioning"]["userDataRef"]["name"],
        "copy-cloudinit"
    );
    assert!(
        secret["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["uid"] == copy["metadata"]["uid"]),
        "{secret}"
    );
    // NEW's own identity; nothing of orig's in NEW's objects.
    let (principals, cert) = crate::clone::platform_identity(&text);
    assert_eq!(principals, ["kubevm@copy.default"]);
    let copy_key = host_key(&text);
    let copy_print = fingerprint(&env, &copy_key);
    assert_ne!(copy_print, orig_print);
    let (certified, cert_principals, listed) = crate::clone::keygen_list(&env, &cert);
    assert_eq!(certified, format!("ED25519-CERT {copy_print}"), "{listed}");
    assert_eq!(
        cert_principals,
        kubevm::ca::host_principals("copy", "default"),
        "{listed}"
    );
    let orig_b64 = orig_key.split_whitespace().nth(1).unwrap();
    let disks: Vec<Value> = env
        .emulator
        .objects(
            "virtualization.deckhouse.io",
            "virtualdisks",
            Some("default"),
        )
        .into_iter()
        .filter(|d| d["metadata"]["labels"]["kubevm.io/vm"] == "copy")
        .collect();
    assert_eq!(disks.len(), 1, "{disks:?}");
    for (what, body) in [
        ("user data", text.clone()),
        ("secret", secret.to_string()),
        ("vm", copy.to_string()),
        ("disk", disks[0].to_string()),
    ] {
        for needle in [orig_b64, orig_print.as_str(), "orig.default", "@orig"] {
            assert!(!body.contains(needle), "{what} holds {needle}: {body}");
        }
    }
    // Started by the platform, never restarted: the sshd it booted answers with copy's own
    // host certificate (which `kubectl vm ssh` verifies) and refuses orig's user certificate.
    eventually("the copy runs", || {
        kubectl_json(
            &env,
            &["get", "virtualmachines.virtualization.deckhouse.io", "copy"],
        )["status"]["phase"]
            == "Running"
    });
    assert!(
        !env.emulator
            .requests()
            .iter()
            .any(|r| r.path.contains("/virtualmachineoperations") && r.method == "POST"),
        "restarted"
    );
    ok(env.vm(&["ssh-cert", "orig.default.vm"]));
    let orig_cert = env
        .dir
        .path()
        .join(".kube/kubectl-vm/ssh/certs/kubevm@orig.default.vm-cert.pub");
    let out = crate::clone::ssh_with_cert(&env, "copy", &orig_cert);
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    let out = env.vm(&["ssh", "copy", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
