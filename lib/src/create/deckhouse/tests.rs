use serde_json::{Value, json};

use crate::create::fixtures::{self, boot_sources};
use crate::create::plan::{BootSource, CoreFraction, Firmware, OsType, RunStrategy, VmPlan};
use crate::create::{Owner, build, schema_check};
use crate::flavor::Flavor;

fn objects(plan: &VmPlan) -> Vec<Value> {
    let manifests = build(plan).unwrap();
    for o in &manifests.objects {
        schema_check::assert_valid(&o.object);
    }
    manifests.objects.into_iter().map(|o| o.object).collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn every_boot_source_matches_the_schemas() {
    for (what, boot) in boot_sources(Flavor::Deckhouse) {
        let mut plan = fixtures::plan(Flavor::Deckhouse, boot.clone());
        plan.data_disks = vec!["data=5Gi,class=fast".parse().unwrap()];
        plan.core_fraction = Some(CoreFraction::Percent(20));
        plan.firmware = Some(Firmware::Efi);
        let built = objects(&plan);
        let vm = find(&built, "VirtualMachine", "web");
        assert_eq!(vm["spec"]["blockDeviceRefs"][0]["bootOrder"], 1, "{what}");
        let mut plan = fixtures::plan(Flavor::Deckhouse, boot);
        plan.platform_ssh.enabled = false;
        plan.guest.guest_agent = false;
        let built = objects(&plan);
        assert!(
            find(&built, "VirtualMachine", "web")["spec"]
                .get("provisioning")
                .is_none(),
            "{what}"
        );
    }
}

#[test]
fn boot_disk_sources() {
    let disk = |boot| {
        let objects = objects(&fixtures::plan(Flavor::Deckhouse, boot));
        find(&objects, "VirtualDisk", "web-root").clone()
    };
    let d = disk(fixtures::image());
    assert_eq!(
        d["spec"]["dataSource"],
        json!({"type": "ContainerImage", "containerImage": {"image": "quay.io/containerdisks/debian:12"}})
    );
    assert_eq!(d["spec"]["persistentVolumeClaim"]["size"], "10Gi");

    let d = disk(BootSource::ContainerDisk {
        image: "vi/debian".into(),
        ephemeral: false,
    });
    assert_eq!(
        d["spec"]["dataSource"],
        json!({"type": "ObjectRef", "objectRef": {"kind": "VirtualImage", "name": "debian"}})
    );
    let d = disk(BootSource::ContainerDisk {
        image: "cvi/ubuntu".into(),
        ephemeral: false,
    });
    assert_eq!(
        d["spec"]["dataSource"]["objectRef"]["kind"],
        "ClusterVirtualImage"
    );

    let sha = "ab".repeat(32);
    let d = disk(BootSource::Url {
        url: "https://e.com/d.img".into(),
        checksums: vec![format!("sha256:{sha}").parse().unwrap()],
    });
    assert_eq!(
        d["spec"]["dataSource"],
        json!({"type": "HTTP", "http": {"url": "https://e.com/d.img", "checksum": {"sha256": sha}}})
    );

    let d = disk(BootSource::Blank {
        size: "30Gi".parse().unwrap(),
    });
    assert!(d["spec"].get("dataSource").is_none());
    assert_eq!(d["spec"]["persistentVolumeClaim"]["size"], "30Gi");

    let objects = objects(&fixtures::plan(
        Flavor::Deckhouse,
        BootSource::ExistingDisk {
            name: "mydisk".into(),
        },
    ));
    assert!(objects.iter().all(|o| o["kind"] != "VirtualDisk"));
    let vm = find(&objects, "VirtualMachine", "web");
    assert_eq!(
        vm["spec"]["blockDeviceRefs"],
        json!([{"kind": "VirtualDisk", "name": "mydisk", "bootOrder": 1}])
    );
}

#[test]
fn vm_spec_and_order() {
    let mut plan = fixtures::plan(Flavor::Deckhouse, fixtures::image());
    plan.data_disks = vec!["data=5Gi".parse().unwrap()];
    plan.storage_class = Some("ceph".into());
    plan.cpu = Some(2);
    plan.memory = Some("4Gi".parse().unwrap());
    plan.core_fraction = Some(CoreFraction::Percent(50));
    plan.class = Some("highcpu".into());
    plan.run_strategy = Some(RunStrategy::RerunOnFailure);
    plan.os = OsType::Windows;
    plan.firmware = Some(Firmware::Bios);
    let manifests = build(&plan).unwrap();
    let kinds: Vec<_> = manifests
        .objects
        .iter()
        .map(|o| (o.kind().to_string(), o.name().to_string()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("VirtualDisk".into(), "web-root".into()),
            ("VirtualDisk".into(), "web-data".into()),
            ("VirtualMachine".to_string(), "web".to_string())
        ]
    );
    let vm = manifests.vm();
    assert_eq!(vm["apiVersion"], "virtualization.deckhouse.io/v1alpha2");
    assert_eq!(vm["spec"]["virtualMachineClassName"], "highcpu");
    assert_eq!(
        vm["spec"]["cpu"],
        json!({"cores": 2, "coreFraction": "50%"})
    );
    assert_eq!(vm["spec"]["memory"], json!({"size": "4Gi"}));
    assert_eq!(vm["spec"]["runPolicy"], "AlwaysOnUnlessStoppedManually");
    assert_eq!(vm["spec"]["osType"], "Windows");
    assert_eq!(vm["spec"]["bootloader"], "BIOS");
    assert_eq!(
        vm["spec"]["blockDeviceRefs"][1],
        json!({"kind": "VirtualDisk", "name": "web-data"})
    );
    let data = &manifests.objects[1].object;
    assert_eq!(
        data["spec"]["persistentVolumeClaim"],
        json!({"size": "5Gi", "storageClassName": "ceph"})
    );
}

#[test]
fn provisioning_inline_or_secret() {
    let mut small = fixtures::plan(Flavor::Deckhouse, fixtures::image());
    small.platform_ssh.enabled = false;
    let objects = objects(&small);
    let vm = find(&objects, "VirtualMachine", "web");
    assert_eq!(vm["spec"]["provisioning"]["type"], "UserData");
    assert!(
        vm["spec"]["provisioning"]["userData"]
            .as_str()
            .unwrap()
            .len()
            <= 2048
    );
    assert_eq!(vm["spec"]["class"], Value::Null);
    assert_eq!(vm["spec"]["virtualMachineClassName"], "generic");

    let manifests = build(&fixtures::plan(Flavor::Deckhouse, fixtures::image())).unwrap();
    let vm = manifests.vm();
    assert_eq!(
        vm["spec"]["provisioning"],
        json!({"type": "UserDataRef", "userDataRef": {"kind": "Secret", "name": "web-cloudinit"}})
    );
    let secret = manifests.objects.last().unwrap();
    assert_eq!(secret.owner, Owner::Vm);
    assert_eq!(
        secret.object["type"],
        "provisioning.virtualization.deckhouse.io/cloud-init"
    );
    assert!(
        secret.object["stringData"]["userData"]
            .as_str()
            .unwrap()
            .starts_with("#cloud-config")
    );
}

#[test]
fn hostname_goes_through_cloud_init() {
    let mut plan = fixtures::plan(Flavor::Deckhouse, fixtures::image());
    plan.hostname = Some("db-01".into());
    plan.stopped = true;
    let manifests = build(&plan).unwrap();
    assert!(
        manifests
            .user_data
            .as_ref()
            .unwrap()
            .text
            .contains("hostname: db-01")
    );
    assert_eq!(manifests.vm()["spec"]["runPolicy"], "Manual");
}
