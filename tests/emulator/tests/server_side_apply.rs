//! Server-side apply field ownership, driven by real kubectl (v1.36): managedFields per
//! manager, conflicts (409 with kubectl's own conflict text), `--force-conflicts`,
//! co-ownership of equal values and pruning. Expected texts follow the API server's
//! fieldmanager (k8s.io/apiserver .../fieldmanager/internal/conflict.go) and the examples of
//! kubernetes.io/docs/reference/using-api/server-side-apply.

use crate::common;

use common::kubectl::KubectlEnv as Env;
use serde_json::{Value, json};

impl Env {
    /// `kubectl apply --server-side --field-manager=M [extra] -f -`.
    fn apply(&self, manager: &str, extra: &[&str], yaml: &str) -> (bool, String, String) {
        let fm = format!("--field-manager={manager}");
        let mut args = vec!["apply", "--server-side", fm.as_str()];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-f", "-"]);
        self.run(&args, yaml)
    }

    fn apply_ok(&self, manager: &str, extra: &[&str], yaml: &str) -> String {
        let (ok, out, err) = self.apply(manager, extra, yaml);
        assert!(ok, "apply by {manager} failed:\n{out}\n{err}");
        out
    }

    fn configmap(&self) -> Value {
        self.json(&["get", "cm", "c", "-o", "json", "--show-managed-fields"])
    }
}

fn cm(data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: default\ndata:\n{data}"
    )
}

/// manager → (operation, fieldsV1) of an object's managedFields.
fn owners(obj: &Value) -> Vec<(String, String, Value)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .map(|e| {
            assert_eq!(e["fieldsType"], "FieldsV1", "{e}");
            assert!(e["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{e}");
            (
                e["manager"].as_str().unwrap().to_string(),
                e["operation"].as_str().unwrap().to_string(),
                e["fieldsV1"].clone(),
            )
        })
        .collect()
}

#[test]
fn conflict_then_force_takes_the_field_over() {
    let env = Env::new();
    let out = env.apply_ok("a", &[], &cm("  foo: \"1\"\n  bar: x\n"));
    assert_eq!(out.trim(), "configmap/c serverside-applied");
    let obj = env.configmap();
    assert_eq!(
        owners(&obj),
        vec![(
            "a".into(),
            "Apply".into(),
            json!({"f:data": {"f:bar": {}, "f:foo": {}}})
        )]
    );
    assert_eq!(obj["metadata"]["managedFields"][0]["apiVersion"], "v1");
    // kubectl hides managedFields unless asked.
    let plain = env.json(&["get", "cm", "c", "-o", "json"]);
    assert!(plain["metadata"].get("managedFields").is_none(), "{plain}");

    // B changes foo: kubectl shows the server's conflict and its advice.
    let (ok, _, err) = env.apply("b", &[], &cm("  foo: \"2\"\n"));
    assert!(!ok);
    assert!(
        err.contains("error: Apply failed with 1 conflict: conflict with \"a\": .data.foo"),
        "{err}"
    );
    assert!(err.contains("--force-conflicts"), "{err}");
    assert_eq!(env.configmap()["data"]["foo"], "1", "nothing changed");

    // Two fields: the plural form, one line per field.
    let (ok, _, err) = env.apply("b", &[], &cm("  foo: \"2\"\n  bar: y\n"));
    assert!(!ok);
    assert!(
        err.contains(
            "error: Apply failed with 2 conflicts: conflicts with \"a\":\n- .data.bar\n- .data.foo"
        ),
        "{err}"
    );

    // Forced: B owns foo, A keeps bar.
    let out = env.apply_ok("b", &["--force-conflicts"], &cm("  foo: \"2\"\n"));
    assert_eq!(out.trim(), "configmap/c serverside-applied");
    let obj = env.configmap();
    assert_eq!(obj["data"], json!({"foo": "2", "bar": "x"}));
    assert_eq!(
        owners(&obj),
        vec![
            ("a".into(), "Apply".into(), json!({"f:data": {"f:bar": {}}})),
            ("b".into(), "Apply".into(), json!({"f:data": {"f:foo": {}}})),
        ]
    );
}

#[test]
fn equal_values_are_co_owned_and_pruning_spares_them() {
    let env = Env::new();
    env.apply_ok("a", &[], &cm("  foo: \"1\"\n  bar: x\n  baz: z\n"));
    // B applies the value A set: no conflict, both own foo.
    env.apply_ok("b", &[], &cm("  foo: \"1\"\n"));
    let obj = env.configmap();
    assert_eq!(
        owners(&obj)[1],
        ("b".into(), "Apply".into(), json!({"f:data": {"f:foo": {}}}))
    );
    // A stops applying bar and foo: bar (A's alone) is pruned, foo (co-owned by B) stays.
    env.apply_ok("a", &[], &cm("  baz: z\n"));
    let obj = env.configmap();
    assert_eq!(obj["data"], json!({"foo": "1", "baz": "z"}));
    assert_eq!(
        owners(&obj),
        vec![
            ("a".into(), "Apply".into(), json!({"f:data": {"f:baz": {}}})),
            ("b".into(), "Apply".into(), json!({"f:data": {"f:foo": {}}})),
        ]
    );
    // A no-op re-apply changes nothing, not even the resourceVersion.
    let rv = obj["metadata"]["resourceVersion"].clone();
    env.apply_ok("a", &[], &cm("  baz: z\n"));
    assert_eq!(env.configmap()["metadata"]["resourceVersion"], rv);
}

#[test]
fn updates_record_their_manager_and_then_conflict_with_apply() {
    let env = Env::new();
    let (ok, out, err) = env.run(&["create", "configmap", "c", "--from-literal=foo=1"], "");
    assert!(ok, "{out}{err}");
    // kubectl create sends fieldManager=kubectl-create: an Update entry.
    let obj = env.configmap();
    let o = owners(&obj);
    assert_eq!(o.len(), 1);
    assert_eq!(
        (o[0].0.as_str(), o[0].1.as_str()),
        ("kubectl-create", "Update")
    );
    // The data map was added whole, so its node is owned too (`.`), as the real server shows.
    assert_eq!(o[0].2["f:data"], json!({".": {}, "f:foo": {}}));
    // Apply of another value conflicts with the Update manager, printed with its
    // apiVersion and time (conflict.go printManager).
    let (ok, _, err) = env.apply("a", &[], &cm("  foo: \"2\"\n"));
    assert!(!ok);
    let time = obj["metadata"]["managedFields"][0]["time"]
        .as_str()
        .unwrap();
    assert!(
        err.contains(&format!(
            "Apply failed with 1 conflict: conflict with \"kubectl-create\" using v1 at {time}: .data.foo"
        )),
        "{err}"
    );
    // kubectl label: its own Update entry (fieldManager=kubectl-label).
    let (ok, out, err) = env.run(&["label", "cm", "c", "team=x"], "");
    assert!(ok, "{out}{err}");
    let o = owners(&env.configmap());
    let label = o
        .iter()
        .find(|e| e.0 == "kubectl-label")
        .expect("label entry");
    assert_eq!(label.1, "Update");
    // The labels map was new: its node is owned too.
    assert_eq!(
        label.2,
        json!({"f:metadata": {"f:labels": {".": {}, "f:team": {}}}}),
        "{o:?}"
    );
}

const VM: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: vm
  namespace: default
spec:
  runStrategy: Halted
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
fn custom_resource_lists_are_atomic_and_conflicts_name_the_path() {
    let env = Env::new();
    env.apply_ok("a", &[], &VM.replace("MEMORY", "1Gi"));
    let vm = env.json(&["get", "vm", "vm", "-o", "json", "--show-managed-fields"]);
    let o = owners(&vm);
    assert_eq!(o.len(), 1);
    // KubeVirt's CRD gives disks/volumes no x-kubernetes-list-type: atomic, one field each.
    assert_eq!(
        o[0].2,
        json!({"f:spec": {"f:runStrategy": {}, "f:template": {"f:spec": {
            "f:domain": {"f:devices": {"f:disks": {}},
                "f:resources": {"f:requests": {"f:memory": {}}}},
            "f:volumes": {}}}}})
    );
    let (ok, _, err) = env.apply("b", &[], &VM.replace("MEMORY", "2Gi"));
    assert!(!ok);
    assert!(
        err.contains(
            "Apply failed with 1 conflict: conflict with \"a\": .spec.template.spec.domain.resources.requests.memory"
        ),
        "{err}"
    );
}

#[test]
fn without_field_manager_the_user_agent_program_is_the_manager() {
    // `kubectl create --raw` sends no fieldManager; its User-Agent is
    // `kubectl/v1.36.x (linux/amd64) kubernetes/…`, so the server records "kubectl"
    // (handlers/rest.go prefixFromUserAgent).
    let env = Env::new();
    let body = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"v"}}"#;
    let (ok, out, err) = env.run(
        &[
            "create",
            "--raw",
            "/api/v1/namespaces/default/configmaps",
            "-f",
            "-",
        ],
        body,
    );
    assert!(ok, "{out}{err}");
    let o = owners(&env.configmap());
    assert_eq!(
        o,
        vec![(
            "kubectl".into(),
            "Update".into(),
            json!({"f:data": {".": {}, "f:k": {}}})
        )]
    );
}
