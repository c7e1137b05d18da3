//! End-to-end tests: the built `kubectl-vm` binary (directly and through real kubectl's
//! plugin discovery) against the local API emulator.

mod common;

mod access;
mod ansible;
mod ca;
mod completion;
mod console;
mod create;
mod create_extras;
mod create_safety;
mod create_validation;
mod credentials;
mod debug_info;
mod delete;
mod disk;
mod disk_resize;
mod enroll;
mod errors;
mod export;
mod export_paths;
mod expose;
mod generated;
mod get;
mod guest_info;
mod kubectl_like;
mod lifecycle;
mod lifecycle_deckhouse;
mod list;
mod list_watch;
mod pools;
mod real_guest;
mod real_guest_enroll;
mod real_guest_extras;
mod scripts;
mod server_errors;
mod signer;
mod ssh;
mod ssh_tools;
mod upload;
mod upload_deckhouse;
mod upload_interrupt;
mod version;
mod vnc;
