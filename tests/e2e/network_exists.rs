//! The networks `create --network` and `set network --add` name must exist before anything is
//! written: on Deckhouse the `sdn` module's Network (in the VM's namespace) or ClusterNetwork
//! (cluster-scoped), and a cluster that does not serve `network.deckhouse.io` is told it needs
//! the sdn module (the VirtualMachine CRD's `spec.networks` description). One line, exit 1 (the
//! cluster's state, as a missing VirtualMachineClass or Secret).

use kubevm_emulator::{EmulatorOptions, ServeFlavor};

use crate::common::{Env, fails, ok};
use crate::set::{jsonpath, writes};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";
const DH_VM: &str = "virtualmachines.virtualization.deckhouse.io";

#[test]
fn deckhouse_networks_must_exist_before_anything_is_written() {
    let env = Env::deckhouse();
    env.emulator.clear_requests();
    let missing_network = "Error: network \"nope\" not found in namespace \"default\": create it first (a VM attaches to an existing network)";
    for (args, says) in [
        (
            &["create", "db", "--image", IMAGE, "--network", "nope"][..],
            missing_network,
        ),
        (
            &[
                "create",
                "db",
                "--image",
                IMAGE,
                "--network",
                "clusternetwork/wan",
            ],
            "Error: clusternetwork \"wan\" not found: create it first (a VM attaches to an existing network)",
        ),
        (
            &["set", "network", "linux-vm", "--add", "network/nope"],
            missing_network,
        ),
        // The fixture's ClusterNetwork corp-net is no project Network.
        (
            &["set", "network", "linux-vm", "--add", "corp-net"],
            "Error: network \"corp-net\" not found in namespace \"default\": create it first (a VM attaches to an existing network)",
        ),
    ] {
        assert_eq!(fails(&env, args, 1), says, "{args:?}");
    }
    assert!(writes(&env).is_empty(), "{:?}", writes(&env));
    assert_eq!(jsonpath(&env, DH_VM, "linux-vm", "{.spec.networks}"), "");

    // Networks that exist are attached (the fixture's user-net and corp-net).
    ok(env.vm(&[
        "create",
        "db",
        "--image",
        IMAGE,
        "--no-platform-ssh",
        "--network",
        "user-net",
        "--network",
        "clusternetwork/corp-net",
    ]));
    assert_eq!(
        jsonpath(&env, DH_VM, "db", "{.spec.networks[*].name}"),
        "user-net corp-net"
    );
}

#[test]
fn deckhouse_without_the_sdn_module_says_so() {
    // A cluster without the module has neither the group nor its objects.
    let fixture = crate::common::fixture("deckhouse.yaml");
    let without_sdn: Vec<&str> = fixture
        .split("\n---\n")
        .filter(|doc| !doc.contains("apiVersion: network.deckhouse.io/"))
        .collect();
    let env = Env::with_options(EmulatorOptions {
        fixture_yaml: vec![without_sdn.join("\n---\n")],
        flavor: ServeFlavor::Deckhouse,
        unserved_groups: vec!["network.deckhouse.io".into()],
        ..Default::default()
    });
    env.emulator.clear_requests();
    let says = "Error: the cluster serves no networks.network.deckhouse.io: additional networks (Network, ClusterNetwork) need Deckhouse's sdn module; enable it first";
    assert_eq!(
        fails(
            &env,
            &["set", "network", "linux-vm", "--add", "user-net"],
            1
        ),
        says
    );
    assert_eq!(
        fails(
            &env,
            &[
                "create",
                "db",
                "--image",
                IMAGE,
                "--network",
                "clusternetwork/corp-net"
            ],
            1
        ),
        "Error: the cluster serves no clusternetworks.network.deckhouse.io: additional networks (Network, ClusterNetwork) need Deckhouse's sdn module; enable it first"
    );
    assert!(writes(&env).is_empty(), "{:?}", writes(&env));
}
