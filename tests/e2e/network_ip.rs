//! `create --network NAME --ip NAME=ADDRESS/PREFIX` (KubeVirt): a secondary network's static
//! address in the guest's cloud-init network data. Read back with real kubectl: every interface
//! has a MAC, the user-data Secret's `networkdata` is the Networking Config Version 2 written
//! out here (cloud-init's documented format, matched by those MACs), and the cloud-init volume
//! names the Secret in `networkDataSecretRef` (KubeVirt reads `networkdata` from it). A client
//! dry run shows it all and makes nothing; Deckhouse refuses with its reason after discovery;
//! `network list` and `get` still show both interfaces.

use serde_json::{Value, json};

use crate::common::{Env, fails, ok, stdout};
use crate::network::nad;
use crate::set::jsonpath;

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";
const CREATE: [&str; 8] = [
    "create",
    "db",
    "--image",
    IMAGE,
    "--network",
    "storage",
    "--ip",
    "storage=192.168.50.10/24",
];

/// A locally administered unicast MAC (IEEE 802: first octet's bit 1 set, bit 0 clear).
fn assert_local_unicast(mac: &str) {
    let octets: Vec<u8> = mac
        .split(':')
        .map(|o| u8::from_str_radix(o, 16).unwrap_or_else(|_| panic!("{mac}")))
        .collect();
    assert_eq!(octets.len(), 6, "{mac}");
    assert_eq!(octets[0] & 0b11, 0b10, "{mac}");
}

/// The network data expected for MACs `default` and `storage`, from cloud-init's Networking
/// Config Version 2 reference (`ethernets`, `match.macaddress`, `dhcp4`, `addresses`).
fn expected(default: &str, storage: &str) -> Value {
    json!({
        "version": 2,
        "ethernets": {
            "default": {"match": {"macaddress": default}, "dhcp4": true},
            "storage": {"match": {"macaddress": storage}, "dhcp4": false,
                        "addresses": ["192.168.50.10/24"]},
        },
    })
}

#[test]
fn kubevirt_static_address_is_written_into_network_data() {
    let env = Env::kubevirt();
    nad(&env, "storage");

    // A client dry run shows the MACs, the Secret's network data and the reference; nothing
    // is written.
    env.emulator.clear_requests();
    let mut args = CREATE.to_vec();
    args.extend(["--dry-run=client", "-o", "yaml"]);
    let shown = ok(env.vm(&args));
    let docs: Vec<Value> = shown
        .split("\n---\n")
        .map(|d| yaml_serde::from_str(d).unwrap())
        .collect();
    let vm = docs.iter().find(|d| d["kind"] == "VirtualMachine").unwrap();
    let secret = docs.iter().find(|d| d["kind"] == "Secret").unwrap();
    let macs: Vec<&str> = vm["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["macAddress"].as_str().unwrap())
        .collect();
    let network: Value =
        yaml_serde::from_str(secret["stringData"]["networkdata"].as_str().unwrap()).unwrap();
    assert_eq!(network, expected(macs[0], macs[1]));
    assert!(
        env.emulator.requests().iter().all(|r| r.method == "GET"),
        "{:?}",
        env.emulator.requests()
    );
    assert_eq!(
        ok(env.kubectl(&["get", "vm", "db", "--ignore-not-found"])),
        ""
    );
    assert_eq!(
        ok(env.kubectl(&["get", "secret", "db-cloudinit", "--ignore-not-found"])),
        ""
    );

    let mut args = CREATE.to_vec();
    args.push("--wait");
    ok(env.vm(&args));
    let vm = |path: &str| jsonpath(&env, "vm", "db", path);
    let names = vm("{.spec.template.spec.domain.devices.interfaces[*].name}");
    assert_eq!(names, "default storage");
    let default = vm("{.spec.template.spec.domain.devices.interfaces[0].macAddress}");
    let storage = vm("{.spec.template.spec.domain.devices.interfaces[1].macAddress}");
    assert_local_unicast(&default);
    assert_local_unicast(&storage);
    assert_ne!(default, storage);
    let volume = "{.spec.template.spec.volumes[?(@.name=='cloudinitdisk')].cloudInitNoCloud";
    assert_eq!(
        vm(&format!("{volume}.networkDataSecretRef.name}}")),
        "db-cloudinit"
    );
    assert_eq!(vm(&format!("{volume}.secretRef.name}}")), "db-cloudinit");
    let data = |key: &str| {
        ok(env.kubectl(&[
            "get",
            "secret",
            "db-cloudinit",
            "-o",
            &format!("go-template={{{{index .data \"{key}\" | base64decode}}}}"),
        ]))
    };
    let network: Value = yaml_serde::from_str(&data("networkdata")).unwrap();
    assert_eq!(network, expected(&default, &storage));
    assert!(data("userdata").starts_with("#cloud-config\n"));

    // The running VM reports the interfaces with those MACs.
    ok(env.kubectl(&[
        "wait",
        "vmi/db",
        "--for=jsonpath={.status.interfaces[1].name}=storage",
        "--timeout=60s",
    ]));
    let listed = ok(env.vm(&["network", "list", "db", "-o", "wide"]));
    let rows: Vec<&str> = listed.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{listed}");
    assert!(
        rows[0].starts_with("default ") && rows[0].contains(&default),
        "{listed}"
    );
    assert!(
        rows[1].starts_with("storage ") && rows[1].contains(&storage),
        "{listed}"
    );
    let shown = ok(env.vm(&["get", "db"]));
    assert!(
        shown.contains(&default) && shown.contains(&storage),
        "{shown}"
    );
}

#[test]
fn deckhouse_refuses_a_secondary_address_with_its_reason() {
    let env = Env::deckhouse();
    env.emulator.clear_requests();
    let err = fails(
        &env,
        &[
            "create",
            "db",
            "--image",
            IMAGE,
            "--network",
            "user-net",
            "--ip",
            "user-net=192.168.50.10/24",
        ],
        2,
    );
    assert_eq!(
        err,
        "Error: --ip NAME=ADDRESS/PREFIX is KubeVirt's (cloud-init network data): on Deckhouse an additional network's address comes from the network's IPAM pool (an sdn IPAddress named in spec.networks[].ipAddressName) or is configured inside the guest, and kubectl vm cannot set it there"
    );
    let requests: Vec<String> = env
        .emulator
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(requests, ["GET /apis"]);
    let out = env.kubectl(&["get", "secrets", "-o", "name"]);
    assert!(!stdout(&out).contains("db-cloudinit"));
}

#[test]
fn bad_addresses_are_refused_before_any_request() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let base = ["create", "db", "--image", IMAGE, "--network", "storage"];
    let cases: [(&[&str], &str); 6] = [
        (
            &["--ip", "storage=192.168.50.0/24"],
            "Error: invalid --ip \"storage=192.168.50.0/24\": 192.168.50.0 is the network address of 192.168.50.0/24: give a host address",
        ),
        (
            &["--ip", "storage=192.168.50.255/24"],
            "Error: invalid --ip \"storage=192.168.50.255/24\": 192.168.50.255 is the broadcast address of 192.168.50.0/24: give a host address",
        ),
        (
            &["--ip", "storage=192.168.50.10"],
            "Error: invalid --ip \"storage=192.168.50.10\": give NAME=ADDRESS/PREFIX, e.g. storage=192.168.50.10/24",
        ),
        (
            &["--ip", "storage=192.168.50.10/33"],
            "Error: invalid --ip \"storage=192.168.50.10/33\": the prefix length must be a number from 1 to 32",
        ),
        (
            &["--ip", "backup=192.168.50.10/24"],
            "Error: --ip backup=192.168.50.10/24: \"backup\" is not a --network of this VM: add --network backup[=NAD]",
        ),
        (
            &["--ip", "storage=10.0.0.1/24", "--ip", "storage=10.0.0.2/24"],
            "Error: --ip storage=10.0.0.2/24: network \"storage\" has an address already: one address per network",
        ),
    ];
    for (extra, says) in cases {
        let mut args = base.to_vec();
        args.extend(extra);
        assert_eq!(fails(&env, &args, 2), says, "{args:?}");
    }
    let mut args = base.to_vec();
    args.extend(["--ip", "storage=10.0.0.1/24", "--replicas", "2"]);
    assert_eq!(
        fails(&env, &args, 2),
        "Error: --ip is one address: it cannot be used with --replicas"
    );
    assert!(env.emulator.requests().is_empty());
}

/// The interface MACs of VM `name` (default, storage) and the network data of its Secret.
fn macs_and_network_data(env: &Env, name: &str) -> ((String, String), Value) {
    let vm = |path: &str| jsonpath(env, "vm", name, path);
    let macs = (
        vm("{.spec.template.spec.domain.devices.interfaces[?(@.name=='default')].macAddress}"),
        vm("{.spec.template.spec.domain.devices.interfaces[?(@.name=='storage')].macAddress}"),
    );
    let volume = "{.spec.template.spec.volumes[?(@.name=='cloudinitdisk')].cloudInitNoCloud";
    let secret = vm(&format!("{volume}.networkDataSecretRef.name}}"));
    assert_eq!(
        secret,
        format!("{name}-cloudinit"),
        "{name} names its own Secret"
    );
    assert_eq!(vm(&format!("{volume}.secretRef.name}}")), secret);
    let text = ok(env.kubectl(&[
        "get",
        "secret",
        &secret,
        "-o",
        "go-template={{index .data \"networkdata\" | base64decode}}",
    ]));
    (macs, yaml_serde::from_str(&text).unwrap())
}

/// A clone and a restore as a new VM of a VM with a static address get MACs of their own
/// (KubeVirt's clone through `newMacAddresses`; a restore copies the spec, so kubectl vm sets
/// them) and network data matching them in their own Secret; the source keeps its own.
#[test]
fn kubevirt_copies_get_macs_and_network_data_of_their_own() {
    let env = Env::kubevirt();
    let _signer = crate::signer::start_signer(&env, &[]);
    nad(&env, "storage");
    crate::ssh::vm_with_ca(&env, "db", &CREATE[2..]);
    let (db_macs, db_network) = macs_and_network_data(&env, "db");
    assert_eq!(db_network, expected(&db_macs.0, &db_macs.1));

    ok(env.vm(&["clone", "db", "dst"]));
    ok(env.vm(&["stop", "db", "--wait"]));
    ok(env.vm(&["snapshot", "create", "db", "s1"]));
    ok(env.vm(&["snapshot", "restore", "s1", "--new-vm", "copy"]));
    for copy in ["dst", "copy"] {
        let (macs, network) = macs_and_network_data(&env, copy);
        for mac in [&macs.0, &macs.1] {
            assert_local_unicast(mac);
            assert!(
                *mac != db_macs.0 && *mac != db_macs.1,
                "{copy} has {mac}, a MAC of db {db_macs:?}"
            );
        }
        assert_ne!(macs.0, macs.1);
        assert_eq!(network, expected(&macs.0, &macs.1), "{copy}");
    }
    // The source is as it was.
    let (after, network) = macs_and_network_data(&env, "db");
    assert_eq!(
        (after, network),
        (db_macs.clone(), expected(&db_macs.0, &db_macs.1))
    );
}
