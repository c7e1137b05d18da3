//! `set resources` and `set policy` end to end on both platforms: the change is one GET and one
//! PUT of the VM carrying its resourceVersion; what applies live and what waits for a restart
//! is what the platform reports (KubeVirt `RestartRequired`, Deckhouse
//! `AwaitingRestartToApplyConfiguration` / `status.restartAwaitingChanges`), read back with real
//! kubectl; a concurrent edit between the read and the write is kept; bad input is refused
//! before any request; dry runs change nothing.

use serde_json::Value;

use crate::common::{Env, fails, ok, stderr, stdout};

pub(crate) const KV_VM: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/web";
pub(crate) const DH_VM: &str =
    "/apis/virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualmachines/linux-vm";

pub(crate) fn jsonpath(env: &Env, resource: &str, name: &str, path: &str) -> String {
    let expr = format!("jsonpath={path}");
    ok(env.kubectl(&["get", resource, name, "-o", &expr]))
}

/// (method, query) of the requests on `path` since the log was cleared.
pub(crate) fn requests_on(env: &Env, path: &str) -> Vec<(String, String)> {
    env.emulator
        .requests()
        .into_iter()
        .filter(|r| {
            r.path == path
                || r.path == path.rsplit_once('/').unwrap().0 && r.query.contains("watch")
        })
        .map(|r| (r.method, r.query))
        .collect()
}

pub(crate) fn writes(env: &Env) -> Vec<(String, String)> {
    env.emulator
        .requests()
        .into_iter()
        .filter(|r| !matches!(r.method.as_str(), "GET" | "HEAD"))
        .map(|r| (r.method, r.path))
        .collect()
}

fn until_held(env: &Env, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while env.emulator.held() < n {
        assert!(
            std::time::Instant::now() < deadline,
            "never held {n} requests"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn kubevirt_resources_live_within_the_headroom_then_at_restart() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let out = env.vm(&["set", "resources", "web", "--cpu", "4", "--memory", "4Gi"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/web changed:\n  spec.template.spec.domain.cpu.sockets: (none) → 2\n  spec.template.spec.domain.memory.guest: 2Gi → 4Gi\napplied live: the platform reports no restart needed\n",
        "{}",
        stderr(&out)
    );
    // One GET and one PUT of the VM (then a watch for the controller's verdict).
    let wire = requests_on(&env, KV_VM);
    let methods: Vec<&str> = wire.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(methods, ["GET", "PUT", "GET"], "{wire:?}");
    assert!(wire[2].1.contains("watch=true"), "{wire:?}");
    // The running instance has them (kubectl reads the VMI).
    assert_eq!(
        jsonpath(&env, "vmi", "web", "{.spec.domain.cpu.sockets}"),
        "2"
    );
    assert_eq!(
        jsonpath(&env, "vmi", "web", "{.status.memory.guestCurrent}"),
        "4Gi"
    );
    // Beyond maxGuest (4 × 2Gi): KubeVirt's own message, the VM waits for a restart.
    let out = env.vm(&["set", "resources", "web", "--memory", "16Gi"]);
    assert!(
        stdout(&out).ends_with("applies at the next restart: memory updated in template spec to a value higher than what's available (`kubectl vm restart web.default`, or pass --restart)\n"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        jsonpath(
            &env,
            "vm",
            "web",
            "{.status.conditions[?(@.type=='RestartRequired')].status}"
        ),
        "True"
    );
    // --restart applies what waits, even when this run has nothing new to write: the new
    // instance boots with 16Gi.
    let out = env.vm(&["set", "resources", "web", "--memory", "16Gi", "--restart"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/web unchanged\nrestarted to apply it: the platform reports nothing left waiting\n",
        "{}",
        stderr(&out)
    );
    assert_eq!(
        jsonpath(&env, "vmi", "web", "{.status.memory.guestAtBoot}"),
        "16Gi"
    );
    // Less than it booted with waits too; --restart in the same run.
    let out = env.vm(&["set", "resources", "web", "--memory", "12Gi", "--restart"]);
    assert!(
        stdout(&out)
            .ends_with("restarted to apply it: the platform reports nothing left waiting\n"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(
        jsonpath(&env, "vmi", "web", "{.status.memory.guestAtBoot}"),
        "12Gi"
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
}

#[test]
fn deckhouse_resources_wait_for_a_restart_and_respect_the_class() {
    let env = Env::deckhouse();
    let out = env.vm(&[
        "set",
        "resources",
        "linux-vm",
        "--cpu",
        "2",
        "--memory",
        "2Gi",
    ]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.virtualization.deckhouse.io/linux-vm changed:\n  spec.cpu.cores: 1 → 2\n  spec.memory.size: 1Gi → 2Gi\napplies at the next restart: Waiting for the user to restart in order to apply the configuration changes. [cpu.cores, memory.size] (`kubectl vm restart linux-vm.default`, or pass --restart)\n",
        "{}",
        stderr(&out)
    );
    assert_eq!(
        jsonpath(
            &env,
            "virtualmachines.virtualization.deckhouse.io",
            "linux-vm",
            "{.status.restartAwaitingChanges[*].path}"
        ),
        "cpu.cores memory.size"
    );
    // The class's sizing policy (5-8 cores: 5Gi-16Gi, fractions from 20%) refuses 6 cores
    // with 2Gi at 10%, in Deckhouse's words, and nothing is written.
    env.emulator.clear_requests();
    let err = fails(&env, &["set", "resources", "linux-vm", "--cpu", "6"], 2);
    assert!(
        err.contains("does not match the sizing policy of VirtualMachineClass \"generic\""),
        "{err}"
    );
    assert!(writes(&env).is_empty(), "{:?}", writes(&env));
    // --restart: the operation restarts it and the machine runs with 2 cores.
    let out = env.vm(&[
        "set",
        "resources",
        "linux-vm",
        "--core-fraction",
        "20%",
        "--restart",
    ]);
    assert!(
        stdout(&out)
            .ends_with("restarted to apply it: the platform reports nothing left waiting\n"),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let vm = "virtualmachines.virtualization.deckhouse.io";
    assert_eq!(
        jsonpath(&env, vm, "linux-vm", "{.status.resources.cpu.cores}"),
        "2"
    );
    assert_eq!(
        jsonpath(&env, vm, "linux-vm", "{.status.resources.cpu.coreFraction}"),
        "20%"
    );
    assert_eq!(
        jsonpath(&env, vm, "linux-vm", "{.status.restartAwaitingChanges}"),
        ""
    );
}

#[test]
fn kubevirt_policy_run_strategy_eviction_and_labels() {
    let env = Env::kubevirt();
    let out = env.vm(&[
        "set",
        "policy",
        "web",
        "--run-strategy",
        "Manual",
        "--label",
        "team=web",
        "--label",
        "tier-",
        "--eviction-strategy",
        "LiveMigrate",
    ]);
    let text = stdout(&out);
    for line in [
        "virtualmachine.kubevirt.io/web changed:\n",
        "\n  metadata.labels.tier: frontend → (none)\n",
        "\n  metadata.labels.team: (none) → web\n",
        "\n  spec.runStrategy: Always → Manual\n",
        " → LiveMigrate\n",
        "\napplies at the next restart: a non-live-updatable field was changed in the template spec (`kubectl vm restart web.default`, or pass --restart)\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}{}", stderr(&out));
    }
    assert_eq!(jsonpath(&env, "vm", "web", "{.spec.runStrategy}"), "Manual");
    assert_eq!(
        jsonpath(&env, "vm", "web", "{.metadata.labels}"),
        r#"{"app":"web","team":"web"}"#
    );
    // Template labels: not a template spec change, nothing more waits; on Deckhouse refused.
    let env = Env::kubevirt();
    let out = env.vm(&["set", "policy", "web", "--template", "--label", "team=web"]);
    assert!(
        stdout(&out).ends_with("applied live: the platform reports no restart needed\n"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        jsonpath(&env, "vm", "web", "{.spec.template.metadata.labels.team}"),
        "web"
    );
}

#[test]
fn deckhouse_policy_applies_at_once_but_the_grace_period_waits() {
    let env = Env::deckhouse();
    let vm = "virtualmachines.virtualization.deckhouse.io";
    let out = env.vm(&[
        "set",
        "policy",
        "linux-vm",
        "--run-strategy",
        "AlwaysOn",
        "--eviction-strategy",
        "AlwaysSafe",
        "--annotation",
        "note=canary",
    ]);
    let text = stdout(&out);
    for line in [
        "virtualmachine.virtualization.deckhouse.io/linux-vm changed:\n",
        "\n  metadata.annotations.note: (none) → canary\n",
        " → AlwaysSafe\n",
        "\n  spec.runPolicy: AlwaysOnUnlessStoppedManually → AlwaysOn\n",
        "\napplied live: the platform reports no restart needed\n",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}{}", stderr(&out));
    }
    assert_eq!(
        jsonpath(&env, vm, "linux-vm", "{.spec.liveMigrationPolicy}"),
        "AlwaysSafe"
    );
    assert_eq!(
        jsonpath(&env, vm, "linux-vm", "{.spec.runPolicy}"),
        "AlwaysOn"
    );
    let out = env.vm(&["set", "policy", "linux-vm", "--grace-period", "30"]);
    assert!(
        stdout(&out).contains("applies at the next restart: Waiting for the user to restart in order to apply the configuration changes. [terminationGracePeriodSeconds]"),
        "{}",
        stdout(&out)
    );
    let err = fails(
        &env,
        &["set", "policy", "linux-vm", "--template", "--label", "a=b"],
        2,
    );
    assert!(err.contains("a Deckhouse VM has no template"), "{err}");
}

/// Someone labels the VM while `set` holds the VM it read: the write conflicts, the change is
/// made again on the fresh VM, and both changes are there.
pub(crate) fn concurrent_edit_is_kept(
    env: &Env,
    resource: &str,
    name: &str,
    args: &[&str],
    check: (&str, &str),
) {
    env.emulator.hold("update", "virtualmachines");
    let child = env.spawn(args);
    until_held(env, 1);
    ok(env.kubectl(&["label", resource, name, "theirs=kept"]));
    env.emulator.release_held();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("(written on attempt 2: the VM changed under us before)"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("changed since it was read (attempt 1)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        jsonpath(env, resource, name, "{.metadata.labels.theirs}"),
        "kept"
    );
    assert_eq!(jsonpath(env, resource, name, check.0), check.1);
}

#[test]
fn a_concurrent_edit_between_read_and_write_is_not_lost() {
    let env = Env::kubevirt();
    concurrent_edit_is_kept(
        &env,
        "vm",
        "web",
        &["set", "resources", "web", "--memory", "3Gi"],
        ("{.spec.template.spec.domain.memory.guest}", "3Gi"),
    );
    let env = Env::deckhouse();
    concurrent_edit_is_kept(
        &env,
        "virtualmachines.virtualization.deckhouse.io",
        "linux-vm",
        &["set", "policy", "linux-vm", "--run-strategy", "Manual"],
        ("{.spec.runPolicy}", "Manual"),
    );
}

#[test]
fn bad_input_is_refused_before_any_request() {
    for env in [Env::kubevirt(), Env::deckhouse()] {
        env.emulator.clear_requests();
        for (args, says) in [
            (
                &["set", "resources", "web", "--memory", "2Xi"][..],
                "--memory: invalid size \"2Xi\"",
            ),
            (&["set", "resources", "web", "--memory=-1Gi"], "--memory"),
            (
                &["set", "resources", "web", "--cpu", "0"],
                "--cpu must be at least 1",
            ),
            (
                &["set", "resources", "web", "--core-fraction", "250%"],
                "--core-fraction",
            ),
            (&["set", "resources", "web"], "nothing to change"),
            (
                &["set", "policy", "web", "--label", "bad key=x"],
                "invalid --label",
            ),
            (
                &["set", "policy", "web", "--label", "team"],
                "use key=value to set or key- to remove",
            ),
            (
                &["set", "policy", "web", "--annotation=-bad-=x"],
                "invalid --annotation",
            ),
            (
                &["set", "policy", "web", "--grace-period=-5"],
                "--grace-period",
            ),
            (
                &["set", "policy", "Bad_Name!", "--label", "a=b"],
                "invalid target",
            ),
        ] {
            let err = fails(&env, args, 2);
            assert!(err.contains(says), "{args:?}: {err}");
        }
        assert!(
            env.emulator.requests().is_empty(),
            "{:?}",
            env.emulator.requests().len()
        );
    }
    // What depends on the platform is refused right after discovery: no VM is read.
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let err = fails(
        &env,
        &["set", "resources", "web", "--core-fraction", "50%"],
        2,
    );
    assert!(err.contains("--core-fraction is Deckhouse's"), "{err}");
    let err = fails(
        &env,
        &["set", "policy", "web", "--run-strategy", "AlwaysOn"],
        2,
    );
    assert!(
        err.contains("use one of Always, RerunOnFailure, Manual, Halted, Once"),
        "{err}"
    );
    assert!(requests_on(&env, KV_VM).is_empty());
    let env = Env::deckhouse();
    env.emulator.clear_requests();
    let err = fails(&env, &["set", "resources", "linux-vm", "--sockets", "2"], 2);
    assert!(err.contains("--sockets is KubeVirt's"), "{err}");
    assert!(requests_on(&env, DH_VM).is_empty());
}

#[test]
fn dry_runs_change_nothing() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let out = env.vm(&["set", "resources", "web", "--cpu", "4", "--dry-run"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/web changed (dry run):\n  spec.template.spec.domain.cpu.sockets: (none) → 2\nnothing was changed\n"
    );
    assert!(writes(&env).is_empty());
    let out = env.vm(&["set", "resources", "web", "--cpu", "4", "--dry-run=server"]);
    assert!(
        stdout(&out).contains("changed (server dry run)"),
        "{}",
        stderr(&out)
    );
    let wire = writes(&env);
    assert_eq!(wire.len(), 1, "{wire:?}");
    let put = env
        .emulator
        .requests()
        .into_iter()
        .find(|r| r.method == "PUT")
        .unwrap();
    assert!(put.query.contains("dryRun=All"), "{}", put.query);
    assert_eq!(
        jsonpath(
            &env,
            "vm",
            "web",
            "{.spec.template.spec.domain.cpu.sockets}"
        ),
        ""
    );
    let env = Env::deckhouse();
    let out = env.vm(&[
        "set",
        "policy",
        "linux-vm",
        "--run-strategy",
        "Manual",
        "--dry-run",
    ]);
    assert!(stdout(&out).ends_with("nothing was changed\n"));
    assert_eq!(
        jsonpath(
            &env,
            "virtualmachines.virtualization.deckhouse.io",
            "linux-vm",
            "{.spec.runPolicy}"
        ),
        "AlwaysOnUnlessStoppedManually"
    );
}

#[test]
fn output_yaml_is_the_vm_after_the_change() {
    for (env, name) in [(Env::kubevirt(), "web"), (Env::deckhouse(), "linux-vm")] {
        let out = env.vm(&["set", "policy", name, "--label", "team=web", "-o", "yaml"]);
        let vm: Value = yaml_serde::from_str(&stdout(&out)).unwrap();
        assert_eq!(vm["metadata"]["labels"]["team"], "web");
        assert_eq!(vm["metadata"]["name"], name);
        // The summary goes to stderr, so stdout stays one document.
        assert!(
            stderr(&out).contains("metadata.labels.team: (none) → web"),
            "{}",
            stderr(&out)
        );
        let out = env.vm(&[
            "set",
            "policy",
            name,
            "--label",
            "team=db",
            "--dry-run",
            "-o",
            "json",
        ]);
        let vm: Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(vm["metadata"]["labels"]["team"], "db");
    }
}

#[test]
fn a_stopped_vm_takes_the_change_when_it_starts() {
    let env = Env::kubevirt();
    // batch sizes its memory by requests (no guest memory): the request is what changes.
    let out = env.vm(&[
        "set",
        "resources",
        "batch.dev",
        "--cpu",
        "2",
        "--memory",
        "2Gi",
    ]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/batch changed:\n  spec.template.spec.domain.cpu.sockets: (none) → 2\n  spec.template.spec.domain.resources.requests.memory: 1Gi → 2Gi\nthe VM is not running: it takes the change when it starts\n",
        "{}",
        stderr(&out)
    );
    let memory = ok(env.kubectl(&[
        "get",
        "vm",
        "batch",
        "-n",
        "dev",
        "-o",
        "jsonpath={.spec.template.spec.domain.resources.requests.memory}",
    ]));
    assert_eq!(memory, "2Gi");
    let env = Env::deckhouse();
    let out = env.vm(&[
        "set",
        "resources",
        "builder",
        "-n",
        "dev",
        "--cpu",
        "4",
        "--memory",
        "4Gi",
    ]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.virtualization.deckhouse.io/builder changed:\n  spec.cpu.cores: 2 → 4\n  spec.memory.size: 2Gi → 4Gi\nthe VM is not running: it takes the change when it starts\n",
        "{}",
        stderr(&out)
    );
}

#[test]
fn kubevirt_instancetype_vms_change_their_instancetype_or_are_refused_with_the_reason() {
    let env = Env::kubevirt();
    let path = env.dir.path().join("it.yaml");
    std::fs::write(
        &path,
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: sized, namespace: default}\nspec:\n  runStrategy: Halted\n  instancetype: {kind: VirtualMachineClusterInstancetype, name: u1.small, revisionName: sized-u1.small-1}\n  template:\n    spec:\n      domain: {devices: {}}\n",
    )
    .unwrap();
    ok(env.kubectl(&["apply", "-f", path.to_str().unwrap()]));
    env.emulator.clear_requests();
    let err = fails(&env, &["set", "resources", "sized", "--cpu", "2"], 2);
    assert_eq!(
        err,
        "Error: virtualmachine \"sized\": takes its CPU and memory from VirtualMachineClusterInstancetype \"u1.small\"; change it with --instancetype NAME"
    );
    let err = fails(
        &env,
        &["set", "resources", "web", "--instancetype", "u1.large"],
        2,
    );
    assert!(err.contains("has no instancetype"), "{err}");
    let err = fails(
        &env,
        &[
            "set",
            "resources",
            "sized",
            "--instancetype",
            "u1.large",
            "--memory",
            "2Gi",
        ],
        2,
    );
    assert!(
        err.contains("--instancetype replaces the VM's CPU and memory"),
        "{err}"
    );
    assert!(writes(&env).is_empty(), "{:?}", writes(&env));
    // The new name, and the old revision dropped so that the controller takes the new one's.
    let out = env.vm(&["set", "resources", "sized", "--instancetype", "u1.large"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/sized changed:\n  spec.instancetype.name: u1.small → u1.large\n  spec.instancetype.revisionName: sized-u1.small-1 → (none)\nthe VM is not running: it takes the change when it starts\n",
        "{}",
        stderr(&out)
    );
    assert_eq!(
        jsonpath(&env, "vm", "sized", "{.spec.instancetype.name}"),
        "u1.large"
    );
}
