//! The serial console history in the launcher pod's `guest-console-log` container (kubevirt
//! `pkg/virt-controller/services/serialconsolelog.go`, `cmd/virt-tail/main.go`): present only
//! when the VM's serial console is logged, its log what the guest wrote, followed live.

use std::time::Duration;

use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, LogParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kubevm_emulator::ServeFlavor;
use serde_json::json;

use crate::common;

fn vm(name: &str, log: Option<bool>) -> DynamicObject {
    let mut devices = json!({});
    if let Some(on) = log {
        devices["logSerialConsole"] = json!(on);
    }
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": devices, "resources": {"requests": {"memory": "64Mi"}}}}}}
    }))
    .unwrap()
}

/// The running launcher pod of VM `name`, once there is one.
async fn launcher(pods: &Api<Pod>, name: &str) -> Pod {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let list = pods
            .list(&ListParams::default().labels("kubevirt.io=virt-launcher"))
            .await
            .unwrap();
        if let Some(p) = list.items.into_iter().find(|p| {
            p.metadata
                .name
                .as_deref()
                .unwrap_or("")
                .starts_with(&format!("virt-launcher-{name}-"))
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        }) {
            return p;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no running launcher pod for {name}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn lp(follow: bool) -> LogParams {
    LogParams {
        container: Some("guest-console-log".into()),
        follow,
        ..LogParams::default()
    }
}

#[tokio::test]
async fn guest_console_log_container_shows_the_serial_output() {
    let (emu, client) = common::start(ServeFlavor::KubeVirt).await;
    let gvk = GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachine");
    let vms: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ApiResource::from_gvk(&gvk));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    vms.create(&PostParams::default(), &vm("logged", None))
        .await
        .unwrap();
    vms.create(&PostParams::default(), &vm("quiet", Some(false)))
        .await
        .unwrap();

    // Logged by default (the fixture's KubeVirt CR does not disable it): a native sidecar.
    let pod = launcher(&pods, "logged").await;
    let name = pod.metadata.name.clone().unwrap();
    let spec = pod.spec.unwrap();
    let init = spec.init_containers.unwrap_or_default();
    let sidecar = init
        .iter()
        .find(|c| c.name == "guest-console-log")
        .expect("sidecar");
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    assert_eq!(
        sidecar.command.as_deref(),
        Some(&["/usr/bin/virt-tail".to_owned()][..])
    );
    let uid = pod.metadata.labels.unwrap()["kubevirt.io/created-by"].clone();
    assert_eq!(
        sidecar.args.as_deref().unwrap()[1],
        format!("/var/run/kubevirt-private/{uid}/virt-serial0-log")
    );

    // The guest's boot banner, as complete lines.
    let log = pods.logs(&name, &lp(false)).await.unwrap();
    assert!(
        log.contains("Emulated Linux guest (kubevm-emulator) ttyS0\n"),
        "{log:?}"
    );
    let stamped = pods
        .logs(
            &name,
            &LogParams {
                timestamps: true,
                ..lp(false)
            },
        )
        .await
        .unwrap();
    let first = stamped.lines().next().unwrap();
    assert!(first.split_once(' ').unwrap().0.ends_with('Z'), "{first}");

    // Followed: a line the guest writes later arrives on the open stream.
    let mut lines = pods.log_stream(&name, &lp(true)).await.unwrap().lines();
    let guest = emu.guest("default", "logged").unwrap().unwrap();
    // An empty login name: the terminal echoes the newline, completing the prompt's line. The
    // banner may be out before the prompt is: a newline typed before the prompt only makes an
    // empty line and the prompt is printed again unfinished, so the newline is typed again
    // whenever no line came for a while (a real user presses Enter again too).
    let enter = || {
        guest
            .serial()
            .input
            .send(bytes::Bytes::from_static(b"\r"))
            .unwrap()
    };
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        enter();
        loop {
            match tokio::time::timeout(Duration::from_millis(500), lines.try_next()).await {
                Ok(Ok(Some(line))) if line.starts_with("logged login: ") => return true,
                Ok(Ok(Some(_))) => {}
                Err(_) => enter(),
                Ok(Ok(None)) | Ok(Err(_)) => return false,
            }
        }
    })
    .await;
    assert_eq!(found, Ok(true));

    // Not logged: no container, and the server says so.
    let quiet = launcher(&pods, "quiet").await;
    let quiet_name = quiet.metadata.name.clone().unwrap();
    assert!(
        quiet
            .spec
            .unwrap()
            .init_containers
            .unwrap_or_default()
            .is_empty()
    );
    let err = pods.logs(&quiet_name, &lp(false)).await.unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "container guest-console-log is not valid for pod {quiet_name}"
        )),
        "{err}"
    );
    emu.shutdown().await;
}
