//! Placement on `create` (issue 34 item 2) end to end on both platforms: the stored VM has
//! exactly the node selector, tolerations, node affinity and priority class asked for (read
//! back with real kubectl) and runs on the node they select; `--spread-by` gives a pool's
//! replicas a preferred anti-affinity on the pool label; a selector no node fits leaves the VM
//! unschedulable and `get` shows kube-scheduler's message; a running Deckhouse VM whose node
//! selector changes is moved by the workload updater's operation, and `set placement` says so.

use serde_json::{Value, json};

use crate::common::{Env, fails, ok, stderr, stdout};
use crate::set::jsonpath;

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";
const DH_VM: &str = "virtualmachines.virtualization.deckhouse.io";
const NO_FIT: &str = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.";

fn object(env: &Env, resource: &str, name: &str) -> Value {
    serde_json::from_str(&ok(env.kubectl(&["get", resource, name, "-o", "json"]))).unwrap()
}

fn placement_args(name: &str) -> Vec<&str> {
    vec![
        "create",
        name,
        "--image",
        IMAGE,
        "--no-platform-ssh",
        "--node-selector",
        "kubernetes.io/hostname=node-2",
        "--toleration",
        "gpu=true:NoSchedule",
        "--toleration",
        "dedicated:NoExecute",
        "--node-affinity",
        "kubernetes.io/hostname=node-1",
        "--node-affinity",
        "kubernetes.io/hostname=node-2",
        "--priority-class",
        "high",
    ]
}

/// What the Pod API (and the Deckhouse CRD, which keeps these names) holds for those flags.
fn expected() -> (Value, Value, Value) {
    (
        json!({"kubernetes.io/hostname": "node-2"}),
        json!([
            {"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}
        ]),
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                "values": ["node-1", "node-2"]}]}]}}}),
    )
}

#[test]
fn create_stores_exactly_the_placement_asked_for_and_runs_where_it_selects() {
    let (selector, tolerations, affinity) = expected();
    for kubevirt in [true, false] {
        let env = if kubevirt {
            Env::kubevirt()
        } else {
            Env::deckhouse()
        };
        // The client dry run shows them, and sends nothing.
        let mut dry = placement_args("placed");
        dry.extend(["--dry-run=client", "-o", "yaml"]);
        let text = ok(env.vm(&dry));
        for line in [
            "priorityClassName: high",
            "kubernetes.io/hostname: node-2",
            "effect: NoExecute",
            "operator: In",
        ] {
            assert!(text.contains(line), "{line}:\n{text}");
        }
        ok(env.vm(&placement_args("placed")));
        let (resource, spec_at) = if kubevirt {
            ("vm", "/spec/template/spec")
        } else {
            (DH_VM, "/spec")
        };
        let vm = object(&env, resource, "placed");
        let spec = vm.pointer(spec_at).unwrap();
        assert_eq!(spec["nodeSelector"], selector, "{spec}");
        assert_eq!(spec["tolerations"], tolerations, "{spec}");
        assert_eq!(spec["affinity"], affinity, "{spec}");
        assert_eq!(spec["priorityClassName"], "high", "{spec}");
        // Scheduled on the one node the selector names.
        let (running, status) = if kubevirt {
            ("vm/placed", "{.status.printableStatus}=Running")
        } else {
            (
                "virtualmachines.virtualization.deckhouse.io/placed",
                "{.status.phase}=Running",
            )
        };
        ok(env.kubectl(&[
            "wait",
            running,
            &format!("--for=jsonpath={status}"),
            "--timeout=60s",
        ]));
        let instance = if kubevirt { "vmi" } else { DH_VM };
        assert_eq!(
            jsonpath(&env, instance, "placed", "{.status.nodeName}"),
            "node-2"
        );
        let shown = ok(env.vm(&["get", "placed"]));
        for line in [
            "Node selector:  kubernetes.io/hostname=node-2\n",
            "Tolerations:    gpu=true:NoSchedule,dedicated:NoExecute\n",
            "Node affinity:  kubernetes.io/hostname in (node-1 node-2)\n",
            "Priority class: high\n",
        ] {
            assert!(shown.contains(line), "{line}:\n{shown}");
        }
        assert!(!shown.contains("Unschedulable:"), "{shown}");
    }
}

#[test]
fn spread_by_gives_a_pools_replicas_a_preferred_anti_affinity_on_the_pool() {
    let term = json!({"labelSelector": {"matchLabels": {"kubevm.io/pool": "webs"}},
        "topologyKey": "kubernetes.io/hostname"});
    let args = [
        "create",
        "webs",
        "--replicas",
        "2",
        "--image",
        IMAGE,
        "--no-platform-ssh",
        "--spread-by",
        "hostname",
    ];
    let env = Env::kubevirt();
    ok(env.vm(&args));
    let pool = object(&env, "virtualmachinepools.pool.kubevirt.io", "webs");
    assert_eq!(
        pool.pointer("/spec/virtualMachineTemplate/spec/template/spec/affinity")
            .unwrap(),
        &json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": term}]}}),
    );
    assert_eq!(
        pool.pointer("/spec/virtualMachineTemplate/spec/template/metadata/labels/kubevm.io~1pool"),
        Some(&json!("webs"))
    );

    let env = Env::deckhouse();
    ok(env.vm(&args));
    for replica in ["webs-0", "webs-1"] {
        let vm = object(&env, DH_VM, replica);
        assert_eq!(vm["metadata"]["labels"]["kubevm.io/pool"], "webs");
        assert_eq!(
            vm["spec"]["affinity"],
            json!({"virtualMachineAndPodAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "virtualMachineAndPodAffinityTerm": term}]}}),
            "{replica}"
        );
    }
    // set placement moves the spread to another topology, and removes it.
    let out = env.vm(&[
        "set",
        "placement",
        "webs-0",
        "--spread-by",
        "zone",
        "--no-wait",
    ]);
    assert!(
        stdout(&out).contains("topology.kubernetes.io/zone"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        jsonpath(
            &env,
            DH_VM,
            "webs-0",
            "{.spec.affinity.virtualMachineAndPodAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].virtualMachineAndPodAffinityTerm.topologyKey}"
        ),
        "topology.kubernetes.io/zone"
    );
    ok(env.vm(&[
        "set",
        "placement",
        "webs-0",
        "--spread-by",
        "none",
        "--no-wait",
    ]));
    assert_eq!(jsonpath(&env, DH_VM, "webs-0", "{.spec.affinity}"), "");
    // A VM in no pool has no replicas to spread from.
    let err = fails(
        &env,
        &["set", "placement", "linux-vm", "--spread-by", "hostname"],
        2,
    );
    assert!(
        err.contains("\"linux-vm\" is in none (no kubevm.io/pool label"),
        "{err}"
    );
}

#[test]
fn a_selector_no_node_fits_shows_the_schedulers_message_in_get() {
    let env = Env::kubevirt();
    ok(env.vm(&[
        "create",
        "nofit",
        "--image",
        IMAGE,
        "--no-platform-ssh",
        "--node-selector",
        "disktype=nvme",
    ]));
    ok(env.kubectl(&[
        "wait",
        "vm/nofit",
        "--for=condition=PodScheduled=False",
        "--timeout=60s",
    ]));
    // The launcher pod itself, as kube-scheduler left it.
    let pod_message = ok(env.kubectl(&[
        "get",
        "pods",
        "-l",
        "vm.kubevirt.io/name=nofit",
        "-o",
        "jsonpath={.items[0].status.conditions[?(@.type==\"PodScheduled\")].message}",
    ]));
    assert_eq!(pod_message, NO_FIT);
    let shown = ok(env.vm(&["get", "nofit"]));
    assert!(
        shown.contains(&format!("Unschedulable: {NO_FIT}\n")),
        "{shown}"
    );
    assert!(shown.contains("Node selector: disktype=nvme\n"), "{shown}");
    assert!(
        shown
            .lines()
            .any(|l| l.contains("Warning") && l.contains("FailedScheduling") && l.contains(NO_FIT)),
        "{shown}"
    );

    let env = Env::deckhouse();
    ok(env.vm(&[
        "create",
        "nofit",
        "--image",
        IMAGE,
        "--no-platform-ssh",
        "--node-affinity",
        "topology.kubernetes.io/zone=a",
    ]));
    ok(env.kubectl(&[
        "wait",
        &format!("{DH_VM}/nofit"),
        "--for=jsonpath={.status.phase}=Starting",
        "--timeout=60s",
    ]));
    let shown = ok(env.vm(&["get", "nofit"]));
    assert!(
        shown.contains(&format!("Unschedulable: {NO_FIT}\n")),
        "{shown}"
    );
    assert!(
        shown.contains("Node affinity: topology.kubernetes.io/zone in (a)\n"),
        "{shown}"
    );
}

#[test]
fn deckhouse_running_vm_is_migrated_by_the_workload_updater_after_a_selector_change() {
    let env = Env::deckhouse();
    assert_eq!(
        jsonpath(&env, DH_VM, "linux-vm", "{.status.nodeName}"),
        "node-1"
    );
    // Tolerations do not move it.
    let out = env.vm(&[
        "set",
        "placement",
        "linux-vm",
        "--toleration",
        "gpu:NoSchedule",
    ]);
    assert!(
        stdout(&out).ends_with("applied live: the platform reports no restart needed\n"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = env.vm(&[
        "set",
        "placement",
        "linux-vm",
        "--node-selector",
        "kubernetes.io/hostname=node-2",
    ]);
    let text = stdout(&out);
    let (head, verdict) = text.split_once("migrating to apply: ").unwrap_or_else(|| {
        panic!("{text}{}", stderr(&out));
    });
    assert_eq!(
        head,
        "virtualmachine.virtualization.deckhouse.io/linux-vm changed:\n  spec.nodeSelector[kubernetes.io/hostname]: (none) → node-2\n"
    );
    let op = verdict
        .strip_prefix("the workload updater's VirtualMachineOperation ")
        .and_then(|v| v.split_once(' '))
        .map(|(name, _)| name.to_owned())
        .unwrap_or_else(|| panic!("{verdict}"));
    assert!(op.starts_with("nodeplacement-update-"), "{op}");
    assert!(
        verdict.contains("(Evict) moves it to a node its placement fits"),
        "{verdict}"
    );
    // The operation the platform made, read with kubectl, and the VM on its new node.
    let vmop = format!("virtualmachineoperations.virtualization.deckhouse.io/{op}");
    assert_eq!(
        ok(env.kubectl(&["get", &vmop, "-o", "jsonpath={.spec.type} {.metadata.annotations.virtualization\\.deckhouse\\.io/workload-update}"])),
        "Evict true"
    );
    ok(env.kubectl(&[
        "wait",
        &vmop,
        "--for=jsonpath={.status.phase}=Completed",
        "--timeout=60s",
    ]));
    ok(env.kubectl(&[
        "wait",
        &format!("{DH_VM}/linux-vm"),
        "--for=jsonpath={.status.nodeName}=node-2",
        "--timeout=60s",
    ]));
}

/// Taints (kube-scheduler's TaintToleration filter): with both nodes tainted `NoSchedule`
/// (by real `kubectl taint`), a VM created without tolerations is unschedulable and `get`
/// shows the scheduler's reason per taint; one created with `--toleration` for one node's
/// taint runs on that node.
#[test]
fn a_toleration_lets_a_vm_land_on_a_tainted_node() {
    const TAINTED: &str = "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 1 node(s) had untolerated taint {maintenance: true}. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.";
    for kubevirt in [true, false] {
        let env = if kubevirt {
            Env::kubevirt()
        } else {
            Env::deckhouse()
        };
        ok(env.kubectl(&["taint", "nodes", "node-1", "maintenance=true:NoSchedule"]));
        ok(env.kubectl(&["taint", "nodes", "node-2", "dedicated=gpu:NoSchedule"]));
        let create = |name: &str, extra: &[&str]| {
            let mut args = vec!["create", name, "--image", IMAGE, "--no-platform-ssh"];
            args.extend(extra);
            ok(env.vm(&args));
        };
        create("plain", &[]);
        create("gpu", &["--toleration", "dedicated=gpu:NoSchedule"]);
        let (resource, running, pending) = if kubevirt {
            (
                "vm",
                "{.status.printableStatus}=Running",
                "{.status.printableStatus}=ErrorUnschedulable",
            )
        } else {
            (DH_VM, "{.status.phase}=Running", "{.status.phase}=Starting")
        };
        for (name, state) in [("gpu", running), ("plain", pending)] {
            ok(env.kubectl(&[
                "wait",
                &format!("{resource}/{name}"),
                &format!("--for=jsonpath={state}"),
                "--timeout=60s",
            ]));
        }
        let instance = if kubevirt { "vmi" } else { DH_VM };
        assert_eq!(
            jsonpath(&env, instance, "gpu", "{.status.nodeName}"),
            "node-2"
        );
        let shown = ok(env.vm(&["get", "gpu"]));
        assert!(!shown.contains("Unschedulable:"), "{shown}");
        let shown = ok(env.vm(&["get", "plain"]));
        assert!(
            shown.contains(&format!("Unschedulable: {TAINTED}\n")),
            "{shown}"
        );
    }
}
