//! `kubectl vm ca init|show|rotate`, checked against the objects in the emulator's store; rotation
//! renews only the certified host keys of VMs kubectl-vm made and that own their Secret.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kubevm::ca::CaBundle;
use kubevm_emulator::FailureRule;
use serde_json::Value;

use crate::common::{Env, fails, ok};

const NS: &str = "kubevm-system";

fn one(env: &Env, group: &str, plural: &str, ns: &str, name: &str) -> Option<Value> {
    env.emulator
        .objects(group, plural, Some(ns).filter(|ns| !ns.is_empty()))
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
}

/// `ssh-keygen ARGS` (fails, never skips, when it is missing: CI installs openssh-client).
fn ssh_keygen(args: &[&std::ffi::OsStr]) -> String {
    let out = std::process::Command::new("ssh-keygen")
        .args(args)
        .output()
        .expect("ssh-keygen not found: install openssh-client (tests/tools/install-test-deps.sh)");
    assert!(
        out.status.success(),
        "ssh-keygen {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The SHA256 fingerprints `ssh-keygen -l` prints for the key files `texts`, in order: an
/// independent check of what the tool computes itself.
fn keygen_fingerprints(texts: &[String]) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    texts
        .iter()
        .enumerate()
        .flat_map(|(i, text)| {
            let path = dir.path().join(format!("key{i}"));
            std::fs::write(&path, text).unwrap();
            // ssh-keygen refuses private key files others may read.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            let printed = ssh_keygen(&[
                "-l".as_ref(),
                "-E".as_ref(),
                "sha256".as_ref(),
                "-f".as_ref(),
                path.as_os_str(),
            ]);
            // `256 SHA256:… comment (ED25519)`, one line per key.
            printed
                .lines()
                .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The CA as stored: the bundle read from the Secret, then the fingerprints (by ssh-keygen)
/// of the private keys in the Secret and of the public keys the ConfigMap publishes, oldest
/// first.
fn stored(env: &Env, ns: &str) -> (CaBundle, Vec<String>, Vec<String>) {
    let secret: Secret =
        serde_json::from_value(one(env, "", "secrets", ns, "kubevm-ssh-ca").expect("Secret"))
            .unwrap();
    let text = String::from_utf8(secret.data.as_ref().unwrap()["ca.keys"].0.clone()).unwrap();
    assert!(
        text.contains("-----BEGIN OPENSSH PRIVATE KEY-----"),
        "{text}"
    );
    let end = "-----END OPENSSH PRIVATE KEY-----";
    let private_keys: Vec<String> = text
        .split_inclusive(end)
        .filter(|block| block.contains(end))
        .map(|block| format!("{}\n", block.trim()))
        .collect();
    let bundle = CaBundle::from_secret(&secret).unwrap();
    let config_map: ConfigMap =
        serde_json::from_value(one(env, "", "configmaps", ns, "kubevm-ssh-ca").expect("ConfigMap"))
            .unwrap();
    let published = config_map.data.as_ref().unwrap()["ca.pub"].clone();
    assert!(!published.contains("PRIVATE"), "{published}");
    (
        bundle,
        keygen_fingerprints(&private_keys),
        keygen_fingerprints(&[published]),
    )
}

#[test]
fn init_show_rotate_and_finish() {
    let env = Env::kubevirt();
    assert_eq!(
        fails(&env, &["ca", "show"], 1),
        "Error: no SSH CA in namespace \"kubevm-system\"; create one with `kubectl vm ca init`"
    );
    assert!(one(&env, "", "namespaces", "", NS).is_none());

    let out = ok(env.vm(&["ca", "init"]));
    let (bundle, secret_keys, published) = stored(&env, NS);
    assert_eq!(published, secret_keys);
    assert_eq!(published.len(), 1);
    let first = published[0].clone();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..5],
        [
            "namespace/kubevm-system created",
            "secret/kubevm-ssh-ca created",
            "configmap/kubevm-ssh-ca created",
            "role.rbac.authorization.k8s.io/kubevm-ssh-ca-reader created",
            "rolebinding.rbac.authorization.k8s.io/kubevm-ssh-ca-reader created",
        ],
        "{out}"
    );
    assert_eq!(lines.len(), 6, "{out}");
    assert!(out.contains(&first), "{out}");
    assert!(one(&env, "", "namespaces", "", NS).is_some());

    // Every authenticated user may get the ConfigMap, and nothing else.
    let role = one(
        &env,
        "rbac.authorization.k8s.io",
        "roles",
        NS,
        "kubevm-ssh-ca-reader",
    )
    .expect("Role");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": ["kubevm-ssh-ca"], "verbs": ["get"]}])
    );
    let binding = one(
        &env,
        "rbac.authorization.k8s.io",
        "rolebindings",
        NS,
        "kubevm-ssh-ca-reader",
    )
    .expect("RoleBinding");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], "kubevm-ssh-ca-reader");
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}])
    );

    // A second init refuses and changes nothing.
    let line = fails(&env, &["ca", "init"], 1);
    assert!(
        line.starts_with("Error: an SSH CA already exists in namespace \"kubevm-system\""),
        "{line}"
    );
    assert!(line.contains("`kubectl vm ca rotate`"), "{line}");
    assert_eq!(stored(&env, NS).2, [first.as_str()]);

    let show = ok(env.vm(&["ca", "show"]));
    assert!(show.contains("Rotation:   none"), "{show}");
    // Any authenticated user may read the public keys, through the RoleBinding init made.
    let restricted = ok(env.vm(&["ca", "show", "--context", "emulator-restricted"]));
    assert_eq!(restricted, show);
    assert!(
        show.lines().any(|l| l
            .trim_start()
            .starts_with(&format!("signing   256 {first} kubevm-ca@"))
            && l.ends_with("(ED25519)")),
        "{show}"
    );
    assert!(
        show.contains(&bundle.public_keys_openssh().unwrap()[0]),
        "{show}"
    );

    // Rotation: a new signing key, the old one still trusted.
    let out = ok(env.vm(&["ca", "rotate"]));
    let (bundle, secret_keys, published) = stored(&env, NS);
    assert_eq!(published, secret_keys);
    assert_eq!(published.len(), 2);
    assert_eq!(published[0], first, "old key still trusted");
    let second = published[1].clone();
    let signing = bundle.signing_key().public_key().to_openssh().unwrap();
    assert_eq!(keygen_fingerprints(&[signing]), [second.as_str()]);
    assert!(out.contains(&second) && out.contains(&first), "{out}");

    let json: Value = serde_json::from_str(&ok(env.vm(&["ca", "show", "-o", "json"]))).unwrap();
    assert_eq!(json["rotationInProgress"], true);
    let roles: Vec<(&str, &str)> = json["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["role"].as_str().unwrap(),
                k["fingerprint"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        roles,
        [("trusted", first.as_str()), ("signing", second.as_str())]
    );
    let yaml: Value = yaml_serde::from_str(&ok(env.vm(&["ca", "show", "-o", "yaml"]))).unwrap();
    assert_eq!(yaml, json);

    // A second rotation before finishing the first is refused.
    let line = fails(&env, &["ca", "rotate"], 1);
    assert!(
        line.contains("already in progress") && line.contains("--finish"),
        "{line}"
    );

    let out = ok(env.vm(&["ca", "rotate", "--finish"]));
    assert!(
        out.contains(&format!("No longer trusted: {first}")),
        "{out}"
    );
    let (_, secret_keys, published) = stored(&env, NS);
    assert_eq!(published, [second.as_str()]);
    assert_eq!(secret_keys, [second.as_str()]);
    let line = fails(&env, &["ca", "rotate", "--finish"], 1);
    assert!(line.contains("no rotation is in progress"), "{line}");
}

#[test]
fn restricted_user_cannot_init() {
    let env = Env::kubevirt();
    assert_eq!(
        fails(&env, &["ca", "init", "--context", "emulator-restricted"], 1),
        "Error: forbidden: user \"alice\" cannot create secrets \"kubevm-ssh-ca\" in namespace \"kubevm-system\""
    );
    assert!(one(&env, "", "secrets", NS, "kubevm-ssh-ca").is_none());
}

#[test]
fn rotate_conflict_and_other_namespace() {
    let env = Env::deckhouse();
    let flag = ["--ca-namespace", "platform-ca"];
    assert_eq!(
        fails(&env, &["ca", "rotate", flag[0], flag[1]], 1),
        "Error: no SSH CA in namespace \"platform-ca\"; create one with `kubectl vm ca init --ca-namespace platform-ca`"
    );
    ok(env.vm(&["ca", "init", flag[0], flag[1]]));
    let (_, before, _) = stored(&env, "platform-ca");
    assert!(one(&env, "", "secrets", NS, "kubevm-ssh-ca").is_none());

    // Someone else changed the CA between our read and our write.
    env.emulator.inject_failure(FailureRule {
        verb: "update".into(),
        plural: "configmaps".into(),
        name: Some("kubevm-ssh-ca".into()),
        code: 409,
        message: "Operation cannot be fulfilled on configmaps \"kubevm-ssh-ca\": the object has been modified; please apply your changes to the latest version and try again".into(),
        times: Some(1),
    });
    assert_eq!(
        fails(&env, &["ca", "rotate", flag[0], flag[1]], 1),
        "Error: conflict: the SSH CA in namespace \"platform-ca\" was changed by someone else during the rotation; run the command again"
    );
    assert_eq!(stored(&env, "platform-ca").1, before);
    ok(env.vm(&["ca", "rotate", flag[0], flag[1]]));
    assert_eq!(stored(&env, "platform-ca").2.len(), 2);

    assert!(fails(&env, &["ca", "show", "--ca-namespace", "Bad_NS"], 2).contains("--ca-namespace"));
}

#[test]
fn init_says_configured_for_a_leftover_it_overwrote() {
    let env = Env::kubevirt();
    // A ConfigMap left from an earlier, half-finished CA.
    env.emulator.put_object(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "kubevm-ssh-ca", "namespace": NS},
        "data": {"ca.pub": "stale"}
    }));
    let out = ok(env.vm(&["ca", "init"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "secret/kubevm-ssh-ca created",
            "configmap/kubevm-ssh-ca configured",
            "role.rbac.authorization.k8s.io/kubevm-ssh-ca-reader created",
            "rolebinding.rbac.authorization.k8s.io/kubevm-ssh-ca-reader created",
        ],
        "{out}"
    );
}

/// The `userdata` of Secret `ns/name`, decoded.
fn user_data_of(env: &Env, ns: &str, name: &str) -> (String, Value) {
    use base64::Engine;
    let secret = one(env, "", "secrets", ns, name).unwrap_or_else(|| panic!("Secret {ns}/{name}"));
    let b64 = secret["data"]["userdata"].as_str().expect("userdata");
    let text = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    (String::from_utf8(text).unwrap(), secret)
}

/// The one certificate line inside the heredoc that writes the host certificate.
fn host_cert_line(text: &str) -> String {
    let doc: Value = yaml_serde::from_str(text).unwrap();
    let script = doc["bootcmd"][0].as_str().unwrap();
    let mut lines = script.lines();
    lines
        .find(|l| l.starts_with("cat > /etc/ssh/kubevm_ssh_host_ed25519_key-cert.pub <<"))
        .expect("host certificate heredoc");
    lines.next().unwrap().to_owned()
}

/// A Secret that looks like one `create` makes (labels, name, a platform bootcmd with the CA
/// keys heredoc) holding `key` as its host key, put straight into the store by someone else.
fn hostile_secret(ns: &str, vm: &str, key: &str, cert: &str) -> Value {
    use base64::Engine;
    let text = format!(
        "#cloud-config\nssh_keys:\n  ed25519_public: {key}\nbootcmd:\n- |\n  cat > /etc/ssh/kubevm_trusted_user_ca_keys <<'KUBEVM_EOF'\n  ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHcP1uPBmPUxGj6S+v8Wgfc1ckRtXQ4dx2ri8DPz8GLy\n  KUBEVM_EOF\n  cat > /etc/ssh/kubevm_ssh_host_ed25519_key-cert.pub <<'KUBEVM_EOF'\n  {cert}\n  KUBEVM_EOF\n"
    );
    serde_json::json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": format!("{vm}-cloudinit"), "namespace": ns,
            "labels": {"app.kubernetes.io/managed-by": "kubectl-vm", "kubevm.io/vm": vm}},
        "data": {"userdata": base64::engine::general_purpose::STANDARD.encode(text)}})
}

/// `ssh-keygen -L` of a certificate line: (its public key's fingerprint, the signing CA's).
fn keygen_cert(line: &str) -> (String, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host-cert.pub");
    std::fs::write(&path, format!("{line}\n")).unwrap();
    let text = ssh_keygen(&["-L".as_ref(), "-f".as_ref(), path.as_os_str()]);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("{name}: {text}"))
            .trim()
            .to_owned()
    };
    let public = field("Public key: ED25519-CERT ");
    let signer = field("Signing CA: ED25519 ");
    (
        public,
        signer.split_whitespace().next().unwrap().to_owned(),
        text,
    )
}

#[test]
fn rotation_renews_only_certified_keys_of_vms_we_made_and_own() {
    let env = Env::kubevirt();
    ok(env.vm(&["ca", "init"]));
    // Direct mode (no signer; the admin reads the CA): web gets a host certificate here.
    let image = "quay.io/containerdisks/ubuntu:24.04";
    ok(env.vm(&["create", "www", "--image", image]));
    ok(env.vm(&["create", "idle", "--image", image, "--no-platform-ssh"]));
    let (web_before, _) = user_data_of(&env, "default", "www-cloudinit");
    let web_cert = host_cert_line(&web_before);
    let (web_key_fp, old_ca, _) = keygen_cert(&web_cert);

    // The attacker's key, made by ssh-keygen.
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("attacker");
    ssh_keygen(&[
        "-q".as_ref(),
        "-t".as_ref(),
        "ed25519".as_ref(),
        "-N".as_ref(),
        "".as_ref(),
        "-f".as_ref(),
        key_path.as_os_str(),
    ]);
    let attacker = std::fs::read_to_string(dir.path().join("attacker.pub")).unwrap();
    let attacker = attacker.trim();
    // 1. The fixture: `db.primary.prod-cloudinit` in namespace `vm`, no VM behind it.
    env.emulator
        .put_object(hostile_secret("vm", "db.primary.prod", attacker, &web_cert));
    // 2. Named like ours for a real VM made by kubectl-vm that neither uses nor owns it.
    env.emulator
        .put_object(hostile_secret("default", "idle", attacker, &web_cert));
    let rv = |ns: &str, name: &str| {
        one(&env, "", "secrets", ns, name).unwrap()["metadata"]["resourceVersion"].clone()
    };
    let hostile_rv = (
        rv("vm", "db.primary.prod-cloudinit"),
        rv("default", "idle-cloudinit"),
    );

    let out = ok(env.vm(&["ca", "rotate"]));
    assert!(
        out.contains("Updated the SSH trust of 1 VMs (applied at their next boot): www.default\n"),
        "{out}"
    );
    assert!(
        out.contains("Not updated: db.primary.prod.vm: no such VM; its Secret is not touched\n"),
        "{out}"
    );
    assert!(
        out.contains("Not updated: idle.default: the VM does not use Secret \"idle-cloudinit\""),
        "{out}"
    );
    assert_eq!(
        (
            rv("vm", "db.primary.prod-cloudinit"),
            rv("default", "idle-cloudinit")
        ),
        hostile_rv,
        "the strangers' Secrets are untouched"
    );
    // www: a new certificate for the same (its own) key, from the new signing key.
    let (web_after, _) = user_data_of(&env, "default", "www-cloudinit");
    let (key_fp, new_ca, listed) = keygen_cert(&host_cert_line(&web_after));
    assert_eq!(key_fp, web_key_fp, "{listed}");
    assert_ne!(new_ca, old_ca, "{listed}");
    let json: Value = serde_json::from_str(&ok(env.vm(&["ca", "show", "-o", "json"]))).unwrap();
    assert_eq!(json["keys"][1]["fingerprint"], new_ca.as_str());

    // 3. web's Secret replaced by one that is not owned by www (same name, labels and VM
    // reference) with the attacker's key: not certified at the next rotation's start.
    ok(env.vm(&["ca", "rotate", "--finish"]));
    let (_, stored) = user_data_of(&env, "default", "www-cloudinit");
    ok(env.kubectl(&["delete", "secret", "www-cloudinit"]));
    env.emulator
        .put_object(hostile_secret("default", "www", attacker, &web_cert));
    let replaced_rv = rv("default", "www-cloudinit");
    assert!(stored["metadata"]["ownerReferences"][0]["uid"].is_string());
    let out = ok(env.vm(&["ca", "rotate"]));
    assert!(
        out.contains("Updated the SSH trust of 0 VMs (applied at their next boot)\n"),
        "{out}"
    );
    assert!(
        out.contains("Not updated: www.default: Secret \"www-cloudinit\" is not owned by the VM"),
        "{out}"
    );
    assert_eq!(rv("default", "www-cloudinit"), replaced_rv);
}
