//! The emulator against real kubectl (v1.36): the test of faithfulness.
//!
//! kubectl is found via `$KUBECTL`, else `<repo>/.tools/bin/kubectl`, else `PATH`. If none is
//! found the tests fail: run `tests/tools/get-kubectl.sh`.

use kubevm_emulator::{BlockingEmulator, Emulator, EmulatorOptions, ServeFlavor};
use serde_json::json;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kubectl_path() -> PathBuf {
    if let Some(k) = std::env::var_os("KUBECTL") {
        return PathBuf::from(k);
    }
    let local = repo_root().join(".tools/bin/kubectl");
    if local.is_file() {
        return local;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let k = dir.join("kubectl");
            if k.is_file() {
                return k;
            }
        }
    }
    panic!(
        "kubectl not found: run tests/tools/get-kubectl.sh (installs kubectl v1.36 into <repo>/.tools/bin) or set KUBECTL"
    );
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("tests/fixtures").join(name)).expect("fixture")
}

/// An emulator plus a temporary kubeconfig and kubectl cache dir.
struct Env {
    emu: BlockingEmulator,
    dir: tempfile::TempDir,
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Env {
    fn new(flavor: ServeFlavor) -> Env {
        let fixtures = match flavor {
            ServeFlavor::KubeVirt => vec![fixture("kubevirt.yaml")],
            ServeFlavor::Deckhouse => vec![fixture("deckhouse.yaml")],
            ServeFlavor::Both => vec![fixture("kubevirt.yaml"), fixture("deckhouse.yaml")],
        };
        let opts = EmulatorOptions {
            fixture_yaml: fixtures,
            flavor,
            import_step: Duration::from_millis(50),
            ..Default::default()
        };
        let emu = Emulator::start_blocking(opts).expect("emulator starts");
        let dir = tempfile::tempdir().expect("tempdir");
        emu.write_kubeconfig(&dir.path().join("kubeconfig"))
            .expect("kubeconfig");
        Env { emu, dir }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(kubectl_path());
        c.arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"));
        c.arg("--cache-dir").arg(self.dir.path().join("cache"));
        c.args(args);
        c.env_remove("KUBECONFIG");
        c
    }

    fn run(&self, args: &[&str]) -> Out {
        self.run_stdin(args, None)
    }

    fn run_stdin(&self, args: &[&str], stdin: Option<&str>) -> Out {
        let mut c = self.cmd(args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("kubectl runs");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        } else {
            drop(child.stdin.take());
        }
        let o = child.wait_with_output().unwrap();
        Out {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into(),
            stderr: String::from_utf8_lossy(&o.stderr).into(),
        }
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.ok, "kubectl {args:?} failed:\n{}\n{}", o.stdout, o.stderr);
        o.stdout
    }
}

const NEW_VM: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: testvm
  namespace: default
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        devices:
          disks:
          - {name: rootdisk, disk: {bus: virtio}}
        resources: {requests: {memory: MEMORY}}
      volumes:
      - name: rootdisk
        containerDisk: {image: quay.io/containerdisks/cirros}
"#;

#[test]
fn get_vm_and_vmi_across_namespaces() {
    let env = Env::new(ServeFlavor::KubeVirt);
    let out = env.ok(&["get", "vm,vmi", "-A"]);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0]
            .split_whitespace()
            .eq(["NAMESPACE", "NAME", "AGE", "STATUS", "READY"]),
        "{out}"
    );
    let row = |needle: &str| {
        lines
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle} in\n{out}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    let web = row("virtualmachine.kubevirt.io/web ");
    assert_eq!((web[0], web[3], web[4]), ("default", "Running", "True"));
    assert_eq!(row("virtualmachine.kubevirt.io/batch")[3], "Stopped");
    assert_eq!(row("virtualmachine.kubevirt.io/db.primary")[0], "prod");
    let vmi = row("virtualmachineinstance.kubevirt.io/web");
    assert_eq!(&vmi[3..], ["Running", "10.244.1.10", "node-1", "True"]);
    assert!(out.contains("PHASE") && out.contains("NODENAME"), "{out}");
}

#[test]
fn get_vm_as_yaml() {
    let env = Env::new(ServeFlavor::KubeVirt);
    let out = env.ok(&["get", "vm", "db.primary", "-n", "prod", "-o", "yaml"]);
    assert!(out.contains("name: db.primary"), "{out}");
    assert!(out.contains("apiVersion: kubevirt.io/v1"), "{out}");
    assert!(out.contains("printableStatus: Running"), "{out}");
    let missing = env.run(&["get", "vm", "nope", "-n", "prod"]);
    assert!(!missing.ok);
    assert!(
        missing
            .stderr
            .contains(r#"virtualmachines.kubevirt.io "nope" not found"#),
        "{}",
        missing.stderr
    );
}

#[test]
fn apply_update_and_delete() {
    let env = Env::new(ServeFlavor::KubeVirt);
    let file = env.dir.path().join("vm.yaml");
    std::fs::write(&file, NEW_VM.replace("MEMORY", "1Gi")).unwrap();
    let out = env.ok(&["apply", "-f", file.to_str().unwrap()]);
    assert!(
        out.contains("virtualmachine.kubevirt.io/testvm created"),
        "{out}"
    );
    std::fs::write(&file, NEW_VM.replace("MEMORY", "2Gi")).unwrap();
    let out = env.ok(&["apply", "-f", file.to_str().unwrap()]);
    assert!(
        out.contains("virtualmachine.kubevirt.io/testvm configured"),
        "{out}"
    );
    let vm = env
        .emu
        .objects("kubevirt.io", "virtualmachines", Some("default"))
        .into_iter()
        .find(|v| v["metadata"]["name"] == "testvm")
        .unwrap();
    assert_eq!(
        vm["spec"]["template"]["spec"]["domain"]["resources"]["requests"]["memory"],
        "2Gi"
    );
    assert_eq!(vm["metadata"]["generation"], 2);
    // The controller starts it (runStrategy Always): a VMI appears.
    let deadline = Instant::now() + Duration::from_secs(30);
    while env
        .emu
        .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
        .iter()
        .all(|v| v["metadata"]["name"] != "testvm")
    {
        assert!(Instant::now() < deadline, "no VMI for testvm");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = env.ok(&["delete", "vm", "testvm"]);
    assert!(out.contains("\"testvm\" deleted"), "{out}");
    assert!(
        env.emu
            .objects("kubevirt.io", "virtualmachines", Some("default"))
            .iter()
            .all(|v| v["metadata"]["name"] != "testvm")
    );
    // Garbage collection took the VMI along.
    assert!(
        env.emu
            .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
            .iter()
            .all(|v| v["metadata"]["name"] != "testvm")
    );
}

#[test]
fn unknown_field_is_refused() {
    let env = Env::new(ServeFlavor::KubeVirt);
    let bad = NEW_VM
        .replace("MEMORY", "1Gi")
        .replace("  runStrategy: Always", "  runStrategy: Always\n  foo: bar");
    let out = env.run_stdin(&["apply", "-f", "-"], Some(&bad));
    assert!(!out.ok, "{}", out.stdout);
    assert!(
        out.stderr
            .contains(r#"spec.foo: Invalid value: "bar": unknown field "foo""#),
        "{}",
        out.stderr
    );
    assert!(
        env.emu
            .objects("kubevirt.io", "virtualmachines", Some("default"))
            .iter()
            .all(|v| v["metadata"]["name"] != "testvm")
    );
}

#[test]
fn alice_is_forbidden_outside_dev() {
    let env = Env::new(ServeFlavor::KubeVirt);
    let out = env.run(&[
        "--context",
        "emulator-restricted",
        "get",
        "vm",
        "-n",
        "prod",
    ]);
    assert!(!out.ok);
    assert!(
        out.stderr.contains(r#"Error from server (Forbidden): virtualmachines.kubevirt.io is forbidden: User "alice" cannot list resource "virtualmachines" in API group "kubevirt.io" in the namespace "prod""#),
        "{}",
        out.stderr
    );
    let out = env.ok(&["--context", "emulator-restricted", "get", "vm"]);
    assert!(out.contains("batch"), "{out}");
    let out = env.ok(&["--context", "emulator-restricted", "auth", "whoami"]);
    assert!(out.contains("alice"), "{out}");
}

#[test]
fn deckhouse_vmclass_despite_v1alpha3() {
    let env = Env::new(ServeFlavor::Deckhouse);
    let out = env.ok(&["get", "vmclass"]);
    assert!(
        out.lines().any(|l| l.split_whitespace().eq([
            "generic",
            "Ready",
            "true",
            l.split_whitespace().last().unwrap()
        ])),
        "{out}"
    );
    let out = env.ok(&["get", "vm", "-A"]);
    assert!(
        out.contains("linux-vm") && out.contains("10.66.10.12"),
        "{out}"
    );
    let out = env.ok(&[
        "get",
        "vd",
        "-n",
        "dev",
        "new-disk",
        "-o",
        "jsonpath={.status.progress}",
    ]);
    assert_eq!(out, "37%");
}

#[test]
fn watch_receives_events() {
    let env = Env::new(ServeFlavor::KubeVirt);
    let mut child = env
        .cmd(&["get", "vm", "-n", "dev", "-w", "--request-timeout=30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let recv = |what: &str| -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.contains(what) => return l,
                Ok(_) => {}
                Err(_) => panic!("watch: no line with {what:?}"),
            }
        }
    };
    recv("batch");
    // Change state behind kubectl's back: it must see a MODIFIED event.
    let mut vm = env
        .emu
        .objects("kubevirt.io", "virtualmachines", Some("dev"))
        .into_iter()
        .find(|v| v["metadata"]["name"] == "batch")
        .unwrap();
    vm["status"]["printableStatus"] = json!("Starting");
    env.emu.put_object(vm);
    let line = recv("Starting");
    assert!(line.starts_with("batch"), "{line}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn stale_resource_version_conflicts() {
    let env = Env::new(ServeFlavor::KubeVirt);
    let stale = env.ok(&["get", "vm", "web", "-o", "json"]);
    // Someone else changes the object: the copy above is now stale.
    let mut vm = env
        .emu
        .objects("kubevirt.io", "virtualmachines", Some("default"))
        .into_iter()
        .find(|v| v["metadata"]["name"] == "web")
        .unwrap();
    vm["metadata"]["labels"]["touched"] = json!("yes");
    env.emu.put_object(vm);
    let out = env.run_stdin(&["replace", "-f", "-"], Some(&stale));
    assert!(!out.ok);
    assert!(
        out.stderr.contains(r#"Operation cannot be fulfilled on virtualmachines.kubevirt.io "web": the object has been modified; please apply your changes to the latest version and try again"#),
        "{}",
        out.stderr
    );
}

#[test]
fn server_dry_run_and_injected_failures() {
    let env = Env::new(ServeFlavor::KubeVirt);
    let out = env.run_stdin(
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&NEW_VM.replace("MEMORY", "1Gi")),
    );
    assert!(
        out.ok && out.stdout.contains("testvm created (server dry run)"),
        "{}{}",
        out.stdout,
        out.stderr
    );
    assert!(
        env.emu
            .objects("kubevirt.io", "virtualmachines", Some("default"))
            .iter()
            .all(|v| v["metadata"]["name"] != "testvm")
    );
    env.emu.inject_failure(kubevm_emulator::FailureRule {
        verb: "delete".into(),
        plural: "virtualmachines".into(),
        name: Some("web".into()),
        code: 500,
        message: "etcdserver: request timed out".into(),
        times: Some(1),
    });
    let out = env.run(&["delete", "vm", "web", "--wait=false"]);
    assert!(!out.ok);
    assert!(
        out.stderr
            .contains("Error from server (InternalError): etcdserver: request timed out"),
        "{}",
        out.stderr
    );
    // `times: 1` is used up: the next delete goes through.
    env.ok(&["delete", "vm", "web", "--wait=false"]);
}

#[test]
fn controllers_import_and_start() {
    let env = Env::new(ServeFlavor::Both);
    let vm = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: imported, namespace: dev}
spec:
  runStrategy: Always
  dataVolumeTemplates:
  - metadata: {name: imported-root}
    spec:
      source: {registry: {url: "docker://quay.io/containerdisks/fedora:42"}}
      storage: {resources: {requests: {storage: 5Gi}}}
  template:
    spec:
      domain:
        devices: {disks: [{name: root, disk: {bus: virtio}}]}
        resources: {requests: {memory: 1Gi}}
      volumes: [{name: root, dataVolume: {name: imported-root}}]
---
apiVersion: virtualization.deckhouse.io/v1alpha2
kind: VirtualDisk
metadata: {name: d1, namespace: dev}
spec:
  dataSource: {type: ObjectRef, objectRef: {kind: ClusterVirtualImage, name: ubuntu-24-04}}
  persistentVolumeClaim: {size: 8Gi}
---
apiVersion: virtualization.deckhouse.io/v1alpha2
kind: VirtualMachine
metadata: {name: dvm, namespace: dev}
spec:
  virtualMachineClassName: generic
  cpu: {cores: 1}
  memory: {size: 1Gi}
  blockDeviceRefs: [{kind: VirtualDisk, name: d1}]
"#;
    env.run_stdin(&["apply", "-f", "-"], Some(vm));
    let find = |group: &str, plural: &str, name: &str| {
        env.emu
            .objects(group, plural, Some("dev"))
            .into_iter()
            .find(|v| v["metadata"]["name"] == name)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let kv = find("kubevirt.io", "virtualmachines", "imported").unwrap();
        let dh = find("virtualization.deckhouse.io", "virtualmachines", "dvm").unwrap();
        if kv["status"]["printableStatus"] == "Running" && dh["status"]["phase"] == "Running" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not running: {} / {}",
            kv["status"],
            dh["status"]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let dv = find("cdi.kubevirt.io", "datavolumes", "imported-root").unwrap();
    assert_eq!(
        (
            dv["status"]["phase"].as_str(),
            dv["status"]["progress"].as_str()
        ),
        (Some("Succeeded"), Some("100.0%"))
    );
    assert!(find("", "persistentvolumeclaims", "imported-root").is_some());
    let vd = find("virtualization.deckhouse.io", "virtualdisks", "d1").unwrap();
    let pvc = vd["status"]["target"]["persistentVolumeClaimName"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        pvc.starts_with("vd-d1-") && find("", "persistentvolumeclaims", &pvc).is_some(),
        "{pvc}"
    );
    let vmi = find("kubevirt.io", "virtualmachineinstances", "imported").unwrap();
    assert_eq!(vmi["status"]["nodeName"], "node-1");
    let out = env.ok(&[
        "get",
        "vmi.kubevirt.io",
        "-n",
        "dev",
        "imported",
        "-o",
        "jsonpath={.status.interfaces[0].ipAddress}",
    ]);
    assert!(out.starts_with("10.244."), "{out}");
}

#[test]
fn request_log_records_what_kubectl_sent() {
    let env = Env::new(ServeFlavor::KubeVirt);
    env.emu.clear_requests();
    env.ok(&["label", "vm", "-n", "default", "web", "logged=yes"]);
    let requests = env.emu.requests();
    let patch = requests
        .iter()
        .find(|r| r.method == "PATCH")
        .unwrap_or_else(|| panic!("no PATCH recorded: {requests:?}"));
    assert_eq!(
        patch.path,
        "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/web"
    );
    assert_eq!(patch.status, 200);
    assert_eq!(
        patch.json().unwrap()["metadata"]["labels"]["logged"],
        json!("yes")
    );
    assert!(patch.header("user-agent").unwrap().starts_with("kubectl/"));
    assert!(
        patch.header("authorization").is_none(),
        "tokens are not logged"
    );
    env.emu.clear_requests();
    assert!(env.emu.requests().is_empty());
}
