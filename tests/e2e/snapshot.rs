//! `snapshot create|list|delete|restore` end to end on KubeVirt (FACTS §1:
//! `snapshot.kubevirt.io/v1beta1` VirtualMachineSnapshot / VirtualMachineRestore). The disk's
//! data is written through the emulator's stand-in for a guest writing its disk; what comes
//! back after a restore is read with `kubectl vm export` and compared with `sha256sum` of the
//! bytes written. Listings are compared with real kubectl's view.

use serde_json::{Value, json};

use crate::common::{Env, fails, ok, stderr, stdout, table};
use crate::export::{export, pvc, sha256_of, succeeded};
use crate::lifecycle::eventually;

const MIB: usize = 1 << 20;
const SNAP: &str = "/apis/snapshot.kubevirt.io/v1beta1/namespaces/default";

/// A running VM `db` with one PVC disk `db-root` (1 MiB).
fn running_db() -> Env {
    let env = Env::kubevirt();
    env.emulator.put_object(pvc("db-root", MIB as u64));
    // Through the API (not put_object), so the emulator's controllers run it.
    let file = env.dir.path().join("db.json");
    let vm = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "db-root"}}]}}}
    });
    std::fs::write(&file, vm.to_string()).unwrap();
    ok(env.kubectl(&["create", "-f", file.to_str().unwrap()]));
    eventually("db runs", || {
        env.emulator
            .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
            .iter()
            .any(|o| o["metadata"]["name"] == "db" && o["status"]["phase"] == "Running")
    });
    env
}

fn vmi_exists(env: &Env, name: &str) -> bool {
    env.emulator
        .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
        .iter()
        .any(|o| o["metadata"]["name"] == name)
}

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

/// `(method, path)` of the requests that change something.
fn changes(env: &Env) -> Vec<(String, String)> {
    env.emulator
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect()
}

/// `data` as the disk's content, written to a file for sha256sum too.
fn write_disk(env: &Env, claim: &str, fill: u8) -> String {
    let data = vec![fill; MIB];
    env.emulator.write_volume("default", claim, &data).unwrap();
    let file = env.dir.path().join(format!("expected-{fill}"));
    std::fs::write(&file, &data).unwrap();
    sha256_of(&file)
}

fn exported_sha(env: &Env, claim: &str) -> String {
    let file = env.dir.path().join(format!("{claim}.img"));
    let _ = std::fs::remove_file(&file);
    succeeded(&export(
        env,
        &[&format!("pvc/{claim}"), "-o", file.to_str().unwrap()],
    ));
    sha256_of(&file)
}

fn claim_of_root(env: &Env, vm: &str) -> String {
    let vm = kubectl_json(env, &["get", "vm", vm]);
    vm["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn kubevirt_create_list_restore_brings_the_data_back() {
    let env = running_db();
    let before = write_disk(&env, "db-root", b'A');
    env.emulator.clear_requests();

    // create: one POST of the snapshot, labelled as ours, then a watch until it is ready.
    let out = env.vm(&["snapshot", "create", "db", "before"]);
    assert_eq!(
        stdout(&out),
        "snapshot before of db.default created; ready\n",
        "{}",
        stderr(&out)
    );
    let posts: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].path, format!("{SNAP}/virtualmachinesnapshots"));
    let body = posts[0].json().unwrap();
    assert_eq!(
        body["spec"]["source"],
        json!({"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "db"})
    );
    assert_eq!(
        body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kubectl-vm"
    );
    let snap = kubectl_json(&env, &["get", "vmsnapshot", "before"]);
    assert_eq!(snap["status"]["phase"], "Succeeded");
    assert_eq!(snap["status"]["readyToUse"], true);
    assert_eq!(
        snap["status"]["indications"],
        json!(["Online", "GuestAgent"])
    );

    // list: the same snapshots kubectl sees, with the VM, phase and the claim's size. Not
    // waited for, create points at the list (the snapshot's own state, not a restore's).
    let out = env.vm(&["snapshot", "create", "db", "second", "--no-wait"]);
    assert_eq!(
        stdout(&out),
        "snapshot second of db.default created; not waited for: see `kubectl vm snapshot list`\n",
        "{}",
        stderr(&out)
    );
    eventually("snapshot second ready", || {
        kubectl_json(&env, &["get", "vmsnapshot", "second"])["status"]["readyToUse"] == true
    });
    let rows = table(&ok(env.vm(&["snapshot", "list", "db"])));
    assert_eq!(rows[0], ["NAME", "VM", "PHASE", "READY", "SIZE", "AGE"]);
    let kubectl_rows = table(&ok(env.kubectl(&[
        "get",
        "vmsnapshot",
        "-o",
        "custom-columns=NAME:.metadata.name,VM:.spec.source.name,PHASE:.status.phase,READY:.status.readyToUse",
    ])));
    assert_eq!(rows.len(), kubectl_rows.len());
    for (mine, theirs) in rows.iter().zip(&kubectl_rows).skip(1) {
        assert_eq!(mine[..4], theirs[..4]);
        assert_eq!(mine[4], "1Mi");
    }
    let names = ok(env.vm(&["snapshot", "list", "-o", "name"]));
    assert_eq!(
        names,
        "virtualmachinesnapshot.snapshot.kubevirt.io/before\nvirtualmachinesnapshot.snapshot.kubevirt.io/second\n"
    );

    // The guest changes its disk.
    let after = write_disk(&env, "db-root", b'B');
    assert_ne!(before, after);

    // A running VM without --stop: one line, exit 2, nothing sent that changes anything.
    let rv =
        |env: &Env| kubectl_json(env, &["get", "vm", "db"])["metadata"]["resourceVersion"].clone();
    let rv_before = rv(&env);
    env.emulator.clear_requests();
    let err = fails(&env, &["snapshot", "restore", "before"], 2);
    assert!(
        err.contains("Restore target VMI must be powered off before restore operation"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
    assert_eq!(rv(&env), rv_before);
    assert!(
        kubectl_json(&env, &["get", "vmrestore"])["items"]
            .as_array()
            .unwrap()
            .is_empty()
    );

    // --stop: stopped, restored, started again; the disk holds the snapshot's bytes.
    let out = env.vm(&["snapshot", "restore", "before", "--stop"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "db.default restored from snapshot before; it was stopped for the restore and started again\n"
    );
    let restore = &kubectl_json(&env, &["get", "vmrestore"])["items"][0];
    assert_eq!(restore["status"]["complete"], true);
    assert_eq!(restore["spec"]["targetReadinessPolicy"], "FailImmediate");
    let uid = restore["metadata"]["uid"].as_str().unwrap();
    let claim = claim_of_root(&env, "db");
    assert_eq!(claim, format!("restore-{uid}-root"));
    assert!(vmi_exists(&env, "db"));
    ok(env.vm(&["stop", "db"]));
    assert_eq!(exported_sha(&env, &claim), before);
    // The old claim still has what the guest wrote last (a PVC volume is not deleted).
    assert_eq!(exported_sha(&env, "db-root"), after);
}

#[test]
fn kubevirt_restore_as_a_new_vm_leaves_the_source_alone() {
    let env = running_db();
    let before = write_disk(&env, "db-root", b'C');
    ok(env.vm(&["snapshot", "create", "db", "s1"]));
    let after = write_disk(&env, "db-root", b'D');
    // A name already taken is refused before anything is made.
    let err = fails(&env, &["snapshot", "restore", "s1", "--new-vm", "db"], 1);
    assert!(err.contains("already exists"), "{err}");
    let out = env.vm(&["snapshot", "restore", "s1", "--new-vm", "db-copy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out)
            .starts_with("db-copy.default restored from snapshot s1; the new VM is stopped")
    );
    let copy = kubectl_json(&env, &["get", "vm", "db-copy"]);
    assert_eq!(copy["spec"]["runStrategy"], "Halted");
    let claim = claim_of_root(&env, "db-copy");
    assert!(claim.starts_with("restore-"), "{claim}");
    assert_eq!(claim_of_root(&env, "db"), "db-root");
    assert!(vmi_exists(&env, "db"));
    assert_eq!(exported_sha(&env, &claim), before);
    ok(env.vm(&["stop", "db"]));
    assert_eq!(exported_sha(&env, "db-root"), after);
    // The debug bundles know them: db's snapshot, db-copy's restore.
    let (archive, _) = crate::debug_info::collect(&env, &["db"]);
    let files = crate::debug_info::listing(&archive);
    assert!(
        files.contains(&"virtualmachinesnapshot/s1.yaml".to_string()),
        "{files:?}"
    );
    let (archive, _) = crate::debug_info::collect(&env, &["db-copy"]);
    let files = crate::debug_info::listing(&archive);
    assert!(
        files
            .iter()
            .any(|f| f.starts_with("virtualmachinerestore/s1-restore-")),
        "{files:?}"
    );
}

#[test]
fn kubevirt_delete_only_ours_with_the_uid() {
    let env = running_db();
    ok(env.vm(&["snapshot", "create", "db", "mine"]));
    env.emulator.put_object(json!({
        "apiVersion": "snapshot.kubevirt.io/v1beta1", "kind": "VirtualMachineSnapshot",
        "metadata": {"name": "theirs", "namespace": "default"},
        "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "db"}}
    }));
    env.emulator.clear_requests();
    let err = fails(&env, &["snapshot", "delete", "mine", "theirs"], 1);
    assert!(err.contains("theirs was not made by kubectl vm"), "{err}");
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
    let uid = kubectl_json(&env, &["get", "vmsnapshot", "mine"])["metadata"]["uid"].clone();
    assert_eq!(
        ok(env.vm(&["snapshot", "delete", "mine"])),
        "virtualmachinesnapshot.snapshot.kubevirt.io \"mine\" deleted\n"
    );
    let deletes: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 1);
    assert_eq!(
        deletes[0].path,
        format!("{SNAP}/virtualmachinesnapshots/mine")
    );
    assert_eq!(deletes[0].json().unwrap()["preconditions"]["uid"], uid);
    // Its content goes with it (the default deletionPolicy).
    eventually("the content goes", || {
        env.emulator
            .objects(
                "snapshot.kubevirt.io",
                "virtualmachinesnapshotcontents",
                Some("default"),
            )
            .iter()
            .all(|c| c["spec"]["virtualMachineSnapshotName"] != "mine")
    });
    ok(env.vm(&["snapshot", "delete", "theirs", "--force"]));
}

#[test]
fn kubevirt_bad_input_and_unknown_names() {
    let env = running_db();
    env.emulator.clear_requests();
    for (args, code, needle) in [
        (vec!["snapshot", "create", "db", "Bad_Name"], 2, "snapshot"),
        (
            vec!["snapshot", "restore", "x", "--new-vm", "No!"],
            2,
            "new VM",
        ),
        (vec!["snapshot", "delete", "UPPER"], 2, "snapshot"),
    ] {
        let err = fails(&env, &args, code);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    assert!(env.emulator.requests().is_empty());
    let err = fails(&env, &["snapshot", "create", "nope"], 1);
    assert!(err.contains("nope"), "{err}");
    let err = fails(&env, &["snapshot", "restore", "nope"], 1);
    assert!(err.contains("nope"), "{err}");
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
}

/// `restore --new-vm` of a VM made by `create`: the restored VM used to name the source's
/// Secret (its principals, host key and certificate); now it has a Secret of its own.
#[test]
fn kubevirt_restore_as_a_new_vm_of_a_created_vm_has_its_own_identity() {
    use crate::clone::{cloudinit_secret, keygen_list, platform_identity, ssh_with_cert};
    let env = Env::kubevirt();
    let _signer = crate::signer::start_signer(&env, &[]);
    crate::ssh::vm_with_ca(&env, "orig", &[]);
    let (orig_text, orig_secret) = cloudinit_secret(&env, "orig-cloudinit");
    let (orig_key, _, _) = keygen_list(&env, &platform_identity(&orig_text).1);
    ok(env.vm(&["stop", "orig", "--wait"]));
    ok(env.vm(&["snapshot", "create", "orig", "s1"]));
    ok(env.vm(&["ssh-cert", "orig.default.vm"]));

    let out = env.vm(&["snapshot", "restore", "s1", "--new-vm", "copy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let copy = kubectl_json(&env, &["get", "vm", "copy"]);
    let secret_ref = copy["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v.pointer("/cloudInitNoCloud/secretRef/name"))
        .cloned();
    assert_eq!(secret_ref, Some(json!("copy-cloudinit")), "{copy}");
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
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["uid"],
        copy["metadata"]["uid"]
    );
    let (_, orig_after) = cloudinit_secret(&env, "orig-cloudinit");
    assert_eq!(
        orig_after["metadata"]["resourceVersion"],
        orig_secret["metadata"]["resourceVersion"]
    );
    ok(env.vm(&["start", "copy", "--wait", "--timeout", "60s"]));
    let orig_cert = env
        .dir
        .path()
        .join(".kube/kubectl-vm/ssh/certs/kubevm@orig.default.vm-cert.pub");
    let out = ssh_with_cert(&env, "copy", &orig_cert);
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    let out = env.vm(&["ssh", "copy", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// `--dry-run` on KubeVirt: `client` sends no change and prints the object it would send
/// (the VirtualMachineSnapshot / VirtualMachineRestore of the snapshot.kubevirt.io API),
/// `server` sends the change with `dryRun=All` (kube-apiserver's dry-run query) and nothing is
/// kept; a dry-run delete leaves the snapshot in place.
#[test]
fn kubevirt_dry_runs_change_nothing() {
    let env = running_db();
    let snapshots = || {
        env.emulator
            .objects(
                "snapshot.kubevirt.io",
                "virtualmachinesnapshots",
                Some("default"),
            )
            .into_iter()
            .map(|o| {
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect::<Vec<_>>()
    };
    env.emulator.clear_requests();
    let out = ok(env.vm(&[
        "snapshot",
        "create",
        "db",
        "s1",
        "--dry-run=client",
        "-o",
        "json",
    ]));
    let snapshot: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(snapshot["apiVersion"], "snapshot.kubevirt.io/v1beta1");
    assert_eq!(snapshot["kind"], "VirtualMachineSnapshot");
    assert_eq!(snapshot["metadata"]["name"], "s1");
    assert_eq!(
        snapshot["spec"]["source"],
        json!({"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "db"})
    );
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));

    ok(env.vm(&["snapshot", "create", "db", "s1", "--dry-run=server"]));
    let posts: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0].path, format!("{SNAP}/virtualmachinesnapshots"));
    assert!(posts[0].query.contains("dryRun=All"), "{}", posts[0].query);
    assert!(snapshots().is_empty(), "{:?}", snapshots());

    ok(env.vm(&["snapshot", "create", "db", "s1"]));
    ok(env.vm(&["stop", "db"]));
    env.emulator.clear_requests();
    let out = ok(env.vm(&[
        "snapshot",
        "restore",
        "s1",
        "--dry-run=client",
        "-o",
        "json",
    ]));
    let restore: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(restore["kind"], "VirtualMachineRestore");
    assert_eq!(restore["spec"]["virtualMachineSnapshotName"], "s1");
    assert_eq!(restore["spec"]["target"]["name"], "db");
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
    ok(env.vm(&["snapshot", "restore", "s1", "--dry-run=server"]));
    assert!(
        env.emulator
            .objects(
                "snapshot.kubevirt.io",
                "virtualmachinerestores",
                Some("default")
            )
            .is_empty()
    );
    assert!(
        changes(&env).iter().all(|(m, _)| m == "POST"),
        "{:?}",
        changes(&env)
    );

    env.emulator.clear_requests();
    ok(env.vm(&["snapshot", "delete", "s1", "--dry-run=client"]));
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
    ok(env.vm(&["snapshot", "delete", "s1", "--dry-run=server"]));
    assert_eq!(snapshots(), ["s1"]);
}

/// KubeVirt leaves out of a snapshot the claims whose storage class has no
/// VolumeSnapshotClass (`pkg/storage/snapshot/snapshot.go` `getSnapshotPVC`) and still
/// succeeds, naming them in `status.snapshotVolumes.excludedVolumes`: `snapshot create` says
/// which disks the snapshot does not hold; a snapshot holding every disk says nothing.
#[test]
fn kubevirt_snapshot_names_the_disks_it_leaves_out() {
    let env = Env::kubevirt();
    env.emulator.put_object(pvc("db-root", MIB as u64));
    let mut scratch = pvc("db-scratch", MIB as u64);
    // The fixture's `nfs` class: no VolumeSnapshotClass has its driver.
    scratch["spec"]["storageClassName"] = json!("nfs");
    env.emulator.put_object(scratch);
    let file = env.dir.path().join("db.json");
    let vm = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"runStrategy": "Halted", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}},
                {"name": "scratch", "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "db-root"}},
                {"name": "scratch", "persistentVolumeClaim": {"claimName": "db-scratch"}}]}}}
    });
    std::fs::write(&file, vm.to_string()).unwrap();
    ok(env.kubectl(&["create", "-f", file.to_str().unwrap()]));
    let out = env.vm(&["snapshot", "create", "db", "s1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let notice: Vec<&str> = err.lines().filter(|l| l.contains("leaves out")).collect();
    assert_eq!(notice.len(), 1, "{err}");
    assert!(
        notice[0].contains("disk scratch (claim db-scratch)") && !notice[0].contains("db-root"),
        "{err}"
    );
    let s = kubectl_json(&env, &["get", "vmsnapshot", "s1"]);
    assert_eq!(s["status"]["phase"], "Succeeded");
    assert_eq!(
        s["status"]["snapshotVolumes"]["excludedVolumes"],
        json!(["scratch"])
    );
    // Both disks on a class that can snapshot: no notice.
    ok(env.kubectl(&[
        "patch",
        "vm",
        "db",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/template/spec/volumes/1"},{"op":"remove","path":"/spec/template/spec/domain/devices/disks/1"}]"#,
    ]));
    let out = env.vm(&["snapshot", "create", "db", "s2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("leaves out"), "{}", stderr(&out));
    // `snapshot list -o wide` shows what each snapshot left out (the last column, LEFT OUT).
    let listing = crate::common::table(&ok(env.vm(&["snapshot", "list", "-o", "wide"])));
    assert_eq!(
        listing[0].last().map(String::as_str),
        Some("OUT"),
        "{listing:?}"
    );
    let left_out = |name: &str| {
        listing
            .iter()
            .find(|r| r[0] == name)
            .and_then(|r| r.last().cloned())
            .unwrap_or_else(|| panic!("no {name} in {listing:?}"))
    };
    assert_eq!(left_out("s1"), "scratch");
    assert_eq!(left_out("s2"), "<none>");
}
