//! The cloud-config that kubectl-vm injects into Linux guests: platform SSH trust, the
//! platform user, `--guest-user`/`--ssh-key`, `--env` files, qemu-guest-agent, time zone and host
//! keys.
//!
//! Whatever must survive a CA rotation or a host-certificate renewal is written by `bootcmd`,
//! which cloud-init runs on every boot (the per-instance modules run only once per instance).

pub use crate::names::{
    CA_KEYS_PATH, ENV_FILE_PATH, HOST_CERT_PATH, PRINCIPALS_DIR, PROFILE_PATH,
    REVOKED_KRL_B64_PATH, REVOKED_KRL_PATH, SSHD_DROP_IN_PATH,
};

use yaml_serde::{Mapping, Value};

use crate::create::plan::VmPlan;
use crate::validate::EnvVar;

/// sudoers drop-in for the platform user.
const SUDOERS_PATH: &str = "/etc/sudoers.d/90-kubevm";

const SUDO_ALL: &str = "ALL=(ALL) NOPASSWD:ALL";

fn s(text: &str) -> Value {
    Value::String(text.to_string())
}

fn strings<I: IntoIterator<Item = S>, S: AsRef<str>>(items: I) -> Value {
    Value::Sequence(items.into_iter().map(|i| s(i.as_ref())).collect())
}

/// The platform cloud-config as a YAML mapping. `user_has_users` tells whether the user's own
/// cloud-config has a `users` list: if not, `default` is listed so the image's default user
/// is still created next to the ones added here.
pub fn platform_config(plan: &VmPlan, user_has_users: bool) -> Mapping {
    let guest = &plan.guest;
    let ssh = &plan.platform_ssh;
    let mut doc = Mapping::new();
    // The platform user is not listed here: `bootcmd` creates it on every boot, before the
    // users module runs, and that module would log `User kubevm already exists, skipping`.
    let mut users = Vec::new();
    let boot_keys = |name: &str| {
        guest
            .boot_keys
            .iter()
            .filter(|(user, _)| user == name)
            .flat_map(|(_, keys)| keys.iter().cloned())
            .collect::<Vec<_>>()
    };
    if let Some(user) = &guest.user {
        let mut keys = guest.ssh_keys.clone();
        keys.extend(boot_keys(user));
        users.push(user_entry(user, &keys));
    } else if !guest.ssh_keys.is_empty() {
        doc.insert(s("ssh_authorized_keys"), strings(&guest.ssh_keys));
    }
    // Access-credential users delivered at boot: created if the image lacks them, no sudo.
    // Their password is left as it is (`lock_passwd: false`): an existing user such as root
    // keeps its own, a new one has none and is unlocked by the boot script.
    let mut seen: Vec<&str> = guest.user.iter().map(String::as_str).collect();
    for (user, _) in &guest.boot_keys {
        if seen.contains(&user.as_str()) {
            continue;
        }
        seen.push(user);
        let mut entry = Mapping::new();
        entry.insert(s("name"), s(user));
        entry.insert(s("shell"), s("/bin/bash"));
        entry.insert(s("lock_passwd"), Value::Bool(false));
        entry.insert(s("ssh_authorized_keys"), strings(boot_keys(user)));
        users.push(Value::Mapping(entry));
    }
    if !users.is_empty() {
        if !user_has_users {
            users.insert(0, s("default"));
        }
        doc.insert(s("users"), Value::Sequence(users));
    }
    if !crate::platform::of(plan.flavor).hostname_in_spec {
        // KubeVirt sets the hostname through spec.hostname; Deckhouse has no such field.
        if let Some(hostname) = &plan.hostname {
            doc.insert(s("hostname"), s(hostname));
        }
    }
    if let Some(tz) = &plan.timezone {
        doc.insert(s("timezone"), s(tz));
    }
    if let (true, Some(host)) = (ssh.enabled, &ssh.host) {
        let mut keys = Mapping::new();
        keys.insert(s("ed25519_private"), s(&host.private_key));
        keys.insert(s("ed25519_public"), s(&host.public_key));
        doc.insert(s("ssh_keys"), Value::Mapping(keys));
    }
    let boot = boot_script(plan);
    if !boot.is_empty() {
        doc.insert(s("bootcmd"), strings([boot]));
    }
    let first = first_boot_script(plan);
    if !first.is_empty() {
        doc.insert(s("runcmd"), strings([first]));
    }
    doc
}

fn user_entry(name: &str, keys: &[String]) -> Value {
    let mut user = Mapping::new();
    user.insert(s("name"), s(name));
    user.insert(s("shell"), s("/bin/bash"));
    user.insert(s("sudo"), s(SUDO_ALL));
    user.insert(s("lock_passwd"), Value::Bool(true));
    if !keys.is_empty() {
        user.insert(s("ssh_authorized_keys"), strings(keys));
    }
    Value::Mapping(user)
}

/// Users whose locked password field must become `*`: sshd refuses locked accounts when it
/// runs without PAM, even for key or certificate logins.
fn unlockable_users(plan: &VmPlan) -> Vec<&str> {
    let mut users = Vec::new();
    if plan.platform_ssh.enabled {
        users.push(plan.platform_ssh.user.as_str());
    }
    users.extend(plan.guest.user.as_deref());
    users
}

/// Users whose account must be unlocked: those of [`unlockable_users`] (which also take
/// platform certificates) and the access-credential users delivered at boot (keys only).
fn unlock_users(plan: &VmPlan) -> Vec<&str> {
    let mut users = unlockable_users(plan);
    for (user, _) in &plan.guest.boot_keys {
        if !users.contains(&user.as_str()) {
            users.push(user);
        }
    }
    users
}

/// Shell that turns a password field made only of `!`/`*` (locked, no password) into `*`
/// (no password, not locked). A real password hash, locked or not, is left alone.
fn unlock_snippet(users: &[&str]) -> String {
    format!(
        "for u in {}; do\n  f=$(getent shadow \"$u\" | cut -d: -f2)\n  if [ -n \"$f\" ] && [ -z \"$(printf %s \"$f\" | tr -d '!*')\" ]; then usermod -p '*' \"$u\"; fi\ndone\n",
        users.join(" ")
    )
}

/// `cat > PATH <<'EOF'` with a delimiter that no content line equals.
pub(crate) fn heredoc(out: &mut String, redirect: &str, path: &str, content: &str) {
    let mut delimiter = "KUBEVM_EOF".to_string();
    while content.lines().any(|l| l == delimiter) {
        delimiter.push('_');
    }
    out.push_str(&format!("cat {redirect} {path} <<'{delimiter}'\n{content}"));
    if !content.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&delimiter);
    out.push('\n');
}

/// The base64 lines of a KRL as the boot script's heredoc holds them (76 columns).
pub fn krl_lines(krl: &[u8]) -> Vec<String> {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(krl);
    text.as_bytes()
        .chunks(76)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect()
}

/// The drop-in line that makes sshd refuse what the KRL revokes.
pub fn revoked_keys_line() -> String {
    format!("RevokedKeys {REVOKED_KRL_PATH}")
}

/// Write the CA's KRL (sshd `RevokedKeys`) at every boot: the base64 text, decoded. If it
/// cannot be decoded the file is removed, and sshd then refuses every key and certificate
/// (fail closed: a revoked certificate must not pass because a tool is missing).
pub(crate) fn krl_script(out: &mut String, krl: &[u8]) {
    heredoc(
        out,
        ">",
        REVOKED_KRL_B64_PATH,
        &(krl_lines(krl).join("\n") + "\n"),
    );
    out.push_str(&krl_decode_line());
}

/// The line that decodes [`REVOKED_KRL_B64_PATH`] into [`REVOKED_KRL_PATH`].
pub fn krl_decode_line() -> String {
    format!("base64 -d {REVOKED_KRL_B64_PATH} > {REVOKED_KRL_PATH} || rm -f {REVOKED_KRL_PATH}\n")
}

/// The script `bootcmd` runs on every boot.
fn boot_script(plan: &VmPlan) -> String {
    let mut out = String::new();
    let ssh = &plan.platform_ssh;
    if ssh.enabled {
        out.push_str("umask 022\nmkdir -p /etc/ssh/sshd_config.d\n");
        heredoc(
            &mut out,
            ">",
            CA_KEYS_PATH,
            &(ssh.ca_public_keys.join("\n") + "\n"),
        );
        // A certificate opens this VM only: each login accepts the one principal naming it
        // on this VM (`LOGIN@NAME.NAMESPACE`); logins without a file accept no certificate.
        out.push_str(&format!(
            "rm -rf {PRINCIPALS_DIR}\nmkdir -p {PRINCIPALS_DIR}\n"
        ));
        for login in unlockable_users(plan) {
            let principal = crate::signer::scoped_principal(login, &plan.name, &plan.namespace);
            heredoc(
                &mut out,
                ">",
                &format!("{PRINCIPALS_DIR}/{login}"),
                &format!("{principal}\n"),
            );
        }
        let mut drop_in = format!(
            "# Written by kubectl-vm on every boot; changes are lost.\nTrustedUserCAKeys {CA_KEYS_PATH}\nAuthorizedPrincipalsFile {PRINCIPALS_DIR}/%u\n{}\n",
            revoked_keys_line()
        );
        if let Some(host) = &ssh.host {
            heredoc(&mut out, ">", HOST_CERT_PATH, &host.certificate);
            drop_in.push_str(&format!("HostCertificate {HOST_CERT_PATH}\n"));
        }
        // Just before the drop-in that names it (where `ca revoke` adds it to older guests).
        // What the CA revokes (serials, key IDs, keys), refused by sshd's `RevokedKeys`.
        let krl = if ssh.revoked_krl.is_empty() {
            crate::ca::krl::empty_krl()
        } else {
            ssh.revoked_krl.clone()
        };
        krl_script(&mut out, &krl);
        heredoc(&mut out, ">", SSHD_DROP_IN_PATH, &drop_in);
        // Older images have no Include line; sshd uses the first value, so it goes first.
        out.push_str("if [ -f /etc/ssh/sshd_config ] && ! grep -qi '^Include /etc/ssh/sshd_config.d/' /etc/ssh/sshd_config; then\n  sed -i '1i Include /etc/ssh/sshd_config.d/*.conf' /etc/ssh/sshd_config\nfi\n");
        let user = &ssh.user;
        out.push_str(&format!(
            "id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/bash -c 'kubectl-vm platform user' {user}\n"
        ));
        out.push_str(&format!(
            "echo '{user} {SUDO_ALL}' > {SUDOERS_PATH} && chmod 0440 {SUDOERS_PATH}\n"
        ));
    }
    let users = unlock_users(plan);
    if !users.is_empty() {
        out.push_str(&unlock_snippet(&users));
    }
    if !plan.guest.env.is_empty() {
        env_files(&mut out, &plan.guest.env);
    }
    if ssh.enabled {
        // sshd may already run (a reboot after the first); --no-block avoids waiting on it.
        out.push_str("systemctl --no-block try-reload-or-restart ssh.service sshd.service >/dev/null 2>&1 || true\n");
    }
    if plan.guest.guest_agent {
        out.push_str(
            "systemctl --no-block start qemu-guest-agent.service >/dev/null 2>&1 || true\n",
        );
    }
    out
}

/// The script `runcmd` runs once, after cloud-init created users (which locks them) and
/// installed packages.
fn first_boot_script(plan: &VmPlan) -> String {
    let mut out = String::new();
    let users = unlock_users(plan);
    if !users.is_empty() {
        out.push_str(&unlock_snippet(&users));
    }
    if plan.guest.guest_agent {
        out.push_str(GUEST_AGENT_SCRIPT);
    }
    out
}

/// Installs qemu-guest-agent only when the image lacks it, with whichever package manager the
/// image has, and never fails: cloud-init's `packages:` would run `apt-get update` on every
/// first boot and end in `status: error` without a reachable mirror.
const GUEST_AGENT_SCRIPT: &str = r#"command -v qemu-ga >/dev/null 2>&1 || { { command -v apt-get >/dev/null && apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qqy install qemu-guest-agent || dnf -qy install qemu-guest-agent || yum -qy install qemu-guest-agent || zypper -nq in qemu-guest-agent; } >/var/log/kubevm-guest-agent.log 2>&1 || echo "kubectl-vm: qemu-guest-agent is missing and could not be installed: /var/log/kubevm-guest-agent.log"; }
command -v qemu-ga >/dev/null 2>&1 && systemctl enable --now qemu-guest-agent.service >/dev/null 2>&1
true
"#;

/// Whether `value` needs no quoting in any of the three env file formats.
fn is_plain(value: &str) -> bool {
    !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:,@%+=".contains(c))
}

/// `KEY=VALUE` for systemd's `EnvironmentFile=`: double quotes with `\`, `"`, `` ` `` and
/// `$` escaped (systemd's escapes inside double quotes).
fn systemd_line(var: &EnvVar) -> String {
    if is_plain(&var.value) {
        return format!("{}={}", var.name, var.value);
    }
    let mut quoted = String::new();
    for c in var.value.chars() {
        if matches!(c, '\\' | '"' | '`' | '$') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    format!("{}=\"{quoted}\"", var.name)
}

/// `KEY=VALUE` for pam_env's `/etc/environment`, which only strips surrounding quotes.
fn pam_line(var: &EnvVar) -> String {
    if is_plain(&var.value) {
        format!("{}={}", var.name, var.value)
    } else {
        format!("{}=\"{}\"", var.name, var.value)
    }
}

/// `export KEY='VALUE'` with POSIX single-quote escaping.
fn export_line(var: &EnvVar) -> String {
    format!("export {}='{}'", var.name, var.value.replace('\'', r"'\''"))
}

fn env_files(out: &mut String, env: &[EnvVar]) {
    let lines = |f: fn(&EnvVar) -> String| env.iter().map(f).collect::<Vec<_>>().join("\n") + "\n";
    out.push_str("mkdir -p /etc/kubevm\n");
    heredoc(out, ">", ENV_FILE_PATH, &lines(systemd_line));
    heredoc(out, ">", PROFILE_PATH, &lines(export_line));
    // /etc/environment may hold other settings: replace only kubectl-vm's block.
    out.push_str(
        "touch /etc/environment\nsed -i '/^# BEGIN kubevm$/,/^# END kubevm$/d' /etc/environment\n",
    );
    heredoc(
        out,
        ">>",
        "/etc/environment",
        &format!("# BEGIN kubevm\n{}# END kubevm\n", lines(pam_line)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn env_quoting() {
        assert_eq!(systemd_line(&var("A", "x/y:1")), "A=x/y:1");
        assert_eq!(systemd_line(&var("A", "a \"b\" $c")), r#"A="a \"b\" \$c""#);
        assert_eq!(systemd_line(&var("A", "")), "A=\"\"");
        assert_eq!(pam_line(&var("A", "two words")), "A=\"two words\"");
        assert_eq!(export_line(&var("A", "it's")), r"export A='it'\''s'");
    }

    #[test]
    fn env_quoting_survives_a_real_shell() {
        let v = var("V", "a 'b' \"c\" $HOME `x` \\ end");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{}\nprintf %s \"$V\"", export_line(&v)))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), v.value);
    }

    #[test]
    fn heredoc_avoids_content_delimiter() {
        let mut out = String::new();
        heredoc(&mut out, ">", "/f", "KUBEVM_EOF\nx");
        assert!(out.starts_with("cat > /f <<'KUBEVM_EOF_'\n"), "{out}");
        assert!(out.ends_with("x\nKUBEVM_EOF_\n"), "{out}");
    }
}
