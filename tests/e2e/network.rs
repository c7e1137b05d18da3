//! `network list` and `set network` end to end on both platforms: a KubeVirt bridge interface
//! on a Multus NetworkAttachmentDefinition is hot-plugged under LiveUpdate by a workload-update
//! migration and unplugged through `state: absent` (read back with real kubectl), waits for a
//! restart under another rollout strategy, and is refused when its NAD is missing; a Deckhouse
//! additional network applies without a restart and shows in `status.networks`; dry runs
//! change nothing; bad names are refused before any request.

use crate::common::{Env, fails, ok, stderr, stdout};
use crate::set::{DH_VM, KV_VM, jsonpath, requests_on, writes};

pub(crate) fn nad(env: &Env, name: &str) {
    let path = env.dir.path().join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  config: '{{\"cniVersion\": \"0.3.1\", \"type\": \"bridge\", \"bridge\": \"br1\"}}'\n"
        ),
    )
    .unwrap();
    ok(env.kubectl(&["apply", "-f", path.to_str().unwrap()]));
}

/// The rows of `network list` as (NAME, NETWORK, STATE), the columns split on runs of spaces.
fn rows(env: &Env, vm: &str) -> Vec<(String, String, String)> {
    let out = env.vm(&["network", "list", vm, "--no-headers"]);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| {
            let cols: Vec<&str> = l
                .split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect();
            (
                cols[0].to_owned(),
                cols[1].to_owned(),
                cols.last().unwrap().to_string(),
            )
        })
        .collect()
}

fn row(name: &str, network: &str, state: &str) -> (String, String, String) {
    (name.into(), network.into(), state.into())
}

pub(crate) fn wait_migrations(env: &Env) {
    ok(env.kubectl(&[
        "wait",
        "vmim",
        "--all",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=60s",
    ]));
}

#[test]
fn kubevirt_interface_hotplug_and_unplug_under_live_update() {
    let env = Env::kubevirt();
    assert_eq!(rows(&env, "web"), [row("default", "pod", "attached")]);
    let mac = jsonpath(&env, "vmi", "web", "{.status.interfaces[0].mac}");
    let table = stdout(&env.vm(&["network", "list", "web", "-o", "wide"]));
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.contains("masquerade") && table.contains(&mac),
        "{table}"
    );

    nad(&env, "storage");
    env.emulator.clear_requests();
    let out = env.vm(&["set", "network", "web", "--add", "storage"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/web changed:\n  spec.template.spec.domain.devices.interfaces: [{\"masquerade\":{},\"name\":\"default\"}] → [{\"masquerade\":{},\"name\":\"default\"},{\"bridge\":{},\"name\":\"storage\"}]\n  spec.template.spec.networks: [{\"name\":\"default\",\"pod\":{}}] → [{\"name\":\"default\",\"pod\":{}},{\"multus\":{\"networkName\":\"storage\"},\"name\":\"storage\"}]\nmigrating to apply: KubeVirt is plugging storage by a live migration of the VMI (the VMI's MigrationRequired condition) (`kubectl vm migrate list` follows it)\n",
        "{}",
        stderr(&out)
    );
    let methods: Vec<String> = requests_on(&env, KV_VM)
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    assert_eq!(methods, ["GET", "PUT", "GET"]);
    wait_migrations(&env);
    ok(env.kubectl(&[
        "wait",
        "vmi/web",
        "--for=jsonpath={.status.interfaces[1].name}=storage",
        "--timeout=60s",
    ]));
    assert_eq!(
        rows(&env, "web"),
        [
            row("default", "pod", "attached"),
            row("storage", "multus default/storage", "attached")
        ]
    );
    assert_eq!(
        jsonpath(
            &env,
            "vm",
            "web",
            "{.status.conditions[?(@.type=='RestartRequired')].status}"
        ),
        ""
    );

    // Unplug: the running VM's interface is marked absent; the next migration removes it.
    let out = env.vm(&["set", "network", "web", "--remove", "storage"]);
    assert!(
        stdout(&out).contains("  spec.template.spec.domain.devices.interfaces: ")
            && stdout(&out).ends_with("migrating to apply: KubeVirt is unplugging storage by a live migration of the VMI (the VMI's MigrationRequired condition) (`kubectl vm migrate list` follows it)\n"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        jsonpath(
            &env,
            "vm",
            "web",
            "{.spec.template.spec.domain.devices.interfaces[1].state}"
        ),
        "absent"
    );
    wait_migrations(&env);
    ok(env.kubectl(&[
        "wait",
        "vmi/web",
        "--for=jsonpath={.status.interfaces[0].name}=default",
        "--timeout=60s",
    ]));
    assert_eq!(
        rows(&env, "web"),
        [
            row("default", "pod", "attached"),
            row("storage", "multus default/storage", "detached")
        ]
    );
    let shown = stdout(&env.vm(&["get", "web"]));
    assert!(shown.contains("Interfaces:"), "{shown}");
}

#[test]
fn kubevirt_without_live_update_waits_for_a_restart_and_needs_the_nad() {
    let env = Env::kubevirt();
    ok(env.kubectl(&[
        "patch",
        "kubevirt",
        "kubevirt",
        "-n",
        "kubevirt",
        "--type",
        "merge",
        "-p",
        "{\"spec\":{\"configuration\":{\"vmRolloutStrategy\":\"Stage\"}}}",
    ]));
    env.emulator.clear_requests();
    // The cluster's state, not bad input: exit 1, like a missing VirtualMachineClass.
    let err = fails(
        &env,
        &["set", "network", "web", "--add", "backup=infra/backup-net"],
        1,
    );
    assert_eq!(
        err,
        "Error: networkattachmentdefinition \"backup-net\" not found in namespace \"infra\": create it first (a VM attaches to an existing network)"
    );
    assert!(writes(&env).is_empty(), "{:?}", writes(&env));
    nad(&env, "storage");
    let out = env.vm(&["set", "network", "web", "--add", "storage"]);
    assert!(
        stdout(&out).ends_with("applies at the next restart: a non-live-updatable field was changed in the template spec (`kubectl vm restart web.default`, or pass --restart)\n"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        rows(&env, "web"),
        [
            row("default", "pod", "attached"),
            row("storage", "multus default/storage", "plugging")
        ]
    );
    assert_eq!(
        jsonpath(&env, "vmi", "web", "{.spec.networks[*].name}"),
        "default"
    );
}

#[test]
fn deckhouse_additional_networks_apply_without_a_restart() {
    let env = Env::deckhouse();
    assert_eq!(rows(&env, "linux-vm"), [row("main", "Main", "attached")]);
    env.emulator.clear_requests();
    let out = env.vm(&[
        "set",
        "network",
        "linux-vm",
        "--add",
        "user-net",
        "--add",
        "clusternetwork/corp-net",
    ]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.virtualization.deckhouse.io/linux-vm changed:\n  spec.networks: (none) → [{\"type\":\"Main\"},{\"name\":\"user-net\",\"type\":\"Network\"},{\"name\":\"corp-net\",\"type\":\"ClusterNetwork\"}]\napplied live: the platform reports no restart needed\n",
        "{}",
        stderr(&out)
    );
    let methods: Vec<String> = requests_on(&env, DH_VM)
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    assert_eq!(methods[..2], ["GET", "PUT"]);
    assert_eq!(
        rows(&env, "linux-vm"),
        [
            row("main", "Main", "attached"),
            row("user-net", "Network user-net", "attached"),
            row("corp-net", "ClusterNetwork corp-net", "attached"),
        ]
    );
    let mac = jsonpath(
        &env,
        "virtualmachines.virtualization.deckhouse.io",
        "linux-vm",
        "{.status.networks[1].macAddress}",
    );
    assert_eq!(mac.len(), 17, "{mac}");
    let out = env.vm(&["set", "network", "linux-vm", "--remove", "user-net"]);
    assert!(
        stdout(&out).ends_with("applied live: the platform reports no restart needed\n"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        rows(&env, "linux-vm"),
        [
            row("main", "Main", "attached"),
            row("corp-net", "ClusterNetwork corp-net", "attached")
        ]
    );
    let err = fails(
        &env,
        &["set", "network", "linux-vm", "--remove", "user-net"],
        2,
    );
    assert_eq!(
        err,
        "Error: virtualmachine \"linux-vm\": is not attached to a network named \"user-net\""
    );
}

#[test]
fn dry_runs_change_nothing_and_bad_names_send_nothing() {
    let env = Env::kubevirt();
    nad(&env, "storage");
    env.emulator.clear_requests();
    let out = env.vm(&["set", "network", "web", "--add", "storage", "--dry-run"]);
    assert!(
        stdout(&out).ends_with("nothing was changed\n"),
        "{}",
        stderr(&out)
    );
    assert!(writes(&env).is_empty(), "{:?}", writes(&env));
    let out = env.vm(&[
        "set",
        "network",
        "web",
        "--add",
        "storage",
        "--dry-run=server",
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let written: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        written["spec"]["template"]["spec"]["networks"][1]["multus"]["networkName"],
        "storage"
    );
    assert_eq!(
        jsonpath(&env, "vm", "web", "{.spec.template.spec.networks[*].name}"),
        "default"
    );
    env.emulator.clear_requests();
    for (args, says) in [
        (
            &["set", "network", "web"][..],
            "nothing to change: give --add NAME[=NETWORK] or --remove NAME",
        ),
        (
            &["set", "network", "web", "--add", "=storage"],
            "invalid --add \"=storage\": use NAME[=NETWORK]",
        ),
        (&["network", "list", "Bad_Name!"], "invalid target"),
    ] {
        let err = fails(&env, args, 2);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert!(env.emulator.requests().is_empty());
    let err = fails(&env, &["set", "network", "web", "--remove", "default"], 2);
    assert_eq!(
        err,
        "Error: virtualmachine \"web\": \"default\" is its pod network (the primary interface), not a secondary network"
    );
    let env = Env::deckhouse();
    env.emulator.clear_requests();
    let err = fails(&env, &["set", "network", "linux-vm", "--add", "a=b"], 2);
    assert!(
        err.contains("a Deckhouse VM attaches a network by its name"),
        "{err}"
    );
    assert!(requests_on(&env, DH_VM).is_empty());
}

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";
const VMIP: &str = "virtualmachineipaddresses.virtualization.deckhouse.io";

#[test]
fn deckhouse_fixed_ip_is_attached_and_kept_with_keep_ip() {
    let env = Env::deckhouse();
    ok(env.vm(&[
        "create",
        "db",
        "--image",
        IMAGE,
        "--no-platform-ssh",
        "--ip",
        "10.66.20.77",
        "--network",
        "user-net",
    ]));
    assert_eq!(
        jsonpath(&env, VMIP, "db-ip", "{.spec.type} {.spec.staticIP}"),
        "Static 10.66.20.77"
    );
    ok(env.kubectl(&[
        "wait",
        "vmip/db-ip",
        "--for=jsonpath={.status.phase}=Attached",
        "--timeout=60s",
    ]));
    assert_eq!(
        jsonpath(
            &env,
            VMIP,
            "db-ip",
            "{.status.address} {.status.virtualMachineName}"
        ),
        "10.66.20.77 db"
    );
    ok(env.kubectl(&[
        "wait",
        "virtualmachines.virtualization.deckhouse.io/db",
        "--for=jsonpath={.status.ipAddress}=10.66.20.77",
        "--timeout=60s",
    ]));
    assert_eq!(
        jsonpath(
            &env,
            "virtualmachines.virtualization.deckhouse.io",
            "db",
            "{.spec.networks[1].name}"
        ),
        "user-net"
    );
    let out = ok(env.vm(&["delete", "db", "--keep-ip", "-y"]));
    assert!(
        out.contains("virtualmachineipaddress.virtualization.deckhouse.io \"db-ip\" kept\n"),
        "{out}"
    );
    ok(env.kubectl(&[
        "wait",
        "vmip/db-ip",
        "--for=jsonpath={.status.phase}=Bound",
        "--timeout=60s",
    ]));
    // Created again under the same name, the VM reuses the kept address.
    ok(env.vm(&[
        "create",
        "db",
        "--image",
        IMAGE,
        "--no-platform-ssh",
        "--ip",
        "10.66.20.77",
    ]));
    ok(env.kubectl(&[
        "wait",
        "vmip/db-ip",
        "--for=jsonpath={.status.phase}=Attached",
        "--timeout=60s",
    ]));
    let out = ok(env.vm(&["delete", "db", "-y"]));
    assert!(
        out.contains("virtualmachineipaddress.virtualization.deckhouse.io \"db-ip\" deleted\n"),
        "{out}"
    );
    assert_eq!(ok(env.kubectl(&["get", "vmip", "-o", "name"])), "");

    // KubeVirt has no such object: refused before any request, with the reason.
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let err = fails(
        &env,
        &["create", "db", "--image", IMAGE, "--ip", "10.0.0.5"],
        2,
    );
    assert!(err.contains("--ip is Deckhouse's"), "{err}");
    let err = fails(
        &env,
        &["create", "db", "--image", IMAGE, "--network", "nope"],
        1,
    );
    assert_eq!(
        err,
        "Error: networkattachmentdefinition \"nope\" not found in namespace \"default\": create it first (a VM attaches to an existing network)"
    );
    assert!(writes(&env).is_empty(), "{:?}", writes(&env));
}
