//! KubeVirt VirtualMachinePool (`pool.kubevirt.io`): keeps `spec.replicas` VirtualMachines made
//! from `spec.virtualMachineTemplate`, the way upstream's pool controller does
//! (kubevirt/kubevirt pkg/virt-controller/watch/pool/pool.go):
//!
//! - replicas are the VMs the pool controls (controller ownerReference with its uid) whose
//!   labels match `spec.selector` (`ReleaseDetachedVirtualMachines`: orphans are never adopted);
//!   nothing is done while the template's labels do not match the selector or `spec.paused`;
//! - scale out: names `<pool>-<index>`, the lowest indices no VM of the namespace uses
//!   (`calculateNewVMNames`); labels and annotations copied from the template's metadata plus
//!   the revision label `kubevirt.io/vm-pool-revision-name: <pool>-<generation>`
//!   (`injectPoolRevisionLabelsIntoVM`); the spec indexed by `indexVMSpec`: each
//!   `dataVolumeTemplates` name (and the volumes naming it) gets `-<index>`, and with
//!   `nameGeneration.appendIndexToSecretRefs` so do secret volumes and cloud-init
//!   `secretRef` (UserDataSecretRef) and `networkDataSecretRef` (ConfigMaps with `appendIndexToConfigMapRefs`);
//!   a controller ownerReference to the pool (`poolOwnerRef`), so the garbage collector
//!   deletes the replicas (and, through them, their DataVolumes) with the pool;
//! - scale in: upstream's default sort policy is random; here the highest indices go first (one
//!   of the orders random can produce, and deterministic for tests);
//! - status: `replicas` (controlled VMs), `readyReplicas` (their VM condition Ready=True) and
//!   `labelSelector` (the selector as a string, `updateStatus`).
//!
//! Not modelled: the ControllerRevision objects and proactive updates of replicas after the
//! template changes, autohealing, and the `pool.kubevirt.io/finalizer` upstream puts on pools
//! and replicas (the emulator's store has no generic finalizers; upstream removes them when the
//! pool is deleted, so the end state, replicas collected with the pool, is the same).

use super::{key_of, owner_ref};
use crate::core::app::App;
use crate::core::store::{Key, Propagation};
use crate::core::util::meta_str;
use serde_json::{Value, json};

/// The label upstream puts on every replica naming the pool revision it was made from.
const REVISION_LABEL: &str = "kubevirt.io/vm-pool-revision-name";

/// `spec.selector` as label pairs; `None` when it uses anything but `matchLabels` with string
/// values (the emulator does not evaluate `matchExpressions`).
fn selector(pool: &Value) -> Option<Vec<(String, String)>> {
    let sel = pool.pointer("/spec/selector")?;
    if sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .is_some_and(|e| !e.is_empty())
    {
        return None;
    }
    let labels = sel.get("matchLabels").and_then(Value::as_object)?;
    let mut pairs: Vec<(String, String)> = labels
        .iter()
        .map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect::<Option<_>>()?;
    pairs.sort();
    Some(pairs)
}

fn matches(labels: &Value, selector: &[(String, String)]) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.get(k).and_then(Value::as_str) == Some(v))
}

fn controlled_by(obj: &Value, uid: &str) -> bool {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter()
                .any(|r| r["controller"] == true && r["uid"] == uid)
        })
}

/// `indexFromName`: the number after the last `-`.
fn index_of(name: &str) -> Option<u64> {
    name.rsplit('-').next()?.parse().ok()
}

/// The replica's spec: the template's spec with per-index names (`indexVMSpec`).
pub(crate) fn index_spec(pool: &Value, index: u64) -> Value {
    let mut spec = pool
        .pointer("/spec/virtualMachineTemplate/spec")
        .cloned()
        .unwrap_or(json!({}));
    let suffix = format!("-{index}");
    let mut renamed = Vec::new();
    if let Some(templates) = spec
        .get_mut("dataVolumeTemplates")
        .and_then(Value::as_array_mut)
    {
        for t in templates {
            if let Some(name) = t.pointer("/metadata/name").and_then(Value::as_str) {
                let new = format!("{name}{suffix}");
                renamed.push((name.to_owned(), new.clone()));
                t["metadata"]["name"] = json!(new);
            }
        }
    }
    let flag = |f: &str| {
        pool.pointer(&format!("/spec/nameGeneration/{f}"))
            .and_then(Value::as_bool)
            == Some(true)
    };
    let (secrets, config_maps) = (
        flag("appendIndexToSecretRefs"),
        flag("appendIndexToConfigMapRefs"),
    );
    let rename = |v: &mut Value, field: &str, map: &[(String, String)]| {
        if let Some(new) = v[field]
            .as_str()
            .and_then(|n| map.iter().find(|(old, _)| old == n))
            .map(|(_, new)| new.clone())
        {
            v[field] = json!(new);
        }
    };
    let append = |v: &mut Value, field: &str| {
        if let Some(name) = v.get(field).and_then(Value::as_str) {
            v[field] = json!(format!("{name}{suffix}"));
        }
    };
    let volumes = spec
        .pointer_mut("/template/spec/volumes")
        .and_then(Value::as_array_mut);
    for volume in volumes.into_iter().flatten() {
        // One volume source each, checked in upstream's order.
        if let Some(pvc) = volume.get_mut("persistentVolumeClaim") {
            rename(pvc, "claimName", &renamed);
        } else if let Some(dv) = volume.get_mut("dataVolume") {
            rename(dv, "name", &renamed);
        } else if let Some(cm) = volume.get_mut("configMap").filter(|_| config_maps) {
            append(cm, "name");
        } else if let Some(secret) = volume.get_mut("secret").filter(|_| secrets) {
            append(secret, "secretName");
        } else if let Some(ci) = ["cloudInitNoCloud", "cloudInitConfigDrive"]
            .into_iter()
            .find(|k| volume.get(k).is_some())
            .filter(|_| secrets)
        {
            // Go's UserDataSecretRef is `secretRef` in JSON.
            for r in ["secretRef", "networkDataSecretRef"] {
                if let Some(r) = volume[ci].get_mut(r) {
                    append(r, "name");
                }
            }
        }
    }
    spec
}

/// One replica VM of `pool` with index `index` (`scaleOut`).
fn replica(pool: &Value, index: u64, revision: &str) -> Value {
    let ns = meta_str(pool, "namespace");
    let template_meta = pool
        .pointer("/spec/virtualMachineTemplate/metadata")
        .cloned()
        .unwrap_or(json!({}));
    let mut labels = template_meta
        .get("labels")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or(json!({}));
    labels[REVISION_LABEL] = json!(revision);
    let mut spec = index_spec(pool, index);
    if !spec["template"]["metadata"]["labels"].is_object() {
        spec["template"]["metadata"]["labels"] = json!({});
    }
    spec["template"]["metadata"]["labels"][REVISION_LABEL] = json!(revision);
    let mut meta = json!({
        "name": format!("{}-{index}", meta_str(pool, "name")),
        "namespace": ns,
        "labels": labels,
        "ownerReferences": [owner_ref(pool)],
    });
    if let Some(a) = template_meta.get("annotations").filter(|a| a.is_object()) {
        meta["annotations"] = a.clone();
    }
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": meta, "spec": spec})
}

pub(super) fn kubevirt_pool(app: &App, pool: &Value, _tick: bool) {
    if !pool["metadata"]["deletionTimestamp"].is_null() {
        return;
    }
    let Some(selector) = selector(pool) else {
        return;
    };
    let template_labels = pool
        .pointer("/spec/virtualMachineTemplate/metadata/labels")
        .cloned()
        .unwrap_or(json!({}));
    // Upstream: "Selector does not match template labels, will not re-enqueue."
    if selector.is_empty() || !matches(&template_labels, &selector) {
        return;
    }
    let ns = meta_str(pool, "namespace");
    let uid = meta_str(pool, "uid");
    let pool_key = key_of("pool.kubevirt.io", "virtualmachinepools", pool);
    let (all_vms, _) = app.store.list("kubevirt.io", "virtualmachines", Some(ns));
    let mut owned: Vec<&Value> = all_vms
        .iter()
        .filter(|vm| controlled_by(vm, uid) && matches(&vm["metadata"]["labels"], &selector))
        .collect();
    let wanted = pool
        .pointer("/spec/replicas")
        .and_then(Value::as_u64)
        .unwrap_or(1) as usize;
    let paused = pool.pointer("/spec/paused").and_then(Value::as_bool) == Some(true);
    if !paused && owned.len() < wanted {
        let generation = pool
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let revision = format!("{}-{generation}", meta_str(pool, "name"));
        let taken = |i: u64| {
            let name = format!("{}-{i}", meta_str(pool, "name"));
            all_vms.iter().any(|vm| meta_str(vm, "name") == name)
        };
        let mut index = 0;
        for _ in owned.len()..wanted {
            while taken(index) {
                index += 1;
            }
            let vm = replica(pool, index, &revision);
            crate::core::gc::create_dependent(
                app,
                &pool_key,
                pool,
                "kubevirt.io",
                "virtualmachines",
                vm,
            );
            index += 1;
        }
    } else if !paused && owned.len() > wanted {
        owned.sort_by_key(|vm| std::cmp::Reverse(index_of(meta_str(vm, "name")).unwrap_or(0)));
        for vm in owned.drain(..owned.len() - wanted) {
            let key = Key::of("kubevirt.io", "virtualmachines", vm);
            app.store.delete(&key, Propagation::Cascade);
        }
    }
    // Status from the store as it is now.
    let (vms, _) = app.store.list("kubevirt.io", "virtualmachines", Some(ns));
    let owned: Vec<&Value> = vms
        .iter()
        .filter(|vm| controlled_by(vm, uid) && matches(&vm["metadata"]["labels"], &selector))
        .collect();
    let ready = owned
        .iter()
        .filter(|vm| {
            vm.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
        })
        .count();
    let label_selector = selector
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let status = json!({
        "replicas": owned.len(),
        "readyReplicas": ready,
        "labelSelector": label_selector,
    });
    // Only a change is written (each write wakes the reconcilers again).
    let changed = status
        .as_object()
        .expect("object")
        .iter()
        .any(|(k, v)| pool.pointer(&format!("/status/{k}")) != Some(v));
    if changed {
        app.store.modify(&pool_key, |o| {
            let mut st = o.get("status").cloned().unwrap_or(json!({}));
            for (k, v) in status.as_object().expect("object") {
                st[k] = v.clone();
            }
            o["status"] = st;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::super::{owned_by, reconcile_all};
    use super::*;
    use crate::ServeFlavor;
    use crate::core::registry::Registry;
    use std::time::Duration;

    fn pool(replicas: u64) -> Value {
        json!({"apiVersion": "pool.kubevirt.io/v1beta1", "kind": "VirtualMachinePool",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": replicas,
                "selector": {"matchLabels": {"kubevm.io/pool": "web"}},
                "nameGeneration": {"appendIndexToSecretRefs": true},
                "virtualMachineTemplate": {
                    "metadata": {"labels": {"kubevm.io/pool": "web"},
                                 "annotations": {"ssh.kubevm.io/trust": "vm-scoped"}},
                    "spec": {"runStrategy": "Always",
                        "dataVolumeTemplates": [{"metadata": {"name": "web-rootdisk"},
                            "spec": {"source": {"blank": {}},
                                     "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}],
                        "template": {"spec": {"domain": {"devices": {}}, "volumes": [
                            {"name": "rootdisk", "dataVolume": {"name": "web-rootdisk"}},
                            {"name": "other", "dataVolume": {"name": "shared"}},
                            {"name": "cloudinitdisk", "cloudInitNoCloud":
                                {"secretRef": {"name": "web-cloudinit"}}}]}}}}}})
    }

    fn get(app: &App, group: &str, plural: &str, name: &str) -> Option<Value> {
        app.store.get(&Key::new(group, plural, "default", name))
    }

    fn settle(app: &App) {
        for _ in 0..6 {
            reconcile_all(app, true);
        }
    }

    fn set_replicas(app: &App, n: u64) {
        app.store
            .modify(
                &Key::new("pool.kubevirt.io", "virtualmachinepools", "default", "web"),
                |p| p["spec"]["replicas"] = json!(n),
            )
            .unwrap();
    }

    #[test]
    fn replicas_get_indexed_names_disks_and_secret_refs() {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        // A VM of the name index 1 would take, not the pool's: upstream skips the index.
        app.store
            .create(
                "kubevirt.io",
                "virtualmachines",
                json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                    "metadata": {"name": "web-1", "namespace": "default",
                                 "labels": {"kubevm.io/pool": "web"}},
                    "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}}),
            )
            .unwrap();
        let p = app
            .store
            .create("pool.kubevirt.io", "virtualmachinepools", pool(3))
            .unwrap();
        settle(&app);
        for (i, name) in ["web-0", "web-2", "web-3"].iter().enumerate() {
            let vm = get(&app, "kubevirt.io", "virtualmachines", name)
                .unwrap_or_else(|| panic!("{name} (replica {i})"));
            let index = &name[4..];
            assert!(owned_by(&vm, &p), "{name}");
            assert_eq!(
                vm["metadata"]["ownerReferences"][0]["kind"],
                "VirtualMachinePool"
            );
            assert_eq!(vm["metadata"]["ownerReferences"][0]["controller"], true);
            assert_eq!(vm["metadata"]["labels"]["kubevm.io/pool"], "web");
            assert_eq!(vm["metadata"]["labels"][REVISION_LABEL], "web-1");
            assert_eq!(
                vm["metadata"]["annotations"]["ssh.kubevm.io/trust"],
                "vm-scoped"
            );
            let dv_name = format!("web-rootdisk-{index}");
            assert_eq!(
                vm["spec"]["dataVolumeTemplates"][0]["metadata"]["name"],
                dv_name.as_str()
            );
            let volumes = &vm["spec"]["template"]["spec"]["volumes"];
            assert_eq!(volumes[0]["dataVolume"]["name"], dv_name.as_str());
            // A volume naming no template keeps its name.
            assert_eq!(volumes[1]["dataVolume"]["name"], "shared");
            assert_eq!(
                volumes[2]["cloudInitNoCloud"]["secretRef"]["name"],
                format!("web-cloudinit-{index}").as_str()
            );
            // Each replica's own DataVolume, owned by the replica.
            let dv = get(&app, "cdi.kubevirt.io", "datavolumes", &dv_name).expect("DV");
            assert!(owned_by(&dv, &vm));
        }
        let foreign = get(&app, "kubevirt.io", "virtualmachines", "web-1").unwrap();
        assert!(
            foreign["metadata"]["ownerReferences"].is_null(),
            "never adopted"
        );
        let p = get(&app, "pool.kubevirt.io", "virtualmachinepools", "web").unwrap();
        assert_eq!(p["status"]["replicas"], 3);
        assert_eq!(p["status"]["labelSelector"], "kubevm.io/pool=web");
        // Ready replicas: those whose VM condition Ready is True (upstream `filterReadyVMs`).
        let ready = ["web-0", "web-2", "web-3"]
            .iter()
            .filter(|n| {
                let vm = get(&app, "kubevirt.io", "virtualmachines", n).unwrap();
                vm["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .count();
        assert_eq!(p["status"]["readyReplicas"], ready);

        // Scale in removes the highest index with its disk; scale out reuses the free index.
        set_replicas(&app, 2);
        settle(&app);
        assert!(get(&app, "kubevirt.io", "virtualmachines", "web-3").is_none());
        assert!(get(&app, "cdi.kubevirt.io", "datavolumes", "web-rootdisk-3").is_none());
        assert!(get(&app, "kubevirt.io", "virtualmachines", "web-1").is_some());
        set_replicas(&app, 3);
        settle(&app);
        assert!(get(&app, "kubevirt.io", "virtualmachines", "web-3").is_some());

        // Deleting the pool collects the replicas and their disks, not the foreign VM.
        let key = Key::new("pool.kubevirt.io", "virtualmachinepools", "default", "web");
        app.store.delete(&key, Propagation::Cascade);
        settle(&app);
        for name in ["web-0", "web-2", "web-3"] {
            assert!(get(&app, "kubevirt.io", "virtualmachines", name).is_none());
        }
        assert!(get(&app, "cdi.kubevirt.io", "datavolumes", "web-rootdisk-0").is_none());
        assert!(get(&app, "kubevirt.io", "virtualmachines", "web-1").is_some());
    }

    /// A replica made before its cloud-init Secret exists waits for it, as the launcher pod
    /// waits for its secret volume.
    #[test]
    fn a_replica_runs_once_its_secret_exists() {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        let mut p = pool(1);
        p["spec"]["virtualMachineTemplate"]["spec"]["dataVolumeTemplates"] = json!([]);
        p["spec"]["virtualMachineTemplate"]["spec"]["template"]["spec"]["volumes"]
            .as_array_mut()
            .unwrap()
            .drain(..2);
        app.store
            .create("pool.kubevirt.io", "virtualmachinepools", p)
            .unwrap();
        settle(&app);
        let vmi = get(&app, "kubevirt.io", "virtualmachineinstances", "web-0").expect("VMI");
        assert_eq!(vmi["status"]["phase"], "Scheduled");
        app.store
            .create(
                "",
                "secrets",
                json!({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "web-cloudinit-0", "namespace": "default"},
                    "stringData": {"userdata": "#cloud-config\n"}}),
            )
            .unwrap();
        settle(&app);
        let vmi = get(&app, "kubevirt.io", "virtualmachineinstances", "web-0").unwrap();
        assert_eq!(vmi["status"]["phase"], "Running");
    }

    #[test]
    fn no_replicas_without_a_matching_selector_or_while_paused() {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        let mut p = pool(2);
        p["spec"]["selector"]["matchLabels"]["kubevm.io/pool"] = json!("other");
        app.store
            .create("pool.kubevirt.io", "virtualmachinepools", p)
            .unwrap();
        settle(&app);
        assert!(get(&app, "kubevirt.io", "virtualmachines", "web-0").is_none());

        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        let mut p = pool(2);
        p["spec"]["paused"] = json!(true);
        p["spec"]["nameGeneration"] = json!({});
        app.store
            .create("pool.kubevirt.io", "virtualmachinepools", p)
            .unwrap();
        settle(&app);
        assert!(get(&app, "kubevirt.io", "virtualmachines", "web-0").is_none());
        let key = Key::new("pool.kubevirt.io", "virtualmachinepools", "default", "web");
        app.store
            .modify(&key, |p| p["spec"]["paused"] = json!(false));
        settle(&app);
        let vm = get(&app, "kubevirt.io", "virtualmachines", "web-0").unwrap();
        // Without appendIndexToSecretRefs every replica names the template's Secret.
        assert_eq!(
            vm["spec"]["template"]["spec"]["volumes"][2]["cloudInitNoCloud"]["secretRef"]["name"],
            "web-cloudinit"
        );
    }
}
