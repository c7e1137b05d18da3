//! `set placement` end to end: a running KubeVirt VM whose node selector changed is reported as
//! migrating (the VMI's `NodePlacementNotMatched`, mirrored on the VM) and the emulator's
//! workload updater moves it to the node the selector names (read back with real kubectl);
//! tolerations reach the running instance without a migration; a stopped VM takes the change
//! when it starts; dry runs change nothing; bad selectors and tolerations are refused before
//! any request; a concurrent edit between the read and the write is kept.

use crate::common::{Env, fails, ok, stderr, stdout};
use crate::set::{DH_VM, KV_VM, concurrent_edit_is_kept, jsonpath, requests_on, writes};

#[test]
fn kubevirt_node_selector_change_migrates_the_running_vm() {
    let env = Env::kubevirt();
    assert_eq!(jsonpath(&env, "vmi", "web", "{.status.nodeName}"), "node-1");
    env.emulator.clear_requests();
    let out = env.vm(&[
        "set",
        "placement",
        "web",
        "--node-selector",
        "kubernetes.io/hostname=node-2",
    ]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/web changed:\n  spec.template.spec.nodeSelector[kubernetes.io/hostname]: (none) → node-2\nmigrating to apply: the VMI's node no longer matches its placement (NodePlacementNotMatched) (`kubectl vm migrate list` follows it)\n",
        "{}",
        stderr(&out)
    );
    let wire = requests_on(&env, KV_VM);
    let methods: Vec<&str> = wire.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(methods, ["GET", "PUT", "GET"], "{wire:?}");
    // The instance has the selector, and the workload updater's migration moves it.
    assert_eq!(
        jsonpath(
            &env,
            "vmi",
            "web",
            "{.spec.nodeSelector.kubernetes\\.io/hostname}"
        ),
        "node-2"
    );
    ok(env.kubectl(&[
        "wait",
        "vmi/web",
        "--for=jsonpath={.status.nodeName}=node-2",
        "--timeout=60s",
    ]));
    let vmim = ok(env.kubectl(&["get", "vmim", "-o", "jsonpath={.items[*].metadata.name}"]));
    assert!(vmim.starts_with("kubevirt-workload-update-"), "{vmim}");
    ok(env.kubectl(&[
        "wait",
        &format!("vmim/{vmim}"),
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=60s",
    ]));
    // A toleration alone reaches the instance at once: nothing to move.
    let out = env.vm(&[
        "set",
        "placement",
        "web",
        "--toleration",
        "gpu=true:NoSchedule",
    ]);
    assert!(
        stdout(&out).ends_with("applied live: the platform reports no restart needed\n"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        jsonpath(
            &env,
            "vmi",
            "web",
            "{.spec.tolerations[0].key}={.spec.tolerations[0].operator}"
        ),
        "gpu=Equal"
    );
    // The priority class is not live-updatable.
    let out = env.vm(&["set", "placement", "web", "--priority-class", "high"]);
    assert!(
        stdout(&out).contains("applies at the next restart: a non-live-updatable field was changed in the template spec"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_stopped_vm_takes_the_placement_when_it_starts() {
    let env = Env::kubevirt();
    let out = env.vm(&[
        "set",
        "placement",
        "batch.dev",
        "--toleration",
        "dedicated:NoExecute",
    ]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/batch changed:\n  spec.template.spec.tolerations: (none) → [{\"effect\":\"NoExecute\",\"key\":\"dedicated\",\"operator\":\"Exists\"}]\nthe VM is not running: it takes the change when it starts\n",
        "{}",
        stderr(&out)
    );
    let env = Env::deckhouse();
    let out = env.vm(&[
        "set",
        "placement",
        "builder",
        "-n",
        "dev",
        "--node-selector",
        "disktype=ssd",
        "--priority-class",
        "high",
    ]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.virtualization.deckhouse.io/builder changed:\n  spec.nodeSelector.disktype: (none) → ssd\n  spec.priorityClassName: (none) → high\nthe VM is not running: it takes the change when it starts\n",
        "{}",
        stderr(&out)
    );
    assert_eq!(
        ok(env.kubectl(&[
            "get",
            "virtualmachines.virtualization.deckhouse.io",
            "builder",
            "-n",
            "dev",
            "-o",
            "jsonpath={.spec.nodeSelector.disktype}",
        ])),
        "ssd"
    );
}

#[test]
fn placement_dry_runs_change_nothing() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let out = env.vm(&[
        "set",
        "placement",
        "web",
        "--node-selector",
        "disktype=ssd",
        "--dry-run",
    ]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/web changed (dry run):\n  spec.template.spec.nodeSelector.disktype: (none) → ssd\nnothing was changed\n"
    );
    assert!(writes(&env).is_empty());
    let out = env.vm(&[
        "set",
        "placement",
        "web",
        "--node-selector",
        "disktype=ssd",
        "--dry-run=server",
    ]);
    assert!(
        stdout(&out).contains("changed (server dry run)"),
        "{}",
        stderr(&out)
    );
    let puts: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .collect();
    assert_eq!(puts.len(), 1);
    assert!(puts[0].query.contains("dryRun=All"), "{}", puts[0].query);
    assert_eq!(
        jsonpath(&env, "vm", "web", "{.spec.template.spec.nodeSelector}"),
        ""
    );
    let env = Env::deckhouse();
    env.emulator.clear_requests();
    let out = env.vm(&[
        "set",
        "placement",
        "linux-vm",
        "--toleration",
        "gpu:NoSchedule",
        "--dry-run",
    ]);
    assert!(
        stdout(&out).ends_with("nothing was changed\n"),
        "{}",
        stdout(&out)
    );
    assert!(writes(&env).is_empty());
    assert_eq!(
        jsonpath(
            &env,
            "virtualmachines.virtualization.deckhouse.io",
            "linux-vm",
            "{.spec.tolerations}"
        ),
        ""
    );
}

#[test]
fn bad_placement_is_refused_before_any_request() {
    for env in [Env::kubevirt(), Env::deckhouse()] {
        env.emulator.clear_requests();
        for (args, says) in [
            (
                &["set", "placement", "web", "--toleration", "gpu=true:NoRun"][..],
                "the effect must be one of NoSchedule, PreferNoSchedule, NoExecute",
            ),
            (
                &["set", "placement", "web", "--toleration", "gpu=true"],
                "use key[=value]:Effect to add or key- to remove",
            ),
            (
                &[
                    "set",
                    "placement",
                    "web",
                    "--toleration",
                    "bad key:NoSchedule",
                ],
                "invalid --toleration",
            ),
            (
                &[
                    "set",
                    "placement",
                    "web",
                    "--node-selector",
                    "disktype=not valid",
                ],
                "invalid --node-selector",
            ),
            (
                &["set", "placement", "web", "--node-selector=-bad=x"],
                "invalid --node-selector",
            ),
            (
                &["set", "placement", "web", "--node-selector", "disktype"],
                "use key=value to set or key- to remove",
            ),
            (
                &["set", "placement", "web", "--priority-class", "Not_A_Name"],
                "invalid --priority-class",
            ),
            (&["set", "placement", "web"], "nothing to change"),
        ] {
            let err = fails(&env, args, 2);
            assert!(err.contains(says), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        }
        assert!(
            env.emulator.requests().is_empty(),
            "{}",
            env.emulator.requests().len()
        );
    }
    let _ = DH_VM;
}

#[test]
fn a_concurrent_edit_during_set_placement_is_not_lost() {
    let env = Env::kubevirt();
    concurrent_edit_is_kept(
        &env,
        "vm",
        "web",
        &[
            "set",
            "placement",
            "web",
            "--node-selector",
            "disktype=ssd",
            "--no-wait",
        ],
        ("{.spec.template.spec.nodeSelector.disktype}", "ssd"),
    );
    let env = Env::deckhouse();
    concurrent_edit_is_kept(
        &env,
        "virtualmachines.virtualization.deckhouse.io",
        "linux-vm",
        &[
            "set",
            "placement",
            "linux-vm",
            "--priority-class",
            "high",
            "--no-wait",
        ],
        ("{.spec.priorityClassName}", "high"),
    );
}
