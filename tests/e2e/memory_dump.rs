//! `memory-dump get|remove` on KubeVirt (the claim virtctl would make, the subresource
//! requests, progress to Completed) and its refusal on Deckhouse, which has no memory dump.

use serde_json::{Value, json};

use crate::common::{Env, fails, ok, stderr};
use crate::lifecycle::{apply, changes, eventually};

const SUB: &str = "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines";

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

#[test]
fn get_creates_a_claim_sized_like_virtctl_waits_for_completion_and_remove_dissociates() {
    let env = Env::kubevirt();
    let out = env.vm(&[
        "memory-dump",
        "get",
        "web",
        "--claim-name",
        "web-dump",
        "--create-claim",
    ]);
    let line = ok(out);
    let vm = kubectl_json(&env, &["get", "vm", "web"]);
    let req = &vm["status"]["memoryDumpRequest"];
    assert_eq!(req["phase"], "Completed");
    assert_eq!(req["claimName"], "web-dump");
    assert_eq!(
        line,
        format!(
            "memory dump of web completed: {} in claim web-dump\n",
            req["fileName"].as_str().unwrap()
        )
    );
    // web's VMI requests no memory: (0 + 100 MiB) × 1.055 = 105.5 MiB, rounded up to 106 MiB
    // (virtctl: CalcExpectedMemoryDumpSize, default 5.5% filesystem overhead, 1 MiB alignment).
    let pvc = kubectl_json(&env, &["get", "pvc", "web-dump"]);
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "106Mi");
    assert_eq!(pvc["spec"]["accessModes"], json!(["ReadWriteOnce"]));
    assert_eq!(
        pvc["metadata"]["labels"]["cdi.kubevirt.io/applyStorageProfile"],
        "true"
    );
    let puts: Vec<(String, Option<Value>)> = changes(&env)
        .into_iter()
        .filter(|r| r.path.starts_with("/apis/subresources.kubevirt.io/"))
        .map(|r| (r.path.clone(), r.json()))
        .collect();
    assert_eq!(
        puts,
        [(
            format!("{SUB}/web/memorydump"),
            Some(json!({"claimName": "web-dump"}))
        )]
    );

    // A second --create-claim while a dump is associated is refused before anything is made.
    let err = fails(
        &env,
        &[
            "memory-dump",
            "get",
            "web",
            "--claim-name",
            "other",
            "--create-claim",
        ],
        1,
    );
    assert!(err.contains("still has a memory dump associated"), "{err}");

    env.emulator.clear_requests();
    assert_eq!(
        ok(env.vm(&["memory-dump", "remove", "web"])),
        "memory dump of web removed (claim web-dump kept)\n"
    );
    let vm = kubectl_json(&env, &["get", "vm", "web"]);
    assert!(vm["status"].get("memoryDumpRequest").is_none(), "{vm}");
    let wire: Vec<(String, String)> = changes(&env)
        .into_iter()
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    assert_eq!(
        wire,
        [("PUT".to_owned(), format!("{SUB}/web/removememorydump"))]
    );
    // Nothing left to remove: the server's conflict, exit 1.
    let err = fails(&env, &["memory-dump", "remove", "web"], 1);
    assert!(err.contains("no association found"), "{err}");
}

#[test]
fn the_claim_grows_with_the_memory_request_and_no_wait_returns_at_once() {
    let env = Env::kubevirt();
    apply(
        &env,
        &[
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "big", "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {},
            "resources": {"requests": {"memory": "2Gi"}}}}}}}),
        ],
    );
    eventually("big to run", || {
        env.emulator
            .objects("kubevirt.io", "virtualmachineinstances", Some("default"))
            .iter()
            .any(|v| v["metadata"]["name"] == "big" && v["status"]["phase"] == "Running")
    });
    let out = env.vm(&[
        "memory-dump",
        "get",
        "big",
        "--claim-name",
        "big-dump",
        "--create-claim",
        "--no-wait",
    ]);
    assert_eq!(
        ok(out),
        "memory dump of big requested into claim big-dump\n"
    );
    // (2048 + 100) MiB × 1.055 = 2266.14 MiB → 2267 MiB.
    let pvc = kubectl_json(&env, &["get", "pvc", "big-dump"]);
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "2267Mi");
}

#[test]
fn deckhouse_refuses_in_one_line() {
    let env = Env::deckhouse();
    for args in [
        &[
            "memory-dump",
            "get",
            "linux-vm",
            "--claim-name",
            "d",
            "--create-claim",
        ][..],
        &["memory-dump", "remove", "linux-vm"][..],
    ] {
        let err = fails(&env, args, 2);
        assert!(
            err.starts_with(
                "Error: memory-dump needs KubeVirt: Deckhouse virtualization offers no memory dump"
            ),
            "{err}"
        );
    }
    assert!(changes(&env).is_empty());
}

#[test]
fn bad_input_is_refused_before_any_request() {
    let env = Env::kubevirt();
    for args in [
        &["memory-dump", "get", "Bad_Name!", "--claim-name", "d"][..],
        &["memory-dump", "get", "web", "--claim-name", "Bad_Claim"][..],
        &[
            "memory-dump",
            "get",
            "web",
            "--claim-name",
            "d",
            "--create-claim",
            "--access-mode",
            "ReadOnlyMany",
        ][..],
        &[
            "memory-dump",
            "get",
            "web",
            "--claim-name",
            "d",
            "--create-claim",
            "--storage-class",
            "Bad_SC",
        ][..],
        &["memory-dump", "remove", "web.Bad_NS"][..],
    ] {
        fails(&env, args, 2);
    }
    for args in [
        &["memory-dump", "get", "web", "--create-claim"][..],
        &[
            "memory-dump",
            "get",
            "web",
            "--access-mode",
            "ReadWriteOnce",
        ][..],
        &["memory-dump", "nosuch", "web"][..],
    ] {
        let out = env.vm(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    assert!(
        env.emulator.requests().is_empty(),
        "{:?}",
        env.emulator.requests()
    );
}
