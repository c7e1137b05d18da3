//! API aggregation as kube-aggregator does it: an APIService backed by a Service and Endpoints
//! pointing at a local HTTPS server (`common/backend.rs`), discovery, the proxied request's
//! identity headers, RBAC on the aggregated resources, upstream's unavailable answers, the
//! `Available` condition, ServiceAccount tokens and SubjectAccessReviews.

#[path = "common/backend.rs"]
mod backend;
use crate::common;

use backend::{Backend, GROUP, VERSION, header_values};
use kube::client::Body;
use kubevm_emulator::{Emulator, EmulatorOptions};
use serde_json::{Value, json};
use std::time::Duration;

const NS: &str = "kubevm-system";
const SVC: &str = "ssh-signer";

async fn start() -> (Emulator, kube::Client) {
    let emu = Emulator::start(EmulatorOptions::default()).await.unwrap();
    let client = client_of(&emu.kubeconfig_yaml()).await;
    (emu, client)
}

/// A kube client without kube-rs's default retries (it retries 503s for a long while).
async fn client_of(kubeconfig: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.default_retry = false;
    kube::Client::try_from(cfg).unwrap()
}

/// (status, headers, body) of a raw request through `client` (admin unless headers say).
async fn send(
    client: &kube::Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, http::HeaderMap, String) {
    let mut req = http::Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .send(req.body(Body::from(body.as_bytes().to_vec())).unwrap())
        .await
        .unwrap();
    let (code, headers) = (resp.status().as_u16(), resp.headers().clone());
    let bytes = resp.into_body().collect_bytes().await.unwrap();
    (code, headers, String::from_utf8_lossy(&bytes).into_owned())
}

fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Service `kubevm-system/ssh-signer` (443, named `https`), Endpoints at `127.0.0.1:port`
/// (None: no Endpoints) and APIService `v1alpha1.ssh.kubevm.io`.
fn register(emu: &Emulator, port: Option<u16>, ca_bundle: &str) {
    emu.put_object(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": SVC, "namespace": NS},
        "spec": {"type": "ClusterIP", "ports": [{"name": "https", "port": 443, "targetPort": 8443}]}}));
    if let Some(port) = port {
        emu.put_object(json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": SVC, "namespace": NS},
            "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"name": "https", "port": port}]}]}));
    }
    emu.put_object(json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": format!("{VERSION}.{GROUP}")},
        "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 1000, "versionPriority": 15,
            "service": {"namespace": NS, "name": SVC, "port": 443}, "caBundle": ca_bundle}}));
}

/// Waits for the APIService's Available condition to have `status`; returns the condition.
async fn available(emu: &Emulator, status: &str) -> Value {
    for _ in 0..100 {
        let svc = emu.objects("apiregistration.k8s.io", "apiservices", None);
        let cond = svc
            .iter()
            .flat_map(|s| {
                s["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .find(|c| c["type"] == "Available");
        if let Some(c) = cond.filter(|c| c["status"] == status) {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("APIService never Available={status}");
}

async fn front_proxy_ca(client: &kube::Client) -> (Value, String) {
    let (code, _, body) = send(
        client,
        "GET",
        "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
        &[],
        "",
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let cm = json_of(&body);
    let ca = cm["data"]["requestheader-client-ca-file"]
        .as_str()
        .unwrap()
        .to_string();
    (cm, ca)
}

const CERT_PATH: &str =
    "/apis/ssh.kubevm.io/v1alpha1/namespaces/dev/virtualmachines/web/sshcertificate";

#[tokio::test]
async fn discovery_lists_the_group_and_requests_reach_the_backend_as_the_caller() {
    let (emu, client) = start().await;
    let (cm, ca) = front_proxy_ca(&client).await;
    let data = &cm["data"];
    assert_eq!(
        data["requestheader-allowed-names"],
        r#"["front-proxy-client"]"#
    );
    assert_eq!(
        data["requestheader-username-headers"],
        r#"["X-Remote-User"]"#
    );
    assert_eq!(data["requestheader-group-headers"], r#"["X-Remote-Group"]"#);
    assert_eq!(
        data["requestheader-extra-headers-prefix"],
        r#"["X-Remote-Extra-"]"#
    );
    assert_eq!(data["requestheader-uid-headers"], "[]");
    assert_eq!(data["client-ca-file"], emu.ca_pem().as_str());
    assert_eq!(ca, emu.front_proxy().ca_pem);

    let backend = Backend::start(SVC, NS, &ca).await;
    register(&emu, Some(backend.port), &backend.ca_bundle);
    let cond = available(&emu, "True").await;
    assert_eq!(
        (&cond["reason"], &cond["message"]),
        (&json!("Passed"), &json!("all checks passed"))
    );

    let (_, _, apis) = send(&client, "GET", "/apis", &[], "").await;
    let apis = json_of(&apis);
    let group = apis["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == GROUP)
        .expect("group listed")
        .clone();
    assert_eq!(
        group["preferredVersion"],
        json!({"groupVersion": "ssh.kubevm.io/v1alpha1", "version": "v1alpha1"})
    );
    let (code, _, doc) = send(&client, "GET", "/apis/ssh.kubevm.io", &[], "").await;
    assert_eq!(
        (code, json_of(&doc)["kind"].clone()),
        (200, json!("APIGroup"))
    );
    let (code, _, doc) = send(&client, "GET", "/apis/ssh.kubevm.io/v1alpha1", &[], "").await;
    assert_eq!(code, 200);
    assert_eq!(
        json_of(&doc)["resources"][0]["name"],
        "virtualmachines/sshcertificate"
    );

    // The admin's POST, with forged identity headers, reaches the backend as admin.
    emu.clear_requests();
    let forged = [
        ("content-type", "application/json"),
        ("x-remote-user", "mallory"),
        ("x-remote-group", "system:masters-forged"),
        ("x-remote-extra-scopes", "all"),
    ];
    let (code, _, echo) = send(
        &client,
        "POST",
        &format!("{CERT_PATH}?b=2&a=1"),
        &forged,
        r#"{"publicKey":"ssh-ed25519 AAAA"}"#,
    )
    .await;
    assert_eq!(code, 200, "{echo}");
    let echo = json_of(&echo);
    assert_eq!(
        (&echo["method"], &echo["path"], &echo["query"]),
        (&json!("POST"), &json!(CERT_PATH), &json!("a=1&b=2"))
    );
    assert_eq!(echo["body"], r#"{"publicKey":"ssh-ed25519 AAAA"}"#);
    assert_eq!(header_values(&echo, "x-remote-user"), ["admin"]);
    assert_eq!(
        header_values(&echo, "x-remote-group"),
        ["system:masters", "system:authenticated"]
    );
    assert!(header_values(&echo, "authorization").is_empty());
    assert!(header_values(&echo, "x-remote-extra-scopes").is_empty());
    assert!(header_values(&echo, "x-remote-uid").is_empty());
    assert_eq!(header_values(&echo, "content-type"), ["application/json"]);
    // Recorded like any other request.
    let logged = emu.requests();
    let logged = logged.iter().find(|r| r.path == CERT_PATH).unwrap();
    assert_eq!((logged.method.as_str(), logged.status), ("POST", 200));

    // A ServiceAccount's token: uid and the credential id as an escaped extra header.
    emu.put_object(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "cli", "namespace": "dev"}}));
    let token = emu.service_account_token("dev", "cli", 3600).unwrap();
    let auth = format!("Bearer {token}");
    let sa_client = token_client(&emu, &token).await;
    emu.put_object(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "ssh-signer-user"},
        "rules": [{"apiGroups": [GROUP], "resources": ["virtualmachines/sshcertificate"], "verbs": ["create"]}]}));
    emu.put_object(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "cli-ssh", "namespace": "dev"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ssh-signer-user"},
        "subjects": [{"kind": "ServiceAccount", "name": "cli"}]}));
    let (code, _, echo) = send(
        &sa_client,
        "POST",
        CERT_PATH,
        &[("authorization", &auth)],
        "{}",
    )
    .await;
    assert_eq!(code, 200, "{echo}");
    let echo = json_of(&echo);
    assert_eq!(
        header_values(&echo, "x-remote-user"),
        ["system:serviceaccount:dev:cli"]
    );
    let sa = &emu.objects("", "serviceaccounts", Some("dev"))[0];
    assert_eq!(
        header_values(&echo, "x-remote-uid"),
        [sa["metadata"]["uid"].as_str().unwrap()]
    );
    let credential = header_values(
        &echo,
        "x-remote-extra-authentication.kubernetes.io%2fcredential-id",
    );
    assert!(credential[0].starts_with("JTI="), "{echo}");
    backend.stop().await;
}

/// A client presenting `token` (the kubeconfig of `kubeconfig_yaml_with_token`).
async fn token_client(emu: &Emulator, token: &str) -> kube::Client {
    client_of(&emu.kubeconfig_yaml_with_token("cli", token)).await
}

#[tokio::test]
async fn rbac_resource_names_on_the_subresource_decide_before_the_proxy() {
    let (emu, client) = start().await;
    let (_, ca) = front_proxy_ca(&client).await;
    let backend = Backend::start(SVC, NS, &ca).await;
    register(&emu, Some(backend.port), &backend.ca_bundle);
    available(&emu, "True").await;
    emu.put_object(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "sign-web", "namespace": "dev"},
        "rules": [{"apiGroups": [GROUP], "resources": ["virtualmachines/sshcertificate"],
            "resourceNames": ["web"], "verbs": ["create"]}]}),
    );
    emu.put_object(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "bob-signs-web", "namespace": "dev"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sign-web"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]}),
    );
    let bob = [
        ("impersonate-user", "bob"),
        ("content-type", "application/json"),
    ];
    let (code, _, echo) = send(&client, "POST", CERT_PATH, &bob, "{}").await;
    assert_eq!(code, 200, "{echo}");
    let echo = json_of(&echo);
    assert_eq!(header_values(&echo, "x-remote-user"), ["bob"]);
    assert_eq!(
        header_values(&echo, "x-remote-group"),
        ["system:authenticated"]
    );
    assert!(header_values(&echo, "impersonate-user").is_empty());

    let db = CERT_PATH.replace("/web/", "/db/");
    let (code, headers, body) = send(&client, "POST", &db, &bob, "{}").await;
    assert_eq!(code, 403);
    assert_eq!(headers["content-type"], "application/json");
    let status = json_of(&body);
    assert_eq!(status["reason"], "Forbidden");
    assert_eq!(
        status["message"],
        "virtualmachines.ssh.kubevm.io \"db\" is forbidden: User \"bob\" cannot create resource \"virtualmachines/sshcertificate\" in API group \"ssh.kubevm.io\" in the namespace \"dev\""
    );
    // The namespace counts too.
    let prod = CERT_PATH.replace("/dev/", "/prod/");
    let (code, _, _) = send(&client, "POST", &prod, &bob, "{}").await;
    assert_eq!(code, 403);
    backend.stop().await;
}

#[tokio::test]
async fn unavailable_services_answer_as_the_aggregator_does() {
    let (emu, client) = start().await;
    let (_, ca) = front_proxy_ca(&client).await;
    // No Service at all.
    emu.put_object(json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": format!("{VERSION}.{GROUP}")},
        "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 1000, "versionPriority": 15,
            "service": {"namespace": NS, "name": SVC}}}));
    let cond = available(&emu, "False").await;
    assert_eq!(cond["reason"], "ServiceNotFound");
    assert_eq!(
        cond["message"],
        "service/ssh-signer in \"kubevm-system\" is not present"
    );
    // A Service without Endpoints.
    register(&emu, None, "");
    for _ in 0..50 {
        if available(&emu, "False").await["reason"] == "EndpointsNotFound" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cond = available(&emu, "False").await;
    assert_eq!(
        cond["message"],
        "cannot find endpointslices for service/ssh-signer in \"kubevm-system\""
    );
    let (code, headers, body) = send(&client, "POST", CERT_PATH, &[], "{}").await;
    assert_eq!((code, body.as_str()), (503, "service unavailable\n"));
    assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
    // Discovery of the group still works; its version answers 503 too.
    let (code, _, _) = send(&client, "GET", "/apis/ssh.kubevm.io/v1alpha1", &[], "").await;
    assert_eq!(code, 503);

    // Up, then the backend goes away: the proxy's own dial error until the controller notices.
    let backend = Backend::start(SVC, NS, &ca).await;
    let port = backend.port;
    register(&emu, Some(port), &backend.ca_bundle);
    available(&emu, "True").await;
    backend.stop().await;
    let (code, _, body) = send(&client, "POST", CERT_PATH, &[], "{}").await;
    assert_eq!(code, 503);
    assert_eq!(
        body,
        format!("dial tcp 127.0.0.1:{port}: connect: connection refused\n")
    );
    // A change to the Endpoints makes the controller look again.
    register(&emu, Some(port), "");
    let cond = available(&emu, "False").await;
    assert_eq!(cond["reason"], "FailedDiscoveryCheck");
    let url = format!("https://127.0.0.1:{port}/apis/ssh.kubevm.io/v1alpha1");
    assert_eq!(
        cond["message"],
        format!(
            "failing or missing response from {url}: Get \"{url}\": dial tcp 127.0.0.1:{port}: connect: connection refused"
        )
    );
}

#[tokio::test]
async fn a_wrong_ca_bundle_is_a_tls_error() {
    let (emu, client) = start().await;
    let (_, ca) = front_proxy_ca(&client).await;
    let backend = Backend::start(SVC, NS, &ca).await;
    let other = Backend::start("other", NS, &ca).await;
    register(&emu, Some(backend.port), &other.ca_bundle);
    // The availability check does not verify the server; the proxy does.
    available(&emu, "True").await;
    let (code, _, body) = send(&client, "POST", CERT_PATH, &[], "{}").await;
    assert_eq!(
        (code, body.as_str()),
        (
            503,
            "tls: failed to verify certificate: x509: certificate signed by unknown authority\n"
        )
    );
    backend.stop().await;
    other.stop().await;
}

#[tokio::test]
async fn service_account_tokens_get_only_what_rbac_grants() {
    let (emu, client) = start().await;
    let (code, _, body) = send(
        &client,
        "POST",
        "/api/v1/namespaces/dev/serviceaccounts/signer/token",
        &[("content-type", "application/json")],
        r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{}}"#,
    )
    .await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(
        json_of(&body)["message"],
        "serviceaccounts \"signer\" not found"
    );
    emu.put_object(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "signer", "namespace": "dev"}}));
    let (code, _, body) = send(
        &client,
        "POST",
        "/api/v1/namespaces/dev/serviceaccounts/signer/token",
        &[("content-type", "application/json")],
        r#"{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":1200}}"#,
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let tr = json_of(&body);
    assert_eq!(tr["kind"], "TokenRequest");
    assert_eq!(
        tr["spec"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    let token = tr["status"]["token"].as_str().unwrap().to_string();
    assert_eq!(token.split('.').count(), 3, "JWT-shaped");
    let sa = token_client(&emu, &token).await;

    let (_, _, who) = send(
        &sa,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        &[("content-type", "application/json")],
        r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#,
    )
    .await;
    let info = &json_of(&who)["status"]["userInfo"];
    assert_eq!(info["username"], "system:serviceaccount:dev:signer");
    assert_eq!(
        info["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:dev",
            "system:authenticated"
        ])
    );
    // Not alice's free reads of dev, and no reviews without system:auth-delegator.
    let (code, _, _) = send(&sa, "GET", "/api/v1/namespaces/dev/pods", &[], "").await;
    assert_eq!(code, 403);
    let sar = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "bob", "groups": ["system:authenticated"],
            "resourceAttributes": {"namespace": "dev", "verb": "create", "group": GROUP,
                "resource": "virtualmachines", "subresource": "sshcertificate", "name": "web"}}})
    .to_string();
    let sar_path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    let ct = [("content-type", "application/json")];
    let (code, _, _) = send(&sa, "POST", sar_path, &ct, &sar).await;
    assert_eq!(code, 403);
    let reader = "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication";
    assert_eq!(send(&sa, "GET", reader, &[], "").await.0, 403);

    // What an aggregated server's ServiceAccount is bound to.
    emu.put_object(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "signer:auth-delegator"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
        "subjects": [{"kind": "ServiceAccount", "name": "signer", "namespace": "dev"}]}));
    emu.put_object(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "signer-auth-reader", "namespace": "kube-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "extension-apiserver-authentication-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "signer", "namespace": "dev"}]}));
    assert_eq!(send(&sa, "GET", reader, &[], "").await.0, 200);
    let other_cm = "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt";
    assert_eq!(send(&sa, "GET", other_cm, &[], "").await.0, 403);

    let (code, _, body) = send(&sa, "POST", sar_path, &ct, &sar).await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(json_of(&body)["status"], json!({"allowed": false}));
    emu.put_object(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "sign-web", "namespace": "dev"},
        "rules": [{"apiGroups": [GROUP], "resources": ["virtualmachines/sshcertificate"],
            "resourceNames": ["web"], "verbs": ["create"]}]}),
    );
    emu.put_object(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "bob-signs-web", "namespace": "dev"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sign-web"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]}),
    );
    let (_, _, body) = send(&sa, "POST", sar_path, &ct, &sar).await;
    assert_eq!(
        json_of(&body)["status"],
        json!({"allowed": true, "reason": "RBAC: allowed by RoleBinding \"bob-signs-web/dev\" of Role \"sign-web\" to User \"bob\""})
    );
    let (code, _, body) = send(&sa, "POST", sar_path, &ct,
        r#"{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"resourceAttributes":{"verb":"get","resource":"pods"}}}"#).await;
    assert_eq!(code, 422, "{body}");

    // TokenReview of the token itself.
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}).to_string();
    let (code, _, body) = send(
        &sa,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        &ct,
        &review,
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let status = &json_of(&body)["status"];
    assert_eq!(status["authenticated"], true);
    assert_eq!(
        status["user"]["username"],
        "system:serviceaccount:dev:signer"
    );

    // Deleting the ServiceAccount invalidates its tokens.
    let (code, _, _) = send(
        &client,
        "DELETE",
        "/api/v1/namespaces/dev/serviceaccounts/signer",
        &[],
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(send(&sa, "GET", reader, &[], "").await.0, 401);
}

#[test]
fn kubectl_gets_apiservices_and_creates_tokens() {
    let env = common::kubectl::KubectlEnv::new();
    env.emu.put_object(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": SVC, "namespace": NS},
        "spec": {"ports": [{"name": "https", "port": 443}]}}),
    );
    env.emu.put_object(json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": format!("{VERSION}.{GROUP}")},
        "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 1000, "versionPriority": 15,
            "service": {"namespace": NS, "name": SVC}}}));
    let mut out = String::new();
    for _ in 0..50 {
        let (ok, o, err) = env.run(&["get", "apiservices"], "");
        assert!(ok, "{err}");
        out = o;
        if out.contains("False (EndpointsNotFound)") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| {
            l.split("   ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    assert_eq!(lines[0], ["NAME", "SERVICE", "AVAILABLE", "AGE"], "{out}");
    assert_eq!(
        lines[1][..3],
        [
            "v1alpha1.ssh.kubevm.io",
            "kubevm-system/ssh-signer",
            "False (EndpointsNotFound)"
        ],
        "{out}"
    );
    // As on a real cluster, discovery of the unavailable group/version fails (a warning).
    let (_, _, err) = env.run(&["get", "apiservices"], "");
    assert!(err.contains("ssh.kubevm.io/v1alpha1"), "{err}");

    let (ok, _, err) = env.run(&["create", "token", "signer", "-n", "dev"], "");
    assert!(!ok);
    assert!(
        err.contains("serviceaccounts \"signer\" not found"),
        "{err}"
    );
    env.emu.put_object(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "signer", "namespace": "dev"}}));
    let token = env.ok(&[
        "create",
        "token",
        "signer",
        "-n",
        "dev",
        "--duration",
        "20m",
    ]);
    let kubeconfig = env.dir.path().join("sa.kubeconfig");
    std::fs::write(
        &kubeconfig,
        env.emu.kubeconfig_yaml_with_token("signer", token.trim()),
    )
    .unwrap();
    let o = std::process::Command::new(common::kubectl::kubectl_path())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "system:serviceaccount:dev:signer",
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Endpoints of the Service with one subset per port (all on 127.0.0.1), as the endpoints
/// controller writes replicas that listen on different ports.
fn endpoints(emu: &Emulator, ports: &[u16]) {
    let subsets: Vec<Value> = ports
        .iter()
        .map(|p| json!({"addresses": [{"ip": "127.0.0.1"}], "ports": [{"name": "https", "port": p}]}))
        .collect();
    emu.put_object(
        json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": SVC, "namespace": NS},
        "subsets": subsets}),
    );
}

/// Which backend port answered a proxied request (the proxy sends `Host: IP:PORT`), or the
/// 503 body when none did.
async fn answered_by(client: &kube::Client) -> Result<u16, (u16, String)> {
    let (code, _, body) = send(client, "POST", CERT_PATH, &[], "{}").await;
    if code != 200 {
        return Err((code, body));
    }
    let echo = json_of(&body);
    let host = header_values(&echo, "host").pop().unwrap();
    Ok(host.rsplit_once(':').unwrap().1.parse().unwrap())
}

/// kube-aggregator's endpoint routing (apiserver `pkg/util/proxy/proxy.go` `ResolveEndpoint`,
/// kube-aggregator `handler_proxy.go`): every request goes to a ready endpoint chosen at random;
/// a dead one is the proxy's 503 with the dial error, not retried on the other endpoint; once
/// the endpoint is removed every request reaches the live replica.
#[tokio::test]
async fn each_request_goes_to_a_random_endpoint_and_a_dead_one_is_not_retried() {
    use base64::Engine;
    let (emu, client) = start().await;
    let (_, ca) = front_proxy_ca(&client).await;
    let a = Backend::start(SVC, NS, &ca).await;
    let b = Backend::start(SVC, NS, &ca).await;
    // One caBundle trusting both replicas' serving CAs.
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut bundle = b64.decode(&a.ca_bundle).unwrap();
    bundle.extend(b64.decode(&b.ca_bundle).unwrap());
    register(&emu, None, &b64.encode(bundle));
    let (pa, pb) = (a.port, b.port);
    endpoints(&emu, &[pa, pb]);
    available(&emu, "True").await;
    // 40 requests: both replicas answer (all on one: probability 2^-39).
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..40 {
        let port = answered_by(&client).await.expect("both replicas are up");
        *seen.entry(port).or_insert(0) += 1;
    }
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), {
        let mut both = vec![pa, pb];
        both.sort();
        both
    });
    // Replica a dies; its endpoint is still listed. About half the requests pick it and get
    // the proxy's 503 (no retry on b: a retry would have answered 200).
    a.stop().await;
    let (mut ok, mut refused) = (0, 0);
    for _ in 0..40 {
        match answered_by(&client).await {
            Ok(port) => {
                assert_eq!(port, pb);
                ok += 1;
            }
            Err((code, body)) => {
                assert_eq!(
                    (code, body),
                    (
                        503,
                        format!("dial tcp 127.0.0.1:{pa}: connect: connection refused\n")
                    )
                );
                refused += 1;
            }
        }
    }
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
    // The endpoints controller drops the dead pod: every request reaches b, and the APIService
    // stays Available (its five discovery attempts go to b).
    endpoints(&emu, &[pb]);
    let cond = available(&emu, "True").await;
    assert_eq!(cond["reason"], "Passed");
    for _ in 0..20 {
        assert_eq!(answered_by(&client).await, Ok(pb));
    }
    b.stop().await;
}
