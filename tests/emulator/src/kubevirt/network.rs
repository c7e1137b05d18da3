//! A VM's network interfaces: how they appear in the instance's status, and what adding or
//! removing one does to a running VM.
//!
//! KubeVirt:
//! - a VMI is made from the VM template without the interfaces whose `state` is `absent`, nor
//!   their networks (virt-controller `pkg/virt-controller/watch/vm/vm.go`, `setupVMIFromVM`,
//!   filtering with `pkg/network/vmispec`); its `status.interfaces` lists each interface with
//!   its MAC (`infoSource` `domain, guest-agent` for the pod network, `domain, guest-agent,
//!   multus-status` for a Multus one: `pkg/network/vmispec/infosource.go`).
//! - under `vmRolloutStrategy: LiveUpdate`, a change of interfaces or networks needs a restart
//!   only when an interface or network of the running VMI was removed from the VM (not through
//!   `state: absent`) or changed, or when the pod network was added
//!   (`pkg/network/vmliveupdate/restart.go`, `IsRestartRequired`); a new bridge interface on
//!   a Multus network, or an interface turned `absent`, is copied to the VMI
//!   (`handleDynamicInterfaceRequests`, `vmispec.ApplyDynamicIfaceRequestOnVMI`), which gets the
//!   condition `MigrationRequired`; the workload updater migrates it, and the target pod has
//!   the new interfaces (VEP 29, "Integrate NIC Hotplug with LiveUpdate Rollout Strategy",
//!   kubevirt/enhancements `veps/sig-network/hotplug-with-liveupdate`). Emulator
//!   simplification: the condition is `True` at once (upstream: `False` for ten seconds, the
//!   time left to the dynamic-networks-controller, which the emulator does not run).
//! - under any other rollout strategy the template comparison of `live_update.rs` keeps them,
//!   so any change sets `RestartRequired`.
//!
//! Deckhouse (the virtualization user guide, "Additional network interfaces"; the comparator
//! `pkg/controller/vmchange/comparator_pod_placement.go`, `compareNetworks`, deckhouse/
//! virtualization PR 2187): adding or removing a `Network` / `ClusterNetwork` on a running VM
//! applies at once, a change of the `Main` network waits for a restart; `status.networks`
//! lists the applied networks, each additional one with its MAC address
//! (`virtualMachineMACAddressName` naming its VirtualMachineMACAddress).

use serde_json::{Value, json};

use crate::core::app::App;
use crate::core::store::Key;
use crate::core::util::meta_str;

/// The VMI condition a NIC hotplug sets for the workload updater.
pub const MIGRATION_REQUIRED: &str = "MigrationRequired";

fn items<'a>(spec: &'a Value, pointer: &str) -> Vec<&'a Value> {
    spec.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn name_of(v: &Value) -> &str {
    v.get("name").and_then(Value::as_str).unwrap_or("")
}

fn absent(iface: &Value) -> bool {
    iface.get("state").and_then(Value::as_str) == Some("absent")
}

/// A VMI's spec from the VM template: `absent` interfaces and their networks left out.
pub fn vmi_spec_from_template(spec: &mut Value) {
    let gone: Vec<String> = items(spec, "/domain/devices/interfaces")
        .into_iter()
        .filter(|i| absent(i))
        .map(|i| name_of(i).to_string())
        .collect();
    if gone.is_empty() {
        return;
    }
    if let Some(list) = spec
        .pointer_mut("/domain/devices/interfaces")
        .and_then(Value::as_array_mut)
    {
        list.retain(|i| !absent(i));
    }
    if let Some(list) = spec.get_mut("networks").and_then(Value::as_array_mut) {
        list.retain(|n| !gone.iter().any(|g| g == name_of(n)));
    }
}

/// A MAC for interface `index` of the machine seeded by `seed` (locally administered).
pub fn mac(seed: [u8; 4], index: usize) -> String {
    let [a, b, c, d] = seed;
    format!("02:{c:02x}:{d:02x}:{a:02x}:{b:02x}:{:02x}", index + 1)
}

/// `status.interfaces` of a VMI with spec `spec`: the pod network's interface has `ip`.
pub fn kubevirt_status_interfaces(spec: &Value, ip: &str, seed: [u8; 4]) -> Value {
    let networks = items(spec, "/networks");
    let ifaces = items(spec, "/domain/devices/interfaces");
    if ifaces.is_empty() {
        // No interfaces: virt-api's defaults give the pod network's `default`.
        return json!([{"name": "default", "ipAddress": ip, "ipAddresses": [ip], "mac": mac(seed, 0),
            "interfaceName": "eth0", "infoSource": "domain, guest-agent", "queueCount": 1}]);
    }
    let mut out = vec![];
    for (i, iface) in ifaces.iter().enumerate().filter(|(_, i)| !absent(i)) {
        let name = name_of(iface);
        let network = networks.iter().find(|n| name_of(n) == name);
        let pod = network.is_some_and(|n| n.get("pod").is_some());
        let mut s = json!({"name": name, "mac": iface.get("macAddress").cloned().unwrap_or(json!(mac(seed, i))),
            "interfaceName": format!("eth{i}"), "queueCount": 1});
        if pod {
            s["ipAddress"] = json!(ip);
            s["ipAddresses"] = json!([ip]);
            s["infoSource"] = json!("domain, guest-agent");
        } else {
            s["infoSource"] = json!("domain, guest-agent, multus-status");
        }
        out.push(s);
    }
    Value::Array(out)
}

fn by_name<'a>(list: &[&'a Value]) -> Vec<(&'a str, &'a Value)> {
    list.iter().map(|v| (name_of(v), *v)).collect()
}

fn without_state(v: &Value) -> Value {
    let mut v = v.clone();
    v.as_object_mut().map(|m| m.remove("state"));
    v
}

/// `IsRestartRequired` (`pkg/network/vmliveupdate/restart.go`): the VM template `template`
/// against the running VMI's spec `current`.
pub fn restart_required(template: &Value, current: &Value) -> bool {
    let (want_if, have_if) = (
        items(template, "/domain/devices/interfaces"),
        items(current, "/domain/devices/interfaces"),
    );
    let want_if = by_name(&want_if);
    for (name, have) in by_name(&have_if) {
        match want_if.iter().find(|(n, _)| *n == name) {
            None => return true,
            Some((_, want)) if without_state(want) != without_state(have) => return true,
            _ => {}
        }
    }
    let (want_net, have_net) = (items(template, "/networks"), items(current, "/networks"));
    let pod = |l: &[&Value]| l.iter().any(|n| n.get("pod").is_some());
    if pod(&want_net) && !pod(&have_net) {
        return true;
    }
    let want_net = by_name(&want_net);
    by_name(&have_net).iter().any(|(name, have)| {
        want_net.iter().find(|(n, _)| n == name).map(|(_, w)| *w) != Some(*have)
    })
}

/// `ApplyDynamicIfaceRequestOnVMI`: the VMI spec `current` with the template's new bridge
/// interfaces on Multus networks and its `absent` states; `None` when nothing changes.
fn dynamic_request(template: &Value, current: &Value) -> Option<Value> {
    let mut next = current.clone();
    let mut changed = false;
    let tmpl_nets = items(template, "/networks");
    for iface in items(template, "/domain/devices/interfaces") {
        let name = name_of(iface);
        let have = items(current, "/domain/devices/interfaces")
            .into_iter()
            .position(|i| name_of(i) == name);
        match have {
            Some(at) if absent(iface) && !absent(&next["domain"]["devices"]["interfaces"][at]) => {
                next["domain"]["devices"]["interfaces"][at]["state"] = json!("absent");
                changed = true;
            }
            Some(_) => {}
            None if !absent(iface) && iface.get("bridge").is_some() => {
                let Some(net) = tmpl_nets
                    .iter()
                    .find(|n| name_of(n) == name && n.get("multus").is_some())
                else {
                    continue;
                };
                if !next["domain"]["devices"]["interfaces"].is_array() {
                    next["domain"]["devices"]["interfaces"] = json!([]);
                }
                if !next["networks"].is_array() {
                    next["networks"] = json!([]);
                }
                next["domain"]["devices"]["interfaces"]
                    .as_array_mut()
                    .expect("array")
                    .push(iface.clone());
                next["networks"]
                    .as_array_mut()
                    .expect("array")
                    .push((*net).clone());
                changed = true;
            }
            None => {}
        }
    }
    changed.then_some(next)
}

/// KubeVirt VM `vm` with running VMI `vmi_key` under rollout strategy `live`: whether the
/// network changes need a restart (`Some`, the message); else hot-plug what the template asks
/// for and have the workload updater migrate the VMI.
pub fn kubevirt_sync(app: &App, vm: &Value, vmi_key: &Key, live: bool) -> Option<String> {
    if !live {
        // live_update.rs compares the whole template (interfaces and networks included).
        return None;
    }
    let vmi = app.store.get(vmi_key)?;
    let template = vm
        .pointer("/spec/template/spec")
        .cloned()
        .unwrap_or(json!({}));
    if restart_required(&template, &vmi["spec"]) {
        return Some(crate::kubevirt::live_update::NON_LIVE_MESSAGE.into());
    }
    let migrating = vmi
        .pointer("/status/migrationState")
        .is_some_and(|s| s.get("completed").and_then(Value::as_bool) != Some(true));
    if migrating {
        return None;
    }
    if let Some(spec) = dynamic_request(&template, &vmi["spec"]) {
        app.store.modify(vmi_key, |o| {
            o["spec"] = spec.clone();
            crate::core::controllers::set_condition(
                &mut o["status"],
                MIGRATION_REQUIRED,
                true,
                "",
                "",
            );
        });
        if let Some(vmi) = app.store.get(vmi_key) {
            crate::kubevirt::placement::start_workload_update(app, &vmi);
        }
    }
    None
}

/// A migration of the VMI at `vmi_key` completed: the target pod has the VMI's interfaces.
pub fn migrated(app: &App, vmi_key: &Key, seed: [u8; 4]) {
    let Some(vmi) = app.store.get(vmi_key) else {
        return;
    };
    let ip = vmi
        .pointer("/status/interfaces")
        .and_then(Value::as_array)
        .and_then(|l| l.iter().find_map(|i| i.get("ipAddress").cloned()))
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let interfaces = kubevirt_status_interfaces(&vmi["spec"], &ip, seed);
    app.store.modify(vmi_key, |o| {
        o["status"]["interfaces"] = interfaces.clone();
        if let Some(c) = o["status"]["conditions"].as_array_mut() {
            c.retain(|c| c["type"] != MIGRATION_REQUIRED);
        }
    });
}

/// Deckhouse `spec.networks`, an absent list being the main network alone.
fn deckhouse_networks(spec: &Value) -> Vec<Value> {
    match spec.get("networks").and_then(Value::as_array) {
        Some(l) if !l.is_empty() => l.clone(),
        _ => vec![json!({"type": "Main"})],
    }
}

/// `compareNetworks`: `None` when the networks are equal, else whether the change waits for
/// a restart (the `Main` network added or removed).
pub fn deckhouse_network_change(last: &Value, spec: &Value) -> Option<bool> {
    let (a, b) = (deckhouse_networks(last), deckhouse_networks(spec));
    if a == b {
        return None;
    }
    let main = |l: &[Value]| l.iter().any(|n| n["type"] == "Main");
    Some(main(&a) != main(&b))
}

/// `status.networks` of Deckhouse VM `vm` running with spec `applied`.
pub fn deckhouse_status_networks(vm: &Value, applied: &Value, seed: [u8; 4]) -> Value {
    let name = meta_str(vm, "name");
    let list = deckhouse_networks(applied)
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut s = json!({"type": n["type"]});
            if n["type"] != "Main" {
                let net = n.get("name").and_then(Value::as_str).unwrap_or("");
                s["name"] = json!(net);
                s["macAddress"] = json!(mac(seed, i));
                s["virtualMachineMACAddressName"] = json!(format!("{name}-{net}"));
            }
            s
        })
        .collect();
    Value::Array(list)
}

/// The main network's pool (`virtualMachineCIDRs` of the module settings) the emulator hands
/// addresses from: the one its VMs' automatic addresses (`10.66.x.y`) come from.
pub const VM_CIDR: (u8, u8) = (10, 66);

/// The VirtualMachineIPAddress controller (the user guide, "IP addresses of VMs"; the CRD's
/// `status.phase` Pending / Bound / Attached): a `Static` address is leased as asked, an `Auto`
/// one picked from the pool (not one another address holds); it is `Bound` once leased and
/// `Attached` while a VM names it in `spec.virtualMachineIPAddressName`
/// (`status.virtualMachineName`).
pub fn vmip(app: &App, ip: &Value, _tick: bool) {
    const DH: &str = "virtualization.deckhouse.io";
    let ns = meta_str(ip, "namespace").to_string();
    let name = meta_str(ip, "name").to_string();
    let (all, _) = app.store.list(DH, "virtualmachineipaddresses", None);
    let taken: Vec<&str> = all
        .iter()
        .filter(|o| meta_str(o, "uid") != meta_str(ip, "uid"))
        .filter_map(|o| o.pointer("/status/address").and_then(Value::as_str))
        .collect();
    let address = match ip.pointer("/status/address").and_then(Value::as_str) {
        Some(a) => Some(a.to_string()),
        None if ip.pointer("/spec/type").and_then(Value::as_str) == Some("Static") => ip
            .pointer("/spec/staticIP")
            .and_then(Value::as_str)
            .filter(|a| !taken.contains(a))
            .map(str::to_owned),
        None => {
            let [a, b, ..] = crate::core::controllers::uid_seed_of(ip);
            (0..=u16::MAX).find_map(|n| {
                let v = (u16::from(a) << 8 | u16::from(b)).wrapping_add(n);
                let (x, y) = ((v >> 8) as u8, (v & 0xff) as u8);
                // The first and last address of a subnet are not handed out.
                let cand = format!("{}.{}.{x}.{y}", VM_CIDR.0, VM_CIDR.1);
                {
                    let edge = (x, y) == (0, 0) || (x, y) == (255, 255);
                    !(edge || taken.contains(&cand.as_str()))
                }
                .then_some(cand)
            })
        }
    };
    let (vms, _) = app.store.list(DH, "virtualmachines", Some(&ns));
    let vm = vms.iter().find(|v| {
        v.pointer("/spec/virtualMachineIPAddressName")
            .and_then(Value::as_str)
            == Some(&name)
    });
    let phase = match (&address, vm) {
        (None, _) => "Pending",
        (Some(_), None) => "Bound",
        (Some(_), Some(_)) => "Attached",
    };
    let vm_name = vm.map(|v| meta_str(v, "name").to_string());
    app.store
        .modify(&Key::of(DH, "virtualmachineipaddresses", ip), |o| {
            let generation = o["metadata"]["generation"].clone();
            let st = &mut o["status"];
            if !st.is_object() {
                *st = json!({});
            }
            st["phase"] = json!(phase);
            match &address {
                Some(a) => st["address"] = json!(a),
                None => {
                    st.as_object_mut().map(|m| m.remove("address"));
                }
            }
            match &vm_name {
                Some(v) => st["virtualMachineName"] = json!(v),
                None => {
                    st.as_object_mut().map(|m| m.remove("virtualMachineName"));
                }
            }
            st["observedGeneration"] = generation;
        });
}

/// Deckhouse VM `vm`'s address when it names a VirtualMachineIPAddress: `Ok(None)` when it
/// names none, `Err(name)` while that address does not exist or has no address yet (the VM
/// waits: its condition `VirtualMachineIPAddressReady` is False).
pub fn deckhouse_vm_address(app: &App, vm: &Value) -> Result<Option<(String, String)>, String> {
    let Some(name) = vm
        .pointer("/spec/virtualMachineIPAddressName")
        .and_then(Value::as_str)
    else {
        return Ok(None);
    };
    let key = Key::new(
        "virtualization.deckhouse.io",
        "virtualmachineipaddresses",
        meta_str(vm, "namespace"),
        name,
    );
    let address = app
        .store
        .get(&key)
        .and_then(|o| {
            o.pointer("/status/address")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .ok_or_else(|| name.to_string())?;
    Ok(Some((name.to_string(), address)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(ifaces: Value, nets: Value) -> Value {
        json!({"domain": {"devices": {"interfaces": ifaces}}, "networks": nets})
    }

    /// restart.go: adding a bridge interface is live; removing one without `absent`,
    /// changing one, or adding the pod network needs a restart; `absent` alone does not.
    #[test]
    fn restart_rules_follow_vmliveupdate() {
        let running = spec(
            json!([{"name": "default", "masquerade": {}}]),
            json!([{"name": "default", "pod": {}}]),
        );
        let added = spec(
            json!([{"name": "default", "masquerade": {}}, {"name": "blue", "bridge": {}}]),
            json!([{"name": "default", "pod": {}}, {"name": "blue", "multus": {"networkName": "blue"}}]),
        );
        assert!(!restart_required(&added, &running));
        let plugged = dynamic_request(&added, &running).unwrap();
        assert_eq!(plugged, added);
        let mut unplug = added.clone();
        unplug["domain"]["devices"]["interfaces"][1]["state"] = json!("absent");
        assert!(!restart_required(&unplug, &plugged));
        let next = dynamic_request(&unplug, &plugged).unwrap();
        assert_eq!(
            next["domain"]["devices"]["interfaces"][1]["state"],
            "absent"
        );
        assert!(
            restart_required(&running, &plugged),
            "removed without absent"
        );
        let mut changed = added.clone();
        changed["networks"][1]["multus"]["networkName"] = json!("red");
        assert!(restart_required(&changed, &plugged));
    }

    #[test]
    fn absent_interfaces_are_left_out_of_a_new_vmi() {
        let mut s = spec(
            json!([{"name": "default", "masquerade": {}}, {"name": "blue", "bridge": {}, "state": "absent"}]),
            json!([{"name": "default", "pod": {}}, {"name": "blue", "multus": {"networkName": "blue"}}]),
        );
        vmi_spec_from_template(&mut s);
        assert_eq!(s["networks"].as_array().unwrap().len(), 1);
        let st = kubevirt_status_interfaces(&s, "10.244.0.5", [1, 2, 3, 4]);
        assert_eq!(st[0]["ipAddress"], "10.244.0.5");
        assert_eq!(st.as_array().unwrap().len(), 1);
    }

    /// The user guide: additional networks apply live, the Main network waits for a restart.
    #[test]
    fn deckhouse_additional_networks_are_live_main_is_not() {
        let none = json!({});
        let with = json!({"networks": [{"type": "Main"}, {"type": "Network", "name": "user-net"}]});
        assert_eq!(
            deckhouse_network_change(&none, &json!({"networks": [{"type": "Main"}]})),
            None
        );
        assert_eq!(deckhouse_network_change(&none, &with), Some(false));
        let no_main = json!({"networks": [{"type": "Network", "name": "user-net"}]});
        assert_eq!(deckhouse_network_change(&with, &no_main), Some(true));
        let st = deckhouse_status_networks(
            &json!({"metadata": {"name": "vm"}}),
            &with,
            [0xaa, 0xbb, 0xcc, 0xdd],
        );
        assert_eq!(st[0], json!({"type": "Main"}));
        assert_eq!(st[1]["name"], "user-net");
        assert_eq!(st[1]["macAddress"], "02:cc:dd:aa:bb:02");
    }
    /// VEP 29 end to end: a bridge interface added to a running VM's template reaches the
    /// VMI spec, the VMI gets MigrationRequired and a workload-update migration, after which
    /// its status lists the interface; marking it absent unplugs it the same way.
    #[test]
    fn hotplug_goes_through_a_workload_update_migration() {
        use crate::ServeFlavor;
        use crate::core::controllers::reconcile_all;
        use crate::core::registry::Registry;
        use std::time::Duration;
        const KV: &str = "kubevirt.io";
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        for n in ["node-1", "node-2"] {
            app.store
                .create(
                    "",
                    "nodes",
                    json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}}),
                )
                .unwrap();
        }
        app.store
            .create(
                KV,
                "virtualmachines",
                json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {"runStrategy": "Always", "template": {"spec": {
                    "domain": {"devices": {"interfaces": [{"name": "default", "masquerade": {}}]}},
                    "networks": [{"name": "default", "pod": {}}]}}}}),
            )
            .unwrap();
        for _ in 0..5 {
            reconcile_all(&app, true);
        }
        let vmi_key = Key::new(KV, "virtualmachineinstances", "default", "web");
        let names = |app: &App| -> Vec<String> {
            app.store.get(&vmi_key).unwrap()["status"]["interfaces"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["name"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(names(&app), ["default"]);
        let vm_key = Key::new(KV, "virtualmachines", "default", "web");
        app.store.modify(&vm_key, |o| {
            let t = &mut o["spec"]["template"]["spec"];
            t["domain"]["devices"]["interfaces"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "blue", "bridge": {}}));
            t["networks"]
                .as_array_mut()
                .unwrap()
                .push(json!({"name": "blue", "multus": {"networkName": "blue"}}));
        });
        reconcile_all(&app, true);
        let vmi = app.store.get(&vmi_key).unwrap();
        assert_eq!(
            vmi["spec"]["domain"]["devices"]["interfaces"][1]["name"],
            "blue"
        );
        assert_eq!(
            crate::core::table::eval_first(
                &vmi,
                ".status.conditions[?(@.type=='MigrationRequired')].status"
            ),
            Some(&json!("True"))
        );
        let vm = app.store.get(&vm_key).unwrap();
        assert_eq!(
            crate::core::table::eval_first(
                &vm,
                ".status.conditions[?(@.type=='RestartRequired')].status"
            ),
            None
        );
        assert_eq!(
            app.store
                .list(KV, "virtualmachineinstancemigrations", None)
                .0
                .len(),
            1
        );
        for _ in 0..15 {
            reconcile_all(&app, true);
        }
        assert_eq!(names(&app), ["default", "blue"]);
        app.store.modify(&vm_key, |o| {
            o["spec"]["template"]["spec"]["domain"]["devices"]["interfaces"][1]["state"] =
                json!("absent");
        });
        for _ in 0..15 {
            reconcile_all(&app, true);
        }
        assert_eq!(names(&app), ["default"]);
        // Removed outright (not through absent): a restart (restart.go).
        app.store.modify(&vm_key, |o| {
            let t = &mut o["spec"]["template"]["spec"];
            t["domain"]["devices"]["interfaces"]
                .as_array_mut()
                .unwrap()
                .pop();
            t["networks"].as_array_mut().unwrap().pop();
        });
        reconcile_all(&app, true);
        let vm = app.store.get(&vm_key).unwrap();
        assert_eq!(
            crate::core::table::eval_first(
                &vm,
                ".status.conditions[?(@.type=='RestartRequired')].status"
            ),
            Some(&json!("True"))
        );
    }
    /// The user guide's lifecycle: a Static address is leased as asked and an Auto one from
    /// the pool, both Bound; Attached with `virtualMachineName` once a VM names it, and the VM
    /// reports that address.
    #[test]
    fn ip_addresses_are_bound_then_attached() {
        use crate::ServeFlavor;
        use crate::core::controllers::reconcile_all;
        use crate::core::registry::Registry;
        use std::time::Duration;
        const DH: &str = "virtualization.deckhouse.io";
        let app = App::new(
            Registry::new(ServeFlavor::Deckhouse),
            Duration::from_secs(1),
        );
        for (name, spec) in [
            (
                "fixed",
                json!({"type": "Static", "staticIP": "10.66.20.77"}),
            ),
            ("auto", json!({"type": "Auto"})),
        ] {
            app.store
                .create(DH, "virtualmachineipaddresses", json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2",
                    "kind": "VirtualMachineIPAddress", "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
                .unwrap();
        }
        reconcile_all(&app, true);
        let get = |name: &str| {
            app.store
                .get(&Key::new(DH, "virtualmachineipaddresses", "default", name))
                .unwrap()
        };
        assert_eq!(get("fixed")["status"]["phase"], "Bound");
        assert_eq!(get("fixed")["status"]["address"], "10.66.20.77");
        let auto = get("auto")["status"]["address"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            auto.starts_with("10.66.") && auto != "10.66.20.77",
            "{auto}"
        );
        let vm = json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
            "metadata": {"name": "db", "namespace": "default", "uid": "00000000-0000-4000-8000-000000000001"},
            "spec": {"virtualMachineIPAddressName": "fixed"}});
        assert_eq!(
            deckhouse_vm_address(&app, &vm),
            Ok(Some(("fixed".into(), "10.66.20.77".into())))
        );
        let mut missing = vm.clone();
        missing["spec"]["virtualMachineIPAddressName"] = json!("nope");
        assert_eq!(deckhouse_vm_address(&app, &missing), Err("nope".into()));
        app.store.create(DH, "virtualmachines", vm).unwrap();
        reconcile_all(&app, true);
        assert_eq!(get("fixed")["status"]["phase"], "Attached");
        assert_eq!(get("fixed")["status"]["virtualMachineName"], "db");
        assert_eq!(get("auto")["status"]["phase"], "Bound");
    }
}
