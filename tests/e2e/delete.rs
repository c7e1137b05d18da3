//! `kubectl vm delete`: what goes with the VM, what stays, dry runs, and the confirmation
//! prompt on a terminal.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{Env, exit_code, fails, ok, on_tty, stderr};

const NS: &str = "team";
const VM_UID: &str = "7a000000-0000-4000-8000-000000000001";

fn owner(kind: &str, api_version: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
            "controller": true, "blockOwnerDeletion": true}])
}

fn companion_labels() -> Value {
    json!({"kubevm.io/vm": "web", "app.kubernetes.io/managed-by": "kubectl-vm"})
}

fn data_volume(name: &str, labels: Value, owners: Value) -> Value {
    json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": name, "namespace": NS, "uid": format!("dv-{name}"),
                     "labels": labels, "ownerReferences": owners},
        "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}},
        "status": {"phase": "Succeeded", "progress": "100.0%"}})
}

fn pvc(name: &str, owners: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS, "ownerReferences": owners},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound"}})
}

fn secret(uid: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "web-cloud-init", "namespace": NS, "labels": companion_labels(),
                     "ownerReferences": owner("VirtualMachine", "kubevirt.io/v1", "web", uid)},
        "type": "Opaque", "data": {"userdata": "I2Nsb3VkLWNvbmZpZwo="}})
}

/// The KubeVirt VM `kubectl vm create` would make: root disk from a DataVolume template
/// (owned by the VM), a standalone labelled boot DataVolume, the user's own disk, and an
/// owned cloud-init Secret.
fn kubevirt_vm_manifest() -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "web", "namespace": NS, "labels": companion_labels()},
        "spec": {"runStrategy": "Always",
            "dataVolumeTemplates": [{"metadata": {"name": "web-root", "labels": companion_labels()},
                "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}],
            "template": {"spec": {"domain": {"devices": {"disks": [
                    {"name": "rootdisk", "disk": {"bus": "virtio"}},
                    {"name": "boot", "disk": {"bus": "virtio"}},
                    {"name": "shared", "disk": {"bus": "virtio"}}]}},
                "volumes": [
                    {"name": "rootdisk", "dataVolume": {"name": "web-root"}},
                    {"name": "boot", "dataVolume": {"name": "web-boot"}},
                    {"name": "shared", "dataVolume": {"name": "shared-data"}}]}}}})
}

fn seed_kubevirt(env: &Env) {
    let mut vm = kubevirt_vm_manifest();
    vm["metadata"]["uid"] = json!(VM_UID);
    vm["status"] = json!({"printableStatus": "Running", "created": true, "ready": true});
    env.emulator.put_object(vm);
    let vm_owner = owner("VirtualMachine", "kubevirt.io/v1", "web", VM_UID);
    env.emulator.put_object(
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "web", "namespace": NS, "ownerReferences": vm_owner},
        "spec": {"domain": {"devices": {}}}, "status": {"phase": "Running"}}),
    );
    env.emulator.put_object(data_volume(
        "web-root",
        companion_labels(),
        vm_owner.clone(),
    ));
    env.emulator
        .put_object(data_volume("web-boot", companion_labels(), json!([])));
    env.emulator
        .put_object(data_volume("shared-data", json!({}), json!([])));
    for dv in ["web-root", "web-boot", "shared-data"] {
        let dv_owner = owner(
            "DataVolume",
            "cdi.kubevirt.io/v1beta1",
            dv,
            &format!("dv-{dv}"),
        );
        env.emulator.put_object(pvc(dv, dv_owner));
    }
    env.emulator.put_object(secret(VM_UID));
}

fn names(env: &Env, group: &str, plural: &str) -> Vec<String> {
    let mut names: Vec<String> = env
        .emulator
        .objects(group, plural, Some(NS))
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

fn get(env: &Env, group: &str, plural: &str, name: &str) -> Option<Value> {
    env.emulator
        .objects(group, plural, Some(NS))
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
}

#[test]
fn delete_takes_the_vm_its_disks_and_secrets() {
    let env = Env::kubevirt();
    seed_kubevirt(&env);
    let out = ok(env.vm(&["delete", "web", "-n", NS]));
    assert_eq!(
        out,
        "virtualmachine.kubevirt.io \"web\" deleted\n\
         datavolume.cdi.kubevirt.io \"web-root\" deleted\n\
         datavolume.cdi.kubevirt.io \"web-boot\" deleted\n\
         secret \"web-cloud-init\" deleted\n"
    );
    assert!(names(&env, "kubevirt.io", "virtualmachines").is_empty());
    assert!(names(&env, "kubevirt.io", "virtualmachineinstances").is_empty());
    // The user's own disk is never touched.
    assert_eq!(
        names(&env, "cdi.kubevirt.io", "datavolumes"),
        ["shared-data"]
    );
    assert_eq!(names(&env, "", "persistentvolumeclaims"), ["shared-data"]);
    assert!(names(&env, "", "secrets").is_empty());

    assert_eq!(
        fails(&env, &["delete", "web", "-n", NS], 1),
        "Error: virtualmachine \"web\" not found in namespace \"team\""
    );
}

#[test]
fn keep_disks_releases_them_and_a_recreated_vm_adopts_them() {
    let env = Env::kubevirt();
    seed_kubevirt(&env);
    let out = ok(env.vm(&["delete", "web.team", "--keep-disks"]));
    assert_eq!(
        out,
        "virtualmachine.kubevirt.io \"web\" deleted\n\
         datavolume.cdi.kubevirt.io \"web-root\" kept\n\
         datavolume.cdi.kubevirt.io \"web-boot\" kept\n\
         secret \"web-cloud-init\" deleted\n"
    );
    assert!(names(&env, "kubevirt.io", "virtualmachines").is_empty());
    assert!(names(&env, "kubevirt.io", "virtualmachineinstances").is_empty());
    assert!(names(&env, "", "secrets").is_empty());
    assert_eq!(
        names(&env, "cdi.kubevirt.io", "datavolumes"),
        ["shared-data", "web-boot", "web-root"]
    );
    assert_eq!(
        names(&env, "", "persistentvolumeclaims"),
        ["shared-data", "web-boot", "web-root"]
    );
    let root = get(&env, "cdi.kubevirt.io", "datavolumes", "web-root").unwrap();
    assert!(root["metadata"].get("ownerReferences").is_none(), "{root}");

    // Recreated from the same declaration, the VM adopts the kept DataVolume with its data.
    let path = env.dir.path().join("web.json");
    std::fs::write(&path, kubevirt_vm_manifest().to_string()).unwrap();
    ok(env.kubectl(&["apply", "-f", path.to_str().unwrap()]));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let vm = get(&env, "kubevirt.io", "virtualmachines", "web").expect("VM recreated");
        let root = get(&env, "cdi.kubevirt.io", "datavolumes", "web-root").unwrap();
        if root["metadata"]["ownerReferences"][0]["uid"] == vm["metadata"]["uid"] {
            assert_eq!(
                root["metadata"]["uid"], "dv-web-root",
                "the same DataVolume"
            );
            break;
        }
        assert!(Instant::now() < deadline, "not adopted: {root}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn dry_runs_delete_nothing() {
    let env = Env::kubevirt();
    seed_kubevirt(&env);
    let before = env
        .emulator
        .objects("cdi.kubevirt.io", "datavolumes", Some(NS));
    let out = ok(env.vm(&["delete", "web", "-n", NS, "--dry-run=client"]));
    assert!(
        out.starts_with("virtualmachine.kubevirt.io \"web\" deleted (dry run)\n"),
        "{out}"
    );
    assert_eq!(out.lines().count(), 4, "{out}");
    let out = ok(env.vm(&[
        "delete",
        "web",
        "-n",
        NS,
        "--dry-run=server",
        "--keep-disks",
    ]));
    assert!(
        out.starts_with("virtualmachine.kubevirt.io \"web\" deleted (server dry run)\n"),
        "{out}"
    );
    assert!(
        out.contains("datavolume.cdi.kubevirt.io \"web-root\" kept (server dry run)"),
        "{out}"
    );
    assert_eq!(names(&env, "kubevirt.io", "virtualmachines"), ["web"]);
    assert_eq!(
        names(&env, "kubevirt.io", "virtualmachineinstances"),
        ["web"]
    );
    assert_eq!(names(&env, "", "secrets"), ["web-cloud-init"]);
    assert_eq!(
        env.emulator
            .objects("cdi.kubevirt.io", "datavolumes", Some(NS)),
        before,
        "not even the ownerReferences changed"
    );
}

#[test]
fn bad_input_is_a_usage_error() {
    let env = Env::kubevirt();
    assert!(fails(&env, &["delete", "vmi/web"], 2).contains("use vm/web"));
    // clap reports its own parse errors (exit 2), with a usage hint after the error line.
    let output = env.vm(&["delete", "web", "--timeout", "soon"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).starts_with(
            "error: invalid value 'soon' for '--timeout <DURATION>': invalid duration \"soon\""
        ),
        "{}",
        stderr(&output)
    );
    assert!(fails(&env, &["delete", "web.prod", "-n", "dev"], 2).contains("drop one of them"));
}

fn virtual_disk(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualDisk",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"persistentVolumeClaim": {"size": "10Gi"}},
        "status": {"phase": "Ready", "capacity": "10Gi"}})
}

fn seed_deckhouse(env: &Env) {
    let uid = "7a000000-0000-4000-8000-0000000000d1";
    env.emulator.put_object(
        json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
        "metadata": {"name": "web", "namespace": NS, "uid": uid, "labels": companion_labels()},
        "spec": {"virtualMachineClassName": "generic", "runPolicy": "AlwaysOnUnlessStoppedManually",
                 "cpu": {"cores": 1}, "memory": {"size": "1Gi"},
                 "blockDeviceRefs": [{"kind": "VirtualDisk", "name": "web-root"},
                                     {"kind": "VirtualDisk", "name": "web-data"},
                                     {"kind": "VirtualDisk", "name": "shared"}]},
        "status": {"phase": "Running"}}),
    );
    env.emulator
        .put_object(virtual_disk("web-root", companion_labels()));
    env.emulator
        .put_object(virtual_disk("web-data", companion_labels()));
    env.emulator.put_object(virtual_disk("shared", json!({})));
    let mut s = secret(uid);
    s["metadata"]["ownerReferences"][0]["apiVersion"] =
        json!("virtualization.deckhouse.io/v1alpha2");
    env.emulator.put_object(s);
}

const DH: &str = "virtualization.deckhouse.io";

#[test]
fn deckhouse_disks_go_or_stay() {
    let env = Env::deckhouse();
    seed_deckhouse(&env);
    let out = ok(env.vm(&["delete", "web", "-n", NS, "--keep-disks"]));
    assert_eq!(
        out,
        "virtualmachine.virtualization.deckhouse.io \"web\" deleted\n\
         virtualdisk.virtualization.deckhouse.io \"web-data\" kept\n\
         virtualdisk.virtualization.deckhouse.io \"web-root\" kept\n\
         secret \"web-cloud-init\" deleted\n"
    );
    assert!(names(&env, DH, "virtualmachines").is_empty());
    assert_eq!(
        names(&env, DH, "virtualdisks"),
        ["shared", "web-data", "web-root"]
    );
    assert!(names(&env, "", "secrets").is_empty());

    seed_deckhouse(&env);
    let out = ok(env.vm(&["delete", "web", "-n", NS]));
    assert!(
        out.contains("virtualdisk.virtualization.deckhouse.io \"web-root\" deleted"),
        "{out}"
    );
    assert!(names(&env, DH, "virtualmachines").is_empty());
    assert_eq!(names(&env, DH, "virtualdisks"), ["shared"]);
}

#[test]
fn terminal_asks_before_deleting() {
    let env = Env::deckhouse();
    seed_deckhouse(&env);
    let question =
        "Delete virtual machine \"team/web\" and its 2 disks (web-data, web-root)? [y/N] ";

    let mut session = on_tty(&env, &["delete", "web", "-n", NS]);
    session.exp_string(question).unwrap();
    session.send_line("n").unwrap();
    let rest = session.exp_eof().unwrap();
    assert!(
        rest.contains("Error: aborted: virtual machine \"team/web\" was not deleted (answer y to confirm, or pass --yes)"),
        "{rest}"
    );
    assert_eq!(exit_code(&session), 1);
    assert_eq!(names(&env, DH, "virtualmachines"), ["web"]);

    // Enter alone is a no too.
    let mut session = on_tty(&env, &["delete", "web", "-n", NS]);
    session.exp_string(question).unwrap();
    session.send_line("").unwrap();
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 1);
    assert_eq!(
        names(&env, DH, "virtualdisks"),
        ["shared", "web-data", "web-root"]
    );

    let mut session = on_tty(&env, &["delete", "web", "-n", NS]);
    session.exp_string(question).unwrap();
    session.send_line("y").unwrap();
    let rest = session.exp_eof().unwrap();
    assert!(
        rest.contains("virtualmachine.virtualization.deckhouse.io \"web\" deleted"),
        "{rest}"
    );
    assert_eq!(exit_code(&session), 0);
    assert!(names(&env, DH, "virtualmachines").is_empty());
    assert_eq!(names(&env, DH, "virtualdisks"), ["shared"]);
}

#[test]
fn terminal_prompt_is_skipped_with_yes_and_interrupted_by_ctrl_c() {
    let env = Env::deckhouse();
    seed_deckhouse(&env);
    let mut session = on_tty(&env, &["delete", "web", "-n", NS, "--keep-disks"]);
    session
        .exp_string(
            "Delete virtual machine \"team/web\", keeping its 2 disks (web-data, web-root)? [y/N] ",
        )
        .unwrap();
    session.send_control('c').unwrap();
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 130);
    assert_eq!(names(&env, DH, "virtualmachines"), ["web"]);

    let mut session = on_tty(&env, &["delete", "web", "-n", NS, "-y"]);
    let rest = session.exp_eof().unwrap();
    assert!(!rest.contains("[y/N]"), "{rest}");
    assert!(rest.contains("\"web\" deleted"), "{rest}");
    assert_eq!(exit_code(&session), 0);
    assert!(names(&env, DH, "virtualmachines").is_empty());
}

/// A DataVolume named by `spec.dataVolumeTemplates` that is neither owned by the VM nor
/// labelled as ours (someone replaced it) is not the VM's disk: it stays.
#[test]
fn a_replaced_template_disk_is_not_deleted() {
    let env = Env::kubevirt();
    seed_kubevirt(&env);
    env.emulator
        .put_object(data_volume("web-root", json!({}), json!([])));
    let out = ok(env.vm(&["delete", "web", "-n", NS]));
    assert!(!out.contains("web-root"), "{out}");
    assert_eq!(
        names(&env, "cdi.kubevirt.io", "datavolumes"),
        ["shared-data", "web-root"]
    );
}

/// Conflicting input is refused before any request (no discovery either), and an impossible
/// port in `create --url` is bad input.
#[test]
fn conflicts_are_refused_before_any_request() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    assert!(fails(&env, &["delete", "vm/web/prod", "-n", "dev"], 2).contains("prod"));
    assert!(
        env.emulator.requests().is_empty(),
        "{:?}",
        env.emulator.requests()
    );
    let err = fails(
        &env,
        &[
            "create",
            "web",
            "--url",
            "https://example.org:99999/disk.qcow2",
            "--dry-run=client",
            "-o",
            "yaml",
        ],
        2,
    );
    assert!(err.contains("99999"), "{err}");
}
