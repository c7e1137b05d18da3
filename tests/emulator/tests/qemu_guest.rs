//! The qemu guest (src/qemu_guest.rs) on the real image of tests/guest/build-image.sh: a VM that
//! runs boots Debian under qemu TCG with the VM's cloud-init; the serial console shows a login
//! prompt and a command typed there runs; port 22 answers with OpenSSH's banner; the guest
//! agent reports the OS; a stop is an ACPI power-off, finished only when qemu has exited, and
//! kills qemu when the grace period ends; a guest reboot stays in its qemu and VMI, a guest
//! power-off ends the VMI (Succeeded) and the run strategy decides what follows.
//!
//! Ignored by default (they need the image): `cargo test -p kubevm-emulator --test integration qemu_guest::
//! -- --ignored` after `tests/guest/build-image.sh` (or with `KUBEVM_GUEST_DIR`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kubevm_emulator::core::expect::SerialReader;
use kubevm_emulator::core::qemu_guest::{QemuConfig, QemuGuests};
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::common;
use common::client;

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

/// A KubeVirt emulator whose VMs boot the real guest image.
async fn kubevirt_with_qemu_guests() -> (Emulator, Arc<QemuGuests>) {
    let config = QemuConfig::from_dir(&QemuConfig::default_dir()).expect("the guest image");
    let emu = Emulator::start(EmulatorOptions {
        flavor: ServeFlavor::KubeVirt,
        ..Default::default()
    })
    .await
    .unwrap();
    let guests = emu.use_qemu_guests(config).unwrap();
    (emu, guests)
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
    let (emu, guests) = kubevirt_with_qemu_guests().await;
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
    let mut out = SerialReader::new(serial.output.subscribe());
    let seen = press_return_until_login(&serial, &mut out, Duration::from_secs(150)).await;
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

async fn expect(text: &str, out: &mut SerialReader) -> String {
    out.expect(text, Duration::from_secs(60)).await
}

async fn wait_for_banner(guest: &dyn kubevm_emulator::core::guest::Guest) -> String {
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
    let (emu, guests) = kubevirt_with_qemu_guests().await;
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

/// Types `line` and a return into the serial console.
fn type_line(serial: &kubevm_emulator::core::guest::Serial, line: &str) {
    serial
        .input
        .send(Bytes::from(format!("{line}\r").into_bytes()))
        .unwrap();
}

/// Presses return (every 5 s) until the login prompt shows; returns the output up to it.
async fn press_return_until_login(
    serial: &kubevm_emulator::core::guest::Serial,
    out: &mut SerialReader,
    limit: Duration,
) -> String {
    let deadline = Instant::now() + limit;
    loop {
        type_line(serial, "");
        let next_enter = (Instant::now() + Duration::from_secs(5)).min(deadline);
        match out.expect_by("login: ", next_enter.into()).await {
            Ok(seen) => return seen,
            Err(seen) => assert!(Instant::now() < deadline, "no login prompt; seen {seen:?}"),
        }
    }
}

/// Presses return until the login prompt shows, then logs in as root.
async fn login(
    serial: &kubevm_emulator::core::guest::Serial,
    out: &mut SerialReader,
    limit: Duration,
) {
    press_return_until_login(serial, out, limit).await;
    type_line(serial, "root");
    expect("Password: ", out).await;
    type_line(serial, "root");
    expect("# ", out).await;
}

fn printable_status(emu: &Emulator, name: &str) -> String {
    emu.objects("kubevirt.io", "virtualmachines", Some("default"))
        .into_iter()
        .find(|o| o["metadata"]["name"] == name)
        .and_then(|vm| vm["status"]["printableStatus"].as_str().map(String::from))
        .unwrap_or_default()
}

/// A guest `reboot` resets the machine in the same qemu (same VMI, same process); a power-off
/// from inside (`systemctl poweroff`) ends the VMI `Succeeded` and, under runStrategy Manual,
/// the VM stays `Stopped` (vm.go `syncRunStrategy`) with no new boot. The disk is as large as
/// the VM's PVC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
async fn qemu_guest_reboots_in_place_and_powering_off_stops_a_manual_vm() {
    let (emu, guests) = kubevirt_with_qemu_guests().await;
    let _tail = Tail(guests.clone(), "default", "qoff");
    let client = client(&emu).await;
    let started = Instant::now();
    let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "qoff-root", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "3Gi"}}}});
    let request = http::Request::post("/api/v1/namespaces/default/persistentvolumeclaims")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&pvc).unwrap())
        .unwrap();
    client.request_text(request).await.unwrap();
    create_vm(
        &client,
        json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "qoff", "namespace": "default"},
            "spec": {"runStrategy": "Manual", "template": {"spec": {
                "domain": {"devices": {"disks": [
                    {"name": "rootdisk", "disk": {"bus": "virtio"}, "bootOrder": 1},
                    {"name": "cloudinit", "disk": {"bus": "virtio"}}]}},
                "volumes": [
                    {"name": "rootdisk", "persistentVolumeClaim": {"claimName": "qoff-root"}},
                    {"name": "cloudinit", "cloudInitNoCloud": {"userData": USER_DATA}}]}}}
        }),
    )
    .await;
    vm_action(&client, "qoff", "start").await;
    let pid = wait_for("a qemu process", Duration::from_secs(30), || {
        guests.pids().first().copied()
    })
    .await;
    let uid = wait_for("a running VMI", Duration::from_secs(10), || {
        let v = vmi(&emu, "qoff")?;
        (v["status"]["phase"] == "Running").then(|| v["metadata"]["uid"].clone())
    })
    .await;
    let guest = emu.guest("default", "qoff").unwrap().expect("running");
    let serial = guest.serial();
    let mut out = SerialReader::new(serial.output.subscribe());
    login(&serial, &mut out, Duration::from_secs(150)).await;
    eprintln!("logged in after {:.1}s", started.elapsed().as_secs_f64());

    // The disk is the PVC's 3Gi (in 512-byte sectors), not the 2 GiB base image.
    type_line(&serial, "echo sectors=$(cat /sys/block/vda/size)");
    expect(
        &format!("sectors={}", 3u64 * 1024 * 1024 * 1024 / 512),
        &mut out,
    )
    .await;

    // reboot: the machine resets in the same qemu, for the same VMI (a new kernel boots). A
    // unit enabled now powers the next boot off early, from inside (no second login needed).
    type_line(
        &serial,
        concat!(
            r"printf '[Unit]\nDefaultDependencies=no\n[Service]\nType=oneshot\n",
            r"ExecStart=/bin/systemctl poweroff --no-block\n[Install]\nWantedBy=sysinit.target\n'",
            " > /etc/systemd/system/off-at-boot.service && systemctl enable off-at-boot 2>&1",
            " && echo unit=$((40+2))"
        ),
    );
    expect("unit=42", &mut out).await;
    let reboot = Instant::now();
    type_line(&serial, "reboot");
    expect("reboot: Restarting system", &mut out).await;
    expect("Linux version", &mut out).await;
    eprintln!(
        "reset in place after {:.1}s",
        reboot.elapsed().as_secs_f64()
    );
    assert!(pid_alive(pid), "the same qemu process");
    assert_eq!(guests.pids(), vec![pid]);
    let v = vmi(&emu, "qoff").expect("the VMI");
    assert_eq!(
        (&v["metadata"]["uid"], &v["status"]["phase"]),
        (&uid, &json!("Running"))
    );

    // The guest powers off: the VMI succeeds, qemu is gone, the Manual VM is Stopped and
    // stays so.
    let poweroff = Instant::now();
    wait_for("the VMI to succeed", Duration::from_secs(120), || {
        let v = vmi(&emu, "qoff")?;
        (v["status"]["phase"] == "Succeeded").then_some(())
    })
    .await;
    eprintln!(
        "powered off from inside {:.1}s after the reset",
        poweroff.elapsed().as_secs_f64()
    );
    assert!(!pid_alive(pid));
    wait_for("printableStatus Stopped", Duration::from_secs(10), || {
        (printable_status(&emu, "qoff") == "Stopped").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = vmi(&emu, "qoff").expect("the final VMI stays (Manual)");
    assert_eq!(
        (&v["metadata"]["uid"], &v["status"]["phase"]),
        (&uid, &json!("Succeeded"))
    );
    assert!(guests.pids().is_empty(), "not booted again");
    assert!(emu.guest("default", "qoff").unwrap().is_none());
    emu.shutdown().await;
}

/// A stop kills a guest that does not power off (one still in early boot, where nothing
/// handles the ACPI button) once the VMI's `terminationGracePeriodSeconds` has passed. Also:
/// starting removes the disk directory of an emulator that died (its owner process is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the qemu guest image: tests/run-all.sh builds it"]
async fn qemu_guest_stop_kills_after_the_grace_period() {
    // A directory left by an emulator that was killed: its owner process has exited.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = std::env::temp_dir().join(format!("kubevm-qemu-stale-{}", std::process::id()));
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("owner"), format!("{dead} 1\n")).unwrap();
    std::fs::write(stale.join("overlay.qcow2"), "left behind").unwrap();

    let (emu, guests) = kubevirt_with_qemu_guests().await;
    assert!(!stale.exists(), "the dead emulator's directory is removed");
    let _tail = Tail(guests.clone(), "default", "qgrace");
    let client = client(&emu).await;
    create_vm(
        &client,
        json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "qgrace", "namespace": "default"},
            "spec": {"runStrategy": "Always", "template": {"spec": {
                "terminationGracePeriodSeconds": 3, "domain": {"devices": {}}}}}
        }),
    )
    .await;
    let pid = wait_for("a qemu process", Duration::from_secs(30), || {
        guests.pids().first().copied()
    })
    .await;
    let stop = Instant::now();
    vm_action(&client, "qgrace", "stop").await;
    wait_for("qemu to be killed", Duration::from_secs(20), || {
        (!pid_alive(pid)).then_some(())
    })
    .await;
    let took = stop.elapsed();
    eprintln!("killed {:.1}s after the stop", took.as_secs_f64());
    assert!(
        took >= Duration::from_millis(2500),
        "the grace period was given: {took:?}"
    );
    wait_for("the VMI to go", Duration::from_secs(10), || {
        vmi(&emu, "qgrace").is_none().then_some(())
    })
    .await;
    emu.shutdown().await;
}
