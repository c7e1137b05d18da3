//! `get`: details of one VM on both flavours, and the object itself.

use crate::common::{Env, ok};

#[test]
fn kubevirt_details() {
    let env = Env::kubevirt();
    let text = ok(env.vm(&["get", "web"]));
    for expected in [
        "Name:         web\n",
        "Namespace:    default\n",
        "Platform:     KubeVirt\n",
        "Status:       Running\n",
        "Node:         node-1\n",
        "IP:           10.244.1.10\n",
        "Created:      2026-01-10T09:00:00Z (",
        "CPU:          2\n",
        "Memory:       2Gi\n",
        "Guest agent:  connected\n",
        "Guest OS:     Fedora Linux 42 (Cloud Edition)\n",
        "  rootdisk        containerDisk quay.io/containerdisks/fedora:42",
        "  cloudinitdisk   cloud-init NoCloud",
        "SuccessfulCreate",
        "Started the virtual machine by creating the new virtual machine instance web",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
}

#[test]
fn dotted_names_and_condition_messages() {
    let env = Env::kubevirt();
    for target in [
        vec!["get", "db.primary.prod"],
        vec!["get", "vm/db.primary/prod"],
        vec!["get", "vm/db.primary", "-n", "prod"],
    ] {
        let text = ok(env.vm(&target));
        assert!(
            text.contains("Name:         db.primary\n"),
            "{target:?}:\n{text}"
        );
        assert!(text.contains("LiveMigratable   False    DisksNotLiveMigratable   cannot migrate VMI: PVC db-primary-root is not shared"), "{text}");
        assert!(text.contains("Migratable:   no\n"), "{text}");
    }
}

#[test]
fn object_outputs() {
    let env = Env::kubevirt();
    let yaml: serde_json::Value =
        yaml_serde::from_str(&ok(env.vm(&["get", "batch.dev", "-o", "yaml"]))).unwrap();
    assert_eq!(yaml["spec"]["runStrategy"], "Halted");
    let json: serde_json::Value =
        serde_json::from_str(&ok(env.vm(&["get", "batch.dev", "-o", "json"]))).unwrap();
    assert_eq!(json, yaml);
    assert_eq!(
        ok(env.vm(&["get", "batch.dev", "-o", "name"])),
        "virtualmachine.kubevirt.io/batch\n"
    );
}

#[test]
fn deckhouse_details() {
    let env = Env::deckhouse();
    let vm = env
        .emulator
        .objects("virtualization.deckhouse.io", "virtualmachines", None)
        .into_iter()
        .find(|vm| vm["status"]["phase"] == "Running")
        .expect("fixture has a running Deckhouse VM");
    let name = vm["metadata"]["name"].as_str().unwrap();
    let ns = vm["metadata"]["namespace"].as_str().unwrap();
    let text = ok(env.vm(&["get", name, "-n", ns]));
    assert!(
        text.contains("Platform:     Deckhouse virtualization\n"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "IP:           {}\n",
            vm["status"]["ipAddress"].as_str().unwrap()
        )),
        "{text}"
    );
    let disk = vm["spec"]["blockDeviceRefs"][0]["name"].as_str().unwrap();
    assert!(
        text.contains(&format!("VirtualDisk {disk}")) || text.contains(disk),
        "{text}"
    );
    assert_eq!(
        ok(env.vm(&["get", name, "-n", ns, "-o", "name"])),
        format!("virtualmachine.virtualization.deckhouse.io/{name}\n")
    );
}

/// The cells of the row of the Disks section that starts with `disk`.
fn disk_row(text: &str, disk: &str) -> Vec<String> {
    let section = text
        .split("\nDisks:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no Disks section:\n{text}"));
    section
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .find(|cells| cells.first().map(String::as_str) == Some(disk))
        .unwrap_or_else(|| panic!("no disk {disk}:\n{text}"))
}

#[test]
fn provisioning_vm_shows_import_progress() {
    // tests/fixtures/kubevirt.yaml: DataVolume fedora-dv-root is ImportInProgress at 45.0%.
    let env = Env::kubevirt();
    let text = ok(env.vm(&["get", "fedora-dv"]));
    assert!(text.contains("Status:       Provisioning\n"), "{text}");
    assert_eq!(
        disk_row(&text, "NAME"),
        ["NAME", "SOURCE", "SIZE", "IMPORT"]
    );
    assert_eq!(
        disk_row(&text, "rootdisk"),
        [
            "rootdisk",
            "DataVolume",
            "fedora-dv-root",
            "<none>",
            "ImportInProgress",
            "45%"
        ]
    );
    // A disk the platform does not import has no import state.
    let text = ok(env.vm(&["get", "web"]));
    assert_eq!(
        disk_row(&text, "cloudinitdisk"),
        ["cloudinitdisk", "cloud-init", "NoCloud", "<none>", "<none>"]
    );

    // tests/fixtures/deckhouse.yaml: VirtualDisk new-disk is Provisioning at 37%, and
    // builder-disk is Ready (progress 100%).
    let env = Env::deckhouse();
    let text = ok(env.vm(&["get", "waiting-vm.dev"]));
    assert_eq!(
        disk_row(&text, "new-disk"),
        [
            "new-disk",
            "VirtualDisk",
            "new-disk",
            "<none>",
            "Provisioning",
            "37%"
        ]
    );
    let text = ok(env.vm(&["get", "builder.dev"]));
    assert_eq!(
        disk_row(&text, "builder-disk"),
        [
            "builder-disk",
            "VirtualDisk",
            "builder-disk",
            "20Gi",
            "Ready",
            "100%"
        ]
    );
}

/// `get --help` does not offer `-o wide` (get refuses it), and the lifecycle commands'
/// `--dry-run` values speak of their own requests, not of deleting.
#[test]
fn help_offers_only_what_the_command_does() {
    let env = Env::kubevirt();
    let get = ok(env.vm(&["get", "--help"]));
    let output_help: String = get
        .lines()
        .skip_while(|l| !l.contains("--output"))
        .take_while(|l| !l.trim_start().starts_with("--show-managed-fields"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(output_help.contains("yaml"), "{get}");
    assert!(!output_help.contains("wide"), "{output_help}");
    for command in ["start", "stop", "restart", "pause", "migrate"] {
        let help = ok(env.vm(&[command, "--help"]));
        assert!(help.contains("--dry-run"), "{command}: {help}");
        assert!(
            !help.contains("Really delete") && !help.contains("would be deleted"),
            "{command}: {help}"
        );
    }
}
