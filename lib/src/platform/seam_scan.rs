//! The seam's rule as a test: no `== Flavor::`, `!= Flavor::` or `matches!(… Flavor::` outside
//! `lib/src/platform/` (and test code), in lib and cmd alike. Such a comparison gives a new
//! platform whichever branch its `else` falls to; ask the platform's table instead. And cmd
//! names no platform at all: it parses flags, asks lib and renders, so every per-platform
//! list, message and check it needs comes from lib.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Whether `line` compares a flavor with a literal variant (`Flavor::X` or a path ending in
/// it, such as `kubevm::flavor::Flavor::X`, beside `==`/`!=`, or inside `matches!`).
fn compares_flavor(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    if code.contains("matches!(") && code.contains("Flavor::") {
        return true;
    }
    let path_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    code.match_indices("Flavor::").any(|(at, _)| {
        let before = code[..at].trim_end_matches(path_char).trim_end();
        let after = code[at..].trim_start_matches(path_char).trim_start();
        ["==", "!="]
            .iter()
            .any(|op| before.ends_with(op) || after.starts_with(op))
    })
}

/// The offending lines of one file, test modules (from `#[cfg(test)]` on) left out.
fn offenders(root: &Path, file: &Path) -> Vec<String> {
    let rel = file
        .strip_prefix(root)
        .expect("under the root")
        .to_string_lossy()
        .replace('\\', "/");
    let text = std::fs::read_to_string(file).expect("read source");
    let production = text.split("#[cfg(test)]").next().unwrap_or("");
    production
        .lines()
        .filter(|l| compares_flavor(l))
        .map(|l| format!("{rel}:{}", l.trim()))
        .collect()
}

#[test]
fn no_flavor_comparisons_outside_the_seam() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![];
    for dir in ["lib/src", "cmd/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(
        files.len() > 100,
        "the scan found only {} files",
        files.len()
    );
    let seam = root.join("lib/src/platform");
    let found: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(&seam))
        .filter(|f| {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name != "tests.rs" && !name.ends_with("_tests.rs")
        })
        .flat_map(|f| offenders(&root, f))
        .collect();
    assert!(
        found.is_empty(),
        "flavor compared outside lib/src/platform (ask platform::of(flavor) instead):\n{}",
        found.join("\n")
    );
}

/// Whether `line`'s code (not its comment) names a platform variant.
fn names_a_platform(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    ["Flavor::KubeVirt", "Flavor::Deckhouse"]
        .iter()
        .any(|v| code.contains(v))
}

#[test]
fn cmd_names_no_platform() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![];
    rust_files(&root.join("cmd/src"), &mut files);
    assert!(
        files.len() > 40,
        "the scan found only {} files",
        files.len()
    );
    let found: Vec<String> = files
        .iter()
        .filter(|f| {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name != "tests.rs" && !name.ends_with("_tests.rs")
        })
        .flat_map(|f| {
            let rel = f
                .strip_prefix(&root)
                .expect("under the root")
                .display()
                .to_string();
            let text = std::fs::read_to_string(f).expect("read source");
            let production = text.split("#[cfg(test)]").next().unwrap_or("").to_owned();
            production
                .lines()
                .filter(|l| names_a_platform(l))
                .map(|l| format!("{rel}:{}", l.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        found.is_empty(),
        "cmd names a platform (put the per-platform knowledge in lib's platform tables or the command's lib module):\n{}",
        found.join("\n")
    );
    assert!(names_a_platform(
        "kubevm::flavor::Flavor::Deckhouse => \"vmop\","
    ));
    assert!(!names_a_platform(
        "FlavorChoice::Fixed(f) => f, // Flavor::KubeVirt"
    ));
}

#[test]
fn the_scan_sees_each_form() {
    assert!(compares_flavor("if flavor == Flavor::Deckhouse {"));
    assert!(compares_flavor("x != Flavor::KubeVirt"));
    assert!(compares_flavor("Flavor::KubeVirt == f"));
    assert!(compares_flavor("matches!(f, Flavor::Deckhouse)"));
    assert!(compares_flavor(
        "} else if x && platform.flavor == kubevm::flavor::Flavor::KubeVirt {"
    ));
    assert!(compares_flavor("if flavor==Flavor::KubeVirt {"));
    assert!(!compares_flavor(
        "match flavor { Flavor::KubeVirt => a, Flavor::Deckhouse => b }"
    ));
    assert!(!compares_flavor(
        "// flavor == Flavor::Deckhouse in a comment"
    ));
}
