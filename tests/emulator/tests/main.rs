//! The emulator's integration tests, one test binary (one link of the emulator and its
//! dependencies instead of one per file; each file is a module). Run one file's tests with
//! `cargo test -p kubevm-emulator --test integration FILE::`.

mod common;

mod access_credentials;
mod aggregation;
mod cel_rules;
mod console_log;
mod crd_defaults;
mod debug_subresources;
mod deckhouse_upload;
mod delete_preconditions;
mod dh_snapshot_storage;
mod export;
mod faithful;
mod fixtures;
mod http_import;
mod images;
mod import_cron;
mod infer;
mod kube_client;
mod kubectl;
mod live_update;
mod migrations;
mod missing_namespace;
mod objectgraph;
mod paging;
mod pod_portforward;
mod portforward;
mod qemu_guest;
mod resize;
mod sdn_networks;
mod server_side_apply;
mod storage;
mod streams;
mod subresource_rbac;
mod unserved;
mod upload;

/// Every `tests/*.rs` is a module here: a file left out would never be compiled or run.
#[test]
fn every_test_file_is_a_module() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let main = std::fs::read_to_string(dir.join("main.rs")).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if let Some(module) = name.strip_suffix(".rs").filter(|m| *m != "main") {
            assert!(
                main.lines().any(|l| l == format!("mod {module};")),
                "tests/{name} is not declared in tests/main.rs"
            );
        }
    }
}
