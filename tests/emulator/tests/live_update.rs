//! Changing running VMs (src/live_update.rs): KubeVirt hot-plugs CPU sockets and guest memory
//! within the VMI's maxSockets/maxGuest under `vmRolloutStrategy: LiveUpdate` and sets
//! `RestartRequired` with virt-controller's messages otherwise (kubevirt
//! pkg/virt-controller/watch/vm/vm.go); Deckhouse lists changes that wait for a restart in
//! `status.restartAwaitingChanges` with `AwaitingRestartToApplyConfiguration`
//! (virtualization-controller pkg/controller/vm/internal/sync_kvvm.go, pkg/controller/vmchange).
//! And the optimistic concurrency `set` relies on: a write carrying a stale resourceVersion
//! gets 409 Conflict, also when a held request resumes after someone else's change.

use futures::{StreamExt, TryStreamExt};
use kube::Api;
use kube::api::{
    ApiResource, DynamicObject, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kubevm_emulator::ServeFlavor;
use serde_json::{Value, json};

use crate::common::start;

fn kubevirt(client: &kube::Client, plural: &str, kind: &str) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "kubevirt.io".into(),
        version: "v1".into(),
        api_version: "kubevirt.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(client.clone(), "default", &ar)
}

fn deckhouse_vms(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "virtualization.deckhouse.io".into(),
        version: "v1alpha2".into(),
        api_version: "virtualization.deckhouse.io/v1alpha2".into(),
        kind: "VirtualMachine".into(),
        plural: "virtualmachines".into(),
    };
    Api::namespaced_with(client.clone(), "default", &ar)
}

/// Merge-patch `name` and wait (on a watch) until its controller observed the new generation.
async fn change(api: &Api<DynamicObject>, name: &str, patch: Value) -> Value {
    let written = api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let generation = written.metadata.generation.unwrap();
    let rv = written.metadata.resource_version.clone().unwrap();
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut events = api.watch(&params, &rv).await.unwrap().boxed();
    while let Some(event) = events.try_next().await.unwrap() {
        if let WatchEvent::Modified(o) = event {
            let o = serde_json::to_value(o).unwrap();
            if o["status"]["observedGeneration"].as_i64() >= Some(generation) {
                return o;
            }
        }
    }
    panic!("the watch ended before generation {generation} was observed");
}

fn condition<'a>(vm: &'a Value, type_: &str) -> Option<&'a Value> {
    vm["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

async fn vmi(client: &kube::Client) -> Value {
    let o = kubevirt(client, "virtualmachineinstances", "VirtualMachineInstance")
        .get("web")
        .await
        .unwrap();
    serde_json::to_value(o).unwrap()
}

#[tokio::test]
async fn kubevirt_hotplugs_sockets_and_memory_within_the_headroom() {
    let (_emu, client) = start(ServeFlavor::KubeVirt).await;
    let vms = kubevirt(&client, "virtualmachines", "VirtualMachine");
    // web: 1 socket × 2 cores, 2Gi; LiveUpdate by default: maxSockets 4, maxGuest 8Gi.
    let vm = change(
        &vms,
        "web",
        json!({"spec": {"template": {"spec": {"domain": {
        "cpu": {"sockets": 2}, "memory": {"guest": "4Gi"}}}}}}),
    )
    .await;
    assert!(condition(&vm, "RestartRequired").is_none(), "{vm:#}");
    let running = vmi(&client).await;
    assert_eq!(running["spec"]["domain"]["cpu"]["sockets"], 2);
    assert_eq!(running["spec"]["domain"]["cpu"]["maxSockets"], 4);
    assert_eq!(running["status"]["memory"]["guestCurrent"], "4Gi");
    assert_eq!(running["status"]["memory"]["guestAtBoot"], "2Gi");
    // Beyond maxGuest: waits for a restart, with upstream's message; the VMI keeps 4Gi.
    let vm = change(
        &vms,
        "web",
        json!({"spec": {"template": {"spec": {"domain": {
        "memory": {"guest": "16Gi"}}}}}}),
    )
    .await;
    let c = condition(&vm, "RestartRequired").expect("RestartRequired");
    assert_eq!(c["status"], "True");
    assert_eq!(
        c["message"],
        "memory updated in template spec to a value higher than what's available"
    );
    assert_eq!(
        vmi(&client).await["spec"]["domain"]["memory"]["guest"],
        "4Gi"
    );
    // Back within bounds, then fewer sockets: a reduction waits for a restart.
    change(
        &vms,
        "web",
        json!({"spec": {"template": {"spec": {"domain": {"memory": {"guest": "4Gi"}}}}}}),
    )
    .await;
    let vm = change(
        &vms,
        "web",
        json!({"spec": {"template": {"spec": {"domain": {"cpu": {"sockets": 1}}}}}}),
    )
    .await;
    assert_eq!(
        condition(&vm, "RestartRequired").unwrap()["message"],
        "Reduction of CPU socket count requires a restart"
    );
}

#[tokio::test]
async fn kubevirt_non_live_fields_and_the_stage_strategy_require_a_restart() {
    let (_emu, client) = start(ServeFlavor::KubeVirt).await;
    let vms = kubevirt(&client, "virtualmachines", "VirtualMachine");
    // The eviction strategy is not live-updatable.
    let vm = change(
        &vms,
        "web",
        json!({"spec": {"template": {"spec": {"evictionStrategy": "LiveMigrate"}}}}),
    )
    .await;
    assert_eq!(
        condition(&vm, "RestartRequired").unwrap()["message"],
        "a non-live-updatable field was changed in the template spec"
    );
    // Template labels are not part of the comparison (only the template's spec is).
    let (_emu2, client2) = start(ServeFlavor::KubeVirt).await;
    let vms2 = kubevirt(&client2, "virtualmachines", "VirtualMachine");
    let vm = change(
        &vms2,
        "web",
        json!({"spec": {"template": {"metadata": {"labels": {"team": "x"}}}}}),
    )
    .await;
    assert!(condition(&vm, "RestartRequired").is_none(), "{vm:#}");
    // vmRolloutStrategy Stage: sockets are compared too, so any change waits.
    let ar = ApiResource {
        group: "kubevirt.io".into(),
        version: "v1".into(),
        api_version: "kubevirt.io/v1".into(),
        kind: "KubeVirt".into(),
        plural: "kubevirts".into(),
    };
    let kv = Api::<DynamicObject>::namespaced_with(client2.clone(), "kubevirt", &ar);
    kv.patch(
        "kubevirt",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"configuration": {"vmRolloutStrategy": "Stage"}}})),
    )
    .await
    .unwrap();
    let vm = change(
        &vms2,
        "web",
        json!({"spec": {"template": {"spec": {"domain": {"cpu": {"sockets": 2}}}}}}),
    )
    .await;
    assert_eq!(
        condition(&vm, "RestartRequired").unwrap()["message"],
        "a non-live-updatable field was changed in the template spec"
    );
}

#[tokio::test]
async fn deckhouse_reports_changes_awaiting_a_restart() {
    let (_emu, client) = start(ServeFlavor::Deckhouse).await;
    let vms = deckhouse_vms(&client);
    // runPolicy applies at once.
    let vm = change(&vms, "linux-vm", json!({"spec": {"runPolicy": "AlwaysOn"}})).await;
    assert!(
        condition(&vm, "AwaitingRestartToApplyConfiguration").is_none(),
        "{vm:#}"
    );
    assert!(vm["status"].get("restartAwaitingChanges").is_none());
    // Cores and memory wait (the hotplug feature gates are off by default).
    let vm = change(
        &vms,
        "linux-vm",
        json!({"spec": {"cpu": {"cores": 2}, "memory": {"size": "2Gi"}}}),
    )
    .await;
    let c = condition(&vm, "AwaitingRestartToApplyConfiguration").expect("condition");
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], "ChangesPendingRestart");
    assert_eq!(
        vm["status"]["restartAwaitingChanges"],
        json!([
            {"operation": "replace", "path": "cpu.cores", "currentValue": 1, "desiredValue": 2},
            {"operation": "replace", "path": "memory.size", "currentValue": "1Gi", "desiredValue": "2Gi"}
        ])
    );
    // The machine still runs with what it started with.
    assert_eq!(vm["status"]["resources"]["cpu"]["cores"], 1);
    // Undoing the change clears it.
    let vm = change(
        &vms,
        "linux-vm",
        json!({"spec": {"cpu": {"cores": 1}, "memory": {"size": "1Gi"}}}),
    )
    .await;
    assert!(
        condition(&vm, "AwaitingRestartToApplyConfiguration").is_none(),
        "{vm:#}"
    );
}

#[tokio::test]
async fn a_write_with_a_stale_resource_version_conflicts_even_after_a_hold() {
    let (emu, client) = start(ServeFlavor::KubeVirt).await;
    let vms = kubevirt(&client, "virtualmachines", "VirtualMachine");
    let read = vms.get("web").await.unwrap();
    // The update is held; meanwhile someone else changes the VM.
    emu.hold("update", "virtualmachines");
    let mut mine = read.clone();
    mine.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("mine".into(), "1".into());
    let vms2 = vms.clone();
    let put = tokio::spawn(async move { vms2.replace("web", &PostParams::default(), &mine).await });
    while emu.held() == 0 {
        tokio::task::yield_now().await;
    }
    vms.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"theirs": "1"}}})),
    )
    .await
    .unwrap();
    emu.release_held();
    match put.await.unwrap() {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "Conflict")),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let now = vms.get("web").await.unwrap();
    assert_eq!(
        now.metadata
            .labels
            .unwrap()
            .get("theirs")
            .map(String::as_str),
        Some("1")
    );
}
