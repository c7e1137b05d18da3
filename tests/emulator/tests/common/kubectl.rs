//! Real kubectl (v1.36) against an emulator, for the tests that check the emulator with the
//! client that matters most.

use kubevm_emulator::{BlockingEmulator, Emulator, EmulatorOptions};
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// `KUBECTL`, else `<repo>/.tools/bin/kubectl` (tests/tools/get-kubectl.sh installs it there).
pub fn kubectl_path() -> PathBuf {
    if let Some(k) = std::env::var_os("KUBECTL") {
        return PathBuf::from(k);
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools/bin/kubectl");
    assert!(
        local.is_file(),
        "kubectl not found: run tests/tools/get-kubectl.sh or set KUBECTL"
    );
    local
}

/// An emulator with default options, its kubeconfig and kubectl's cache in a temporary
/// directory.
pub struct KubectlEnv {
    pub emu: BlockingEmulator,
    pub dir: tempfile::TempDir,
}

impl KubectlEnv {
    pub fn new() -> KubectlEnv {
        let emu = Emulator::start_blocking(EmulatorOptions::default()).expect("emulator");
        let dir = tempfile::tempdir().unwrap();
        emu.write_kubeconfig(&dir.path().join("kubeconfig"))
            .unwrap();
        KubectlEnv { emu, dir }
    }

    /// Runs kubectl with `stdin`; (success, stdout, stderr).
    pub fn run(&self, args: &[&str], stdin: &str) -> (bool, String, String) {
        let mut child = Command::new(kubectl_path())
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl runs");
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.as_bytes()).unwrap();
        drop(input);
        let o = child.wait_with_output().unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into(),
            String::from_utf8_lossy(&o.stderr).into(),
        )
    }

    /// Runs kubectl, asserts it succeeded; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args, "");
        assert!(ok, "kubectl {args:?} failed:\n{out}\n{err}");
        out
    }

    /// Runs kubectl, asserts it succeeded; its stdout as JSON.
    pub fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }
}
