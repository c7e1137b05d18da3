//! How many CPUs and how much memory a real guest has, and what is hot-plugged into it while
//! it runs.
//!
//! - KubeVirt: virt-launcher gives the domain `sockets × cores × threads` vCPUs
//!   (`domain.cpu`, each defaulting to 1) and the guest memory `domain.memory.guest` (else
//!   `resources.requests.memory`). Under `vmRolloutStrategy: LiveUpdate` the VMI carries
//!   `maxSockets` and `maxGuest` (`SetDefaultVirtualMachineInstance`, see
//!   `kubevirt/live_update.rs`): the domain is made with room for `maxSockets` sockets (libvirt
//!   `<vcpu current=…>`) and a virtio-mem device spanning `maxGuest − guest`, plugged empty
//!   (KubeVirt user guide, `compute/cpu_hotplug.md` and `compute/memory_hotplug.md`: memory
//!   hotplug is virtio-mem, for Linux guests from 5.8). When virt-controller hot-plugs a change
//!   into the VMI spec, virt-handler brings the domain to it: more vCPUs, and the virtio-mem
//!   device's requested size raised to `guest − guest at boot`. Here qemu gets the same
//!   machine (`-smp …,maxcpus=…`, `-m …,maxmem=…` with a `virtio-mem-pci`) and the same
//!   changes over QMP (`device_add` of the missing CPUs that `query-hotpluggable-cpus`
//!   lists, `qom-set` of `requested-size`). Fewer sockets or less memory wait for a restart
//!   upstream, so nothing is ever unplugged here.
//! - Deckhouse: `spec.cpu.cores` vCPUs and `spec.memory.size`; with the hotplug feature gates
//!   off (their default) every change waits for a restart, so the machine never grows.
//!
//! The guest onlines what is plugged (the test image's udev rules, as RHEL and Fedora ship).

use std::io;
use std::path::Path;

use serde_json::{Value, json};

use super::process::qmp;
use crate::kubevirt::live_update::{bytes, hotplug_headroom};

/// The qemu id of the virtio-mem device.
const MEMORY_DEVICE: &str = "memhp0";
/// virtio-mem's block size: plugged memory grows in steps of it.
const BLOCK_MIB: u64 = 2;
const MIB: u64 = 1 << 20;

/// The vCPUs and memory of one boot, and how far they may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Sizing {
    /// `None`: no topology in the spec, `cpus` plain vCPUs.
    pub topology: Option<Topology>,
    /// vCPUs at boot when there is no topology.
    pub cpus: u64,
    /// Memory at boot, MiB.
    pub memory_mib: u64,
    /// Memory the guest may grow to, MiB (`memory_mib` when it cannot).
    pub max_memory_mib: u64,
}

/// A CPU topology and the sockets it may grow to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Topology {
    pub sockets: u64,
    pub cores: u64,
    pub threads: u64,
    pub max_sockets: u64,
}

fn count(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_u64).unwrap_or(0)
}

/// Bytes to MiB, rounded down to virtio-mem's block.
fn mib(b: u64) -> u64 {
    b / MIB / BLOCK_MIB * BLOCK_MIB
}

impl Sizing {
    /// A KubeVirt guest from its VMI spec (`domain` …) under the cluster's configuration
    /// `config`; `default_memory_mib` and `default_cpus` when the spec names neither.
    pub fn kubevirt(
        spec: &Value,
        config: &Value,
        default_memory_mib: u64,
        default_cpus: u64,
    ) -> Sizing {
        let domain = spec.get("domain").unwrap_or(&Value::Null);
        let (headroom_sockets, headroom_guest) = hotplug_headroom(config, domain);
        let topology = domain.get("cpu").filter(|c| c.is_object()).map(|cpu| {
            let field = |f: &str| count(cpu.get(f)).max(1);
            let sockets = field("sockets");
            let max_sockets = match count(cpu.get("maxSockets")) {
                0 => headroom_sockets.unwrap_or(sockets),
                m => m,
            };
            Topology {
                sockets,
                cores: field("cores"),
                threads: field("threads"),
                max_sockets: max_sockets.max(sockets),
            }
        });
        let guest = bytes(domain.pointer("/memory/guest"))
            .or_else(|| bytes(domain.pointer("/resources/requests/memory")))
            .map(mib)
            .filter(|m| *m > 0)
            .unwrap_or(default_memory_mib);
        let max = bytes(domain.pointer("/memory/maxGuest"))
            .or(headroom_guest)
            .map(mib)
            .unwrap_or(guest);
        Sizing {
            topology,
            cpus: default_cpus,
            memory_mib: guest,
            max_memory_mib: max.max(guest),
        }
    }

    /// A Deckhouse guest from its VM spec (`cpu.cores`, `memory.size`).
    pub fn deckhouse(spec: &Value, default_memory_mib: u64, default_cpus: u64) -> Sizing {
        let memory = bytes(spec.pointer("/memory/size"))
            .map(mib)
            .filter(|m| *m > 0)
            .unwrap_or(default_memory_mib);
        Sizing {
            topology: None,
            cpus: match count(spec.pointer("/cpu/cores")) {
                0 => default_cpus,
                n => n,
            },
            memory_mib: memory,
            max_memory_mib: memory,
        }
    }

    /// vCPUs at boot.
    pub fn boot_cpus(&self) -> u64 {
        match &self.topology {
            Some(t) => t.sockets * t.cores * t.threads,
            None => self.cpus,
        }
    }

    /// `-smp` and `-m`, and the virtio-mem device when memory may grow.
    pub fn args(&self) -> Vec<String> {
        let smp = match &self.topology {
            Some(t) if t.max_sockets > t.sockets => format!(
                "cpus={},sockets={},cores={},threads={},maxcpus={}",
                self.boot_cpus(),
                t.max_sockets,
                t.cores,
                t.threads,
                t.max_sockets * t.cores * t.threads
            ),
            Some(t) => format!(
                "{},sockets={},cores={},threads={}",
                self.boot_cpus(),
                t.sockets,
                t.cores,
                t.threads
            ),
            None => self.cpus.to_string(),
        };
        let mut args = vec!["-smp".to_owned(), smp, "-m".to_owned()];
        let hotplug = self.max_memory_mib - self.memory_mib;
        if hotplug == 0 {
            args.push(format!("{}M", self.memory_mib));
            return args;
        }
        args.extend([
            format!("{}M,maxmem={}M", self.memory_mib, self.max_memory_mib),
            "-object".to_owned(),
            format!("memory-backend-ram,id={MEMORY_DEVICE}-ram,size={hotplug}M"),
            "-device".to_owned(),
            format!(
                "virtio-mem-pci,id={MEMORY_DEVICE},memdev={MEMORY_DEVICE}-ram,block-size={BLOCK_MIB}M,requested-size=0"
            ),
        ]);
        args
    }
}

/// What a running KubeVirt guest should have now: sockets and guest memory (MiB) of its VMI
/// spec, `None` where the spec says nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Wanted {
    pub sockets: Option<u64>,
    pub memory_mib: Option<u64>,
}

impl Wanted {
    /// From a VMI spec.
    pub fn of(spec: &Value) -> Wanted {
        Wanted {
            sockets: spec.pointer("/domain/cpu/sockets").and_then(Value::as_u64),
            memory_mib: bytes(spec.pointer("/domain/memory/guest")).map(mib),
        }
    }
}

/// The QMP commands that bring a guest booted as `boot` to `wanted`, given the CPUs qemu lists
/// as hot-pluggable (`query-hotpluggable-cpus`). Only growth within the machine's room.
pub(super) fn commands(boot: &Sizing, wanted: Wanted, hotpluggable: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    if let (Some(t), Some(sockets)) = (&boot.topology, wanted.sockets) {
        let sockets = sockets.min(t.max_sockets);
        let mut missing: Vec<&Value> = hotpluggable
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter(|c| c.get("qom-path").is_none())
            .filter(|c| count(c.pointer("/props/socket-id")) < sockets)
            .collect();
        missing.sort_by_key(|c| {
            ["socket-id", "core-id", "thread-id"].map(|k| count(c.pointer(&format!("/props/{k}"))))
        });
        for c in missing {
            let mut args = json!({"driver": c["type"]});
            let props = c.get("props").and_then(Value::as_object);
            for (k, v) in props.into_iter().flatten() {
                args[k] = v.clone();
            }
            let id = |k: &str| count(c.pointer(&format!("/props/{k}-id")));
            args["id"] = json!(format!(
                "cpu-s{}-c{}-t{}",
                id("socket"),
                id("core"),
                id("thread")
            ));
            out.push(json!({"execute": "device_add", "arguments": args}));
        }
    }
    if boot.max_memory_mib > boot.memory_mib
        && let Some(memory) = wanted.memory_mib
    {
        let requested = memory.clamp(boot.memory_mib, boot.max_memory_mib) - boot.memory_mib;
        out.push(json!({"execute": "qom-set", "arguments": {
            "path": format!("/machine/peripheral/{MEMORY_DEVICE}"),
            "property": "requested-size",
            "value": requested * MIB,
        }}));
    }
    out
}

/// Brings the qemu at `qmp_socket`, booted as `boot`, to `wanted`.
pub(super) fn sync(qmp_socket: &Path, boot: &Sizing, wanted: Wanted) -> io::Result<()> {
    let hotpluggable = if boot.topology.is_some() && wanted.sockets.is_some() {
        qmp(qmp_socket, &json!({"execute": "query-hotpluggable-cpus"}))?["return"].take()
    } else {
        Value::Null
    };
    for command in commands(boot, wanted, &hotpluggable) {
        qmp(qmp_socket, &command)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubevirt_guest_under_live_update_has_room_to_grow() {
        // Headroom as SetDefaultVirtualMachineInstance gives it: 4 × sockets, 4 × guest.
        let spec = json!({"domain": {"cpu": {"cores": 1}, "memory": {"guest": "1Gi"}}});
        let s = Sizing::kubevirt(&spec, &json!({}), 512, 1);
        assert_eq!(
            s.args(),
            [
                "-smp",
                "cpus=1,sockets=4,cores=1,threads=1,maxcpus=4",
                "-m",
                "1024M,maxmem=4096M",
                "-object",
                "memory-backend-ram,id=memhp0-ram,size=3072M",
                "-device",
                "virtio-mem-pci,id=memhp0,memdev=memhp0-ram,block-size=2M,requested-size=0",
            ]
        );
        // The cluster's maxGuest, and the VMI's own maxSockets.
        let spec = json!({"domain": {"cpu": {"sockets": 2, "cores": 3, "threads": 2, "maxSockets": 3},
            "memory": {"guest": "1Gi"}}});
        let config = json!({"liveUpdateConfiguration": {"maxGuest": "1536Mi"}});
        let s = Sizing::kubevirt(&spec, &config, 512, 1);
        assert_eq!(
            s.args()[1],
            "cpus=12,sockets=3,cores=3,threads=2,maxcpus=18"
        );
        assert_eq!(s.args()[3], "1024M,maxmem=1536M");
    }

    #[test]
    fn without_live_update_the_machine_is_fixed() {
        let spec =
            json!({"domain": {"cpu": {"sockets": 2, "threads": 2}, "memory": {"guest": "2Gi"}}});
        let s = Sizing::kubevirt(&spec, &json!({"vmRolloutStrategy": "Stage"}), 512, 1);
        assert_eq!(
            s.args(),
            ["-smp", "4,sockets=2,cores=1,threads=2", "-m", "2048M"]
        );
        // Requests when there is no guest memory; the defaults when the spec names nothing.
        let spec = json!({"domain": {"resources": {"requests": {"memory": "1536Mi"}}}});
        let s = Sizing::kubevirt(&spec, &json!({"vmRolloutStrategy": "Stage"}), 512, 3);
        assert_eq!(s.args(), ["-smp", "3", "-m", "1536M"]);
        let s = Sizing::kubevirt(&json!({}), &json!({"vmRolloutStrategy": "Stage"}), 512, 1);
        assert_eq!(s.args(), ["-smp", "1", "-m", "512M"]);
    }

    #[test]
    fn a_deckhouse_guest_has_its_cores_and_memory_size() {
        let spec =
            json!({"cpu": {"cores": 2, "coreFraction": "10%"}, "memory": {"size": "1536Mi"}});
        assert_eq!(
            Sizing::deckhouse(&spec, 1024, 1).args(),
            ["-smp", "2", "-m", "1536M"]
        );
    }

    #[test]
    fn growth_becomes_device_add_and_requested_size() {
        let spec = json!({"domain": {"cpu": {"cores": 1}, "memory": {"guest": "1Gi"}}});
        let boot = Sizing::kubevirt(&spec, &json!({}), 512, 1);
        // query-hotpluggable-cpus of `-smp cpus=1,sockets=4,…` (qemu lists the highest first).
        let listed = json!([
            {"type": "max-x86_64-cpu", "vcpus-count": 1, "props": {"socket-id": 3, "core-id": 0, "thread-id": 0}},
            {"type": "max-x86_64-cpu", "vcpus-count": 1, "props": {"socket-id": 2, "core-id": 0, "thread-id": 0}},
            {"type": "max-x86_64-cpu", "vcpus-count": 1, "props": {"socket-id": 1, "core-id": 0, "thread-id": 0}},
            {"type": "max-x86_64-cpu", "vcpus-count": 1, "props": {"socket-id": 0, "core-id": 0, "thread-id": 0},
             "qom-path": "/machine/unattached/device[0]"},
        ]);
        let wanted =
            Wanted::of(&json!({"domain": {"cpu": {"sockets": 2}, "memory": {"guest": "1536Mi"}}}));
        let c = commands(&boot, wanted, &listed);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(
            c[0],
            json!({"execute": "device_add", "arguments": {"driver": "max-x86_64-cpu",
                "socket-id": 1, "core-id": 0, "thread-id": 0, "id": "cpu-s1-c0-t0"}})
        );
        assert_eq!(c[1]["arguments"]["value"], 512 * MIB);
        // Nothing to do once qemu lists the socket as present; memory is asked again (idempotent).
        let unchanged = Wanted::of(&json!({"domain": {"cpu": {"sockets": 1}}}));
        assert!(commands(&boot, unchanged, &listed).is_empty());
    }
}
