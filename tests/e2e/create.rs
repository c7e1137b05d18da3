//! `create`: offline manifests, objects the (emulated) API server accepts under the real
//! schemas, all-or-nothing creation, waiting, cluster-side checks and every validation error.

use std::path::PathBuf;
use std::process::Output;

use kubevm_emulator::FailureRule;
use serde_json::Value;

use crate::common::{BIN, Env, etcd_timeout, find_object, ok, on_tty, stderr};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";
const SHA256: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// A user key and a CA key written as OpenSSH .pub files.
fn keys(env: &Env) -> (PathBuf, PathBuf) {
    let user = env.dir.path().join("user.pub");
    std::fs::write(&user, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ alice@laptop\n").unwrap();
    let ca = env.dir.path().join("ca.pub");
    std::fs::write(&ca, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKhuTx3UbMv7V3GfqnLbhy/2YQkbgRDybsdM05K+ALjI platform-ca\n").unwrap();
    (user, ca)
}

fn yaml_documents(text: &str) -> Vec<Value> {
    text.split("\n---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| yaml_serde::from_str(d).unwrap())
        .collect()
}

/// Boot-source flag sets for one flavour.
fn boot_sources(deckhouse: bool) -> Vec<Vec<&'static str>> {
    let mut sources = vec![
        vec!["--image", IMAGE],
        vec![
            "--url",
            "https://images.example.org/disk.qcow2",
            "--checksum",
            SHA256,
        ],
        vec!["--url", "https://images.example.org/disk.qcow2"],
        vec!["--blank", "20Gi"],
        vec!["--disk", "existing-root"],
    ];
    if deckhouse {
        sources.push(vec!["--image", "cvi/ubuntu-24-04"]);
    } else {
        sources.push(vec!["--image", IMAGE, "--ephemeral"]);
        sources.push(vec!["--clone-pvc", "golden/ubuntu-root"]);
    }
    sources
}

/// Offline manifests for every boot source pass the emulator's real-schema validation
/// (server-side dry run through real kubectl).
fn offline_manifests_validate(env: &Env, flavor: &str) {
    let (user, ca) = keys(env);
    for source in boot_sources(flavor == "deckhouse") {
        let mut args = vec![
            "create",
            "vm1",
            "--flavor",
            flavor,
            "--dry-run=client",
            "-o",
            "yaml",
            "-n",
            "dev",
        ];
        args.extend(&source);
        let (user, ca) = (user.to_str().unwrap(), ca.to_str().unwrap());
        let data_disk = if flavor == "kubevirt" {
            "data=5Gi,bus=scsi"
        } else {
            "data=5Gi"
        };
        args.extend([
            "--ssh-key",
            user,
            "--ca-public-key",
            ca,
            "--env",
            "STAGE=test",
            "--data-disk",
            data_disk,
        ]);
        // No cluster at all: the kubeconfig points nowhere.
        let output = env
            .command(BIN)
            .args(&args)
            .env("KUBECONFIG", "/nonexistent")
            .output()
            .unwrap();
        let text = ok(output);
        let documents = yaml_documents(&text);
        assert!(
            documents.iter().any(|d| d["kind"] == "VirtualMachine"),
            "{source:?}:\n{text}"
        );
        let file = env.dir.path().join("manifests.yaml");
        std::fs::write(&file, &text).unwrap();
        let applied = env.kubectl(&["apply", "--dry-run=server", "-f", file.to_str().unwrap()]);
        assert!(
            applied.status.success(),
            "{flavor} {source:?} refused by the API server:\n{}\n{text}",
            stderr(&applied)
        );
    }
}

#[test]
fn kubevirt_offline_manifests_pass_the_real_schemas() {
    offline_manifests_validate(&Env::kubevirt(), "kubevirt");
}

#[test]
fn deckhouse_offline_manifests_pass_the_real_schemas() {
    offline_manifests_validate(&Env::deckhouse(), "deckhouse");
}

/// `kubectl-vm create app -n NS ARGS`.
fn create_app(env: &Env, ns: &str, args: &[&str]) -> Output {
    env.vm(&[&["create", "app", "-n", ns], args].concat())
}

fn names(env: &Env, group: &str, plural: &str, ns: &str) -> Vec<String> {
    let mut names: Vec<String> = env
        .emulator
        .objects(group, plural, Some(ns))
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn kubevirt_create_and_wait() {
    let env = Env::kubevirt();
    let (user, _) = keys(&env);
    let output = create_app(
        &env,
        "dev",
        &[
            "--image",
            IMAGE,
            "--cpu",
            "2",
            "--memory",
            "2Gi",
            "--ssh-key",
            user.to_str().unwrap(),
            "--wait",
            "--timeout",
            "60s",
        ],
    );
    let text = ok(output.clone());
    assert_eq!(text, "virtualmachine.kubevirt.io/app created\n");
    let log = stderr(&output);
    assert!(
        log.contains("Warning: no platform SSH CA in namespace \"kubevm-system\""),
        "{log}"
    );
    assert!(
        log.contains("disk app-root: ImportInProgress"),
        "progress lines without a terminal:\n{log}"
    );
    assert!(
        log.ends_with("virtualmachine \"app\" is Running\n"),
        "{log}"
    );
    assert!(names(&env, "kubevirt.io", "virtualmachines", "dev").contains(&"app".to_owned()));
    assert!(names(&env, "cdi.kubevirt.io", "datavolumes", "dev").contains(&"app-root".to_owned()));
    let vm = find_object(&env, "kubevirt.io", "virtualmachines", Some("dev"), "app").unwrap();
    assert_eq!(vm["spec"]["template"]["spec"]["domain"]["cpu"]["cores"], 2);
    assert_eq!(
        vm["spec"]["template"]["spec"]["domain"]["memory"]["guest"],
        "2Gi"
    );
    // A second create of the same name is refused before anything is written.
    let again = env.vm(&["create", "app", "-n", "dev", "--image", IMAGE]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).ends_with("Error: virtualmachine \"app\" already exists in namespace \"dev\"; delete it first or choose another name\n"), "{}", stderr(&again));
}

#[test]
fn deckhouse_create_and_wait() {
    let env = Env::deckhouse();
    let (user, ca) = keys(&env);
    let ns = env
        .emulator
        .objects("virtualization.deckhouse.io", "virtualmachines", None)[0]["metadata"]["namespace"]
        .as_str()
        .unwrap()
        .to_owned();
    let output = create_app(
        &env,
        &ns,
        &[
            "--url",
            "https://images.example.org/disk.qcow2",
            "--checksum",
            SHA256,
            "--data-disk",
            "data=5Gi",
            "--ssh-key",
            user.to_str().unwrap(),
            "--ca-public-key",
            ca.to_str().unwrap(),
            "--wait",
            "--timeout",
            "60s",
        ],
    );
    let text = ok(output.clone());
    assert_eq!(
        text,
        // The user data (with the VM-scoped principal files) is over the 2048 bytes Deckhouse
        // takes inline, so it goes into a Secret the VM references.
        "virtualdisk.virtualization.deckhouse.io/app-root created\nvirtualdisk.virtualization.deckhouse.io/app-data created\nvirtualmachine.virtualization.deckhouse.io/app created\nsecret/app-cloudinit created\n",
        "{}",
        stderr(&output)
    );
    let disk = find_object(
        &env,
        "virtualization.deckhouse.io",
        "virtualdisks",
        Some(&ns),
        "app-root",
    )
    .unwrap();
    assert_eq!(
        disk["spec"]["dataSource"]["http"]["checksum"]["sha256"],
        SHA256.trim_start_matches("sha256:")
    );
    let vm = find_object(
        &env,
        "virtualization.deckhouse.io",
        "virtualmachines",
        Some(&ns),
        "app",
    )
    .unwrap();
    assert_eq!(
        vm["spec"]["provisioning"]["userDataRef"]["name"],
        "app-cloudinit"
    );
    let secret = find_object(&env, "", "secrets", Some(&ns), "app-cloudinit").unwrap();
    let encoded = secret["data"]["userData"].as_str().unwrap_or_default();
    let user_data = String::from_utf8(
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded).unwrap(),
    )
    .unwrap();
    assert!(
        user_data.contains("platform-ca") && user_data.contains("kubevm@app.default"),
        "the CA key and the VM-scoped principal are in the guest's user data:\n{user_data}"
    );
}

#[test]
fn failure_after_the_first_object_leaves_nothing_behind() {
    let env = Env::kubevirt();
    env.emulator
        .inject_failure(etcd_timeout("create", "virtualmachines"));
    let output = create_app(
        &env,
        "dev",
        &[
            "--url",
            "https://images.example.org/disk.qcow2",
            "--checksum",
            SHA256,
            "--no-platform-ssh",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        "Error: cannot create virtualmachine \"app\": the server answered 500 InternalError: etcdserver: request timed out; removed the 1 object created before it\n"
    );
    assert!(
        !names(&env, "cdi.kubevirt.io", "datavolumes", "dev")
            .iter()
            .any(|n| n.starts_with("app"))
    );
    assert!(!names(&env, "kubevirt.io", "virtualmachines", "dev").contains(&"app".to_owned()));
}

#[test]
fn failure_of_an_owned_secret_removes_the_vm_too() {
    let env = Env::kubevirt();
    env.emulator.inject_failure(FailureRule {
        verb: "create".into(),
        plural: "secrets".into(),
        name: None,
        code: 403,
        // The authorizer's wording (k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go).
        message: "secrets \"app-cloudinit\" is forbidden: User \"admin\" cannot create resource \"secrets\" in API group \"\" in the namespace \"dev\"".into(),
        times: None,
    });
    let (_, ca) = keys(&env);
    // A password makes the user data secret, so it goes into a Secret owned by the VM.
    let cloud_init = env.dir.path().join("user-data");
    std::fs::write(&cloud_init, "#cloud-config\nchpasswd:\n  expire: false\n  users:\n  - {name: root, password: hunter2, type: text}\n").unwrap();
    let output = create_app(
        &env,
        "dev",
        &[
            "--image",
            IMAGE,
            "--ca-public-key",
            ca.to_str().unwrap(),
            "--cloud-init",
            cloud_init.to_str().unwrap(),
        ],
    );
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr(&output),
        "Error: cannot create secret \"app-cloudinit\": forbidden: user \"admin\" cannot create secrets \"app-cloudinit\" in namespace \"dev\"; removed the 1 object created before it\n"
    );
    assert!(!names(&env, "kubevirt.io", "virtualmachines", "dev").contains(&"app".to_owned()));
    assert!(!names(&env, "", "secrets", "dev").contains(&"app-cloudinit".to_owned()));
}

#[test]
fn server_dry_run_writes_nothing() {
    let env = Env::kubevirt();
    let text = ok(create_app(
        &env,
        "dev",
        &["--image", IMAGE, "--dry-run=server", "--no-platform-ssh"],
    ));
    assert_eq!(
        text,
        "virtualmachine.kubevirt.io/app created (server dry run)\n"
    );
    assert!(!names(&env, "kubevirt.io", "virtualmachines", "dev").contains(&"app".to_owned()));
}

#[test]
fn checksums_the_cluster_cannot_verify_are_refused() {
    let env = Env::kubevirt();
    let mut cdi = env.emulator.objects("cdi.kubevirt.io", "cdis", None)[0].clone();
    cdi["status"]["observedVersion"] = "v1.60.2".into();
    env.emulator.put_object(cdi);
    let args = [
        "create",
        "app",
        "-n",
        "dev",
        "--url",
        "https://images.example.org/disk.qcow2",
        "--checksum",
        SHA256,
        "--no-platform-ssh",
    ];
    let output = env.vm(&args);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr(&output),
        "Error: CDI v1.60 does not verify checksums (v1.65 and later do); refusing to import app unverified (pass --allow-unverified to import it anyway)\n"
    );
    assert!(
        names(&env, "cdi.kubevirt.io", "datavolumes", "dev")
            .iter()
            .all(|n| !n.starts_with("app"))
    );
    let mut allowed = args.to_vec();
    allowed.push("--allow-unverified");
    let output = env.vm(&allowed);
    ok(output.clone());
    assert!(
        stderr(&output).starts_with("Warning: CDI v1.60 does not verify checksums"),
        "{}",
        stderr(&output)
    );
    let vm = find_object(&env, "kubevirt.io", "virtualmachines", Some("dev"), "app").unwrap();
    assert!(
        !vm.to_string().contains("checksum"),
        "no checksum is sent that nobody checks"
    );
}

#[test]
fn deckhouse_sizing_policy_violations_are_reported_together() {
    let env = Env::deckhouse();
    let output = create_app(
        &env,
        "default",
        &[
            "--image",
            IMAGE,
            "--cpu",
            "2",
            "--memory",
            "1Mi",
            "--core-fraction",
            "7%",
            "--no-platform-ssh",
        ],
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("sizing policy") && err.contains("several reasons"),
        "{err}"
    );
}

#[test]
fn require_ca_fails_without_a_ca() {
    let env = Env::kubevirt();
    let output = create_app(&env, "dev", &["--image", IMAGE, "--require-ca"]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr(&output),
        "Error: no platform SSH CA in namespace \"kubevm-system\": run `kubectl vm ca init`, or pass --ca-public-key\n"
    );
}

/// A create that asks for what its flags leave out (on a terminal), writing nothing.
const INTERACTIVE_DEMO: [&str; 8] = [
    "create",
    "demo",
    "-n",
    "dev",
    "--dry-run=client",
    "--flavor",
    "kubevirt",
    "--no-platform-ssh",
];

#[test]
fn interactive_create_through_a_terminal() {
    let env = Env::kubevirt();
    let ssh = env.dir.path().join(".ssh");
    std::fs::create_dir(&ssh).unwrap();
    let (user, _) = keys(&env);
    std::fs::copy(&user, ssh.join("id_ed25519.pub")).unwrap();
    let mut session = on_tty(&env, &[&INTERACTIVE_DEMO[..], &["-o", "name"]].concat());
    session.exp_string("Boot image").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Boot disk size").unwrap();
    session.send_line("").unwrap();
    session.exp_string("CPU cores").unwrap();
    session.send_line("2").unwrap();
    session.exp_string("Memory").unwrap();
    session.send_line("").unwrap();
    session.exp_string("SSH public key").unwrap();
    session.send_line("").unwrap();
    session.exp_string("cores: 2").unwrap();
    session.exp_string("Create these").unwrap();
    session.send_line("y").unwrap();
    session
        .exp_string("virtualmachine.kubevirt.io/demo")
        .unwrap();
    session.exp_eof().unwrap();
}

#[test]
fn with_a_cluster_ca_the_guest_gets_a_signed_host_key_in_a_secret() {
    let env = Env::kubevirt();
    ok(env.vm(&["ca", "init"]));
    let ca_public = find_object(
        &env,
        "",
        "configmaps",
        Some("kubevm-system"),
        "kubevm-ssh-ca",
    )
    .unwrap()["data"]["ca.pub"]
        .as_str()
        .unwrap()
        .trim()
        .to_owned();
    let text = ok(create_app(&env, "dev", &["--image", IMAGE, "--require-ca"]));
    assert_eq!(
        text,
        "virtualmachine.kubevirt.io/app created\nsecret/app-cloudinit created\n"
    );
    let secret = find_object(&env, "", "secrets", Some("dev"), "app-cloudinit").unwrap();
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["kind"],
        "VirtualMachine"
    );
    // The API server stores stringData as base64 data (the emulator converts it like the real one).
    assert!(
        secret.get("stringData").is_none(),
        "stringData is write-only"
    );
    let data = {
        use base64::Engine;
        let encoded = secret["data"]["userdata"].as_str().expect("data.userdata");
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap(),
        )
        .unwrap()
    };
    assert!(
        data.contains(&ca_public),
        "the guest trusts the cluster's CA"
    );
    assert!(
        data.contains("ed25519_private: |") || data.contains("ed25519_private:"),
        "host key delivered:\n{data}"
    );
    assert!(
        data.contains("ssh-ed25519-cert-v01@openssh.com"),
        "host certificate delivered"
    );
    let vm = find_object(&env, "kubevirt.io", "virtualmachines", Some("dev"), "app").unwrap();
    assert!(
        !vm.to_string().contains("PRIVATE KEY"),
        "no private key inline in the VM"
    );
}

#[test]
fn create_then_delete_leaves_nothing() {
    let env = Env::kubevirt();
    let (_, ca) = keys(&env);
    ok(create_app(
        &env,
        "dev",
        &[
            "--url",
            "https://images.example.org/disk.qcow2",
            "--checksum",
            SHA256,
            "--data-disk",
            "data=1Gi",
            "--ca-public-key",
            ca.to_str().unwrap(),
            "--env",
            "K=v",
            "--wait",
            "--timeout",
            "60s",
        ],
    ));
    let before = names(&env, "cdi.kubevirt.io", "datavolumes", "dev");
    assert!(
        before.contains(&"app-root".to_owned()) && before.contains(&"app-data".to_owned()),
        "{before:?}"
    );
    ok(env.vm(&["delete", "app", "-n", "dev", "--yes"]));
    for (group, plural) in [
        ("kubevirt.io", "virtualmachines"),
        ("kubevirt.io", "virtualmachineinstances"),
        ("cdi.kubevirt.io", "datavolumes"),
        ("", "persistentvolumeclaims"),
        ("", "secrets"),
    ] {
        let left: Vec<String> = names(&env, group, plural, "dev")
            .into_iter()
            .filter(|n| n.starts_with("app"))
            .collect();
        assert!(left.is_empty(), "{plural} left behind: {left:?}");
    }
}

#[test]
fn wait_shows_progress_bars_on_a_terminal() {
    let env = Env::kubevirt();
    let mut session = on_tty(
        &env,
        &[
            "create",
            "app",
            "-n",
            "dev",
            "--image",
            IMAGE,
            "--no-platform-ssh",
            "--wait",
            "--timeout",
            "60s",
        ],
    );
    session
        .exp_string("virtualmachine.kubevirt.io/app created")
        .unwrap();
    // The bar: disk name, a bracketed bar with '=' fill, and the phase.
    session.exp_regex(r"app-root \[=+").unwrap();
    session
        .exp_string("virtualmachine \"app\" is Running")
        .unwrap();
    session.exp_eof().unwrap();
}

#[test]
fn ctrl_c_at_an_interactive_prompt_exits_130() {
    let env = Env::kubevirt();
    let mut session = on_tty(&env, &INTERACTIVE_DEMO);
    session.exp_string("Boot image").unwrap();
    session.send_control('c').unwrap();
    // The menu hid the cursor; it is shown again before the program ends.
    session.exp_string("\x1b[?25h").unwrap();
    session.exp_eof().unwrap();
    assert_eq!(crate::common::exit_code(&session), 130);
}
