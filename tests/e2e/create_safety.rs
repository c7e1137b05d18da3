//! `create` never takes over or deletes what it did not make: existing objects refuse the
//! create, new objects are POSTed, rollbacks delete with uid preconditions and name what they
//! could not remove, and `delete --keep-disks` releases only the VM's ownerReference.

use serde_json::{Value, json};

use crate::common::{Env, etcd_timeout, fails, find_object, ok, stderr};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";
const NS: &str = "dev";
const DVD: &str = "virtualization.deckhouse.io";

fn get(env: &Env, group: &str, plural: &str, name: &str) -> Option<Value> {
    find_object(env, group, plural, Some(NS), name)
}

/// Methods of every write request the emulator received.
fn writes(env: &Env) -> Vec<String> {
    env.emulator
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

fn virtual_disk(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"persistentVolumeClaim": {"size": "3Gi"}},
        "status": {"phase": "Ready", "progress": "100%"}})
}

/// The create most tests here run: VM `web` from an image, no platform SSH.
const CREATE_WEB: [&str; 7] = [
    "create",
    "web",
    "-n",
    NS,
    "--image",
    IMAGE,
    "--no-platform-ssh",
];

fn create_web(env: &Env, extra: &[&str]) -> std::process::Output {
    let mut args = CREATE_WEB.to_vec();
    args.extend(extra);
    env.vm(&args)
}

#[test]
fn an_existing_object_it_did_not_make_refuses_the_create_and_nothing_changes() {
    // Deckhouse: the user's own VirtualDisk named like the boot disk.
    let env = Env::deckhouse();
    env.emulator
        .put_object(virtual_disk("web-root", json!({"team": "db"})));
    let before = get(&env, DVD, "virtualdisks", "web-root").unwrap();
    env.emulator.clear_requests();
    let err = fails(&env, &CREATE_WEB, 1);
    assert_eq!(
        err,
        "Error: virtualdisk \"web-root\" already exists in namespace \"dev\" and was not created by kubectl vm for VM \"web\"; nothing was changed (delete it or choose another VM name)"
    );
    assert!(writes(&env).is_empty(), "{:?}", writes(&env));
    assert_eq!(get(&env, DVD, "virtualdisks", "web-root").unwrap(), before);
    assert!(get(&env, DVD, "virtualmachines", "web").is_none());

    // KubeVirt: a DataVolume named like the VM's DataVolume template, and a Secret named like
    // the cloud-init Secret.
    let env = Env::kubevirt();
    env.emulator.put_object(json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "web-root", "namespace": NS},
        "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}));
    env.emulator.clear_requests();
    let err = fails(&env, &CREATE_WEB, 1);
    assert!(
        err.contains("datavolume \"web-root\" already exists"),
        "{err}"
    );
    assert!(writes(&env).is_empty(), "{:?}", writes(&env));

    let env = Env::kubevirt();
    env.emulator
        .put_object(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "web-cloudinit", "namespace": NS}, "type": "Opaque",
        "data": {"userdata": "aGk="}}));
    let cloud_init = env.dir.path().join("user-data");
    std::fs::write(&cloud_init, "#cloud-config\nchpasswd:\n  expire: false\n  users:\n  - {name: root, password: hunter2, type: text}\n").unwrap();
    env.emulator.clear_requests();
    let output = create_web(&env, &["--cloud-init", cloud_init.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("secret \"web-cloudinit\" already exists"),
        "{}",
        stderr(&output)
    );
    assert!(writes(&env).is_empty(), "{:?}", writes(&env));
    let secret = get(&env, "", "secrets", "web-cloudinit").unwrap();
    assert_eq!(secret["data"]["userdata"], "aGk=");
    assert!(secret["metadata"].get("ownerReferences").is_none());
}

#[test]
fn a_disk_kept_for_the_vm_is_reused_and_every_new_object_is_posted() {
    let env = Env::deckhouse();
    let labels = json!({"kubevm.io/vm": "web", "app.kubernetes.io/managed-by": "kubectl-vm"});
    env.emulator.put_object(virtual_disk("web-root", labels));
    let kept_uid = get(&env, DVD, "virtualdisks", "web-root").unwrap()["metadata"]["uid"].clone();
    env.emulator.clear_requests();
    let out = ok(create_web(&env, &[]));
    assert_eq!(
        out,
        "virtualdisk.virtualization.deckhouse.io/web-root reused\n\
         virtualmachine.virtualization.deckhouse.io/web created\n"
    );
    assert_eq!(
        get(&env, DVD, "virtualdisks", "web-root").unwrap()["metadata"]["uid"],
        kept_uid
    );
    // Create semantics: a POST to the collection, never an apply over an existing name.
    assert_eq!(
        writes(&env),
        [format!(
            "POST /apis/{DVD}/v1alpha2/namespaces/dev/virtualmachines"
        )]
    );
}

#[test]
fn rollback_deletes_with_uid_preconditions() {
    let env = Env::deckhouse();
    env.emulator
        .inject_failure(etcd_timeout("create", "virtualmachines"));
    let err = fails(&env, &CREATE_WEB, 1);
    assert_eq!(
        err,
        "Error: cannot create virtualmachine \"web\": the server answered 500 InternalError: etcdserver: request timed out; removed the 1 object created before it"
    );
    let requests = env.emulator.requests();
    let created = requests
        .iter()
        .find(|r| r.method == "POST" && r.path.ends_with("/virtualdisks"))
        .expect("the disk was POSTed");
    assert_eq!(created.status, 201);
    let delete = requests
        .iter()
        .find(|r| r.method == "DELETE")
        .expect("rolled back");
    assert!(
        delete.path.ends_with("/virtualdisks/web-root"),
        "{}",
        delete.path
    );
    let body = delete.json().expect("DeleteOptions body");
    assert!(
        body["preconditions"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty()),
        "{body}"
    );
    assert!(get(&env, DVD, "virtualdisks", "web-root").is_none());
}

#[test]
fn a_rollback_that_cannot_delete_names_what_is_left_and_how_to_remove_it() {
    let env = Env::deckhouse();
    for (verb, plural) in [("create", "virtualmachines"), ("delete", "virtualdisks")] {
        env.emulator.inject_failure(etcd_timeout(verb, plural));
    }
    let err = fails(
        &env,
        &[&CREATE_WEB[..], &["--data-disk", "data=1Gi"]].concat(),
        1,
    );
    assert!(
        err.contains("removed 0 of the 2 objects created before it; left behind: virtualdisk.virtualization.deckhouse.io/web-data, virtualdisk.virtualization.deckhouse.io/web-root"),
        "{err}"
    );
    assert!(
        err.ends_with("remove them with: kubectl delete -n dev virtualdisk.virtualization.deckhouse.io/web-data virtualdisk.virtualization.deckhouse.io/web-root"),
        "{err}"
    );
    assert!(get(&env, DVD, "virtualdisks", "web-root").is_some());
}

#[test]
fn two_concurrent_creates_of_one_name_cannot_both_succeed() {
    let env = Env::kubevirt();
    for _ in 0..5 {
        let spawn = || {
            env.spawn(&[
                "create",
                "race",
                "-n",
                NS,
                "--image",
                IMAGE,
                "--no-platform-ssh",
            ])
        };
        let (a, b) = (spawn(), spawn());
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let wins = [&a, &b].iter().filter(|o| o.status.success()).count();
        assert_eq!(wins, 1, "a: {}\nb: {}", stderr(&a), stderr(&b));
        ok(env.vm(&["delete", "race", "-n", NS, "-y", "--wait"]));
    }
}

#[test]
fn keep_disks_removes_only_the_vms_owner_reference() {
    let env = Env::kubevirt();
    ok(create_web(&env, &[]));
    let vm = get(&env, "kubevirt.io", "virtualmachines", "web").unwrap();
    // The VM controller makes the template's DataVolume, owned by the VM.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut dv = loop {
        if let Some(dv) = get(&env, "cdi.kubevirt.io", "datavolumes", "web-root")
            && dv["metadata"]["ownerReferences"][0]["uid"] == vm["metadata"]["uid"]
        {
            break dv;
        }
        assert!(std::time::Instant::now() < deadline, "no owned DataVolume");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let other = json!({"apiVersion": "example.org/v1", "kind": "Backup", "name": "nightly",
        "uid": "b0000000-0000-4000-8000-000000000001"});
    dv["metadata"]["ownerReferences"]
        .as_array_mut()
        .unwrap()
        .push(other.clone());
    env.emulator.put_object(dv);
    ok(env.vm(&["delete", "web", "-n", NS, "-y", "--keep-disks"]));
    let dv = get(&env, "cdi.kubevirt.io", "datavolumes", "web-root").expect("kept");
    assert_eq!(dv["metadata"]["ownerReferences"], json!([other]), "{dv}");
    assert_ne!(vm["metadata"]["uid"], other["uid"]);
}

#[test]
fn user_is_the_kubeconfig_user_and_guest_user_the_guest_one() {
    let env = Env::kubevirt();
    // `--user` names a kubeconfig user; a name the kubeconfig lacks points to --guest-user.
    let err = fails(
        &env,
        &[
            "create", "web", "-n", NS, "--image", IMAGE, "--user", "root",
        ],
        1,
    );
    assert!(
        err.starts_with("Error: user \"root\" not found in the kubeconfig")
            && err.ends_with("to create a user in the guest pass --guest-user root"),
        "{err}"
    );
    let key = env.dir.path().join("k.pub");
    std::fs::write(
        &key,
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ a@b\n",
    )
    .unwrap();
    let offline = |extra: &[&str]| {
        let mut args = vec![
            "create",
            "web",
            "--image",
            IMAGE,
            "--no-platform-ssh",
            "--dry-run=client",
            "-o",
            "json",
            "--flavor",
            "kubevirt",
            "--ssh-key",
            key.to_str().unwrap(),
        ];
        args.extend(extra);
        let out: Value = serde_json::from_str(&ok(env.vm(&args))).unwrap();
        out["items"][0]["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|v| {
                v["cloudInitNoCloud"]["userData"]
                    .as_str()
                    .map(str::to_owned)
            })
            .unwrap()
    };
    for flag in ["--guest-user", "--login"] {
        let user_data = offline(&[flag, "alice"]);
        assert!(user_data.contains("name: alice"), "{flag}: {user_data}");
    }
    // The global --user (an existing kubeconfig user) never reaches the guest.
    let user_data = offline(&["--user", "admin"]);
    assert!(!user_data.contains("admin"), "{user_data}");
}

/// `--wait` ends early with the platform's reason when an import keeps failing (the
/// emulator's CDI fails imports from the never-resolving `.invalid` domain, restarting the
/// importer like CDI), and `--stopped --wait` does not wait for disks on
/// WaitForFirstConsumer storage (the fixtures' default class).
#[test]
fn wait_ends_early_on_a_failing_import_and_skips_first_consumer_disks() {
    let env = Env::kubevirt();
    let started = std::time::Instant::now();
    let output = env.vm(&[
        "create",
        "bad",
        "-n",
        NS,
        "--url",
        "https://images.example.invalid/d.qcow2",
        "--no-platform-ssh",
        "--wait",
        "--timeout",
        "120s",
    ]);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.lines().last().unwrap().starts_with(
            "Error: disk \"bad-root\" of virtual machine \"bad\" cannot be provisioned: Unable to connect to http data source: Get \"https://images.example.invalid/d.qcow2\": dial tcp: lookup images.example.invalid: no such host (import restarted "
        ),
        "{err}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "ended early"
    );

    for (env, flavor) in [
        (Env::kubevirt(), "kubevirt"),
        (Env::deckhouse(), "deckhouse"),
    ] {
        let started = std::time::Instant::now();
        let output = env.vm(&[
            "create",
            "idle",
            "-n",
            NS,
            "--image",
            IMAGE,
            "--no-platform-ssh",
            "--stopped",
            "--wait",
            "--timeout",
            "60s",
        ]);
        let err = stderr(&output);
        assert_eq!(output.status.code(), Some(0), "{flavor}: {err}");
        assert!(
            err.ends_with("virtualmachine \"idle\" is created stopped; disks pending-first-consumer (their storage binds them when the VM first starts): idle-root\n"),
            "{flavor}: {err}"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{flavor}"
        );
    }
}

/// Send SIGINT (what Ctrl-C sends) to a process.
fn interrupt(child: &std::process::Child) {
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Wait until the emulator holds `n` requests.
fn until_held(env: &Env, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while env.emulator.held() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "never held {n} requests"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn ctrl_c_during_create_rolls_back_and_a_second_one_abandons_the_rollback() {
    let spawn = |env: &Env| env.spawn(&CREATE_WEB);
    // Ctrl-C while the VM is being created: the disk this run made is removed again.
    let env = Env::deckhouse();
    env.emulator.hold("create", "virtualmachines");
    let child = spawn(&env);
    until_held(&env, 1);
    interrupt(&child);
    let output = child.wait_with_output().unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(130), "{err}");
    assert!(
        err.starts_with(
            "Error: cannot create virtualmachine \"web\": interrupted while waiting for the server"
        ) && err.ends_with("; removed the 1 object created before it\n"),
        "{err}"
    );
    assert!(get(&env, DVD, "virtualdisks", "web-root").is_none());
    env.emulator.release_held();

    // A second Ctrl-C while the rollback waits: it stops and names what is left.
    let env = Env::deckhouse();
    env.emulator.hold("create", "virtualmachines");
    env.emulator.hold("delete", "virtualdisks");
    let child = spawn(&env);
    until_held(&env, 1);
    interrupt(&child);
    until_held(&env, 2);
    interrupt(&child);
    let output = child.wait_with_output().unwrap();
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(130), "{err}");
    assert!(
        err.ends_with("; rollback interrupted: removed 0 of the 1 objects created before it; left behind: virtualdisk.virtualization.deckhouse.io/web-root (virtualdisk.virtualization.deckhouse.io/web-root: not removed); remove them with: kubectl delete -n dev virtualdisk.virtualization.deckhouse.io/web-root\n"),
        "{err}"
    );
    env.emulator.release_held();
}

#[test]
fn delete_sends_the_uid_of_every_object_it_deletes() {
    let env = Env::kubevirt();
    // --url with a checksum makes a standalone boot DataVolume, which delete removes itself.
    let mut args = vec![
        "create",
        "web",
        "-n",
        NS,
        "--no-platform-ssh",
        "--allow-unverified",
    ];
    args.extend(["--url", "https://images.example.org/d.qcow2", "--checksum"]);
    args.push("sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
    ok(env.vm(&args));
    env.emulator.clear_requests();
    ok(env.vm(&["delete", "web", "-n", NS, "-y", "--wait=false"]));
    let deletes: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert!(
        deletes.iter().any(|d| d.path.contains("/datavolumes/")),
        "the boot DataVolume is deleted too: {:?}",
        deletes.iter().map(|d| &d.path).collect::<Vec<_>>()
    );
    for d in &deletes {
        let body = d.json().unwrap_or_default();
        assert!(
            body["preconditions"]["uid"]
                .as_str()
                .is_some_and(|u| !u.is_empty()),
            "{} {body}",
            d.path
        );
    }
}
