//! `snapshot restore SNAP --new-vm NEW` after the snapshot's VM and its user-data Secret were
//! deleted (both flavors). NEW's identity is made from the user data the snapshot holds, or
//! the restore is refused with nothing made; it never boots with the source's identity.
//! Deckhouse keeps the provisioning Secret in the snapshot (deckhouse/virtualization
//! `service/restorer/secret_restorer.go` `setProvisioning`); a KubeVirt snapshot keeps the VM
//! spec (content `spec.source.virtualMachine`), which only names the Secret.

use serde_json::Value;

use crate::clone::{cloudinit_secret, keygen_list, platform_identity, ssh_with_cert};
use crate::common::{Env, fails, ok, stderr};
use crate::lifecycle::eventually;

const DH: &str = "virtualization.deckhouse.io";

fn names(env: &Env, group: &str, plural: &str) -> Vec<String> {
    env.emulator
        .objects(group, plural, Some("default"))
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}

/// `web` made by `create` (through the signer), snapshotted as `s1`, then deleted with its
/// Secret (owned by it). Returns web's host key as `ssh-keygen -L` prints it.
fn web_snapshotted_and_deleted(env: &Env, vms: (&str, &str)) -> String {
    // The KubeVirt fixture has a VM `web` of its own (not made by `create`).
    if names(env, vms.0, vms.1).contains(&"web".to_owned()) {
        ok(env.kubectl(&["delete", &format!("{}.{}", vms.1, vms.0), "web", "--wait"]));
    }
    crate::ssh::vm_with_ca(env, "web", &[]);
    let (text, _) = cloudinit_secret(env, "web-cloudinit");
    let (principals, cert) = platform_identity(&text);
    assert_eq!(principals, ["kubevm@web.default"]);
    let (web_key, _, _) = keygen_list(env, &cert);
    ok(env.vm(&["stop", "web", "--wait"]));
    ok(env.vm(&["snapshot", "create", "web", "s1"]));
    ok(env.vm(&["ssh-cert", "web.default.vm"]));
    ok(env.vm(&["delete", "web", "--yes", "--wait"]));
    eventually("web and its Secret are gone", || {
        !names(env, vms.0, vms.1).contains(&"web".to_owned())
            && !names(env, "", "secrets").contains(&"web-cloudinit".to_owned())
    });
    web_key
}

/// Deckhouse: the restorer makes `web2-cloudinit` from the copy the snapshot keeps; it used
/// to hold web's principals, host key and host certificate (the user data was read from the
/// deleted Secret, so nothing was regenerated). Now web2's own.
#[test]
fn deckhouse_restore_as_a_new_vm_of_a_deleted_vm_has_its_own_identity() {
    let env = Env::deckhouse();
    let _signer = crate::signer::start_signer(&env, &[]);
    let web_key = web_snapshotted_and_deleted(&env, (DH, "virtualmachines"));

    let out = env.vm(&["snapshot", "restore", "s1", "--new-vm", "web2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (text, secret) = cloudinit_secret(&env, "web2-cloudinit");
    assert!(!text.contains("web.default"), "{text}");
    let (principals, cert) = platform_identity(&text);
    assert_eq!(principals, ["kubevm@web2.default"]);
    let (key, cert_principals, listed) = keygen_list(&env, &cert);
    assert_ne!(key, web_key, "{listed}");
    assert_eq!(
        cert_principals,
        kubevm::ca::host_principals("web2", "default"),
        "{listed}"
    );
    let web2: Value = env
        .emulator
        .objects(DH, "virtualmachines", Some("default"))
        .into_iter()
        .find(|o| o["metadata"]["name"] == "web2")
        .expect("web2");
    assert_eq!(
        web2["spec"]["provisioning"]["userDataRef"]["name"],
        "web2-cloudinit"
    );
    assert!(
        secret["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["uid"] == web2["metadata"]["uid"]),
        "{secret}"
    );
    // What the guest presents: web2 runs (web's runPolicy), its sshd refuses web's user
    // certificate and takes web2's (the built-in ssh checks the host certificate for web2).
    eventually("web2 runs", || {
        env.emulator
            .objects(DH, "virtualmachines", Some("default"))
            .iter()
            .any(|o| o["metadata"]["name"] == "web2" && o["status"]["phase"] == "Running")
    });
    let web_cert = env
        .dir
        .path()
        .join(".kube/kubectl-vm/ssh/certs/kubevm@web.default.vm-cert.pub");
    let out = ssh_with_cert(&env, "web2", &web_cert);
    assert_eq!(out.status.code(), Some(255), "{}", stderr(&out));
    let out = env.vm(&["ssh", "web2", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// KubeVirt: the snapshot names `web-cloudinit`, which is gone; the restore used to make
/// web2 anyway (naming the missing Secret, no identity of its own). Now it is refused in one
/// line and nothing is made.
#[test]
fn kubevirt_restore_as_a_new_vm_of_a_deleted_vm_is_refused_without_its_user_data() {
    let env = Env::kubevirt();
    let _signer = crate::signer::start_signer(&env, &[]);
    web_snapshotted_and_deleted(&env, ("kubevirt.io", "virtualmachines"));

    let err = fails(&env, &["snapshot", "restore", "s1", "--new-vm", "web2"], 1);
    assert!(
        err.contains("web2 cannot get its own SSH identity")
            && err.contains("\"web-cloudinit\"")
            && err.contains("nothing was created"),
        "{err}"
    );
    assert!(!names(&env, "kubevirt.io", "virtualmachines").contains(&"web2".to_owned()));
    assert!(names(&env, "snapshot.kubevirt.io", "virtualmachinerestores").is_empty());
    assert!(!names(&env, "", "secrets").contains(&"web2-cloudinit".to_owned()));
}

/// Deckhouse, a snapshot that does not keep the provisioning Secret (its `provisioner` key
/// removed, as a snapshot taken without it) of a deleted VM: refused in one line, nothing made.
#[test]
fn deckhouse_restore_as_a_new_vm_without_any_user_data_is_refused() {
    let env = Env::deckhouse();
    let _signer = crate::signer::start_signer(&env, &[]);
    web_snapshotted_and_deleted(&env, (DH, "virtualmachines"));
    let snap = env
        .emulator
        .objects(DH, "virtualmachinesnapshots", Some("default"))
        .into_iter()
        .find(|o| o["metadata"]["name"] == "s1")
        .expect("s1");
    let kept = snap["status"]["virtualMachineSnapshotSecretName"]
        .as_str()
        .unwrap()
        .to_owned();
    ok(env.kubectl(&[
        "patch",
        "secret",
        &kept,
        "--type",
        "json",
        "-p",
        r#"[{"op": "remove", "path": "/data/provisioner"}]"#,
    ]));

    let err = fails(&env, &["snapshot", "restore", "s1", "--new-vm", "web2"], 1);
    assert!(
        err.contains("web2 cannot get its own SSH identity")
            && err.contains("\"web-cloudinit\"")
            && err.contains("nothing was created"),
        "{err}"
    );
    assert!(names(&env, DH, "virtualmachinesnapshotoperations").is_empty());
    assert!(!names(&env, DH, "virtualmachines").contains(&"web2".to_owned()));
    assert!(
        !names(&env, DH, "virtualdisks")
            .iter()
            .any(|d| d.starts_with("web2"))
    );
    assert!(!names(&env, "", "secrets").contains(&"web2-cloudinit".to_owned()));
}
