//! KubeVirt VirtualMachine: creates its DataVolumes (adopting released ones), its VMI and the
//! virt-launcher pod when it should run, and reports printableStatus.

use super::{NODE, has_controller, key_of, owner_ref, set_condition, uid_bytes};
use crate::core::app::App;
use crate::core::store::Key;
use crate::core::util::{meta_str, now_rfc3339};
use serde_json::{Value, json};

/// Whether a KubeVirt VM should run: runStrategy Always/RerunOnFailure/Once, legacy
/// `spec.running: true`, or Manual with a VMI already present.
pub(crate) fn kubevirt_should_run(vm: &Value, vmi_exists: bool) -> bool {
    let strategy = vm.pointer("/spec/runStrategy").and_then(Value::as_str);
    match strategy {
        Some("Always") | Some("RerunOnFailure") | Some("Once") => true,
        Some("Manual") => vmi_exists,
        Some(_) => false,
        None => vm.pointer("/spec/running").and_then(Value::as_bool) == Some(true),
    }
}

pub(super) fn kubevirt_vm(app: &App, vm: &Value, _tick: bool) {
    // Volume hotplug requests first: they change the template the rest works from.
    if crate::kubevirt::hotplug::apply_volume_requests(app, vm) {
        return;
    }
    let ns = meta_str(vm, "namespace").to_string();
    let cdi = app
        .registry
        .find_plural("cdi.kubevirt.io", "datavolumes")
        .is_some();
    let mut dv_names = vec![];
    for t in vm
        .pointer("/spec/dataVolumeTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let dv_name = t
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if dv_name.is_empty() || !cdi {
            continue;
        }
        let dv_key = Key::new("cdi.kubevirt.io", "datavolumes", &ns, &dv_name);
        if let Some(existing) = app.store.get(&dv_key) {
            // Like KubeVirt, adopt an orphaned DataVolume of the template's name (one kept by
            // `kubectl vm delete --keep-disks`) instead of failing.
            if !has_controller(&existing) {
                app.store.modify(&dv_key, |o| {
                    let mut refs = o
                        .pointer("/metadata/ownerReferences")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default();
                    refs.push(owner_ref(vm));
                    o["metadata"]["ownerReferences"] = json!(refs);
                });
            }
        } else {
            let mut meta = t.get("metadata").cloned().unwrap_or(json!({}));
            meta["namespace"] = json!(ns);
            meta["ownerReferences"] = json!([owner_ref(vm)]);
            let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "metadata": meta, "spec": t["spec"]});
            // The VM may be gone since it was read (a pool or cascade deleting it): the DataVolume is
            // then collected at once, as the garbage collector removes a dependent whose owner is
            // absent (garbagecollector.go `attemptToDeleteItem`).
            let vm_key = Key::of("kubevirt.io", "virtualmachines", vm);
            crate::core::gc::create_dependent(
                app,
                &vm_key,
                vm,
                "cdi.kubevirt.io",
                "datavolumes",
                dv,
            );
        }
        dv_names.push(dv_name);
    }
    for v in vm
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(n) = v.pointer("/dataVolume/name").and_then(Value::as_str)
            && !dv_names.iter().any(|d| d == n)
        {
            dv_names.push(n.to_string());
        }
    }
    let provisioning = cdi
        && dv_names.iter().any(|n| {
            app.store
                .get(&Key::new("cdi.kubevirt.io", "datavolumes", &ns, n))
                .and_then(|dv| {
                    dv.pointer("/status/phase")
                        .and_then(Value::as_str)
                        .map(|p| p != "Succeeded")
                })
                .unwrap_or(true)
        });
    // Run strategies and state change requests: lifecycle/.
    let vmi = crate::core::lifecycle::kubevirt_run(app, vm, provisioning);
    let run = vmi.is_some();
    let vmi_ready = vmi.as_ref().and_then(|v| {
        crate::core::table::eval_first(v, ".status.conditions[?(@.type=='Ready')].status").cloned()
    }) == Some(json!("True"));
    let printable = if provisioning {
        "Provisioning"
    } else {
        crate::core::lifecycle::kubevirt_printable(vm, vmi.as_ref())
    };
    let generation = vm
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let _ = run;
    let run_strategy = json!(crate::core::lifecycle::run_strategy(vm));
    // The VM mirrors its VMI's scheduling failure (virt-controller copies the condition).
    let unschedulable = vmi.as_ref().and_then(|v| {
        v.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| {
                c.iter()
                    .find(|c| c["type"] == "PodScheduled" && c["status"] == "False")
            })
            .cloned()
    });
    // Live updates and RestartRequired: live_update.rs.
    let restart_required = vmi.as_ref().and_then(|v| {
        let key = key_of("kubevirt.io", "virtualmachineinstances", v);
        crate::kubevirt::live_update::kubevirt_sync(app, vm, &key).or_else(|| {
            // Interfaces and networks: network.rs.
            crate::kubevirt::network::kubevirt_sync(
                app,
                vm,
                &key,
                crate::kubevirt::live_update::kubevirt_live_update(app),
            )
        })
    });
    // A placement change moves the running VMI: placement.rs.
    let placement_not_matched = vmi.as_ref().is_some_and(|v| {
        crate::kubevirt::placement::kubevirt_sync(
            app,
            vm,
            &key_of("kubevirt.io", "virtualmachineinstances", v),
            crate::kubevirt::live_update::kubevirt_live_update(app),
        )
    });
    app.store
        .modify(&key_of("kubevirt.io", "virtualmachines", vm), |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            // virt-controller mirrors the VMI's conditions on the VM (vm.go, syncConditions).
            if placement_not_matched {
                set_condition(
                    &mut st,
                    crate::kubevirt::placement::NOT_MATCHED,
                    true,
                    "",
                    "",
                );
            } else if let Some(c) = st["conditions"].as_array_mut() {
                c.retain(|c| c["type"] != crate::kubevirt::placement::NOT_MATCHED);
            }
            if let Some(message) = &restart_required {
                set_condition(&mut st, "RestartRequired", true, "", message);
            } else if let Some(c) = st["conditions"].as_array_mut() {
                c.retain(|c| c["type"] != "RestartRequired");
            }
            st["printableStatus"] = json!(printable);
            st["runStrategy"] = run_strategy;
            st["observedGeneration"] = generation.clone();
            st["desiredGeneration"] = generation;
            let m = st.as_object_mut().expect("object");
            if vmi.is_some() {
                m.insert("created".into(), json!(true))
            } else {
                m.remove("created")
            };
            if vmi_ready {
                m.insert("ready".into(), json!(true))
            } else {
                m.remove("ready")
            };
            let (reason, message) = match (&vmi, vmi_ready) {
                (None, _) => ("VMINotExists", "VMI does not exist"),
                (Some(_), false) => ("GuestNotRunning", "Guest VM is not reported as running"),
                (Some(_), true) => ("", ""),
            };
            set_condition(&mut st, "Ready", vmi_ready, reason, message);
            match &unschedulable {
                Some(c) => set_condition(
                    &mut st,
                    "PodScheduled",
                    false,
                    c["reason"].as_str().unwrap_or(""),
                    c["message"].as_str().unwrap_or(""),
                ),
                None => {
                    if let Some(c) = st["conditions"].as_array_mut() {
                        c.retain(|c| c["type"] != "PodScheduled");
                    }
                }
            }
            o["status"] = st;
        });
}

/// virt-controller's message on the VM condition `RestartRequired`
/// (`pkg/virt-controller/watch/vm/vm.go`, `syncRestartRequired`).
#[cfg(test)]
pub(crate) const RESTART_REQUIRED_MESSAGE: &str = crate::kubevirt::live_update::NON_LIVE_MESSAGE;

pub(crate) fn new_vmi(vm: &Value) -> Value {
    let [a, b, c, d] = uid_bytes(vm);
    let ip = format!("10.244.{}.{}", a, b % 254 + 1);
    let mut template = vm.pointer("/spec/template").cloned().unwrap_or(json!({}));
    if let Some(spec) = template.get_mut("spec") {
        crate::kubevirt::network::vmi_spec_from_template(spec);
    }
    let mut labels = template
        .pointer("/metadata/labels")
        .cloned()
        .unwrap_or(json!({}));
    labels["kubevirt.io/nodeName"] = json!(NODE);
    let now = now_rfc3339();
    let mut status = json!({
        "phase": "Running",
        "nodeName": NODE,
        // One entry per interface of the template (network.rs).
        "interfaces": crate::kubevirt::network::kubevirt_status_interfaces(
            template.get("spec").unwrap_or(&Value::Null), &ip, [a, b, c, d]),
        "guestOSInfo": {"id": "fedora", "name": "Fedora Linux", "prettyName": "Fedora Linux 42 (Cloud Edition)",
                        "version": "42 (Cloud Edition)", "versionId": "42", "kernelRelease": "6.14.0-63.fc42.x86_64"},
        "qosClass": "Burstable",
        "launcherContainerImageVersion": "quay.io/kubevirt/virt-launcher:v1.9.0",
        "migrationMethod": "BlockMigration",
        "migrationTransport": "Unix",
        "phaseTransitionTimestamps": [{"phase": "Running", "phaseTransitionTimestamp": now}],
    });
    for t in ["Ready", "LiveMigratable", "AgentConnected"] {
        set_condition(&mut status, t, true, "", "");
    }
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": vm["metadata"]["name"], "namespace": vm["metadata"]["namespace"],
            "labels": labels,
            "annotations": template.pointer("/metadata/annotations").cloned().unwrap_or(json!({})),
            "ownerReferences": [owner_ref(vm)],
        },
        "spec": template.get("spec").cloned().unwrap_or(json!({})),
        "status": status,
    })
}

/// The host name virt-launcher's pod carries in `vm.kubevirt.io/name`: `spec.hostname`, else
/// the VMI's name up to its first dot, at most 63 characters (kubevirt `pkg/util/net/dns`
/// SanitizeHostname, used by `pkg/virt-controller/services/template.go`).
pub(crate) fn sanitized_hostname(vmi: &Value) -> String {
    if let Some(h) = vmi.pointer("/spec/hostname").and_then(Value::as_str)
        && !h.is_empty()
    {
        return h.to_string();
    }
    let name = meta_str(vmi, "name");
    let first = name.split('.').next().unwrap_or(name);
    first.chars().take(63).collect()
}

/// virt-launcher's pod for `vmi`. Its labels are the VMI's plus `kubevirt.io: virt-launcher`,
/// `kubevirt.io/created-by: <VMI uid>` and `vm.kubevirt.io/name: <host name>`, as
/// `template.go` RenderLaunchManifest sets them.
pub(crate) fn launcher_pod(vmi: &Value) -> Value {
    let name = meta_str(vmi, "name");
    let uid = meta_str(vmi, "uid");
    let mut labels = vmi
        .pointer("/metadata/labels")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or(json!({}));
    // The pod is rendered before scheduling: the node label the VMI gets later is not copied.
    if let Some(l) = labels.as_object_mut() {
        l.remove("kubevirt.io/nodeName");
    }
    labels["kubevirt.io"] = json!("virt-launcher");
    labels["kubevirt.io/created-by"] = json!(uid);
    labels["vm.kubevirt.io/name"] = json!(sanitized_hostname(vmi));
    let ip = vmi
        .pointer("/status/interfaces/0/ipAddress")
        .cloned()
        .unwrap_or(json!(""));
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("virt-launcher-{name}-{}", &uid.get(..5).unwrap_or("00000")),
            "namespace": vmi["metadata"]["namespace"],
            "labels": labels,
            "annotations": {"emulator.kubevm.io/log": format!(
                "{{\"component\":\"virt-launcher\",\"level\":\"info\",\"msg\":\"Domain started\",\"name\":\"{name}\"}}\n{{\"component\":\"virt-launcher\",\"level\":\"info\",\"msg\":\"Synced vmi\",\"name\":\"{name}\"}}\n")},
            "ownerReferences": [owner_ref(vmi)],
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "compute", "image": "quay.io/kubevirt/virt-launcher:v1.9.0"}]},
        "status": {"phase": "Running", "podIP": ip, "hostIP": "192.168.0.11",
                   "containerStatuses": [{"name": "compute", "ready": true, "restartCount": 0, "image": "quay.io/kubevirt/virt-launcher:v1.9.0"}]},
    })
}

#[cfg(test)]
mod tests {
    use super::super::{owned_by, reconcile_all};
    use super::*;
    use crate::ServeFlavor;
    use crate::core::registry::Registry;
    use crate::core::store::{Key, Propagation};
    use std::time::Duration;

    fn vm() -> Value {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"runStrategy": "Always",
                "dataVolumeTemplates": [{"metadata": {"name": "web-root"},
                    "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}],
                "template": {"spec": {"domain": {"devices": {}},
                    "volumes": [{"name": "rootdisk", "dataVolume": {"name": "web-root"}}]}}}})
    }

    fn get(app: &App, group: &str, plural: &str, name: &str) -> Option<Value> {
        app.store.get(&Key::new(group, plural, "default", name))
    }

    fn settle_controllers(app: &App) {
        for _ in 0..6 {
            reconcile_all(app, true);
        }
    }

    /// A controller acting on a VM it read just before the VM was deleted (a pool's replica
    /// collected with its pool) must not leave a DataVolume, VMI or pod behind whose owner is
    /// gone: the garbage collector deletes such dependents (pkg/controller/garbagecollector
    /// `attemptToDeleteItem`). Under load this left a replica's DataVolume behind and `delete
    /// POOL` waited for it until its timeout.
    #[test]
    fn a_vm_read_before_its_deletion_leaves_no_dependents() {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        let stale = app
            .store
            .create("kubevirt.io", "virtualmachines", vm())
            .unwrap();
        app.store.delete(
            &Key::of("kubevirt.io", "virtualmachines", &stale),
            Propagation::Cascade,
        );
        for _ in 0..6 {
            kubevirt_vm(&app, &stale, true);
        }
        assert!(get(&app, "cdi.kubevirt.io", "datavolumes", "web-root").is_none());
        assert!(get(&app, "kubevirt.io", "virtualmachineinstances", "web").is_none());
        assert!(app.store.list("", "pods", Some("default")).0.is_empty());
    }

    #[test]
    fn vm_delete_collects_dependents_and_recreate_adopts_kept_disks() {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        let first = app
            .store
            .create("kubevirt.io", "virtualmachines", vm())
            .unwrap();
        settle_controllers(&app);
        let dv = get(&app, "cdi.kubevirt.io", "datavolumes", "web-root").expect("DV created");
        assert!(owned_by(&dv, &first));
        assert!(get(&app, "", "persistentvolumeclaims", "web-root").is_some());
        assert!(get(&app, "kubevirt.io", "virtualmachineinstances", "web").is_some());

        // Deleting the VM garbage-collects the VMI, its pod, the DataVolume and its PVC.
        app.store.delete(
            &Key::of("kubevirt.io", "virtualmachines", &first),
            Propagation::Cascade,
        );
        assert!(get(&app, "kubevirt.io", "virtualmachineinstances", "web").is_none());
        assert!(get(&app, "cdi.kubevirt.io", "datavolumes", "web-root").is_none());
        assert!(get(&app, "", "persistentvolumeclaims", "web-root").is_none());
        assert!(app.store.list("", "pods", Some("default")).0.is_empty());

        // A DataVolume released from its VM (ownerReference removed) survives the VM ...
        let second = app
            .store
            .create("kubevirt.io", "virtualmachines", vm())
            .unwrap();
        settle_controllers(&app);
        let dv_key = Key::new("cdi.kubevirt.io", "datavolumes", "default", "web-root");
        app.store.modify(&dv_key, |o| {
            o["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("ownerReferences");
        });
        app.store.delete(
            &Key::of("kubevirt.io", "virtualmachines", &second),
            Propagation::Cascade,
        );
        let kept = app.store.get(&dv_key).expect("released DV survives");
        assert!(get(&app, "", "persistentvolumeclaims", "web-root").is_some());
        assert!(get(&app, "kubevirt.io", "virtualmachineinstances", "web").is_none());

        // ... and a VM recreated from the same declaration adopts it, data and all.
        let third = app
            .store
            .create("kubevirt.io", "virtualmachines", vm())
            .unwrap();
        settle_controllers(&app);
        let adopted = app.store.get(&dv_key).unwrap();
        assert_eq!(adopted["metadata"]["uid"], kept["metadata"]["uid"]);
        assert!(owned_by(&adopted, &third));
        let vm = get(&app, "kubevirt.io", "virtualmachines", "web").unwrap();
        assert_eq!(vm["status"]["printableStatus"], "Running");
    }
}

#[cfg(test)]
mod restart_required_tests {
    use super::super::reconcile_all;
    use super::*;
    use crate::ServeFlavor;
    use crate::core::registry::Registry;
    use crate::core::store::{Key, Propagation};
    use std::time::Duration;

    fn condition(app: &App) -> Option<Value> {
        let vm = app
            .store
            .get(&Key::new(
                "kubevirt.io",
                "virtualmachines",
                "default",
                "web",
            ))
            .unwrap();
        vm.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|c| c.iter().find(|c| c["type"] == "RestartRequired").cloned())
    }

    #[test]
    fn access_credentials_change_on_a_running_vm_requires_a_restart() {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {}}}}}});
        app.store
            .create("kubevirt.io", "virtualmachines", vm)
            .unwrap();
        let settle = |app: &App| {
            for _ in 0..4 {
                reconcile_all(app, true);
            }
        };
        settle(&app);
        let vmi_key = Key::new("kubevirt.io", "virtualmachineinstances", "default", "web");
        assert!(app.store.get(&vmi_key).is_some());
        assert!(condition(&app).is_none());
        let vm_key = Key::new("kubevirt.io", "virtualmachines", "default", "web");
        let entry = json!([{"sshPublicKey": {"source": {"secret": {"secretName": "k"}},
            "propagationMethod": {"qemuGuestAgent": {"users": ["debian"]}}}}]);
        app.store.modify(&vm_key, |o| {
            o["spec"]["template"]["spec"]["accessCredentials"] = entry.clone();
        });
        settle(&app);
        let c = condition(&app).expect("RestartRequired");
        assert_eq!(c["status"], "True");
        assert_eq!(c["message"], RESTART_REQUIRED_MESSAGE);
        // A new VMI from the template has the entry: the condition goes.
        app.store.delete(&vmi_key, Propagation::Cascade);
        settle(&app);
        let vmi = app.store.get(&vmi_key).expect("a new VMI");
        assert_eq!(vmi["spec"]["accessCredentials"], entry);
        assert!(condition(&app).is_none());
    }
}
