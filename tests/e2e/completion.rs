//! Completion through kubectl's plugin completion (`kubectl_complete-vm`) and through the
//! script `kubectl vm completion bash` prints.

use crate::common::{Env, ok, stderr};

/// Candidates (first column) kubectl's `__complete` returns, and its directive line.
fn kubectl_complete(env: &Env, words: &[&str]) -> (Vec<String>, String) {
    let mut args = vec!["__complete", "vm"];
    args.extend_from_slice(words);
    let output = env.kubectl(&args);
    let text = ok(output);
    let mut lines: Vec<&str> = text.lines().collect();
    let directive = lines.pop().unwrap_or_default().to_owned();
    let values = lines
        .iter()
        .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
        .collect();
    (values, directive)
}

#[test]
fn kubectl_completes_commands() {
    let env = Env::kubevirt();
    let (values, directive) = kubectl_complete(&env, &[""]);
    for command in ["list", "get", "version", "completion"] {
        assert!(
            values.contains(&command.to_owned()),
            "{command} missing from {values:?}"
        );
    }
    assert!(
        !values.iter().any(|v| v == "generate-docs"),
        "hidden commands stay hidden"
    );
    assert_eq!(directive, ":4");
}

#[test]
fn kubectl_completes_flags() {
    let env = Env::kubevirt();
    let (values, _) = kubectl_complete(&env, &["list", "--"]);
    for flag in [
        "--output",
        "--selector",
        "--all-namespaces",
        "--watch",
        "--context",
        "--namespace",
    ] {
        assert!(
            values.contains(&flag.to_owned()),
            "{flag} missing from {values:?}"
        );
    }
}

#[test]
fn kubectl_completes_vm_names_from_the_cluster() {
    let env = Env::kubevirt();
    let (values, _) = kubectl_complete(&env, &["get", "-n", "prod", ""]);
    let mut expected: Vec<String> = env
        .emulator
        .objects("kubevirt.io", "virtualmachines", Some("prod"))
        .iter()
        .map(|vm| vm["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    expected.sort();
    assert!(!expected.is_empty());
    let mut values = values;
    values.sort();
    assert_eq!(values, expected);
    // The prefix filters.
    let first = &expected[0][..1];
    let (values, _) = kubectl_complete(&env, &["get", "-n", "prod", first]);
    assert!(values.iter().all(|v| v.starts_with(first)) && !values.is_empty());
}

#[test]
fn kubectl_completes_namespaces_and_contexts() {
    let env = Env::kubevirt();
    let (values, _) = kubectl_complete(&env, &["list", "-n", ""]);
    for ns in ["default", "dev", "prod"] {
        assert!(
            values.contains(&ns.to_owned()),
            "{ns} missing from {values:?}"
        );
    }
    let (values, _) = kubectl_complete(&env, &["list", "--context", ""]);
    assert_eq!(values, ["emulator", "emulator-restricted"]);
}

#[test]
fn kubectl_completer_is_quiet_when_the_cluster_is_unreachable() {
    let env = Env::kubevirt();
    let output = env
        .command(env.bin_dir.join("kubectl_complete-vm"))
        .args(["get", "--kubeconfig", "/nonexistent", ""])
        .output()
        .unwrap();
    assert_eq!(stderr(&output), "");
    assert_eq!(ok(output), ":4\n");
}

/// Run the bash completion function from `kubectl vm completion bash` for `words`.
fn bash_complete(env: &Env, words: &[&str]) -> Vec<String> {
    let script = ok(env.vm(&["completion", "bash"]));
    let script_path = env.dir.path().join("kubectl-vm.bash");
    std::fs::write(&script_path, script).unwrap();
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'\nCOMP_WORDS=({})\nCOMP_CWORD={}\nCOMP_TYPE=9\n_clap_complete_kubectl_vm kubectl-vm '{}' '{}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script_path.display(),
        quoted.join(" "),
        words.len() - 1,
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let text = ok(env.command("bash").arg("-c").arg(program).output().unwrap());
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.trim_end().to_owned())
        .collect()
}

#[test]
fn bash_script_completes_commands_flags_and_vm_names() {
    let env = Env::kubevirt();
    let commands = bash_complete(&env, &["kubectl-vm", ""]);
    for command in ["list", "get", "version"] {
        assert!(
            commands.contains(&command.to_owned()),
            "{command} missing from {commands:?}"
        );
    }
    let flags = bash_complete(&env, &["kubectl-vm", "list", "--al"]);
    assert_eq!(flags, ["--all-namespaces"]);
    let names = bash_complete(&env, &["kubectl-vm", "get", "-n", "dev", ""]);
    for vm in ["api", "batch"] {
        assert!(
            names.contains(&vm.to_owned()),
            "{vm} missing from {names:?}"
        );
    }
    let names = bash_complete(&env, &["kubectl-vm", "get", "-n", "dev", "b"]);
    assert_eq!(names, ["batch"]);
}

#[test]
fn kubectl_completes_create_flags_and_secret_names() {
    let env = Env::kubevirt();
    let (values, _) = kubectl_complete(&env, &["create", "web", "--"]);
    for flag in [
        "--sockets",
        "--threads",
        "--uuid",
        "--serial",
        "--secure-boot",
        "--persistent-efi",
        "--subdomain",
        "--user-data-secret",
        "--ssh-key-secret",
        "--access-credential",
        "--replicas",
    ] {
        assert!(
            values.contains(&flag.to_owned()),
            "{flag} missing from {values:?}"
        );
    }
    ok(env.kubectl(&[
        "create",
        "secret",
        "generic",
        "team-keys",
        "-n",
        "dev",
        "--from-literal=ops=ssh-ed25519 AAAA ops",
    ]));
    let mut expected: Vec<String> = env
        .emulator
        .objects("", "secrets", Some("dev"))
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    expected.sort();
    assert!(expected.contains(&"team-keys".to_owned()));
    for flag in [
        "--user-data-secret",
        "--ssh-key-secret",
        "--access-credential",
    ] {
        let (mut values, _) = kubectl_complete(&env, &["create", "web", "-n", "dev", flag, ""]);
        values.sort();
        assert_eq!(values, expected, "{flag}");
    }
}

#[test]
fn kubectl_completes_disk_names_for_attach() {
    let env = Env::kubevirt();
    let (values, _) = kubectl_complete(&env, &["disk", "attach", "web", "fedora"]);
    assert_eq!(values, ["fedora-dv-root"]);
    let env = Env::deckhouse();
    let (values, _) = kubectl_complete(&env, &["disk", "attach", "linux-vm", ""]);
    assert!(values.contains(&"linux-disk".to_owned()), "{values:?}");
    assert!(
        values.contains(&"cvi/ubuntu-24-04".to_owned()),
        "{values:?}"
    );
}

/// Candidates as kubectl's `__complete` prints them, `value<TAB>help`, the directive left out.
fn kubectl_complete_lines(env: &Env, words: &[&str]) -> Vec<String> {
    let mut args = vec!["__complete", "vm"];
    args.extend_from_slice(words);
    let text = ok(env.kubectl(&args));
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines.pop();
    lines
}

/// Each disk and network candidate carries its kind as help, from the platform's table; a
/// platform that names networks otherwise (Deckhouse) is offered none.
#[test]
fn kubectl_completion_names_each_candidates_kind() {
    let env = Env::kubevirt();
    let nad = env.dir.path().join("nad.yaml");
    std::fs::write(
        &nad,
        "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {name: br-net, namespace: default}\nspec:\n  config: '{\"cniVersion\": \"0.3.1\", \"type\": \"bridge\"}'\n",
    )
    .unwrap();
    ok(env.kubectl(&["apply", "-f", nad.to_str().unwrap()]));
    let lines = kubectl_complete_lines(&env, &["set", "network", "web", "--add", "br"]);
    assert_eq!(lines, ["br-net\tNetworkAttachmentDefinition"]);
    let lines = kubectl_complete_lines(&env, &["disk", "attach", "web", "fedora"]);
    assert_eq!(lines, ["fedora-dv-root\tDataVolume"]);

    let env = Env::deckhouse();
    let lines = kubectl_complete_lines(&env, &["disk", "attach", "linux-vm", ""]);
    for want in [
        "linux-disk\tVirtualDisk",
        "cvi/ubuntu-24-04\tClusterVirtualImage",
    ] {
        assert!(lines.contains(&want.to_owned()), "{want} not in {lines:?}");
    }
    let lines = kubectl_complete_lines(&env, &["set", "network", "linux-vm", "--add", ""]);
    assert_eq!(lines, Vec::<String>::new());
}

#[test]
fn kubectl_completes_snapshot_names() {
    let env = Env::kubevirt();
    ok(env.vm(&["snapshot", "create", "web", "web-before"]));
    ok(env.vm(&["snapshot", "create", "web", "other"]));
    let (values, _) = kubectl_complete(&env, &["snapshot", "restore", "web-"]);
    assert_eq!(values, ["web-before"]);
    let (values, _) = kubectl_complete(&env, &["snapshot", "delete", ""]);
    assert_eq!(values, ["other", "web-before"]);
}

/// `completion install` links `kubectl_complete-vm` beside the binary, after which real
/// kubectl completes `kubectl vm` through it (and not before); a second run says so and
/// changes nothing; a file of that name that is not a link is left alone; a missing directory
/// is bad input.
#[test]
fn completion_install_makes_kubectl_complete_the_plugin() {
    let env = Env::kubevirt();
    let plugins = env.dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let exe = plugins.join("kubectl-vm");
    std::fs::copy(crate::common::BIN, &exe).unwrap();
    let exe = exe.canonicalize().unwrap();
    let path = format!("{}:/usr/bin:/bin", plugins.display());
    let run = |program: &std::path::Path, args: &[&str], path: &str| {
        std::process::Command::new(program)
            .args(args)
            .env("HOME", env.dir.path())
            .env("KUBECONFIG", &env.kubeconfig)
            .env("PATH", path)
            .env_remove("COMPLETE")
            .output()
            .unwrap()
    };
    let kubectl = crate::common::kubectl();
    let complete = |path: &str| {
        let text = ok(run(&kubectl, &["__complete", "vm", "li"], path));
        // Candidates, then kubectl's `:DIRECTIVE` line.
        text.lines()
            .filter(|l| !l.starts_with(':'))
            .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
            .collect::<Vec<_>>()
    };
    // Before: kubectl finds the plugin but no completer for it.
    assert!(!complete(&path).contains(&"list".to_owned()));

    let link = plugins.join("kubectl_complete-vm");
    let out = ok(run(&exe, &["completion", "install"], &path));
    assert_eq!(
        out,
        format!("linked {} -> {}\n", link.display(), exe.display())
    );
    assert_eq!(std::fs::read_link(&link).unwrap(), exe);
    assert_eq!(complete(&path), ["list"]);

    let again = ok(run(&exe, &["completion", "install"], &path));
    assert_eq!(
        again,
        format!("{} already points to {}\n", link.display(), exe.display())
    );

    // Another directory, not on PATH: linked, with a note saying kubectl will not find it.
    let elsewhere = env.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let dir_arg = elsewhere.to_str().unwrap();
    let out = ok(run(
        &exe,
        &["completion", "install", "--dir", dir_arg],
        &path,
    ));
    assert!(
        out.ends_with(&format!(
            "note: {dir_arg} is not on PATH; kubectl only finds completers on PATH\n"
        )),
        "{out}"
    );

    // A regular file of that name is someone else's: refused, untouched.
    let taken = env.dir.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("kubectl_complete-vm"), "#!/bin/sh\necho mine\n").unwrap();
    let refused = run(
        &exe,
        &["completion", "install", "--dir", taken.to_str().unwrap()],
        &path,
    );
    assert_eq!(refused.status.code(), Some(1));
    assert_eq!(
        stderr(&refused).trim_end(),
        format!(
            "Error: {} exists and is not a link; remove it first",
            taken.join("kubectl_complete-vm").display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(taken.join("kubectl_complete-vm")).unwrap(),
        "#!/bin/sh\necho mine\n"
    );

    let missing = run(
        &exe,
        &["completion", "install", "--dir", "/nonexistent/dir"],
        &path,
    );
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
    assert_eq!(
        stderr(&missing).trim_end(),
        "Error: /nonexistent/dir is not a directory"
    );
}

/// `--node-selector` and `--node-affinity` complete the cluster's node labels as KEY=VALUE
/// (one labelled by real kubectl here), on `create` and `set placement`.
#[test]
fn kubectl_completes_node_labels_for_placement() {
    let env = Env::kubevirt();
    ok(env.kubectl(&["label", "node", "node-2", "disktype=ssd"]));
    let (values, _) = kubectl_complete(
        &env,
        &["set", "placement", "web", "--node-selector", "disk"],
    );
    assert_eq!(values, ["disktype=ssd"]);
    let (values, _) = kubectl_complete(
        &env,
        &["create", "db", "--node-affinity", "kubernetes.io/hostname="],
    );
    assert_eq!(
        values,
        [
            "kubernetes.io/hostname=node-1",
            "kubernetes.io/hostname=node-2"
        ]
    );
}
