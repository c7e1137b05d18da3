use std::process::Command;

use yaml_serde::Value;

use super::platform::{
    CA_KEYS_PATH, ENV_FILE_PATH, HOST_CERT_PATH, PROFILE_PATH, SSHD_DROP_IN_PATH,
};
use super::*;
use crate::create::fixtures;
use crate::flavor::Flavor;

fn plan() -> VmPlan {
    let mut plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    plan.platform_ssh.host = None;
    plan
}

fn user_data(plan: &VmPlan) -> UserData {
    plan.validate().unwrap();
    build(plan).unwrap().expect("user data")
}

fn yaml(text: &str) -> Value {
    yaml_serde::from_str(text).unwrap()
}

/// The platform cloud-config inside a multipart archive.
fn platform_part(text: &str) -> &str {
    let start = text.find("filename=\"kubevm-platform.cfg\"\n\n").unwrap()
        + "filename=\"kubevm-platform.cfg\"\n\n".len();
    let end = text[start..].find("\n--").unwrap() + start + 1;
    &text[start..end]
}

fn boot_script(doc: &Value) -> &str {
    doc["bootcmd"][0].as_str().unwrap()
}

#[test]
fn platform_ssh_is_written_every_boot() {
    let data = user_data(&plan());
    assert!(data.text.starts_with("#cloud-config\n"));
    assert!(!data.contains_secrets);
    let doc = yaml(&data.text);
    let boot = boot_script(&doc);
    let ca = &fixtures::ca_keys()[0];
    assert!(
        boot.contains(&format!(
            "cat > {CA_KEYS_PATH} <<'KUBEVM_EOF'\n{ca}\nKUBEVM_EOF\n"
        )),
        "{boot}"
    );
    assert!(
        boot.contains(&format!("cat > {SSHD_DROP_IN_PATH} <<'KUBEVM_EOF'\n")),
        "{boot}"
    );
    assert!(boot.contains(&format!("TrustedUserCAKeys {CA_KEYS_PATH}\n")));
    assert!(!boot.contains("HostCertificate"));
    assert!(boot.contains("useradd -m -s /bin/bash -c 'kubectl-vm platform user' kubevm"));
    assert!(boot.contains("usermod -p '*' \"$u\""));
    assert!(boot.contains("try-reload-or-restart ssh.service sshd.service"));
    // bootcmd alone creates the platform user: listing it in `users` too made cloud-init log
    // `User kubevm already exists, skipping` on every first boot.
    assert!(doc.get("users").is_none(), "{doc:?}");
    // No `packages:` (an apt-get update on every first boot, an error without a mirror).
    assert!(doc.get("packages").is_none(), "{doc:?}");
    assert!(
        doc["runcmd"][0]
            .as_str()
            .unwrap()
            .contains("systemctl enable --now qemu-guest-agent")
    );
}

#[test]
fn host_keys_make_it_secret() {
    let mut p = plan();
    p.platform_ssh.host = Some(fixtures::host_keys());
    let data = user_data(&p);
    assert!(data.contains_secrets && data.needs_secret());
    let doc = yaml(&data.text);
    let host = fixtures::host_keys();
    assert_eq!(
        doc["ssh_keys"]["ed25519_private"].as_str(),
        Some(host.private_key.as_str())
    );
    assert_eq!(
        doc["ssh_keys"]["ed25519_public"].as_str(),
        Some(host.public_key.as_str())
    );
    let boot = boot_script(&doc);
    assert!(
        boot.contains(&format!(
            "cat > {HOST_CERT_PATH} <<'KUBEVM_EOF'\n{}\nKUBEVM_EOF",
            host.certificate
        )),
        "{boot}"
    );
    assert!(boot.contains(&format!("HostCertificate {HOST_CERT_PATH}\n")));
}

#[test]
fn user_cloud_config_is_merged_not_replaced() {
    let mut p = plan();
    p.guest.user_data = Some("#cloud-config\npackages: [nginx]\nruncmd:\n  - systemctl start nginx\nssh_pwauth: true\nbootcmd: [echo mine]\nwrite_files:\n  - path: /etc/motd\n    content: hi\n".into());
    let doc = yaml(&user_data(&p).text);
    assert_eq!(doc["packages"], yaml("[nginx]"));
    assert_eq!(doc["ssh_pwauth"], Value::from(true));
    assert_eq!(doc["write_files"][0]["path"], Value::from("/etc/motd"));
    assert_eq!(
        doc["runcmd"].as_sequence().unwrap().last().unwrap(),
        &Value::from("systemctl start nginx")
    );
    let boot = doc["bootcmd"].as_sequence().unwrap();
    assert_eq!(boot.len(), 2);
    assert!(boot[0].as_str().unwrap().contains(CA_KEYS_PATH));
    assert_eq!(boot[1], Value::from("echo mine"));
}

#[test]
fn user_users_list_keeps_its_choice_about_default() {
    let mut p = plan();
    p.guest.user_data = Some("#cloud-config\nusers:\n  - name: ops\n".into());
    let doc = yaml(&user_data(&p).text);
    let names: Vec<_> = doc["users"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap_or("default"))
        .collect();
    assert_eq!(names, ["ops"]);
}

#[test]
fn user_password_makes_it_secret() {
    let mut p = plan();
    p.guest.user_data =
        Some("#cloud-config\nchpasswd: {expire: false}\npassword: hunter2\n".into());
    assert!(user_data(&p).contains_secrets);
}

#[test]
fn scripts_and_multiparts_are_kept_in_a_multipart() {
    let mut p = plan();
    p.guest.user_data = Some("#!/bin/bash\necho hello > /tmp/hello\n".into());
    let data = user_data(&p);
    assert!(data.text.starts_with("Content-Type: multipart/mixed"));
    assert!(
        data.text
            .contains("Content-Type: text/x-shellscript; charset=\"utf-8\"")
    );
    assert!(
        data.text
            .contains("\n\n#!/bin/bash\necho hello > /tmp/hello\n--")
    );
    let doc = yaml(platform_part(&data.text));
    assert!(boot_script(&doc).contains(CA_KEYS_PATH));

    let inner = "Content-Type: multipart/mixed; boundary=\"inner\"\nMIME-Version: 1.0\n\n--inner\nContent-Type: text/x-shellscript\n\n#!/bin/sh\necho a\n--inner\nContent-Type: text/cloud-config\n\n#cloud-config\npackages: [vim]\n--inner--\n";
    p.guest.user_data = Some(inner.into());
    let data = user_data(&p);
    assert!(data.text.contains(inner.trim_end()), "{}", data.text);
    let parsed = mail_parts(&data.text);
    assert_eq!(
        parsed,
        [
            "text/x-shellscript",
            "text/cloud-config",
            "text/cloud-config"
        ]
    );

    p.platform_ssh.enabled = false;
    p.guest.guest_agent = false;
    p.guest.user_data = Some("#!/bin/sh\necho only\n".into());
    assert_eq!(
        user_data(&p).text,
        "#!/bin/sh\necho only\n",
        "nothing to add: kept as is"
    );
}

/// Leaf part types as Python's email parser (which cloud-init uses) sees them.
fn mail_parts(text: &str) -> Vec<String> {
    let out = Command::new("python3")
        .arg("-c")
        .arg("import email,sys\nm=email.message_from_string(sys.stdin.read())\nprint('\\n'.join(p.get_content_type() for p in m.walk() if not p.is_multipart()))")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(text.as_bytes())?;
            child.wait_with_output()
        })
        .expect("python3 runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn env_files() {
    let mut p = plan();
    p.guest.env = vec![
        "APP_MODE=prod".parse().unwrap(),
        "GREETING=hello 'world' $x".parse().unwrap(),
    ];
    let doc = yaml(&user_data(&p).text);
    let boot = boot_script(&doc);
    assert!(boot.contains(&format!("cat > {ENV_FILE_PATH} <<'KUBEVM_EOF'\nAPP_MODE=prod\nGREETING=\"hello 'world' \\$x\"\nKUBEVM_EOF")), "{boot}");
    assert!(boot.contains(&format!("cat > {PROFILE_PATH} <<'KUBEVM_EOF'\nexport APP_MODE='prod'\nexport GREETING='hello '\\''world'\\'' $x'\nKUBEVM_EOF")), "{boot}");
    assert!(boot.contains("cat >> /etc/environment <<'KUBEVM_EOF'\n# BEGIN kubevm\nAPP_MODE=prod\nGREETING=\"hello 'world' $x\"\n# END kubevm\n"), "{boot}");
    assert!(boot.contains("sed -i '/^# BEGIN kubevm$/,/^# END kubevm$/d' /etc/environment"));
}

/// `create --env DB_PASSWORD=…` on a VM without platform SSH (no host key, small user data) put
/// the value inline into the VM's spec, readable by anyone who may read VMs.
#[test]
fn env_values_always_go_through_a_secret() {
    let mut p = plan();
    p.platform_ssh.enabled = false;
    p.guest.env = vec!["DB_PASSWORD=hunter2".parse().unwrap()];
    let data = user_data(&p);
    assert!(data.text.len() < INLINE_LIMIT, "{}", data.text.len());
    assert!(data.contains_secrets && data.needs_secret());
    p.guest.env.clear();
    p.guest.ssh_keys = vec!["ssh-ed25519 AAAAkey me@laptop".into()];
    assert!(!user_data(&p).needs_secret());
}

#[test]
fn ssh_keys_and_user() {
    let mut p = plan();
    p.guest.ssh_keys = vec!["ssh-ed25519 AAAAkey me@laptop".into()];
    let doc = yaml(&user_data(&p).text);
    assert_eq!(
        doc["ssh_authorized_keys"],
        yaml("['ssh-ed25519 AAAAkey me@laptop']")
    );
    p.guest.user = Some("alice".into());
    let doc = yaml(&user_data(&p).text);
    assert!(doc.get("ssh_authorized_keys").is_none());
    let alice = &doc["users"][1];
    assert_eq!(alice["name"], Value::from("alice"));
    assert_eq!(
        alice["ssh_authorized_keys"],
        yaml("['ssh-ed25519 AAAAkey me@laptop']")
    );
    assert!(boot_script(&doc).contains("for u in kubevm alice; do"));
}

#[test]
fn nothing_to_configure_and_windows() {
    let mut p = plan();
    p.platform_ssh.enabled = false;
    p.guest.guest_agent = false;
    assert_eq!(build(&p).unwrap(), None);
    p.os = OsType::Windows;
    p.guest.user_data = Some("#ps1_sysnative\nnet user admin P@ss /add\n".into());
    let data = build(&p).unwrap().unwrap();
    assert_eq!(data.text, "#ps1_sysnative\nnet user admin P@ss /add\n");
    p.platform_ssh.enabled = true;
    assert_eq!(
        build(&p).unwrap().unwrap().text,
        data.text,
        "no Linux injection on Windows"
    );
}

#[test]
fn size_decides_secret() {
    let small = UserData {
        text: "x".repeat(INLINE_LIMIT),
        contains_secrets: false,
    };
    assert!(!small.needs_secret());
    let big = UserData {
        text: "x".repeat(INLINE_LIMIT + 1),
        contains_secrets: false,
    };
    assert!(big.needs_secret());
}

#[test]
fn bad_user_data_is_one_line() {
    let mut p = plan();
    p.guest.user_data = Some("#cloud-config\nusers:\n  - name: a\n   bad: indent\n".into());
    let e = build(&p).unwrap_err().to_string();
    assert!(
        e.starts_with("--cloud-init data is not valid YAML at line 4, column") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn scripts_are_valid_shell() {
    let mut p = plan();
    p.platform_ssh.host = Some(fixtures::host_keys());
    p.guest.env = vec!["A=b c".parse().unwrap()];
    p.guest.user = Some("alice".into());
    let doc = yaml(&user_data(&p).text);
    for key in ["bootcmd", "runcmd"] {
        let script = doc[key][0].as_str().unwrap();
        let out = Command::new("sh")
            .args(["-n", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Runs `cloud-init schema` on generated cloud-configs. Needs the `cloud-init` command
/// (Debian: `apt-get install -y cloud-init`); fails without it.
#[test]
fn cloud_init_accepts_the_schema() {
    let probe = Command::new("cloud-init").arg("--version").output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "the `cloud-init` command is missing: install it (Debian/Ubuntu: apt-get install -y cloud-init) to validate generated user data"
    );
    let mut cases: Vec<(&str, VmPlan)> = Vec::new();
    cases.push(("plain", plan()));
    let mut with_user = plan();
    with_user.guest.user_data = Some("#cloud-config\npackages: [nginx]\nruncmd: [[systemctl, start, nginx]]\nusers: [default, {name: ops, groups: [adm]}]\n".into());
    with_user.guest.ssh_keys = vec!["ssh-ed25519 AAAAkey me".into()];
    cases.push(("user cloud-config", with_user));
    let mut with_env = plan();
    with_env.guest.env = vec!["A=1".parse().unwrap(), "B=two words".parse().unwrap()];
    with_env.guest.user = Some("alice".into());
    with_env.timezone = Some("Europe/Berlin".into());
    cases.push(("env", with_env));
    let mut with_host = plan();
    with_host.platform_ssh.host = Some(fixtures::host_keys());
    with_host.flavor = Flavor::Deckhouse;
    with_host.hostname = Some("web-01".into());
    cases.push(("host key", with_host));
    let mut multipart = plan();
    multipart.guest.user_data = Some("#!/bin/sh\necho hi\n".into());
    cases.push(("multipart", multipart));

    let dir = tempfile::tempdir().unwrap();
    for (name, plan) in cases {
        let data = user_data(&plan);
        let config = if data.text.starts_with("Content-Type:") {
            platform_part(&data.text).to_string()
        } else {
            data.text.clone()
        };
        let path = dir.path().join("user-data");
        std::fs::write(&path, &config).unwrap();
        let out = Command::new("cloud-init")
            .args(["schema", "--config-file"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: cloud-init schema rejected the user data:\n{}{}\n{config}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Runs the generated `runcmd` script under `sh` with a PATH of stand-ins only, the guest's log
/// file moved into a temporary directory. `present` holds what the image has (`qemu-ga`), and
/// `apt_works` whether `apt-get` reaches a mirror (it then "installs" qemu-ga). Returns the
/// exit status and the stand-ins' calls, one per line.
fn run_first_boot(present: bool, apt_works: bool) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let calls = dir.path().join("calls");
    let shim = |name: &str, body: &str| {
        let path = bin.join(name);
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"{name} $*\" >> {}\n{body}\n",
                calls.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    shim("systemctl", "exit 0");
    for tool in ["getent", "cut", "tr", "usermod"] {
        shim(tool, "exit 0");
    }
    if present {
        shim("qemu-ga", "exit 0");
    }
    let install = format!(
        "case \"$*\" in *install*) printf '#!/bin/sh\\n' > {0}/qemu-ga; /bin/chmod +x {0}/qemu-ga;; esac",
        bin.display()
    );
    if apt_works {
        shim("apt-get", &install);
    } else {
        shim(
            "apt-get",
            "echo 'E: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease' >&2; exit 100",
        );
    }
    let mut p = plan();
    p.guest.user = Some("alice".into());
    let doc = yaml(&user_data(&p).text);
    let log = dir.path().join("agent.log");
    let script = doc["runcmd"][0]
        .as_str()
        .unwrap()
        .replace("/var/log/kubevm-guest-agent.log", log.to_str().unwrap());
    let out = Command::new("/bin/sh")
        .args(["-c", &script])
        .env_clear()
        .env("PATH", &bin)
        .output()
        .unwrap();
    (
        out.status.success(),
        std::fs::read_to_string(&calls).unwrap_or_default(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn guest_agent_present_means_no_package_manager() {
    let (ok, calls, _) = run_first_boot(true, false);
    assert!(ok);
    assert!(!calls.contains("apt-get"), "{calls}");
    assert!(
        calls.contains("systemctl enable --now qemu-guest-agent.service"),
        "{calls}"
    );
}

#[test]
fn guest_agent_missing_is_installed_when_a_mirror_answers() {
    let (ok, calls, _) = run_first_boot(false, true);
    assert!(ok);
    let apt: Vec<_> = calls.lines().filter(|l| l.starts_with("apt-get")).collect();
    assert_eq!(apt.len(), 2, "{calls}");
    assert!(apt[0].ends_with(" update"), "{calls}");
    assert!(apt[1].contains("install") && apt[1].ends_with("qemu-guest-agent"));
    assert!(calls.contains("systemctl enable --now qemu-guest-agent.service"));
}

#[test]
fn guest_agent_without_a_mirror_is_not_an_error() {
    let (ok, calls, stdout) = run_first_boot(false, false);
    assert!(
        ok,
        "a missing agent must not fail runcmd (cloud-init status: error)"
    );
    assert!(calls.contains("apt-get -qq update"), "{calls}");
    assert!(!calls.contains("systemctl enable"), "{calls}");
    assert!(
        stdout.contains("qemu-guest-agent is missing and could not be installed"),
        "{stdout}"
    );
}

#[test]
fn no_guest_agent_leaves_the_agent_alone() {
    let mut p = plan();
    p.guest.guest_agent = false;
    let doc = yaml(&user_data(&p).text);
    let text = format!("{doc:?}");
    assert!(!text.contains("qemu-guest-agent"), "{text}");
}

/// User data from a Secret is merged like a file (the platform trust stays) and always goes
/// into kubectl-vm's own Secret; boot-time credential keys create their users.
#[test]
fn secret_user_data_and_boot_keys() {
    let mut p = plan();
    p.guest.user_data = Some("#cloud-config\nruncmd:\n  - echo from-secret\n".into());
    p.guest.user_data_from_secret = true;
    p.guest.boot_keys = vec![
        ("ops".into(), vec!["ssh-ed25519 AAAA one".into()]),
        ("ops".into(), vec!["ssh-ed25519 BBBB two".into()]),
    ];
    let data = build(&p).unwrap().unwrap();
    assert!(data.needs_secret());
    let doc = yaml(&data.text);
    let runcmd = format!("{:?}", doc["runcmd"]);
    assert!(runcmd.contains("from-secret"), "{runcmd}");
    assert!(data.text.contains(CA_KEYS_PATH));
    let users = doc["users"].as_sequence().unwrap();
    assert_eq!(users[0], Value::String("default".into()));
    let ops = users
        .iter()
        .find(|u| u["name"].as_str() == Some("ops"))
        .unwrap();
    let keys: Vec<&str> = ops["ssh_authorized_keys"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(keys, ["ssh-ed25519 AAAA one", "ssh-ed25519 BBBB two"]);
    assert_eq!(users.len(), 2, "ops is listed once");
    assert!(ops.get("sudo").is_none(), "boot-time users get no sudo");
    assert_eq!(ops["lock_passwd"], Value::Bool(false), "a password is kept");
    assert!(
        data.text.contains("for u in kubevm ops; do"),
        "{}",
        data.text
    );
}

/// Found by `properties::cloud_config_keeps_the_platform_trust` (issue 37): `bootcmd:` left
/// empty replaced the platform's boot script, so the guest no longer trusted the CA; a value of
/// another shape did the same. Empty keys are dropped; wrong shapes are refused in one line.
#[test]
fn user_keys_of_another_shape_never_replace_the_platform_part() {
    let mut p = plan();
    p.guest.user_data = Some("#cloud-config\nbootcmd: null\nruncmd:\n".into());
    let doc = yaml(&user_data(&p).text);
    assert!(boot_script(&doc).contains(CA_KEYS_PATH));
    for (text, key, shape) in [
        ("#cloud-config\nbootcmd: echo mine\n", "bootcmd", "a list"),
        ("#cloud-config\nruncmd: {a: 1}\n", "runcmd", "a list"),
        ("#cloud-config\nssh_keys: [x]\n", "ssh_keys", "a mapping"),
    ] {
        let mut p = plan();
        p.platform_ssh.host = Some(fixtures::host_keys());
        p.guest.user_data = Some(text.into());
        let err = build(&p).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("--cloud-init data: {key:?} must be {shape}")),
            "{err}"
        );
        assert!(!err.contains('\n'));
    }
}
