//! KubeVirt: the `subresources.kubevirt.io/v1` PUTs (`start`, `stop`, `restart`, `migrate` on
//! VMs; `pause`, `unpause`, `softreboot`, `reset` on VMIs; FACTS §2), their 409s turned into
//! sentences, and waits that watch the VM, its VMI or its VirtualMachineInstanceMigration.

use std::time::Instant;

use kube::api::ListParams;
use serde_json::{Value, json};

use super::watch::{self, Watched};
use super::{Action, Done, DryRun, Event, Options, VmRef, condition, get_vm, text};
use crate::api::{KUBEVIRT_VM, KUBEVIRT_VMI, Kind};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;

/// KubeVirt's VirtualMachineInstanceMigration.
pub const KUBEVIRT_VMIM: Kind = Kind {
    group: "kubevirt.io",
    version: "v1",
    kind: "VirtualMachineInstanceMigration",
    plural: "virtualmachineinstancemigrations",
    namespaced: true,
};

/// Printable statuses a start cannot get past by itself (virt-controller `vm.go`).
const START_ERRORS: &[&str] = &[
    "ErrorUnschedulable",
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrorPvcNotFound",
    "ErrorDataVolumeNotFound",
    "DataVolumeError",
    "CrashLoopBackOff",
];

/// Migration phases in order (`api/core/v1/types.go` `VirtualMachineInstanceMigrationPhase`).
const MIGRATION_PHASES: &[&str] = &[
    "Pending",
    "Scheduling",
    "Scheduled",
    "PreparingTarget",
    "TargetReady",
    "Running",
    "Succeeded",
];

/// The path of a subresource: `/apis/subresources.kubevirt.io/v1/namespaces/NS/PLURAL/NAME/SUB`.
pub fn subresource_path(plural: &str, vm: &VmRef, sub: &str) -> String {
    format!(
        "/apis/subresources.kubevirt.io/v1/namespaces/{}/{plural}/{}/{sub}",
        vm.namespace, vm.name
    )
}

/// The option body of a PUT (`StartOptions`, `StopOptions`, … in `api/core/v1/types.go`);
/// `None` for `softreboot`, which takes none.
pub fn body(action: &Action, dry_run: bool) -> Option<Value> {
    let mut body = match action {
        Action::Start { paused: true } => json!({"paused": true}),
        Action::Stop {
            grace_period: Some(g),
            ..
        } => json!({"gracePeriod": g}),
        Action::Stop {
            grace_period: None,
            force: true,
        } => json!({"gracePeriod": 0}),
        Action::Restart { force: true } => json!({"gracePeriodSeconds": 0}),
        Action::Migrate { node_selector, .. } if !node_selector.is_empty() => {
            json!({"addedNodeSelector": node_selector})
        }
        Action::SoftReboot | Action::Reset => return None,
        _ => json!({}),
    };
    if dry_run {
        body["dryRun"] = json!(["All"]);
    }
    Some(body)
}

async fn put(cluster: &Cluster, path: &str, body: Option<Value>) -> kube::Result<String> {
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let request = http::Request::put(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(bytes)
        .map_err(kube::Error::HttpError)?;
    cluster.client.request_text(request).await
}

/// Turn virt-api's refusal into a sentence that says what to do, keeping its own words.
pub fn explain(action: &Action, name: &str, run_strategy: &str, message: &str) -> String {
    let sentence = if message.contains("does not support manual start requests") {
        format!(
            "{name} has runStrategy {run_strategy}: KubeVirt starts it by itself and restarts it when it stops; `kubectl vm stop {name}` sets runStrategy to Halted"
        )
    } else if message == "VM is already running" {
        format!("{name} is already running")
    } else if message == "VM is not running"
        || message == "VMI is not running"
        || message.starts_with("VM is not running:")
    {
        format!("{name} is not running; start it with `kubectl vm start {name}`")
    } else if message.contains("Halted only supports manual stop requests") {
        format!(
            "{name} has runStrategy Halted and is already stopping; pass a --grace-period shorter than its current one to stop it sooner"
        )
    } else if message.contains("does not support manual restart requests") {
        match run_strategy {
            "Halted" => format!(
                "{name} has runStrategy Halted (it is stopped); start it with `kubectl vm start {name}`"
            ),
            rs => format!(
                "{name} has runStrategy {rs}: KubeVirt does not restart it on request; stop it and start it again"
            ),
        }
    } else if message.contains("already underway") {
        format!("a start or stop of {name} is already underway; wait for it to finish")
    } else if message == "VMI is already paused" {
        format!("{name} is already paused")
    } else if message == "VMI is not paused" {
        format!("{name} is not paused")
    } else if message == "VMI is paused" {
        format!("{name} is paused; unpause it first with `kubectl vm unpause {name}`")
    } else if message.contains("in-flight migration detected") {
        format!(
            "{name} is already being migrated; wait for it, or cancel it with `kubectl vm migrate {name} --cancel`"
        )
    } else if message.contains("RerunOnFailure does not support starting VM from failed state") {
        format!(
            "{name} has runStrategy RerunOnFailure and its last run failed; KubeVirt reruns it by itself"
        )
    } else {
        format!("cannot {} {name}", action.verb())
    };
    format!("{sentence} (KubeVirt: {message})")
}

fn refused(
    cluster: &Cluster,
    err: kube::Error,
    action: &Action,
    vm: &VmRef,
    rs: &str,
    path: &str,
) -> Error {
    match err {
        kube::Error::Api(s) if matches!(s.code, 400 | 409) => {
            Error::Platform(explain(action, &vm.name, rs, &s.message))
        }
        kube::Error::Api(s)
            if s.code == 404
                && path.contains("virtualmachineinstances")
                && s.message.trim() != crate::error::NO_SUCH_PATH
                && s.reason != crate::error::NOT_A_STATUS =>
        {
            Error::Platform(format!(
                "{} is not running (it has no VirtualMachineInstance); start it with `kubectl vm start {}`",
                vm.name, vm.name
            ))
        }
        other => cluster.error(
            other,
            &crate::error::Action::new(
                "update",
                "virtualmachines.subresources.kubevirt.io",
                "virtualmachine",
            )
            .named(&vm.name)
            .in_namespace(Some(&vm.namespace)),
        ),
    }
}

/// The message of the first failing condition (a scheduling failure, an image pull error).
fn failure_reason(obj: &Value) -> String {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| {
            c["status"] == "False"
                && matches!(c["type"].as_str(), Some("PodScheduled" | "Synchronized"))
                || c["status"] == "True" && c["type"] == "Failure"
        })
        .filter_map(|c| c["message"].as_str().filter(|m| !m.is_empty()))
        .next()
        .unwrap_or("")
        .to_owned()
}

pub(crate) async fn run(
    cluster: &Cluster,
    action: &Action,
    vm: &VmRef,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Done> {
    let vm_obj = get_vm(cluster, Flavor::KubeVirt, vm).await?;
    let rs = run_strategy(&vm_obj);
    let mut done = Done {
        vm: vm.clone(),
        waited: false,
        migrated: None,
        object: None,
    };
    let server_dry = options.dry_run == DryRun::Server;
    let vmi = instance(cluster, vm).await?;
    if let Action::CancelMigration = action {
        return cancel(cluster, vm, options, on_event, done).await;
    }
    let (plural, sub) = subresource(action);
    let source_node = if action.is_migration() {
        migration_source(vmi.as_ref(), vm, action)?
    } else {
        String::new()
    };
    super::check_target_node(cluster, action).await?;
    if options.dry_run == DryRun::Client {
        return Ok(done);
    }
    let old_vmi_uid = vmi
        .as_ref()
        .map(|v| text(v, "/metadata/uid").to_owned())
        .unwrap_or_default();
    let path = subresource_path(plural, vm, sub);
    let started = Instant::now();
    put(cluster, &path, body(action, server_dry))
        .await
        .map_err(|e| refused(cluster, e, action, vm, &rs, &path))?;
    if server_dry {
        return Ok(done);
    }
    let mut migration_name = None;
    if action.is_migration() {
        // The migrate subresource does not name the migration it created: find it.
        let m = active_migration(cluster, vm).await?;
        migration_name = m.map(|m| text(&m, "/metadata/name").to_owned());
    }
    on_event(Event::Accepted {
        vm: vm.clone(),
        detail: migration_name
            .as_ref()
            .map(|n| format!("virtualmachineinstancemigration {n}")),
    });
    if matches!(action, Action::Stop { .. }) && matches!(rs.as_str(), "Always" | "Once") {
        on_event(Event::Notice {
            vm: vm.clone(),
            message: format!(
                "{} had runStrategy {rs}; KubeVirt set it to Halted so it stays stopped until `kubectl vm start {}`",
                vm.name, vm.name
            ),
        });
    }
    // A reboot or reset leaves the instance running: nothing in the API to wait for.
    let instant = matches!(action, Action::SoftReboot | Action::Reset);
    if !options.wait || instant {
        done.waited = instant;
        return finish(cluster, options, done).await;
    }
    // The state before the request is not news: report changes from it.
    let mut last_phase = text(&vm_obj, "/status/printableStatus").to_owned();
    let mut phase_event = |phase: &str| {
        if phase != last_phase && !phase.is_empty() {
            last_phase = phase.to_owned();
            on_event(Event::Phase {
                vm: vm.clone(),
                phase: phase.to_owned(),
            });
        }
    };
    let migration = migration_name.map(|name| (name, source_node.as_str()));
    if let Some((source, target)) = wait_for_action(
        cluster,
        action,
        vm,
        &old_vmi_uid,
        migration,
        &mut phase_event,
        on_event,
    )
    .await?
    {
        done.migrated = Some((source, target, started.elapsed()));
    }
    done.waited = true;
    finish(cluster, options, done).await
}

/// The VM's run strategy, the legacy `spec.running` read as one (`Always`/`Halted`).
fn run_strategy(vm: &Value) -> String {
    match text(vm, "/spec/runStrategy") {
        "" if vm.pointer("/spec/running") == Some(&json!(true)) => "Always",
        "" => "Halted",
        rs => rs,
    }
    .to_owned()
}

/// The VM's instance, when it has one.
async fn instance(cluster: &Cluster, vm: &VmRef) -> Result<Option<Value>> {
    let vmi_api = KUBEVIRT_VMI.api(&cluster.client, Some(&vm.namespace));
    match vmi_api.get_opt(&vm.name).await {
        Ok(v) => Ok(v.map(|v| serde_json::to_value(v).unwrap_or_default())),
        Err(e) => Err(cluster.error(
            e,
            &KUBEVIRT_VMI
                .action("get", Some(&vm.namespace))
                .named(&vm.name),
        )),
    }
}

/// The virt-api subresource that carries `action`: `(plural of the object it is on, name)`.
fn subresource(action: &Action) -> (&'static str, &'static str) {
    match action {
        Action::Start { .. } => ("virtualmachines", "start"),
        Action::Stop { .. } => ("virtualmachines", "stop"),
        Action::Restart { .. } => ("virtualmachines", "restart"),
        Action::Evict { .. } | Action::Migrate { .. } => ("virtualmachines", "migrate"),
        Action::Pause => ("virtualmachineinstances", "pause"),
        Action::Unpause => ("virtualmachineinstances", "unpause"),
        Action::SoftReboot => ("virtualmachineinstances", "softreboot"),
        Action::Reset => ("virtualmachineinstances", "reset"),
        Action::CancelMigration => unreachable!("cancel has no subresource: handled before"),
    }
}

/// Waits until the accepted action shows: the state it leads to, a new instance (restart), or
/// the end of the migration (`migration`: its name and the node it leaves), whose `(source,
/// target)` nodes are returned.
async fn wait_for_action(
    cluster: &Cluster,
    action: &Action,
    vm: &VmRef,
    old_vmi_uid: &str,
    migration: Option<(String, &str)>,
    phase_event: &mut (dyn FnMut(&str) + Send),
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Option<(String, String)>> {
    match action {
        Action::Start { paused } => {
            let want = if *paused { "Paused" } else { "Running" };
            wait_for_status(cluster, vm, want, true, phase_event).await?;
        }
        Action::Stop { .. } => wait_for_status(cluster, vm, "Stopped", false, phase_event).await?,
        Action::Pause => wait_for_status(cluster, vm, "Paused", false, phase_event).await?,
        Action::Unpause => wait_for_status(cluster, vm, "Running", false, phase_event).await?,
        Action::Restart { .. } => {
            wait_for_new_instance(cluster, vm, old_vmi_uid, phase_event).await?;
        }
        Action::Evict { .. } | Action::Migrate { .. } => {
            let Some((name, source_node)) = migration else {
                return Err(Error::Platform(format!(
                    "KubeVirt accepted the migration of {} but no VirtualMachineInstanceMigration for it was found",
                    vm.name
                )));
            };
            let nodes = follow_migration(cluster, vm, &name, source_node, on_event).await?;
            return Ok(Some(nodes));
        }
        Action::SoftReboot | Action::Reset | Action::CancelMigration => {}
    }
    Ok(None)
}

/// Checks that the instance can be migrated now (running, `LiveMigratable`, not already on the
/// target node) and returns the node it runs on.
fn migration_source(vmi: Option<&Value>, vm: &VmRef, action: &Action) -> Result<String> {
    let Some(vmi) = vmi.filter(|v| text(v, "/status/phase") == "Running") else {
        return Err(Error::Platform(format!(
            "{} is not running, so it cannot be migrated; start it with `kubectl vm start {}`",
            vm.name, vm.name
        )));
    };
    let source_node = text(vmi, "/status/nodeName").to_owned();
    if let Some(c) = condition(vmi, "LiveMigratable").filter(|c| c["status"] == "False") {
        return Err(Error::Platform(format!(
            "{} cannot be live-migrated: {} ({})",
            vm.name,
            c["message"].as_str().unwrap_or(""),
            c["reason"].as_str().unwrap_or("LiveMigratable=False")
        )));
    }
    if let Action::Migrate { node_selector, .. } = action
        && node_selector.get("kubernetes.io/hostname") == Some(&source_node)
    {
        return Err(Error::InvalidTarget(format!(
            "{} already runs on node {source_node}; choose another --target-node",
            vm.name
        )));
    }
    Ok(source_node)
}

/// Watches the VM until its printable status is `want`; a start that meets one of
/// [`START_ERRORS`] fails with the platform's reason instead.
async fn wait_for_status(
    cluster: &Cluster,
    vm: &VmRef,
    want: &str,
    starting: bool,
    phase_event: &mut (dyn FnMut(&str) + Send),
) -> Result<()> {
    let vm_watch = Watched::new(KUBEVIRT_VM, &vm.namespace, &vm.name);
    watch::until(cluster, &[vm_watch], |objs| {
        let obj = objs[0].as_ref()?;
        let status = text(obj, "/status/printableStatus");
        phase_event(status);
        if status == want {
            return Some(Ok(()));
        }
        if starting && START_ERRORS.contains(&status) {
            let why = failure_reason(obj);
            return Some(Err(Error::Platform(format!(
                "{} cannot start: {status}{}",
                vm.name,
                if why.is_empty() {
                    String::new()
                } else {
                    format!(": {why}")
                }
            ))));
        }
        None
    })
    .await
}

/// Watches the VMI until one other than `old_vmi_uid` runs (a restart replaces the instance);
/// an unschedulable new instance fails with the scheduler's message.
async fn wait_for_new_instance(
    cluster: &Cluster,
    vm: &VmRef,
    old_vmi_uid: &str,
    phase_event: &mut (dyn FnMut(&str) + Send),
) -> Result<()> {
    let vmi_watch = Watched::new(KUBEVIRT_VMI, &vm.namespace, &vm.name);
    watch::until(cluster, &[vmi_watch], |objs| {
        let Some(obj) = objs[0].as_ref() else {
            phase_event("Stopped");
            return None;
        };
        if text(obj, "/metadata/uid") == old_vmi_uid {
            phase_event("Stopping");
            return None;
        }
        let phase = text(obj, "/status/phase");
        phase_event(phase);
        if phase == "Running" {
            return Some(Ok(()));
        }
        condition(obj, "PodScheduled")
            .filter(|c| c["status"] == "False" && c["reason"] == "Unschedulable")
            .map(|c| {
                Err(Error::Platform(format!(
                    "{} cannot start again: ErrorUnschedulable: {}",
                    vm.name,
                    c["message"].as_str().unwrap_or("")
                )))
            })
    })
    .await
}

/// Follows migration `name` to its end, reporting its phases as progress; returns the source
/// and target nodes, or the platform's failure reason.
async fn follow_migration(
    cluster: &Cluster,
    vm: &VmRef,
    name: &str,
    source_node: &str,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<(String, String)> {
    let mig = Watched::new(KUBEVIRT_VMIM, &vm.namespace, name);
    watch::until(cluster, &[mig], |objs| {
        let Some(m) = objs[0].as_ref() else {
            return Some(Err(Error::Platform(format!(
                "the migration {name} of {} was deleted (cancelled)",
                vm.name
            ))));
        };
        let phase = text(m, "/status/phase");
        let state = m
            .pointer("/status/migrationState")
            .cloned()
            .unwrap_or_default();
        let target = text(&state, "/targetNode").to_owned();
        let source = match text(&state, "/sourceNode") {
            "" => source_node.to_owned(),
            s => s.to_owned(),
        };
        if phase == "Failed" {
            let why = match text(&state, "/failureReason") {
                "" => condition(m, "Failed")
                    .and_then(|c| c["message"].as_str())
                    .unwrap_or("no reason given")
                    .to_owned(),
                r => r.to_owned(),
            };
            return Some(Err(Error::Platform(format!(
                "migration {name} of {} failed: {why}",
                vm.name
            ))));
        }
        let index = MIGRATION_PHASES
            .iter()
            .position(|p| *p == phase)
            .unwrap_or(0);
        let mode = text(&state, "/mode");
        let mut detail = source.clone();
        if !target.is_empty() {
            detail = format!("{source} → {target}");
        }
        if !mode.is_empty() {
            detail = format!("{detail}, mode {mode}");
        }
        on_event(Event::Migration {
            vm: vm.clone(),
            phase: if phase.is_empty() {
                "Pending".into()
            } else {
                phase.to_owned()
            },
            percent: 100.0 * index as f64 / (MIGRATION_PHASES.len() - 1) as f64,
            detail,
        });
        (phase == "Succeeded").then_some(Ok((source, target)))
    })
    .await
}

async fn finish(cluster: &Cluster, options: &Options, mut done: Done) -> Result<Done> {
    if options.want_object {
        done.object = Some(get_vm(cluster, Flavor::KubeVirt, &done.vm).await?);
    }
    Ok(done)
}

/// The newest migration of `vm` that has not ended (label `kubevirt.io/vmi-name`, FACTS §5).
async fn active_migration(cluster: &Cluster, vm: &VmRef) -> Result<Option<Value>> {
    let api = KUBEVIRT_VMIM.api(&cluster.client, Some(&vm.namespace));
    let list = api
        .list(&ListParams::default().labels(&format!("kubevirt.io/vmi-name={}", vm.name)))
        .await
        .map_err(|e| cluster.error(e, &KUBEVIRT_VMIM.action("list", Some(&vm.namespace))))?;
    let mut active: Vec<Value> = list
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .filter(|m| !matches!(text(m, "/status/phase"), "Succeeded" | "Failed"))
        .collect();
    active.sort_by(|a, b| {
        text(a, "/metadata/creationTimestamp").cmp(text(b, "/metadata/creationTimestamp"))
    });
    Ok(active.pop())
}

/// `--cancel`: delete the active migration (what `virtctl migrate-cancel` does).
async fn cancel(
    cluster: &Cluster,
    vm: &VmRef,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
    done: Done,
) -> Result<Done> {
    let Some(m) = active_migration(cluster, vm).await? else {
        return Err(Error::Platform(format!(
            "{} has no migration in progress; nothing to cancel",
            vm.name
        )));
    };
    let done =
        super::cancel_migration(cluster, KUBEVIRT_VMIM, vm, &m, options, on_event, done).await?;
    if options.dry_run != DryRun::None {
        return Ok(done);
    }
    finish(cluster, options, done).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn bodies_follow_the_option_types() {
        assert_eq!(
            body(&Action::Start { paused: false }, false),
            Some(json!({}))
        );
        assert_eq!(
            body(&Action::Start { paused: true }, true),
            Some(json!({"paused": true, "dryRun": ["All"]}))
        );
        assert_eq!(
            body(
                &Action::Stop {
                    grace_period: None,
                    force: true
                },
                false
            ),
            Some(json!({"gracePeriod": 0}))
        );
        assert_eq!(
            body(&Action::Restart { force: true }, false),
            Some(json!({"gracePeriodSeconds": 0}))
        );
        let sel = BTreeMap::from([("kubernetes.io/hostname".to_owned(), "node-2".to_owned())]);
        assert_eq!(
            body(
                &Action::Migrate {
                    node_selector: sel,
                    force: false
                },
                false
            ),
            Some(json!({"addedNodeSelector": {"kubernetes.io/hostname": "node-2"}}))
        );
        assert_eq!(body(&Action::SoftReboot, false), None);
        assert_eq!(body(&Action::Reset, false), None);
    }

    #[test]
    fn refusals_say_what_to_do() {
        let m = explain(
            &Action::Start { paused: false },
            "web",
            "Always",
            "Always does not support manual start requests",
        );
        assert!(
            m.starts_with("web has runStrategy Always: KubeVirt starts it by itself"),
            "{m}"
        );
        assert!(m.contains("sets runStrategy to Halted"), "{m}");
        assert!(m.ends_with("(KubeVirt: Always does not support manual start requests)"));
    }
}
