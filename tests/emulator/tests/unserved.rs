//! An API group the cluster does not serve (KubeVirt's CRDs without virt-api's APIService, CDI
//! without its upload API), as kube-apiserver answers it: the request falls through the
//! delegation chain to k8s.io/apiserver `pkg/util/notfoundhandler` (`http.NotFound`): 404,
//! `text/plain; charset=utf-8`, body `404 page not found\n`, no `Status`. Discovery does not
//! list the group. `EmulatorOptions::unserved_groups` (binary: `--unserve GROUP`).

use http::Request;
use kube::client::Body;
use kubevm_emulator::{Emulator, EmulatorOptions};

use crate::common::{client, fixture};

async fn send(client: &kube::Client, method: &str, path: &str) -> (u16, String, String) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(b"{}".to_vec()))
        .unwrap();
    let response = client.send(request).await.unwrap();
    let code = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.into_body().collect_bytes().await.unwrap();
    (
        code,
        content_type,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn unserved_groups_answer_like_the_end_of_the_delegation_chain() {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![fixture("kubevirt.yaml")],
        unserved_groups: vec![
            "subresources.kubevirt.io".into(),
            "upload.cdi.kubevirt.io".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let client = client(&emu).await;

    let (code, _, groups) = send(&client, "GET", "/apis").await;
    assert_eq!(code, 200);
    assert!(groups.contains("\"kubevirt.io\""), "{groups}");
    assert!(groups.contains("\"cdi.kubevirt.io\""), "{groups}");
    assert!(!groups.contains("subresources.kubevirt.io"), "{groups}");
    assert!(!groups.contains("upload.cdi.kubevirt.io"), "{groups}");

    for (method, path) in [
        (
            "PUT",
            "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/web/start",
        ),
        (
            "GET",
            "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/web/console",
        ),
        ("GET", "/apis/subresources.kubevirt.io/v1"),
        ("GET", "/apis/subresources.kubevirt.io"),
        (
            "POST",
            "/apis/upload.cdi.kubevirt.io/v1beta1/namespaces/default/uploadtokenrequests",
        ),
    ] {
        let answer = send(&client, method, path).await;
        assert_eq!(
            answer,
            (
                404,
                "text/plain; charset=utf-8".to_owned(),
                "404 page not found\n".to_owned()
            ),
            "{method} {path}"
        );
    }

    // The groups it still serves answer as before: the VM is there, a missing one is the
    // registry's NotFound Status.
    let (code, _, _) = send(
        &client,
        "GET",
        "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/web",
    )
    .await;
    assert_eq!(code, 200);
    let (code, content_type, body) = send(
        &client,
        "GET",
        "/apis/kubevirt.io/v1/namespaces/default/virtualmachines/nosuch",
    )
    .await;
    assert_eq!((code, content_type.as_str()), (404, "application/json"));
    assert!(body.contains("\"reason\":\"NotFound\""), "{body}");
}

#[tokio::test]
async fn served_by_default() {
    let emu = Emulator::start(EmulatorOptions {
        fixture_yaml: vec![fixture("kubevirt.yaml")],
        ..Default::default()
    })
    .await
    .unwrap();
    let client = client(&emu).await;
    let (code, _, groups) = send(&client, "GET", "/apis").await;
    assert_eq!(code, 200);
    assert!(groups.contains("subresources.kubevirt.io"), "{groups}");
    assert!(groups.contains("upload.cdi.kubevirt.io"), "{groups}");
    // virt-api answers a missing VM with the object's own Status.
    let (code, content_type, body) = send(
        &client,
        "PUT",
        "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/nosuch/start",
    )
    .await;
    assert_eq!(
        (code, content_type.as_str()),
        (404, "application/json"),
        "{body}"
    );
}
