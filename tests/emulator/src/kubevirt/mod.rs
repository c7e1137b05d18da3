//! KubeVirt's and CDI's own behaviour: VM snapshots and restores, clones, volume exports, CDI
//! uploads, hotplug, live updates, memory dumps, evacuation, virt-api's webhooks and mutator.
//! The export server and the clone controller also serve Deckhouse's DataExport and
//! VirtualMachineOperation `Clone`, which reuse the same machinery.

pub mod clone;
pub mod clone_auth;
pub mod console_log;
pub mod evacuation;
pub mod export;
pub mod export_pods;
pub mod export_server;
pub mod export_snapshot;
pub mod guestagent;
pub mod hotplug;
pub mod infer;
pub mod live_update;
pub mod memory_core;
pub mod memory_dump;
pub mod network;
pub mod objectgraph;
pub mod placement;
pub mod sshd_agent;
pub mod upload;
pub mod upload_server;
pub mod vm_snapshot;
pub mod webhooks;
