//! The qemu guest (src/qemu_guest.rs) on the real image of tests/guest/build-image.sh: a VM that
//! runs boots Debian under qemu TCG with the VM's cloud-init; the serial console shows a login
//! prompt and a command typed there runs; port 22 answers with OpenSSH's banner; the guest
//! agent reports the OS; a stop is an ACPI power-off, finished only when qemu has exited.
//!
//! Ignored by default (they need the image): `cargo test -p kubevm-emulator --test qemu_guest
//! -- --ignored` after `tests/guest/build-image.sh` (or with `KUBEVM_GUEST_DIR`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kubevm_emulator::qemu_guest::{QemuConfig, QemuGuests};
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

fn pid_alive(pid: i32) -> bool {
    // Not a zombie either: the emulator reaps its qemu.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// Prints the guest's serial log tail if the test fails.
struct Tail(Arc<QemuGuests>, &'static str, &'static str);

impl Drop for Tail {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- serial log of {}/{} (tail) ----\n{}",
                self.1,
                self.2,
                self.0.serial_log_tail(self.1, self.2, 4000)
            );
        }
    }
}

async fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn client(emu: &Emulator) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&emu.kubeconfig_yaml()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

/// Creates a VM through the API (objects put directly are fixtures the controllers leave alone).
async fn create_vm(client: &kube::Client, vm: Value) {
    let request = http::Request::post("/apis/kubevirt.io/v1/namespaces/default/virtualmachines")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&vm).unwrap())
        .unwrap();
    client.request_text(request).await.unwrap();
}

/// `PUT subresources.kubevirt.io/.../virtualmachines/NAME/ACTION`.
async fn vm_action(client: &kube::Client, name: &str, action: &str) {
    let request = http::Request::put(format!(
        "/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachines/{name}/{action}"
    ))
    .header("content-type", "application/json")
    .body(b"{}".to_vec())
    .unwrap();
    client.request_text(request).await.unwrap();
}

fn vmi(emu: &Emulator, name: &str) -> Option<Value> {
    emu.objects("kubevirt.io", "virtualmachineinstances", Some("default"))
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
}

const USER_DATA: &str =
    "#cloud-config\nruncmd:\n- echo qemu-guest-runcmd > /var/tmp/runcmd-marker\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
async fn qemu_guest_boots_serves_console_ssh_agent_and_powers_off() {
    let config = QemuConfig::from_dir(&QemuConfig::default_dir()).expect("the guest image");
    let emu = Emulator::start(EmulatorOptions {
        flavor: ServeFlavor::KubeVirt,
        ..Default::default()
    })
    .await
    .unwrap();
    let guests = emu.use_qemu_guests(config).unwrap();
    let _tail = Tail(guests.clone(), "default", "qvm");
    let client = client(&emu).await;
    let started = Instant::now();
    create_vm(&client, json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "qvm", "namespace": "default"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "cloudinit", "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": "cloudinit", "cloudInitNoCloud": {"userData": USER_DATA}}]}}}
    }))
    .await;
    // The guest boots once the VMI runs, without anyone connecting.
    let pid = wait_for("a qemu process", Duration::from_secs(30), || {
        guests.pids().first().copied()
    })
    .await;
    assert!(pid_alive(pid));
    let guest = emu
        .guest("default", "qvm")
        .unwrap()
        .expect("guest of a running VM");
    assert_eq!(
        guests.pids(),
        vec![pid],
        "the same guest, not a second boot"
    );

    // Serial console: a getty's login prompt, then root/root and a shell command.
    let serial = guest.serial();
    let mut out = serial.output.subscribe();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut last_enter = Instant::now() - Duration::from_secs(10);
    while !seen.contains("login: ") {
        assert!(Instant::now() < deadline, "no login prompt; seen {seen:?}");
        if last_enter.elapsed() > Duration::from_secs(5) {
            serial.input.send(Bytes::from_static(b"\r")).unwrap();
            last_enter = Instant::now();
        }
        if let Ok(Ok(b)) = tokio::time::timeout(Duration::from_millis(500), out.recv()).await {
            seen.push_str(&String::from_utf8_lossy(&b));
        }
    }
    eprintln!("login prompt after {:.1}s", started.elapsed().as_secs_f64());
    assert!(
        seen.contains("qvm login: "),
        "hostname from meta-data: {seen:?}"
    );
    serial.input.send(Bytes::from_static(b"root\r")).unwrap();
    expect("Password: ", &mut out).await;
    serial.input.send(Bytes::from_static(b"root\r")).unwrap();
    expect("# ", &mut out).await;
    serial
        .input
        .send(Bytes::from_static(b"echo sum=$((6*7))\r"))
        .unwrap();
    expect("sum=42", &mut out).await;

    // Port 22: sshd's banner over a forwarded port (sshd may still be starting: retry).
    let banner = wait_for_banner(&*guest).await;
    assert!(banner.starts_with("SSH-2.0-OpenSSH"), "{banner:?}");
    eprintln!("ssh banner after {:.1}s", started.elapsed().as_secs_f64());

    // The agent: AgentConnected and the guest's own OS info on the VMI.
    let os = wait_for("AgentConnected", Duration::from_secs(120), || {
        let v = vmi(&emu, "qvm")?;
        let connected = v["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "AgentConnected" && c["status"] == "True");
        connected.then(|| v["status"]["guestOSInfo"].clone())
    })
    .await;
    assert_eq!(os["id"], "debian", "{os}");
    assert_eq!(os["versionId"], "12", "{os}");
    assert!(
        os["kernelRelease"].as_str().unwrap().contains("amd64"),
        "{os}"
    );
    // The runcmd of the VM's cloud-config ran (it is in the seed byte for byte); cloud-init's
    // final stage may still be running.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        serial
            .input
            .send(Bytes::from_static(b"cat /var/tmp/runcmd-marker\r"))
            .unwrap();
        if tokio::time::timeout(
            Duration::from_secs(3),
            expect("qemu-guest-runcmd", &mut out),
        )
        .await
        .is_ok()
        {
            break;
        }
        assert!(Instant::now() < deadline, "runcmd did not run");
    }

    // Stop: the VMI stays (VM Stopping) until the guest has powered off, then goes.
    let stop = Instant::now();
    vm_action(&client, "qvm", "stop").await;
    let mut saw_stopping_with_qemu = false;
    wait_for("the VMI to go", Duration::from_secs(90), || {
        if vmi(&emu, "qvm").is_some() && pid_alive(pid) {
            saw_stopping_with_qemu = true;
        }
        vmi(&emu, "qvm").is_none().then_some(())
    })
    .await;
    assert!(!pid_alive(pid), "qemu has exited before the VMI is gone");
    assert!(saw_stopping_with_qemu, "the stop waited for the guest");
    eprintln!("powered off in {:.1}s", stop.elapsed().as_secs_f64());
    assert!(guests.pids().is_empty());
    emu.shutdown().await;
}

async fn expect(text: &str, out: &mut tokio::sync::broadcast::Receiver<Bytes>) -> String {
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.contains(text) {
        assert!(
            Instant::now() < deadline,
            "waiting for {text:?}; seen {seen:?}"
        );
        if let Ok(Ok(b)) = tokio::time::timeout(Duration::from_millis(500), out.recv()).await {
            seen.push_str(&String::from_utf8_lossy(&b));
        }
    }
    seen
}

async fn wait_for_banner(guest: &dyn kubevm_emulator::guest::Guest) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(mut conn) = guest.dial(22).await {
            let mut buf = vec![0u8; 64];
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await
                && n > 0
            {
                return String::from_utf8_lossy(&buf[..n]).into_owned();
            }
        }
        assert!(Instant::now() < deadline, "no ssh banner");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
async fn shutdown_kills_every_qemu() {
    let config = QemuConfig::from_dir(&QemuConfig::default_dir()).expect("the guest image");
    let emu = Emulator::start(EmulatorOptions {
        flavor: ServeFlavor::KubeVirt,
        ..Default::default()
    })
    .await
    .unwrap();
    let guests = emu.use_qemu_guests(config).unwrap();
    create_vm(
        &client(&emu).await,
        json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "gone", "namespace": "default"},
            "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {}}}}}
        }),
    )
    .await;
    let pid = wait_for("a qemu process", Duration::from_secs(30), || {
        guests.pids().first().copied()
    })
    .await;
    emu.shutdown().await;
    wait_for("qemu to be killed", Duration::from_secs(10), || {
        (!pid_alive(pid)).then_some(())
    })
    .await;
}
