use serde_json::{Value, json};

use crate::create::fixtures::{self, boot_sources};
use crate::create::plan::{BootSource, Firmware, KindRef, OsType, RunStrategy, VmPlan};
use crate::create::{Owner, build, schema_check};
use crate::flavor::Flavor;

fn objects(plan: &VmPlan) -> Vec<Value> {
    let manifests = build(plan).unwrap();
    for o in &manifests.objects {
        schema_check::assert_valid(&o.object);
    }
    manifests.objects.into_iter().map(|o| o.object).collect()
}

fn vm(plan: &VmPlan) -> Value {
    objects(plan)
        .into_iter()
        .find(|o| o["kind"] == "VirtualMachine")
        .unwrap()
}

fn volume<'a>(vm: &'a Value, name: &str) -> &'a Value {
    vm["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name}"))
}

#[test]
fn every_boot_source_matches_the_schemas() {
    for (what, boot) in boot_sources(Flavor::KubeVirt) {
        let mut plan = fixtures::plan(Flavor::KubeVirt, boot.clone());
        plan.data_disks = vec!["data=5Gi,class=fast,bus=scsi".parse().unwrap()];
        let objects = objects(&plan);
        assert!(
            objects.iter().any(|o| o["kind"] == "VirtualMachine"),
            "{what}"
        );
        // Also without cloud-init and with every optional field.
        let mut plan = fixtures::plan(Flavor::KubeVirt, boot);
        plan.platform_ssh.enabled = false;
        plan.guest.guest_agent = false;
        plan.firmware = Some(Firmware::Efi);
        plan.hostname = Some("web-host".into());
        plan.timezone = Some("Europe/Berlin".into());
        plan.instancetype = Some(KindRef::instancetype("u1.medium").unwrap());
        plan.preference = Some(KindRef::preference("vmpreference/debian").unwrap());
        plan.labels = vec!["team=a".parse().unwrap()];
        let vm = vm(&plan);
        assert!(
            vm["spec"]["template"]["spec"]["domain"]
                .get("cpu")
                .is_none(),
            "{what}"
        );
        assert!(volume(&vm, "rootdisk").is_object());
    }
}

#[test]
fn persisted_image_is_imported_from_the_registry() {
    let vm = vm(&fixtures::plan(Flavor::KubeVirt, fixtures::image()));
    let template = &vm["spec"]["dataVolumeTemplates"][0];
    assert_eq!(template["metadata"]["name"], "web-root");
    assert_eq!(
        template["spec"]["source"]["registry"]["url"],
        "docker://quay.io/containerdisks/debian:12"
    );
    assert_eq!(
        template["spec"]["storage"]["resources"]["requests"]["storage"],
        "10Gi"
    );
    assert_eq!(volume(&vm, "rootdisk")["dataVolume"]["name"], "web-root");
    let disks = &vm["spec"]["template"]["spec"]["domain"]["devices"]["disks"];
    assert_eq!(
        disks[0],
        json!({"name": "rootdisk", "disk": {"bus": "virtio"}, "bootOrder": 1})
    );
    assert_eq!(vm["spec"]["runStrategy"], "Always");
    let spec = &vm["spec"]["template"]["spec"];
    assert_eq!(
        spec["domain"]["devices"]["interfaces"],
        json!([{"name": "default", "masquerade": {}}])
    );
    assert_eq!(spec["networks"], json!([{"name": "default", "pod": {}}]));
    assert_eq!(spec["domain"]["cpu"]["cores"], 1);
    assert_eq!(spec["domain"]["memory"]["guest"], "1Gi");
}

#[test]
fn ephemeral_existing_and_clone_sources() {
    let plan = |boot| fixtures::plan(Flavor::KubeVirt, boot);
    let vm1 = vm(&plan(BootSource::ContainerDisk {
        image: "quay.io/x/y:1".into(),
        ephemeral: true,
    }));
    assert_eq!(
        volume(&vm1, "rootdisk")["containerDisk"]["image"],
        "quay.io/x/y:1"
    );
    assert!(vm1["spec"].get("dataVolumeTemplates").is_none());

    let vm2 = vm(&plan(BootSource::ExistingDisk {
        name: "pvc1".into(),
    }));
    assert_eq!(
        volume(&vm2, "rootdisk")["persistentVolumeClaim"]["claimName"],
        "pvc1"
    );

    let vm3 = vm(&plan(BootSource::ClonePvc {
        name: "golden/debian".into(),
    }));
    let spec = &vm3["spec"]["dataVolumeTemplates"][0]["spec"];
    assert_eq!(
        spec["source"]["pvc"],
        json!({"namespace": "golden", "name": "debian"})
    );
    assert!(
        spec["storage"].get("resources").is_none(),
        "a clone takes its source's size"
    );
    let vm4 = vm(&plan(BootSource::ClonePvc {
        name: "debian".into(),
    }));
    assert_eq!(
        vm4["spec"]["dataVolumeTemplates"][0]["spec"]["source"]["pvc"]["namespace"],
        "default"
    );

    let mut blank = plan(BootSource::Blank {
        size: "20Gi".parse().unwrap(),
    });
    blank.storage_class = Some("fast".into());
    let vm5 = vm(&blank);
    let spec = &vm5["spec"]["dataVolumeTemplates"][0]["spec"];
    assert_eq!(spec["source"], json!({"blank": {}}));
    assert_eq!(
        spec["storage"],
        json!({"resources": {"requests": {"storage": "20Gi"}}, "storageClassName": "fast"})
    );
}

#[test]
fn url_with_checksum_is_a_standalone_datavolume() {
    let sha512 = format!("sha512:{}", "1".repeat(128)).parse().unwrap();
    let md5 = format!("md5:{}", "2".repeat(32)).parse().unwrap();
    let plan = fixtures::plan(
        Flavor::KubeVirt,
        BootSource::Url {
            url: "https://e.com/d.qcow2".into(),
            checksums: vec![md5, sha512],
        },
    );
    let objects = objects(&plan);
    assert_eq!(objects[0]["kind"], "DataVolume");
    assert_eq!(objects[0]["metadata"]["name"], "web-root");
    assert_eq!(objects[0]["metadata"]["namespace"], "default");
    assert_eq!(
        objects[0]["spec"]["source"]["http"]["checksum"],
        format!("sha512:{}", "1".repeat(128)),
        "strongest wins"
    );
    let vm = &objects[1];
    assert!(vm["spec"].get("dataVolumeTemplates").is_none());
    assert_eq!(volume(vm, "rootdisk")["dataVolume"]["name"], "web-root");

    let plain = fixtures::plan(
        Flavor::KubeVirt,
        BootSource::Url {
            url: "https://e.com/d.qcow2".into(),
            checksums: vec![],
        },
    );
    let vm = self::vm(&plain);
    assert_eq!(
        vm["spec"]["dataVolumeTemplates"][0]["spec"]["source"],
        json!({"http": {"url": "https://e.com/d.qcow2"}})
    );
}

#[test]
fn data_disks_get_a_serial_and_a_blank_volume() {
    let mut plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    plan.storage_class = Some("standard".into());
    plan.data_disks = vec![
        "data=5Gi,class=fast,bus=scsi".parse().unwrap(),
        "logs=1Gi".parse().unwrap(),
    ];
    let vm = vm(&plan);
    let disks = &vm["spec"]["template"]["spec"]["domain"]["devices"]["disks"];
    assert_eq!(
        disks[1],
        json!({"name": "data", "disk": {"bus": "scsi"}, "serial": "data"})
    );
    assert_eq!(disks[2]["serial"], "logs");
    let templates = &vm["spec"]["dataVolumeTemplates"];
    assert_eq!(templates[1]["metadata"]["name"], "web-data");
    assert_eq!(templates[1]["spec"]["storage"]["storageClassName"], "fast");
    assert_eq!(
        templates[2]["spec"]["storage"]["storageClassName"],
        "standard"
    );
    assert_eq!(volume(&vm, "logs")["dataVolume"]["name"], "web-logs");
}

#[test]
fn cloud_init_inline_or_secret() {
    let mut small = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    small.platform_ssh.enabled = false;
    let manifests = build(&small).unwrap();
    assert_eq!(manifests.objects.len(), 1);
    let vm = &manifests.objects[0].object;
    let inline = &volume(vm, "cloudinitdisk")["cloudInitNoCloud"]["userData"];
    assert!(inline.as_str().unwrap().starts_with("#cloud-config\n"));

    let big = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    let manifests = build(&big).unwrap();
    let vm = &manifests.objects[0].object;
    assert_eq!(
        volume(vm, "cloudinitdisk")["cloudInitNoCloud"],
        json!({"secretRef": {"name": "web-cloudinit"}})
    );
    let secret = &manifests.objects[1];
    assert_eq!(secret.owner, Owner::Vm);
    assert_eq!(secret.object["type"], "Opaque");
    assert_eq!(
        secret.object["stringData"]["userdata"],
        manifests.user_data.unwrap().text
    );
}

#[test]
fn machine_options() {
    let mut plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    plan.firmware = Some(Firmware::Efi);
    plan.hostname = Some("web-01".into());
    plan.cpu = Some(4);
    plan.memory = Some("1.5Gi".parse().unwrap());
    plan.run_strategy = Some(RunStrategy::Manual);
    plan.labels = vec!["team=a".parse().unwrap()];
    let vm = vm(&plan);
    let spec = &vm["spec"]["template"]["spec"];
    assert_eq!(
        spec["domain"]["firmware"],
        json!({"bootloader": {"efi": {"secureBoot": false}}})
    );
    assert_eq!(spec["hostname"], "web-01");
    assert_eq!(spec["domain"]["cpu"]["cores"], 4);
    assert_eq!(spec["domain"]["memory"]["guest"], "1536Mi");
    assert_eq!(vm["spec"]["runStrategy"], "Manual");
    assert_eq!(vm["metadata"]["labels"]["team"], "a");
    assert_eq!(vm["spec"]["template"]["metadata"]["labels"]["team"], "a");

    plan.instancetype = Some(KindRef::instancetype("u1.large").unwrap());
    plan.cpu = None;
    plan.memory = None;
    let vm = self::vm(&plan);
    assert_eq!(
        vm["spec"]["instancetype"],
        json!({"kind": "VirtualMachineClusterInstancetype", "name": "u1.large"})
    );
    assert!(
        vm["spec"]["template"]["spec"]["domain"]
            .get("memory")
            .is_none()
    );
}

#[test]
fn windows_and_time_zones() {
    let mut plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    plan.os = OsType::Windows;
    plan.timezone = Some("Europe/Berlin".into());
    let vm = vm(&plan);
    let domain = &vm["spec"]["template"]["spec"]["domain"];
    assert_eq!(domain["clock"]["timezone"], "Europe/Berlin");
    assert_eq!(domain["devices"]["disks"][0]["disk"]["bus"], "sata");
    assert_eq!(domain["devices"]["interfaces"][0]["model"], "e1000e");
    assert!(domain["features"]["hyperv"].is_object());
    assert!(volume(&vm, "rootdisk").is_object());
    assert!(
        vm["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["name"] != "cloudinitdisk")
    );

    plan.os = OsType::Linux;
    let vm = self::vm(&plan);
    assert_eq!(
        vm["spec"]["template"]["spec"]["domain"]["clock"],
        json!({"utc": {}})
    );
}

#[test]
fn stopped_vm_is_halted() {
    let mut plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    plan.stopped = true;
    assert_eq!(vm(&plan)["spec"]["runStrategy"], "Halted");
}

/// The seed's further settings land in the fields the KubeVirt API docs name
/// (swagger `v1.CPU`, `v1.Firmware`, `v1.EFI`, `v1.AccessCredential`, `v1.VirtualMachineInstanceSpec.subdomain`).
#[test]
fn seed_extras_use_the_api_fields() {
    use crate::create::plan::{AccessCredential, DeliveryMethod};
    let mut plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    plan.cpu = Some(8);
    plan.extras.sockets = Some(2);
    plan.extras.threads = Some(2);
    plan.extras.uuid = Some("7C9E6679-7425-40DE-944B-E07FC1F90AE7".into());
    plan.extras.serial = Some("SN 42".into());
    plan.extras.secure_boot = true;
    plan.extras.persistent_efi = true;
    plan.hostname = Some("db".into());
    plan.extras.subdomain = Some("tier".into());
    plan.extras.access_credentials = vec![
        AccessCredential {
            secret: "team-keys".into(),
            users: vec!["ubuntu".into(), "ops".into()],
            method: DeliveryMethod::QemuGuestAgent,
        },
        AccessCredential {
            secret: "boot-keys".into(),
            users: vec!["ops".into()],
            method: DeliveryMethod::ConfigDrive,
        },
    ];
    let created = vm(&plan);
    let spec = &created["spec"]["template"]["spec"];
    let domain = &spec["domain"];
    assert_eq!(
        domain["cpu"],
        json!({ "sockets": 2, "cores": 2, "threads": 2 })
    );
    assert_eq!(
        domain["firmware"],
        json!({
            "bootloader": { "efi": { "secureBoot": true, "persistent": true } },
            "uuid": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
            "serial": "SN 42",
        })
    );
    assert_eq!(domain["features"]["smm"], json!({ "enabled": true }));
    assert_eq!(spec["hostname"], "db");
    assert_eq!(spec["subdomain"], "tier");
    // Only the guest-agent credential is a reference; configDrive keys come in the user data.
    assert_eq!(
        spec["accessCredentials"],
        json!([{ "sshPublicKey": {
            "source": { "secret": { "secretName": "team-keys" } },
            "propagationMethod": { "qemuGuestAgent": { "users": ["ubuntu", "ops"] } },
        } }])
    );
    // Without the extras nothing of it appears.
    let plain = vm(&fixtures::plan(Flavor::KubeVirt, fixtures::image()));
    let spec = &plain["spec"]["template"]["spec"];
    assert_eq!(spec["domain"]["cpu"], json!({ "cores": 1 }));
    for absent in ["accessCredentials", "subdomain"] {
        assert!(spec.get(absent).is_none(), "{absent}");
    }
    assert!(spec["domain"].get("firmware").is_none());
}

#[test]
fn infer_from_image_asks_virt_api_for_the_labels_of_the_boot_volume() {
    let mut plan = fixtures::plan(
        Flavor::KubeVirt,
        BootSource::ContainerDisk {
            image: "ds/os-images/fedora".into(),
            ephemeral: false,
        },
    );
    plan.infer_from_image = true;
    let vm = vm(&plan);
    assert_eq!(
        vm["spec"]["instancetype"],
        json!({"inferFromVolume": "rootdisk"})
    );
    assert_eq!(
        vm["spec"]["preference"],
        json!({"inferFromVolume": "rootdisk", "inferFromVolumeFailurePolicy": "Ignore"})
    );
    let domain = &vm["spec"]["template"]["spec"]["domain"];
    assert!(
        domain.get("memory").is_none() && domain.get("cpu").is_none(),
        "{domain}"
    );
    assert_eq!(
        volume(&vm, "rootdisk")["dataVolume"]["name"],
        json!(plan.boot_disk_name())
    );
    // An explicit preference is kept; only the instancetype is inferred.
    plan.preference = Some(KindRef::preference("fedora").unwrap());
    let vm = self::vm(&plan);
    assert_eq!(
        vm["spec"]["preference"],
        json!({"kind": "VirtualMachineClusterPreference", "name": "fedora"})
    );
}
