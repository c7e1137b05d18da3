//! `kubectl vm deps` (alias `objectgraph`) end to end on both platforms, on objects made by
//! `create` (with a user-data Secret), `snapshot create` and `expose`, with the same names in
//! two namespaces: each graph names only its own namespace's objects. Expected names come from
//! kubectl (what the cluster holds), not from the code under test.

use serde_json::Value;

use crate::common::{Env, fails, ok};

/// Cloud-config with a password: `create` keeps it in a Secret of its own.
const USER_DATA: &str = "#cloud-config\npassword: Deps-Secret-5521\nchpasswd: {expire: false}\n";

fn make(env: &Env, ns: &str, extra: bool) {
    let file = env.dir.path().join("user-data.yaml");
    std::fs::write(&file, USER_DATA).unwrap();
    ok(env.vm(&[
        "create",
        "app",
        "-n",
        ns,
        "--blank",
        "64Mi",
        "--no-platform-ssh",
        "--cloud-init",
        file.to_str().unwrap(),
        "--wait",
        "--timeout",
        "60s",
    ]));
    if extra {
        ok(env.vm(&["snapshot", "create", "app", "snap1", "-n", ns]));
        ok(env.vm(&["expose", "app", "-n", ns, "--port", "22"]));
    }
}

/// `(kind, name, namespace)` of every node of a JSON graph part, depth first.
fn nodes(part: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for n in part.as_array().into_iter().flatten() {
        let r = &n["objectReference"];
        out.push((
            r["kind"].as_str().unwrap().to_owned(),
            r["name"].as_str().unwrap().to_owned(),
            r["namespace"].as_str().unwrap_or("").to_owned(),
        ));
        out.extend(nodes(&n["children"]));
    }
    out
}

fn kubectl_names(env: &Env, what: &str, ns: &str) -> Vec<String> {
    ok(env.kubectl(&[
        "get",
        what,
        "-n",
        ns,
        "-l",
        "kubevm.io/vm=app",
        "-o",
        "name",
    ]))
    .lines()
    .map(|l| l.rsplit('/').next().unwrap().to_owned())
    .collect()
}

fn check(env: &Env, snapshot_kind: &str, disk_kind: &str) {
    make(env, "dev", true);
    make(env, "prod", false);
    let graph: Value = serde_json::from_str(&ok(env.vm(&[
        "objectgraph",
        "app",
        "-n",
        "dev",
        "-o",
        "json",
    ])))
    .unwrap();
    let depends = nodes(&graph["dependsOn"]);
    let dependents = nodes(&graph["dependents"]);
    // Everything in dev: same names in prod are not mixed in.
    for (kind, name, ns) in depends.iter().chain(&dependents) {
        assert!(
            ns == "dev" || ns.is_empty(),
            "{kind} {name} in {ns}: {graph:#}"
        );
    }
    // The user-data Secret create made (labelled for the VM), as kubectl lists it.
    let secrets = kubectl_names(env, "secrets", "dev");
    assert_eq!(secrets.len(), 1, "{secrets:?}");
    assert!(
        depends.contains(&("Secret".into(), secrets[0].clone(), "dev".into())),
        "{depends:?}"
    );
    assert!(
        depends.iter().any(|(k, _, _)| k == disk_kind),
        "{depends:?}"
    );
    assert!(
        depends.iter().any(|(k, _, _)| k == "PersistentVolumeClaim"),
        "{depends:?}"
    );
    assert!(depends.iter().any(|(k, _, _)| k == "Pod"), "{depends:?}");
    assert_eq!(
        dependents,
        [
            (
                snapshot_kind.to_owned(),
                "snap1".to_owned(),
                "dev".to_owned()
            ),
            (
                "Service".to_owned(),
                kubectl_names(env, "services", "dev")[0].clone(),
                "dev".to_owned()
            ),
        ]
    );
    // prod: its own Secret, nothing depends on it.
    let prod: Value =
        serde_json::from_str(&ok(env.vm(&["deps", "app", "-n", "prod", "-o", "json"]))).unwrap();
    assert!(nodes(&prod["dependents"]).is_empty(), "{prod:#}");
    let prod_secret = kubectl_names(env, "secrets", "prod")[0].clone();
    assert!(nodes(&prod["dependsOn"]).contains(&("Secret".into(), prod_secret, "prod".into())));
    // The tree names the same objects.
    let tree = ok(env.vm(&["deps", "app.dev"]));
    assert!(tree.starts_with("VirtualMachine."), "{tree}");
    assert!(tree.contains("├── depends on\n"), "{tree}");
    assert!(tree.contains("└── depended on by\n"), "{tree}");
    assert!(tree.contains(" snap1\n"), "{tree}");
    assert!(tree.contains(&format!("Secret {}\n", secrets[0])), "{tree}");
    // delete says what stays: the snapshot and the Service, not the Secret it deletes.
    let service = kubectl_names(env, "services", "dev")[0].clone();
    let out = env.vm(&["delete", "app", "-n", "dev", "-y"]);
    let said = crate::common::stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("\"snap1\" (refers to the VM, not deleted with it)\n"),
        "{said}"
    );
    assert!(
        said.contains(&format!(
            "Left in place: service {service:?} (refers to the VM, not deleted with it)\n"
        )),
        "{said}"
    );
    assert!(
        !said.contains(&format!("secret {:?}", secrets[0])),
        "{said}"
    );
    // Bad input before any request; a missing VM in one line.
    let err = fails(env, &["deps", "app", "-o", "wide"], 2);
    assert_eq!(err, "Error: -o takes yaml or json here");
    fails(env, &["deps", "nosuch", "-n", "dev"], 1);
}

#[test]
fn kubevirt_deps_of_a_created_vm() {
    check(&Env::kubevirt(), "VirtualMachineSnapshot", "DataVolume");
}

#[test]
fn deckhouse_deps_of_a_created_vm() {
    check(&Env::deckhouse(), "VirtualMachineSnapshot", "VirtualDisk");
}

#[test]
fn kubevirt_objectgraph_subresource_where_served() {
    let env = Env::kubevirt();
    make(&env, "dev", true);
    let computed: Value =
        serde_json::from_str(&ok(env.vm(&["deps", "app", "-n", "dev", "-o", "json"]))).unwrap();
    // With KubeVirt's ObjectGraph feature gate the platform's answer is used.
    ok(env.kubectl(&[
        "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=merge", "-p",
        r#"{"spec":{"configuration":{"developerConfiguration":{"featureGates":["Snapshot","HotplugVolumes","ObjectGraph"]}}}}"#,
    ]));
    env.emulator.clear_requests();
    let served: Value =
        serde_json::from_str(&ok(env.vm(&["deps", "app", "-n", "dev", "-o", "json"]))).unwrap();
    let asked = env
        .emulator
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/virtualmachines/app/objectgraph"))
        .expect("objectgraph requested");
    assert_eq!(
        (asked.method.as_str(), asked.status),
        ("GET", 200),
        "{}",
        asked.path
    );
    assert_eq!(
        asked.path,
        "/apis/subresources.kubevirt.io/v1/namespaces/dev/virtualmachines/app/objectgraph"
    );
    assert_eq!(nodes(&served["dependsOn"]), nodes(&computed["dependsOn"]));
    assert_eq!(served["dependents"], computed["dependents"]);
}
