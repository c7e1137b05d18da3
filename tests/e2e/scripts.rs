//! The repository's own shell scripts.

use std::path::Path;

/// `get-kubectl.sh` must not fail when kubectl writes more than the script reads: an early
/// closing `| grep -q`/`| head` made kubectl die of SIGPIPE and the script exit 141 under
/// `pipefail` (seen in CI).
#[test]
fn get_kubectl_survives_a_chatty_kubectl() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("kubectl");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'Client Version: v1.36.3'\nseq 1 200000 | sed 's/^/Kustomize line /'\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tools/get-kubectl.sh");
    for _ in 0..5 {
        let output = std::process::Command::new("bash")
            .arg(&script)
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "exit {:?}: {}",
            output.status.code(),
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            format!("kubectl already at {}/kubectl\n", dir.path().display())
        );
    }
}
