//! `snapshot restore SNAP --new-vm NEW` end to end on Deckhouse: kubectl vm makes NEW's disks
//! from the snapshot's VirtualDiskSnapshots, then its Secret with its own SSH identity, then
//! NEW, last (lib `snapshot::deckhouse_new_vm`).

use serde_json::Value;

use super::{DH, exported_sha, kubectl_json, running_db, write_disk};
use crate::common::{Env, changes, fails, ok, stderr, stdout};
use crate::lifecycle::eventually;

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
