use super::*;
use crate::ServeFlavor;
use crate::core::app::App;
use crate::core::registry::Registry;
use std::time::Duration;

fn app() -> App {
    App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1))
}

fn service(spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "web", "namespace": "default"}, "spec": spec})
}

#[test]
fn defaults_follow_set_defaults_service() {
    let mut svc = service(json!({"ports": [{"port": 80}]}));
    prepare(&mut svc).unwrap();
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert_eq!(svc["spec"]["sessionAffinity"], "None");
    assert_eq!(svc["spec"]["internalTrafficPolicy"], "Cluster");
    assert_eq!(svc["spec"]["ports"][0]["protocol"], "TCP");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 80);
    assert!(svc["spec"].get("externalTrafficPolicy").is_none());
    let mut node_port =
        service(json!({"type": "NodePort", "ports": [{"port": 80, "targetPort": "http"}]}));
    prepare(&mut node_port).unwrap();
    assert_eq!(node_port["spec"]["externalTrafficPolicy"], "Cluster");
    assert_eq!(node_port["spec"]["ports"][0]["targetPort"], "http");
}

#[test]
fn validation_messages_are_the_api_servers() {
    let cases = [
        (json!({}), "spec.ports: Required value"),
        (
            json!({"ports": [{"port": 80}, {"port": 81}]}),
            "spec.ports[0].name: Required value",
        ),
        (
            json!({"ports": [{"port": 80, "nodePort": 30080}]}),
            "spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'",
        ),
        (
            json!({"type": "NodePort", "clusterIP": "None", "ports": [{"port": 80}]}),
            "spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services",
        ),
        (
            json!({"ports": [{"port": 70000}]}),
            "spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive",
        ),
    ];
    for (spec, want) in cases {
        let err = prepare(&mut service(spec.clone())).expect_err(&spec.to_string());
        assert!(err.message.contains(want), "{spec}: {}", err.message);
        assert!(
            err.message.starts_with("Service \"web\" is invalid: "),
            "{}",
            err.message
        );
    }
    // A headless Service needs no ports.
    prepare(&mut service(json!({"clusterIP": "None"}))).unwrap();
}

#[test]
fn cluster_ips_and_node_ports_are_allocated_once() {
    let app = app();
    let mut first = service(
        json!({"type": "NodePort", "ports": [{"port": 80}, {"port": 443, "name": "https"}]}),
    );
    first["spec"]["ports"][0]["name"] = json!("http");
    prepare(&mut first).unwrap();
    allocate(&app, &mut first).unwrap();
    let ip: std::net::Ipv4Addr = first["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(ip.octets()[0], 10);
    assert!((96..112).contains(&ip.octets()[1]), "{ip} in 10.96.0.0/12");
    assert_eq!(first["spec"]["clusterIPs"], json!([ip.to_string()]));
    for p in first["spec"]["ports"].as_array().unwrap() {
        assert!(NODE_PORTS.contains(&p["nodePort"].as_u64().unwrap()), "{p}");
    }
    let taken_port = first["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
    app.store.create("", "services", first.clone()).unwrap();

    let mut same_ip = service(json!({"clusterIP": ip.to_string(), "ports": [{"port": 80}]}));
    same_ip["metadata"]["name"] = json!("other");
    prepare(&mut same_ip).unwrap();
    let err = allocate(&app, &mut same_ip).unwrap_err();
    assert!(
        err.message.contains("provided IP is already allocated"),
        "{}",
        err.message
    );

    let mut same_port =
        service(json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": taken_port}]}));
    prepare(&mut same_port).unwrap();
    let err = allocate(&app, &mut same_port).unwrap_err();
    assert!(
        err.message.contains(&format!("spec.ports[0].nodePort: Invalid value: {taken_port}: provided port is already allocated")),
        "{}",
        err.message
    );

    let mut headless = service(json!({"clusterIP": "None"}));
    prepare(&mut headless).unwrap();
    allocate(&app, &mut headless).unwrap();
    assert_eq!(headless["spec"]["clusterIPs"], json!(["None"]));
}

fn pod(name: &str, labels: Value, ip: &str, phase: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "labels": labels},
           "spec": {"nodeName": "node-1", "containers": [{"name": "compute", "ports": [{"name": "http", "containerPort": 8080}]}]},
           "status": {"phase": phase, "podIP": ip}})
}

#[test]
fn an_endpoint_slice_lists_the_selected_pods_and_follows_them() {
    let app = app();
    app.store
        .create(
            "",
            "pods",
            pod("a", json!({"app": "web"}), "10.244.0.5", "Running"),
        )
        .unwrap();
    app.store
        .create(
            "",
            "pods",
            pod("b", json!({"app": "db"}), "10.244.0.6", "Running"),
        )
        .unwrap();
    let mut svc =
        service(json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]}));
    prepare(&mut svc).unwrap();
    allocate(&app, &mut svc).unwrap();
    let svc = app.store.create("", "services", svc).unwrap();
    crate::core::controllers::reconcile_all(&app, false);
    let (slices, _) = app
        .store
        .list("discovery.k8s.io", "endpointslices", Some("default"));
    assert_eq!(slices.len(), 1);
    let slice = &slices[0];
    assert!(meta_str(slice, "name").starts_with("web-"));
    assert_eq!(slice["metadata"]["labels"][SERVICE_NAME_LABEL], "web");
    assert_eq!(
        slice["metadata"]["ownerReferences"][0]["uid"],
        svc["metadata"]["uid"]
    );
    assert_eq!(slice["endpoints"].as_array().unwrap().len(), 1);
    assert_eq!(slice["endpoints"][0]["addresses"], json!(["10.244.0.5"]));
    assert_eq!(slice["endpoints"][0]["targetRef"]["name"], "a");
    assert_eq!(slice["ports"][0]["port"], 8080, "the named container port");

    // A second matching pod joins the same slice; deleting the Service collects the slice.
    app.store
        .create(
            "",
            "pods",
            pod("c", json!({"app": "web"}), "10.244.0.7", "Running"),
        )
        .unwrap();
    crate::core::controllers::reconcile_all(&app, false);
    let (slices, _) = app
        .store
        .list("discovery.k8s.io", "endpointslices", Some("default"));
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0]["endpoints"].as_array().unwrap().len(), 2);
    app.store.delete(
        &Key::new("", "services", "default", "web"),
        crate::core::store::Propagation::Cascade,
    );
    let (slices, _) = app
        .store
        .list("discovery.k8s.io", "endpointslices", Some("default"));
    assert!(slices.is_empty(), "{slices:?}");
}
