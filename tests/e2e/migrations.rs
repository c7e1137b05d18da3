//! Migrations in flight: `migrate list [-A] [-w]` on both platforms (a migration seen to start
//! and finish under `-w`, a drain's migrations marked, a failure's reason), `evacuate-cancel`
//! (KubeVirt's `evacuate/cancel`; refused on Deckhouse) and `migrate --cancel --all-on-node`.

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::sync::mpsc;
use std::time::Duration;

use kubevm_emulator::ServeFlavor;
use serde_json::{Value, json};

use crate::common::{Env, fails, ok, stdout, table};
use crate::lifecycle::{apply, changes, eventually};

/// A running command whose stdout lines arrive on a channel.
struct Lines {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Lines {
    fn start(env: &Env, args: &[&str]) -> Lines {
        let mut child = env.spawn(args);
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { child, lines }
    }

    /// The next line satisfying `want`, with every line read until then.
    #[track_caller]
    fn until(&mut self, what: &str, want: impl Fn(&[String]) -> bool) -> Vec<String> {
        let mut seen = vec![];
        loop {
            match self.lines.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => {
                    let cells: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
                    seen.push(line);
                    if want(&cells) {
                        return seen;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    let mut err = String::new();
                    if let Some(mut e) = self.child.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    panic!("no line with {what} within 20s; saw {seen:#?}; stderr: {err}");
                }
            }
        }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Columns of the default table (without -A).
const HEADER: [&str; 10] = [
    "NAME",
    "VM",
    "TYPE",
    "INITIATOR",
    "PHASE",
    "SOURCE",
    "TARGET",
    "PROGRESS",
    "DURATION",
    "REASON",
];

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

#[test]
fn kubevirt_list_watch_sees_a_migration_start_and_finish() {
    let env = Env::with_step(
        ServeFlavor::KubeVirt,
        "kubevirt.yaml",
        Duration::from_millis(150),
    );
    let mut watch = Lines::start(&env, &["migrate", "list", "-w"]);
    let header = watch.until("the header", |c| c.first().is_some_and(|h| h == "NAME"));
    assert_eq!(table(&header.join("\n"))[0], HEADER);
    ok(env.vm(&["migrate", "web", "--no-wait"]));
    // The migration's name as kubectl sees it (independent of the code under test).
    let list = kubectl_json(&env, &["get", "vmim", "-n", "default"]);
    let name = list["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let started = watch.until("the new migration", |c| c.first() == Some(&name));
    let first = table(started.last().unwrap())[0].clone();
    assert_eq!(&first[1..4], ["web", "Migrate", "user"]);
    assert_ne!(first[4], "Succeeded", "the start is seen before the end");
    let rows = watch.until("the migration's end", |c| {
        c.first() == Some(&name) && c.get(4).is_some_and(|p| p == "Succeeded")
    });
    let last = table(rows.last().unwrap())[0].clone();
    assert_eq!(&last[5..7], ["node-1", "node-2"]);
    // Phases in upstream's order, each printed as it was reached (no phase goes backwards).
    const ORDER: [&str; 7] = [
        "Pending",
        "Scheduling",
        "Scheduled",
        "PreparingTarget",
        "TargetReady",
        "Running",
        "Succeeded",
    ];
    let mut seen: Vec<usize> = std::iter::once(&first)
        .chain(
            table(&rows.join("\n"))
                .iter()
                .filter(|r| r.first() == Some(&name)),
        )
        .map(|r| ORDER.iter().position(|p| *p == r[4]).unwrap())
        .collect();
    let sorted = {
        let mut s = seen.clone();
        s.sort();
        s
    };
    assert_eq!(seen, sorted);
    seen.dedup();
    assert!(seen.len() >= 3, "several phases seen: {rows:?}");
    let vmim = kubectl_json(&env, &["get", "vmim", &name, "-n", "default"]);
    assert_eq!(vmim["status"]["phase"], "Succeeded");
}

#[test]
fn deckhouse_list_watch_sees_an_operation_start_and_finish_with_its_progress() {
    let env = Env::with_step(
        ServeFlavor::Deckhouse,
        "deckhouse.yaml",
        Duration::from_millis(150),
    );
    let mut watch = Lines::start(&env, &["migrate", "list", "-w"]);
    watch.until("the header", |c| c.first().is_some_and(|h| h == "NAME"));
    ok(env.vm(&["migrate", "linux-vm", "--no-wait"]));
    let ops = kubectl_json(&env, &["get", "vmop", "-n", "default"]);
    let name = ops["items"][0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let rows = watch.until("the operation's end", |c| {
        c.first() == Some(&name) && c.get(4).is_some_and(|p| p == "Completed")
    });
    let rows: Vec<Vec<String>> = table(&rows.join("\n"))
        .into_iter()
        .filter(|r| r.first() == Some(&name))
        .collect();
    assert!(rows.len() >= 2, "the start and the end: {rows:?}");
    assert!(
        ["Pending", "InProgress"].contains(&rows[0][4].as_str()),
        "the start is seen before the end: {rows:?}"
    );
    let last = rows.last().unwrap();
    assert_eq!(&last[1..4], ["linux-vm", "Migrate", "user"]);
    assert_eq!(&last[5..8], ["node-1", "node-2", "100%"]);
    // The platform's own percentage, as kubectl shows it.
    let op = kubectl_json(&env, &["get", "vmop", &name, "-n", "default"]);
    assert_eq!(op["status"]["progress"], "100%");
}

#[test]
fn kubevirt_list_marks_a_drain_and_shows_a_failure_reason_in_every_format() {
    let env = Env::kubevirt();
    let kubectl = |args: &[&str]| ok(env.kubectl(args));
    // What virt-api's eviction admitter does when a drain evicts web's launcher pod.
    kubectl(&[
        "patch",
        "vmi",
        "web",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"evacuationNodeName":"node-1"}}"#,
    ]);
    // A migration that does not converge (the emulator's fixture annotation).
    apply(
        &env,
        &[
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "slow", "namespace": "lab", "annotations": {"emulator.kubevm.io/migration-fail": "timeout"}},
        "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {}}}}}}),
        ],
    );
    eventually("slow to run", || {
        env.emulator
            .objects("kubevirt.io", "virtualmachineinstances", Some("lab"))
            .iter()
            .any(|v| v["status"]["phase"] == "Running")
    });
    let out = env.vm(&["migrate", "slow.lab"]);
    assert_eq!(out.status.code(), Some(1));
    eventually("the drain's migration to end", || {
        let l = kubectl_json(&env, &["get", "vmim", "-n", "default"]);
        l["items"].as_array().unwrap().iter().any(|m| {
            m["metadata"]["annotations"]["kubevirt.io/evacuationMigration"] == "node-1"
                && m["status"]["phase"] == "Succeeded"
        })
    });
    let out = ok(env.vm(&["migrate", "list", "-A"]));
    let rows = table(&out);
    assert_eq!(rows[0][0], "NAMESPACE");
    let drain = rows
        .iter()
        .find(|r| r[1].starts_with("kubevirt-evacuation-"))
        .unwrap();
    assert_eq!(
        &drain[2..8],
        ["web", "Evict", "drain", "Succeeded", "node-1", "node-2"]
    );
    let failed = out.lines().find(|l| l.contains(" slow ")).unwrap();
    assert!(failed.contains("Failed"), "{failed}");
    // The reason as KubeVirt reports it in the migration state.
    let vmims = kubectl_json(&env, &["get", "vmim", "-n", "lab"]);
    let reason = vmims["items"][0]["status"]["migrationState"]["failureReason"]
        .as_str()
        .unwrap();
    assert!(failed.trim_end().ends_with(reason), "{failed} / {reason}");

    // -o name lists what kubectl lists, -o json the same objects.
    let names = ok(env.vm(&["migrate", "list", "-n", "lab", "-o", "name"]));
    let by_kubectl = ok(env.kubectl(&["get", "vmim", "-n", "lab", "-o", "name"]));
    assert_eq!(names, by_kubectl);
    let json: Value =
        serde_json::from_str(&ok(env.vm(&["migrate", "list", "-n", "lab", "-o", "json"]))).unwrap();
    assert_eq!(json["kind"], "List");
    assert_eq!(
        json["items"][0]["metadata"]["uid"],
        vmims["items"][0]["metadata"]["uid"]
    );
    let yaml = ok(env.vm(&["migrate", "list", "-n", "lab", "-o", "yaml"]));
    assert!(
        yaml.contains("kind: VirtualMachineInstanceMigration"),
        "{yaml}"
    );
    let wide = table(&ok(env.vm(&["migrate", "list", "-n", "lab", "-o", "wide"])));
    assert_eq!(&wide[0][10..], ["STARTED", "ENDED"]);
    let empty = env.vm(&["migrate", "list", "-n", "nowhere"]);
    assert_eq!(stdout(&empty), "");
    assert_eq!(
        crate::common::stderr(&empty),
        "No migrations found in namespace \"nowhere\".\n"
    );
}

#[test]
fn evacuate_cancel_sends_the_node_the_instance_runs_on_and_removes_the_mark() {
    let env = Env::kubevirt();
    // Not marked: the server changes nothing, and says so.
    assert_eq!(
        ok(env.vm(&["evacuate-cancel", "vm", "web"])),
        "virtualmachine.kubevirt.io/web was not being evacuated from node-1\n"
    );
    let mark = |ns: &str, vmi: &str, node: &str| {
        ok(env.kubectl(&[
            "patch",
            "vmi",
            vmi,
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(r#"{{"status":{{"evacuationNodeName":"{node}"}}}}"#),
        ]));
    };
    let marked = |ns: &str, vmi: &str| {
        kubectl_json(&env, &["get", "vmi", vmi, "-n", ns])["status"]
            .get("evacuationNodeName")
            .cloned()
    };
    mark("default", "web", "node-1");
    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["evacuate-cancel", "vmi", "web", "--dry-run=server"])),
        "virtualmachineinstance.kubevirt.io/web evacuation from node-1 cancelled (server dry run)\n"
    );
    assert_eq!(marked("default", "web"), Some(json!("node-1")));
    assert_eq!(
        ok(env.vm(&["evacuate-cancel", "vm", "web"])),
        "virtualmachine.kubevirt.io/web evacuation from node-1 cancelled\n"
    );
    assert_eq!(marked("default", "web"), None);
    let wire: Vec<(String, String, Option<Value>)> = changes(&env)
        .into_iter()
        .map(|r| (r.method.clone(), r.path.clone(), r.json()))
        .collect();
    let sub = "/apis/subresources.kubevirt.io/v1/namespaces/default";
    assert_eq!(
        wire,
        [
            (
                "PUT".to_owned(),
                format!("{sub}/virtualmachineinstances/web/evacuate/cancel"),
                Some(json!({"evacuationNodeName": "node-1", "dryRun": ["All"]}))
            ),
            (
                "PUT".to_owned(),
                format!("{sub}/virtualmachines/web/evacuate/cancel"),
                Some(json!({"evacuationNodeName": "node-1"}))
            ),
        ]
    );
    // A node: every instance marked for it, in any namespace; others are left alone.
    mark("prod", "db.primary", "node-2");
    mark("dev", "api", "node-1");
    assert_eq!(
        ok(env.vm(&["evacuate-cancel", "node", "node-2"])),
        "virtualmachineinstance.kubevirt.io/db.primary in prod evacuation from node-2 cancelled\n"
    );
    assert_eq!(marked("prod", "db.primary"), None);
    assert_eq!(marked("dev", "api"), Some(json!("node-1")));
    let none = env.vm(&["evacuate-cancel", "node", "node-2"]);
    assert_eq!(stdout(&none), "");
    assert!(
        crate::common::stderr(&none)
            .contains("No virtual machine instances are being evacuated from node \"node-2\"")
    );
    // A stopped VM has no instance: the server's NotFound names it.
    let err = fails(&env, &["evacuate-cancel", "vm", "nope"], 1);
    assert!(err.contains("\"nope\" not found"), "{err}");
}

#[test]
fn cancel_all_on_node_stops_the_drain_and_its_migrations_on_kubevirt() {
    let env = Env::with_step(
        ServeFlavor::KubeVirt,
        "kubevirt.yaml",
        Duration::from_millis(400),
    );
    ok(env.kubectl(&[
        "patch",
        "vmi",
        "web",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"evacuationNodeName":"node-1"}}"#,
    ]));
    eventually("the drain's migration", || {
        env.emulator
            .objects(
                "kubevirt.io",
                "virtualmachineinstancemigrations",
                Some("default"),
            )
            .iter()
            .any(|m| {
                m["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .starts_with("kubevirt-evacuation-")
            })
    });
    env.emulator.clear_requests();
    let out = ok(env.vm(&["migrate", "--cancel", "--all-on-node", "node-1"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "virtualmachineinstance.kubevirt.io/web in default evacuation from node-1 cancelled"
    );
    // dev/api's migration (the fixture's, running from node-1) and web's evacuation.
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines.iter().any(|l| l
            .starts_with("virtualmachineinstancemigration.kubevirt.io/kubevirt-evacuation-")
            && l.contains("(Evict of web, node-1 → ")),
        "{out}"
    );
    assert!(lines.iter().any(|l| l.starts_with("virtualmachineinstancemigration.kubevirt.io/kubevirt-migrate-vm-4xq9z in dev (Migrate of api, node-1 → node-2)")), "{out}");
    // Deleted with their uids as preconditions; nothing migrates web again.
    let deletes: Vec<_> = changes(&env)
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 2);
    assert!(
        deletes
            .iter()
            .all(|d| d.json().unwrap()["preconditions"]["uid"].is_string())
    );
    let left = ok(env.kubectl(&["get", "vmim", "-A", "-o", "name"]));
    assert_eq!(left, "", "{left}");
    let vmi = kubectl_json(&env, &["get", "vmi", "web"]);
    assert!(vmi["status"].get("evacuationNodeName").is_none());
    assert_eq!(vmi["status"]["nodeName"], "node-1");
}

#[test]
fn deckhouse_lists_a_drains_evict_and_cancel_all_on_node_deletes_it() {
    let env = Env::with_step(
        ServeFlavor::Deckhouse,
        "deckhouse.yaml",
        Duration::from_millis(400),
    );
    // The operation Deckhouse's evacuation controller makes for a drain (evacuation.go).
    apply(
        &env,
        &[
            json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachineOperation",
        "metadata": {"name": "evacuation-x7k2p", "namespace": "default",
            "annotations": {"virtualization.deckhouse.io/evacuation": "true"}},
        "spec": {"type": "Evict", "virtualMachineName": "linux-vm"}}),
        ],
    );
    eventually("the evacuation to run", || {
        env.emulator
            .objects(
                "virtualization.deckhouse.io",
                "virtualmachineoperations",
                Some("default"),
            )
            .iter()
            .any(|o| o["status"]["phase"] == "InProgress")
    });
    let rows = table(&ok(env.vm(&["migrate", "list"])));
    assert_eq!(rows[0], HEADER);
    assert_eq!(
        &rows[1][..6],
        [
            "evacuation-x7k2p",
            "linux-vm",
            "Evict",
            "drain",
            "InProgress",
            "node-1"
        ]
    );
    let uid = kubectl_json(&env, &["get", "vmop", "evacuation-x7k2p"])["metadata"]["uid"].clone();
    env.emulator.clear_requests();
    let out = ok(env.vm(&["migrate", "--cancel", "--all-on-node", "node-1"]));
    assert!(out.starts_with("virtualmachineoperation.virtualization.deckhouse.io/evacuation-x7k2p in default (Evict of linux-vm, node-1 → "), "{out}");
    let deletes: Vec<_> = changes(&env)
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].json().unwrap()["preconditions"]["uid"], uid);
    assert!(
        env.emulator
            .objects(
                "virtualization.deckhouse.io",
                "virtualmachineoperations",
                Some("default")
            )
            .iter()
            .all(|o| o["metadata"]["name"] != "evacuation-x7k2p")
    );
    // evacuate-cancel is KubeVirt's subresource: one line, exit 2, nothing changed.
    let err = fails(&env, &["evacuate-cancel", "vm", "linux-vm"], 2);
    assert!(
        err.starts_with(
            "Error: evacuate-cancel drives KubeVirt's evacuate/cancel subresource; on Deckhouse"
        ),
        "{err}"
    );
}

#[test]
fn bad_input_is_refused_before_any_request() {
    for env in [Env::kubevirt(), Env::deckhouse()] {
        for (args, code) in [
            (&["evacuate-cancel", "node", "Bad_Name!"][..], 2),
            (&["evacuate-cancel", "vm", "web.Bad_NS"][..], 2),
            (&["migrate", "--cancel", "--all-on-node", "no_de"][..], 2),
            (&["migrate", "list", "-l", "a in (b"][..], 2),
            (&["migrate", "list", "-A", "-n", "default"][..], 2),
        ] {
            fails(&env, args, code);
        }
        // clap's own refusals (an error line and a hint).
        for args in [
            &["evacuate-cancel", "pod", "web"][..],
            &["migrate", "--all-on-node", "node-1"][..],
            &["migrate", "web", "--cancel", "--all-on-node", "node-1"][..],
            &["migrate", "list", "web"][..],
        ] {
            let out = env.vm(args);
            assert_eq!(out.status.code(), Some(2), "{args:?}");
        }
        assert!(
            env.emulator.requests().is_empty(),
            "{:?}",
            env.emulator.requests()
        );
    }
}
