//! `instancetype list`, `preference list` (KubeVirt) and `class list` (Deckhouse): the sizes as
//! kubectl shows the same objects, and each platform told where the other's sizes live.

use serde_json::json;

use crate::common::{Env, fails, ok, table};

fn create(env: &Env, obj: serde_json::Value) {
    let file = env.dir.path().join(format!(
        "{}.json",
        obj["metadata"]["name"].as_str().unwrap()
    ));
    std::fs::write(&file, obj.to_string()).unwrap();
    ok(env.kubectl(&["create", "-f", file.to_str().unwrap()]));
}

#[test]
fn kubevirt_instance_types_and_preferences_are_listed_cluster_wide_and_namespaced() {
    let env = Env::kubevirt();
    let it = "instancetype.kubevirt.io/v1beta1";
    create(
        &env,
        json!({"apiVersion": it, "kind": "VirtualMachineClusterInstancetype",
        "metadata": {"name": "u1.medium"}, "spec": {"cpu": {"guest": 1}, "memory": {"guest": "4Gi"}}}),
    );
    create(
        &env,
        json!({"apiVersion": it, "kind": "VirtualMachineInstancetype",
        "metadata": {"name": "big", "namespace": "dev"}, "spec": {"cpu": {"guest": 8}, "memory": {"guest": "32Gi"}}}),
    );
    create(
        &env,
        json!({"apiVersion": it, "kind": "VirtualMachinePreference",
        "metadata": {"name": "fedora", "namespace": "default"},
        "spec": {"devices": {"preferredDiskBus": "virtio"}, "firmware": {"preferredUseEfi": true}}}),
    );
    // The default namespace: the cluster-wide type only.
    let rows = table(&ok(env.vm(&["instancetype", "list"])));
    assert_eq!(
        rows[0],
        ["NAMESPACE", "NAME", "SCOPE", "CPU", "MEMORY", "AGE"]
    );
    assert_eq!(rows[1][..5], ["<none>", "u1.medium", "cluster", "1", "4Gi"]);
    assert_eq!(rows.len(), 2);
    // -A adds dev's; -o name as kubectl prints the same objects.
    let names = ok(env.vm(&["instancetype", "list", "-A", "-o", "name"]));
    let mut theirs = ok(env.kubectl(&["get", "virtualmachineclusterinstancetypes", "-o", "name"]));
    theirs.push_str(&ok(env.kubectl(&[
        "get",
        "virtualmachineinstancetypes",
        "-A",
        "-o",
        "name",
    ])));
    assert_eq!(names, theirs);
    let rows = table(&ok(env.vm(&["preference", "list"])));
    assert_eq!(
        rows[1][..4],
        [
            "default",
            "fedora",
            "namespaced",
            "devices.preferredDiskBus=virtio;"
        ]
    );
    assert_eq!(rows[1][4], "firmware.preferredUseEfi=true");
    let err = fails(&env, &["class", "list"], 1);
    assert!(
        err.contains("VirtualMachineClasses are Deckhouse's"),
        "{err}"
    );
}

#[test]
fn deckhouse_classes_show_their_policies_and_the_default() {
    let env = Env::deckhouse();
    let rows = table(&ok(env.vm(&["class", "list", "-o", "wide"])));
    // tests/fixtures/deckhouse.yaml: class generic, the default, three policies.
    let generic = rows.iter().find(|r| r[0] == "generic").unwrap();
    assert_eq!(generic[1..4], ["true", "Discovery", "Ready"]);
    let line = generic[4..].join(" ");
    assert!(
        line.starts_with("cores 1-4: memory 1Gi-8Gi, fractions 5%,10%,20%,50%,100%; cores 5-8:"),
        "{line}"
    );
    assert!(
        line.contains("cores 9-16: memory 9Gi-32Gi, fractions 50%,100%"),
        "{line}"
    );
    assert_eq!(
        ok(env.vm(&["class", "list", "-o", "name"])),
        ok(env.kubectl(&["get", "virtualmachineclasses", "-o", "name"]))
    );
    let err = fails(&env, &["instancetype", "list"], 1);
    assert!(err.contains("instance types are KubeVirt's"), "{err}");
}
