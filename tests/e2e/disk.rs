//! `disk list|attach|detach` end to end: the requests checked against FACTS (KubeVirt §2
//! `addvolume`/`removevolume` with `AddVolumeOptions{name, disk, volumeSource, dryRun}`;
//! Deckhouse §12 VirtualMachineBlockDeviceAttachment), results read back with real kubectl.

use serde_json::{Value, json};

use crate::common::{Env, changes, fails, ok, stderr, stdout, table};

const SUB: &str = "/apis/subresources.kubevirt.io/v1/namespaces";

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

fn named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array()?.iter().find(|v| v["name"] == name)
}

#[test]
fn kubevirt_hotplug_new_disk_and_unplug() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let out = env.vm(&["disk", "attach", "web", "data", "--size", "1Gi"]);
    assert_eq!(
        stdout(&out),
        "disk data attached to web.default; the running guest sees it now, no restart needed\n",
        "{}",
        stderr(&out)
    );
    // The hotplug phases came by on stderr, ending with Ready.
    let err = stderr(&out);
    assert!(
        err.starts_with("datavolume/data created\naddvolume data accepted\n"),
        "{err}"
    );
    assert!(
        err.contains("  Ready: Successfully attach hotplugged volume data to VM"),
        "{err}"
    );
    // Exactly two writes: the blank DataVolume (create), then the addvolume PUT.
    let wire = changes(&env);
    assert_eq!(wire.len(), 2, "{wire:#?}");
    assert_eq!(
        (wire[0].0.as_str(), wire[0].1.as_str()),
        (
            "POST",
            "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes"
        )
    );
    let dv = wire[0].2.clone().unwrap();
    assert_eq!(dv["spec"]["source"], json!({"blank": {}}));
    assert_eq!(
        dv["spec"]["storage"]["resources"]["requests"]["storage"],
        "1Gi"
    );
    assert_eq!(
        dv["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kubectl-vm"
    );
    assert_eq!(
        (wire[1].0.as_str(), wire[1].1.clone()),
        (
            "PUT",
            format!("{SUB}/default/virtualmachines/web/addvolume")
        )
    );
    assert_eq!(
        wire[1].2,
        Some(
            json!({"name": "data", "disk": {"name": "data", "disk": {"bus": "scsi"}, "serial": "data"},
            "volumeSource": {"dataVolume": {"name": "data"}}})
        )
    );
    // Persisted in the VM template (hotpluggable, as virt-api marks it) and live in the VMI.
    let vm = kubectl_json(&env, &["get", "vm", "web"]);
    assert_eq!(
        named(&vm["spec"]["template"]["spec"]["volumes"], "data"),
        Some(&json!({"name": "data", "dataVolume": {"name": "data", "hotpluggable": true}}))
    );
    let vmi = kubectl_json(&env, &["get", "vmi", "web"]);
    let status = named(&vmi["status"]["volumeStatus"], "data").expect("volumeStatus of data");
    assert_eq!(
        (&status["phase"], &status["target"]),
        (&json!("Ready"), &json!("sda"))
    );
    let rows = table(&ok(env.vm(&["disk", "list", "web"])));
    assert_eq!(
        rows[0],
        [
            "NAME", "SOURCE", "BUS", "SIZE", "SERIAL", "TARGET", "HOTPLUG", "RO", "STATE"
        ]
    );
    assert!(
        rows.contains(
            &[
                "data", "dv/data", "scsi", "1Gi", "data", "sda", "true", "false", "Ready"
            ]
            .map(String::from)
            .to_vec()
        ),
        "{rows:?}"
    );
    let listed: Value =
        serde_json::from_str(&ok(env.vm(&["disk", "list", "web", "-o", "json"]))).unwrap();
    assert_eq!(
        named(&listed, "rootdisk").unwrap()["source"],
        "containerDisk"
    );

    // Bad input: one line, nothing sent that changes anything.
    env.emulator.clear_requests();
    assert_eq!(
        fails(&env, &["disk", "attach", "web", "data", "--size", "1Gi"], 2),
        "Error: web.default already has disk data (dv/data); nothing was changed"
    );
    assert_eq!(
        fails(&env, &["disk", "attach", "web", "nope"], 2),
        "Error: no DataVolume or PersistentVolumeClaim \"nope\" in namespace \"default\"; nothing was changed (a new disk needs --size)"
    );
    assert_eq!(
        fails(&env, &["disk", "attach", "web", "fedora-dv-root"], 2),
        "Error: fedora-dv-root is in use by VM fedora-dv in namespace \"default\"; detach it there first (nothing was changed)"
    );
    assert_eq!(
        fails(&env, &["disk", "attach", "web", "vd/data"], 2),
        "Error: disk \"vd/data\": KubeVirt has no such kind; use pvc/NAME or dv/NAME"
    );
    assert!(changes(&env).is_empty(), "{:#?}", changes(&env));
    // virt-api's own refusal of a volume that was not hotplugged.
    let line = fails(&env, &["disk", "detach", "web", "rootdisk"], 1);
    assert_eq!(
        line,
        "Error: cannot detach rootdisk from web.default (KubeVirt: Operation cannot be fulfilled on virtualmachine.kubevirt.io \"web\": Unable to remove volume [rootdisk] because it is not hotpluggable)"
    );

    // Server dry run: the PUT carries dryRun, nothing changes.
    env.emulator.clear_requests();
    ok(env.vm(&["disk", "detach", "web", "data", "--dry-run=server"]));
    assert_eq!(
        changes(&env),
        [(
            "PUT".into(),
            format!("{SUB}/default/virtualmachines/web/removevolume"),
            Some(json!({"name": "data", "dryRun": ["All"]}))
        )]
    );
    assert!(
        named(
            &kubectl_json(&env, &["get", "vm", "web"])["spec"]["template"]["spec"]["volumes"],
            "data"
        )
        .is_some()
    );

    // Detach: removevolume, gone from the template and the VMI; the DataVolume stays.
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["disk", "detach", "web", "data"])),
        "disk data detached from web.default (the disk itself is kept)\n"
    );
    assert_eq!(
        changes(&env),
        [(
            "PUT".into(),
            format!("{SUB}/default/virtualmachines/web/removevolume"),
            Some(json!({"name": "data"}))
        )]
    );
    let vm = kubectl_json(&env, &["get", "vm", "web"]);
    assert!(named(&vm["spec"]["template"]["spec"]["volumes"], "data").is_none());
    let vmi = kubectl_json(&env, &["get", "vmi", "web"]);
    assert!(named(&vmi["status"]["volumeStatus"], "data").is_none());
    assert!(named(&vmi["spec"]["volumes"], "data").is_none());
    ok(env.kubectl(&["get", "dv", "data"]));
    assert_eq!(
        fails(&env, &["disk", "detach", "web", "data"], 2),
        "Error: web.default has no disk \"data\" (see `kubectl vm disk list web.default`)"
    );
    // Client dry run of attaching the kept DataVolume again: the request on stdout, nothing sent.
    env.emulator.clear_requests();
    let shown: Value = serde_json::from_str(&ok(env.vm(&[
        "disk",
        "attach",
        "web",
        "data",
        "--dry-run",
        "-o",
        "json",
    ])))
    .unwrap();
    assert_eq!(
        shown,
        json!({"name": "data", "disk": {"name": "data", "disk": {"bus": "scsi"}, "serial": "data"},
            "volumeSource": {"dataVolume": {"name": "data"}}})
    );
    assert!(changes(&env).is_empty(), "{:#?}", changes(&env));
}

#[test]
fn kubevirt_attach_to_a_stopped_vm_applies_at_start() {
    let env = Env::kubevirt();
    let pvc = r#"{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"iso","namespace":"dev"},
        "spec":{"accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":"2Gi"}},"storageClassName":"local-path"}}"#;
    let path = env.dir.path().join("pvc.json");
    std::fs::write(&path, pvc).unwrap();
    ok(env.kubectl(&["apply", "-f", path.to_str().unwrap()]));
    let out = env.vm(&[
        "disk",
        "attach",
        "batch.dev",
        "pvc/iso",
        "--read-only",
        "--bus",
        "virtio",
        "--serial",
        "ISO1",
        "-o",
        "name",
    ]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/batch\n",
        "{}",
        stderr(&out)
    );
    let vm = kubectl_json(&env, &["get", "vm", "batch", "-n", "dev"]);
    assert_eq!(
        named(
            &vm["spec"]["template"]["spec"]["domain"]["devices"]["disks"],
            "iso"
        ),
        Some(
            &json!({"name": "iso", "disk": {"bus": "virtio", "readonly": true}, "serial": "ISO1"})
        )
    );
    assert_eq!(
        named(&vm["spec"]["template"]["spec"]["volumes"], "iso"),
        Some(
            &json!({"name": "iso", "persistentVolumeClaim": {"claimName": "iso", "readOnly": true, "hotpluggable": true}})
        )
    );
    let rows = table(&ok(env.vm(&["disk", "list", "batch", "-n", "dev"])));
    assert!(
        rows.contains(
            &[
                "iso", "pvc/iso", "virtio", "2Gi", "ISO1", "<none>", "true", "true", "-"
            ]
            .map(String::from)
            .to_vec()
        ),
        "{rows:?}"
    );
}

#[test]
fn deckhouse_attach_with_vmbda_and_detach() {
    let env = Env::deckhouse();
    env.emulator.clear_requests();
    let out = env.vm(&["disk", "attach", "linux-vm", "data", "--size", "1Gi"]);
    assert_eq!(
        stdout(&out),
        "disk data attached to linux-vm.default; the running guest sees it now, no restart needed\n",
        "{}",
        stderr(&out)
    );
    let wire = changes(&env);
    assert_eq!(wire.len(), 2, "{wire:#?}");
    assert_eq!(
        (wire[0].0.as_str(), wire[0].1.as_str()),
        (
            "POST",
            "/apis/virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualdisks"
        )
    );
    assert_eq!(
        wire[0].2.as_ref().unwrap()["spec"],
        json!({"persistentVolumeClaim": {"size": "1Gi"}})
    );
    assert_eq!(
        (wire[1].0.as_str(), wire[1].1.as_str()),
        (
            "POST",
            "/apis/virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualmachineblockdeviceattachments"
        )
    );
    let bda = wire[1].2.clone().unwrap();
    assert_eq!(bda["metadata"]["name"], "linux-vm-data");
    assert_eq!(
        bda["spec"],
        json!({"virtualMachineName": "linux-vm", "blockDeviceRef": {"kind": "VirtualDisk", "name": "data"}})
    );
    let got = kubectl_json(&env, &["get", "vmbda", "linux-vm-data"]);
    assert_eq!(got["status"]["phase"], "Attached");
    let vm = kubectl_json(
        &env,
        &[
            "get",
            "virtualmachines.virtualization.deckhouse.io",
            "linux-vm",
        ],
    );
    let r = vm["status"]["blockDeviceRefs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "data")
        .expect("data in status.blockDeviceRefs");
    assert_eq!(
        (&r["hotplugged"], &r["attached"]),
        (&json!(true), &json!(true))
    );
    assert_eq!(
        r["virtualMachineBlockDeviceAttachmentName"],
        "linux-vm-data"
    );
    // The serial is Deckhouse's: md5 of the VirtualDisk's uid (checked with md5sum).
    let vd = kubectl_json(&env, &["get", "virtualdisks", "data"]);
    let uid = vd["metadata"]["uid"].as_str().unwrap();
    let md5 = std::process::Command::new("sh")
        .args(["-c", "printf %s \"$1\" | md5sum", "sh", uid])
        .output()
        .unwrap();
    let serial = String::from_utf8(md5.stdout).unwrap()[..32].to_owned();
    let rows = table(&ok(env.vm(&["disk", "list", "linux-vm"])));
    assert!(
        rows.contains(
            &[
                "data",
                "vd/data",
                "scsi",
                "1Gi",
                serial.as_str(),
                "sda",
                "true",
                "false",
                "Attached"
            ]
            .map(String::from)
            .to_vec()
        ),
        "{rows:?}"
    );

    // Bad input: nothing sent.
    env.emulator.clear_requests();
    assert_eq!(
        fails(&env, &["disk", "attach", "linux-vm", "linux-disk"], 2),
        "Error: linux-vm.default already has VirtualDisk linux-disk in its spec.blockDeviceRefs; nothing was changed"
    );
    assert_eq!(
        fails(&env, &["disk", "attach", "linux-vm", "cvi/nope"], 2),
        "Error: no ClusterVirtualImage \"nope\"; nothing was changed"
    );
    assert_eq!(
        fails(
            &env,
            &["disk", "attach", "linux-vm", "data", "--bus", "virtio"],
            2
        ),
        "Error: --name, --serial and --bus are KubeVirt's: Deckhouse names the device after the disk and always uses SCSI"
    );
    assert!(changes(&env).is_empty(), "{:#?}", changes(&env));

    // An attachment someone else made is left alone.
    let theirs = env.dir.path().join("theirs.json");
    std::fs::write(&theirs, r#"{"apiVersion":"virtualization.deckhouse.io/v1alpha2","kind":"VirtualMachineBlockDeviceAttachment",
        "metadata":{"name":"iso","namespace":"default"},
        "spec":{"virtualMachineName":"linux-vm","blockDeviceRef":{"kind":"ClusterVirtualImage","name":"ubuntu-24-04"}}}"#).unwrap();
    ok(env.kubectl(&["apply", "-f", theirs.to_str().unwrap()]));
    env.emulator.clear_requests();
    assert_eq!(
        fails(&env, &["disk", "detach", "linux-vm", "ubuntu-24-04"], 1),
        "Error: attachment iso of ubuntu-24-04 was not made by kubectl vm; it is left as it is (delete it with kubectl if you mean to)"
    );
    assert!(changes(&env).is_empty());

    // Detach: DELETE with the uid precondition; the VirtualDisk stays.
    let uid = got["metadata"]["uid"].as_str().unwrap().to_owned();
    assert_eq!(
        ok(env.vm(&["disk", "detach", "linux-vm", "data"])),
        "disk data detached from linux-vm.default (the disk itself is kept)\n"
    );
    let wire = changes(&env);
    assert_eq!(wire.len(), 1, "{wire:#?}");
    assert_eq!(
        (wire[0].0.as_str(), wire[0].1.as_str()),
        (
            "DELETE",
            "/apis/virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualmachineblockdeviceattachments/linux-vm-data"
        )
    );
    assert_eq!(
        wire[0].2.as_ref().unwrap()["preconditions"]["uid"],
        uid.as_str()
    );
    let out = env.kubectl(&["get", "vmbda", "linux-vm-data"]);
    assert!(!out.status.success());
    ok(env.kubectl(&["get", "vd", "data"]));

    // Deleting the VM takes our attachments with it (someone else's stays), and the disk made
    // by attach --size, which is labelled as the VM's.
    ok(env.vm(&["disk", "attach", "linux-vm", "data"]));
    let out = ok(env.vm(&["delete", "linux-vm", "-y", "--wait"]));
    assert!(
        out.contains("virtualmachineblockdeviceattachment.virtualization.deckhouse.io \"linux-vm-data\" deleted\n"),
        "{out}"
    );
    assert!(
        out.contains("virtualdisk.virtualization.deckhouse.io \"data\" deleted"),
        "{out}"
    );
    assert!(
        !env.kubectl(&["get", "vmbda", "linux-vm-data"])
            .status
            .success()
    );
    ok(env.kubectl(&["get", "vmbda", "iso"]));
}

#[test]
fn kubevirt_hotplug_that_cannot_go_on_times_out_with_the_reason() {
    let env = Env::kubevirt();
    // A claim no volume will ever be provisioned for (no provisioner): it stays Pending, and
    // so does the hotplugged volume.
    let path = env.dir.path().join("pending.yaml");
    std::fs::write(
        &path,
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: manual}\nprovisioner: kubernetes.io/no-provisioner\nvolumeBindingMode: Immediate\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: stuck, namespace: default}\nspec: {accessModes: [ReadWriteOnce], storageClassName: manual, resources: {requests: {storage: 1Gi}}}\n",
    )
    .unwrap();
    ok(env.kubectl(&["apply", "-f", path.to_str().unwrap()]));
    let out = env.vm(&["disk", "attach", "web", "stuck", "--timeout", "3s"]);
    assert_eq!(out.status.code(), Some(1));
    // Progress first, then the one error line.
    assert_eq!(
        stderr(&out).lines().collect::<Vec<_>>(),
        [
            "addvolume stuck accepted",
            "  Pending: PVC stuck is not bound",
            "Error: timed out waiting for stuck to be attached to web.default (after 3s; last state Pending: PVC stuck is not bound; raise --timeout, or pass --no-wait)",
        ]
    );
    // The request itself was taken: the volume is in the template, Pending in the VMI.
    let rows = table(&ok(env.vm(&["disk", "list", "web"])));
    assert!(
        rows.iter().any(|r| r[0] == "stuck" && r[8] == "Pending"),
        "{rows:?}"
    );
}
