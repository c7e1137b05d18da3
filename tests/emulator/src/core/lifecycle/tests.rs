//! Tests of the lifecycle emulation.

use super::*;
use crate::ServeFlavor;
use crate::core::controllers::reconcile_all;
use crate::core::handlers::parse_path;
use crate::core::registry::Registry;
use std::time::Duration;

pub(super) fn kubevirt() -> App {
    let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
    for (n, labels) in [
        ("node-1", json!({"kubernetes.io/hostname": "node-1"})),
        ("node-2", json!({"kubernetes.io/hostname": "node-2"})),
    ] {
        app.store
                .create("", "nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": labels}}))
                .unwrap();
    }
    app
}

pub(super) fn vm(app: &App, name: &str, rs: &str, annotations: Value) -> Value {
    app.store
        .create(
            KV,
            "virtualmachines",
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": name, "namespace": "default", "annotations": annotations},
                "spec": {"runStrategy": rs, "template": {"spec": {"domain": {"devices": {}}}}}}),
        )
        .unwrap()
}

pub(super) fn put(
    app: &App,
    plural: &str,
    name: &str,
    sub: &str,
    body: Value,
) -> Result<u16, (u16, String)> {
    let path =
        format!("/apis/subresources.kubevirt.io/v1/namespaces/default/{plural}/{name}/{sub}");
    let rp = parse_path(&path).unwrap();
    let body = Bytes::from(body.to_string());
    match action(app, &rp, sub, &Query::new(), &body).unwrap() {
        Ok(r) => Ok(r.status().as_u16()),
        Err(e) => Err((e.code, e.message)),
    }
}

pub(super) fn ticks(app: &App, n: usize) {
    for _ in 0..n {
        reconcile_all(app, true);
    }
}

pub(super) fn get(app: &App, plural: &str, name: &str) -> Option<Value> {
    app.store.get(&Key::new(KV, plural, "default", name))
}

/// A `subresources.kubevirt.io` action on a VirtualMachine.
fn vm_action(app: &App, name: &str, sub: &str, body: Value) -> Result<u16, (u16, String)> {
    put(app, "virtualmachines", name, sub, body)
}

/// A `subresources.kubevirt.io` action on a VirtualMachineInstance.
fn vmi_action(app: &App, name: &str, sub: &str, body: Value) -> Result<u16, (u16, String)> {
    put(app, "virtualmachineinstances", name, sub, body)
}

fn get_vmi(app: &App, name: &str) -> Option<Value> {
    get(app, "virtualmachineinstances", name)
}

pub(super) fn printable(app: &App, name: &str) -> String {
    get(app, "virtualmachines", name).unwrap()["status"]["printableStatus"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[test]
fn start_goes_through_vmi_phases_with_a_launcher_pod() {
    let app = kubevirt();
    vm(&app, "web", "Always", json!({}));
    reconcile_all(&app, false);
    assert_eq!(phase(&get_vmi(&app, "web").unwrap()), "Pending");
    assert_eq!(printable(&app, "web"), "Starting");
    ticks(&app, 1);
    assert_eq!(phase(&get_vmi(&app, "web").unwrap()), "Scheduling");
    let pods = app.store.list("", "pods", Some("default")).0;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["status"]["phase"], "Pending");
    ticks(&app, 3);
    assert_eq!(printable(&app, "web"), "Running");
    let pods = app.store.list("", "pods", Some("default")).0;
    assert_eq!(pods[0]["status"]["phase"], "Running");
    // virt-handler reports the pod's IP as the VMI's.
    let vmi = get_vmi(&app, "web").unwrap();
    assert_eq!(
        pods[0]["status"]["podIP"],
        vmi["status"]["interfaces"][0]["ipAddress"]
    );
    assert_ne!(pods[0]["status"]["podIP"], "");
}

/// template.go RenderLaunchManifest: the VMI's labels, plus `kubevirt.io: virt-launcher`,
/// `kubevirt.io/created-by: <VMI uid>` and `vm.kubevirt.io/name: <SanitizeHostname>` (the
/// template's hostname, else the name up to its first dot).
#[test]
fn launcher_pod_labels_are_virt_controllers() {
    let app = kubevirt();
    for (name, hostname) in [("web.v2", None), ("db", Some("pg-primary"))] {
        let mut template =
            json!({"metadata": {"labels": {"app": name}}, "spec": {"domain": {"devices": {}}}});
        if let Some(h) = hostname {
            template["spec"]["hostname"] = json!(h);
        }
        app.store
            .create(
                KV,
                "virtualmachines",
                json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"runStrategy": "Always", "template": template}}),
            )
            .unwrap();
    }
    ticks(&app, 5);
    let pods = app.store.list("", "pods", Some("default")).0;
    assert_eq!(pods.len(), 2);
    for (name, host) in [("web.v2", "web"), ("db", "pg-primary")] {
        let vmi = get_vmi(&app, name).unwrap();
        let pod = pods
            .iter()
            .find(|p| p["metadata"]["labels"]["kubevirt.io/created-by"] == vmi["metadata"]["uid"])
            .expect("the VMI's pod");
        let labels = &pod["metadata"]["labels"];
        assert_eq!(labels["app"], name);
        assert_eq!(labels["kubevirt.io"], "virt-launcher");
        assert_eq!(labels["vm.kubevirt.io/name"], host);
        assert!(labels.get("kubevirt.io/nodeName").is_none());
    }
}

#[test]
fn always_stop_sets_halted_and_start_is_refused_while_running() {
    let app = kubevirt();
    vm(&app, "web", "Always", json!({}));
    ticks(&app, 5);
    assert_eq!(
        vm_action(&app, "web", "start", json!({})),
        Err((409, "VM is already running".into()))
    );
    assert_eq!(vm_action(&app, "web", "stop", json!({})), Ok(202));
    assert_eq!(
        get(&app, "virtualmachines", "web").unwrap()["spec"]["runStrategy"],
        "Halted"
    );
    ticks(&app, 1);
    assert_eq!(printable(&app, "web"), "Stopping");
    ticks(&app, 2);
    assert_eq!(printable(&app, "web"), "Stopped");
    assert!(get_vmi(&app, "web").is_none());
    assert!(app.store.list("", "pods", Some("default")).0.is_empty());
    assert_eq!(
        vm_action(&app, "web", "stop", json!({})),
        Err((409, "VM is not running".into()))
    );
    // Halted + start: runStrategy back to Always.
    assert_eq!(vm_action(&app, "web", "start", json!({})), Ok(202));
    assert_eq!(
        get(&app, "virtualmachines", "web").unwrap()["spec"]["runStrategy"],
        "Always"
    );
    ticks(&app, 5);
    assert_eq!(printable(&app, "web"), "Running");
    // Halted with a live VMI: only a shorter grace period is accepted.
    app.store
        .modify(&Key::new(KV, "virtualmachines", "default", "web"), |o| {
            o["spec"]["runStrategy"] = json!("Halted")
        });
    assert_eq!(
        vm_action(&app, "web", "stop", json!({})),
        Err((
            409,
            "Halted only supports manual stop requests with a shorter graceperiod".into()
        ))
    );
    // The VMI has no grace period of its own: any given one is accepted (upstream compares
    // only with a set `terminationGracePeriodSeconds`).
    assert_eq!(
        vm_action(
            &app,
            "web",
            "stop",
            json!({"gracePeriod": 600, "dryRun": ["All"]})
        ),
        Ok(202)
    );
    assert_eq!(
        vm_action(&app, "web", "stop", json!({"gracePeriod": 1})),
        Ok(202)
    );
    assert_eq!(
        get_vmi(&app, "web").unwrap()["spec"]["terminationGracePeriodSeconds"],
        1
    );
    // Now it has one: an equal or longer one is refused.
    assert_eq!(
        vm_action(&app, "web", "stop", json!({"gracePeriod": 1})),
        Err((
            409,
            "Halted only supports manual stop requests with a shorter graceperiod".into()
        ))
    );
}

#[test]
fn manual_uses_state_change_requests() {
    let app = kubevirt();
    vm(&app, "m", "Manual", json!({}));
    ticks(&app, 2);
    assert!(get_vmi(&app, "m").is_none());
    assert_eq!(
        vm_action(&app, "m", "start", json!({"paused": true})),
        Ok(202)
    );
    let reqs = state_requests(&get(&app, "virtualmachines", "m").unwrap());
    assert_eq!(
        reqs,
        vec![json!({"action": "Start", "data": {"paused": "true"}})]
    );
    assert_eq!(
        vm_action(&app, "m", "start", json!({})),
        Err((
            409,
            "unable to complete request: stop/start already underway".into()
        ))
    );
    ticks(&app, 5);
    assert_eq!(printable(&app, "m"), "Paused");
    assert!(state_requests(&get(&app, "virtualmachines", "m").unwrap()).is_empty());
    let uid = get_vmi(&app, "m").unwrap()["metadata"]["uid"].clone();
    assert_eq!(
        vm_action(&app, "m", "stop", json!({"gracePeriod": 0})),
        Ok(202)
    );
    assert_eq!(
        state_requests(&get(&app, "virtualmachines", "m").unwrap()),
        vec![json!({"action": "Stop", "uid": uid})]
    );
    assert_eq!(
        get_vmi(&app, "m").unwrap()["spec"]["terminationGracePeriodSeconds"],
        0
    );
    ticks(&app, 3);
    assert_eq!(printable(&app, "m"), "Stopped");
    assert_eq!(
        vm_action(&app, "m", "restart", json!({})),
        Err((409, "VM is not running: Stopped".into()))
    );
}

#[test]
fn restart_makes_a_new_vmi_and_refuses_halted_once_and_grace() {
    let app = kubevirt();
    vm(&app, "web", "Always", json!({}));
    vm(&app, "h", "Halted", json!({}));
    vm(&app, "o", "Once", json!({}));
    ticks(&app, 5);
    let old = get_vmi(&app, "web").unwrap()["metadata"]["uid"].clone();
    assert_eq!(
        vm_action(&app, "web", "restart", json!({"gracePeriodSeconds": 5})),
        Err((
            400,
            "For force restart, only gracePeriod=0 is supported for now".into()
        ))
    );
    assert_eq!(
        vm_action(&app, "web", "restart", json!({"gracePeriodSeconds": 0})),
        Ok(202)
    );
    assert_eq!(
        get_vmi(&app, "web").unwrap()["spec"]["terminationGracePeriodSeconds"],
        1
    );
    ticks(&app, 8);
    let new = get_vmi(&app, "web").unwrap();
    assert_ne!(new["metadata"]["uid"], old);
    assert_eq!(printable(&app, "web"), "Running");
    for (name, rs) in [("h", "Halted"), ("o", "Once")] {
        assert_eq!(
            vm_action(&app, name, "restart", json!({})),
            Err((
                409,
                format!("RunStategy {rs} does not support manual restart requests")
            ))
        );
    }
    assert_eq!(
        vm_action(&app, "o", "start", json!({})),
        Err((409, "VM is already running".into()))
    );
    assert_eq!(
        vm_action(&app, "h", "stop", json!({})),
        Err((409, "VM is not running".into()))
    );
}

#[test]
fn dry_run_changes_nothing() {
    let app = kubevirt();
    vm(&app, "web", "Always", json!({}));
    ticks(&app, 5);
    let before = get(&app, "virtualmachines", "web").unwrap();
    assert_eq!(
        vm_action(&app, "web", "stop", json!({"dryRun": ["All"]})),
        Ok(202)
    );
    assert_eq!(
        vm_action(&app, "web", "migrate", json!({"dryRun": ["All"]})),
        Ok(202)
    );
    assert_eq!(
        vmi_action(&app, "web", "pause", json!({"dryRun": ["All"]})),
        Ok(200)
    );
    assert_eq!(get(&app, "virtualmachines", "web").unwrap(), before);
    assert!(
        app.store
            .list(KV, "virtualmachineinstancemigrations", None)
            .0
            .is_empty()
    );
}

#[test]
fn pause_unpause_and_soft_reboot() {
    let app = kubevirt();
    vm(&app, "web", "Always", json!({}));
    ticks(&app, 5);
    assert_eq!(
        vmi_action(&app, "web", "unpause", json!({})),
        Err((409, "VMI is not paused".into()))
    );
    assert_eq!(vmi_action(&app, "web", "pause", json!({})), Ok(200));
    reconcile_all(&app, false);
    assert_eq!(printable(&app, "web"), "Paused");
    assert_eq!(
        vmi_action(&app, "web", "pause", json!({})),
        Err((409, "VMI is already paused".into()))
    );
    assert_eq!(
        vmi_action(&app, "web", "softreboot", json!({})),
        Err((409, "VMI is paused".into()))
    );
    assert_eq!(vmi_action(&app, "web", "unpause", json!({})), Ok(200));
    reconcile_all(&app, false);
    assert_eq!(printable(&app, "web"), "Running");
    assert_eq!(vmi_action(&app, "web", "softreboot", json!({})), Ok(200));
}

#[test]
fn reset_needs_a_running_or_scheduled_instance() {
    let app = kubevirt();
    vm(&app, "web", "Always", json!({}));
    reconcile_all(&app, false);
    assert_eq!(phase(&get_vmi(&app, "web").unwrap()), "Pending");
    // virt-api's message for an instance it cannot reach (subresource.go ResetVMI), a 400;
    // the body is not read, so even a malformed one gets this answer.
    assert_eq!(
        put(&app, "virtualmachineinstances", "web", "reset", json!("not options")),
        Err((
            400,
            "Failed to reset non-running VMI with phase Pending: Unable to connect to VirtualMachineInstance because phase is Pending instead of Running or Scheduled".into()
        ))
    );
    ticks(&app, 5);
    assert_eq!(phase(&get_vmi(&app, "web").unwrap()), "Running");
    // No guest has booted yet (the default guests boot on first use): nothing to reset.
    assert_eq!(vmi_action(&app, "web", "reset", json!({})), Ok(200));
}

#[test]
fn unschedulable_switch_gives_error_unschedulable() {
    let app = kubevirt();
    vm(&app, "big", "Always", json!({UNSCHEDULABLE: "true"}));
    ticks(&app, 6);
    assert_eq!(printable(&app, "big"), "ErrorUnschedulable");
    let vm = get(&app, "virtualmachines", "big").unwrap();
    let cond = crate::core::table::eval_first(
        &vm,
        ".status.conditions[?(@.type=='PodScheduled')].message",
    );
    assert_eq!(cond, Some(&json!(UNSCHEDULABLE_MESSAGE)));
}

fn migrations(app: &App) -> Vec<Value> {
    app.store
        .list(KV, "virtualmachineinstancemigrations", None)
        .0
}

#[test]
fn migration_moves_the_vmi_through_phases() {
    let app = kubevirt();
    vm(&app, "web", "Always", json!({}));
    ticks(&app, 5);
    assert_eq!(vm_action(&app, "web", "migrate", json!({})), Ok(202));
    let m = &migrations(&app)[0];
    assert!(meta_str(m, "name").starts_with("kubevirt-migrate-vm-"));
    assert_eq!(m["metadata"]["labels"]["kubevirt.io/vmi-name"], "web");
    // A second one while the first is active is refused by admission.
    let (code, msg) = vm_action(&app, "web", "migrate", json!({})).unwrap_err();
    assert_eq!(code, 400);
    assert!(msg.contains("in-flight migration detected"), "{msg}");
    let mut seen = vec![];
    for _ in 0..15 {
        reconcile_all(&app, true);
        let p = phase(&migrations(&app)[0]).to_string();
        if seen.last() != Some(&p) {
            seen.push(p);
        }
    }
    assert_eq!(
        seen,
        [
            "Pending",
            "Scheduling",
            "Scheduled",
            "PreparingTarget",
            "TargetReady",
            "Running",
            "Succeeded"
        ]
    );
    let vmi = get_vmi(&app, "web").unwrap();
    assert_eq!(vmi["status"]["nodeName"], "node-2");
    assert_eq!(vmi["status"]["migrationState"]["sourceNode"], "node-1");
    assert_eq!(vmi["status"]["migrationState"]["targetNode"], "node-2");
    assert_eq!(vmi["status"]["migrationState"]["completed"], true);
    let pods = app.store.list("", "pods", Some("default")).0;
    assert_eq!(pods.len(), 1);
    assert_eq!(pods[0]["spec"]["nodeName"], "node-2");
}

#[test]
fn migrations_fail_without_a_target_or_on_timeout() {
    let app = kubevirt();
    vm(&app, "a", "Always", json!({}));
    vm(&app, "b", "Always", json!({MIGRATION_FAIL: "timeout"}));
    ticks(&app, 5);
    assert_eq!(
        vm_action(
            &app,
            "a",
            "migrate",
            json!({"addedNodeSelector": {"kubernetes.io/hostname": "node-9"}})
        ),
        Ok(202)
    );
    assert_eq!(vm_action(&app, "b", "migrate", json!({})), Ok(202));
    ticks(&app, 15);
    for (vmi, why) in [("a", NO_TARGET_MESSAGE), ("b", TIMEOUT_MESSAGE)] {
        let m = migrations(&app)
            .into_iter()
            .find(|m| m["spec"]["vmiName"] == vmi)
            .unwrap();
        assert_eq!(phase(&m), "Failed");
        assert_eq!(m["status"]["migrationState"]["failureReason"], why);
        let v = get_vmi(&app, vmi).unwrap();
        assert_eq!(v["status"]["nodeName"], "node-1", "{vmi} stays");
        assert_eq!(v["status"]["migrationState"]["failed"], true);
    }
}

pub(super) fn deckhouse() -> App {
    let app = App::new(
        Registry::new(ServeFlavor::Deckhouse),
        Duration::from_secs(1),
    );
    for n in ["node-1", "node-2"] {
        app.store
                .create("", "nodes", json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}}))
                .unwrap();
    }
    app.store
            .create(DH, "virtualmachines", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
                "metadata": {"name": "linux", "namespace": "default"},
                "spec": {"runPolicy": "Manual", "virtualMachineClassName": "generic", "cpu": {"cores": 1},
                         "memory": {"size": "1Gi"}, "blockDeviceRefs": []}}))
            .unwrap();
    app
}

pub(super) fn op(app: &App, ty: &str, extra: Value) -> String {
    let mut spec = json!({"type": ty, "virtualMachineName": "linux"});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    let name = format!("linux-{}", random_suffix(5));
    app.store
            .create(DH, "virtualmachineoperations", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                "kind": "VirtualMachineOperation", "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
            .unwrap();
    name
}

pub(super) fn dh(app: &App, plural: &str, name: &str) -> Value {
    app.store
        .get(&Key::new(DH, plural, "default", name))
        .unwrap()
}

fn op_phase(app: &App, name: &str) -> String {
    phase(&dh(app, "virtualmachineoperations", name)).to_string()
}

#[test]
fn operations_start_stop_and_migrate_with_progress() {
    let app = deckhouse();
    ticks(&app, 1);
    assert_eq!(phase(&dh(&app, "virtualmachines", "linux")), "Stopped");
    let start = op(&app, "Start", json!({}));
    reconcile_all(&app, false);
    assert_eq!(op_phase(&app, &start), "Pending");
    ticks(&app, 1);
    assert_eq!(op_phase(&app, &start), "InProgress");
    assert_eq!(phase(&dh(&app, "virtualmachines", "linux")), "Starting");
    ticks(&app, 1);
    assert_eq!(op_phase(&app, &start), "Completed");
    assert_eq!(phase(&dh(&app, "virtualmachines", "linux")), "Running");
    let migrate = op(
        &app,
        "Migrate",
        json!({"migrate": {"nodeSelector": {"kubernetes.io/hostname": "node-2"}}}),
    );
    let mut progress = vec![];
    for _ in 0..8 {
        reconcile_all(&app, true);
        let o = dh(&app, "virtualmachineoperations", &migrate);
        if let Some(p) = o["status"]["progress"].as_str()
            && progress.last().map(String::as_str) != Some(p)
        {
            progress.push(p.to_string());
        }
    }
    assert_eq!(progress, ["0%", "25%", "50%", "75%", "100%"]);
    assert_eq!(op_phase(&app, &migrate), "Completed");
    assert_eq!(
        dh(&app, "virtualmachines", "linux")["status"]["nodeName"],
        "node-2"
    );
    let stop = op(&app, "Stop", json!({}));
    ticks(&app, 3);
    assert_eq!(op_phase(&app, &stop), "Completed");
    assert_eq!(phase(&dh(&app, "virtualmachines", "linux")), "Stopped");
    // Stopping a stopped VM fails with the platform's reason.
    let again = op(&app, "Stop", json!({}));
    reconcile_all(&app, false);
    let o = dh(&app, "virtualmachineoperations", &again);
    assert_eq!(phase(&o), "Failed");
    assert_eq!(
        o["status"]["conditions"][0]["reason"],
        "NotApplicableForVirtualMachinePhase"
    );
}

#[test]
fn operations_supersede_or_fail_and_migrations_fail() {
    let app = deckhouse();
    ticks(&app, 1);
    // Stop supersedes an active Start.
    let start = op(&app, "Start", json!({}));
    reconcile_all(&app, false);
    let stop = op(&app, "Stop", json!({}));
    reconcile_all(&app, false);
    let s = dh(&app, "virtualmachineoperations", &start);
    assert_eq!(phase(&s), "Superseded");
    assert_eq!(s["status"]["conditions"][0]["reason"], "Superseded");
    assert_eq!(op_phase(&app, &stop), "Failed");
    let start = op(&app, "Start", json!({}));
    ticks(&app, 3);
    assert_eq!(op_phase(&app, &start), "Completed");
    // A forced Stop supersedes a Stop; a Start does not supersede it and fails.
    let stop = op(&app, "Stop", json!({}));
    reconcile_all(&app, false);
    let forced = op(&app, "Stop", json!({"force": true}));
    reconcile_all(&app, false);
    assert_eq!(op_phase(&app, &stop), "Superseded");
    let start2 = op(&app, "Start", json!({}));
    reconcile_all(&app, false);
    let o = dh(&app, "virtualmachineoperations", &start2);
    assert_eq!(phase(&o), "Failed");
    assert_eq!(
        o["status"]["conditions"][0]["reason"],
        "NotReadyToBeExecuted"
    );
    ticks(&app, 3);
    assert_eq!(op_phase(&app, &forced), "Completed");
    let start3 = op(&app, "Start", json!({}));
    ticks(&app, 3);
    assert_eq!(op_phase(&app, &start3), "Completed");
    app.store
        .modify(&Key::new(DH, "virtualmachines", "default", "linux"), |o| {
            set_annotation(o, MIGRATION_FAIL, Some("timeout"))
        });
    let m = op(&app, "Evict", json!({}));
    ticks(&app, 6);
    let o = dh(&app, "virtualmachineoperations", &m);
    assert_eq!(phase(&o), "Failed");
    assert_eq!(o["status"]["conditions"][0]["reason"], "NotConverging");
    assert_eq!(o["status"]["conditions"][0]["message"], TIMEOUT_MESSAGE);
    let m = op(
        &app,
        "Migrate",
        json!({"migrate": {"nodeSelector": {"kubernetes.io/hostname": "node-1"}}}),
    );
    ticks(&app, 3);
    let o = dh(&app, "virtualmachineoperations", &m);
    assert_eq!(
        o["status"]["conditions"][0]["reason"],
        "TargetUnschedulable"
    );
}

/// A guest that powers off only when the test says so (a real OS shutting down).
struct SlowGuest {
    spec: crate::core::guest::GuestSpec,
    off: tokio::sync::watch::Sender<bool>,
    asked: std::sync::atomic::AtomicBool,
}

impl crate::core::guest::Guest for SlowGuest {
    fn spec(&self) -> &crate::core::guest::GuestSpec {
        &self.spec
    }
    fn serial(&self) -> crate::core::guest::Serial {
        crate::core::guest::Serial {
            input: tokio::sync::mpsc::unbounded_channel().0,
            output: tokio::sync::broadcast::channel(1).0,
            consoles: Default::default(),
            transcript: Default::default(),
        }
    }
    fn dial(&self, _port: u16) -> crate::core::guest::DialFuture {
        Box::pin(async { Err(std::io::Error::other("no ports")) })
    }
    fn stop(&self) {
        self.asked.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    fn kill(&self) {
        self.off.send_replace(true);
    }
    fn graceful(&self) -> bool {
        true
    }
    fn stopped(&self) -> tokio::sync::watch::Receiver<bool> {
        self.off.subscribe()
    }
}

#[derive(Default)]
struct SlowGuests(std::sync::Mutex<Vec<std::sync::Arc<SlowGuest>>>);

impl crate::core::guest::GuestFactory for SlowGuests {
    fn boot(
        &self,
        spec: &crate::core::guest::GuestSpec,
    ) -> std::io::Result<std::sync::Arc<dyn crate::core::guest::Guest>> {
        let g = std::sync::Arc::new(SlowGuest {
            spec: spec.clone(),
            off: tokio::sync::watch::channel(false).0,
            asked: Default::default(),
        });
        self.0.lock().unwrap().push(g.clone());
        Ok(g)
    }
    fn eager(&self) -> bool {
        true
    }
}

/// A KubeVirt app whose guests power off only when told, with VM `web` running.
fn running_with_slow_guests() -> (App, std::sync::Arc<SlowGuests>) {
    let app = kubevirt();
    let factory = std::sync::Arc::new(SlowGuests::default());
    app.guests.set_factory(factory.clone());
    vm(&app, "web", "Always", json!({}));
    ticks(&app, 4);
    (app, factory)
}

#[test]
fn a_stop_waits_for_a_graceful_guest_to_power_off() {
    let (app, factory) = running_with_slow_guests();
    assert_eq!(get_vmi(&app, "web").unwrap()["status"]["phase"], "Running");
    // Eager: the guest boots because the VM runs, not because someone connected.
    app.guests.boot_missing(&app);
    let guest = factory.0.lock().unwrap()[0].clone();
    assert_eq!(vm_action(&app, "web", "stop", json!({})), Ok(202));
    ticks(&app, 4);
    assert!(
        guest.asked.load(std::sync::atomic::Ordering::SeqCst),
        "told to power off"
    );
    assert!(
        get_vmi(&app, "web").is_some(),
        "VMI kept while the guest runs"
    );
    assert_eq!(printable(&app, "web"), "Stopping");
    // No second boot while the first one is shutting down.
    app.guests.boot_missing(&app);
    assert_eq!(factory.0.lock().unwrap().len(), 1);
    guest.off.send_replace(true);
    ticks(&app, 2);
    assert!(get_vmi(&app, "web").is_none());
    assert_eq!(printable(&app, "web"), "Stopped");
}

#[test]
fn a_forced_restart_kills_a_graceful_guest() {
    let (app, factory) = running_with_slow_guests();
    app.guests.boot_missing(&app);
    let first = factory.0.lock().unwrap()[0].clone();
    let old_uid = get_vmi(&app, "web").unwrap()["metadata"]["uid"].clone();
    // gracePeriodSeconds 0 leaves the VMI 1 s (lifecycle.go): no waiting for the guest.
    assert_eq!(
        vm_action(&app, "web", "restart", json!({"gracePeriodSeconds": 0})),
        Ok(202)
    );
    ticks(&app, 3);
    assert!(*first.off.borrow(), "killed");
    ticks(&app, 4);
    let vmi = get_vmi(&app, "web").unwrap();
    assert_ne!(vmi["metadata"]["uid"], old_uid);
    assert_eq!(vmi["status"]["phase"], "Running");
    app.guests.boot_missing(&app);
    assert_eq!(factory.0.lock().unwrap().len(), 2, "a fresh boot");
}

/// A running Deckhouse VM has its virt-launcher pod, named as `status.virtualMachinePods`
/// says, labelled with the VM's name under Deckhouse's renamed KubeVirt labels, with the VM's
/// IP; stopping the VM removes it.
#[test]
fn deckhouse_launcher_pod_follows_the_vm() {
    let app = deckhouse();
    let start = op(&app, "Start", json!({}));
    ticks(&app, 3);
    assert_eq!(op_phase(&app, &start), "Completed");
    let vm = dh(&app, "virtualmachines", "linux");
    let pods = app.store.list("", "pods", Some("default")).0;
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    assert_eq!(
        pod["metadata"]["name"],
        vm["status"]["virtualMachinePods"][0]["name"]
    );
    let labels = &pod["metadata"]["labels"];
    assert_eq!(
        labels["vm.kubevirt.internal.virtualization.deckhouse.io/name"],
        "linux"
    );
    assert_eq!(
        labels["kubevirt.internal.virtualization.deckhouse.io"],
        "virt-launcher"
    );
    assert_eq!(pod["status"]["podIP"], vm["status"]["ipAddress"]);
    let stop = op(&app, "Stop", json!({}));
    ticks(&app, 4);
    assert_eq!(op_phase(&app, &stop), "Completed");
    assert!(app.store.list("", "pods", Some("default")).0.is_empty());
}
