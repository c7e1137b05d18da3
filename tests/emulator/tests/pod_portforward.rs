//! `pods/portforward` to an export server's pod, checked with the clients that matter: real
//! kubectl v1.36 (`kubectl port-forward`, which speaks SPDY/3.1 tunnelled in a WebSocket) with
//! curl through the forwarded port, and kube-rs (`v4.channel.k8s.io`, what kubectl-vm uses).
//! Expected bytes come from the emulator's content generator piped to `sha256sum`.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use common::kubectl::kubectl_path;
use kubevm_emulator::export::{ExportFaults, fill};
use kubevm_emulator::{BlockingEmulator, Emulator, EmulatorOptions, ServeFlavor};
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;
const TOKEN: &str = "s3cr3t-export-token";

fn sha256_of_generated(emu: &BlockingEmulator, pvc: &str, size: u64) -> String {
    let key = emu.export_content_key("default", pvc);
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut buf = vec![0u8; MIB as usize];
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(MIB) as usize;
        fill(key, pos, &mut buf[..n]);
        stdin.write_all(&buf[..n]).unwrap();
        pos += n as u64;
    }
    drop(stdin);
    String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()[..64].to_string()
}

fn sha256_file(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// An emulator of `flavor` whose exports have no external link, its kubeconfig written in a
/// temporary directory, and PVC `disk` of `size` bytes.
fn without_external_links(flavor: ServeFlavor, size: u64) -> (BlockingEmulator, tempfile::TempDir) {
    let emu = Emulator::start_blocking(EmulatorOptions {
        flavor,
        import_step: Duration::from_millis(50),
        ..Default::default()
    })
    .unwrap();
    emu.set_export_faults(ExportFaults {
        no_external: true,
        ..Default::default()
    });
    let dir = tempfile::tempdir().unwrap();
    emu.write_kubeconfig(&dir.path().join("kubeconfig"))
        .unwrap();
    emu.put_object(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "disk", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size.to_string()}}},
        "status": {"phase": "Bound", "capacity": {"storage": size.to_string()}}}));
    (emu, dir)
}

/// `kubectl create -f -` of `object` with the kubeconfig in `dir`, as a client would (so the
/// emulator's controllers reconcile it).
fn kubectl_create(dir: &std::path::Path, object: Value) {
    let mut create = Command::new(kubectl_path())
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .args(["create", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    create
        .stdin
        .take()
        .unwrap()
        .write_all(object.to_string().as_bytes())
        .unwrap();
    assert!(create.wait().unwrap().success());
}

/// A KubeVirt emulator with PVC `disk` (`size` bytes) and a ready export `ex` of it that has no
/// external link.
fn ready_export(size: u64) -> (BlockingEmulator, tempfile::TempDir, Value) {
    let (emu, dir) = without_external_links(ServeFlavor::KubeVirt, size);
    emu.put_object(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "ex-token", "namespace": "default"},
        "data": {"token": base64::engine::general_purpose::STANDARD.encode(TOKEN)}}));
    kubectl_create(
        dir.path(),
        json!({"apiVersion": "export.kubevirt.io/v1", "kind": "VirtualMachineExport",
            "metadata": {"name": "ex", "namespace": "default"},
            "spec": {"source": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": "disk"},
                     "tokenSecretRef": "ex-token"}}),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let vme = emu
            .objects(
                "export.kubevirt.io",
                "virtualmachineexports",
                Some("default"),
            )
            .into_iter()
            .find(|o| o["status"]["phase"] == "Ready");
        if let Some(vme) = vme {
            return (emu, dir, vme);
        }
        assert!(Instant::now() < deadline, "export not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `kubectl port-forward pod/POD :PORT` and returns the child and the local port it
/// printed.
fn port_forward(dir: &Path, pod: &str, port: u16) -> (std::process::Child, u16) {
    let mut child = Command::new(kubectl_path())
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .args(["port-forward", &format!("pod/{pod}"), &format!(":{port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // "Forwarding from 127.0.0.1:40123 -> 8443"
    let line = lines.next().expect("kubectl printed nothing").unwrap();
    let local = line
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|r| r.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected kubectl output: {line}"));
    // Keep draining stdout so kubectl never blocks on it.
    std::thread::spawn(move || for _ in lines {});
    (child, local)
}

fn curl(args: &[&str]) -> std::process::Output {
    Command::new("curl").args(args).output().unwrap()
}

/// The reconciler creates the exporter pod and service as upstream does, with the internal
/// link on the service's DNS name.
#[test]
fn exporter_pod_and_service_like_upstream() {
    let (emu, _dir, vme) = ready_export(MIB);
    let uid = vme["metadata"]["uid"].clone();
    let pods = emu.objects("", "pods", Some("default"));
    let pod = pods
        .iter()
        .find(|p| p["metadata"]["name"] == "virt-export-ex")
        .expect("exporter pod");
    assert_eq!(
        pod["metadata"]["labels"]["kubevirt.io.virt-export-service"],
        "ex"
    );
    assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], uid);
    assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(pod["status"]["phase"], "Running");
    let svc = emu
        .objects("", "services", Some("default"))
        .into_iter()
        .find(|s| s["metadata"]["name"] == "virt-export-ex")
        .expect("service");
    assert_eq!(
        svc["spec"]["selector"]["kubevirt.io.virt-export-service"],
        "ex"
    );
    assert_eq!(svc["spec"]["ports"][0]["port"], 443);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8443);
    assert_eq!(vme["status"]["serviceName"], "virt-export-ex");
    assert!(vme["status"]["links"].get("external").is_none());
    assert_eq!(
        vme["status"]["links"]["internal"]["volumes"][0]["formats"][0]["url"],
        "https://virt-export-ex.default.svc/volumes/disk/disk.img"
    );
    // The internal cert is the export CA, not the external server's.
    assert_ne!(
        vme["status"]["links"]["internal"]["cert"].as_str().unwrap(),
        emu.export_ca_pem()
    );
}

/// Real kubectl port-forwards to the exporter pod; curl fetches the volume through it with TLS
/// verified against the internal link's CA for the service's DNS name; a wrong CA, a wrong
/// token and a port nothing listens on are refused.
#[test]
fn kubectl_port_forward_reaches_the_export_server() {
    let size = 8 * MIB;
    let (emu, dir, vme) = ready_export(size);
    let ca = dir.path().join("internal.pem");
    std::fs::write(
        &ca,
        vme["status"]["links"]["internal"]["cert"].as_str().unwrap(),
    )
    .unwrap();
    let (mut child, local) = port_forward(dir.path(), "virt-export-ex", 8443);
    let host = "virt-export-ex.default.svc";
    let resolve = format!("{host}:{local}:127.0.0.1");
    let url = format!("https://{host}:{local}/volumes/disk/disk.img");
    let out_file = dir.path().join("disk.img");
    let token = format!("x-kubevirt-export-token: {TOKEN}");
    let got = curl(&[
        "-sSf",
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        "-H",
        &token,
        "-o",
        out_file.to_str().unwrap(),
        &url,
    ]);
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(
        sha256_file(&out_file),
        sha256_of_generated(&emu, "disk", size)
    );

    // A second connection through the same forward, with a Range.
    let range = curl(&[
        "-sSf",
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        "-H",
        &token,
        "-r",
        "100-199",
        "-D",
        "-",
        "-o",
        "/dev/null",
        &url,
    ]);
    let headers = String::from_utf8_lossy(&range.stdout).to_lowercase();
    assert!(
        headers.contains(&format!("content-range: bytes 100-199/{size}")),
        "{headers}"
    );

    // The external server's CA did not sign the pod's certificate: curl refuses (60).
    let wrong = dir.path().join("wrong.pem");
    std::fs::write(&wrong, emu.export_ca_pem()).unwrap();
    let refused = curl(&[
        "-sS",
        "--cacert",
        wrong.to_str().unwrap(),
        "--resolve",
        &resolve,
        "-H",
        &token,
        "-o",
        "/dev/null",
        &url,
    ]);
    assert_eq!(refused.status.code(), Some(60), "{refused:?}");
    // The certificate names the service, not another host.
    let other = curl(&[
        "-sS",
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &format!("elsewhere.default.svc:{local}:127.0.0.1"),
        "-o",
        "/dev/null",
        &format!("https://elsewhere.default.svc:{local}/volumes/disk/disk.img"),
    ]);
    assert_eq!(other.status.code(), Some(60), "{other:?}");
    // No token: 401 from the export server.
    let unauthorized = curl(&[
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--cacert",
        ca.to_str().unwrap(),
        "--resolve",
        &resolve,
        &url,
    ]);
    assert_eq!(String::from_utf8_lossy(&unauthorized.stdout), "401");
    child.kill().unwrap();
    let _ = child.wait();

    // A port the pod does not listen on: kubectl reports the kubelet's error.
    let (mut child, local) = port_forward(dir.path(), "virt-export-ex", 9999);
    let failed = curl(&[
        "-sS",
        "--max-time",
        "10",
        &format!("http://127.0.0.1:{local}/"),
    ]);
    assert!(!failed.status.success());
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("connection refused"), "{err}");
}

/// kube-rs's `Api::portforward` (the `v4.channel.k8s.io` protocol kubectl-vm uses) gets the
/// port number as the first two bytes of each channel and a working byte stream.
#[test]
fn kube_rs_port_forward_over_v4_channels() {
    let size = 2 * MIB;
    let (emu, dir, vme) = ready_export(size);
    let kubeconfig = dir.path().join("kubeconfig");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ca_pem = vme["status"]["links"]["internal"]["cert"]
        .as_str()
        .unwrap()
        .to_string();
    let body = rt.block_on(async move {
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client, "default");
        let mut pf = pods.portforward("virt-export-ex", &[8443]).await.unwrap();
        let stream = pf.take_stream(8443).unwrap();
        // TLS to the service name over the forwarded stream, trusting only the export CA.
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("virt-export-ex.default.svc").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls))
            .connect(name, stream)
            .await
            .unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tls.write_all(
            format!(
                "GET /volumes/disk/disk.img HTTP/1.1\r\nHost: virt-export-ex.default.svc\r\nx-kubevirt-export-token: {TOKEN}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let mut all = vec![];
        let _ = tls.read_to_end(&mut all).await;
        drop(tls);
        let _ = pf.join().await;
        all
    });
    let split = body.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&body[..split]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let file = dir.path().join("kube-rs.img");
    std::fs::write(&file, &body[split..]).unwrap();
    assert_eq!(sha256_file(&file), sha256_of_generated(&emu, "disk", size));
}

/// Deckhouse: a DataExport without a public URL has an exporter pod with the IP of
/// `status.url`; real kubectl port-forwards to it and curl fetches `/api/v1/block` with the
/// kubeconfig's token, TLS verified against `status.ca` for that IP.
#[test]
fn kubectl_port_forward_reaches_the_deckhouse_exporter() {
    let size = 4 * MIB;
    let (emu, dir) = without_external_links(ServeFlavor::Deckhouse, size);
    kubectl_create(
        dir.path(),
        json!({"apiVersion": "storage-foundation.deckhouse.io/v1alpha1", "kind": "DataExport",
            "metadata": {"name": "de", "namespace": "default"},
            "spec": {"ttl": "1h", "publish": true, "targetRef": {"kind": "PersistentVolumeClaim", "name": "disk"}}}),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let de = loop {
        let de = emu
            .objects(
                "storage-foundation.deckhouse.io",
                "dataexports",
                Some("default"),
            )
            .into_iter()
            .find(|o| o["status"]["phase"] == "Ready");
        if let Some(de) = de {
            break de;
        }
        assert!(Instant::now() < deadline, "DataExport not ready");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(de["status"].get("publicURL").is_none());
    let url = de["status"]["url"].as_str().unwrap();
    let ip = url
        .strip_prefix("https://")
        .and_then(|r| r.strip_suffix(":8085"))
        .unwrap();
    let pod = emu
        .objects("", "pods", Some("default"))
        .into_iter()
        .find(|p| p["status"]["podIP"] == ip)
        .expect("a pod with the exporter's IP");
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["uid"],
        de["metadata"]["uid"]
    );
    let ca = dir.path().join("ca.pem");
    std::fs::write(
        &ca,
        base64::engine::general_purpose::STANDARD
            .decode(de["status"]["ca"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let yaml: Value = yaml_serde::from_str(&emu.kubeconfig_yaml()).unwrap();
    let token = yaml["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "admin")
        .unwrap()["user"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    let (mut child, local) =
        port_forward(dir.path(), pod["metadata"]["name"].as_str().unwrap(), 8085);
    let out_file = dir.path().join("disk.img");
    let got = curl(&[
        "-sSf",
        "--cacert",
        ca.to_str().unwrap(),
        "--connect-to",
        &format!("{ip}:8085:127.0.0.1:{local}"),
        "-H",
        &format!("Authorization: Bearer {token}"),
        "-o",
        out_file.to_str().unwrap(),
        &format!("{url}/api/v1/block"),
    ]);
    assert!(
        got.status.success(),
        "{}",
        String::from_utf8_lossy(&got.stderr)
    );
    assert_eq!(
        sha256_file(&out_file),
        sha256_of_generated(&emu, "disk", size)
    );
    // Without credentials the exporter answers 401.
    let anonymous = curl(&[
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--cacert",
        ca.to_str().unwrap(),
        "--connect-to",
        &format!("{ip}:8085:127.0.0.1:{local}"),
        &format!("{url}/api/v1/block"),
    ]);
    assert_eq!(String::from_utf8_lossy(&anonymous.stdout), "401");
    child.kill().unwrap();
    let _ = child.wait();
}
