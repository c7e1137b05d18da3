//! The emulator's pod logs, pods/exec over v5.channel.k8s.io and guest-agent subresources,
//! driven by kube-rs (the client kubectl-vm uses), and the exec denial for a read-only user.

use futures::AsyncBufReadExt;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams, LogParams};
use kubevm_emulator::{Emulator, EmulatorOptions};
use tokio::io::AsyncReadExt;

fn fixtures() -> Vec<String> {
    ["kubevirt.yaml", "debug-kubevirt.yaml"]
        .iter()
        .map(|f| {
            std::fs::read_to_string(format!("{}/../fixtures/{f}", env!("CARGO_MANIFEST_DIR")))
                .unwrap()
        })
        .collect()
}

async fn client(emu: &Emulator, context: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&emu.kubeconfig_yaml()).unwrap();
    let options = kube::config::KubeConfigOptions {
        context: Some(context.into()),
        ..Default::default()
    };
    let cfg = kube::Config::from_custom_kubeconfig(kc, &options)
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

#[tokio::test]
async fn exec_logs_and_guest_agent() {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: fixtures(),
        ..Default::default()
    })
    .await
    .unwrap();
    let admin = client(&emu, "emulator").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "dev");

    // virsh dumpxml in compute: stdout carries the XML, the status channel says Success.
    let params = AttachParams::default()
        .container("compute")
        .stdin(false)
        .stdout(true)
        .stderr(true);
    let mut p = pods
        .exec(
            "virt-launcher-app-new22",
            ["virsh", "dumpxml", "dev_app"],
            &params,
        )
        .await
        .unwrap();
    let status = p.take_status().unwrap();
    let mut xml = String::new();
    p.stdout().unwrap().read_to_string(&mut xml).await.unwrap();
    let status = status.await.unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"));
    assert!(
        xml.starts_with("<domain type='kvm'") && xml.contains("<name>dev_app</name>"),
        "{xml}"
    );

    // The hang switch: the exec is accepted, then nothing comes and the stream stays open.
    emu.set_exec_hangs(true);
    let mut p = pods
        .exec(
            "virt-launcher-app-new22",
            ["virsh", "dumpxml", "dev_app"],
            &params,
        )
        .await
        .unwrap();
    let mut out = p.stdout().unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(std::time::Duration::from_millis(500), out.read(&mut byte));
    // This wait holds time: nothing may arrive within it.
    assert!(read.await.is_err(), "a hung exec says nothing");
    drop(out);
    p.abort();
    emu.set_exec_hangs(false);

    // A wrong domain: virsh's error on stderr, exit code 1 in the Status.
    let mut p = pods
        .exec(
            "virt-launcher-app-new22",
            ["virsh", "dumpxml", "other"],
            &params,
        )
        .await
        .unwrap();
    let status = p.take_status().unwrap();
    let mut err = String::new();
    p.stderr().unwrap().read_to_string(&mut err).await.unwrap();
    let status = status.await.unwrap();
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    assert_eq!(err, "error: failed to get domain 'other'\n");

    // No container named and two containers: the API server's 400.
    let e = pods
        .exec(
            "virt-launcher-app-new22",
            ["true"],
            &AttachParams::default().stdin(false),
        )
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("a container name must be specified for pod virt-launcher-app-new22"),
        "{e}"
    );

    // Logs: previous needs a restart; tailLines.
    let lp = |c: &str, previous: bool| LogParams {
        container: Some(c.into()),
        previous,
        tail_lines: Some(1),
        ..Default::default()
    };
    let text = pods
        .logs("virt-launcher-broken-c4sh1", &lp("compute", true))
        .await
        .unwrap();
    assert!(text.contains("Failed to start the domain"), "{text}");
    let e = pods
        .logs("virt-launcher-app-new22", &lp("compute", true))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "previous terminated container \"compute\" in pod \"virt-launcher-app-new22\" not found"
        ),
        "{e}"
    );
    let lines: Vec<String> = pods
        .log_stream("virt-launcher-app-new22", &lp("compute", false))
        .await
        .unwrap()
        .lines()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(lines.len(), 1);

    // Guest agent subresources.
    let req = http::Request::get(
        "/apis/subresources.kubevirt.io/v1/namespaces/dev/virtualmachineinstances/app/userlist",
    )
    .body(Vec::new())
    .unwrap();
    let users: serde_json::Value = admin.request(req).await.unwrap();
    assert_eq!(users["items"][0]["userName"], "fedora");
    let req = http::Request::get("/apis/subresources.kubevirt.io/v1/namespaces/dev/virtualmachineinstances/broken/guestosinfo")
        .body(Vec::new())
        .unwrap();
    let e = admin.request::<serde_json::Value>(req).await.unwrap_err();
    assert!(e.to_string().contains("VMI is not running"), "{e}");

    // alice may read pods in dev but not exec: the websocket GET is authorized as `get` on
    // pods/exec (RequestInfo), then as `create` (since Kubernetes 1.35, feature
    // AuthorizePodWebsocketUpgradeCreatePermission); the `edit` ClusterRole grants both.
    let alice: Api<Pod> = Api::namespaced(client(&emu, "emulator-restricted").await, "dev");
    let exec = || async {
        alice
            .exec(
                "virt-launcher-app-new22",
                ["virsh", "dumpxml", "dev_app"],
                &params,
            )
            .await
            .err()
            .unwrap()
    };
    let e = exec().await;
    assert!(
        e.to_string().contains("cannot get resource \"pods/exec\""),
        "{e}"
    );
    let rbac = "rbac.authorization.k8s.io";
    emu.put_object(
        serde_json::json!({"apiVersion": format!("{rbac}/v1"), "kind": "Role",
        "metadata": {"name": "exec-get", "namespace": "dev"},
        "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get"]}]}),
    );
    emu.put_object(
        serde_json::json!({"apiVersion": format!("{rbac}/v1"), "kind": "RoleBinding",
        "metadata": {"name": "exec-get", "namespace": "dev"},
        "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "exec-get"},
        "subjects": [{"apiGroup": rbac, "kind": "User", "name": "alice"}]}),
    );
    let e = exec().await;
    assert!(
        e.to_string()
            .contains("cannot create resource \"pods/exec\""),
        "{e}"
    );
}
