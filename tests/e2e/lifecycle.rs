//! `start`, `stop`, `restart`, `pause`, `unpause`, `soft-reboot`, `evict`, `migrate` on
//! KubeVirt: end states, the requests on the wire (bodies as KubeVirt's option types in
//! FACTS §2 define them), bulk selection and confirmation, dry runs, failures with the
//! platform's reason, and what a terminal shows.

use std::time::Duration;

use kubevm_emulator::ServeFlavor;
use kubevm_emulator::core::requests::RecordedRequest;
use serde_json::{Value, json};

use crate::common::{Env, exit_code, fails, ok, on_tty, stderr, stdout};

const SUB: &str = "/apis/subresources.kubevirt.io/v1/namespaces";

/// The requests that change something (everything but GET/LIST/WATCH).
pub fn changes(env: &Env) -> Vec<RecordedRequest> {
    env.emulator
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .collect()
}

/// `(method, path, body)` of the changing requests.
fn wire(env: &Env) -> Vec<(String, String, Option<Value>)> {
    changes(env)
        .into_iter()
        .map(|r| (r.method.clone(), r.path.clone(), r.json()))
        .collect()
}

fn vm(env: &Env, ns: &str, name: &str) -> Value {
    env.emulator
        .objects("kubevirt.io", "virtualmachines", Some(ns))
        .into_iter()
        .find(|v| v["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("vm {ns}/{name}"))
}

fn vmi(env: &Env, ns: &str, name: &str) -> Option<Value> {
    env.emulator
        .objects("kubevirt.io", "virtualmachineinstances", Some(ns))
        .into_iter()
        .find(|v| v["metadata"]["name"] == name)
}

fn printable(env: &Env, ns: &str, name: &str) -> String {
    vm(env, ns, name)["status"]["printableStatus"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// Create VMs through the API (so the emulator's controllers run them, unlike fixtures).
pub fn apply(env: &Env, objects: &[Value]) {
    let mut namespaces: Vec<&str> = objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str())
        .filter(|ns| !["default", "dev", "prod"].contains(ns))
        .collect();
    namespaces.sort();
    namespaces.dedup();
    let mut objects: Vec<Value> = objects.to_vec();
    for ns in namespaces {
        if env
            .emulator
            .objects("", "namespaces", None)
            .iter()
            .all(|n| n["metadata"]["name"] != ns)
        {
            objects.insert(
                0,
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            );
        }
    }
    let path = env
        .dir
        .path()
        .join(format!("objects-{}.json", rand_suffix()));
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    std::fs::write(&path, list.to_string()).unwrap();
    ok(env.kubectl(&["create", "--validate=false", "-f", path.to_str().unwrap()]));
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

pub fn kubevirt_vm(ns: &str, name: &str, rs: &str, labels: Value, annotations: Value) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
        "spec": {"runStrategy": rs, "template": {"spec": {"domain": {"devices": {}}}}}})
}

/// Wait (bounded) until `f` holds; the emulator's controllers run in the background.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn power_cycle_reaches_each_end_state_with_exact_requests() {
    let env = Env::kubevirt();
    let path = |plural: &str, sub: &str| format!("{SUB}/default/{plural}/web/{sub}");

    // stop: runStrategy Always becomes Halted (lifecycle.go), the VMI and its pod go.
    env.emulator.clear_requests();
    let out = env.vm(&["stop", "web"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/web stopped\n",
        "{}",
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(err.contains("web: Stopped"), "{err}");
    assert!(
        err.contains("runStrategy Always; KubeVirt set it to Halted"),
        "{err}"
    );
    // Off a terminal: plain lines, no spinner frames or cursor movement.
    assert!(!err.contains('\x1b') && !err.contains('\r'), "{err:?}");
    assert!(err.lines().all(|l| l.starts_with("web: ")), "{err}");
    assert_eq!(
        wire(&env),
        [(
            "PUT".into(),
            path("virtualmachines", "stop"),
            Some(json!({}))
        )]
    );
    assert_eq!(vm(&env, "default", "web")["spec"]["runStrategy"], "Halted");
    assert!(vmi(&env, "default", "web").is_none());
    assert!(
        env.emulator
            .objects("", "pods", Some("default"))
            .iter()
            .all(|p| p["metadata"]["labels"]["vm.kubevirt.io/name"] != "web")
    );

    // start: back to Always, a new VMI that reaches Running.
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["start", "web"])),
        "virtualmachine.kubevirt.io/web started\n"
    );
    assert_eq!(
        wire(&env),
        [(
            "PUT".into(),
            path("virtualmachines", "start"),
            Some(json!({}))
        )]
    );
    assert_eq!(printable(&env, "default", "web"), "Running");
    let first = vmi(&env, "default", "web").unwrap()["metadata"]["uid"].clone();

    // restart: a new VMI.
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["restart", "web"])),
        "virtualmachine.kubevirt.io/web restarted\n"
    );
    assert_eq!(
        wire(&env),
        [(
            "PUT".into(),
            path("virtualmachines", "restart"),
            Some(json!({}))
        )]
    );
    let second = vmi(&env, "default", "web").unwrap();
    assert_ne!(second["metadata"]["uid"], first);
    assert_eq!(second["status"]["phase"], "Running");

    // pause / unpause are VMI subresources (there is no pause on virtualmachines).
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["pause", "web"])),
        "virtualmachine.kubevirt.io/web paused\n"
    );
    assert_eq!(printable(&env, "default", "web"), "Paused");
    assert_eq!(
        ok(env.vm(&["unpause", "web"])),
        "virtualmachine.kubevirt.io/web unpaused\n"
    );
    assert_eq!(printable(&env, "default", "web"), "Running");
    assert_eq!(
        ok(env.vm(&["soft-reboot", "web"])),
        "virtualmachine.kubevirt.io/web soft-rebooted\n"
    );
    assert_eq!(
        ok(env.vm(&["reset", "web"])),
        "virtualmachine.kubevirt.io/web reset\n"
    );
    let requests = changes(&env);
    assert_eq!(
        requests
            .iter()
            .map(|r| (r.method.as_str(), r.path.clone()))
            .collect::<Vec<_>>(),
        [
            ("PUT", path("virtualmachineinstances", "pause")),
            ("PUT", path("virtualmachineinstances", "unpause")),
            ("PUT", path("virtualmachineinstances", "softreboot")),
            ("PUT", path("virtualmachineinstances", "reset")),
        ]
    );
    assert_eq!(requests[0].json(), Some(json!({})));
    assert_eq!(requests[1].json(), Some(json!({})));
    // SoftReboot and reset take no options body.
    assert_eq!(requests[2].body, "");
    assert_eq!(requests[3].body, "");
    assert!(requests.iter().all(|r| r.status == 200));
}

#[test]
fn options_bodies_for_force_grace_and_paused() {
    let env = Env::kubevirt();
    apply(
        &env,
        &[kubevirt_vm("lab", "batch", "Manual", json!({}), json!({}))],
    );
    env.emulator.clear_requests();
    // --paused (KubeVirt StartOptions.paused): the guest starts paused.
    assert_eq!(
        ok(env.vm(&["start", "batch.lab", "--paused"])),
        "virtualmachine.kubevirt.io/batch started\n"
    );
    assert_eq!(printable(&env, "lab", "batch"), "Paused");
    ok(env.vm(&["unpause", "batch.lab"]));
    // restart --force: RestartOptions.gracePeriodSeconds 0.
    ok(env.vm(&["restart", "batch.lab", "--force"]));
    // stop --grace-period: StopOptions.gracePeriod.
    ok(env.vm(&["stop", "batch.lab", "--grace-period", "30"]));
    assert_eq!(printable(&env, "lab", "batch"), "Stopped");
    let path = |sub: &str| format!("{SUB}/lab/virtualmachines/batch/{sub}");
    let bodies: Vec<_> = wire(&env)
        .into_iter()
        .filter(|(_, p, _)| p.contains("/virtualmachines/"))
        .collect();
    assert_eq!(
        bodies,
        [
            ("PUT".into(), path("start"), Some(json!({"paused": true}))),
            (
                "PUT".into(),
                path("restart"),
                Some(json!({"gracePeriodSeconds": 0}))
            ),
            ("PUT".into(), path("stop"), Some(json!({"gracePeriod": 30}))),
        ]
    );
    // Restart takes no grace period but 0 (virt-api answers 400 otherwise): refused locally.
    let err = fails(&env, &["restart", "batch.lab", "--grace-period", "10"], 2);
    assert!(err.contains("only takes --grace-period 0"), "{err}");
}

#[test]
fn migrate_moves_the_vm_and_reports_the_nodes() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let out = env.vm(&["migrate", "web", "--target-node", "node-2"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/web migrated\n",
        "{}",
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(err.contains("migrated web: node-1 → node-2 in "), "{err}");
    assert!(err.contains("web: migration Running"), "{err}");
    assert_eq!(
        wire(&env),
        [(
            "PUT".into(),
            format!("{SUB}/default/virtualmachines/web/migrate"),
            Some(json!({"addedNodeSelector": {"kubernetes.io/hostname": "node-2"}}))
        )]
    );
    assert_eq!(
        vmi(&env, "default", "web").unwrap()["status"]["nodeName"],
        "node-2"
    );
    let migrations = env.emulator.objects(
        "kubevirt.io",
        "virtualmachineinstancemigrations",
        Some("default"),
    );
    assert_eq!(migrations.len(), 1);
    assert_eq!(migrations[0]["status"]["phase"], "Succeeded");
    // evict on KubeVirt: a migration to any other node (no selector).
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["evict", "web"])),
        "virtualmachine.kubevirt.io/web evicted\n"
    );
    assert_eq!(wire(&env)[0].2, Some(json!({})));
    assert_eq!(
        vmi(&env, "default", "web").unwrap()["status"]["nodeName"],
        "node-1"
    );
    // No such node: said before anything is changed.
    env.emulator.clear_requests();
    let err = fails(&env, &["migrate", "web", "--target-node", "node-9"], 1);
    assert_eq!(
        err,
        "Error: there is no node named \"node-9\" in the cluster; `kubectl get nodes` lists them"
    );
    assert!(changes(&env).is_empty());
    // Already there: refused before any request.
    let err = fails(&env, &["migrate", "web", "--target-node", "node-1"], 2);
    assert!(err.contains("already runs on node node-1"), "{err}");
}

#[test]
fn cancel_stops_a_running_migration_and_no_wait_returns_before() {
    let env = Env::with_step(
        ServeFlavor::KubeVirt,
        "kubevirt.yaml",
        Duration::from_millis(700),
    );
    // dev/batch starts meanwhile: its migration is the measure of time below.
    ok(env.vm(&["start", "batch.dev", "--no-wait"]));
    let out = env.vm(&["migrate", "web", "--no-wait"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/web migrate requested\n",
        "{}",
        stderr(&out)
    );
    let migrations = env.emulator.objects(
        "kubevirt.io",
        "virtualmachineinstancemigrations",
        Some("default"),
    );
    assert_eq!(migrations.len(), 1);
    assert_ne!(
        migrations[0]["status"]["phase"], "Succeeded",
        "returned before the end"
    );
    let name = migrations[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let uid = migrations[0]["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["migrate", "web", "--cancel"])),
        "virtualmachine.kubevirt.io/web migration cancelled\n"
    );
    // virtctl migrate-cancel: DELETE the VMIM, only the one we looked at (uid precondition).
    let delete = env
        .emulator
        .requests()
        .into_iter()
        .find(|r| r.method == "DELETE")
        .expect("a DELETE was sent");
    assert_eq!(delete.json().unwrap()["preconditions"]["uid"], uid.as_str());
    assert_eq!(
        wire(&env)
            .into_iter()
            .map(|(m, p, _)| (m, p))
            .collect::<Vec<_>>(),
        [(
            "DELETE".into(),
            format!(
                "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations/{name}"
            )
        )]
    );
    assert!(
        env.emulator
            .objects(
                "kubevirt.io",
                "virtualmachineinstancemigrations",
                Some("default")
            )
            .is_empty()
    );
    // A whole migration of another VM, started after the cancel, runs to its end: the
    // cancelled one, further along in the same controller ticks, would have ended in that
    // time too and moved web.
    eventually("batch running", || {
        printable(&env, "dev", "batch") == "Running"
    });
    assert_eq!(
        ok(env.vm(&["migrate", "batch.dev"])),
        "virtualmachine.kubevirt.io/batch migrated\n"
    );
    let web = vmi(&env, "default", "web").unwrap();
    assert_eq!(web["status"]["nodeName"], "node-1");
    assert_ne!(web["status"]["migrationState"]["completed"], true, "{web}");
    let err = fails(&env, &["migrate", "web", "--cancel"], 1);
    assert!(err.contains("web has no migration in progress"), "{err}");

    // start --no-wait: accepted, not yet running.
    ok(env.vm(&["stop", "web"]));
    let out = env.vm(&["start", "web", "--no-wait"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/web start requested\n"
    );
    assert_ne!(printable(&env, "default", "web"), "Running");
    eventually("web running", || {
        printable(&env, "default", "web") == "Running"
    });

    // --timeout bounds the wait.
    let out = env.vm(&["migrate", "web", "--timeout", "1s"]);
    assert_eq!(out.status.code(), Some(1));
    let last = stderr(&out).lines().last().unwrap().to_owned();
    assert!(
        last.starts_with("Error: timed out waiting for virtual machine default/web to be migrated"),
        "{last}"
    );
}

#[test]
fn failing_migration_and_unschedulable_start_exit_1_with_the_reason() {
    let env = Env::kubevirt();
    apply(
        &env,
        &[
            kubevirt_vm(
                "lab",
                "slow",
                "Always",
                json!({}),
                json!({"emulator.kubevm.io/migration-fail": "timeout"}),
            ),
            kubevirt_vm(
                "lab",
                "big",
                "Halted",
                json!({}),
                json!({"emulator.kubevm.io/unschedulable": "true"}),
            ),
        ],
    );
    eventually("slow running", || {
        printable(&env, "lab", "slow") == "Running"
    });
    let out = env.vm(&["migrate", "slow.lab"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).is_empty());
    let err = stderr(&out);
    let last = err.lines().last().unwrap();
    assert!(
        last.starts_with("Error: migration kubevirt-migrate-vm-"),
        "{err}"
    );
    assert!(
        last.contains("Live migration is not completed after 150 sec and has been aborted"),
        "{err}"
    );

    // No node matches the selector: the migration fails with the scheduler's reason.
    let out = env.vm(&["migrate", "slow.lab", "--node-selector", "zone=nowhere"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.lines().last().unwrap().contains("failed: target pod is unschedulable: 0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector"),
        "{err}"
    );

    let out = env.vm(&["start", "big.lab"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.lines().last().unwrap().starts_with("Error: big cannot start: ErrorUnschedulable: 0/2 nodes are available: 2 Insufficient memory."),
        "{err}"
    );
}

#[test]
fn refusals_are_sentences_with_the_platform_words() {
    let env = Env::kubevirt();
    let err = fails(&env, &["start", "web"], 1);
    assert_eq!(
        err,
        "Error: web is already running (KubeVirt: VM is already running)"
    );
    ok(env.vm(&["pause", "web"]));
    let err = fails(&env, &["soft-reboot", "web"], 1);
    assert!(
        err.starts_with("Error: web is paused; unpause it first"),
        "{err}"
    );
    assert!(err.ends_with("(KubeVirt: VMI is paused)"), "{err}");
    let err = fails(&env, &["stop", "nosuch"], 1);
    assert!(err.contains("\"nosuch\" not found"), "{err}");
}

#[test]
fn selector_and_all_act_on_exactly_the_matching_vms() {
    let env = Env::kubevirt();
    apply(
        &env,
        &[
            kubevirt_vm("lab", "b1", "Always", json!({"grp": "b"}), json!({})),
            kubevirt_vm("lab", "b2", "Always", json!({"grp": "b"}), json!({})),
            kubevirt_vm("lab", "other", "Always", json!({"app": "web"}), json!({})),
            kubevirt_vm("lab2", "b3", "Always", json!({"grp": "b"}), json!({})),
        ],
    );
    for (ns, n) in [
        ("lab", "b1"),
        ("lab", "b2"),
        ("lab", "other"),
        ("lab2", "b3"),
    ] {
        eventually(n, || printable(&env, ns, n) == "Running");
    }
    env.emulator.clear_requests();
    let out = env.vm(&["stop", "-n", "lab", "-l", "grp=b", "-y", "--wait"]);
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/b1 stopped\nvirtualmachine.kubevirt.io/b2 stopped\n",
        "{}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).lines().last(), Some("2 stopped"));
    let stopped: Vec<String> = changes(&env).iter().map(|r| r.path.clone()).collect();
    assert_eq!(stopped.len(), 2);
    assert!(stopped.contains(&format!("{SUB}/lab/virtualmachines/b1/stop")));
    assert!(stopped.contains(&format!("{SUB}/lab/virtualmachines/b2/stop")));
    assert_eq!(printable(&env, "lab", "other"), "Running");
    assert_eq!(printable(&env, "lab2", "b3"), "Running");

    // --all -n dev: every VM of dev, no other namespace; b1/b2 already stopped fail with the
    // reason, and the summary counts both.
    env.emulator.clear_requests();
    let out = env.vm(&["stop", "--all", "-n", "lab", "-y", "--wait"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "virtualmachine.kubevirt.io/other stopped\n");
    let err = stderr(&out);
    assert!(err.contains("Error: lab/b1: b1 is not running"), "{err}");
    assert!(err.contains("1 stopped, 2 failed"), "{err}");
    assert!(
        changes(&env)
            .iter()
            .all(|r| r.path.contains("/namespaces/lab/"))
    );
    assert_eq!(printable(&env, "lab2", "b3"), "Running");

    // -A with a selector: across namespaces.
    let out = env.vm(&["start", "-A", "-l", "grp=b", "-y", "--wait"]);
    let text = stdout(&out);
    assert!(
        text.contains("/b1 started") && text.contains("/b2 started"),
        "{text}"
    );
    assert!(
        stderr(&out).contains("2 started, 1 failed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bulk_without_a_terminal_refuses_without_yes_and_changes_nothing() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let err = fails(&env, &["stop", "--all", "-A"], 2);
    assert!(err.contains("pass -y"), "{err}");
    let err = fails(&env, &["restart", "web", "db.primary.prod"], 2);
    assert!(
        err.contains("refusing to restart 2 virtual machines"),
        "{err}"
    );
    assert!(changes(&env).is_empty());
    assert_eq!(printable(&env, "default", "web"), "Running");
    // Bad input is refused before any request.
    env.emulator.clear_requests();
    fails(&env, &["stop"], 2);
    assert_eq!(env.vm(&["stop", "web", "--all"]).status.code(), Some(2));
    fails(&env, &["stop", "web", "-A"], 2);
    fails(&env, &["migrate", "web", "--node-selector", "zone"], 2);
    assert!(env.emulator.requests().is_empty());
}

#[test]
fn dry_runs_change_nothing() {
    let env = Env::kubevirt();
    let before = vm(&env, "default", "web");
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["stop", "web", "--dry-run=server"])),
        "virtualmachine.kubevirt.io/web stopped (server dry run)\n"
    );
    assert_eq!(
        wire(&env),
        [(
            "PUT".into(),
            format!("{SUB}/default/virtualmachines/web/stop"),
            Some(json!({"dryRun": ["All"]}))
        )]
    );
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["migrate", "web", "--dry-run=server"])),
        "virtualmachine.kubevirt.io/web migrated (server dry run)\n"
    );
    assert_eq!(wire(&env)[0].2, Some(json!({"dryRun": ["All"]})));
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["restart", "web", "--dry-run"])),
        "virtualmachine.kubevirt.io/web restarted (dry run)\n"
    );
    assert!(changes(&env).is_empty());
    assert_eq!(vm(&env, "default", "web"), before);
    assert!(
        env.emulator
            .objects(
                "kubevirt.io",
                "virtualmachineinstancemigrations",
                Some("default")
            )
            .is_empty()
    );
}

#[test]
fn output_name_and_json() {
    let env = Env::kubevirt();
    assert_eq!(
        ok(env.vm(&["stop", "web", "-o", "name"])),
        "virtualmachine.kubevirt.io/web\n"
    );
    let json: Value = serde_json::from_str(&ok(env.vm(&["start", "web", "-o", "json"]))).unwrap();
    assert_eq!(json["kind"], "VirtualMachine");
    assert_eq!(json["status"]["printableStatus"], "Running");
}

#[test]
fn a_terminal_shows_a_spinner_and_a_migration_bar() {
    let env = Env::with_step(
        ServeFlavor::KubeVirt,
        "kubevirt.yaml",
        Duration::from_millis(400),
    );
    let mut session = on_tty(&env, &["restart", "web"]);
    // A spinner frame, the VM and a phase on one line.
    // (rexpect reads bytes one by one: a braille frame is E2 A0 xx.)
    session
        .exp_regex("\u{e2}\u{a0}[\u{80}-\u{bf}] web: Scheduling")
        .unwrap();
    session
        .exp_string("virtualmachine.kubevirt.io/web restarted")
        .unwrap();
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 0);

    let mut session = on_tty(&env, &["migrate", "web"]);
    session
        .exp_regex(r"web \[=+>? *\] +[0-9]+% PreparingTarget")
        .unwrap();
    session
        .exp_regex("migrated web: node-1 .{1,3} node-2 in [0-9]+s")
        .unwrap();
    session
        .exp_string("virtualmachine.kubevirt.io/web migrated")
        .unwrap();
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 0);
}

#[test]
fn a_terminal_asks_once_for_a_bulk_action() {
    let env = Env::kubevirt();
    let mut session = on_tty(&env, &["stop", "--all", "-A"]);
    session
        .exp_string("This will stop 5 virtual machines:")
        .unwrap();
    session.exp_string("default/web").unwrap();
    session.exp_string("prod/db.primary").unwrap();
    session.exp_string("Continue? [y/N]").unwrap();
    session.send_line("n").unwrap();
    session.exp_string("aborted: nothing was done").unwrap();
    session.exp_eof().unwrap();
    assert_eq!(exit_code(&session), 1);
    assert_eq!(printable(&env, "default", "web"), "Running");
}

#[test]
fn completion_offers_vm_names_for_every_lifecycle_command() {
    let env = Env::kubevirt();
    for command in [
        "start",
        "stop",
        "restart",
        "pause",
        "unpause",
        "soft-reboot",
        "reset",
        "evict",
        "migrate",
    ] {
        let out = ok(env.kubectl(&["__complete", "vm", command, "-n", "prod", ""]));
        let names: Vec<&str> = out
            .lines()
            .filter(|l| !l.starts_with(':'))
            .map(|l| l.split('\t').next().unwrap())
            .collect();
        // `migrate list` is a subcommand beside the VM names.
        let expected: &[&str] = if command == "migrate" {
            &["list", "db.primary"]
        } else {
            &["db.primary"]
        };
        assert_eq!(names, expected, "{command}: {out}");
    }
}

/// A wait whose watch is answered "resource version gone" (an etcd compaction) lists again and
/// goes on, as `list -w` does, instead of re-watching from the gone version in a loop.
#[test]
fn a_wait_relists_after_410_gone() {
    let env = Env::with_step(
        ServeFlavor::KubeVirt,
        "kubevirt.yaml",
        Duration::from_millis(400),
    );
    apply(
        &env,
        &[kubevirt_vm("dev", "slow", "Halted", json!({}), json!({}))],
    );
    env.emulator.clear_requests();
    let child = env
        .command(crate::common::BIN)
        .args(["start", "slow", "-n", "dev", "--timeout", "20s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let watching = |env: &Env| {
        env.emulator.requests().into_iter().any(|r| {
            r.path == "/apis/kubevirt.io/v1/namespaces/dev/virtualmachines"
                && r.query.contains("watch=")
        })
    };
    eventually("the wait watches", || watching(&env));
    assert_ne!(
        printable(&env, "dev", "slow"),
        "Running",
        "too fast to test"
    );
    // A change the wait does not watch moves the resource version on; then everything up to
    // it is compacted: the open watch ends and re-watching from its version is Gone.
    env.emulator.put_object(kubevirt_vm(
        "prod",
        "elsewhere",
        "Halted",
        json!({}),
        json!({}),
    ));
    env.emulator.clear_requests();
    env.emulator.expire_resource_versions();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(printable(&env, "dev", "slow"), "Running");
    let after = env.emulator.requests();
    let on_vms = |watch: bool| {
        after
            .iter()
            .filter(|r| {
                r.path == "/apis/kubevirt.io/v1/namespaces/dev/virtualmachines"
                    && r.query.contains("watch=") == watch
            })
            .count()
    };
    assert!(on_vms(false) >= 1, "no re-list: {after:?}");
    assert!(
        on_vms(true) <= 4,
        "{} watch requests: {after:?}",
        on_vms(true)
    );
}
