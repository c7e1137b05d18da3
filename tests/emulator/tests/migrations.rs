//! Live migrations as KubeVirt runs them: a VirtualMachineInstanceMigration's phases in
//! upstream's order (`VirtualMachineInstanceMigrationPhase`, `api/core/v1/types.go`) with the
//! VMI's `status.migrationState`; the evacuation controller's migration for a VMI marked for
//! eviction (`pkg/virt-controller/watch/drain/evacuation/evacuation.go`); and the
//! `evacuate/cancel` subresource (`pkg/virt-api/rest/evacuate_cancel.go`).

use kube::client::Body;
use kubevm_emulator::{Emulator, EmulatorOptions};
use serde_json::{Value, json};
use std::time::Duration;

async fn start() -> (Emulator, kube::Client) {
    let fixture = std::fs::read_to_string(format!(
        "{}/../fixtures/kubevirt.yaml",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![fixture],
        import_step: Duration::from_millis(50),
        ..Default::default()
    })
    .await
    .unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&emu.kubeconfig_yaml()).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.default_retry = false;
    let client = kube::Client::try_from(cfg).unwrap();
    (emu, client)
}

async fn send(client: &kube::Client, method: &str, path: &str, body: &str) -> (u16, String) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(
            "content-type",
            if method == "PATCH" {
                "application/merge-patch+json"
            } else {
                "application/json"
            },
        )
        .body(Body::from(body.as_bytes().to_vec()))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect_bytes().await.unwrap();
    (code, String::from_utf8_lossy(&bytes).into_owned())
}

async fn get(client: &kube::Client, path: &str) -> Value {
    let (code, body) = send(client, "GET", path, "").await;
    assert_eq!(code, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls (bounded) until `f` returns Some: the emulator's controllers run in the background.
async fn until<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

const VMIS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances";
const VMIMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations";
const SUB: &str = "/apis/subresources.kubevirt.io/v1/namespaces/default";

#[tokio::test]
async fn a_migration_goes_through_upstreams_phases_and_fills_the_migration_state() {
    let (_emu, client) = start().await;
    let vmim = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": "move-web", "namespace": "default"}, "spec": {"vmiName": "web"}});
    let (code, body) = send(&client, "POST", VMIMS, &vmim.to_string()).await;
    assert_eq!(code, 201, "{body}");
    let done = until("the migration to end", async || {
        let m = get(&client, &format!("{VMIMS}/move-web")).await;
        matches!(m["status"]["phase"].as_str(), Some("Succeeded" | "Failed")).then_some(m)
    })
    .await;
    let phases: Vec<&str> = done["status"]["phaseTransitionTimestamps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["phase"].as_str().unwrap())
        .collect();
    // VirtualMachineInstanceMigrationPhase, in the order virt-controller moves through them.
    assert_eq!(
        phases,
        [
            "Pending",
            "Scheduling",
            "Scheduled",
            "PreparingTarget",
            "TargetReady",
            "Running",
            "Succeeded"
        ]
    );
    // Only upstream's fields (swagger v1.VirtualMachineInstanceMigrationState) in the copy.
    const UPSTREAM: &[&str] = &[
        "abortRequested",
        "abortStatus",
        "completed",
        "endTimestamp",
        "failed",
        "failureReason",
        "migrationConfiguration",
        "migrationNetworkType",
        "migrationPolicyName",
        "migrationUid",
        "mode",
        "sourceNode",
        "sourcePersistentStatePVCName",
        "sourcePod",
        "sourceState",
        "startTimestamp",
        "targetAttachmentPodUID",
        "targetCPUSet",
        "targetDirectMigrationNodePorts",
        "targetMemoryOverhead",
        "targetNode",
        "targetNodeAddress",
        "targetNodeDomainDetected",
        "targetNodeDomainReadyTimestamp",
        "targetNodeTopology",
        "targetPersistentStatePVCName",
        "targetPod",
        "targetState",
    ];
    for key in done["status"]["migrationState"].as_object().unwrap().keys() {
        assert!(
            UPSTREAM.contains(&key.as_str()),
            "{key} is no upstream field"
        );
    }
    let uid = done["metadata"]["uid"].as_str().unwrap();
    let vmi = get(&client, &format!("{VMIS}/web")).await;
    let state = &vmi["status"]["migrationState"];
    // VirtualMachineInstanceMigrationState fields (swagger v1.VirtualMachineInstanceMigrationState).
    assert_eq!(state["migrationUid"], uid);
    assert_eq!(state["sourceNode"], "node-1");
    assert_eq!(state["targetNode"], "node-2");
    assert_eq!(state["completed"], true);
    assert_eq!(state["mode"], "PreCopy");
    assert!(state["startTimestamp"].is_string() && state["endTimestamp"].is_string());
    assert_eq!(vmi["status"]["nodeName"], "node-2");
}

#[tokio::test]
async fn evacuation_migrates_a_marked_vmi_and_evacuate_cancel_takes_the_mark_away() {
    let (_emu, client) = start().await;
    // Without a mark, evacuate/cancel answers 200 and changes nothing.
    let (code, body) = send(
        &client,
        "PUT",
        &format!("{SUB}/virtualmachineinstances/web/evacuate/cancel"),
        r#"{"evacuationNodeName":"node-1"}"#,
    )
    .await;
    assert_eq!(code, 200, "{body}");

    // What virt-api's eviction admitter does when the launcher pod is evicted by a drain.
    let (code, body) = send(
        &client,
        "PATCH",
        &format!("{VMIS}/web/status"),
        r#"{"status":{"evacuationNodeName":"node-1"}}"#,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let evacuation = until("the evacuation migration", async || {
        let list = get(&client, VMIMS).await;
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["metadata"]["annotations"]["kubevirt.io/evacuationMigration"] == "node-1")
            .cloned()
    })
    .await;
    let name = evacuation["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("kubevirt-evacuation-"), "{name}");
    assert_eq!(evacuation["spec"]["vmiName"], "web");
    assert_eq!(evacuation["spec"]["priority"], "system-critical");
    assert_eq!(
        evacuation["metadata"]["labels"]["kubevirt.io/vmi-name"],
        "web"
    );

    // The body must name the node the VMI is evacuated from: a failed JSON patch test is a 500.
    let path = format!("{SUB}/virtualmachines/web/evacuate/cancel");
    let (code, body) = send(&client, "PUT", &path, r#"{"evacuationNodeName":"node-2"}"#).await;
    assert_eq!(code, 500, "{body}");
    let (code, _) = send(&client, "PUT", &path, "").await;
    assert_eq!(code, 500);
    // A dry run changes nothing.
    let (code, body) = send(
        &client,
        "PUT",
        &path,
        r#"{"evacuationNodeName":"node-1","dryRun":["All"]}"#,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let vmi = get(&client, &format!("{VMIS}/web")).await;
    assert_eq!(vmi["status"]["evacuationNodeName"], "node-1");
    let (code, body) = send(&client, "PUT", &path, r#"{"evacuationNodeName":"node-1"}"#).await;
    assert_eq!(code, 200, "{body}");
    let vmi = get(&client, &format!("{VMIS}/web")).await;
    assert!(vmi["status"].get("evacuationNodeName").is_none(), "{vmi}");

    // A VM that does not exist is a 404 naming it.
    let (code, body) = send(
        &client,
        "PUT",
        &format!("{SUB}/virtualmachines/nope/evacuate/cancel"),
        "{}",
    )
    .await;
    assert_eq!(code, 404, "{body}");
}

#[tokio::test]
async fn evacuate_cancel_is_refused_while_the_node_carries_the_drain_taint() {
    let (_emu, client) = start().await;
    let (code, body) = send(
        &client,
        "PATCH",
        "/api/v1/nodes/node-1",
        r#"{"spec":{"taints":[{"key":"kubevirt.io/drain","effect":"NoSchedule"}]}}"#,
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = send(
        &client,
        "PUT",
        &format!("{SUB}/virtualmachineinstances/web/evacuate/cancel"),
        r#"{"evacuationNodeName":"node-1"}"#,
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains(
            "Node \\\"node-1\\\" has NodeDrainTaintKey \\\"kubevirt.io/drain:NoSchedule\\\""
        ),
        "{body}"
    );
}

/// `memorydump` / `removememorydump` as virt-api validates them
/// (`pkg/virt-api/rest/memorydump.go`) and the request's phases (`pkg/storage/memorydump`).
#[tokio::test]
async fn memory_dump_requests_are_validated_and_go_through_their_phases() {
    let (_emu, client) = start().await;
    let dump = format!("{SUB}/virtualmachines/web/memorydump");
    let claim = |name: &str, size: &str| {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}})
        .to_string()
    };
    // Without the hotplug feature gate (the fixture's KubeVirt CR has it: take it away).
    let kv = get(&client, "/apis/kubevirt.io/v1/kubevirts").await;
    let kv_path = format!(
        "/apis/kubevirt.io/v1/namespaces/{}/kubevirts/{}",
        kv["items"][0]["metadata"]["namespace"].as_str().unwrap(),
        kv["items"][0]["metadata"]["name"].as_str().unwrap()
    );
    let gates = |g: &str| {
        format!(
            r#"{{"spec":{{"configuration":{{"developerConfiguration":{{"featureGates":[{g}]}}}}}}}}"#
        )
    };
    assert_eq!(send(&client, "PATCH", &kv_path, &gates("")).await.0, 200);
    let (code, body) = send(&client, "PUT", &dump, r#"{"claimName":"dump"}"#).await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains(
            "Enable DeclarativeHotplugVolumes or HotplugVolumes feature gate to use this API."
        ),
        "{body}"
    );
    assert_eq!(
        send(&client, "PATCH", &kv_path, &gates(r#""HotplugVolumes""#))
            .await
            .0,
        200
    );
    let (code, body) = send(&client, "PUT", &dump, "{}").await;
    assert_eq!(code, 400, "{body}");
    assert!(
        body.contains("Memory dump requires claim name to be set"),
        "{body}"
    );
    let (code, _) = send(&client, "PUT", &dump, r#"{"claimName":"dump"}"#).await;
    assert_eq!(code, 404);
    // web requests no memory: 100 MiB + 5.5% = 105.5 MiB, aligned up to 106 MiB.
    let pvcs = "/api/v1/namespaces/default/persistentvolumeclaims";
    assert_eq!(
        send(&client, "POST", pvcs, &claim("small", "100Mi"))
            .await
            .0,
        201
    );
    let (code, body) = send(&client, "PUT", &dump, r#"{"claimName":"small"}"#).await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body.contains(&format!("should be bigger then [{}]", 106 * 1024 * 1024)),
        "{body}"
    );
    assert_eq!(
        send(&client, "POST", pvcs, &claim("dump", "106Mi")).await.0,
        201
    );
    let (code, body) = send(&client, "PUT", &dump, r#"{"claimName":"dump"}"#).await;
    assert_eq!(code, 202, "{body}");
    let (code, body) = send(&client, "PUT", &dump, r#"{"claimName":"small"}"#).await;
    assert_eq!(code, 409, "{body}");
    let vms = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
    let done = until("the dump to complete", async || {
        let vm = get(&client, &format!("{vms}/web")).await;
        (vm["status"]["memoryDumpRequest"]["phase"] == "Completed")
            .then(|| vm["status"]["memoryDumpRequest"].clone())
    })
    .await;
    assert_eq!(done["claimName"], "dump");
    let file = done["fileName"].as_str().unwrap();
    assert!(
        file.starts_with("web-dump-") && file.ends_with(".memory.dump"),
        "{file}"
    );
    assert!(done["startTimestamp"].is_string() && done["endTimestamp"].is_string());
    // Remove: Dissociating, then the request is gone; a second remove finds none.
    let remove = format!("{SUB}/virtualmachines/web/removememorydump");
    assert_eq!(send(&client, "PUT", &remove, "").await.0, 202);
    until("the association to go", async || {
        let vm = get(&client, &format!("{vms}/web")).await;
        vm["status"]
            .get("memoryDumpRequest")
            .is_none()
            .then_some(())
    })
    .await;
    let (code, body) = send(&client, "PUT", &remove, "").await;
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("no association found"), "{body}");
}
