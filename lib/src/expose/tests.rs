use super::*;

fn request(ports: &[&str]) -> ExposeRequest {
    ExposeRequest {
        vm: VmRef {
            namespace: "prod".into(),
            name: "web".into(),
        },
        service_name: None,
        ports: ports.iter().map(|p| PortSpec::parse(p).unwrap()).collect(),
        service_type: ServiceType::ClusterIP,
        cluster_ip: None,
        external_ips: vec![],
    }
}

#[test]
fn port_specs_parse_like_their_help_says() {
    let p = PortSpec::parse("80").unwrap();
    assert_eq!(
        (p.port, p.target.clone(), p.protocol),
        (80, None, Protocol::Tcp)
    );
    let p = PortSpec::parse("443:https/TCP").unwrap();
    assert_eq!(p.target, Some(TargetPort::Name("https".into())));
    let p = PortSpec::parse("53:5353/udp").unwrap();
    assert_eq!(
        (p.port, p.target, p.protocol),
        (53, Some(TargetPort::Number(5353)), Protocol::Udp)
    );
    for bad in [
        "0",
        "65536",
        "http",
        "80:",
        "80:Bad_Name",
        "80/icmp",
        "80:0",
    ] {
        let err = PortSpec::parse(bad).unwrap_err().to_string();
        assert!(err.starts_with(&format!("--port {bad:?}: ")), "{err}");
    }
}

#[test]
fn iana_port_names() {
    for ok in ["http", "h2c", "web-ui", "a1234567890bcde"] {
        assert!(valid_port_name(ok), "{ok}");
    }
    for bad in [
        "",
        "HTTP",
        "1234",
        "-web",
        "web-",
        "we--b",
        "a1234567890bcdef",
    ] {
        assert!(!valid_port_name(bad), "{bad}");
    }
}

#[test]
fn several_ports_get_names_and_the_vm_owns_the_service() {
    let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                    "metadata": {"name": "web", "namespace": "prod", "uid": "u-1"}});
    let svc = request(&["80:8080", "53/udp"]).service(&vm, json!({"vm.kubevirt.io/name": "web"}));
    assert_eq!(svc["metadata"]["name"], "web");
    assert_eq!(svc["metadata"]["namespace"], "prod");
    assert_eq!(svc["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
    assert_eq!(svc["metadata"]["ownerReferences"][0]["uid"], "u-1");
    assert_eq!(
        svc["metadata"]["ownerReferences"][0]["kind"],
        "VirtualMachine"
    );
    assert_eq!(
        svc["spec"]["ports"],
        json!([
            {"name": "tcp-80", "port": 80, "protocol": "TCP", "targetPort": 8080},
            {"name": "udp-53", "port": 53, "protocol": "UDP", "targetPort": 53},
        ])
    );
    let one = request(&["22"]).service(&vm, json!({}));
    assert!(
        one["spec"]["ports"][0].get("name").is_none(),
        "a lone port needs no name"
    );
}

#[test]
fn what_the_api_server_would_refuse_is_refused_first() {
    let mut r = request(&["80"]);
    r.ports[0].node_port = Some(30080);
    assert!(
        r.validate()
            .unwrap_err()
            .to_string()
            .contains("--node-port needs --type NodePort")
    );
    r.service_type = ServiceType::NodePort;
    r.validate().unwrap();
    r.cluster_ip = Some("None".into());
    assert!(r.validate().unwrap_err().to_string().contains("headless"));
    let mut r = request(&["80", "80"]);
    assert!(r.validate().unwrap_err().to_string().contains("used twice"));
    r.ports[1].protocol = Protocol::Udp;
    r.validate().unwrap();
    let mut r = request(&["80"]);
    r.service_name = Some("Web_1".into());
    assert!(r.validate().is_err());
    let mut r = request(&["80"]);
    r.cluster_ip = Some("10.96.0.300".into());
    assert!(
        r.validate()
            .unwrap_err()
            .to_string()
            .contains("not an IP address")
    );
    assert!(request(&[]).validate().is_err());
}
