use super::*;
use crate::ca::{CaBundle, DEFAULT_HOST_CERT_VALIDITY};
use crate::create::cloudinit;
use crate::create::fixtures;

/// The user data `create` makes for `web` in `default` (with a host key), with `user` data.
fn source_text(user: Option<&str>) -> String {
    let mut plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    plan.guest.user = Some("alice".into());
    plan.guest.user_data = user.map(str::to_owned);
    cloudinit::build(&plan).unwrap().unwrap().text
}

fn new_host() -> HostKeys {
    let ca = CaBundle::generate().unwrap();
    HostKeys::issue(&ca, "web2", "default", DEFAULT_HOST_CERT_VALIDITY).unwrap()
}

fn doc(text: &str) -> Yaml {
    yaml_serde::from_str(text).unwrap()
}

#[test]
fn the_platform_part_names_the_new_vm_and_carries_the_new_host_key() {
    let user = "#cloud-config\nwrite_files:\n- path: /etc/motd\n  content: hello from the user\nruncmd:\n- echo user-step\n";
    let source = source_text(Some(user));
    let old = fixtures::host_keys();
    assert!(source.contains("kubevm@web.default") && source.contains(&old.certificate));
    let host = new_host();
    let text = reissue(&source, "web", "web2", "default", Some(&host))
        .unwrap()
        .unwrap();
    // Nothing of the source's identity survives.
    for gone in [
        "web.default",
        old.public_key.as_str(),
        old.certificate.as_str(),
    ] {
        assert!(!text.contains(gone), "{gone:?} survived:\n{text}");
    }
    let old_private_tail = old.private_key.lines().rev().nth(1).unwrap();
    assert!(!text.contains(old_private_tail));
    let d = doc(&text);
    assert_eq!(
        d["ssh_keys"]["ed25519_public"].as_str(),
        Some(host.public_key.as_str())
    );
    assert_eq!(
        d["ssh_keys"]["ed25519_private"].as_str(),
        Some(host.private_key.as_str())
    );
    let script = d["bootcmd"][0].as_str().unwrap();
    for login in ["kubevm", "alice"] {
        assert!(
            script.contains(&format!(
                "cat > {PRINCIPALS_DIR}/{login} <<'KUBEVM_EOF'\n{login}@web2.default\nKUBEVM_EOF\n"
            )),
            "{script}"
        );
    }
    assert!(script.contains(&format!(
        "cat > {HOST_CERT_PATH} <<'KUBEVM_EOF'\n{}\nKUBEVM_EOF\n",
        host.certificate
    )));
    assert_eq!(script.matches("HostCertificate ").count(), 1, "{script}");
    // The user's part is carried over; the rest of the platform part too.
    assert_eq!(d["write_files"], doc(user)["write_files"]);
    assert_eq!(
        d["runcmd"].as_sequence().unwrap().last(),
        doc(user)["runcmd"].get(0)
    );
    let source_doc = doc(&source);
    assert_eq!(d["users"], source_doc["users"]);
    assert_eq!(
        script
            .replace("web2.default", "web.default")
            .replace(&host.certificate, &old.certificate),
        source_doc["bootcmd"][0].as_str().unwrap()
    );
}

#[test]
fn without_a_certificate_the_host_key_is_left_to_the_guest() {
    let source = source_text(None);
    let text = reissue(&source, "web", "web2", "default", None)
        .unwrap()
        .unwrap();
    let d = doc(&text);
    assert!(d.get("ssh_keys").is_none(), "{text}");
    let script = d["bootcmd"][0].as_str().unwrap();
    assert!(!script.contains(HOST_CERT_PATH), "{script}");
    assert!(script.contains("kubevm@web2.default") && !script.contains("web.default"));
    // And a certificate is added where the source had none.
    let host = new_host();
    let again = reissue(&text, "web2", "web3", "default", Some(&host))
        .unwrap()
        .unwrap();
    let script = doc(&again)["bootcmd"][0].as_str().unwrap().to_owned();
    let cert_at = script.find(&host.certificate).unwrap();
    let drop_in_at = script.find(&format!("cat > {SSHD_DROP_IN_PATH}")).unwrap();
    assert!(cert_at < drop_in_at, "{script}");
    assert!(
        script.contains(&format!("HostCertificate {HOST_CERT_PATH}\nKUBEVM_EOF")),
        "{script}"
    );
}

#[test]
fn a_multipart_keeps_the_user_part_byte_for_byte() {
    let user = "#!/bin/sh\necho kubevm@web.default is the user's own text\n";
    let source = source_text(Some(user));
    assert!(
        source.starts_with("Content-Type: multipart/mixed"),
        "{source}"
    );
    let host = new_host();
    let text = reissue(&source, "web", "web2", "default", Some(&host))
        .unwrap()
        .unwrap();
    assert!(text.contains(user), "{text}");
    let boundary_end = "--==KUBEVM_BOUNDARY==--\n";
    assert!(text.ends_with(boundary_end), "{text}");
    let platform = text.split(PLATFORM_PART).nth(1).unwrap();
    assert!(!platform.contains("web.default") && platform.contains("kubevm@web2.default"));
    assert!(platform.contains(&host.public_key));
}

#[test]
fn user_data_without_the_platform_part_is_not_ours() {
    assert_eq!(
        reissue("#cloud-config\nruncmd: [true]\n", "web", "web2", "ns", None),
        Ok(None)
    );
}

#[test]
fn the_volume_patch_keeps_network_data() {
    let vm = json!({"spec": {"template": {"spec": {"volumes": [{"name": "rootdisk"},
        {"name": "cloudinitdisk", "cloudInitNoCloud": {"userData": "#cloud-config\n", "networkData": "n"}}]}}}});
    let patch: Value =
        serde_json::from_str(&kubevirt_volume_patch(&vm, 1, "web2-cloudinit", false).unwrap())
            .unwrap();
    assert_eq!(
        patch,
        json!({"op": "replace", "path": "/spec/template/spec/volumes/1/cloudInitNoCloud",
            "value": {"networkData": "n", "secretRef": {"name": "web2-cloudinit"}}})
    );
    // The copy's own network data goes with its user data.
    let patch: Value =
        serde_json::from_str(&kubevirt_volume_patch(&vm, 1, "web2-cloudinit", true).unwrap())
            .unwrap();
    assert_eq!(
        patch["value"],
        json!({"secretRef": {"name": "web2-cloudinit"}, "networkDataSecretRef": {"name": "web2-cloudinit"}})
    );
}
