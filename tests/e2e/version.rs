//! `version`: client version always; Kubernetes and platform versions from the cluster.

use crate::common::{BIN, Env, ok};

#[test]
fn client_version_needs_no_cluster() {
    let output = std::process::Command::new(BIN)
        .args(["version", "--client"])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(
        ok(output),
        format!("Client Version: v{}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn kubevirt_server_and_platform_versions() {
    let env = Env::kubevirt();
    let text = ok(env.vm(&["version"]));
    assert!(text.contains("Server Version: v1.36.0\n"), "{text}");
    assert!(
        text.contains("Platform: KubeVirt v1.9.0 (kubevirt.io/v1)\n"),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(env.vm(&["version", "-o", "json"]))).unwrap();
    assert_eq!(json["platformVersion"], "v1.9.0");
}

#[test]
fn deckhouse_platform_is_named() {
    let env = Env::deckhouse();
    let text = ok(env.vm(&["version"]));
    assert!(
        text.contains(
            "Platform: Deckhouse virtualization (virtualization.deckhouse.io/v1alpha2)\n"
        ),
        "{text}"
    );
}
