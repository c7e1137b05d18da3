//! The committed man pages and completion scripts must match what the binary generates.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::{BIN, ok};

fn files_under(root: &Path, sub: &str) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let dir = root.join(sub);
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        files.insert(
            path.strip_prefix(root).unwrap().to_owned(),
            std::fs::read(&path).unwrap(),
        );
    }
    files
}

#[test]
fn committed_man_pages_and_completions_are_current() {
    let out = tempfile::tempdir().unwrap();
    ok(std::process::Command::new(BIN)
        .args(["generate-docs"])
        .arg(out.path())
        .output()
        .unwrap());
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for sub in ["man", "completions"] {
        let fresh = files_under(out.path(), sub);
        let committed = files_under(&repo, sub);
        let fresh_names: Vec<_> = fresh.keys().collect();
        let committed_names: Vec<_> = committed.keys().collect();
        assert_eq!(
            committed_names, fresh_names,
            "{sub}/ is stale: run `cargo run -p kubectl-vm -- generate-docs .` and commit"
        );
        for (name, content) in &fresh {
            assert!(
                committed[name] == *content,
                "{} is stale: run `cargo run -p kubectl-vm -- generate-docs .` and commit",
                name.display()
            );
        }
    }
}

#[test]
fn every_visible_command_has_a_man_page() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for command in [
        "list",
        "get",
        "version",
        "completion",
        "completion-bash",
        "completion-install",
    ] {
        let page = repo.join(format!("man/kubectl-vm-{command}.1"));
        assert!(page.exists(), "missing {}", page.display());
    }
    let root = std::fs::read_to_string(repo.join("man/kubectl-vm.1")).unwrap();
    assert!(
        root.contains("kubectl vm"),
        "usage is shown as `kubectl vm`"
    );
}
