//! `kubectl vm ansible-inventory` read by Debian's real Ansible: `ansible-inventory` parses
//! the YAML (as a file and through `<(…)`) and the dynamic-inventory script answer, and
//! `ansible -m ping` reaches the emulator's sshd guests through the generated ssh settings.

use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};

use crate::common::{BIN, Env, ok, stderr, stdout};
use crate::ssh::vm_with_ca;

/// Run `bash -c SCRIPT` in the environment (for `<(…)`), with the inventory command as `$INV`.
fn bash(env: &Env, script: &str) -> std::process::Output {
    env.command("bash")
        .current_dir(env.dir.path())
        .env("INV", BIN)
        .env("ANSIBLE_NOCOLOR", "1")
        .args(["-c", script])
        .output()
        .unwrap()
}

fn inventory_of(env: &Env, script: &str) -> Value {
    let out = bash(env, script);
    assert!(out.status.success(), "{script}: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)))
}

fn hosts_of(list: &Value, group: &str) -> Value {
    list[group]["hosts"].clone()
}

/// `resource`: kubectl's name of the flavor's VMs.
fn inventory_and_ping(env: &Env, resource: &str) {
    // Same name in two namespaces; both running with the platform SSH setup.
    vm_with_ca(env, "app", &["--label", "role=web"]);
    vm_with_ca(env, "app", &["-n", "dev", "--label", "role=web"]);
    let witness = env.dir.path().join("templated");
    let motd = format!("{{{{ lookup('pipe', 'touch {}') }}}}", witness.display());
    ok(env.kubectl(&[
        "annotate",
        resource,
        "app",
        "ansible.kubevm.io/groups=web, db-primary",
        "ansible.deckhouse.io/groups=legacy",
        &format!("vars.ansible.kubevm.io/motd={motd}"),
        "vars.ansible.kubevm.io/http_port=8080",
        "vars.ansible.deckhouse.io/tier=gold",
        "vars.ansible.kubevm.io/ansible_port=2222",
        "vars.ansible.kubevm.io/ansible_ssh_common_args=-oProxyCommand=false",
    ]));
    let cmd = "\"$INV\" ansible-inventory -A -l role=web --group-by-label role";

    // 1. Through a pipe, as the issue asks.
    let out = bash(
        env,
        &format!("ansible-inventory -i <({cmd}) --list 2>/dev/null; {cmd} 2>&1 >/dev/null"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let (json_text, warnings) = text.split_at(text.rfind("}\n").unwrap() + 2);
    let piped: Value = serde_json::from_str(json_text).unwrap();
    assert!(
        warnings.contains("app.default: variable \"ansible_port\" ignored")
            && warnings.contains("app.default: variable \"ansible_ssh_common_args\" ignored"),
        "{warnings}"
    );

    // What Ansible itself made of it.
    let vars = &piped["_meta"]["hostvars"]["app.default"];
    assert_eq!(vars["ansible_host"], "app.default.vm");
    assert_eq!(vars["motd"], json!({ "__ansible_unsafe": motd }), "{vars}");
    assert_eq!(vars["http_port"], json!({ "__ansible_unsafe": "8080" }));
    assert_eq!(vars["tier"], json!({ "__ansible_unsafe": "gold" }));
    assert!(vars.get("ansible_port").is_none(), "{vars}");
    let common = vars["ansible_ssh_common_args"].as_str().unwrap();
    assert!(common.starts_with("-F "), "{common}");
    assert_eq!(
        piped["_meta"]["hostvars"]["app.dev"]["ansible_host"],
        "app.dev.vm"
    );
    assert_eq!(hosts_of(&piped, "default"), json!(["app.default"]));
    assert_eq!(hosts_of(&piped, "dev"), json!(["app.dev"]));
    assert_eq!(hosts_of(&piped, "web"), json!(["app.default"]));
    assert_eq!(hosts_of(&piped, "db_primary"), json!(["app.default"]));
    assert_eq!(hosts_of(&piped, "legacy"), json!(["app.default"]));
    let mut role: Vec<Value> = hosts_of(&piped, "role_web").as_array().unwrap().clone();
    role.sort_by_key(|v| v.to_string());
    assert_eq!(role, [json!("app.default"), json!("app.dev")]);

    // 2. The same from a YAML file and from the dynamic-inventory script protocol.
    ok(bash(env, &format!("{cmd} -o yaml > inv.yml")));
    let from_file = inventory_of(env, "ansible-inventory -i inv.yml --list 2>/dev/null");
    assert_eq!(from_file, piped);
    std::fs::write(
        env.dir.path().join("inv.sh"),
        format!(
            "#!/bin/sh\nexec {BIN} ansible-inventory -A -l role=web --group-by-label role \"$@\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        env.dir.path().join("inv.sh"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let from_script = inventory_of(env, "ansible-inventory -i ./inv.sh --list 2>/dev/null");
    assert_eq!(from_script, piped);
    // INI: the same hosts and groups; only plain-word variables (no unsafe marking there).
    ok(bash(env, &format!("{cmd} -o ini > inv.ini 2>/dev/null")));
    let from_ini = inventory_of(env, "ansible-inventory -i inv.ini --list 2>/dev/null");
    for group in ["default", "dev", "web", "db_primary", "legacy", "role_web"] {
        let mut a = hosts_of(&from_ini, group).as_array().unwrap().clone();
        let mut b = hosts_of(&piped, group).as_array().unwrap().clone();
        a.sort_by_key(|v| v.to_string());
        b.sort_by_key(|v| v.to_string());
        assert_eq!(a, b, "{group}");
    }
    let ini_vars = &from_ini["_meta"]["hostvars"]["app.default"];
    assert_eq!(ini_vars["ansible_host"], "app.default.vm");
    assert_eq!(ini_vars["ansible_ssh_common_args"], common);
    assert_eq!(ini_vars["tier"], "gold");
    assert!(ini_vars.get("motd").is_none(), "{ini_vars}");
    let host = inventory_of(env, "\"$INV\" ansible-inventory --host app.default");
    assert_eq!(host["motd"], json!({ "__ansible_unsafe": motd }));

    // 3. The annotation's template is never run, and ping goes through the ssh settings.
    let out = bash(
        env,
        &format!("ansible app.default -i <({cmd} 2>/dev/null) -m debug -a var=motd"),
    );
    assert!(
        stdout(&out).contains(&format!("\"motd\": \"{}\"", motd)),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(!witness.exists(), "a host variable was templated");
    let out = bash(
        env,
        &format!("ansible all -i <({cmd} 2>/dev/null) -m ping -o"),
    );
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    for host in ["app.default", "app.dev"] {
        assert!(
            text.contains(&format!("{host} | SUCCESS")) && text.contains("\"ping\": \"pong\""),
            "{text}"
        );
    }

    // 4. The ssh_config is private and one file however often the inventory is made.
    let dir = env.dir.path().join(".kube/kubectl-vm/ansible");
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let path = files[0].as_ref().unwrap().path();
    assert_eq!(common, format!("-F {}", path.display()));
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn kubevirt_inventory_parsed_and_pinged_by_ansible() {
    inventory_and_ping(&Env::kubevirt(), "virtualmachines.kubevirt.io");
}

#[test]
fn deckhouse_inventory_parsed_and_pinged_by_ansible() {
    inventory_and_ping(
        &Env::deckhouse(),
        "virtualmachines.virtualization.deckhouse.io",
    );
}

#[test]
fn bad_input_is_refused_before_any_request() {
    let env = Env::kubevirt();
    for args in [
        &["ansible-inventory", "-A", "-n", "dev"][..],
        &["ansible-inventory", "--host", "a.b", "-o", "yaml"],
        &["ansible-inventory", "--group-by-label", " "],
        &["ansible-inventory", "--list", "--host", "a.b"],
    ] {
        env.emulator.clear_requests();
        crate::common::fails(&env, args, 2);
        let sent: Vec<String> = env
            .emulator
            .requests()
            .iter()
            .map(|r| format!("{} {}", r.method, r.path))
            .collect();
        assert!(sent.is_empty(), "{args:?} sent {sent:?}");
    }
}

#[test]
fn without_a_ca_the_inventory_is_made_with_a_warning() {
    let env = Env::kubevirt();
    let out = env.vm(&["ansible-inventory", "-A", "-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Warning: no SSH CA in namespace"),
        "{}",
        stderr(&out)
    );
    let list: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(list["_meta"]["hostvars"].is_object(), "{list}");
}
