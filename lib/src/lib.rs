//! `kubevm`: the client library behind `kubectl-vm`.
//!
//! It knows how to reach a cluster the way kubectl does ([`cluster`]), which virtualization
//! platform the cluster serves ([`flavor`]), how users name virtual machines ([`target`]), and
//! how to read VMs of both platforms into one shape ([`vm`]). It has no terminal UI: the
//! `kubectl-vm` binary renders what this library returns.

pub mod ansible_inventory;
pub mod api;
pub mod ca;
pub mod clone;
pub mod cluster;
pub mod console;
pub mod create;
pub mod credentials;
pub mod debug_info;
pub mod delete;
pub mod deps;
pub mod disk;
pub mod enroll;
pub mod error;
pub mod export;
pub mod expose;
pub mod flavor;
pub mod guest_info;
pub mod http_log;
pub mod image;
pub mod lifecycle;
pub mod logs;
pub mod map_edit;
pub mod memory_dump;
pub mod names;
pub mod network;
pub mod placement;
pub mod platform;
pub mod port_forward;
pub mod quantity;
pub mod scp;
pub mod selector;
pub mod session;
pub mod set;
pub mod signer;
pub mod sizes;
pub mod snapshot;
pub mod ssh;
pub mod stream;
pub mod target;
pub mod upload;
pub mod validate;
pub mod version;
pub mod vm;
pub mod vnc;
pub mod wait;

pub use error::{Error, Result};
pub use flavor::Flavor;
