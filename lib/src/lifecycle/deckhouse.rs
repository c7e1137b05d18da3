//! Deckhouse: every action is a VirtualMachineOperation (`generateName: NAME-`, `spec.type`,
//! `spec.virtualMachineName`, `spec.force` only when asked, `spec.migrate.nodeSelector`;
//! deckhouse FACTS §6, §10), created in the VM's own namespace; waits watch the operation
//! (and, for a start, the VM) until Completed, Failed or Superseded.

use std::time::Instant;

use kube::api::{DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

use super::watch::{self, Watched};
use super::{Action, Done, DryRun, Event, Options, VmRef, condition, get_vm, text};
use crate::api::{DECKHOUSE_VM, Kind};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;

/// Deckhouse's VirtualMachineOperation.
pub const VMOP: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualMachineOperation",
    plural: "virtualmachineoperations",
    namespaced: true,
};

/// `spec.type` for an action.
fn op_type(action: &Action) -> Option<&'static str> {
    Some(match action {
        Action::Start { .. } => "Start",
        Action::Stop { .. } => "Stop",
        Action::Restart { .. } => "Restart",
        Action::Evict { .. } => "Evict",
        Action::Migrate { .. } => "Migrate",
        _ => return None,
    })
}

/// The VirtualMachineOperation for `action` on `vm`.
pub fn operation(action: &Action, vm: &VmRef) -> Option<Value> {
    let mut spec = json!({"type": op_type(action)?, "virtualMachineName": vm.name});
    let force = match action {
        Action::Stop { force, .. }
        | Action::Restart { force }
        | Action::Evict { force }
        | Action::Migrate { force, .. } => *force,
        _ => false,
    };
    // Only when asked: the operation's own default applies otherwise (d8 sends a pointer).
    if force {
        spec["force"] = json!(true);
    }
    if let Action::Migrate { node_selector, .. } = action
        && !node_selector.is_empty()
    {
        spec["migrate"] = json!({"nodeSelector": node_selector});
    }
    Some(json!({
        "apiVersion": VMOP.api_version(),
        "kind": VMOP.kind,
        "metadata": {"generateName": format!("{}-", vm.name), "namespace": vm.namespace},
        "spec": spec,
    }))
}

fn is_terminal(op: &Value) -> bool {
    matches!(
        text(op, "/status/phase"),
        "Completed" | "Failed" | "Superseded"
    )
}

/// `operation web-x7k2p (Start) failed: NotApplicableForVirtualMachinePhase: …`.
fn op_failure(op: &Value, vm: &str) -> String {
    let phase = text(op, "/status/phase").to_ascii_lowercase();
    let (reason, message) = condition(op, "Completed")
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or("").to_owned(),
                c["message"].as_str().unwrap_or("").to_owned(),
            )
        })
        .unwrap_or_default();
    let mut why = reason;
    if !message.is_empty() {
        why = if why.is_empty() {
            message
        } else {
            format!("{why}: {message}")
        };
    }
    format!(
        "virtualmachineoperation {} ({} of {vm}) {phase}{}",
        text(op, "/metadata/name"),
        text(op, "/spec/type"),
        if why.is_empty() {
            String::new()
        } else {
            format!(": {why}")
        }
    )
}

fn progress(op: &Value) -> Option<f64> {
    text(op, "/status/progress")
        .trim_end_matches('%')
        .parse()
        .ok()
}

pub(crate) async fn run(
    cluster: &Cluster,
    action: &Action,
    vm: &VmRef,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Done> {
    // The VM is looked up in the target's own namespace (d8 v used the kubeconfig's).
    let vm_obj = get_vm(cluster, Flavor::Deckhouse, vm).await?;
    let mut done = Done {
        vm: vm.clone(),
        waited: false,
        migrated: None,
        object: None,
    };
    if let Action::CancelMigration = action {
        return cancel(cluster, vm, options, on_event, done).await;
    }
    let source = text(&vm_obj, "/status/nodeName").to_owned();
    if action.is_migration() {
        check_migratable(&vm_obj, vm, action, &source)?;
    }
    let Some(body) = operation(action, vm) else {
        return Err(Error::InvalidTarget(format!(
            "{} is not supported by Deckhouse virtualization",
            action.verb()
        )));
    };
    super::check_target_node(cluster, action).await?;
    if options.dry_run == DryRun::Client {
        return Ok(done);
    }
    let api = VMOP.api(&cluster.client, Some(&vm.namespace));
    let object: DynamicObject = serde_json::from_value(body)
        .map_err(|e| Error::Internal(format!("building the operation: {e}")))?;
    let params = PostParams {
        dry_run: options.dry_run == DryRun::Server,
        ..PostParams::default()
    };
    let started = Instant::now();
    let created = api
        .create(&params, &object)
        .await
        .map_err(|e| cluster.error(e, &VMOP.action("create", Some(&vm.namespace))))?;
    if options.dry_run == DryRun::Server {
        return Ok(done);
    }
    let op_name = created.metadata.name.unwrap_or_default();
    on_event(Event::Accepted {
        vm: vm.clone(),
        detail: Some(format!("virtualmachineoperation {op_name}")),
    });
    if !options.wait {
        return finish(cluster, options, done).await;
    }
    follow_operation(cluster, action, vm, &op_name, on_event).await?;
    done.waited = true;
    if action.is_migration() {
        let after = get_vm(cluster, Flavor::Deckhouse, vm).await?;
        done.migrated = Some((
            source,
            text(&after, "/status/nodeName").to_owned(),
            started.elapsed(),
        ));
        if options.want_object {
            done.object = Some(after);
        }
        return Ok(done);
    }
    finish(cluster, options, done).await
}

/// Checks that the VM can be live-migrated now: not already on the target node, and the
/// platform's `Migratable` condition not False.
fn check_migratable(vm_obj: &Value, vm: &VmRef, action: &Action, source: &str) -> Result<()> {
    if let Action::Migrate { node_selector, .. } = action
        && !source.is_empty()
        && node_selector
            .get("kubernetes.io/hostname")
            .map(String::as_str)
            == Some(source)
    {
        return Err(Error::InvalidTarget(format!(
            "{} already runs on node {source}; choose another --target-node",
            vm.name
        )));
    }
    // The platform says up front when the VM cannot be live-migrated.
    if let Some(c) = condition(vm_obj, "Migratable").filter(|c| c["status"] == "False") {
        return Err(Error::Platform(format!(
            "{} cannot be live-migrated: {}{}",
            vm.name,
            c["reason"].as_str().unwrap_or("Migratable=False"),
            c["message"]
                .as_str()
                .filter(|m| !m.is_empty())
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        )));
    }
    Ok(())
}

/// Follows VirtualMachineOperation `op_name` (and, for a start or restart, the VM) until the
/// operation completes, reporting its phases or migration progress; a failed or superseded
/// operation, or a start that cannot get a node, fails with the platform's reason.
async fn follow_operation(
    cluster: &Cluster,
    action: &Action,
    vm: &VmRef,
    op_name: &str,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<()> {
    let mut objects = vec![Watched::new(VMOP, &vm.namespace, op_name)];
    let starting = matches!(action, Action::Start { .. } | Action::Restart { .. });
    if starting {
        objects.push(Watched::new(DECKHOUSE_VM, &vm.namespace, &vm.name));
    }
    let mut last = String::new();
    watch::until(cluster, &objects, |objs| {
        let Some(op) = objs[0].as_ref() else {
            return Some(Err(Error::Platform(format!(
                "virtualmachineoperation {op_name} of {} was deleted",
                vm.name
            ))));
        };
        let phase = match text(op, "/status/phase") {
            "" => "Pending",
            p => p,
        };
        let vm_phase = objs
            .get(1)
            .and_then(|v| v.as_ref())
            .map(|v| text(v, "/status/phase"))
            .unwrap_or("");
        if action.is_migration() {
            let reason = condition(op, "Completed")
                .and_then(|c| c["reason"].as_str())
                .unwrap_or("");
            let key = format!("{phase}{}{reason}", text(op, "/status/progress"));
            if key != last {
                last = key;
                on_event(Event::Migration {
                    vm: vm.clone(),
                    phase: phase.to_owned(),
                    percent: progress(op).unwrap_or(0.0),
                    detail: reason.to_owned(),
                });
            }
        } else {
            let shown = if vm_phase.is_empty() || phase != "InProgress" {
                phase.to_owned()
            } else {
                format!("{phase} (virtual machine {vm_phase})")
            };
            if shown != last {
                last = shown.clone();
                on_event(Event::Phase {
                    vm: vm.clone(),
                    phase: shown,
                });
            }
        }
        match phase {
            "Completed" => return Some(Ok(())),
            "Failed" | "Superseded" => return Some(Err(Error::Platform(op_failure(op, &vm.name)))),
            _ => {}
        }
        // A start that cannot get a node ends here, with the platform's reason.
        if starting
            && let Some(v) = objs.get(1).and_then(|v| v.as_ref())
            && let Some(c) = condition(v, "Running")
            && c["status"] == "False"
            && !matches!(
                c["reason"].as_str(),
                Some("" | "NotRunning" | "Running") | None
            )
            && c["message"].as_str().is_some_and(|m| !m.is_empty())
        {
            return Some(Err(Error::Platform(format!(
                "{} cannot start: {}: {}",
                vm.name,
                c["reason"].as_str().unwrap_or(""),
                c["message"].as_str().unwrap_or("")
            ))));
        }
        None
    })
    .await
}

async fn finish(cluster: &Cluster, options: &Options, mut done: Done) -> Result<Done> {
    if options.want_object {
        done.object = Some(get_vm(cluster, Flavor::Deckhouse, &done.vm).await?);
    }
    Ok(done)
}

/// `--cancel`: delete the active Migrate (or Evict) operation of the VM.
async fn cancel(
    cluster: &Cluster,
    vm: &VmRef,
    options: &Options,
    on_event: &(dyn Fn(Event) + Send + Sync),
    done: Done,
) -> Result<Done> {
    let api = VMOP.api(&cluster.client, Some(&vm.namespace));
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.error(e, &VMOP.action("list", Some(&vm.namespace))))?;
    let active = list
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .filter(|o| text(o, "/spec/virtualMachineName") == vm.name)
        .filter(|o| matches!(text(o, "/spec/type"), "Migrate" | "Evict"))
        .find(|o| !is_terminal(o));
    let Some(op) = active else {
        return Err(Error::Platform(format!(
            "{} has no migration in progress; nothing to cancel",
            vm.name
        )));
    };
    let done = super::cancel_migration(cluster, VMOP, vm, &op, options, on_event, done).await?;
    if options.dry_run != DryRun::None {
        return Ok(done);
    }
    finish(cluster, options, done).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn vm() -> VmRef {
        VmRef {
            namespace: "prod".into(),
            name: "web".into(),
        }
    }

    #[test]
    fn force_only_when_asked_and_migrate_node_selector() {
        let op = operation(
            &Action::Stop {
                grace_period: None,
                force: false,
            },
            &vm(),
        )
        .unwrap();
        assert_eq!(
            op["spec"],
            json!({"type": "Stop", "virtualMachineName": "web"})
        );
        assert_eq!(
            op["metadata"],
            json!({"generateName": "web-", "namespace": "prod"})
        );
        let op = operation(&Action::Restart { force: true }, &vm()).unwrap();
        assert_eq!(op["spec"]["force"], true);
        let sel = BTreeMap::from([("kubernetes.io/hostname".to_owned(), "node-2".to_owned())]);
        let op = operation(
            &Action::Migrate {
                node_selector: sel,
                force: false,
            },
            &vm(),
        )
        .unwrap();
        assert_eq!(
            op["spec"]["migrate"],
            json!({"nodeSelector": {"kubernetes.io/hostname": "node-2"}})
        );
        assert!(operation(&Action::Pause, &vm()).is_none());
    }

    #[test]
    fn failures_carry_reason_and_message() {
        let op = json!({"metadata": {"name": "web-abcde"}, "spec": {"type": "Start"},
            "status": {"phase": "Failed", "conditions": [{"type": "Completed", "status": "False",
                "reason": "NotApplicableForVirtualMachineRunPolicy", "message": "runPolicy AlwaysOff"}]}});
        assert_eq!(
            op_failure(&op, "web"),
            "virtualmachineoperation web-abcde (Start of web) failed: NotApplicableForVirtualMachineRunPolicy: runPolicy AlwaysOff"
        );
    }
}
