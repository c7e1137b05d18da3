//! End-to-end tests: the built `kubectl-vm` binary (directly and through real kubectl's
//! plugin discovery) against the local API emulator.

mod common;

mod access;
mod ca;
mod completion;
mod create;
mod delete;
mod errors;
mod export;
mod generated;
mod get;
mod list;
mod scripts;
mod version;
