//! Test environment: an emulator seeded from a fixture, a private HOME with its kubeconfig,
//! and a bin directory where kubectl finds `kubectl-vm` and `kubectl_complete-vm`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use kubevm_emulator::{BlockingEmulator, Emulator, EmulatorOptions, FailureRule, ServeFlavor};
use tempfile::TempDir;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_kubectl-vm");

/// A running emulator plus a scratch directory.
pub struct Env {
    pub emulator: BlockingEmulator,
    pub dir: TempDir,
    pub kubeconfig: PathBuf,
    pub bin_dir: PathBuf,
}

pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

impl Env {
    /// Emulator serving KubeVirt, seeded with tests/fixtures/kubevirt.yaml.
    pub fn kubevirt() -> Env {
        Env::start(ServeFlavor::KubeVirt, "kubevirt.yaml")
    }

    /// Emulator serving Deckhouse virtualization, seeded with tests/fixtures/deckhouse.yaml.
    pub fn deckhouse() -> Env {
        Env::start(ServeFlavor::Deckhouse, "deckhouse.yaml")
    }

    fn start(flavor: ServeFlavor, fixture_name: &str) -> Env {
        Env::with_step(flavor, fixture_name, EmulatorOptions::default().import_step)
    }

    /// Like [`Env::kubevirt`]/[`Env::deckhouse`] with another controller step (slower
    /// controllers leave time to look at intermediate states).
    pub fn with_step(flavor: ServeFlavor, fixture_name: &str, step: std::time::Duration) -> Env {
        Env::with_options(EmulatorOptions {
            fixture_yaml: vec![fixture(fixture_name)],
            flavor,
            import_step: step,
            ..Default::default()
        })
    }

    /// An emulator started with these options.
    pub fn with_options(options: EmulatorOptions) -> Env {
        let emulator = Emulator::start_blocking(options).expect("emulator starts");
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        emulator.write_kubeconfig(&kubeconfig).unwrap();
        let bin_dir = dir.path().join("bin");
        std::fs::create_dir(&bin_dir).unwrap();
        for name in ["kubectl-vm", "kubectl_complete-vm"] {
            std::os::unix::fs::symlink(BIN, bin_dir.join(name)).unwrap();
        }
        Env {
            emulator,
            dir,
            kubeconfig,
            bin_dir,
        }
    }

    /// Emulator serving KubeVirt (tests/fixtures/kubevirt.yaml) without these API groups:
    /// `subresources.kubevirt.io` is a cluster with KubeVirt's CRDs but no virt-api.
    pub fn kubevirt_without(groups: &[&str]) -> Env {
        Env::with_options(EmulatorOptions {
            fixture_yaml: vec![fixture("kubevirt.yaml")],
            flavor: ServeFlavor::KubeVirt,
            unserved_groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        })
    }

    /// Emulator serving Deckhouse (tests/fixtures/deckhouse.yaml) without these API groups.
    pub fn deckhouse_without(groups: &[&str]) -> Env {
        Env::with_options(EmulatorOptions {
            fixture_yaml: vec![fixture("deckhouse.yaml")],
            flavor: ServeFlavor::Deckhouse,
            unserved_groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        })
    }

    /// A command with this environment's HOME, KUBECONFIG and PATH.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        let path = std::env::var("PATH").unwrap_or_default();
        command
            .env("HOME", self.dir.path())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("PATH", format!("{}:{path}", self.bin_dir.display()))
            .env_remove("COMPLETE");
        command
    }

    /// Run `kubectl-vm ARGS`.
    pub fn vm(&self, args: &[&str]) -> Output {
        self.command(BIN).args(args).output().unwrap()
    }

    /// Start `kubectl-vm ARGS` in the background, stdout and stderr piped.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(BIN)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Run real kubectl (`KUBECTL`, else `.tools/bin/kubectl`, else PATH).
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.command(kubectl()).args(args).output().unwrap()
    }
}

/// The kubectl binary the tests drive. Fails (never skips) when none is installed.
pub fn kubectl() -> PathBuf {
    if let Some(path) = std::env::var_os("KUBECTL") {
        return path.into();
    }
    let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/kubectl");
    if local.exists() {
        return local;
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("kubectl"))
            .find(|p| p.exists())
    });
    found.expect("kubectl v1.36 not found: run tests/tools/get-kubectl.sh (or set KUBECTL)")
}

/// stdout as text.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Assert success and return stdout.
#[track_caller]
pub fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "command failed ({:?})\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

/// Split a table into rows of whitespace-separated cells.
pub fn table(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// Run `kubectl-vm ARGS`, expect exit `code` with nothing on stdout, and return the single
/// stderr line.
#[track_caller]
pub fn fails(env: &Env, args: &[&str], code: i32) -> String {
    let output = env.vm(args);
    let err = stderr(&output);
    assert_eq!(
        output.status.code(),
        Some(code),
        "args {args:?}\nstderr: {err}\nstdout: {}",
        stdout(&output)
    );
    assert_eq!(
        err.lines().count(),
        1,
        "one line expected for {args:?}, got:\n{err}"
    );
    assert!(stdout(&output).is_empty(), "nothing on stdout for {args:?}");
    err.trim_end().to_owned()
}

/// The stored object `name` of `group`/`plural` (in namespace `ns`, or any), if there is one.
pub fn find_object(
    env: &Env,
    group: &str,
    plural: &str,
    ns: Option<&str>,
    name: &str,
) -> Option<serde_json::Value> {
    env.emulator
        .objects(group, plural, ns)
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
}

/// Fails every `verb` of `plural` with the 500 the API server answers when etcd times out.
pub fn etcd_timeout(verb: &str, plural: &str) -> FailureRule {
    FailureRule {
        verb: verb.into(),
        plural: plural.into(),
        // A POST names no object in its path: match any name.
        name: None,
        code: 500,
        message: "etcdserver: request timed out".into(),
        times: None,
    }
}

/// Exit code of a program run in a pseudo-terminal, once it ended.
#[track_caller]
pub fn exit_code(session: &rexpect::session::PtySession) -> i32 {
    match session.process().wait().unwrap() {
        rexpect::process::WaitStatus::Exited(_, code) => code,
        other => panic!("not exited: {other:?}"),
    }
}

/// `kubectl-vm ARGS` on a pseudo-terminal (TERM=xterm), answering within 30 s per step.
pub fn on_tty(env: &Env, args: &[&str]) -> rexpect::session::PtySession {
    let mut command = env.command(BIN);
    command.args(args).env("TERM", "xterm");
    rexpect::session::spawn_command(command, Some(30_000)).unwrap()
}

/// `(method, path, body)` of the requests to the emulator that change something (not GETs).
pub(crate) fn changes(env: &Env) -> Vec<(String, String, Option<serde_json::Value>)> {
    env.emulator
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .map(|r| (r.method.clone(), r.path.clone(), r.json()))
        .collect()
}

/// Real OpenSSH reaching VM `target` (`NAME.NAMESPACE`) through `kubectl-vm port-forward
/// --stdio`, logging in with private key `key` and certificate `cert` only: no config file,
/// no agent, no prompt, and no host-key check (the tests that use it are about the user
/// side). `kubectl_vm_flags` go before `port-forward` (e.g. `--kubeconfig FILE`). The caller
/// adds `USER@HOST` and the remote command.
pub fn openssh_via_vm(
    env: &Env,
    kubectl_vm_flags: &str,
    target: &str,
    key: &Path,
    cert: &Path,
) -> Command {
    let mut command = env.command("ssh");
    command
        .args([
            "-F",
            "/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
        ])
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
        ])
        .arg("-o")
        .arg(format!(
            "ProxyCommand={BIN} {kubectl_vm_flags} port-forward --stdio {target} 22"
        ))
        .arg("-i")
        .arg(key)
        .arg("-o")
        .arg(format!("CertificateFile={}", cert.display()));
    command
}
