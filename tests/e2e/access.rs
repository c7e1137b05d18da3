//! Cluster access like kubectl: a KUBECONFIG list of files merged (missing ones skipped),
//! exec credential plugins, and the context's namespace.

use crate::common::{BIN, Env, ok};

/// The admin token of the emulator's kubeconfig.
fn admin_token(env: &Env) -> String {
    let config: serde_json::Value = yaml_serde::from_str(&env.emulator.kubeconfig_yaml()).unwrap();
    let users = config["users"].as_array().unwrap();
    let admin = users.iter().find(|u| u["name"] == "admin").unwrap();
    admin["user"]["token"].as_str().unwrap().to_owned()
}

#[test]
fn kubeconfig_list_is_merged_and_missing_files_are_skipped() {
    let env = Env::kubevirt();
    let config: serde_json::Value = yaml_serde::from_str(&env.emulator.kubeconfig_yaml()).unwrap();
    // File one: clusters and users. File two: contexts and the current context.
    let one = serde_json::json!({"apiVersion": "v1", "kind": "Config", "clusters": config["clusters"], "users": config["users"]});
    let two = serde_json::json!({"apiVersion": "v1", "kind": "Config", "contexts": config["contexts"], "current-context": "emulator-restricted"});
    let dir = env.dir.path();
    std::fs::write(dir.join("one"), yaml_serde::to_string(&one).unwrap()).unwrap();
    std::fs::write(dir.join("two"), yaml_serde::to_string(&two).unwrap()).unwrap();
    let list = format!(
        "{}:{}:{}",
        dir.join("missing").display(),
        dir.join("one").display(),
        dir.join("two").display()
    );
    let output = env
        .command(BIN)
        .args(["list"])
        .env("KUBECONFIG", list)
        .output()
        .unwrap();
    // The restricted context's namespace is dev.
    let text = ok(output);
    assert!(
        text.contains("\napi ") && text.contains("\nbatch "),
        "{text}"
    );
}

#[test]
fn exec_credential_plugin_supplies_the_token() {
    let env = Env::kubevirt();
    let plugin = env.dir.path().join("credential-plugin");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\necho '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{}\"}}}}'\n",
            admin_token(&env)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut config: serde_json::Value =
        yaml_serde::from_str(&env.emulator.kubeconfig_yaml()).unwrap();
    config["users"] = serde_json::json!([{"name": "admin", "user": {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": plugin.to_str().unwrap(),
        "interactiveMode": "Never"
    }}}]);
    let path = env.dir.path().join("exec-kubeconfig");
    std::fs::write(&path, yaml_serde::to_string(&config).unwrap()).unwrap();
    let text = ok(env.vm(&["list", "-n", "prod", "--kubeconfig", path.to_str().unwrap()]));
    assert!(text.contains("db.primary"), "{text}");
}

#[test]
fn impersonation_flags_reach_the_server() {
    let env = Env::kubevirt();
    // bob may only read in dev (the emulator's default for non-admins).
    assert_eq!(
        crate::common::fails(&env, &["list", "-n", "prod", "--as", "bob"], 1),
        "Error: forbidden: user \"bob\" cannot list virtualmachines.kubevirt.io in namespace \"prod\""
    );
    let text = ok(env.vm(&[
        "list",
        "-n",
        "prod",
        "--as",
        "bob",
        "--as-group",
        "system:masters",
    ]));
    assert!(text.contains("db.primary"), "{text}");
    // alice may not impersonate anyone.
    let line = crate::common::fails(
        &env,
        &[
            "list",
            "-n",
            "dev",
            "--context",
            "emulator-restricted",
            "--as",
            "admin",
        ],
        1,
    );
    assert_eq!(
        line,
        "Error: forbidden: user \"alice\" cannot impersonate users"
    );
}
