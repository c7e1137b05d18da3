//! Deckhouse-only behaviour: VM snapshots, restores and snapshot operations, uploads through
//! the uploader pods, and the internal KubeVirt kinds the virtualization controller drives.

pub mod internal_kinds;
pub mod snapshot;
pub mod snapshot_op;
pub mod upload;
