use serde_json::json;

use super::*;

fn vm(name: &str, ns: &str, status: &str, annotations: Value, labels: Value) -> VmSummary {
    let object = json!({"metadata": {"name": name, "namespace": ns,
        "annotations": annotations, "labels": labels}});
    let mut summary = crate::vm::summarize_deckhouse(&object);
    summary.status = status.into();
    summary
}

fn build_all(vms: &[VmSummary], options: &Options) -> (Inventory, Vec<Event>) {
    let mut events = Vec::new();
    let inv = build(vms, options, &mut |e| events.push(e));
    (inv, events)
}

#[test]
fn group_names_are_sanitized_and_reserved_ones_refused() {
    assert_eq!(group_name("web").as_deref(), Some("web"));
    assert_eq!(group_name("prod-eu.1").as_deref(), Some("prod_eu_1"));
    assert_eq!(group_name(" 9lives ").as_deref(), Some("_9lives"));
    assert_eq!(group_name("grüß").as_deref(), Some("gr__"));
    assert_eq!(group_name("a b;$(x)").as_deref(), Some("a_b___x_"));
    for bad in ["", "  ", "all", "ungrouped", "_meta"] {
        assert_eq!(group_name(bad), None, "{bad:?}");
    }
}

#[test]
fn connection_steering_and_invalid_vars_are_refused() {
    for ok in [
        "http_port",
        "_x",
        "ansible_python_interpreter",
        "ansible_become",
        "ansible_become_user",
        "ansible_become_password",
    ] {
        assert_eq!(var_refusal(ok, "v"), None, "{ok}");
    }
    assert_eq!(var_refusal("ansible_user", "deploy"), None);
    for bad in [
        "ansible_host",
        "ansible_port",
        "ansible_connection",
        "ansible_ssh_common_args",
        "ansible_ssh_extra_args",
        "ansible_ssh_executable",
        "ansible_scp_extra_args",
        "ansible_private_key_file",
        "ansible_shell_executable",
        "hostvars",
        "inventory_hostname",
        "1x",
        "a-b",
        "a.b",
        "",
    ] {
        assert!(var_refusal(bad, "v").is_some(), "{bad:?}");
    }
    assert!(var_refusal("ansible_user", "root -oProxyCommand=x").is_some());
}

#[test]
fn hosts_groups_and_vars_from_annotations() {
    let vms = [
        vm(
            "web",
            "prod-eu",
            "Running",
            json!({
                GROUPS_ANNOTATION: "frontend, db ,,all",
                DECKHOUSE_GROUPS_ANNOTATION: "legacy",
                "vars.ansible.kubevm.io/http_port": "8080",
                "vars.ansible.deckhouse.io/http_port": "80",
                "vars.ansible.deckhouse.io/tier": "gold",
                "vars.ansible.kubevm.io/ansible_host": "evil.example",
                "vars.ansible.kubevm.io/ansible_ssh_common_args": "-oProxyCommand=touch /tmp/x",
                "ssh.kubevm.io/default-login": "ubuntu",
            }),
            json!({"app": "shop", "tier": "1"}),
        ),
        vm("web", "dev", "Running", json!({}), json!({"app": "shop"})),
        vm("off", "dev", "Stopped", json!({}), json!({})),
    ];
    let options = Options {
        group_by_labels: vec!["app".into(), "missing".into()],
        ssh_common_args: Some("-F /k/c".into()),
    };
    let (inv, events) = build_all(&vms, &options);
    assert_eq!(
        inv.hosts.keys().collect::<Vec<_>>(),
        ["web.dev", "web.prod-eu"]
    );
    let web = &inv.hosts["web.prod-eu"];
    assert_eq!(web["ansible_host"], HostVar::Ours("web.prod-eu.vm".into()));
    assert_eq!(web["ansible_user"], HostVar::Ours("ubuntu".into()));
    // Ours win over d8's.
    assert_eq!(web["http_port"], HostVar::Unsafe("8080".into()));
    assert_eq!(web["tier"], HostVar::Unsafe("gold".into()));
    assert_eq!(web.len(), 4, "{web:?}");
    let members = |g: &str| inv.groups[g].iter().cloned().collect::<Vec<_>>();
    assert_eq!(members("prod_eu"), ["web.prod-eu"]);
    assert_eq!(members("dev"), ["web.dev"]);
    assert_eq!(members("frontend"), ["web.prod-eu"]);
    assert_eq!(members("db"), ["web.prod-eu"]);
    assert_eq!(members("legacy"), ["web.prod-eu"]);
    assert_eq!(members("app_shop"), ["web.dev", "web.prod-eu"]);
    assert_eq!(inv.groups.len(), 6, "{:?}", inv.groups.keys());
    assert_eq!(inv.vars["ansible_ssh_common_args"], "-F /k/c");
    assert!(events.contains(&Event::NotRunning {
        host: "off.dev".into(),
        status: "Stopped".into()
    }));
    assert!(events.contains(&Event::GroupRefused {
        host: "web.prod-eu".into(),
        group: "all".into()
    }));
    let refused: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::VarRefused { var, .. } => Some(var.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(refused, ["ansible_host", "ansible_ssh_common_args"]);
}

#[test]
fn hostile_names_are_not_hosts() {
    let (inv, events) = build_all(
        &[vm("a$(x)", "dev", "Running", json!({}), json!({}))],
        &Options::default(),
    );
    assert!(inv.hosts.is_empty());
    assert!(matches!(events[..], [Event::BadName { .. }]));
}

fn sample() -> Inventory {
    let vms = [vm(
        "web",
        "prod",
        "Running",
        json!({
            GROUPS_ANNOTATION: "frontend",
            "vars.ansible.kubevm.io/motd": "{{ lookup('pipe', 'id') }} \"q\" \\ ü\u{7f}\n",
            "vars.ansible.kubevm.io/port": "8080",
        }),
        json!({}),
    )];
    build_all(
        &vms,
        &Options {
            group_by_labels: vec![],
            ssh_common_args: Some("-F '/home/a b/c'".into()),
        },
    )
    .0
}

const MOTD: &str = "{{ lookup('pipe', 'id') }} \"q\" \\ ü\u{7f}\n";

#[test]
fn script_json_marks_cluster_values_unsafe() {
    let list = list_json(&sample());
    assert_eq!(
        list["_meta"]["hostvars"]["web.prod"],
        json!({
            "ansible_host": "web.prod.vm",
            "motd": {"__ansible_unsafe": MOTD},
            "port": {"__ansible_unsafe": "8080"},
        })
    );
    assert_eq!(list["frontend"], json!({"hosts": ["web.prod"]}));
    assert_eq!(list["prod"], json!({"hosts": ["web.prod"]}));
    assert_eq!(
        list["all"],
        json!({"children": ["frontend", "prod"],
               "vars": {"ansible_ssh_common_args": "-F '/home/a b/c'"}})
    );
    assert_eq!(
        host_json(&sample(), "web.prod"),
        list["_meta"]["hostvars"]["web.prod"]
    );
    assert_eq!(host_json(&sample(), "nope.prod"), json!({}));
}

#[test]
fn ungrouped_hosts_are_listed() {
    // A namespace named like a reserved group makes no group.
    let (inv, _) = build_all(
        &[vm("a", "all", "Running", json!({}), json!({}))],
        &Options::default(),
    );
    let list = list_json(&inv);
    assert_eq!(list["ungrouped"], json!({"hosts": ["a.all"]}));
    assert_eq!(list["all"]["children"], json!(["ungrouped"]));
}

#[test]
fn yaml_reads_back_with_unsafe_tags() {
    let text = yaml(&sample());
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    let host = &doc["all"]["hosts"]["web.prod"];
    assert_eq!(host["ansible_host"].as_str(), Some("web.prod.vm"));
    let yaml_serde::Value::Tagged(motd) = &host["motd"] else {
        panic!("motd is not tagged: {text}");
    };
    assert_eq!(motd.tag, "!unsafe");
    assert_eq!(motd.value.as_str(), Some(MOTD));
    assert_eq!(
        doc["all"]["vars"]["ansible_ssh_common_args"].as_str(),
        Some("-F '/home/a b/c'")
    );
    let frontend = &doc["all"]["children"]["frontend"]["hosts"];
    assert!(frontend.as_mapping().unwrap().contains_key("web.prod"));
    // Still a YAML document after any part of the padding is taken away.
    let padded = format!("{}{text}", yaml_pipe_padding());
    assert!(padded.len() - text.len() >= 16 * 1024 - 128);
    for cut in [0, 1, 2, 127, 128, 4096, 8192, 16 * 1024 - 200] {
        let rest: yaml_serde::Value = yaml_serde::from_str(&padded[cut..]).unwrap();
        assert_eq!(rest, doc, "cut at {cut}");
    }
}

#[test]
fn ini_leaves_out_what_it_cannot_carry_untemplated() {
    let mut events = Vec::new();
    let text = ini(&sample(), &mut |e| events.push(e));
    assert_eq!(
        text,
        "# Generated by `kubectl vm ansible-inventory`.\n\
         \n[frontend]\nweb.prod ansible_host=web.prod.vm port=8080\n\
         \n[prod]\nweb.prod\n\
         \n[all:vars]\nansible_ssh_common_args=-F '/home/a b/c'\n"
    );
    assert_eq!(
        events
            .iter()
            .map(|e| match e {
                Event::VarRefused { var, .. } => var.as_str(),
                _ => "",
            })
            .collect::<Vec<_>>(),
        ["motd"]
    );
}

#[test]
fn ssh_config_path_is_stable_per_selection() {
    let inv = |args: &[&str]| Invocation {
        program: "/bin/kubectl-vm".into(),
        global_args: args.iter().map(|s| s.to_string()).collect(),
    };
    let home = Path::new("/h");
    let a = ssh_config_path(home, &inv(&["--context", "a"]), &["https://x", "a"]);
    assert_eq!(
        a,
        ssh_config_path(home, &inv(&["--context", "a"]), &["https://x", "a"])
    );
    assert_ne!(
        a,
        ssh_config_path(home, &inv(&["--context", "b"]), &["https://x", "a"])
    );
    assert_ne!(
        a,
        ssh_config_path(home, &inv(&["--context", "a"]), &["https://y", "a"])
    );
    assert!(a.starts_with("/h/.kube/kubectl-vm/ansible/"), "{a:?}");
    assert_eq!(
        ssh_common_args(Path::new("/h/it's here")),
        r"-F '/h/it'\''s here'"
    );
}
