//! Chunked lists and expired resource versions, through kube-rs and real kubectl.

use futures::StreamExt;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, WatchEvent, WatchParams,
};
use kubevm_emulator::{Emulator, EmulatorOptions};
use serde_json::json;

use crate::common;
use common::client;

fn vm(ns: &str, name: &str) -> serde_json::Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}})
}

fn vms(client: kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine"),
        "virtualmachines",
    );
    Api::all_with(client, &ar)
}

#[tokio::test]
async fn list_in_chunks_then_expired_continue_is_gone() {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    for ns in ["a", "b"] {
        for i in 0..3 {
            emu.put_object(vm(ns, &format!("vm-{i}")));
        }
    }
    let api = vms(client(&emu).await);
    let first = api.list(&ListParams::default().limit(4)).await.unwrap();
    let names: Vec<String> = first
        .items
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o.metadata.namespace.as_deref().unwrap(),
                o.metadata.name.as_deref().unwrap()
            )
        })
        .collect();
    assert_eq!(names, ["a/vm-0", "a/vm-1", "a/vm-2", "b/vm-0"]);
    assert_eq!(first.metadata.remaining_item_count, Some(2));
    let token = first.metadata.continue_.clone().unwrap();
    // A change between chunks does not change the list's resourceVersion.
    emu.put_object(vm("c", "late"));
    let second = api
        .list(&ListParams::default().limit(4).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    assert_eq!(second.items[0].metadata.name.as_deref(), Some("vm-1"));
    assert_eq!(second.metadata.continue_, None);

    emu.expire_resource_versions();
    let err = api
        .list(&ListParams::default().limit(4).continue_token(&token))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
            assert!(
                s.message
                    .starts_with("The provided continue parameter is too old"),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn expiry_ends_open_watches_and_old_versions_are_gone() {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    emu.put_object(vm("a", "one"));
    let api = vms(client(&emu).await);
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut stream = api
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .unwrap()
        .boxed();
    emu.put_object(vm("a", "two"));
    assert!(matches!(
        stream.next().await,
        Some(Ok(WatchEvent::Added(_)))
    ));
    emu.expire_resource_versions();
    let end = tokio::time::timeout(std::time::Duration::from_secs(30), stream.next())
        .await
        .expect("the open watch ends");
    assert!(end.is_none(), "{end:?}");
    // Re-watching from the old resourceVersion: an ERROR event with 410 Expired.
    let mut again = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match again.next().await {
        Some(Ok(WatchEvent::Error(e))) => {
            assert_eq!(e.code, 410);
            assert!(
                e.message.starts_with("too old resource version"),
                "{}",
                e.message
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reads_a_chunked_list() {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    for i in 0..5 {
        emu.put_object(vm("a", &format!("vm-{i}")));
    }
    let dir = tempfile::tempdir().unwrap();
    emu.write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap();
    let kubectl = std::env::var_os("KUBECTL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools/bin/kubectl")
        });
    let path = dir.path().to_owned();
    emu.clear_requests();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(path.join("kubeconfig"))
            .arg("--cache-dir")
            .arg(path.join("cache"))
            .args(["get", "vm", "-n", "a", "--chunk-size=2", "-o", "name"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "virtualmachine.kubevirt.io/vm-0\nvirtualmachine.kubevirt.io/vm-1\nvirtualmachine.kubevirt.io/vm-2\nvirtualmachine.kubevirt.io/vm-3\nvirtualmachine.kubevirt.io/vm-4\n"
    );
    let pages = emu
        .requests()
        .iter()
        .filter(|r| r.path == "/apis/kubevirt.io/v1/namespaces/a/virtualmachines")
        .count();
    assert_eq!(pages, 3, "5 VMs in chunks of 2");
}
