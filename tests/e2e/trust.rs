//! SSH trust that names one VM (issue 32): `ca migrate` of VMs made before VM-scoped trust,
//! the TRUST column, no trust on first use where the platform vouches, and host names that
//! cannot collide, each against the emulator's guests running a real OpenSSH sshd.

use base64::Engine;
use serde_json::Value;

use crate::common::{BIN, Env, ok, stderr, stdout, table};
use crate::ssh::vm_with_ca;

const PRINCIPALS_DIR: &str = "/etc/ssh/kubevm_principals";

fn object(env: &Env, group: &str, plural: &str, name: &str) -> Value {
    env.emulator
        .objects(group, plural, Some("default"))
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{plural}/{name}"))
}

/// The user data in Secret `NAME-cloudinit`, and its data key.
fn user_data(env: &Env, vm: &str) -> (String, String) {
    let secret = object(env, "", "secrets", &format!("{vm}-cloudinit"));
    let data = secret["data"].as_object().unwrap();
    let (key, value) = data
        .iter()
        .find(|(k, _)| *k == "userdata" || *k == "userData")
        .unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(value.as_str().unwrap())
        .unwrap();
    (key.clone(), String::from_utf8(bytes).unwrap())
}

/// Turn VM `vm` into one as `create` made it before VM-scoped trust (commit 23389dc^): no
/// principals files, no `AuthorizedPrincipalsFile`, no trust annotation. Written straight into
/// the store, as an old kubectl-vm left it.
fn make_legacy(env: &Env, group: &str, vm: &str) {
    let (key, text) = user_data(env, vm);
    let mut legacy = String::new();
    let mut skipping = false;
    for line in text.split_inclusive('\n') {
        let t = line.trim();
        if t == format!("rm -rf {PRINCIPALS_DIR}") {
            skipping = true;
        }
        if t.starts_with("cat > /etc/ssh/kubevm_ssh_host")
            || t.starts_with("cat > /etc/ssh/sshd_config.d")
        {
            skipping = false;
        }
        if skipping || t.starts_with("AuthorizedPrincipalsFile ") {
            continue;
        }
        legacy.push_str(line);
    }
    assert!(!legacy.contains(PRINCIPALS_DIR), "{legacy}");
    let mut secret = object(env, "", "secrets", &format!("{vm}-cloudinit"));
    secret["data"][&key] = base64::engine::general_purpose::STANDARD
        .encode(legacy)
        .into();
    env.emulator.put_object(secret);
    let mut object = object(env, group, "virtualmachines", vm);
    object["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("ssh.kubevm.io/trust");
    env.emulator.put_object(object);
}

fn trust_column(env: &Env) -> Vec<(String, String)> {
    let rows = table(&ok(env.vm(&["list", "-o", "wide"])));
    let at = rows[0].iter().position(|h| h == "TRUST").expect("TRUST");
    rows[1..]
        .iter()
        .map(|r| (r[0].clone(), r[at].clone()))
        .collect()
}

fn ssh(env: &Env, args: &[&str]) -> std::process::Output {
    env.command(BIN).arg("ssh").args(args).output().unwrap()
}

fn migrate(env: &Env, group: &str) {
    let _signer = crate::signer::start_signer(env, &[]);
    vm_with_ca(env, "shop", &[]);
    vm_with_ca(env, "theirs", &[]);
    vm_with_ca(env, "plain", &["--no-platform-ssh"]);
    make_legacy(env, group, "shop");
    make_legacy(env, group, "theirs");
    // theirs' Secret is not owned by its VM (say, made by someone else under that name).
    let mut secret = object(env, "", "secrets", "theirs-cloudinit");
    secret["metadata"]["ownerReferences"] = Value::Array(vec![]);
    env.emulator.put_object(secret);
    let before_theirs = user_data(env, "theirs");
    ok(env.vm(&["restart", "shop"]));
    let mut trust: Vec<_> = trust_column(env)
        .into_iter()
        .filter(|(n, _)| ["plain", "theirs", "shop"].contains(&n.as_str()))
        .collect();
    trust.sort();
    assert_eq!(
        trust,
        [
            ("plain".to_string(), "none".to_string()),
            ("shop".into(), "legacy".into()),
            ("theirs".into(), "legacy".into()),
        ]
    );
    // The legacy guest trusts the CA for the bare login only; the signer no longer issues it
    // (on c452aaa it did, and this login succeeded).
    let out = ssh(env, &["shop", "--", "id", "-un"]);
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("does not accept the platform certificate"),
        "{}",
        stderr(&out)
    );

    let (_, legacy_text) = user_data(env, "shop");
    let dry = ok(env.vm(&["ca", "migrate", "--dry-run"]));
    assert_eq!(
        dry,
        "shop.default: would write scoped trust for kubevm (dry run)\n\
         theirs.default: skipped: Secret theirs-cloudinit is not one kubectl-vm made for this VM (no label, or the VM does not own it): left alone\n"
    );
    assert_eq!(
        user_data(env, "shop").1,
        legacy_text,
        "dry run wrote nothing"
    );

    let out = ok(env.vm(&["ca", "migrate"]));
    assert_eq!(
        out,
        "shop.default: scoped trust written for kubevm, takes effect at next boot\n\
         theirs.default: skipped: Secret theirs-cloudinit is not one kubectl-vm made for this VM (no label, or the VM does not own it): left alone\n\
         Restart the migrated VMs (`kubectl vm restart NAME`) for their guests to apply it.\n"
    );
    assert_eq!(
        user_data(env, "theirs"),
        before_theirs,
        "not ours: untouched"
    );
    let (_, migrated) = user_data(env, "shop");
    assert!(
        migrated.contains(&format!("cat > {PRINCIPALS_DIR}/kubevm <<'KUBEVM_EOF'"))
            && migrated.contains("kubevm@shop.default\n")
            && migrated.contains(&format!("AuthorizedPrincipalsFile {PRINCIPALS_DIR}/%u")),
        "{migrated}"
    );
    let trust = trust_column(env);
    assert!(
        trust.contains(&("shop".to_string(), "vm-scoped".to_string())),
        "{trust:?}"
    );
    assert!(
        trust.contains(&("theirs".to_string(), "legacy".to_string())),
        "{trust:?}"
    );
    // Nothing left to do for web: a second run names only what it left alone.
    let again = ok(env.vm(&["ca", "migrate"]));
    assert!(!again.contains("shop.default"), "{again}");
    // At the next boot the guest accepts the VM-scoped certificate.
    ok(env.vm(&["restart", "shop"]));
    let out = ssh(env, &["shop", "--", "id", "-un"]);
    assert_eq!(stdout(&out), "kubevm\n", "{}", stderr(&out));
}

#[test]
fn kubevirt_migrate_gives_legacy_vms_scoped_trust() {
    migrate(&Env::kubevirt(), "kubevirt.io");
}

#[test]
fn deckhouse_migrate_gives_legacy_vms_scoped_trust() {
    migrate(&Env::deckhouse(), "virtualization.deckhouse.io");
}

/// OpenSSH through a hand-written config like ssh-config's: the portforward to `vm`, the CA
/// as the only host trust, `alias` as the name the host certificate must carry.
fn openssh_to(env: &Env, vm: &str, alias: &str) -> std::process::Output {
    let kubeconfig = env.kubeconfig.to_str().unwrap().to_owned();
    env.command("ssh")
        .args([
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
        ])
        .arg("-o")
        .arg(format!(
            "ProxyCommand={BIN} --kubeconfig {kubeconfig} port-forward --stdio {vm} 22"
        ))
        .arg("-o")
        .arg(format!(
            "KnownHostsCommand={BIN} --kubeconfig {kubeconfig} ssh-known-hosts"
        ))
        .args([
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
        ])
        .arg(format!("HostKeyAlias={alias}"))
        .args(["kubevm@x", "true"])
        .output()
        .unwrap()
}

/// Issue 32: a host certificate the signer issues for `db.primary.prod` in namespace `vm` is
/// refused by OpenSSH verifying `db.primary` in `prod` (what ssh-config verifies for it). On
/// c452aaa that certificate named `db.primary.prod.vm` and passed.
#[test]
fn a_host_certificate_for_db_primary_prod_in_vm_does_not_pass_for_db_primary_in_prod() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::kubevirt();
    vm_with_ca(&env, "edge", &[]);
    // The guest presents its own host key with a certificate made as the signer makes them
    // for the hostile pair, signed by ssh-keygen with the CA key.
    let ca_secret = env
        .emulator
        .objects("", "secrets", Some("kubevm-system"))
        .into_iter()
        .find(|o| o["metadata"]["name"] == "kubevm-ssh-ca")
        .unwrap();
    let ca_key = base64::engine::general_purpose::STANDARD
        .decode(ca_secret["data"]["ca.keys"].as_str().unwrap())
        .unwrap();
    let dir = env.dir.path().join("hostile");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("ca"), &ca_key).unwrap();
    std::fs::set_permissions(dir.join("ca"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let (key, text) = user_data(&env, "edge");
    let host_pub = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("ed25519_public:"))
        .unwrap()
        .trim()
        .to_owned();
    std::fs::write(dir.join("host.pub"), format!("{host_pub}\n")).unwrap();
    let principals = kubevm::signer::host_principals("db.primary.prod", "vm");
    let signed = std::process::Command::new("ssh-keygen")
        .args(["-q", "-s"])
        .arg(dir.join("ca"))
        .args([
            "-h",
            "-I",
            "hostile",
            "-V",
            "-5m:+1h",
            "-n",
            &principals.join(","),
        ])
        .arg(dir.join("host.pub"))
        .output()
        .expect("ssh-keygen");
    assert!(signed.status.success(), "{}", stderr(&signed));
    let cert = std::fs::read_to_string(dir.join("host-cert.pub")).unwrap();
    let with_cert = kubevm::ca::propagate::replace_heredoc(
        &text,
        "/etc/ssh/kubevm_ssh_host_ed25519_key-cert.pub",
        &[cert.trim().to_owned()],
    )
    .unwrap();
    let mut secret = object(&env, "", "secrets", "edge-cloudinit");
    secret["data"][&key] = base64::engine::general_purpose::STANDARD
        .encode(with_cert)
        .into();
    env.emulator.put_object(secret);
    ok(env.vm(&["restart", "edge"]));
    let out = openssh_to(&env, "edge.default", "db.primary.prod.vm");
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Host key verification failed"),
        "{}",
        stderr(&out)
    );
    // The same certificate passes for the pair it names: the refusal above is the name's.
    let out = openssh_to(&env, "edge.default", "db.primary.prod.vm.vm");
    assert!(
        !stderr(&out).contains("Host key verification failed")
            && stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    // Our own client refuses it for edge.default too: it is not edge's name.
    let out = ssh(&env, &["edge", "--", "true"]);
    assert_eq!(out.status.code(), Some(255));
    assert!(
        stderr(&out).contains("it is for db.primary.prod.vm.vm, not edge.default.vm alone"),
        "{}",
        stderr(&out)
    );
}

fn one_line(out: &std::process::Output) -> String {
    let err: String = stderr(out)
        .lines()
        .filter(|l| !l.starts_with("Notice: "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err
}

/// Issue 32 item 9: a VM whose trust the platform set up is proven by its host certificate
/// alone; a plain key is refused even with accept-new, by `ssh`, `scp` and OpenSSH through
/// ssh-config. Trust on first use stays for VMs without platform trust, and says so.
#[test]
fn no_trust_on_first_use_where_the_platform_vouches() {
    let env = Env::deckhouse();
    vm_with_ca(&env, "web", &[]);
    vm_with_ca(&env, "plain", &["--no-platform-ssh"]);
    let kubeconfig = env.kubeconfig.to_str().unwrap().to_owned();
    let config = env.dir.path().join("printed_config");
    std::fs::write(
        &config,
        ok(env.vm(&["--kubeconfig", &kubeconfig, "ssh-config"])),
    )
    .unwrap();
    let openssh = || {
        env.command("ssh")
            .env_remove("KUBECONFIG")
            .args(["-F", config.to_str().unwrap(), "-o", "BatchMode=yes"])
            .args(["web.default.vm", "true"])
            .output()
            .unwrap()
    };
    let out = openssh();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ssh(&env, &["web", "--", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The guest comes back with a plain host key and no certificate.
    env.emulator.change_guest_host_key("default", "web");
    ok(env.vm(&["restart", "web"]));
    let known = env.dir.path().join(".kube/kubectl-vm/vm_known_hosts");
    for strict in ["accept-new", "no"] {
        let out = ssh(
            &env,
            &["--strict-host-key-checking", strict, "web", "--", "true"],
        );
        let err = one_line(&out);
        assert!(
            err.contains("host key verification failed: web.default.vm was set up by kubectl-vm, so only a host certificate of the platform CA proves it, and it presented a plain ED25519 key SHA256:"),
            "{err}"
        );
    }
    let file = env.dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    let out = env
        .command(BIN)
        .args(["scp", "--strict-host-key-checking", "accept-new"])
        .arg(&file)
        .arg("web:/tmp/f")
        .output()
        .unwrap();
    assert!(one_line(&out).contains("only a host certificate"));
    assert!(!known.exists(), "nothing recorded");
    let out = openssh();
    assert_eq!(out.status.code(), Some(255));
    assert!(
        stderr(&out).contains("Host key verification failed"),
        "{}",
        stderr(&out)
    );
    // A VM without platform trust: trust on first use, said so.
    let out = ssh(
        &env,
        &[
            "--strict-host-key-checking",
            "accept-new",
            "plain",
            "--",
            "true",
        ],
    );
    assert!(
        stderr(&out).contains("plain.default.vm has no host certificate of the platform (an enrolled or foreign VM): trusting its key on first use."),
        "{}",
        stderr(&out)
    );
    assert!(
        std::fs::read_to_string(&known)
            .unwrap()
            .starts_with("plain.default.vm ssh-ed25519 ")
    );
}

/// `ca revoke --key FILE` publishes the host key with the CA keys; `kubectl vm ssh` refuses it
/// even with a valid host certificate, and so does OpenSSH through ssh-config (`@revoked`).
#[test]
fn a_revoked_host_key_is_refused_by_ssh_and_openssh() {
    let env = Env::kubevirt();
    vm_with_ca(&env, "gone", &[]);
    let kubeconfig = env.kubeconfig.to_str().unwrap().to_owned();
    let config = env.dir.path().join("printed_config");
    std::fs::write(
        &config,
        ok(env.vm(&["--kubeconfig", &kubeconfig, "ssh-config"])),
    )
    .unwrap();
    let openssh = || {
        env.command("ssh")
            .env_remove("KUBECONFIG")
            .args(["-F", config.to_str().unwrap(), "-o", "BatchMode=yes"])
            .args(["gone.default.vm", "true"])
            .output()
            .unwrap()
    };
    let out = openssh();
    assert!(out.status.success(), "{}", stderr(&out));
    let (_, text) = user_data(&env, "gone");
    let host_pub = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("ed25519_public:"))
        .unwrap()
        .trim()
        .to_owned();
    let file = env.dir.path().join("gone.pub");
    std::fs::write(&file, format!("{host_pub}\n")).unwrap();
    // The fingerprint as ssh-keygen prints it.
    let listed = std::process::Command::new("ssh-keygen")
        .args(["-l", "-E", "sha256", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    let fingerprint = stdout(&listed)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_owned();
    let out = ok(env.vm(&["ca", "revoke", "--key", file.to_str().unwrap()]));
    assert!(
        out.starts_with(&format!(
            "revoked host key {fingerprint} (1 host keys revoked in configmap/kubevm-ssh-ca"
        )),
        "{out}"
    );
    let again = ok(env.vm(&["ca", "revoke", "--key", file.to_str().unwrap()]));
    assert_eq!(again, format!("host key {fingerprint}: already revoked\n"));
    let out = ssh(&env, &["gone", "--", "true"]);
    let err = one_line(&out);
    assert!(
        err.contains(&format!(
            "the host key {fingerprint} is revoked by the platform"
        )),
        "{err}"
    );
    // Published without the key's comment.
    let bare: Vec<&str> = host_pub.split_whitespace().take(2).collect();
    let line = format!("@revoked * {}\n", bare.join(" "));
    let known = ok(env.vm(&["ssh-known-hosts"]));
    assert!(known.contains(&line), "{known}");
    let out = openssh();
    assert_eq!(out.status.code(), Some(255));
    assert!(stderr(&out).contains("REVOKED"), "{}", stderr(&out));
    // The list outlives a rotation.
    ok(env.vm(&["ca", "rotate"]));
    assert!(ok(env.vm(&["ssh-known-hosts"])).contains(&line));
    // Bad input: one line, exit 2, before any request.
    std::fs::write(&file, "not a key\n").unwrap();
    let out = env
        .command(BIN)
        .args(["ca", "revoke", "--key", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
