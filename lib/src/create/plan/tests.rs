use super::*;

fn image(flavor: Flavor) -> VmPlan {
    let mut plan = VmPlan::new(
        "web",
        "default",
        flavor,
        BootSource::ContainerDisk {
            image: "quay.io/containerdisks/debian:12".into(),
            ephemeral: false,
        },
    );
    plan.platform_ssh.ca_public_keys = vec!["ssh-ed25519 AAAAC3Nza ca".into()];
    plan
}

fn err(plan: &VmPlan) -> String {
    let e = plan.validate().unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    e
}

#[test]
fn defaults_are_valid() {
    image(Flavor::KubeVirt).validate().unwrap();
    image(Flavor::Deckhouse).validate().unwrap();
}

#[test]
fn boot_flags_reduce_to_one_source() {
    let e = BootSource::from_flags(BootFlags {
        ephemeral: true,
        url: Some("https://x".into()),
        ..Default::default()
    });
    assert!(
        e.unwrap_err()
            .to_string()
            .contains("--ephemeral needs --image")
    );
    let sum = "sha256:".to_string() + &"0".repeat(64);
    let e = BootSource::from_flags(BootFlags {
        image: Some("x".into()),
        checksums: vec![sum.parse().unwrap()],
        ..Default::default()
    });
    assert!(
        e.unwrap_err()
            .to_string()
            .contains("--checksum needs --url")
    );
    let e = BootSource::from_flags(BootFlags {
        image: Some("x".into()),
        disk: Some("d".into()),
        ..Default::default()
    });
    assert!(
        e.unwrap_err()
            .to_string()
            .contains("--image and --disk cannot")
    );
    assert!(
        BootSource::from_flags(BootFlags::default())
            .unwrap_err()
            .to_string()
            .contains("no boot source")
    );
    let ok = BootSource::from_flags(BootFlags {
        image: Some("x".into()),
        ephemeral: true,
        ..Default::default()
    });
    assert_eq!(
        ok,
        Ok(BootSource::ContainerDisk {
            image: "x".into(),
            ephemeral: true
        })
    );
}

#[test]
fn flavor_conflicts() {
    let mut p = image(Flavor::Deckhouse);
    p.boot = BootSource::ContainerDisk {
        image: "x".into(),
        ephemeral: true,
    };
    assert!(err(&p).contains("--ephemeral is KubeVirt-only"));

    let mut p = image(Flavor::KubeVirt);
    p.core_fraction = Some(CoreFraction::Percent(20));
    assert!(err(&p).contains("--core-fraction is Deckhouse-only"));

    let mut p = image(Flavor::Deckhouse);
    p.instancetype = Some(KindRef::instancetype("u1.small").unwrap());
    assert!(err(&p).contains("--instancetype is KubeVirt-only"));

    let mut p = image(Flavor::KubeVirt);
    p.instancetype = Some(KindRef::instancetype("u1.small").unwrap());
    p.validate().unwrap();
    p.memory = Some(Quantity::parse("2Gi").unwrap());
    assert!(err(&p).contains("--instancetype cannot be used with --memory"));

    let mut p = image(Flavor::Deckhouse);
    p.boot = BootSource::ClonePvc { name: "src".into() };
    assert!(err(&p).contains("--clone-pvc is KubeVirt-only"));

    let mut p = image(Flavor::KubeVirt);
    p.boot = BootSource::ContainerDisk {
        image: "cvi/ubuntu".into(),
        ephemeral: false,
    };
    assert!(err(&p).contains("docker.io/cvi/ubuntu"));

    let mut p = image(Flavor::KubeVirt);
    p.boot = BootSource::Url {
        url: "https://x/d.img".into(),
        checksums: vec![format!("streebog256:{}", "0".repeat(64)).parse().unwrap()],
    };
    assert!(err(&p).contains("streebog"));
    p.flavor = Flavor::Deckhouse;
    p.validate().unwrap();
}

#[test]
fn disk_conflicts() {
    let mut p = image(Flavor::KubeVirt);
    p.boot = BootSource::ExistingDisk {
        name: "disk1".into(),
    };
    p.disk_size = Some(Quantity::parse("1Gi").unwrap());
    assert!(err(&p).contains("--disk-size applies"));

    let mut p = image(Flavor::KubeVirt);
    p.boot = BootSource::Blank {
        size: Quantity::parse("1Gi").unwrap(),
    };
    p.disk_size = Some(Quantity::parse("1Gi").unwrap());
    assert!(err(&p).contains("--blank SIZE"));

    let mut p = image(Flavor::KubeVirt);
    p.data_disks = vec!["a=1Gi".parse().unwrap(), "a=2Gi".parse().unwrap()];
    assert!(err(&p).contains("twice"));
    p.data_disks = vec!["cloudinitdisk=1Gi".parse().unwrap()];
    assert!(err(&p).contains("reserved"));

    let mut p = image(Flavor::Deckhouse);
    p.data_disks = vec!["a=1Gi,bus=sata".parse().unwrap()];
    assert!(err(&p).contains("bus= is KubeVirt-only"));

    let mut p = image(Flavor::KubeVirt);
    p.name = "a".repeat(60);
    assert!(err(&p).contains("at most 58"));

    // Deckhouse's VirtualMachine CRD: `blockDeviceRefs` maxItems 16, the boot disk included.
    let disks = |n: usize| -> Vec<DataDisk> {
        (0..n)
            .map(|i| format!("d{i}=1Gi").parse().unwrap())
            .collect()
    };
    let mut p = image(Flavor::Deckhouse);
    p.data_disks = disks(15);
    p.validate().unwrap();
    p.data_disks = disks(16);
    assert_eq!(
        err(&p),
        "too many --data-disk: a VM on Deckhouse virtualization takes at most 16 disks including the boot disk"
    );
    let mut p = image(Flavor::KubeVirt);
    p.data_disks = disks(16);
    p.validate().unwrap();
}

#[test]
fn guest_conflicts() {
    let mut p = image(Flavor::KubeVirt);
    p.platform_ssh.ca_public_keys.clear();
    assert!(err(&p).contains("kubectl vm ca init"));
    p.platform_ssh.enabled = false;
    p.validate().unwrap();

    let mut p = image(Flavor::KubeVirt);
    p.guest.user = Some("kubevm".into());
    assert!(err(&p).contains("platform user"));
    p.guest.user = Some("Bad".into());
    assert!(err(&p).contains("not a valid user name"));

    let mut p = image(Flavor::KubeVirt);
    p.os = OsType::Windows;
    p.guest.env = vec!["A=b".parse().unwrap()];
    assert!(err(&p).contains("--env is applied by cloud-init"));

    let mut p = image(Flavor::KubeVirt);
    p.guest.ssh_keys = vec!["not-a-key".into()];
    assert!(err(&p).contains("not an OpenSSH public key"));

    let mut p = image(Flavor::KubeVirt);
    p.timezone = Some("Europe/Berlin; rm".into());
    assert!(err(&p).contains("not in the time zone database"));
    // Names from the tz database (tzdata's zone1970.tab) pass; made-up ones do not.
    for zone in ["Europe/Berlin", "America/Argentina/Buenos_Aires", "UTC"] {
        p.timezone = Some(zone.into());
        assert!(p.validate().is_ok(), "{zone}");
    }
    p.timezone = Some("Mars/Olympus".into());
    assert!(err(&p).contains("not in the time zone database"));
}

#[test]
fn run_strategy_mapping() {
    let mut p = image(Flavor::KubeVirt);
    assert_eq!(p.run_strategy(), RunStrategy::Always);
    p.stopped = true;
    assert_eq!(p.run_strategy(), RunStrategy::Halted);
    p.flavor = Flavor::Deckhouse;
    assert_eq!(p.run_strategy(), RunStrategy::Manual);
    p.run_strategy = Some(RunStrategy::Always);
    assert!(err(&p).contains("--stopped cannot be used with --run-strategy Always"));
    let map: Vec<_> = ["always", "RerunOnFailure", "manual", "Halted"]
        .iter()
        .map(|s| s.parse::<RunStrategy>().unwrap().deckhouse())
        .collect();
    assert_eq!(
        map,
        [
            "AlwaysOn",
            "AlwaysOnUnlessStoppedManually",
            "Manual",
            "AlwaysOff"
        ]
    );
    assert!("Once".parse::<RunStrategy>().is_err());
}

#[test]
fn small_parsers() {
    assert_eq!("20%".parse::<CoreFraction>(), Ok(CoreFraction::Percent(20)));
    assert_eq!("50".parse::<CoreFraction>().unwrap().to_string(), "50%");
    assert_eq!("auto".parse::<CoreFraction>().unwrap().to_string(), "Auto");
    assert!("0%".parse::<CoreFraction>().is_err());
    assert!("101%".parse::<CoreFraction>().is_err());
    assert_eq!("UEFI".parse::<Firmware>(), Ok(Firmware::Efi));
    assert_eq!("windows".parse::<OsType>(), Ok(OsType::Windows));
    let it = KindRef::instancetype("vminstancetype/my.type").unwrap();
    assert_eq!(
        (it.kind, it.name.as_str()),
        ("VirtualMachineInstancetype", "my.type")
    );
    assert_eq!(
        KindRef::preference("fedora").unwrap().kind,
        "VirtualMachineClusterPreference"
    );
    assert!(
        KindRef::preference("bogus/x")
            .unwrap_err()
            .to_string()
            .contains("unknown kind")
    );
    assert_eq!(
        ImageRef::parse("vi/ubuntu"),
        ImageRef::VirtualImage("ubuntu")
    );
    assert_eq!(
        ImageRef::parse("cvi/ubuntu"),
        ImageRef::ClusterVirtualImage("ubuntu")
    );
    assert_eq!(
        ImageRef::parse("docker.io/vi/x"),
        ImageRef::Registry("docker.io/vi/x")
    );
}

#[test]
fn infer_from_image_needs_a_data_source_and_no_sizes() {
    let ds = BootSource::ContainerDisk {
        image: "ds/os-images/fedora".into(),
        ephemeral: false,
    };
    let mut p = image(Flavor::KubeVirt);
    p.boot = ds.clone();
    p.infer_from_image = true;
    p.validate().unwrap();
    p.preference = Some(KindRef::preference("fedora").unwrap());
    p.validate().unwrap();
    p.memory = Some(Quantity::parse("2Gi").unwrap());
    assert!(err(&p).contains("--infer-from-image cannot be used with --memory"));

    let mut p = image(Flavor::KubeVirt);
    p.boot = ds;
    p.infer_from_image = true;
    p.instancetype = Some(KindRef::instancetype("u1.small").unwrap());
    assert!(err(&p).contains("--infer-from-image cannot be used with --instancetype"));

    let mut p = image(Flavor::KubeVirt);
    p.infer_from_image = true;
    assert!(err(&p).contains(
        "--infer-from-image reads the labels of a DataSource: boot from one with --image ds/[NAMESPACE/]NAME"
    ));

    let mut p = image(Flavor::Deckhouse);
    p.infer_from_image = true;
    assert!(err(&p).contains("--infer-from-image is KubeVirt-only"));
}
