//! The SSH signer end to end: `ca init --signer` installs it, `kubectl-vm signer serve` runs
//! it (here on 127.0.0.1, as its ServiceAccount, with the serving certificate from the Secret
//! `ca init` made), the emulator's aggregation proxies `ssh.kubevm.io` to it through the
//! Service's Endpoints, and the guests' real sshd decides what a certificate opens.

use std::io::BufRead;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use base64::Engine;
use serde_json::json;

use crate::common::{BIN, Env, find_object, ok, stderr, stdout};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";
const CA_NS: &str = "kubevm-system";

/// A running signer process and its audit lines.
pub struct SignerProcess {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub address: String,
    audit: Arc<Mutex<Vec<String>>>,
}

impl SignerProcess {
    /// The audit records so far, parsed.
    pub fn audit(&self) -> Vec<serde_json::Value> {
        self.audit
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The signer's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stop the signer (the Service's endpoint then refuses connections).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SignerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn secret_file(env: &Env, secret: &serde_json::Value, key: &str) -> std::path::PathBuf {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(secret["data"][key].as_str().unwrap())
        .unwrap();
    let path = env.dir.path().join(format!("signer-{key}"));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `ca init --signer`, then the signer running with `extra` flags and registered as the
/// Service's endpoint.
pub fn start_signer(env: &Env, extra: &[&str]) -> SignerProcess {
    let out = ok(env.vm(&[
        "ca",
        "init",
        "--signer",
        "--image",
        "registry.example/kubectl-vm:test",
    ]));
    assert!(
        out.contains("apiservice/v1alpha1.ssh.kubevm.io created"),
        "{out}"
    );
    // The CA exists now: crate::ssh::vm_with_ca must not init it again.
    std::fs::write(env.dir.path().join(".ca-done"), "").unwrap();
    launch(env, signer_args(env, extra))
}

/// The command line of `signer serve` as the signer's ServiceAccount, with the serving
/// certificate `ca init --signer` made.
fn signer_args(env: &Env, extra: &[&str]) -> Vec<String> {
    let secret = find_object(env, "", "secrets", Some(CA_NS), "kubevm-ssh-signer-tls")
        .expect("ca init --signer made the serving certificate");
    let cert = secret_file(env, &secret, "tls.crt");
    let key = secret_file(env, &secret, "tls.key");
    let token = env
        .emulator
        .service_account_token(CA_NS, "kubevm-ssh-signer", 3600)
        .expect("ca init --signer made the ServiceAccount");
    let kubeconfig = env.dir.path().join("signer.kubeconfig");
    std::fs::write(
        &kubeconfig,
        env.emulator.kubeconfig_yaml_with_token(
            "system:serviceaccount:kubevm-system:kubevm-ssh-signer",
            &token,
        ),
    )
    .unwrap();
    let mut args: Vec<String> = [
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "signer",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-private-key-file",
        key.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// `signer serve` started once more (after [`start_signer`]), its output piped.
pub fn start_signer_process(env: &Env, extra: &[&str]) -> Child {
    Command::new(BIN)
        .args(signer_args(env, extra))
        .env("HOME", env.dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn launch(env: &Env, args: Vec<String>) -> SignerProcess {
    let mut child = Command::new(BIN)
        .args(&args)
        .env("HOME", env.dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines
        .next()
        .expect("the signer says where it listens")
        .unwrap();
    let listening: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(listening["event"], "listening", "{first}");
    let address = listening["address"].as_str().unwrap().to_owned();
    let audit = Arc::new(Mutex::new(Vec::new()));
    let sink = audit.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    let (ip, port) = address.rsplit_once(':').unwrap();
    env.emulator.put_object(json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubevm-ssh-signer", "namespace": CA_NS},
        "subsets": [{"addresses": [{"ip": ip}],
            "ports": [{"name": "https", "port": port.parse::<u16>().unwrap(), "protocol": "TCP"}]}]
    }));
    SignerProcess {
        child,
        address,
        audit,
    }
}

/// `create NAME -n NS` as admin (who may get host certificates), running.
pub fn create_vm(env: &Env, name: &str, ns: &str) {
    ok(env.vm(&[
        "create",
        name,
        "-n",
        ns,
        "--image",
        IMAGE,
        "--wait",
        "--timeout",
        "60s",
    ]));
}

/// alice: may read `dev` (the emulator's reader RoleBinding) and, through this Role, create the
/// user certificate of VM `web` in `dev` only and open its platform port-forward (`get`, as
/// KubeVirt's `kubevirt.io:edit` and Deckhouse's `forward_port` grant it), which is how ssh
/// reaches the guest.
pub fn grant_alice_web(env: &Env) {
    let rbac = "rbac.authorization.k8s.io";
    let deckhouse = !env
        .emulator
        .objects("virtualization.deckhouse.io", "virtualmachines", None)
        .is_empty();
    // kubectl-vm forwards to the VM on both (KubeVirt: `virtualmachines/NAME/portforward`).
    let group = if deckhouse {
        "subresources.virtualization.deckhouse.io"
    } else {
        "subresources.kubevirt.io"
    };
    env.emulator.put_object(json!({
        "apiVersion": format!("{rbac}/v1"), "kind": "Role",
        "metadata": {"name": "web-ssh", "namespace": "dev"},
        "rules": [{"apiGroups": ["ssh.kubevm.io"], "resources": ["virtualmachines/sshcertificate"],
            "resourceNames": ["web"], "verbs": ["create"]},
            {"apiGroups": [group], "resources": ["virtualmachines/portforward"], "resourceNames": ["web"], "verbs": ["get"]}]}));
    env.emulator.put_object(json!({
        "apiVersion": format!("{rbac}/v1"), "kind": "RoleBinding",
        "metadata": {"name": "alice-web-ssh", "namespace": "dev"},
        "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "web-ssh"},
        "subjects": [{"apiGroup": rbac, "kind": "User", "name": "alice"}]}));
}

pub fn ssh_as(env: &Env, who: &[&str], args: &[&str]) -> Output {
    env.command(BIN)
        .args(who)
        .arg("ssh")
        .args(["--strict-host-key-checking", "yes"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

pub const ALICE: &[&str] = &["--context", "emulator-restricted"];
const BOB: &[&str] = &["--as", "bob"];

fn sshd_log(env: &Env, ns: &str, vm: &str) -> String {
    env.emulator
        .guest(ns, vm)
        .unwrap()
        .and_then(|g| g.sshd_log())
        .unwrap_or_default()
}

#[track_caller]
pub fn one_line_255(out: &Output) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(255), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err
}

fn rbac_and_scoping(env: &Env, flavor: &str) {
    let signer = start_signer(env, &[]);
    for (name, ns) in [("web", "dev"), ("db", "dev"), ("web", "prod")] {
        create_vm(env, name, ns);
    }
    // Host certificates came from the signer: each VM got one, requested by admin.
    let host_issues: Vec<_> = signer
        .audit()
        .into_iter()
        .filter(|r| r["kind"] == "host" && r["event"] == "issued")
        .collect();
    assert_eq!(host_issues.len(), 3, "{host_issues:?}");
    assert!(host_issues.iter().all(|r| r["user"] == "admin"));
    grant_alice_web(env);
    env.emulator.clear_requests();

    // alice logs in to web.dev, the host verified by its certificate.
    let out = ssh_as(env, ALICE, &["web.dev", "--", "id", "-un"]);
    assert_eq!(
        (out.status.code(), stdout(&out).as_str()),
        (Some(0), "kubevm\n"),
        "{flavor}: {}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("unsafe"), "{}", stderr(&out));
    // db.dev: the API server's own 403, one line, exit 255.
    let err = one_line_255(&ssh_as(env, ALICE, &["db.dev", "--", "true"]));
    assert!(
        err.contains("Forbidden")
            && err.contains("User \"alice\" cannot create resource \"virtualmachines/sshcertificate\" in API group \"ssh.kubevm.io\" in the namespace \"dev\""),
        "{err}"
    );
    // bob has no role at all.
    let err = one_line_255(&ssh_as(env, BOB, &["web.dev", "--", "true"]));
    assert!(err.contains("User \"bob\" cannot create resource"), "{err}");
    // Neither asked for the CA Secret: every request for it came from the signer.
    let secret_reads: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/secrets/kubevm-ssh-ca"))
        .collect();
    assert!(!secret_reads.is_empty(), "the signer reads the CA Secret");
    for r in &secret_reads {
        assert!(
            r.header("user-agent")
                .is_some_and(|ua| ua.starts_with("kubectl-vm/"))
                && r.header("impersonate-user").is_none(),
            "{r:?}"
        );
    }
    let issued: Vec<_> = signer
        .audit()
        .into_iter()
        .filter(|r| r["kind"] == "user")
        .collect();
    // alice's one issuance; the refusals never reached the signer (RBAC stopped them).
    assert_eq!(issued.len(), 1, "{issued:?}");
    let record = &issued[0];
    assert_eq!(record["event"], "issued");
    assert_eq!(record["user"], "alice");
    assert_eq!(record["principals"], json!(["kubevm@web.dev"]));
    assert_eq!(record["keyId"], "kubectl-vm:alice:dev/web");
    // sshd logged the key ID the signer wrote from the API server's identity.
    let log = sshd_log(env, "dev", "web");
    assert!(
        log.contains(&format!(
            "ID kubectl-vm:alice:dev/web (serial {})",
            record["serial"].as_str().unwrap()
        )),
        "{log}"
    );
    // An Event on the VM names who got what.
    let events = env.emulator.objects("", "events", Some("dev"));
    let event = events
        .iter()
        .find(|e| e["reason"] == "SSHCertificateIssued" && e["involvedObject"]["name"] == "web")
        .expect("an Event on web");
    let message = event["message"].as_str().unwrap();
    assert!(
        message.contains("\"alice\"") && message.contains(record["fingerprint"].as_str().unwrap()),
        "{message}"
    );

    // A certificate for web.dev opens web.dev only: present it with OpenSSH to db.dev and
    // web.prod, whose sshd refuse it.
    ok(env
        .command(BIN)
        .args(ALICE)
        .args(["ssh-cert", "web.dev.vm"])
        .output()
        .unwrap());
    let base = env.dir.path().join(".kube/kubectl-vm/ssh");
    let key = base.join("id_ed25519");
    let cert = base.join("certs/kubevm@web.dev.vm-cert.pub");
    for (vm, ns) in [("db", "dev"), ("web", "prod")] {
        let out = crate::common::openssh_via_vm(env, "", &format!("{vm}.{ns}"), &key, &cert)
            .args([&format!("kubevm@{vm}.{ns}"), "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(255), "{vm}.{ns}: {}", stderr(&out));
        let log = sshd_log(env, ns, vm);
        assert!(
            log.contains("principal") && !log.contains("Accepted publickey for kubevm"),
            "{vm}.{ns}: {log}"
        );
    }
    // web.dev's host certificate does not pass for web.prod: OpenSSH connects to web.dev
    // while verifying the host as web.prod (a man in the middle with web.dev's identity).
    let trust = env.dir.path().join("ca_known_hosts");
    let known_hosts = crate::common::ok(env.vm(&["ssh-known-hosts"]));
    assert!(
        known_hosts.starts_with("@cert-authority * ssh-"),
        "{known_hosts}"
    );
    std::fs::write(&trust, known_hosts).unwrap();
    let out = env
        .command("ssh")
        .args(["-F", "/dev/null", "-o", "BatchMode=yes"])
        .arg("-o")
        .arg(format!(
            "ProxyCommand={BIN} port-forward --stdio web.dev 22"
        ))
        .arg("-o")
        .arg(format!("UserKnownHostsFile={}", trust.display()))
        .args([
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "HostKeyAlias=web.prod.vm",
        ])
        .args(["kubevm@web.prod", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(255));
    assert!(
        stderr(&out).contains("Host key verification failed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn kubevirt_rbac_decides_and_a_certificate_opens_one_vm() {
    rbac_and_scoping(&Env::kubevirt(), "kubevirt");
}

#[test]
fn deckhouse_rbac_decides_and_a_certificate_opens_one_vm() {
    rbac_and_scoping(&Env::deckhouse(), "deckhouse");
}

#[test]
fn the_signer_decides_lifetime_and_logins_and_trusts_only_the_api_server() {
    let env = Env::kubevirt();
    let signer = start_signer(&env, &["--max-ttl", "10m"]);
    create_vm(&env, "www", "default");
    // Over the signer's cap: refused by the signer, in one line.
    let err = one_line_255(&ssh_as(&env, &[], &["www", "--ttl", "30m", "--", "true"]));
    assert!(
        err.contains("Invalid: spec.ttlSeconds 1800 exceeds the signer's maximum of 600"),
        "{err}"
    );
    // A login the VM does not list.
    let err = one_line_255(&ssh_as(&env, &[], &["root@www", "--", "true"]));
    assert!(
        err.contains("Forbidden: login \"root\" is not allowed"),
        "{err}"
    );
    // Within the cap: fine.
    let out = ssh_as(&env, &[], &["www", "--ttl", "10m", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Straight to the signer, with a forged identity and no front-proxy certificate.
    let url = format!(
        "https://{}/apis/ssh.kubevm.io/v1alpha1/namespaces/default/virtualmachines/www/sshcertificate",
        signer.address
    );
    let out = Command::new("curl")
        .args(["-sk", "-X", "POST", "-H", "X-Remote-User: admin", "-H", "X-Remote-Group: system:masters"])
        .args(["-H", "Content-Type: application/json", "--data", r#"{"spec":{"publicKey":"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHcP1uPBmPUxGj6S+v8Wgfc1ckRtXQ4dx2ri8DPz8GLy"}}"#])
        .args(["-w", "\n%{http_code}", &url])
        .output()
        .expect("curl is installed");
    let text = stdout(&out);
    assert!(text.ends_with("\n401"), "{text}");
    assert!(
        text.contains("no verified front-proxy client certificate"),
        "{text}"
    );
    let refused = signer.audit();
    assert!(
        refused.iter().any(|r| r["event"] == "unauthenticated"),
        "{refused:?}"
    );
    assert!(!refused.iter().any(|r| r["event"] == "issued"
        && r["user"] == "admin"
        && r["kind"] == "user"
        && r["principals"].is_null()));
}

#[test]
fn a_signer_that_is_down_fails_in_one_line_and_no_secret_is_read() {
    let env = Env::deckhouse();
    let mut signer = start_signer(&env, &[]);
    create_vm(&env, "web", "default");
    signer.stop();
    env.emulator.clear_requests();
    let err = one_line_255(&ssh_as(&env, &[], &["web", "--", "true"]));
    // The client tries a 503 again four times, 0.25 s to 2 s apart (another replica may
    // answer), then fails with the last answer: five requests to the signer's API, no more.
    let asked: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/sshcertificate"))
        .map(|r| r.status)
        .collect();
    assert_eq!(
        asked, [503; 5],
        "one request to the signer and four retries"
    );
    assert!(
        err.contains(
            "the SSH certificate signer (APIService v1alpha1.ssh.kubevm.io) is unavailable"
        ),
        "{err}"
    );
    assert!(
        !env.emulator
            .requests()
            .iter()
            .any(|r| r.path.contains("/secrets")),
        "no fall-back to the CA Secret"
    );
    // create cannot get a host certificate either, and says so instead of skipping it.
    let out = env.vm(&["create", "db", "--image", IMAGE]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot get the VM's host certificate from the SSH signer"),
        "{}",
        stderr(&out)
    );
    assert!(
        find_object(
            &env,
            "virtualization.deckhouse.io",
            "virtualmachines",
            Some("default"),
            "db"
        )
        .is_none()
    );
}

fn signing_ca(env: &Env, host: &str) -> String {
    ok(env.vm(&["ssh-cert", host]));
    let cert = env
        .dir
        .path()
        .join(format!(".kube/kubectl-vm/ssh/certs/kubevm@{host}-cert.pub"));
    let listed = Command::new("ssh-keygen")
        .arg("-L")
        .arg("-f")
        .arg(&cert)
        .output()
        .unwrap();
    let text = stdout(&listed);
    text.split("Signing CA: ED25519 ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{text}"))
        .to_owned()
}

#[test]
fn rotation_reaches_the_running_signer_and_the_guests() {
    let env = Env::kubevirt();
    let _signer = start_signer(&env, &[]);
    create_vm(&env, "www", "default");
    let rotated = ok(env.vm(&["ca", "rotate"]));
    assert!(
        rotated
            .contains("Updated the SSH trust of 1 VMs (applied at their next boot): www.default"),
        "{rotated}"
    );
    let keys: serde_json::Value =
        serde_json::from_str(&ok(env.vm(&["ca", "show", "-o", "json"]))).unwrap();
    assert_eq!(keys["mode"], "signer");
    let old_key = keys["keys"][0]["fingerprint"].as_str().unwrap().to_owned();
    let new_key = keys["keys"][1]["fingerprint"].as_str().unwrap().to_owned();
    // During the rotation the running signer (no restart) signs user certificates with the
    // key every guest trusts, so the VM keeps working before its reboot.
    assert_eq!(signing_ca(&env, "www.default.vm"), old_key);
    let out = ssh_as(&env, &[], &["www", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Its next boot applies the new trust and a host certificate of the new key.
    ok(env.vm(&["restart", "www", "--wait", "--timeout", "60s"]));
    let finished = ok(env.vm(&["ca", "rotate", "--finish"]));
    assert!(
        finished.contains(&format!("No longer trusted: {old_key}")),
        "{finished}"
    );
    // From now on the new key signs, the guest accepts it, and its host certificate (new key)
    // is verified with only the new key trusted.
    assert_eq!(signing_ca(&env, "www.default.vm"), new_key);
    let out = ssh_as(&env, &[], &["www", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn install_manifests_offline_and_idempotent_reruns() {
    let env = Env::kubevirt();
    env.emulator.clear_requests();
    let text = ok(env.vm(&[
        "ca",
        "init",
        "--signer",
        "--image",
        "registry.example/kubectl-vm:1",
        "--dry-run=client",
        "-o",
        "yaml",
    ]));
    assert!(env.emulator.requests().is_empty(), "offline");
    let list: serde_json::Value = yaml_serde::from_str(&text).unwrap();
    let kinds: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    for kind in [
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "APIService",
        "ClusterRole",
        "ServiceAccount",
    ] {
        assert!(kinds.contains(&kind), "{kind}: {kinds:?}");
    }
    // Real kubectl sends them as they are; the server checks them without storing (the
    // emulator serves no OpenAPI for these groups, so kubectl's client validation is off).
    let file = env.dir.path().join("signer.yaml");
    std::fs::write(&file, &text).unwrap();
    ok(env.vm(&["ca", "init"]));
    let applied = env.kubectl(&[
        "apply",
        "--dry-run=server",
        "--validate=false",
        "-f",
        file.to_str().unwrap(),
    ]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    // Installing twice changes nothing that matters: the serving certificate stays.
    ok(env.vm(&[
        "ca",
        "init",
        "--signer",
        "--image",
        "registry.example/kubectl-vm:1",
    ]));
    let bundle = |env: &Env| {
        find_object(
            env,
            "apiregistration.k8s.io",
            "apiservices",
            None,
            "v1alpha1.ssh.kubevm.io",
        )
        .unwrap()["spec"]["caBundle"]
            .clone()
    };
    let first = bundle(&env);
    let again = ok(env.vm(&[
        "ca",
        "init",
        "--signer",
        "--image",
        "registry.example/kubectl-vm:2",
    ]));
    assert!(
        again.contains("secret/kubevm-ssh-ca unchanged")
            && again.contains("deployment/kubevm-ssh-signer (namespace kubevm-system) configured"),
        "{again}"
    );
    assert_eq!(bundle(&env), first);
    // Never over something that is not ours.
    env.emulator.put_object(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "kubevm:ssh"}, "rules": []}),
    );
    let err = crate::common::fails(&env, &["ca", "init", "--signer", "--image", "x"], 1);
    assert!(
        err.contains("clusterrole/kubevm:ssh exists and was not created by kubectl vm"),
        "{err}"
    );
}

#[test]
fn direct_mode_says_it_is_unsafe() {
    let env = Env::kubevirt();
    crate::ssh::vm_with_ca(&env, "www", &[]);
    let out = ssh_as(&env, &[], &["www", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Notice: this cluster has no SSH signer")
            && stderr(&out).contains("kubectl vm ca init --signer"),
        "{}",
        stderr(&out)
    );
    let show = ok(env.vm(&["ca", "show"]));
    assert!(show.contains("Mode:       direct (unsafe)"), "{show}");
    let get = ok(env.vm(&["get", "www"]));
    assert!(
        get.contains("SSH trust:    vm-scoped: certificates for LOGIN@NAME.NAMESPACE only"),
        "{get}"
    );
}
