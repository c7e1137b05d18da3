use serde_json::{Value, json};

use super::*;
use crate::create::fixtures;
use crate::flavor::Flavor;

fn plan(flavor: Flavor, networks: &[&str], ips: &[&str]) -> VmPlan {
    let mut p = fixtures::plan(flavor, fixtures::image());
    p.extras.networks = networks.iter().map(|s| s.to_string()).collect();
    p.extras.ip = ips.iter().map(|s| s.to_string()).collect();
    p
}

#[test]
fn static_addresses_parse_and_refuse_network_and_broadcast() {
    let ip = StaticIp::parse("storage=192.168.50.10/24").unwrap();
    assert_eq!(
        (ip.network.as_str(), ip.cidr()),
        ("storage", "192.168.50.10/24".into())
    );
    // A /31 (RFC 3021) and a /32 have no network or broadcast address.
    StaticIp::parse("p2p=10.0.0.0/31").unwrap();
    StaticIp::parse("p2p=10.0.0.1/31").unwrap();
    StaticIp::parse("one=10.0.0.0/32").unwrap();
    StaticIp::parse("wide=10.0.0.1/1").unwrap();
    let err = |t: &str| StaticIp::parse(t).unwrap_err();
    assert_eq!(
        err("storage=192.168.50.0/24"),
        "invalid --ip \"storage=192.168.50.0/24\": 192.168.50.0 is the network address of 192.168.50.0/24: give a host address"
    );
    assert_eq!(
        err("storage=192.168.50.255/24"),
        "invalid --ip \"storage=192.168.50.255/24\": 192.168.50.255 is the broadcast address of 192.168.50.0/24: give a host address"
    );
    assert!(err("s=10.0.0.3/30").contains("broadcast address of 10.0.0.0/30"));
    assert!(err("s=10.1.2.3/0").contains("from 1 to 32"));
    assert!(err("s=10.1.2.3/33").contains("from 1 to 32"));
    assert!(err("s=10.1.2.3/x").contains("from 1 to 32"));
    assert!(err("s=10.1.2.300/24").contains("\"10.1.2.300\" is not an IPv4 address"));
    assert!(err("s=10.1.2.3").contains("give NAME=ADDRESS/PREFIX"));
    assert!(err("=10.1.2.3/24").contains("give NAME=ADDRESS/PREFIX"));
}

#[test]
fn validation_names_a_network_of_this_create_once_and_not_on_deckhouse() {
    let ok = plan(
        Flavor::KubeVirt,
        &["storage=infra/stor"],
        &["storage=192.168.50.10/24"],
    );
    validate(&ok).unwrap();
    let err = |p: &VmPlan| validate(p).unwrap_err();
    assert_eq!(
        err(&plan(
            Flavor::KubeVirt,
            &["blue"],
            &["storage=192.168.50.10/24"]
        )),
        "--ip storage=192.168.50.10/24: \"storage\" is not a --network of this VM: add --network storage[=NAD]"
    );
    assert!(
        err(&plan(
            Flavor::KubeVirt,
            &["storage"],
            &["storage=192.168.50.10/24", "storage=192.168.50.11/24"]
        ))
        .contains("one address per network")
    );
    let mut pool = ok.clone();
    pool.replicas = Some(2);
    assert_eq!(
        err(&pool),
        "--ip is one address: it cannot be used with --replicas"
    );
    let mut windows = ok.clone();
    windows.os = OsType::Windows;
    assert!(err(&windows).contains("Linux guests apply"));
    let deckhouse = plan(
        Flavor::Deckhouse,
        &["storage"],
        &["storage=192.168.50.10/24"],
    );
    assert_eq!(
        err(&deckhouse),
        crate::platform::of(Flavor::Deckhouse)
            .secondary_static_ip
            .reason()
            .unwrap()
    );
    // The main network's address is Deckhouse's, as before, and one.
    validate(&plan(Flavor::Deckhouse, &[], &["10.66.10.20"])).unwrap();
    assert!(
        err(&plan(
            Flavor::Deckhouse,
            &[],
            &["10.66.10.20", "10.66.10.21"]
        ))
        .contains("the main network takes one address")
    );
    assert!(err(&plan(Flavor::KubeVirt, &[], &["10.66.10.20"])).starts_with("--ip is Deckhouse's"));
}

#[test]
fn mac_addresses_are_locally_administered_unicast() {
    for _ in 0..32 {
        let mac = random_mac();
        let octets: Vec<u8> = mac
            .split(':')
            .map(|o| u8::from_str_radix(o, 16).unwrap())
            .collect();
        assert_eq!(octets.len(), 6, "{mac}");
        assert_eq!(
            octets[0] & 0b11,
            0b10,
            "{mac}: locally administered, unicast"
        );
    }
    assert_ne!(random_mac(), random_mac());
}

/// The KubeVirt VM gives every interface a MAC, and its cloud-init Secret carries the user data
/// and the network data that matches those MACs (written out here from cloud-init's Networking
/// Config Version 2 documentation, not from the code).
#[test]
fn kubevirt_vm_and_secret_carry_the_network_data() {
    let p = plan(
        Flavor::KubeVirt,
        &["storage=infra/stor", "backup"],
        &["storage=192.168.50.10/24"],
    );
    let built = crate::create::build(&p).unwrap();
    let vm = built.vm();
    crate::create::schema_check::assert_valid(vm);
    let spec = &vm["spec"]["template"]["spec"];
    let mac = |name: &str| -> String {
        spec["domain"]["devices"]["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == name)
            .unwrap()["macAddress"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (default, storage, backup) = (mac("default"), mac("storage"), mac("backup"));
    assert!(default != storage && storage != backup);
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "cloudinitdisk")
        .unwrap();
    assert_eq!(
        volume["cloudInitNoCloud"],
        json!({"secretRef": {"name": "web-cloudinit"}, "networkDataSecretRef": {"name": "web-cloudinit"}})
    );
    let secret = built.objects.iter().find(|o| o.kind() == "Secret").unwrap();
    assert_eq!(secret.name(), "web-cloudinit");
    let data = &secret.object["stringData"];
    assert!(
        data["userdata"]
            .as_str()
            .unwrap()
            .starts_with("#cloud-config")
    );
    let network: Value = yaml_serde::from_str(data["networkdata"].as_str().unwrap()).unwrap();
    assert_eq!(
        network,
        json!({"version": 2, "ethernets": {
            "default": {"match": {"macaddress": default}, "dhcp4": true},
            "storage": {"match": {"macaddress": storage}, "addresses": ["192.168.50.10/24"], "dhcp4": false},
            "backup": {"match": {"macaddress": backup}, "dhcp4": true, "optional": true},
        }})
    );
}

/// Without `--ip NAME=` nothing changes: no MACs, no network data, user data inline when small.
#[test]
fn without_a_static_address_the_vm_is_as_before() {
    let mut p = plan(Flavor::KubeVirt, &["storage"], &[]);
    p.platform_ssh.enabled = false;
    let built = crate::create::build(&p).unwrap();
    let text = built.vm().to_string();
    assert!(
        !text.contains("macAddress") && !text.contains("networkData"),
        "{text}"
    );
    assert!(built.objects.iter().all(|o| o.kind() != "Secret"));
    // With it, small user data moves into the Secret with the network data.
    p.extras.ip = vec!["storage=10.1.0.5/16".into()];
    let built = crate::create::build(&p).unwrap();
    let secret = built.objects.iter().find(|o| o.kind() == "Secret").unwrap();
    assert!(secret.object["stringData"]["userdata"].is_string());
    assert!(
        secret.object["stringData"]["networkdata"]
            .as_str()
            .unwrap()
            .contains("10.1.0.5/16")
    );
}
