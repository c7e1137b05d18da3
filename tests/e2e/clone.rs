//! `clone` end to end on both platforms: the new VM runs with disks of its own whose bytes
//! equal the source's (both exported, sha256sum compared, and on KubeVirt against the file
//! uploaded into the source), the source is unchanged (resourceVersion and spec read with real
//! kubectl before and after), `delete NEW` removes the clone and leaves the source; a taken
//! name or an unknown source is one line with nothing created. The requests the clone sends
//! are checked against FACTS (KubeVirt `clone.kubevirt.io/v1beta1` VirtualMachineClone,
//! Deckhouse VirtualMachineOperation `type: Clone` with `clone.nameReplacement`).
//!
//! A clone of a VM made by `create` has its own identity: its Secret names only the clone's
//! principals, its host certificate (read with `ssh-keygen -L`) names the clone and certifies
//! a new key, the source's Secret and VM are unchanged, and the clone's real sshd refuses a
//! certificate for the source and takes its own.

use kubevm_emulator::ServeFlavor;
use serde_json::Value;

use crate::common::{Env, changes, fails, ok, stderr, stdout};
use crate::export::sha256_of;

const MIB: u64 = 1 << 20;

fn get_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

/// The source as kubectl shows it: generation, labels, annotations and spec (its status moves
/// on by itself while it runs, so its resourceVersion may too).
fn source_state(env: &Env, kind: &str, name: &str) -> (Value, Value) {
    let vm = get_json(env, &["get", kind, name]);
    let meta = &vm["metadata"];
    (
        serde_json::json!([meta["generation"], meta["labels"], meta["annotations"]]),
        vm["spec"].clone(),
    )
}

fn export_sha(env: &Env, target: &str) -> String {
    let file = env
        .dir
        .path()
        .join(format!("{}.img", target.replace('/', "-")));
    let out = crate::export::export(env, &[target, "-o", file.to_str().unwrap()]);
    assert!(out.status.success(), "export {target}: {}", stderr(&out));
    sha256_of(&file)
}

#[test]
fn kubevirt_clone_runs_with_copies_of_the_disks() {
    let env = Env::kubevirt();
    // The source's disk holds known bytes: a raw file uploaded into it.
    let raw = env.dir.path().join("data.raw");
    crate::upload::noise(&raw, 8 * MIB);
    let out = env.vm(&[
        "upload",
        raw.to_str().unwrap(),
        "dv/src-root",
        "--size",
        "64Mi",
        "--format",
        "raw",
    ]);
    assert!(out.status.success(), "upload: {}", stderr(&out));
    ok(env.vm(&["create", "src", "--disk", "src-root", "--no-platform-ssh"]));
    let before = source_state(&env, "vm", "src");
    env.emulator.clear_requests();
    let out = env.vm(&["clone", "src", "dst", "--start"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "virtualmachine.kubevirt.io/dst cloned from default/src with disks dst-rootdisk; started\n",
        "{}",
        stderr(&out)
    );
    // Progress polls the clone, so a phase that passed between two looks may not show: the
    // ones shown come in upstream's order and end with Succeeded.
    phases_in_order(
        &stderr(&out),
        &[
            "accepted",
            "SnapshotInProgress",
            "RestoreInProgress",
            "CreatingTargetVM",
            "Succeeded",
        ],
    );
    // The one write of the clone is the VirtualMachineClone (FACTS: clone.kubevirt.io/v1beta1);
    // then the start.
    let wire = changes(&env);
    assert_eq!(
        (wire[0].0.as_str(), wire[0].1.as_str()),
        (
            "POST",
            "/apis/clone.kubevirt.io/v1beta1/namespaces/default/virtualmachineclones"
        ),
        "{wire:#?}"
    );
    let body = wire[0].2.clone().unwrap();
    assert_eq!(body["spec"]["source"]["name"], "src");
    assert_eq!(body["spec"]["source"]["kind"], "VirtualMachine");
    assert_eq!(body["spec"]["target"]["name"], "dst");
    assert!(
        wire[1..].iter().all(|(m, p, _)| p
            .starts_with("/apis/kubevirt.io/v1/namespaces/default/virtualmachines/dst")
            || p.starts_with(
                "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/dst/start"
            )
            || (m == "PUT" && p.contains("/dst/"))),
        "{wire:#?}"
    );
    // Runs, with a claim of its own, labelled as ours; no MAC or serial of the source.
    let dst = get_json(&env, &["get", "vm", "dst"]);
    assert_eq!(dst["status"]["printableStatus"], "Running");
    assert_eq!(dst["metadata"]["labels"]["kubevm.io/vm"], "dst");
    assert_eq!(
        dst["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kubectl-vm"
    );
    let claim = dst["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|v| v.pointer("/persistentVolumeClaim/claimName"))
        .and_then(Value::as_str)
        .unwrap()
        .to_owned();
    assert_eq!(claim, "dst-rootdisk");
    let pvc = get_json(&env, &["get", "pvc", &claim]);
    assert_eq!(pvc["metadata"]["ownerReferences"][0]["name"], "dst");
    // The bytes: both exported, equal to each other and to the uploaded file grown with zeros
    // to the claim's size (CDI resizes a raw upload to its volume).
    let src_sha = export_sha(&env, "pvc/src-root");
    let exported = std::fs::metadata(env.dir.path().join("pvc-src-root.img"))
        .unwrap()
        .len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&raw)
        .unwrap()
        .set_len(exported)
        .unwrap();
    let want = sha256_of(&raw);
    assert_eq!(src_sha, want);
    assert_eq!(export_sha(&env, &format!("pvc/{claim}")), want);
    // The source is unchanged.
    assert_eq!(source_state(&env, "vm", "src"), before);
    // The clone object stays, Succeeded (KubeVirt deletes it with its target VM).
    let record = get_json(&env, &["get", "vmclone", "clone-dst"]);
    assert_eq!(record["status"]["phase"], "Succeeded");
    bundles_hold(&env, "virtualmachineclone/clone-dst.yaml");

    // A taken name: one line, nothing created.
    env.emulator.clear_requests();
    let err = fails(&env, &["clone", "src", "dst"], 1);
    assert_eq!(
        err,
        "Error: virtualmachine \"dst\" already exists in namespace \"default\"; nothing was created (choose another name)"
    );
    // An unknown source: one line, nothing created.
    let err = fails(&env, &["clone", "nope", "dst2"], 1);
    assert!(err.contains("\"nope\" not found"), "{err}");
    // Bad names: refused before any request.
    let err = fails(&env, &["clone", "src", "Bad_Name"], 2);
    assert!(err.starts_with("Error: "), "{err}");
    assert!(changes(&env).is_empty(), "{:#?}", changes(&env));

    // delete dst takes the clone (and its claim) and leaves the source.
    ok(env.vm(&["delete", "dst"]));
    assert!(!env.kubectl(&["get", "vm", "dst"]).status.success());
    assert_eq!(source_state(&env, "vm", "src"), before);
    assert!(env.kubectl(&["get", "pvc", "src-root"]).status.success());
}

#[test]
fn kubevirt_dry_runs_send_nothing_or_are_not_stored() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let out = env.vm(&["clone", "web", "web-2", "--dry-run", "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let object: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(object["kind"], "VirtualMachineClone");
    assert_eq!(object["apiVersion"], "clone.kubevirt.io/v1beta1");
    assert!(changes(&env).is_empty());
    let out = env.vm(&["clone", "web", "web-2", "--dry-run=server", "-o", "name"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "virtualmachine.kubevirt.io/web-2\n");
    let wire = changes(&env);
    assert_eq!(wire.len(), 1, "{wire:#?}");
    assert!(
        !env.kubectl(&["get", "vmclone", "clone-web-2"])
            .status
            .success()
    );
}

#[test]
fn deckhouse_clone_runs_with_copies_of_the_disks() {
    let env = Env::with_step(
        ServeFlavor::Deckhouse,
        "deckhouse.yaml",
        std::time::Duration::from_millis(100),
    );
    ok(env.vm(&["create", "src", "--blank", "64Mi", "--no-platform-ssh"]));
    let before = source_state(&env, "vm", "src");
    let src_disks: Vec<String> = before.1["blockDeviceRefs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "VirtualDisk")
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect();
    env.emulator.clear_requests();
    let out = env.vm(&["clone", "src", "dst", "--start", "-o", "name"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "virtualmachine.virtualization.deckhouse.io/dst\n"
    );
    phases_in_order(&stderr(&out), &["accepted", "InProgress", "Completed"]);
    let wire = changes(&env);
    assert_eq!(
        (wire[0].0.as_str(), wire[0].1.as_str()),
        (
            "POST",
            "/apis/virtualization.deckhouse.io/v1alpha2/namespaces/default/virtualmachineoperations"
        ),
        "{wire:#?}"
    );
    let op = wire[0].2.clone().unwrap();
    assert_eq!(op["spec"]["type"], "Clone");
    assert_eq!(op["spec"]["virtualMachineName"], "src");
    let rules = op["spec"]["clone"]["nameReplacement"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r["from"]["kind"] == "VirtualMachine" && r["to"] == "dst")
    );
    // The other writes label the new VM and its disks, and make the operation and the copied
    // Secret the new VM's (merge patches), nothing else.
    assert!(
        wire[1..].iter().all(|(m, p, _)| m == "PATCH"
            && (p.ends_with("/virtualmachines/dst")
                || p.contains("/virtualdisks/dst-")
                || p.ends_with("/virtualmachineoperations/clone-dst")
                || p.contains("/secrets/dst-"))),
        "{wire:#?}"
    );
    assert!(
        wire.iter()
            .any(|(_, p, _)| p.ends_with("/virtualmachineoperations/clone-dst")),
        "{wire:#?}"
    );
    let dst = get_json(&env, &["get", "vm", "dst"]);
    assert_eq!(dst["status"]["phase"], "Running");
    assert_eq!(dst["metadata"]["labels"]["kubevm.io/vm"], "dst");
    let dst_disks: Vec<String> = dst["spec"]["blockDeviceRefs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "VirtualDisk")
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(dst_disks.len(), src_disks.len());
    for (s, d) in src_disks.iter().zip(&dst_disks) {
        assert_ne!(s, d);
        let vd = get_json(&env, &["get", "vd", d]);
        assert_eq!(vd["metadata"]["labels"]["kubevm.io/vm"], "dst");
        assert_eq!(vd["metadata"]["ownerReferences"][0]["name"], "dst");
        let src_pvc =
            get_json(&env, &["get", "vd", s])["status"]["target"]["persistentVolumeClaimName"]
                .clone();
        assert_ne!(vd["status"]["target"]["persistentVolumeClaimName"], src_pvc);
        assert_eq!(
            export_sha(&env, &format!("vd/{s}")),
            export_sha(&env, &format!("vd/{d}"))
        );
    }
    assert_eq!(source_state(&env, "vm", "src"), before);
    // The operation is kept as the record.
    let record = get_json(&env, &["get", "vmop", "clone-dst"]);
    assert_eq!(record["status"]["phase"], "Completed");
    bundles_hold(&env, "virtualmachineoperation/clone-dst.yaml");

    env.emulator.clear_requests();
    let err = fails(&env, &["clone", "src", "dst"], 1);
    assert_eq!(
        err,
        "Error: virtualmachine \"dst\" already exists in namespace \"default\"; nothing was created (choose another name)"
    );
    let err = fails(&env, &["clone", "nope", "dst2"], 1);
    assert!(err.contains("\"nope\" not found"), "{err}");
    assert!(changes(&env).is_empty(), "{:#?}", changes(&env));
    // The record and the copied Secret are owned by the new VM: they go with it.
    let dst = get_json(
        &env,
        &["get", "virtualmachines.virtualization.deckhouse.io", "dst"],
    );
    let copied_secret = dst["spec"]["provisioning"]["userDataRef"]["name"]
        .as_str()
        .map(str::to_owned);
    let record = get_json(&env, &["get", "vmop", "clone-dst"]);
    assert_eq!(
        record["metadata"]["ownerReferences"][0]["uid"],
        dst["metadata"]["uid"]
    );
    if let Some(secret) = &copied_secret {
        let sec = get_json(&env, &["get", "secret", secret]);
        assert_eq!(
            sec["metadata"]["ownerReferences"][0]["uid"],
            dst["metadata"]["uid"]
        );
    }
    ok(env.vm(&["delete", "dst"]));
    assert_eq!(source_state(&env, "vm", "src"), before);
    for s in &src_disks {
        assert!(env.kubectl(&["get", "vd", s]).status.success());
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while env.kubectl(&["get", "vmop", "clone-dst"]).status.success()
        || copied_secret
            .as_ref()
            .is_some_and(|s| env.kubectl(&["get", "secret", s]).status.success())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "clone-dst or its Secret stayed"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // So the same name can be cloned again.
    ok(env.vm(&["clone", "src", "dst"]));
}

/// The phases of `all` that `err` shows appear in that order; the first and the last always do.
#[track_caller]
/// The debug bundles of the source and the new VM both hold the clone's record `file`.
fn bundles_hold(env: &Env, file: &str) {
    for vm in ["src", "dst"] {
        let (archive, _) = crate::debug_info::collect(env, &[vm]);
        let files = crate::debug_info::listing(&archive);
        assert!(files.iter().any(|f| f == file), "{vm}: {files:?}");
    }
}

fn phases_in_order(err: &str, all: &[&str]) {
    let mut at = 0;
    let mut seen = vec![];
    for phase in all {
        if let Some(i) = err[at..].find(phase) {
            at += i + phase.len();
            seen.push(*phase);
        }
    }
    assert_eq!(seen.first(), all.first(), "{err}");
    assert_eq!(seen.last(), all.last(), "{err}");
    for phase in all {
        let first = err.find(phase);
        assert!(
            first.is_none() || seen.contains(phase),
            "{phase} out of order in:\n{err}"
        );
    }
}

/// The decoded user data of Secret `name` in `default` and the Secret itself.
pub(crate) fn cloudinit_secret(env: &Env, name: &str) -> (String, Value) {
    use base64::Engine;
    let secret = get_json(env, &["get", "secret", name]);
    let data = secret["data"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(k, _)| k.as_str() == "userdata" || k.as_str() == "userData")
        .map(|(_, v)| v.as_str().unwrap().to_owned())
        .expect("user data");
    let text = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    (String::from_utf8(text).unwrap(), secret)
}

/// `(principals lines, host certificate line)` of the platform boot script in `text`.
pub(crate) fn platform_identity(text: &str) -> (Vec<String>, String) {
    let doc: Value = yaml_serde::from_str(text).unwrap();
    let script = doc["bootcmd"][0].as_str().unwrap();
    let mut principals = vec![];
    let mut cert = String::new();
    let mut lines = script.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("cat > /etc/ssh/kubevm_principals/") {
            principals.push(lines.next().unwrap().to_owned());
        } else if line.starts_with("cat > /etc/ssh/kubevm_ssh_host_ed25519_key-cert.pub") {
            cert = lines.next().unwrap().to_owned();
        }
    }
    (principals, cert)
}

/// `ssh-keygen -L` of a certificate line: (the certified key, the principals, the whole text).
pub(crate) fn keygen_list(env: &Env, cert: &str) -> (String, Vec<String>, String) {
    let path = env.dir.path().join("listed-cert.pub");
    std::fs::write(&path, format!("{cert}\n")).unwrap();
    let out = std::process::Command::new("ssh-keygen")
        .arg("-L")
        .arg("-f")
        .arg(&path)
        .output()
        .expect("ssh-keygen not found: install openssh-client");
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    let key = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Public key: "))
        .unwrap()
        .to_owned();
    let principals = text
        .split("Principals:")
        .nth(1)
        .unwrap()
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("                "))
        .map(|l| l.trim().to_owned())
        .collect();
    (key, principals, text)
}

/// OpenSSH with the user certificate `cert` (and the tool's key) to `kubevm@VM.default`.
pub(crate) fn ssh_with_cert(env: &Env, vm: &str, cert: &std::path::Path) -> std::process::Output {
    let key = env.dir.path().join(".kube/kubectl-vm/ssh/id_ed25519");
    crate::common::openssh_via_vm(env, "", &format!("{vm}.default"), &key, cert)
        .args([&format!("kubevm@{vm}.default"), "true"])
        .output()
        .unwrap()
}

/// A VM made by `create` (through the signer), cloned: the clone has an identity of its own.
fn clone_has_its_own_identity(env: &Env, kind: &str) {
    let _signer = crate::signer::start_signer(env, &[]);
    crate::ssh::vm_with_ca(env, "orig", &[]);
    let (orig_text, orig_secret) = cloudinit_secret(env, "orig-cloudinit");
    let (orig_principals, orig_cert) = platform_identity(&orig_text);
    assert_eq!(orig_principals, ["kubevm@orig.default"]);
    let (orig_key, _, _) = keygen_list(env, &orig_cert);
    let before = source_state(env, kind, "orig");
    // A certificate for orig, which orig accepts.
    ok(env.vm(&["ssh-cert", "orig.default.vm"]));
    let orig_user_cert = env
        .dir
        .path()
        .join(".kube/kubectl-vm/ssh/certs/kubevm@orig.default.vm-cert.pub");
    let out = ssh_with_cert(env, "orig", &orig_user_cert);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let out = env.vm(&["clone", "orig", "copy", "--start"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // The copy's Secret names the copy only, with a new host key certified for the copy.
    let (text, secret) = cloudinit_secret(env, "copy-cloudinit");
    assert!(!text.contains("orig"), "{text}");
    let (principals, cert) = platform_identity(&text);
    assert_eq!(principals, ["kubevm@copy.default"]);
    let (key, cert_principals, listed) = keygen_list(env, &cert);
    assert_ne!(key, orig_key, "{listed}");
    assert_eq!(
        cert_principals,
        kubevm::ca::host_principals("copy", "default"),
        "{listed}"
    );
    assert!(listed.contains("host certificate"), "{listed}");
    let doc: Value = yaml_serde::from_str(&text).unwrap();
    let public = doc["ssh_keys"]["ed25519_public"].as_str().unwrap();
    // ssh-keygen prints the certified key as `ED25519-CERT SHA256:…`: the same key's fingerprint.
    let pub_file = env.dir.path().join("copy_host.pub");
    std::fs::write(&pub_file, format!("{public}\n")).unwrap();
    let fp = stdout(
        &std::process::Command::new("ssh-keygen")
            .args(["-l", "-E", "sha256", "-f"])
            .arg(&pub_file)
            .output()
            .unwrap(),
    );
    assert!(
        key.ends_with(fp.split_whitespace().nth(1).unwrap()),
        "{key} vs {fp}"
    );
    // Owned by the copy, labelled for it; the source's Secret and VM are as they were.
    let copy = get_json(env, &["get", kind, "copy"]);
    assert!(
        secret["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["uid"] == copy["metadata"]["uid"]),
        "{secret}"
    );
    assert_eq!(secret["metadata"]["labels"]["kubevm.io/vm"], "copy");
    let (_, orig_after) = cloudinit_secret(env, "orig-cloudinit");
    assert_eq!(
        orig_after["metadata"]["resourceVersion"],
        orig_secret["metadata"]["resourceVersion"]
    );
    assert_eq!(source_state(env, kind, "orig"), before);

    // The copy's real sshd refuses the certificate for orig, and takes its own (the tool
    // verifies the copy's host certificate on the way).
    let out = ssh_with_cert(env, "copy", &orig_user_cert);
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    let out = env.vm(&["ssh", "copy", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The copy's host does not pass for orig's: OpenSSH reaches the copy while verifying the
    // host as orig with the CA's known_hosts.
    let trust = env.dir.path().join("ca_known_hosts");
    std::fs::write(&trust, stdout(&env.vm(&["ssh-known-hosts"]))).unwrap();
    let alias = |vm: &str| kubevm::ca::host_principals(vm, "default")[0].clone();
    let verify_as = |alias: &str| {
        env.command("ssh")
            .args(["-F", "/dev/null", "-o", "BatchMode=yes"])
            .arg("-o")
            .arg(format!(
                "ProxyCommand={} port-forward --stdio copy.default 22",
                crate::common::BIN
            ))
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", trust.display()))
            .args(["-o", "StrictHostKeyChecking=yes", "-o"])
            .arg(format!("HostKeyAlias={alias}"))
            .arg("-i")
            .arg(env.dir.path().join(".kube/kubectl-vm/ssh/id_ed25519"))
            .args(["kubevm@copy", "true"])
            .output()
            .unwrap()
    };
    let out = verify_as(&alias("orig"));
    assert!(
        stderr(&out).contains("Host key verification failed"),
        "{}",
        stderr(&out)
    );
    let out = verify_as(&alias("copy"));
    assert!(
        !stderr(&out).contains("Host key verification failed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn kubevirt_clone_has_its_own_identity() {
    clone_has_its_own_identity(&Env::kubevirt(), "vm");
}

#[test]
fn deckhouse_clone_has_its_own_identity() {
    clone_has_its_own_identity(
        &Env::deckhouse(),
        "virtualmachine.virtualization.deckhouse.io",
    );
}

/// Deckhouse caps each `clone.nameReplacement[].to` at 59 characters (the CEL rule of
/// `crds/virtualmachineoperations.yaml`), though a VM name may have 63: a new name that makes
/// a disk's copy longer is refused before anything is written (exit 2, one line), where the
/// API server would answer 422.
#[test]
fn deckhouse_clone_names_over_the_platform_limit_are_refused() {
    let env = Env::deckhouse();
    // The fixture's `linux-vm` has the disk `linux-disk`: its copy is `NEW-linux-disk`.
    let target = "c".repeat(50);
    env.emulator.clear_requests();
    let err = fails(&env, &["clone", "linux-vm", &target], 2);
    assert!(
        err.contains(&format!("{target}-linux-disk")) && err.contains("59"),
        "{err}"
    );
    assert!(changes(&env).is_empty(), "{:?}", changes(&env));
    // The emulator holds the platform to it too.
    let op = serde_json::json!({
        "apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachineOperation",
        "metadata": {"name": "long", "namespace": "default"},
        "spec": {"type": "Clone", "virtualMachineName": "linux-vm", "clone": {"mode": "Strict",
            "nameReplacement": [{"from": {"kind": "VirtualDisk", "name": "linux-disk"},
                "to": format!("{target}-linux-disk")}]}},
    });
    let file = env.dir.path().join("op.json");
    std::fs::write(&file, op.to_string()).unwrap();
    let out = env.kubectl(&["create", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("spec.clone.nameReplacement: Invalid value: \"array\": Each nameReplacement.to must be between 1 and 59 characters"),
        "{}",
        stderr(&out)
    );
}

/// Issue 32: Deckhouse makes its copy of the source's provisioning Secret and then the VM
/// with the source's runPolicy in one pass (`service/restorer/snapshot_resources.go`), so an
/// AlwaysOn copy may start before anything rewrote that Secret. The Secret the copy boots from
/// must never have held the source's identity: kubectl vm makes it (POST, marked with the
/// operation's uid) before the platform processes the clone, and never rewrites it (no PUT).
/// Before this, the platform made it with `orig`'s identity and it was rewritten afterwards.
#[test]
fn deckhouse_always_on_clone_never_sees_the_source_identity() {
    let env = Env::deckhouse();
    let _signer = crate::signer::start_signer(&env, &[]);
    crate::ssh::vm_with_ca(&env, "orig", &["--run-strategy", "Always"]);
    env.emulator.clear_requests();
    let out = env.vm(&["clone", "orig", "copy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let path = "/api/v1/namespaces/default/secrets";
    let requests = env.emulator.requests();
    let made = requests
        .iter()
        .filter(|r| r.method == "POST" && r.path == path)
        .filter(|r| r.body.contains("\"copy-cloudinit\""))
        .collect::<Vec<_>>();
    assert_eq!(
        made.len(),
        1,
        "{:?}",
        requests
            .iter()
            .map(|r| (&r.method, &r.path))
            .collect::<Vec<_>>()
    );
    assert!(
        made[0]
            .body
            .contains("virtualization.deckhouse.io/vmoprestore"),
        "{}",
        made[0].body
    );
    assert!(!made[0].body.contains("orig"), "{}", made[0].body);
    assert!(
        !requests
            .iter()
            .any(|r| r.method == "PUT" && r.path == format!("{path}/copy-cloudinit")),
        "the Secret was rewritten after the platform made it"
    );
    // The copy (AlwaysOn, started by the platform, never restarted) answers with its own
    // host certificate, which `kubectl vm ssh` verifies.
    let copy = get_json(
        &env,
        &["get", "virtualmachine.virtualization.deckhouse.io", "copy"],
    );
    assert_eq!(copy["spec"]["runPolicy"], "AlwaysOn");
    let out = env.vm(&["ssh", "copy", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
