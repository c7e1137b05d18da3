//! `list` against both flavours, directly and through kubectl's plugin discovery.

use crate::common::{Env, ok, stderr, table};

/// Rows without the AGE column (it depends on today's date).
fn without_age(rows: Vec<Vec<String>>, age_column: usize) -> Vec<Vec<String>> {
    rows.into_iter()
        .map(|mut row| {
            row.remove(age_column);
            row
        })
        .collect()
}

fn rows(expected: &[&[&str]]) -> Vec<Vec<String>> {
    expected
        .iter()
        .map(|r| r.iter().map(|c| c.to_string()).collect())
        .collect()
}

#[test]
fn kubevirt_wide_list_through_kubectl_plugin_discovery() {
    let env = Env::kubevirt();
    let text = ok(env.kubectl(&["vm", "list", "-A", "-o", "wide"]));
    let header = text.lines().next().unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "NAMESPACE",
            "NAME",
            "STATUS",
            "NODE",
            "IP",
            "AGE",
            "CPU",
            "MEMORY",
            "AGENT",
            "MIGRATABLE",
            "RUN-STRATEGY",
            "POOL",
            "TRUST"
        ]
    );
    // Columns line up: every header starts where its cells start.
    let age_at = header.find("AGE").unwrap();
    for line in text.lines().skip(1) {
        assert_eq!(&line[age_at - 3..age_at], "   ", "aligned: {line}");
    }
    assert_eq!(
        without_age(table(&text), 5),
        rows(&[
            &[
                "NAMESPACE",
                "NAME",
                "STATUS",
                "NODE",
                "IP",
                "CPU",
                "MEMORY",
                "AGENT",
                "MIGRATABLE",
                "RUN-STRATEGY",
                "POOL",
                "TRUST"
            ],
            &[
                "default",
                "fedora-dv",
                "Provisioning",
                "<none>",
                "<none>",
                "<none>",
                "2Gi",
                "<none>",
                "<none>",
                "Always",
                "<none>",
                "none"
            ],
            &[
                "default",
                "web",
                "Running",
                "node-1",
                "10.244.1.10",
                "2",
                "2Gi",
                "true",
                "true",
                "Always",
                "<none>",
                "none"
            ],
            &[
                "dev",
                "api",
                "Migrating",
                "node-1",
                "10.244.1.30",
                "<none>",
                "1Gi",
                "false",
                "true",
                "Always",
                "<none>",
                "none"
            ],
            &[
                "dev", "batch", "Stopped", "<none>", "<none>", "<none>", "1Gi", "<none>", "<none>",
                "Halted", "<none>", "none"
            ],
            &[
                "prod",
                "db.primary",
                "Running",
                "node-2",
                "10.244.2.20",
                "4",
                "8Gi",
                "true",
                "false",
                "Always",
                "<none>",
                "none"
            ],
        ])
    );
}

#[test]
fn deckhouse_wide_list_through_kubectl_plugin_discovery() {
    let env = Env::deckhouse();
    let text = ok(env.kubectl(&["vm", "list", "-A", "-o", "wide"]));
    // Read by hand from tests/fixtures/deckhouse.yaml: status first (the CRD's printer columns
    // Phase, Node, IPAddress, Cores, CoreFraction, Memory read .status), the spec for what a VM
    // without status resources asks for. waiting-vm names no coreFraction: the class default
    // applies (CRD description of spec.cpu.coreFraction), which the VM does not say. It names
    // no runPolicy either: the API server serves the CRD's `default:`
    // (AlwaysOnUnlessStoppedManually, schemas/deckhouse/virtualmachines.yaml).
    assert_eq!(
        without_age(table(&text), 5),
        rows(&[
            &[
                "NAMESPACE",
                "NAME",
                "STATUS",
                "NODE",
                "IP",
                "CPU",
                "MEMORY",
                "AGENT",
                "MIGRATABLE",
                "RUN-STRATEGY",
                "CORE-FRACTION",
                "POOL",
                "TRUST"
            ],
            &[
                "default",
                "linux-vm",
                "Running",
                "node-1",
                "10.66.10.12",
                "1",
                "1Gi",
                "true",
                "true",
                "AlwaysOnUnlessStoppedManually",
                "10%",
                "<none>",
                "none"
            ],
            &[
                "dev", "builder", "Stopped", "<none>", "<none>", "2", "2Gi", "<none>", "<none>",
                "Manual", "50%", "<none>", "none"
            ],
            &[
                "dev",
                "waiting-vm",
                "Pending",
                "<none>",
                "<none>",
                "1",
                "1Gi",
                "<none>",
                "<none>",
                "AlwaysOnUnlessStoppedManually",
                "<none>",
                "<none>",
                "none"
            ],
            &[
                "prod",
                "db.primary",
                "Running",
                "node-2",
                "10.66.20.5",
                "4",
                "8Gi",
                "true",
                "false",
                "AlwaysOn",
                "100%",
                "<none>",
                "none"
            ],
        ])
    );
}

#[test]
fn namespace_comes_from_flag_or_context() {
    let env = Env::kubevirt();
    let text = ok(env.vm(&["list"]));
    let names: Vec<String> = table(&text)
        .into_iter()
        .skip(1)
        .map(|r| r[0].clone())
        .collect();
    assert_eq!(names, ["fedora-dv", "web"], "context namespace is default");
    let text = ok(env.vm(&["list", "-n", "prod"]));
    assert!(
        text.starts_with("NAME "),
        "no NAMESPACE column without -A:\n{text}"
    );
    assert_eq!(table(&text)[1][0], "db.primary");
    // The restricted context's namespace is dev, where alice may read.
    let text = ok(env.vm(&["list", "--context", "emulator-restricted"]));
    assert_eq!(table(&text).len(), 3, "{text}");
}

#[test]
fn selector_name_yaml_and_json_outputs() {
    let env = Env::kubevirt();
    assert_eq!(
        ok(env.vm(&["list", "-A", "-l", "app=web", "-o", "name"])),
        "virtualmachine.kubevirt.io/web\n"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(env.vm(&["list", "-n", "dev", "-o", "json"]))).unwrap();
    assert_eq!(json["kind"], "List");
    let names: Vec<&str> = json["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "batch"]);
    let yaml: serde_json::Value =
        yaml_serde::from_str(&ok(env.vm(&["list", "-n", "prod", "-o", "yaml"]))).unwrap();
    assert_eq!(yaml["items"][0]["metadata"]["name"], "db.primary");
    assert_eq!(yaml["items"][0]["kind"], "VirtualMachine");
}

#[test]
fn empty_namespace_says_so_on_stderr() {
    let env = Env::kubevirt();
    let output = env.vm(&["list", "-n", "kubevirt"]);
    assert_eq!(ok(output.clone()), "");
    assert_eq!(
        stderr(&output),
        "No virtual machines found in namespace \"kubevirt\".\n"
    );
}

#[test]
fn watch_prints_changes() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let env = Env::kubevirt();
    let mut child = env
        .command(crate::common::BIN)
        .args(["list", "-n", "dev", "-w"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || lines.next().unwrap().unwrap();
    assert!(next().starts_with("NAME"));
    assert!(next().starts_with("api "));
    assert!(next().starts_with("batch "));
    // Start the stopped VM behind the tool's back: the emulator's controller runs it.
    let mut batch = env
        .emulator
        .objects("kubevirt.io", "virtualmachines", Some("dev"))
        .into_iter()
        .find(|vm| vm["metadata"]["name"] == "batch")
        .unwrap();
    batch["status"]["printableStatus"] = "Starting".into();
    env.emulator.put_object(batch);
    let line = next();
    child.kill().unwrap();
    let _ = child.wait();
    // The whole row: AGE as kubectl prints it for the same object.
    let theirs = table(&ok(env.kubectl(&["get", "vm", "batch", "-n", "dev"])));
    let age_at = theirs[0].iter().position(|h| h == "AGE").unwrap();
    let age = theirs[1][age_at].clone();
    assert_eq!(
        table(&line),
        rows(&[&["batch", "Starting", "<none>", "<none>", age.as_str()]]),
        "{line}"
    );
}
