use super::*;
use crate::create::fixtures;
use crate::flavor::Flavor;

fn plan(flavor: Flavor) -> VmPlan {
    fixtures::plan(flavor, fixtures::image())
}

fn err(plan: &VmPlan) -> String {
    let e = plan.validate().unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    e
}

#[test]
fn uuid_v4_follows_rfc_9562() {
    // Printed by `uuidgen -r` (util-linux) and `python3 -c 'import uuid; print(uuid.uuid4())'`.
    for good in [
        "0f8fad5b-d9cb-469f-a165-70867728950e",
        "7C9E6679-7425-40DE-944B-E07FC1F90AE7",
    ] {
        assert!(is_uuid_v4(good), "{good}");
    }
    for bad in [
        // Version 1 (time based), from `uuidgen -t`.
        "c232ab00-9414-11ec-b3c8-9f6bdeced846",
        // Version 4 digit but the NCS variant (0xxx).
        "0f8fad5b-d9cb-469f-0165-70867728950e",
        "0f8fad5bd9cb469fa16570867728950e",
        "0f8fad5b-d9cb-469f-a165-70867728950",
        "0f8fad5b-d9cb-469f-a165-70867728950g",
        "",
    ] {
        assert!(!is_uuid_v4(bad), "{bad}");
    }
}

#[test]
fn access_credentials_parse() {
    let c: AccessCredential = "team-keys:ubuntu,ops".parse().unwrap();
    assert_eq!(c.secret, "team-keys");
    assert_eq!(c.users, ["ubuntu", "ops"]);
    assert_eq!(c.method, DeliveryMethod::QemuGuestAgent);
    let c: AccessCredential = "k:root:configDrive".parse().unwrap();
    assert_eq!(c.method, DeliveryMethod::ConfigDrive);
    for bad in ["k", ":u", "k:u:ssh", "k:u:configDrive:x"] {
        assert!(bad.parse::<AccessCredential>().is_err(), "{bad}");
    }
}

#[test]
fn topology_derives_cores_from_cpu() {
    let mut p = plan(Flavor::KubeVirt);
    assert_eq!(p.topology(), None);
    p.cpu = Some(12);
    p.extras.sockets = Some(2);
    p.extras.threads = Some(2);
    assert_eq!(
        p.topology(),
        Some(Topology {
            sockets: 2,
            cores: 3,
            threads: 2
        })
    );
    p.validate().unwrap();
    // Without --cpu the VM gets sockets × threads vCPUs.
    p.cpu = None;
    assert_eq!(p.topology().unwrap().cores, 1);
    p.validate().unwrap();
    p.cpu = Some(5);
    assert!(err(&p).contains("--cpu 5 cannot be split into 2 sockets × 2 threads"));
}

#[test]
fn seed_limits_are_enforced() {
    let mut p = plan(Flavor::KubeVirt);
    p.extras.sockets = Some(33);
    assert!(err(&p).contains("--sockets 33 is out of range: give 1 to 32"));
    p.extras.sockets = Some(32);
    p.cpu = Some(32);
    p.validate().unwrap();
    p.extras.threads = Some(9);
    assert!(err(&p).contains("--threads 9 is out of range: give 1 to 8"));

    let mut p = plan(Flavor::KubeVirt);
    p.extras.ssh_key_secrets = (0..9).map(|i| format!("keys-{i}")).collect();
    assert!(err(&p).contains("given 9 times: at most 8 Secrets"));
    p.extras.ssh_key_secrets.pop();
    p.validate().unwrap();

    let mut p = plan(Flavor::KubeVirt);
    let users: Vec<String> = (0..17).map(|i| format!("u{i}")).collect();
    p.extras.access_credentials = vec![AccessCredential {
        secret: "team".into(),
        users: users.clone(),
        method: DeliveryMethod::QemuGuestAgent,
    }];
    assert!(err(&p).contains("17 users; give 1 to 16"));
    p.extras.access_credentials[0].users.pop();
    p.validate().unwrap();
    p.extras.access_credentials[0].users.clear();
    assert!(err(&p).contains("0 users"));

    let mut p = plan(Flavor::KubeVirt);
    p.extras.uuid = Some("c232ab00-9414-11ec-b3c8-9f6bdeced846".into());
    assert!(err(&p).contains("not a version 4 UUID"));

    let mut p = plan(Flavor::KubeVirt);
    p.extras.subdomain = Some("Web_Tier".into());
    assert!(err(&p).contains("--subdomain \"Web_Tier\" is not valid"));
    p.extras.subdomain = Some("a".repeat(64));
    assert!(err(&p).contains("at most 63"));
}

#[test]
fn secure_boot_needs_persistent_efi() {
    let mut p = plan(Flavor::KubeVirt);
    p.extras.secure_boot = true;
    assert!(err(&p).contains("needs persistent EFI NVRAM (--persistent-efi)"));
    p.extras.persistent_efi = true;
    p.validate().unwrap();
    p.firmware = Some(crate::create::plan::Firmware::Bios);
    assert!(err(&p).contains("--secure-boot needs UEFI"));
    let mut d = plan(Flavor::Deckhouse);
    d.extras.secure_boot = true;
    d.extras.persistent_efi = true;
    assert!(err(&d).contains("loses its boot state on reboot"));
}

#[test]
fn deckhouse_says_where_it_has_no_field() {
    for (set, flag) in [
        (
            (|p: &mut VmPlan| p.extras.sockets = Some(2)) as fn(&mut VmPlan),
            "--sockets",
        ),
        (|p| p.extras.threads = Some(2), "--threads"),
        (
            |p| p.extras.uuid = Some("0f8fad5b-d9cb-469f-a165-70867728950e".into()),
            "--uuid",
        ),
        (|p| p.extras.serial = Some("SN1".into()), "--serial"),
        (|p| p.extras.subdomain = Some("tier".into()), "--subdomain"),
    ] {
        let mut d = plan(Flavor::Deckhouse);
        set(&mut d);
        let e = err(&d);
        assert!(e.contains(flag) && e.contains("KubeVirt-only"), "{e}");
        let mut k = plan(Flavor::KubeVirt);
        set(&mut k);
        k.cpu = Some(4);
        k.validate().unwrap();
    }
}

#[test]
fn user_data_sources_are_exclusive() {
    let mut p = plan(Flavor::KubeVirt);
    p.extras.user_data_secret = Some("my-ud".into());
    p.validate().unwrap();
    p.guest.user_data = Some("#cloud-config\n".into());
    assert!(err(&p).contains("--cloud-init and --user-data-secret cannot be used together"));
    // Once read from the Secret, the text is the Secret's.
    p.guest.user_data_from_secret = true;
    p.validate().unwrap();
    p.extras.user_data_secret = Some("web-cloudinit".into());
    assert!(err(&p).contains("the Secret kubectl vm writes"));
}

#[test]
fn keys_are_every_line_of_every_key() {
    let data = vec![
        (
            "a".to_string(),
            b"ssh-ed25519 AAAA one\n\n# note\n".to_vec(),
        ),
        (
            "b".to_string(),
            b"ssh-rsa BBBB two\r\nssh-ed25519 CCCC three".to_vec(),
        ),
    ];
    assert_eq!(
        keys_in_secret(&data),
        [
            "ssh-ed25519 AAAA one",
            "ssh-rsa BBBB two",
            "ssh-ed25519 CCCC three"
        ]
    );
}

#[test]
fn windows_takes_no_key_secrets() {
    let mut p = plan(Flavor::KubeVirt);
    p.os = crate::create::plan::OsType::Windows;
    p.platform_ssh.enabled = false;
    p.extras.ssh_key_secrets = vec!["k".into()];
    assert!(err(&p).contains("--ssh-key-secret is applied on Linux guests"));
}
