//! Guests that power themselves off or die, and grace periods (guest_exit.rs), with guests
//! whose end the test decides.

use super::tests::{deckhouse, dh, get, kubevirt, op, printable, put, ticks, vm};
use super::*;
use crate::core::guest::{DialFuture, Guest, GuestExit, GuestFactory, GuestSpec, Serial};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// A guest that ends when the test says, by itself or because it was told to.
struct TestGuest {
    spec: GuestSpec,
    off: watch::Sender<bool>,
    exit: Mutex<Option<GuestExit>>,
    /// The grace period of the last stop (None: a stop without one).
    grace: Mutex<Option<Option<Duration>>>,
}

impl TestGuest {
    /// The guest ends by itself.
    fn end(&self, exit: GuestExit) {
        *self.exit.lock().unwrap() = Some(exit);
        self.off.send_replace(true);
    }
}

impl Guest for TestGuest {
    fn spec(&self) -> &GuestSpec {
        &self.spec
    }
    fn serial(&self) -> Serial {
        Serial {
            input: tokio::sync::mpsc::unbounded_channel().0,
            output: tokio::sync::broadcast::channel(1).0,
            consoles: Default::default(),
            transcript: Default::default(),
        }
    }
    fn dial(&self, _port: u16) -> DialFuture {
        Box::pin(async { Err(std::io::Error::other("no ports")) })
    }
    fn stop(&self) {
        *self.grace.lock().unwrap() = Some(None);
    }
    fn stop_within(&self, grace: Duration) {
        *self.grace.lock().unwrap() = Some(Some(grace));
    }
    fn kill(&self) {
        self.off.send_replace(true);
    }
    fn graceful(&self) -> bool {
        true
    }
    fn stopped(&self) -> watch::Receiver<bool> {
        self.off.subscribe()
    }
    fn exit(&self) -> Option<GuestExit> {
        *self.exit.lock().unwrap()
    }
}

#[derive(Default)]
struct TestGuests(Mutex<Vec<Arc<TestGuest>>>);

impl TestGuests {
    fn last(&self) -> Arc<TestGuest> {
        self.0.lock().unwrap().last().unwrap().clone()
    }
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

impl GuestFactory for TestGuests {
    fn boot(&self, spec: &GuestSpec) -> std::io::Result<Arc<dyn Guest>> {
        let g = Arc::new(TestGuest {
            spec: spec.clone(),
            off: watch::channel(false).0,
            exit: Mutex::default(),
            grace: Mutex::default(),
        });
        self.0.lock().unwrap().push(g.clone());
        Ok(g)
    }
    fn eager(&self) -> bool {
        true
    }
}

fn with_guests(app: &App) -> Arc<TestGuests> {
    let factory = Arc::new(TestGuests::default());
    app.guests.set_factory(factory.clone());
    factory
}

/// What the emulator's guest loop does each second, then controller ticks.
fn settle(app: &App, n: usize) {
    for _ in 0..n {
        app.guests.sync(app);
        app.guests.boot_missing(app);
        ticks(app, 1);
    }
}

fn vmi_uid(app: &App) -> Option<Value> {
    get(app, "virtualmachineinstances", "web").map(|v| v["metadata"]["uid"].clone())
}

fn running_vm(app: &App, rs: &str) -> Arc<TestGuests> {
    let factory = with_guests(app);
    vm(app, "web", rs, json!({}));
    if rs == "Manual" {
        ticks(app, 1);
        assert_eq!(
            put(app, "virtualmachines", "web", "start", json!({})),
            Ok(202)
        );
    }
    settle(app, 5);
    assert_eq!(
        phase(&get(app, "virtualmachineinstances", "web").unwrap()),
        "Running"
    );
    assert_eq!(factory.count(), 1, "booted");
    factory
}

#[test]
fn always_restarts_a_guest_that_powered_off() {
    let app = kubevirt();
    let guests = running_vm(&app, "Always");
    let first = vmi_uid(&app).unwrap();
    guests.last().end(GuestExit::PoweredOff);
    app.guests.sync(&app);
    let vmi = get(&app, "virtualmachineinstances", "web").unwrap();
    assert_eq!(phase(&vmi), "Succeeded", "the VMI of that boot succeeded");
    let pods = app.store.list("", "pods", Some("default")).0;
    assert_eq!(pods[0]["status"]["phase"], "Succeeded");
    // The VM controller replaces it: a new VMI, and a new boot for it.
    settle(&app, 6);
    let vmi = get(&app, "virtualmachineinstances", "web").unwrap();
    assert_ne!(vmi["metadata"]["uid"], first);
    assert_eq!(phase(&vmi), "Running");
    assert_eq!(printable(&app, "web"), "Running");
    assert_eq!(guests.count(), 2);
}

#[test]
fn manual_keeps_the_succeeded_vmi_and_shows_stopped() {
    let app = kubevirt();
    let guests = running_vm(&app, "Manual");
    let first = vmi_uid(&app).unwrap();
    guests.last().end(GuestExit::PoweredOff);
    settle(&app, 5);
    let vmi = get(&app, "virtualmachineinstances", "web").unwrap();
    assert_eq!(vmi["metadata"]["uid"], first);
    assert_eq!(phase(&vmi), "Succeeded");
    assert_eq!(printable(&app, "web"), "Stopped");
    assert_eq!(guests.count(), 1, "not booted again");
    // A start replaces the final VMI (stateChangeRequests Stop{uid}, Start).
    assert_eq!(
        put(&app, "virtualmachines", "web", "start", json!({})),
        Ok(202)
    );
    settle(&app, 6);
    let vmi = get(&app, "virtualmachineinstances", "web").unwrap();
    assert_ne!(vmi["metadata"]["uid"], first);
    assert_eq!(phase(&vmi), "Running");
    assert_eq!(guests.count(), 2);
}

#[test]
fn rerun_on_failure_stays_stopped_after_a_power_off_and_reruns_a_crash() {
    let app = kubevirt();
    let guests = running_vm(&app, "RerunOnFailure");
    let first = vmi_uid(&app).unwrap();
    // A crash: a new VMI.
    guests.last().end(GuestExit::Crashed);
    app.guests.sync(&app);
    assert_eq!(
        phase(&get(&app, "virtualmachineinstances", "web").unwrap()),
        "Failed"
    );
    settle(&app, 6);
    let second = vmi_uid(&app).unwrap();
    assert_ne!(second, first);
    assert_eq!(guests.count(), 2);
    // A power-off: the VMI goes and the VM stays stopped.
    guests.last().end(GuestExit::PoweredOff);
    settle(&app, 6);
    assert_eq!(vmi_uid(&app), None);
    assert_eq!(printable(&app, "web"), "Stopped");
    assert_eq!(guests.count(), 2);
    // Until started.
    assert_eq!(
        put(&app, "virtualmachines", "web", "start", json!({})),
        Ok(202)
    );
    settle(&app, 6);
    assert_eq!(
        phase(&get(&app, "virtualmachineinstances", "web").unwrap()),
        "Running"
    );
    assert_eq!(guests.count(), 3);
}

#[test]
fn a_stop_gives_the_guest_the_vmi_grace_period() {
    let app = kubevirt();
    let guests = with_guests(&app);
    app.store
        .create(
            KV,
            "virtualmachines",
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"runStrategy": "Always", "template": {"spec": {
                    "terminationGracePeriodSeconds": 7, "domain": {"devices": {}}}}}}),
        )
        .unwrap();
    settle(&app, 5);
    assert_eq!(
        put(&app, "virtualmachines", "web", "stop", json!({})),
        Ok(202)
    );
    settle(&app, 2);
    assert_eq!(
        *guests.last().grace.lock().unwrap(),
        Some(Some(Duration::from_secs(7)))
    );
    // Unset: KubeVirt's default.
    let app = kubevirt();
    let guests = running_vm(&app, "Always");
    assert_eq!(
        put(&app, "virtualmachines", "web", "stop", json!({})),
        Ok(202)
    );
    settle(&app, 2);
    assert_eq!(
        *guests.last().grace.lock().unwrap(),
        Some(Some(Duration::from_secs(30)))
    );
}

fn deckhouse_running(policy: &str) -> (App, Arc<TestGuests>) {
    let app = deckhouse();
    app.store
        .modify(&Key::new(DH, "virtualmachines", "default", "linux"), |o| {
            o["spec"]["runPolicy"] = json!(policy);
            o["spec"]["terminationGracePeriodSeconds"] = json!(9);
        });
    let guests = with_guests(&app);
    if policy == "Manual" {
        op(&app, "Start", json!({}));
    }
    settle(&app, 4);
    assert_eq!(
        dh(&app, "virtualmachines", "linux")["status"]["phase"],
        "Running"
    );
    assert_eq!(guests.count(), 1);
    (app, guests)
}

fn start_time(app: &App) -> Value {
    dh(app, "virtualmachines", "linux")["status"]["stats"]["lastStartTime"].clone()
}

#[test]
fn deckhouse_always_on_restarts_and_unless_stopped_manually_stops() {
    let (app, guests) = deckhouse_running("AlwaysOn");
    let started = start_time(&app);
    std::thread::sleep(Duration::from_millis(1100));
    guests.last().end(GuestExit::PoweredOff);
    settle(&app, 3);
    assert_eq!(
        dh(&app, "virtualmachines", "linux")["status"]["phase"],
        "Running"
    );
    assert_ne!(start_time(&app), started, "a new start");
    assert_eq!(guests.count(), 2, "booted again");

    let (app, guests) = deckhouse_running("AlwaysOnUnlessStoppedManually");
    guests.last().end(GuestExit::PoweredOff);
    settle(&app, 3);
    assert_eq!(
        dh(&app, "virtualmachines", "linux")["status"]["phase"],
        "Stopped"
    );
    assert_eq!(guests.count(), 1);
}

#[test]
fn deckhouse_stop_gives_the_guest_the_vm_grace_period() {
    let (app, guests) = deckhouse_running("Manual");
    op(&app, "Stop", json!({}));
    settle(&app, 3);
    assert_eq!(
        *guests.last().grace.lock().unwrap(),
        Some(Some(Duration::from_secs(9)))
    );
}
