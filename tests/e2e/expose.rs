//! `kubectl vm expose` end to end: the Service real kubectl reads back selects exactly the
//! VM's virt-launcher pod (as each platform labels it), its EndpointSlice carries that pod's
//! IP, it is owned by the VM, and what the API server would refuse is refused first.

use serde_json::{Value, json};

use crate::common::{Env, fails, ok, stderr, stdout};

const IMAGE: &str = "quay.io/containerdisks/ubuntu:24.04";

fn kubectl_json(env: &Env, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(env.kubectl(&all))).unwrap()
}

fn create(env: &Env, name: &str, ns: &str) {
    ok(env.vm(&[
        "create",
        name,
        "-n",
        ns,
        "--image",
        IMAGE,
        "--no-platform-ssh",
        "--wait",
        "--timeout",
        "60s",
    ]));
}

/// `key=value,…` of a selector map, for `kubectl get -l`.
fn selector_text(selector: &Value) -> String {
    selector
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The Service's selector picks exactly the VM's launcher pod, and the EndpointSlice the
/// cluster made for it lists that pod's IP.
fn check_reaches_only(env: &Env, ns: &str, service: &str, vm_pod_ip: &str) {
    let svc = kubectl_json(env, &["get", "service", service, "-n", ns]);
    let selector = selector_text(&svc["spec"]["selector"]);
    let pods = kubectl_json(env, &["get", "pods", "-n", ns, "-l", &selector]);
    let pods = pods["items"].as_array().unwrap();
    assert_eq!(pods.len(), 1, "{selector}: {pods:#?}");
    assert_eq!(pods[0]["status"]["podIP"], vm_pod_ip);
    let slices = kubectl_json(
        env,
        &[
            "get",
            "endpointslices",
            "-n",
            ns,
            "-l",
            &format!("kubernetes.io/service-name={service}"),
        ],
    );
    let slices = slices["items"].as_array().unwrap();
    assert_eq!(slices.len(), 1, "{slices:#?}");
    assert_eq!(slices[0]["endpoints"][0]["addresses"], json!([vm_pod_ip]));
}

#[test]
fn kubevirt_expose_selects_the_vms_pod_only() {
    let env = Env::kubevirt();
    // Same VM name in two namespaces, and another VM next to it.
    for (name, ns) in [("web", "dev"), ("web", "prod"), ("db", "dev")] {
        create(&env, name, ns);
    }
    env.emulator.clear_requests();
    let out = env.vm(&[
        "expose", "web", "-n", "dev", "--port", "80:8080", "--port", "22",
    ]);
    let said = stdout(&out);
    assert!(
        said.starts_with("service/web exposed: ClusterIP 10."),
        "{said}{}",
        stderr(&out)
    );
    assert!(said.ends_with(", 80→8080/TCP, 22→22/TCP\n"), "{said}");
    // One write: the Service, with create semantics.
    let writes: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .collect();
    assert_eq!(writes.len(), 1, "{writes:#?}");
    assert_eq!(
        (writes[0].method.as_str(), writes[0].path.as_str()),
        ("POST", "/api/v1/namespaces/dev/services")
    );

    let svc = kubectl_json(&env, &["get", "service", "web", "-n", "dev"]);
    assert_eq!(
        svc["spec"]["selector"],
        json!({"vm.kubevirt.io/name": "web"})
    );
    assert_eq!(
        svc["spec"]["ports"],
        json!([
            {"name": "tcp-80", "port": 80, "protocol": "TCP", "targetPort": 8080},
            {"name": "tcp-22", "port": 22, "protocol": "TCP", "targetPort": 22},
        ])
    );
    let vm = kubectl_json(
        &env,
        &["get", "virtualmachines.kubevirt.io", "web", "-n", "dev"],
    );
    assert_eq!(
        svc["metadata"]["ownerReferences"][0]["uid"],
        vm["metadata"]["uid"]
    );
    let vmi = kubectl_json(
        &env,
        &["get", "virtualmachineinstances", "web", "-n", "dev"],
    );
    let ip = vmi["status"]["interfaces"][0]["ipAddress"]
        .as_str()
        .unwrap();
    check_reaches_only(&env, "dev", "web", ip);

    // The name is taken now: create semantics leave the Service alone.
    let before = kubectl_json(&env, &["get", "service", "web", "-n", "dev"]);
    let err = fails(&env, &["expose", "web", "-n", "dev", "--port", "443"], 1);
    assert!(err.contains("already exists"), "{err}");
    let after = kubectl_json(&env, &["get", "service", "web", "-n", "dev"]);
    assert_eq!(
        before["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );

    // NodePort with a chosen node port; -o name.
    let out = ok(env.vm(&[
        "expose",
        "web",
        "-n",
        "prod",
        "--name",
        "web-ssh",
        "--port",
        "22",
        "--type",
        "NodePort",
        "--node-port",
        "30022",
        "-o",
        "name",
    ]));
    assert_eq!(out, "service/web-ssh\n");
    let svc = kubectl_json(&env, &["get", "service", "web-ssh", "-n", "prod"]);
    assert_eq!(svc["spec"]["type"], "NodePort");
    assert_eq!(svc["spec"]["ports"][0]["nodePort"], 30022);
    // A node port in use is the API server's refusal, with its message.
    let err = fails(
        &env,
        &[
            "expose",
            "db",
            "-n",
            "dev",
            "--port",
            "22",
            "--type",
            "NodePort",
            "--node-port",
            "30022",
        ],
        1,
    );
    assert!(err.contains("provided port is already allocated"), "{err}");
    // Deleting the VM takes its Services with it (they are owned by it).
    ok(env.vm(&["delete", "web", "-n", "prod", "-y", "--wait"]));
    let gone = env.kubectl(&["get", "service", "web-ssh", "-n", "prod"]);
    assert!(!gone.status.success());
}

#[test]
fn kubevirt_vms_sharing_a_host_name_are_refused() {
    let env = Env::kubevirt();
    create(&env, "web", "dev");
    // A VM made from YAML whose guest is also called "web": KubeVirt labels both pods alike.
    let yaml = r#"apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: web-copy, namespace: dev}
spec:
  runStrategy: Halted
  template:
    spec:
      hostname: web
      domain: {devices: {}, memory: {guest: 1Gi}}
"#;
    let file = env.dir.path().join("copy.yaml");
    std::fs::write(&file, yaml).unwrap();
    ok(env.kubectl(&["create", "-f", file.to_str().unwrap()]));
    let err = fails(&env, &["expose", "web", "-n", "dev", "--port", "80"], 1);
    assert!(err.contains("VM web-copy"), "{err}");
    assert!(err.contains("vm.kubevirt.io/name=web"), "{err}");
    let none = env.kubectl(&["get", "service", "web", "-n", "dev"]);
    assert!(!none.status.success(), "nothing was created");
}

#[test]
fn deckhouse_expose_selects_the_vms_pod_only() {
    let env = Env::deckhouse();
    create(&env, "web", "dev");
    create(&env, "db", "dev");
    let out = ok(env.vm(&[
        "expose",
        "web",
        "-n",
        "dev",
        "--port",
        "80",
        "--type",
        "LoadBalancer",
    ]));
    assert!(
        out.starts_with("service/web exposed: LoadBalancer 10."),
        "{out}"
    );
    let svc = kubectl_json(&env, &["get", "service", "web", "-n", "dev"]);
    assert_eq!(
        svc["spec"]["selector"],
        json!({"vm.kubevirt.internal.virtualization.deckhouse.io/name": "web"})
    );
    assert!(svc["spec"]["ports"][0]["nodePort"].as_u64().is_some());
    let vm = kubectl_json(
        &env,
        &[
            "get",
            "virtualmachines.virtualization.deckhouse.io",
            "web",
            "-n",
            "dev",
        ],
    );
    let ip = vm["status"]["ipAddress"].as_str().unwrap();
    check_reaches_only(&env, "dev", "web", ip);
}

#[test]
fn bad_input_is_refused_before_any_request() {
    let env = Env::kubevirt();
    let cases: [(&[&str], &str); 5] = [
        (&["expose", "web", "--port", "http"], "--port \"http\""),
        (
            &["expose", "web", "--port", "80", "--node-port", "30080"],
            "--node-port needs --type NodePort",
        ),
        (
            &[
                "expose",
                "web",
                "--port",
                "80",
                "--type",
                "NodePort",
                "--cluster-ip",
                "None",
            ],
            "headless",
        ),
        (
            &[
                "expose",
                "web",
                "--port",
                "80",
                "--port",
                "81",
                "--target-port",
                "8080",
            ],
            "single --port",
        ),
        (
            &["expose", "web", "--port", "80", "--name", "Web"],
            "service",
        ),
    ];
    for (args, want) in cases {
        env.emulator.clear_requests();
        let err = fails(&env, args, 2);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(env.emulator.requests().is_empty(), "{args:?} made requests");
    }
    // A VM that does not exist: the server's answer, nothing created.
    let err = fails(&env, &["expose", "nosuch", "--port", "80"], 1);
    assert!(err.contains("\"nosuch\" not found"), "{err}");
    // --dry-run=client prints what would be created and sends nothing that changes anything.
    env.emulator.clear_requests();
    let yaml = ok(env.vm(&[
        "expose",
        "web",
        "--port",
        "80",
        "--dry-run=client",
        "-o",
        "yaml",
    ]));
    assert!(yaml.contains("kind: Service"), "{yaml}");
    assert!(env.emulator.requests().iter().all(|r| r.method == "GET"));
}

/// `--protocol`, `--port-name` and `--external-ip` reach the Service as the Kubernetes API
/// defines them (core/v1 ServicePort `name`/`protocol`, ServiceSpec `externalIPs`), read back
/// by real kubectl.
#[test]
fn protocol_port_name_and_external_ips_reach_the_service() {
    let env = Env::kubevirt();
    create(&env, "dns", "default");
    let out = env.vm(&[
        "expose",
        "dns",
        "--port",
        "53",
        "--target-port",
        "5353",
        "--protocol",
        "udp",
        "--port-name",
        "dns-udp",
        "--external-ip",
        "192.0.2.10",
        "--external-ip",
        "192.0.2.11",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let svc = kubectl_json(&env, &["get", "service", "dns"]);
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "dns-udp", "port": 53, "protocol": "UDP", "targetPort": 5353}])
    );
    assert_eq!(
        svc["spec"]["externalIPs"],
        json!(["192.0.2.10", "192.0.2.11"])
    );
}
