//! `kubectl vm ssh-config`: an OpenSSH configuration so plain `ssh`, `scp`, rsync, ansible and
//! VS Code reach `NAME.NAMESPACE.vm` through `kubectl vm port-forward --stdio`, trust the
//! platform CA for host keys (`@cert-authority`), and get a fresh short-lived certificate on
//! every connection from `Match exec "kubectl vm ssh-cert …"`.

use std::path::{Path, PathBuf};

use super::SshError;
use super::files;

/// Files of the OpenSSH integration, under `~/.kube/kubectl-vm/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigPaths {
    /// The generated ssh_config (included from `~/.ssh/config`).
    pub config: PathBuf,
    /// The private key `ssh-cert` creates once (0600); only its certificates change, so a
    /// connection always reads a key and a certificate that belong together.
    pub key: PathBuf,
    /// Directory of the certificates, one per login and host (`LOGIN@HOST-cert.pub`).
    pub certificates: PathBuf,
    /// The known_hosts file `kubectl vm ssh` records keys in (`NAME.NAMESPACE.vm`); the
    /// config reads it only for VMs whose host the platform does not vouch for.
    pub known_hosts: PathBuf,
}

/// Why a word holding `${` cannot go into the config: OpenSSH expands `${NAME}` from the
/// environment in `IdentityFile`, `CertificateFile`, `UserKnownHostsFile` and
/// `KnownHostsCommand` (ssh_config(5), ENVIRONMENT VARIABLES) and has no escape for it.
fn dollar_brace(word: &str) -> String {
    format!(
        "{word:?} holds \"${{\", which OpenSSH expands as an environment variable in its config; use a path without it"
    )
}

impl ConfigPaths {
    /// Refuse paths the config cannot name: one holding `${` (see [`Invocation::check`]).
    pub fn check(&self) -> Result<(), String> {
        for path in [
            &self.key,
            &self.certificates,
            &self.known_hosts,
            &self.config,
        ] {
            let text = path.display().to_string();
            if text.contains("${") {
                return Err(dollar_brace(&text));
            }
        }
        Ok(())
    }

    /// The paths under `home`.
    pub fn under(home: &Path) -> ConfigPaths {
        let base = home.join(".kube/kubectl-vm");
        ConfigPaths {
            config: base.join("ssh_config"),
            key: base.join("ssh/id_ed25519"),
            certificates: base.join("ssh/certs"),
            known_hosts: base.join(super::hostkey::KNOWN_HOSTS_FILE),
        }
    }

    /// The certificate file of `login` on `host` (`NAME.NAMESPACE.vm`), as the config's
    /// `CertificateFile …/%r@%n-cert.pub` names it. Both are checked names (no `/`).
    pub fn certificate(&self, login: &str, host: &str) -> PathBuf {
        self.certificates.join(format!("{login}@{host}-cert.pub"))
    }
}

/// The VM an ssh-config host name (`NAME.NAMESPACE.vm`) stands for, checked: anything else
/// (another form, shell or path characters) is refused before it is used.
pub fn vm_of_host(host: &str) -> Result<crate::target::Target, crate::Error> {
    let bad = || {
        crate::Error::InvalidTarget(format!("invalid host {host:?}: expected NAME.NAMESPACE.vm"))
    };
    let (name, namespace) = crate::signer::vm_of_host_name(host).ok_or_else(bad)?;
    if host.contains(['/', '@']) {
        return Err(bad());
    }
    crate::target::Target::parse(&format!("{name}.{namespace}"), false)
}

/// How the generated commands reach the cluster: the program and the flags the user gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The kubectl-vm binary.
    pub program: String,
    /// `--kubeconfig`, `--context` and the like, already split.
    pub global_args: Vec<String>,
}

/// Quote a literal word for the shell that runs `ProxyCommand`, `KnownHostsCommand` and
/// `Match exec` (POSIX single quotes), and for ssh_config itself: `%` is OpenSSH's token
/// character in those lines and in file names, so it is doubled.
fn q(s: &str) -> String {
    shell_word(s).replace('%', "%%")
}

/// POSIX single-quoting, when needed.
pub(crate) fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@+,".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// An OpenSSH token (`%n`, `%r`) as a shell word: single-quoted, which is safe because the
/// blocks that use it match only names without a single quote (see [`NO_QUOTE`]).
fn token(t: &str) -> String {
    format!("'{t}'")
}

/// Pattern-list entry that refuses host and user names with a single quote, so a token
/// quoted by [`token`] cannot end its quotes (OpenSSH before 9.6 passes any name through).
const NO_QUOTE: &str = "!*'*";

impl Invocation {
    /// Refuse words the config cannot carry to every OpenSSH: `Match exec "…"` is read up to
    /// the next `"` with no escapes (OpenSSH 9.2 `strdelim`), so a `"`, a `\\` or a `'` (whose
    /// shell quoting needs a backslash) in the program or a flag would change the command;
    /// `${` would be expanded from the environment in `KnownHostsCommand`.
    pub fn check(&self) -> Result<(), String> {
        for word in std::iter::once(&self.program).chain(&self.global_args) {
            if word.contains(['"', '\\', '\'']) || word.chars().any(char::is_control) {
                return Err(format!(
                    "{word:?} has a quote, a backslash or a control character, which an OpenSSH config cannot carry safely; use a path without them"
                ));
            }
            if word.contains("${") {
                return Err(dollar_brace(word));
            }
        }
        Ok(())
    }

    fn command(&self, args: &[String]) -> String {
        let mut words = vec![q(&self.program)];
        words.extend(self.global_args.iter().map(|a| q(a)));
        words.extend(args.iter().cloned());
        words.join(" ")
    }
}

/// One VM whose host the platform does not vouch for (enrolled or foreign): it gets its own
/// block that lets the key `kubectl vm ssh` recorded for it on first use count. Every other
/// `*.vm` host is proven by a host certificate of the platform CA alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmEntry {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
}

/// The ssh_config text. It works as printed (`ssh -F <(kubectl vm ssh-config) …`): host
/// trust comes from `KnownHostsCommand` (the CA keys as published now, so a rotation is
/// followed) and certificates from `Match exec` before each connection. The host name
/// `NAME.NAMESPACE.vm` is the host certificate's one principal, so no `HostKeyAlias` is needed
/// and VMs created later are reached through the `*.vm` block. Known-hosts files count only
/// for `tofu_vms` (enrolled or foreign VMs, trusted on first use by `kubectl vm ssh`); for
/// every other host a plain key is refused (`Host key verification failed`).
pub fn render(inv: &Invocation, paths: &ConfigPaths, user: &str, tofu_vms: &[VmEntry]) -> String {
    let p = |path: &Path| q(&path.display().to_string());
    let mut out = String::from(
        "# Generated by `kubectl vm ssh-config`; regenerate rather than edit.\n\
         # `ssh [USER@]NAME.NAMESPACE.vm` goes through the platform's port-forward.\n",
    );
    for vm in tofu_vms {
        // OpenSSH uses the first value it reads: these come before the `/dev/null` below.
        out.push_str(&format!(
            "Host {}\n  UserKnownHostsFile {}\n",
            crate::signer::host_name(&vm.name, &vm.namespace),
            p(&paths.known_hosts),
        ));
    }
    // The login first, so `%r` below is it unless the user typed USER@.
    out.push_str(&format!("Host *.vm\n  User {}\n", q(user)));
    let hosts = format!("\"*.vm,{NO_QUOTE}\"");
    // A fresh certificate for this host and login before every connection; the match is
    // only a hook (ssh-cert exits 0 when it wrote one).
    let cert = inv.command(&[
        "ssh-cert".into(),
        "--login".into(),
        token("%r"),
        token("%n"),
    ]);
    out.push_str(&format!(
        "Match host {hosts} user \"*,{NO_QUOTE}\" exec \"{cert}\"\n"
    ));
    out.push_str(&format!(
        "Match host {hosts}\n  ProxyCommand {}\n  IdentityFile {}\n  CertificateFile {}/%r@%n-cert.pub\n  IdentitiesOnly yes\n  KnownHostsCommand {}\n  UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n",
        inv.command(&[
            "port-forward".into(),
            "--stdio".into(),
            "--ssh-host".into(),
            token("%n"),
            "%p".into()
        ]),
        p(&paths.key),
        p(&paths.certificates),
        // The key the host offers (`%t %K`): a host certificate revoked by serial or key ID
        // gets an `@revoked` line for its key (known_hosts has no syntax for serials).
        inv.command(&["ssh-known-hosts".into(), "%t".into(), "%K".into()]),
    ));
    out
}

/// `@cert-authority` lines trusting `ca_keys` (OpenSSH lines) for every VM host alias, and
/// `@revoked` lines for the `revoked` host keys (OpenSSH then refuses them, certified or not).
pub fn known_hosts(ca_keys: &[String], revoked: &[String]) -> String {
    let mut out: String = ca_keys
        .iter()
        .map(|k| format!("@cert-authority * {}\n", k.trim()))
        .collect();
    for key in revoked {
        out.push_str(&format!("@revoked * {}\n", key.trim()));
    }
    out
}

/// The plain key of the host certificate OpenSSH offers to `KnownHostsCommand` (`%t %K`:
/// its type and base64 blob), as an OpenSSH line, when `revocations` revokes that certificate
/// by serial or key ID; `None` for anything else (`NONE`, a plain key, a certificate not
/// revoked, text that does not parse).
pub fn revoked_offered_certificate(
    revocations: &crate::ca::krl::Revocations,
    key_type: &str,
    key: &str,
) -> Option<String> {
    let cert = ssh_key::Certificate::from_openssh(&format!("{key_type} {key}")).ok()?;
    revocations.certificate_revoked(&cert)?;
    ssh_key::PublicKey::from(cert.public_key().clone())
        .to_openssh()
        .ok()
}

/// The `Include` line added to `~/.ssh/config`.
pub fn include_line(paths: &ConfigPaths) -> String {
    format!(
        "Include {}",
        shell_word(&paths.config.display().to_string())
    )
}

/// Write the config (0600) and, with `install`, add the `Include` at the top of
/// `ssh_config` (`~/.ssh/config`) once. Returns whether `ssh_config` was changed.
pub fn install(
    paths: &ConfigPaths,
    config: &str,
    ssh_config: Option<&Path>,
) -> Result<bool, SshError> {
    files::write_private(&paths.config, config.as_bytes())?;
    let Some(user_config) = ssh_config else {
        return Ok(false);
    };
    let line = include_line(paths);
    let current = match std::fs::read_to_string(user_config) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e.into()),
    };
    if current.lines().any(|l| l.trim() == line) {
        return Ok(false);
    }
    // Include must come before any Host/Match block to apply to every host.
    files::write_private(user_config, format!("{line}\n{current}").as_bytes())?;
    Ok(true)
}

/// The key `ssh-cert` certifies: created once, 0600, and never replaced, so parallel
/// connections (ansible) always read a key that matches any of its certificates.
pub fn stable_key(path: &Path) -> Result<russh::keys::PrivateKey, SshError> {
    if let Ok(key) = russh::keys::load_secret_key(path, None) {
        return Ok(key);
    }
    let key = super::cert::fresh_key()?;
    let text = key
        .to_openssh(russh::keys::ssh_key::LineEnding::LF)?
        .to_string();
    files::create_private_once(path, text.as_bytes())?;
    // Another process may have won the race: use whichever key is on disk.
    russh::keys::load_secret_key(path, None)
        .map_err(|e| SshError::Io(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(program: &str, kubeconfig: &str) -> Invocation {
        Invocation {
            program: program.into(),
            global_args: vec![
                "--kubeconfig".into(),
                kubeconfig.into(),
                "--context".into(),
                "prod".into(),
            ],
        }
    }

    #[test]
    fn config_carries_the_cluster_flags_and_quotes_every_token() {
        let paths = ConfigPaths::under(Path::new("/home/a"));
        let text = render(
            &inv("/usr/bin/kubectl-vm", "/x y/k"),
            &paths,
            "kubevm",
            &[VmEntry {
                name: "web".into(),
                namespace: "prod".into(),
            }],
        );
        assert!(
            text.starts_with(
                "# Generated by `kubectl vm ssh-config`; regenerate rather than edit.\n# `ssh [USER@]NAME.NAMESPACE.vm` goes through the platform's port-forward.\nHost web.prod.vm\n  UserKnownHostsFile /home/a/.kube/kubectl-vm/vm_known_hosts\nHost *.vm\n"
            ),
            "{text}"
        );
        assert!(!text.contains("HostKeyAlias"), "{text}");
        assert!(text.contains("  UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n"), "{text}");
        assert!(text.contains("ProxyCommand /usr/bin/kubectl-vm --kubeconfig '/x y/k' --context prod port-forward --stdio --ssh-host '%n' %p"), "{text}");
        assert!(text.contains(r#"Match host "*.vm,!*'*" user "*,!*'*" exec "/usr/bin/kubectl-vm --kubeconfig '/x y/k' --context prod ssh-cert --login '%r' '%n'""#), "{text}");
        assert!(text.contains("CertificateFile /home/a/.kube/kubectl-vm/ssh/certs/%r@%n-cert.pub"));
        assert!(text.contains("KnownHostsCommand /usr/bin/kubectl-vm --kubeconfig '/x y/k' --context prod ssh-known-hosts %t %K\n"));
        assert!(
            !text.contains("$("),
            "no shell expansion of a token: {text}"
        );
    }

    /// Found by `properties::openssh_passes_every_word_through` (issue 37): under a home
    /// directory named `${,rd` OpenSSH failed on `IdentityFile` ("environment variable ',rd/key'
    /// missing closing '}'") and no connection worked; such paths and words are refused.
    #[test]
    fn dollar_brace_is_refused() {
        let paths = ConfigPaths::under(Path::new("/tmp/${,rd"));
        let err = paths.check().unwrap_err();
        assert!(err.contains("environment variable"), "{err}");
        assert!(ConfigPaths::under(Path::new("/home/$a{b}")).check().is_ok());
        assert!(inv("/opt/${X}/kubectl-vm", "/k").check().is_err());
        assert!(inv("/opt/kubectl-vm", "/k/${HOME}").check().is_err());
    }

    #[test]
    fn percent_stays_literal_and_unquotable_words_are_refused() {
        let paths = ConfigPaths::under(Path::new("/home/a%h"));
        let text = render(&inv("/opt/kubectl-vm", "/k%r/c"), &paths, "kubevm", &[]);
        // `%` is doubled for OpenSSH's token expansion.
        assert!(
            text.contains("ProxyCommand /opt/kubectl-vm --kubeconfig '/k%%r/c'"),
            "{text}"
        );
        assert!(
            text.contains("IdentityFile '/home/a%%h/.kube/kubectl-vm/ssh/id_ed25519'"),
            "{text}"
        );
        assert!(inv("/opt/kubectl-vm", "/k%r/c").check().is_ok());
        for bad in [
            "/opt/it's/kubectl-vm",
            "/opt/\"x\"/kubectl-vm",
            "/opt/a\\b",
            "/opt/a\nb",
        ] {
            assert!(inv(bad, "/k").check().is_err(), "{bad:?}");
            assert!(inv("/opt/kubectl-vm", bad).check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hosts_must_be_name_namespace_vm() {
        let target = vm_of_host("db.primary.prod.vm").unwrap();
        assert_eq!(
            (target.name.as_str(), target.namespace.as_deref()),
            ("db.primary", Some("prod"))
        );
        let target = vm_of_host("db.primary.prod.vm.vm").unwrap();
        assert_eq!(
            (target.name.as_str(), target.namespace.as_deref()),
            ("db.primary.prod", Some("vm"))
        );
        for bad in [
            "web.vm",
            "web.prod",
            ".prod.vm",
            "x$(touch y).prod.vm",
            "../x.prod.vm",
            "a/b.c.vm",
            "u@w.p.vm",
            "W.p.vm",
        ] {
            assert!(vm_of_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn install_is_idempotent_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let paths = ConfigPaths::under(dir.path());
        let user = dir.path().join(".ssh/config");
        std::fs::create_dir_all(user.parent().unwrap()).unwrap();
        std::fs::write(&user, "Host other\n  User x\n").unwrap();
        assert!(install(&paths, "c", Some(&user)).unwrap());
        assert!(!install(&paths, "c", Some(&user)).unwrap());
        let text = std::fs::read_to_string(&user).unwrap();
        assert!(
            text.starts_with(&format!("Include {}\nHost other", paths.config.display())),
            "{text}"
        );
        assert_eq!(text.matches("Include").count(), 1);
        for f in [&paths.config, &user] {
            assert_eq!(
                std::fs::metadata(f).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
    }

    #[test]
    fn the_stable_key_is_made_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ssh/id_ed25519");
        let first = stable_key(&path).unwrap();
        let second = stable_key(&path).unwrap();
        assert_eq!(first.public_key(), second.public_key());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}

/// Properties of the quoting (issue 37), checked through the real programs that read it:
/// `/bin/sh` and OpenSSH's `ssh`. `PROPTEST_CASES=2000 cargo test -p kubevm --lib
/// ssh::config::properties` for a long run.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use std::process::Command;

    fn cases(default: u32) -> ProptestConfig {
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default);
        ProptestConfig::with_cases(cases)
    }

    /// Words a user's paths and flags may hold: every printable character but the three
    /// `Invocation::check` refuses, weighted toward what shells and ssh_config treat specially.
    fn hostile_word() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                3 => prop::sample::select(vec![' ', '$', '`', ';', '|', '&', '*', '?', '%', '#', '!', '(', ')', '{', '}', '<', '>', '~', '=', ',', '[', ']', '^', '\t']),
                2 => prop::char::range('a', 'z'),
                1 => prop::char::range('\u{a0}', '\u{2ff}'),
            ],
            1..12,
        )
        .prop_map(|c| c.into_iter().collect::<String>().replace('\t', " "))
    }

    proptest! {
        #![proptest_config(cases(128))]

        /// A word quoted by `shell_word` reaches a POSIX shell's command as exactly itself.
        #[test]
        fn shell_words_survive_the_shell(word in "\\PC{0,16}|[ -~]{0,16}") {
            let out = Command::new("/bin/sh")
                .arg("-c")
                .arg(format!("printf '%s' {}", shell_word(&word)))
                .output()
                .unwrap();
            prop_assert!(out.status.success());
            prop_assert_eq!(String::from_utf8_lossy(&out.stdout), word);
        }
    }

    proptest! {
        #![proptest_config(cases(24))]

        /// The generated config brings the program's path and the user's flags, whatever they
        /// hold, through OpenSSH's parsing, token expansion and shell to the program as the
        /// very same words, in both `Match exec` and `ProxyCommand`.
        #[test]
        fn openssh_passes_every_word_through(dir in hostile_word(), flags in prop::collection::vec(hostile_word(), 1..4)) {
            prop_assume!(dir != "." && dir != "..");
            let tmp = tempfile::tempdir().unwrap();
            let home = tmp.path().join(&dir);
            std::fs::create_dir_all(&home).unwrap();
            let log = tmp.path().join("argv.log");
            let program = home.join("kubectl-vm");
            // The fake tool logs its arguments (one record per run, fields split by RS) and
            // succeeds, so `Match exec` matches and `ProxyCommand` ends the connection at once.
            std::fs::write(
                &program,
                format!(
                    "#!/bin/sh\n{{ for a in \"$@\"; do printf '%s\\036' \"$a\"; done; printf '\\n'; }} >> {}\n",
                    shell_word(&log.display().to_string())
                ),
            )
            .unwrap();
            std::fs::set_permissions(&program, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
            let mut global_args = vec!["--kubeconfig".to_string()];
            global_args.extend(flags.iter().cloned());
            let inv = Invocation { program: program.display().to_string(), global_args: global_args.clone() };
            let paths = ConfigPaths::under(&home);
            prop_assume!(inv.check().is_ok() && paths.check().is_ok());
            let config = tmp.path().join("ssh_config");
            std::fs::write(&config, render(&inv, &paths, "kubevm", &[])).unwrap();
            let out = Command::new("ssh")
                .args(["-F"])
                .arg(&config)
                .args(["-o", "BatchMode=yes", "web.prod.vm", "true"])
                .env("SHELL", "/bin/sh")
                .output()
                .unwrap();
            let logged = std::fs::read_to_string(&log).unwrap_or_default();
            let runs: Vec<Vec<&str>> = logged
                .lines()
                .map(|l| l.strip_suffix('\u{1e}').unwrap_or(l).split('\u{1e}').collect())
                .collect();
            let expect = |tail: &[&str]| -> Vec<String> {
                global_args.iter().cloned().chain(tail.iter().map(|s| s.to_string())).collect()
            };
            let runs: Vec<Vec<String>> = runs.into_iter().map(|r| r.into_iter().map(str::to_owned).collect()).collect();
            prop_assert_eq!(
                runs,
                vec![
                    expect(&["ssh-cert", "--login", "kubevm", "web.prod.vm"]),
                    expect(&["port-forward", "--stdio", "--ssh-host", "web.prod.vm", "22"]),
                ],
                "ssh said: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
