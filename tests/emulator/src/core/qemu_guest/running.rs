//! What a running guest's machine is made of and how it follows the platform while it runs:
//! its CPUs and memory ([`super::sizing`]), SMBIOS identity ([`super::machine`]) and network
//! cards ([`super::nics`]) read from the VMI or VM, and the housekeeping passes that hot-plug
//! disks ([`super::hotplug`]), network cards and CPUs and memory into running qemus.

use serde_json::Value;

use super::{DH, KV, QemuGuests, hotplug, machine, nics, sizing};
use crate::core::app::App;
use crate::core::store::Key;

impl QemuGuests {
    /// The KubeVirt VMI spec a guest boots from (else its VM template's).
    pub(super) fn kubevirt_spec(app: &App, ns: &str, name: &str) -> Option<Value> {
        app.store
            .get(&Key::new(KV, "virtualmachineinstances", ns, name))
            .and_then(|v| v.get("spec").cloned())
            .or_else(|| {
                app.store
                    .get(&Key::new(KV, "virtualmachines", ns, name))
                    .and_then(|v| v.pointer("/spec/template/spec").cloned())
            })
    }

    /// The vCPUs and memory of a guest's boot ([`sizing`]).
    pub(super) fn sizing(&self, app: &App, ns: &str, name: &str) -> sizing::Sizing {
        let c = &self.config;
        let (memory, cpus) = (u64::from(c.memory_mib), u64::from(c.cpus));
        if let Some(spec) = Self::kubevirt_spec(app, ns, name) {
            let config = crate::kubevirt::live_update::kubevirt_configuration(app);
            return sizing::Sizing::kubevirt(&spec, &config, memory, cpus);
        }
        match app.store.get(&Key::new(DH, "virtualmachines", ns, name)) {
            Some(vm) => sizing::Sizing::deckhouse(&vm["spec"], memory, cpus),
            None => sizing::Sizing::deckhouse(&Value::Null, memory, cpus),
        }
    }

    /// The SMBIOS arguments of a KubeVirt guest; a Deckhouse guest keeps qemu's own table.
    pub(super) fn machine(app: &App, ns: &str, name: &str) -> Vec<String> {
        Self::kubevirt_spec(app, ns, name)
            .map(|spec| machine::args(&spec))
            .unwrap_or_default()
    }

    /// The guest's network cards ([`nics`]).
    pub(super) fn nics(app: &App, ns: &str, name: &str) -> Vec<nics::Nic> {
        if let Some(vmi) = app
            .store
            .get(&Key::new(KV, "virtualmachineinstances", ns, name))
        {
            return nics::kubevirt(&vmi);
        }
        match app.store.get(&Key::new(DH, "virtualmachines", ns, name)) {
            Some(vm) => nics::deckhouse(&vm),
            None => nics::kubevirt(&Value::Null),
        }
    }

    /// Plugs into (and unplugs from) each running qemu the disks its VM has hotplugged, as
    /// virt-handler does for the domain ([`hotplug`]). Only a changed set, or an unplug the
    /// guest has not finished, is sent to qemu.
    pub(super) fn sync_hotplug(&self, app: &App) {
        let live = self.live();
        let mut done = self.hotplugged.lock().unwrap_or_else(|e| e.into_inner());
        done.retain(|pid, _| live.iter().any(|p| p.pid == *pid));
        for p in live {
            let want = hotplug::attached(app, &p.key.0, &p.key.1);
            if done.get(&p.pid) == Some(&want) {
                continue;
            }
            match hotplug::sync(app, &p.qmp, self.root.path(), &want) {
                Ok(true) => {
                    done.insert(p.pid, want);
                }
                Ok(false) => {
                    done.remove(&p.pid);
                }
                Err(e) => {
                    done.remove(&p.pid);
                    if p.running() {
                        eprintln!("kubevm-emulator: hotplug into {}/{}: {e}", p.key.0, p.key.1);
                    }
                }
            }
        }
    }

    /// Plugs into (and unplugs from) each running qemu the network cards its VM's interfaces
    /// now report ([`nics`]): KubeVirt's once the interface's migration has put it in the
    /// VMI's status, Deckhouse's as soon as `status.networks` lists it.
    pub(super) fn sync_nics(&self, app: &App) {
        let live = self.live();
        let mut done = self.nics_plugged.lock().unwrap_or_else(|e| e.into_inner());
        done.retain(|pid, _| live.iter().any(|p| p.pid == *pid));
        for p in live {
            let want = Self::nics(app, &p.key.0, &p.key.1);
            if done.get(&p.pid) == Some(&want) {
                continue;
            }
            match nics::sync(&p.qmp, &want) {
                Ok(true) => {
                    done.insert(p.pid, want);
                }
                // Sent: looked at again on the next pass (an unplug waits for the guest).
                Ok(false) => {}
                Err(e) if p.running() => {
                    eprintln!(
                        "kubevm-emulator: network cards of {}/{}: {e}",
                        p.key.0, p.key.1
                    )
                }
                Err(_) => {}
            }
        }
    }

    /// Grows each running KubeVirt qemu to its VMI's sockets and guest memory, as virt-handler
    /// does after virt-controller hot-plugs a change into the VMI ([`sizing`]).
    pub(super) fn sync_sizes(&self, app: &App) {
        let live = self.live();
        let mut sized = self.sized.lock().unwrap_or_else(|e| e.into_inner());
        sized.retain(|pid, _| live.iter().any(|p| p.pid == *pid));
        for p in live {
            let Some((boot, applied)) = sized.get_mut(&p.pid) else {
                continue;
            };
            let Some(vmi) =
                app.store
                    .get(&Key::new(KV, "virtualmachineinstances", &p.key.0, &p.key.1))
            else {
                continue;
            };
            let wanted = sizing::Wanted::of(&vmi["spec"]);
            if wanted == *applied {
                continue;
            }
            match sizing::sync(&p.qmp, boot, wanted) {
                Ok(()) => *applied = wanted,
                Err(e) if p.running() => {
                    eprintln!("kubevm-emulator: resize of {}/{}: {e}", p.key.0, p.key.1)
                }
                Err(_) => {}
            }
        }
    }
}
