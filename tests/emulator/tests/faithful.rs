//! The emulator as faithful as the tool needs, driven by real kubectl (v1.36): typed
//! (protobuf) creates, Secret conversion and limits, the request-body limit, KubeVirt/CDI
//! webhook rules, object-count quota and webhook denials.

use crate::common;

use common::kubectl::KubectlEnv as Env;

#[test]
fn kubectl_create_secret_namespace_and_configmap() {
    // kubectl's typed client sends these as application/vnd.kubernetes.protobuf.
    let env = Env::new();
    assert_eq!(
        env.ok(&["create", "namespace", "team"]).trim(),
        "namespace/team created"
    );
    assert_eq!(
        env.ok(&[
            "create",
            "secret",
            "generic",
            "creds",
            "-n",
            "team",
            "--from-literal=user=admin",
            "--from-literal=flag=y",
        ])
        .trim(),
        "secret/creds created"
    );
    env.ok(&[
        "create",
        "configmap",
        "settings",
        "-n",
        "team",
        "--from-literal=mode=fast",
    ]);
    let secret = env.json(&["get", "secret", "creds", "-n", "team", "-o", "json"]);
    // `printf admin | base64` = YWRtaW4=, `printf y | base64` = eQ==.
    assert_eq!(secret["data"]["user"], "YWRtaW4=");
    assert_eq!(secret["data"]["flag"], "eQ==");
    assert_eq!(secret["type"], "Opaque");
    assert!(secret["metadata"].get("generation").is_none());
    let cm = env.json(&["get", "configmap", "settings", "-n", "team", "-o", "json"]);
    assert_eq!(cm["data"]["mode"], "fast");
    assert!(cm["metadata"].get("generation").is_none());
    let ns = env.json(&["get", "namespace", "team", "-o", "json"]);
    assert_eq!(ns["status"]["phase"], "Active");
    assert!(ns["metadata"].get("generation").is_none());
}

#[test]
fn secret_string_data_is_stored_as_data() {
    let env = Env::new();
    // kubectl reads YAML 1.1 (an unquoted `y` is a boolean), so the values are quoted.
    let manifest = "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: default}\n\
                    data: {keep: a2VlcA==, over: b2xk}\nstringData: {over: new, answer: \"y\", other: \"no\"}\n";
    env.run(&["apply", "-f", "-"], manifest);
    let secret = env.json(&["get", "secret", "s", "-o", "json"]);
    assert!(secret.get("stringData").is_none(), "{secret}");
    // base64 of "keep", "new", "y", "no".
    assert_eq!(
        secret["data"],
        serde_json::json!({"keep": "a2VlcA==", "over": "bmV3", "answer": "eQ==", "other": "bm8="})
    );
}

#[test]
fn secret_over_one_mebibyte_is_refused_like_the_api_server() {
    let env = Env::new();
    let big = "x".repeat(1024 * 1024 + 1);
    let manifest = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: big, namespace: default}}\nstringData: {{k: {big}}}\n"
    );
    let (ok, _, err) = env.run(&["create", "-f", "-"], &manifest);
    assert!(!ok);
    assert!(
        err.contains(
            r#"Secret "big" is invalid: data: Too long: may not be more than 1048576 bytes"#
        ),
        "{err}"
    );
}

#[test]
fn request_body_over_three_mebibytes_is_413() {
    let env = Env::new();
    let big = "x".repeat(3 * 1024 * 1024 + 10);
    let manifest = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: huge, namespace: default}}\ndata: {{k: {big}}}\n"
    );
    let (ok, _, err) = env.run(&["create", "-f", "-"], &manifest);
    assert!(!ok);
    assert!(
        err.contains("Error from server (RequestEntityTooLarge)")
            && err.contains("Request entity too large: limit is 3145728"),
        "{err}"
    );
}

#[test]
fn secret_string_data_must_be_strings() {
    let env = Env::new();
    let manifest = "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: default}\nstringData: {answer: y}\n";
    let (ok, _, err) = env.run(&["create", "-f", "-"], manifest);
    assert!(!ok);
    assert!(
        err.contains(r#"Secret in version "v1" cannot be handled as a Secret: json: cannot unmarshal bool into Go struct field Secret.stringData of type string"#),
        "{err}"
    );
}

const VM: &str = r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: NAME, namespace: default}
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        devices:
          disks: [{name: root}]
        resources: {requests: {memory: 64Mi}}
      volumes: [{name: root, containerDisk: {image: quay.io/containerdisks/cirros}}]
"#;

#[test]
fn kubevirt_and_cdi_webhooks_refuse_what_they_refuse() {
    let env = Env::new();
    let both = VM.replace("NAME", "both").replace(
        "runStrategy: Halted",
        "runStrategy: Halted\n  running: false",
    );
    let (ok, _, err) = env.run(&["create", "-f", "-"], &both);
    assert!(!ok);
    // kubectl prints a 422 whose details carry only causes (as webhook denials do) as
    // "The request is invalid: FIELD: MESSAGE"; the Status message itself is checked in the
    // emulator's unit tests (webhooks.rs).
    assert!(
        err.contains("The request is invalid: spec.running: Running and RunStrategy are mutually exclusive. Note that Running is deprecated, please use RunStrategy instead"),
        "{err}"
    );
    let no_volume = VM.replace("NAME", "novol").replace(
        "disks: [{name: root}]",
        "disks: [{name: root}, {name: data}]",
    );
    let (ok, _, err) = env.run(&["create", "-f", "-"], &no_volume);
    assert!(!ok);
    assert!(
        err.contains("The request is invalid: spec.template.spec.domain.devices.disks[1].name: spec.template.spec.domain.devices.disks[1].Name 'data' not found."),
        "{err}"
    );
    let dv = "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {name: zero, namespace: default}\n\
              spec:\n  source: {blank: {}}\n  storage: {resources: {requests: {storage: \"0\"}}}\n";
    let (ok, _, err) = env.run(&["create", "-f", "-"], dv);
    assert!(!ok);
    assert!(
        err.contains("The request is invalid: spec.Storage.resources.requests.size: Storage size can't be equal or less than zero"),
        "{err}"
    );
    env.run(&["create", "-f", "-"], &VM.replace("NAME", "fine"));
    env.ok(&["get", "vm", "fine"]);
}

#[test]
fn object_count_quota_refuses_with_the_real_message() {
    let env = Env::new();
    let quota = "apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: vms, namespace: default}\n\
                 spec: {hard: {count/virtualmachines.kubevirt.io: \"1\"}}\n";
    env.run(&["create", "-f", "-"], quota);
    env.run(&["create", "-f", "-"], &VM.replace("NAME", "one"));
    env.ok(&["get", "vm", "one"]);
    let (ok, _, err) = env.run(&["create", "-f", "-"], &VM.replace("NAME", "two"));
    assert!(!ok);
    assert!(
        err.contains(r#"virtualmachines.kubevirt.io "two" is forbidden: exceeded quota: vms, requested: count/virtualmachines.kubevirt.io=1, used: count/virtualmachines.kubevirt.io=1, limited: count/virtualmachines.kubevirt.io=1"#),
        "{err}"
    );
    assert!(err.contains("Error from server (Forbidden)"), "{err}");
}

#[test]
fn admission_denial_switch() {
    let env = Env::new();
    env.emu.deny_admission(
        "policy.example.com",
        "create",
        "virtualmachines",
        "no VMs on Fridays",
        Some(1),
    );
    let (ok, _, err) = env.run(&["create", "-f", "-"], &VM.replace("NAME", "fri"));
    assert!(!ok);
    assert!(
        err.contains(r#"Error from server (Forbidden): error when creating "STDIN": admission webhook "policy.example.com" denied the request: no VMs on Fridays"#),
        "{err}"
    );
    env.run(&["create", "-f", "-"], &VM.replace("NAME", "fri"));
    env.ok(&["get", "vm", "fri"]);
}

#[test]
fn foreground_deletion_takes_time() {
    let env = Env::new();
    env.run(&["create", "-f", "-"], &VM.replace("NAME", "owner"));
    let owner = env.json(&["get", "vm", "owner", "-o", "json"]);
    let uid = owner["metadata"]["uid"].as_str().unwrap().to_owned();
    let dependent = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dep\n  namespace: default\n  ownerReferences:\n  - {{apiVersion: kubevirt.io/v1, kind: VirtualMachine, name: owner, uid: {uid}, blockOwnerDeletion: true}}\n"
    );
    env.run(&["create", "-f", "-"], &dependent);
    env.ok(&[
        "delete",
        "vm",
        "owner",
        "--cascade=foreground",
        "--wait=false",
    ]);
    // Still there, marked, while its dependents go first.
    let marked = env.json(&["get", "vm", "owner", "-o", "json"]);
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    assert_eq!(
        marked["metadata"]["finalizers"],
        serde_json::json!(["foregroundDeletion"])
    );
    env.ok(&["wait", "--for=delete", "configmap/dep", "--timeout=20s"]);
    env.ok(&["wait", "--for=delete", "vm/owner", "--timeout=20s"]);
}
