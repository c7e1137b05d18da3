//! The lifecycle commands on Deckhouse: VirtualMachineOperations as deckhouse FACTS §6/§10
//! describe them (generateName `NAME-`, `spec.type`, `spec.virtualMachineName`, `spec.force`
//! only when asked, `spec.migrate.nodeSelector`), in the VM's own namespace.

use std::time::Duration;

use kubevm_emulator::ServeFlavor;
use serde_json::{Value, json};

use crate::common::{Env, exit_code, fails, ok, on_tty, stderr, stdout};
use crate::lifecycle::{apply, changes, eventually};

const DH: &str = "virtualization.deckhouse.io";

fn vm(env: &Env, ns: &str, name: &str) -> Value {
    env.emulator
        .objects(DH, "virtualmachines", Some(ns))
        .into_iter()
        .find(|v| v["metadata"]["name"] == name)
        .unwrap()
}

fn phase(env: &Env, ns: &str, name: &str) -> String {
    vm(env, ns, name)["status"]["phase"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn ops(env: &Env, ns: &str) -> Vec<Value> {
    env.emulator
        .objects(DH, "virtualmachineoperations", Some(ns))
}

/// The one POST of a VirtualMachineOperation since the log was cleared: (path, body).
fn posted(env: &Env) -> (String, Value) {
    let posts: Vec<_> = changes(env)
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 1, "{posts:?}");
    (posts[0].path.clone(), posts[0].json().unwrap())
}

fn operation(ns: &str, vm: &str, spec: Value) -> Value {
    json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachineOperation",
        "metadata": {"generateName": format!("{vm}-"), "namespace": ns}, "spec": spec})
}

const OPS_PATH: &str =
    "/apis/virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualmachineoperations";

#[test]
fn every_operation_reaches_its_end_state() {
    let env = Env::deckhouse();
    let cases: [(&[&str], &str, Value, &str); 5] = [
        (
            &["stop", "linux-vm"],
            "stopped",
            json!({"type": "Stop", "virtualMachineName": "linux-vm"}),
            "Stopped",
        ),
        (
            &["start", "linux-vm"],
            "started",
            json!({"type": "Start", "virtualMachineName": "linux-vm"}),
            "Running",
        ),
        (
            &["restart", "linux-vm", "--force"],
            "restarted",
            json!({"type": "Restart", "virtualMachineName": "linux-vm", "force": true}),
            "Running",
        ),
        (
            &["evict", "linux-vm"],
            "evicted",
            json!({"type": "Evict", "virtualMachineName": "linux-vm"}),
            "Running",
        ),
        (
            &["migrate", "linux-vm", "--target-node", "node-1"],
            "migrated",
            json!({"type": "Migrate", "virtualMachineName": "linux-vm", "migrate": {"nodeSelector": {"kubernetes.io/hostname": "node-1"}}}),
            "Running",
        ),
    ];
    for (args, word, spec, end) in cases {
        env.emulator.clear_requests();
        let out = env.vm(args);
        assert_eq!(
            stdout(&out),
            format!("virtualmachine.virtualization.deckhouse.io/linux-vm {word}\n"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert_eq!(
            posted(&env),
            (OPS_PATH.to_owned(), operation("default", "linux-vm", spec)),
            "{args:?}"
        );
        assert_eq!(phase(&env, "default", "linux-vm"), end, "{args:?}");
        let newest = ops(&env, "default")
            .into_iter()
            .max_by_key(|o| {
                o["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
                    + o["metadata"]["resourceVersion"].as_str().unwrap_or("")
            })
            .unwrap();
        assert_eq!(newest["status"]["phase"], "Completed", "{args:?}");
        if args[0] == "evict" {
            assert_eq!(
                vm(&env, "default", "linux-vm")["status"]["nodeName"],
                "node-2"
            );
            assert!(
                stderr(&out).contains("migrated linux-vm: node-1 → node-2 in"),
                "{}",
                stderr(&out)
            );
            assert!(
                stderr(&out).contains("linux-vm: migration InProgress 50%"),
                "{}",
                stderr(&out)
            );
        }
    }
    assert_eq!(
        vm(&env, "default", "linux-vm")["status"]["nodeName"],
        "node-1"
    );
}

#[test]
fn the_vm_is_looked_up_in_the_targets_namespace() {
    // d8 v looked the VM up in the kubeconfig's namespace; NAME.NAMESPACE must work.
    let env = Env::deckhouse();
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["start", "builder.dev"])),
        "virtualmachine.virtualization.deckhouse.io/builder started\n"
    );
    let (path, body) = posted(&env);
    assert_eq!(path, OPS_PATH.replace("/default/", "/dev/"));
    assert_eq!(
        body,
        operation(
            "dev",
            "builder",
            json!({"type": "Start", "virtualMachineName": "builder"})
        )
    );
    assert_eq!(phase(&env, "dev", "builder"), "Running");
}

#[test]
fn failures_and_refusals_carry_the_platform_reason() {
    let env = Env::deckhouse();
    // Start of a running VM: the operation fails with its condition's reason and message.
    let out = env.vm(&["start", "linux-vm"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.lines()
            .last()
            .unwrap()
            .contains("(Start of linux-vm) failed: NotApplicableForVirtualMachinePhase"),
        "{err}"
    );
    // KubeVirt-only actions are refused before any request.
    env.emulator.clear_requests();
    for cmd in ["pause", "unpause", "soft-reboot", "reset"] {
        let err = fails(&env, &[cmd, "linux-vm"], 2);
        assert!(err.contains("is not supported by Deckhouse"), "{err}");
    }
    assert!(changes(&env).is_empty());
    // A migration that does not converge, and a start with no node to go to.
    apply(
        &env,
        &[
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
                "metadata": {"name": "slow", "namespace": "dev", "annotations": {"emulator.kubevm.io/migration-fail": "timeout"}},
                "spec": {"runPolicy": "AlwaysOnUnlessStoppedManually", "virtualMachineClassName": "generic", "cpu": {"cores": 1},
                         "memory": {"size": "1Gi"}, "blockDeviceRefs": [{"kind": "ClusterVirtualImage", "name": "ubuntu-24-04"}]}}),
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
                "metadata": {"name": "big", "namespace": "dev", "annotations": {"emulator.kubevm.io/unschedulable": "true"}},
                "spec": {"runPolicy": "Manual", "virtualMachineClassName": "generic", "cpu": {"cores": 1},
                         "memory": {"size": "1Gi"}, "blockDeviceRefs": [{"kind": "ClusterVirtualImage", "name": "ubuntu-24-04"}]}}),
        ],
    );
    eventually("slow running", || phase(&env, "dev", "slow") == "Running");
    let out = env.vm(&["migrate", "slow.dev"]);
    assert_eq!(out.status.code(), Some(1));
    let last = stderr(&out).lines().last().unwrap().to_owned();
    assert!(
        last.contains("(Migrate of slow) failed: NotConverging: Live migration is not completed"),
        "{last}"
    );
    // Migratable=False: refused before any operation, with the VM's own reason.
    env.emulator.clear_requests();
    let err = fails(&env, &["evict", "db.primary.prod"], 1);
    assert_eq!(
        err,
        "Error: db.primary cannot be live-migrated: NonMigratable: Live migration requires that all PVCs must be shared (using ReadWriteMany access mode)"
    );
    assert!(changes(&env).is_empty());
    let out = env.vm(&["start", "big.dev"]);
    assert_eq!(out.status.code(), Some(1));
    let last = stderr(&out).lines().last().unwrap().to_owned();
    assert!(
        last.starts_with("Error: big cannot start: PodNotStarted: 0/2 nodes are available: 2 Insufficient memory."),
        "{last}"
    );
}

#[test]
fn cancel_no_wait_dry_run_and_bulk() {
    let env = Env::with_step(
        ServeFlavor::Deckhouse,
        "deckhouse.yaml",
        Duration::from_millis(700),
    );
    let out = env.vm(&["evict", "linux-vm", "--no-wait"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.virtualization.deckhouse.io/linux-vm evict requested\n"
    );
    let op = ops(&env, "default")
        .into_iter()
        .find(|o| o["spec"]["type"] == "Evict")
        .unwrap();
    assert_ne!(
        op["status"]["phase"], "Completed",
        "returned before the end"
    );
    let name = op["metadata"]["name"].as_str().unwrap().to_owned();
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["migrate", "linux-vm", "--cancel"])),
        "virtualmachine.virtualization.deckhouse.io/linux-vm migration cancelled\n"
    );
    let deletes: Vec<_> = changes(&env)
        .into_iter()
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(
        deletes,
        [("DELETE".to_owned(), format!("{OPS_PATH}/{name}"))]
    );

    // --dry-run=server: the operation is sent with dryRun=All and not stored.
    let before = ops(&env, "default").len();
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["stop", "linux-vm", "--dry-run=server"])),
        "virtualmachine.virtualization.deckhouse.io/linux-vm stopped (server dry run)\n"
    );
    let post = changes(&env)
        .into_iter()
        .find(|r| r.method == "POST")
        .unwrap();
    assert!(post.query.contains("dryRun=All"), "{}", post.query);
    assert_eq!(ops(&env, "default").len(), before);
    assert_eq!(phase(&env, "default", "linux-vm"), "Running");

    // Bulk off a terminal without -y: refused, nothing created.
    env.emulator.clear_requests();
    let err = fails(&env, &["stop", "--all", "-A"], 2);
    assert!(err.contains("pass -y"), "{err}");
    assert!(changes(&env).is_empty());
    // -l with -y: exactly the matching VMs (linux-vm has app=web).
    let out = env.vm(&["stop", "-l", "app=web", "-A", "-y"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.virtualization.deckhouse.io/linux-vm stop requested\n",
        "{}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).lines().last(), Some("1 stop requested"));
    let stops: Vec<_> = env
        .emulator
        .objects(DH, "virtualmachineoperations", None)
        .into_iter()
        .filter(|o| o["spec"]["type"] == "Stop")
        .collect();
    assert_eq!(stops.len(), 1);
    assert_eq!(stops[0]["spec"]["virtualMachineName"], "linux-vm");
}

#[test]
fn a_terminal_shows_the_operation_progress_bar() {
    let env = Env::with_step(
        ServeFlavor::Deckhouse,
        "deckhouse.yaml",
        Duration::from_millis(400),
    );
    let mut session = on_tty(&env, &["migrate", "linux-vm"]);
    session
        .exp_regex(r"linux-vm \[=+>? *\] +(25|50|75)% InProgress")
        .unwrap();
    session
        .exp_regex("migrated linux-vm: node-1 .{1,3} node-2 in [0-9]+s")
        .unwrap();
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 0);
}
