//! `get`'s Interfaces section on both platforms with a second network: each interface's name,
//! type, MAC, IPs and state, the spec joined by name with what the running machine reports
//! (KubeVirt: the VMI's `status.interfaces`; Deckhouse: the VM's `status.networks` and
//! `status.ipAddress`), checked against those fields read back with real kubectl.

use crate::common::{Env, ok};
use crate::network::{nad, wait_migrations};
use crate::set::jsonpath;

/// The rows of `get`'s Interfaces section, cells split on runs of two spaces or more.
fn interface_rows(text: &str) -> Vec<Vec<String>> {
    let section = text
        .split("\nInterfaces:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no Interfaces section:\n{text}"));
    section
        .lines()
        .take_while(|l| l.starts_with("  "))
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .collect()
}

#[test]
fn kubevirt_get_shows_pod_and_multus_interfaces() {
    let env = Env::kubevirt();
    nad(&env, "storage");
    ok(env.vm(&["set", "network", "web", "--add", "storage"]));
    wait_migrations(&env);
    ok(env.kubectl(&[
        "wait",
        "vmi/web",
        "--for=jsonpath={.status.interfaces[1].name}=storage",
        "--timeout=60s",
    ]));
    let vmi = |path: &str| jsonpath(&env, "vmi", "web", path);
    let (pod_mac, pod_ip) = (
        vmi("{.status.interfaces[0].mac}"),
        vmi("{.status.interfaces[0].ipAddresses[0]}"),
    );
    let storage_mac = vmi("{.status.interfaces[?(@.name=='storage')].mac}");
    assert_eq!(storage_mac.len(), 17, "{storage_mac}");
    let rows = interface_rows(&ok(env.vm(&["get", "web"])));
    assert_eq!(
        rows,
        [
            vec!["NAME", "TYPE", "MAC", "IPS", "STATE"],
            vec!["default", "pod", &pod_mac, &pod_ip, "attached"],
            vec![
                "storage",
                "multus default/storage",
                &storage_mac,
                "<none>",
                "attached"
            ],
        ]
    );
}

#[test]
fn deckhouse_get_shows_main_and_additional_networks() {
    let env = Env::deckhouse();
    ok(env.vm(&[
        "set",
        "network",
        "linux-vm",
        "--add",
        "clusternetwork/corp-net",
    ]));
    let vm = |path: &str| {
        jsonpath(
            &env,
            "virtualmachines.virtualization.deckhouse.io",
            "linux-vm",
            path,
        )
    };
    let ip = vm("{.status.ipAddress}");
    let mac = vm("{.status.networks[?(@.name=='corp-net')].macAddress}");
    assert_eq!(mac.len(), 17, "{mac}");
    let rows = interface_rows(&ok(env.vm(&["get", "linux-vm"])));
    assert_eq!(
        rows,
        [
            vec!["NAME", "TYPE", "MAC", "IPS", "STATE"],
            vec!["main", "Main", "<none>", &ip, "attached"],
            vec![
                "corp-net",
                "ClusterNetwork corp-net",
                &mac,
                "<none>",
                "attached"
            ],
        ]
    );
    // Stopped, it still lists what the VM asks for, with no address.
    ok(env.vm(&["stop", "linux-vm", "--wait"]));
    let rows = interface_rows(&ok(env.vm(&["get", "linux-vm"])));
    assert_eq!(rows[2][0], "corp-net");
    assert_eq!(rows[1][3..], ["<none>", "stopped"]);
}
