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

/// The visible commands below `path`, as the binary's own `--help` lists them (the command
/// tree a user sees), each as the path of names from the root.
fn visible_commands(path: &[String]) -> Vec<Vec<String>> {
    let help = ok(std::process::Command::new(BIN)
        .args(path)
        .arg("--help")
        .output()
        .unwrap());
    let mut found = Vec::new();
    // Commands are listed under `Commands:` in a subcommand's help and under task headings
    // (`Basic commands:`, `Lifecycle:`, ...) in the root's; argument and option sections
    // are not commands.
    let mut in_commands = false;
    for line in help.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            let heading = line.to_ascii_lowercase();
            in_commands = heading == "commands:"
                || (path.is_empty()
                    && !heading.contains("options")
                    && !heading.starts_with("arguments")
                    && !heading.starts_with("examples"));
            continue;
        }
        if !in_commands || line.trim().is_empty() {
            continue;
        }
        // A command's line is indented two spaces; a wrapped description line more.
        if line.starts_with("   ") {
            continue;
        }
        let name = line.split_whitespace().next().unwrap().to_owned();
        if name == "help" {
            continue;
        }
        let mut sub = path.to_vec();
        sub.push(name);
        found.extend(visible_commands(&sub));
        found.push(sub);
    }
    found
}

#[test]
fn every_visible_command_has_a_man_page() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let commands = visible_commands(&[]);
    // The tree really was walked: top-level commands and nested ones alike.
    for must in [
        &["create"][..],
        &["delete"],
        &["ca", "rotate"],
        &["completion", "bash"],
    ] {
        assert!(
            commands.iter().any(|c| c == must),
            "{must:?} not in {commands:?}"
        );
    }
    let mut expected: Vec<String> = commands
        .iter()
        .map(|c| format!("kubectl-vm-{}.1", c.join("-")))
        .collect();
    expected.push("kubectl-vm.1".into());
    expected.sort();
    let mut pages: Vec<String> = std::fs::read_dir(repo.join("man"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    assert_eq!(
        pages, expected,
        "one man page per visible command, no others"
    );
    let root = std::fs::read_to_string(repo.join("man/kubectl-vm.1")).unwrap();
    assert!(
        root.contains("kubectl vm"),
        "usage is shown as `kubectl vm`"
    );
}
