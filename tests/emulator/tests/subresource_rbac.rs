//! RBAC decides every request, subresources of the aggregated VM APIs included, with the
//! attributes kube-apiserver derives from the URL and the method before it proxies to virt-api
//! or Deckhouse's virtualization-api (k8s.io/apiserver/pkg/endpoints/request/requestinfo.go:
//! GET of a named object is `get`, a websocket upgrade too; PUT `update`; the first segment
//! after the name is the subresource, so `vnc/screenshot` is `vnc`). The grants follow the
//! platforms' own roles: KubeVirt's `kubevirt.io:edit` gives `get` on
//! `virtualmachineinstances/console|vnc|portforward` and `update` on `virtualmachines/stop`
//! (pkg/virt-operator/resource/generate/rbac/cluster.go); Deckhouse's `access_console`
//! capability get/create/update on `virtualmachines/console|vnc`
//! (deckhouse/virtualization templates/rbacv2/use/capabilities/access_console.yaml).

use crate::common::{dial, fixture};
use kube::client::Body;
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};

async fn emulator(flavor: ServeFlavor, file: &str) -> Emulator {
    Emulator::start(EmulatorOptions {
        fixture_yaml: vec![fixture(file)],
        flavor,
        ..Default::default()
    })
    .await
    .unwrap()
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

/// The websocket's answer: 101, or the refusal's code and Status message.
async fn upgrade(client: &kube::Client, path: &str, protocol: &str) -> (u16, String) {
    match dial(client, path, protocol).await {
        Ok(_) => (101, String::new()),
        Err((code, status)) => (code, status["message"].as_str().unwrap_or("").to_owned()),
    }
}

async fn put(client: &kube::Client, path: &str) -> (u16, String) {
    let request = http::Request::put(path)
        .header("content-type", "application/json")
        .body(Body::from(b"{}".to_vec()))
        .unwrap();
    let response = client.send(request).await.unwrap();
    let code = response.status().as_u16();
    let body = response.into_body().collect_bytes().await.unwrap();
    let status: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (code, status["message"].as_str().unwrap_or("").to_owned())
}

/// A Role in `dev` with `rules`, bound to alice.
fn grant(emu: &Emulator, name: &str, rules: Value) {
    let rbac = "rbac.authorization.k8s.io";
    emu.put_object(json!({"apiVersion": format!("{rbac}/v1"), "kind": "Role",
        "metadata": {"name": name, "namespace": "dev"}, "rules": rules}));
    emu.put_object(
        json!({"apiVersion": format!("{rbac}/v1"), "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": "dev"},
        "roleRef": {"apiGroup": rbac, "kind": "Role", "name": name},
        "subjects": [{"apiGroup": rbac, "kind": "User", "name": "alice"}]}),
    );
}

#[tokio::test]
async fn kubevirt_subresources_need_a_role() {
    let emu = emulator(ServeFlavor::KubeVirt, "kubevirt.yaml").await;
    let alice = client(&emu, "emulator-restricted").await;
    let vmi = "/apis/subresources.kubevirt.io/v1/namespaces/dev/virtualmachineinstances/api";
    let console = format!("{vmi}/console");
    let (code, message) = upgrade(&alice, &console, "plain.kubevirt.io").await;
    assert_eq!(
        (code, message.as_str()),
        (
            403,
            "virtualmachineinstances.subresources.kubevirt.io \"api\" is forbidden: User \"alice\" cannot get resource \"virtualmachineinstances/console\" in API group \"subresources.kubevirt.io\" in the namespace \"dev\""
        ),
        "reading dev grants no subresource"
    );
    for (sub, protocol) in [
        ("vnc", "plain.kubevirt.io"),
        ("portforward/22/tcp", "plain.kubevirt.io"),
    ] {
        let (code, message) = upgrade(&alice, &format!("{vmi}/{sub}"), protocol).await;
        let first = sub.split('/').next().unwrap();
        assert_eq!(code, 403, "{sub}");
        assert!(
            message.contains(&format!(
                "cannot get resource \"virtualmachineinstances/{first}\""
            )),
            "{message}"
        );
    }
    grant(
        &emu,
        "api-console",
        json!([{"apiGroups": ["subresources.kubevirt.io"],
            "resources": ["virtualmachineinstances/console"], "resourceNames": ["api"], "verbs": ["get"]}]),
    );
    assert_eq!(upgrade(&alice, &console, "plain.kubevirt.io").await.0, 101);
    // The grant names one subresource of one VMI.
    assert_eq!(
        upgrade(&alice, &format!("{vmi}/vnc"), "plain.kubevirt.io")
            .await
            .0,
        403
    );
    let other = console.replace("/api/", "/batch/");
    let (code, message) = upgrade(&alice, &other, "plain.kubevirt.io").await;
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("\"batch\" is forbidden"), "{message}");
    // PUT is `update`: `get` on start/stop grants nothing.
    let stop = "/apis/subresources.kubevirt.io/v1/namespaces/dev/virtualmachines/api/stop";
    grant(
        &emu,
        "api-stop-read",
        json!([{"apiGroups": ["subresources.kubevirt.io"],
            "resources": ["virtualmachines/stop"], "verbs": ["get"]}]),
    );
    let (code, message) = put(&alice, stop).await;
    assert_eq!(code, 403, "{message}");
    assert!(
        message.ends_with("User \"alice\" cannot update resource \"virtualmachines/stop\" in API group \"subresources.kubevirt.io\" in the namespace \"dev\""),
        "{message}"
    );
    // `vnc/screenshot` is authorized as the subresource `vnc`.
    let screenshot = format!("{vmi}/vnc/screenshot");
    let before = alice
        .send(http::Request::get(&screenshot).body(Body::empty()).unwrap())
        .await
        .unwrap()
        .status();
    assert_eq!(before, 403);
    grant(
        &emu,
        "api-vnc",
        json!([{"apiGroups": ["subresources.kubevirt.io"],
            "resources": ["virtualmachineinstances/vnc"], "resourceNames": ["api"], "verbs": ["get"]}]),
    );
    let after = alice
        .send(http::Request::get(&screenshot).body(Body::empty()).unwrap())
        .await
        .unwrap()
        .status();
    assert_ne!(after, 403);
    assert_eq!(
        upgrade(&alice, &format!("{vmi}/vnc"), "plain.kubevirt.io")
            .await
            .0,
        101
    );
    emu.shutdown().await;
}

#[tokio::test]
async fn deckhouse_subresources_need_a_role() {
    let emu = emulator(ServeFlavor::Deckhouse, "deckhouse.yaml").await;
    let admin = client(&emu, "emulator").await;
    let alice = client(&emu, "emulator-restricted").await;
    let vm = "/apis/subresources.virtualization.deckhouse.io/v1alpha2/namespaces/dev/virtualmachines/builder";
    let console = format!("{vm}/console");
    let protocol = "plain.virtualization.deckhouse.io";
    let (code, message) = upgrade(&alice, &console, protocol).await;
    assert_eq!(
        (code, message.as_str()),
        (
            403,
            "virtualmachines.subresources.virtualization.deckhouse.io \"builder\" is forbidden: User \"alice\" cannot get resource \"virtualmachines/console\" in API group \"subresources.virtualization.deckhouse.io\" in the namespace \"dev\""
        )
    );
    grant(
        &emu,
        "builder-console",
        json!([{"apiGroups": ["subresources.virtualization.deckhouse.io"],
            "resources": ["virtualmachines/console", "virtualmachines/vnc"],
            "resourceNames": ["builder"], "verbs": ["get", "create", "update"]}]),
    );
    // Now alice is answered as the administrator is.
    let (admin_code, _) = upgrade(&admin, &console, protocol).await;
    assert_ne!(admin_code, 403);
    assert_eq!(upgrade(&alice, &console, protocol).await.0, admin_code);
    let (code, message) = upgrade(&alice, &format!("{vm}/portforward?port=22"), protocol).await;
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("cannot get resource \"virtualmachines/portforward\""),
        "{message}"
    );
    emu.shutdown().await;
}

/// The emulator's own users get what their RBAC objects say: alice reads `dev` through a
/// RoleBinding an administrator can see and delete, Secrets excepted; without it she reads
/// nothing there.
#[tokio::test]
async fn alice_reads_dev_through_a_role_binding() {
    let emu = emulator(ServeFlavor::KubeVirt, "kubevirt.yaml").await;
    let admin = client(&emu, "emulator").await;
    let alice = client(&emu, "emulator-restricted").await;
    let get = |client: kube::Client, path: &'static str| async move {
        let request = http::Request::get(path).body(Body::empty()).unwrap();
        client.send(request).await.unwrap().status().as_u16()
    };
    let vms = "/apis/kubevirt.io/v1/namespaces/dev/virtualmachines";
    assert_eq!(get(alice.clone(), vms).await, 200);
    assert_eq!(
        get(alice.clone(), "/api/v1/namespaces/dev/secrets").await,
        403
    );
    let binding =
        "/apis/rbac.authorization.k8s.io/v1/namespaces/dev/rolebindings/kubevm-emulator:alice-view";
    let request = http::Request::delete(binding).body(Body::empty()).unwrap();
    assert_eq!(admin.send(request).await.unwrap().status(), 200);
    assert_eq!(get(alice, vms).await, 403);
    emu.shutdown().await;
}
