//! A cluster that serves the platform's CRDs but not one of its aggregated APIs (KubeVirt
//! without virt-api: `subresources.kubevirt.io`; CDI without `upload.cdi.kubevirt.io`), and
//! failures after a command made something. kube-apiserver answers a path under an unserved
//! group with its end-of-chain text 404 (the emulator's `--unserve`, see its `unserved` test):
//! every command says which API is missing, never "VM not found", and leaves nothing behind.

use kubevm_emulator::FailureRule;

use crate::common::{Env, changes, find_object, stderr, stdout};

const VIRT_API: &str = "KubeVirt's API component (virt-api, APIService v1.subresources.kubevirt.io) is not installed or not ready";

#[test]
fn without_virt_api_every_subresource_command_names_it() {
    let env = Env::kubevirt_without(&["subresources.kubevirt.io"]);
    let shot = env.dir.path().join("shot.png");
    let shot = shot.to_str().unwrap();
    for args in [
        vec!["start", "web"],
        vec!["stop", "web"],
        vec!["restart", "web"],
        vec!["migrate", "web"],
        vec!["pause", "web"],
        vec!["unpause", "web"],
        vec!["soft-reboot", "web"],
        vec!["reset", "web"],
        vec!["console", "web"],
        vec!["vnc", "screenshot", "web", "-o", shot],
        vec!["guestosinfo", "web"],
        vec!["userlist", "web"],
        vec!["fslist", "web"],
        vec!["disk", "attach", "web", "pvc/shared"],
        vec!["disk", "detach", "web", "rootdisk"],
        // These listen first and dial later: refused from discovery, before listening.
        vec!["port-forward", "web", "0:22"],
        vec!["vnc", "--proxy-only", "web"],
    ] {
        let out = env.vm(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(VIRT_API), "{args:?}: {err}");
        assert!(!err.contains("not found"), "{args:?}: {err}");
    }
}

#[test]
fn deckhouse_without_its_subresource_api_names_it() {
    let env = Env::deckhouse_without(&["subresources.virtualization.deckhouse.io"]);
    for args in [
        vec!["console", "linux-vm"],
        vec!["port-forward", "linux-vm", "0:22"],
        vec!["vnc", "--proxy-only", "linux-vm"],
    ] {
        let out = env.vm(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("Deckhouse virtualization's API (virtualization-api, APIService v1alpha2.subresources.virtualization.deckhouse.io) is not installed or not ready"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("not found"), "{args:?}: {err}");
    }
}

#[test]
fn disk_attach_new_without_virt_api_makes_nothing() {
    let env = Env::kubevirt_without(&["subresources.kubevirt.io"]);
    env.emulator.clear_requests();
    let out = env.vm(&["disk", "attach", "web", "data", "--size", "1Gi"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err,
        format!(
            "Error: the server does not serve virtualmachines.subresources.kubevirt.io; {VIRT_API}\n"
        )
    );
    // Refused from discovery, before any write.
    assert_eq!(changes(&env), vec![]);
    assert!(
        find_object(
            &env,
            "cdi.kubevirt.io",
            "datavolumes",
            Some("default"),
            "data"
        )
        .is_none()
    );
}

#[test]
fn disk_attach_new_deletes_its_datavolume_when_addvolume_fails() {
    let env = Env::kubevirt();
    env.emulator.inject_failure(FailureRule {
        verb: "addvolume".into(),
        plural: "virtualmachines".into(),
        name: Some("web".into()),
        code: 500,
        message: "etcdserver: request timed out".into(),
        times: None,
    });
    let out = env.vm(&["disk", "attach", "web", "data", "--size", "1Gi"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(stdout(&out).is_empty());
    assert!(
        err.contains("datavolume/data deleted again: the attach failed"),
        "{err}"
    );
    assert!(err.contains("etcdserver: request timed out"), "{err}");
    assert!(
        find_object(
            &env,
            "cdi.kubevirt.io",
            "datavolumes",
            Some("default"),
            "data"
        )
        .is_none()
    );
    // The delete named the uid it created.
    let deletes: Vec<_> = env
        .emulator
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:#?}");
    assert!(deletes[0].path.ends_with("/datavolumes/data"));
    assert!(
        deletes[0].json().unwrap()["preconditions"]["uid"].is_string(),
        "{}",
        deletes[0].body
    );
}

#[test]
fn deckhouse_disk_attach_new_deletes_its_virtualdisk_when_the_attachment_fails() {
    let env = Env::deckhouse();
    env.emulator.inject_failure(FailureRule {
        verb: "create".into(),
        plural: "virtualmachineblockdeviceattachments".into(),
        name: None,
        code: 500,
        message: "etcdserver: request timed out".into(),
        times: None,
    });
    let out = env.vm(&["disk", "attach", "linux-vm", "data", "--size", "1Gi"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("virtualdisk/data deleted again: the attach failed"),
        "{err}"
    );
    assert!(
        find_object(
            &env,
            "virtualization.deckhouse.io",
            "virtualdisks",
            Some("default"),
            "data"
        )
        .is_none()
    );
}

#[test]
fn upload_without_cdi_upload_api_makes_nothing() {
    let env = Env::kubevirt_without(&["upload.cdi.kubevirt.io"]);
    let image = env.dir.path().join("disk.raw");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    env.emulator.clear_requests();
    let started = std::time::Instant::now();
    let out = env.vm(&[
        "upload",
        image.to_str().unwrap(),
        "dv/up",
        "--format",
        "raw",
        "--timeout",
        "60s",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.ends_with("Error: the server does not serve uploadtokenrequests.upload.cdi.kubevirt.io; CDI's upload API (cdi-apiserver, APIService v1beta1.upload.cdi.kubevirt.io) is not installed or not ready\n"),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(changes(&env), vec![]);
    assert!(
        find_object(
            &env,
            "cdi.kubevirt.io",
            "datavolumes",
            Some("default"),
            "up"
        )
        .is_none()
    );
}

#[test]
fn enroll_deletes_the_secret_it_made_when_the_vm_update_fails() {
    let env = Env::kubevirt();
    crate::common::ok(env.vm(&["ca", "init"]));
    crate::enroll::apply(&env, "plain", &crate::enroll::plain_vm("plain"));
    env.emulator.inject_failure(FailureRule {
        verb: "update".into(),
        plural: "virtualmachines".into(),
        name: Some("plain".into()),
        code: 500,
        message: "etcdserver: request timed out".into(),
        times: None,
    });
    let out = env.vm(&["enroll", "plain", "-u", "debian"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("etcdserver: request timed out"), "{err}");
    assert!(
        find_object(
            &env,
            "",
            "secrets",
            Some("default"),
            "plain-kubevm-trust-debian"
        )
        .is_none(),
        "the Secret made for the failed enroll is still there"
    );
}
