use super::*;

fn vm() -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "web", "namespace": "dev", "uid": "u-1"},
        "spec": {"template": {"spec": {"domain": {}}}}})
}

fn logins(l: &[&str]) -> Vec<String> {
    l.iter().map(|s| s.to_string()).collect()
}

#[test]
fn logins_are_checked_before_any_request() {
    assert!(validate_logins(&logins(&["debian", "ops-1"])).is_ok());
    for bad in [&[][..], &["Root"], &["a_b"], &["1x"], &["x-"], &["a", "a"]] {
        let e = validate_logins(&logins(bad)).unwrap_err();
        assert!(matches!(e, Error::Usage(_)), "{bad:?}: {e}");
    }
    let many: Vec<String> = (0..17).map(|i| format!("u{i}")).collect();
    assert!(validate_logins(&many).is_err());
}

#[test]
fn lines_name_one_login_on_one_vm() {
    let keys = vec![
        "ssh-ed25519 AAAA old".to_string(),
        "ssh-ed25519 BBBB new\n".into(),
    ];
    assert_eq!(
        trust_lines(&keys, "debian", "web", "dev"),
        [
            "cert-authority,principals=\"debian@web.dev\" ssh-ed25519 AAAA old",
            "cert-authority,principals=\"debian@web.dev\" ssh-ed25519 BBBB new"
        ]
    );
    assert_eq!(secret_name("web", "debian"), "web-kubevm-trust-debian");
}

#[test]
fn secret_is_owned_by_the_vm_and_recognised() {
    let s = secret_object(&vm(), "debian", &["line".into()], true);
    assert_eq!(s.metadata.name.as_deref(), Some("web-kubevm-trust-debian"));
    assert_eq!(secret_content(&s), "line\n");
    let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("VirtualMachine", "u-1")
    );
    assert!(is_ours(&s, "web", "u-1", "debian"));
    // Another VM of the same name (recreated), another login, or a stranger's Secret.
    assert!(!is_ours(&s, "web", "u-2", "debian"));
    assert!(!is_ours(&s, "web", "u-1", "root"));
    let mut foreign = s.clone();
    foreign.metadata.labels = None;
    assert!(!is_ours(&foreign, "web", "u-1", "debian"));
}

#[test]
fn vm_gets_one_entry_per_login_and_the_logins_annotation() {
    let mut v = vm();
    assert!(add_to_vm(&mut v, "debian"));
    assert!(add_to_vm(&mut v, "ops"));
    assert!(!add_to_vm(&mut v, "debian"), "idempotent");
    let creds = v["spec"]["template"]["spec"]["accessCredentials"]
        .as_array()
        .unwrap();
    assert_eq!(creds.len(), 2);
    // KubeVirt's AccessCredential (kubevirt.io/api/core/v1 types.go: SSHPublicKeyAccessCredential
    // with a Secret source and qemuGuestAgent propagation), written out.
    assert_eq!(
        creds[0],
        json!({"sshPublicKey": {
            "source": {"secret": {"secretName": "web-kubevm-trust-debian"}},
            "propagationMethod": {"qemuGuestAgent": {"users": ["debian"]}}}})
    );
    assert_eq!(
        creds[1],
        json!({"sshPublicKey": {
            "source": {"secret": {"secretName": "web-kubevm-trust-ops"}},
            "propagationMethod": {"qemuGuestAgent": {"users": ["ops"]}}}})
    );
    // The annotations the signer reads (README "SSH trust: the platform signs"), written out.
    assert_eq!(
        v["metadata"]["annotations"],
        json!({
            "ssh.kubevm.io/logins": "debian,ops",
            "ssh.kubevm.io/trust": "vm-scoped",
            "ssh.kubevm.io/default-login": "debian"
        })
    );
    assert!(remove_entry(&mut v, "debian"));
    assert!(!remove_entry(&mut v, "debian"));
    assert!(remove_login(&mut v, "debian"));
    assert_eq!(v["metadata"]["annotations"][LOGINS_ANNOTATION], "ops");
    assert!(
        v["metadata"]["annotations"]
            .get(crate::names::DEFAULT_LOGIN_ANNOTATION)
            .is_none()
    );
    assert!(remove_entry(&mut v, "ops") && remove_login(&mut v, "ops"));
    assert!(
        v["spec"]["template"]["spec"]
            .get("accessCredentials")
            .is_none()
    );
    assert!(
        v["metadata"]["annotations"]
            .get(LOGINS_ANNOTATION)
            .is_none()
    );
}

#[test]
fn existing_entries_and_trust_of_our_vms_are_kept() {
    let mut v = vm();
    v["metadata"]["labels"] = json!({MANAGED_BY_LABEL: MANAGED_BY});
    v["spec"]["template"]["spec"]["accessCredentials"] = json!([
        {"sshPublicKey": {"source": {"secret": {"secretName": "team"}},
         "propagationMethod": {"noCloud": {}}}}]);
    v["metadata"]["annotations"] = json!({LOGINS_ANNOTATION: "ops"});
    assert!(add_to_vm(&mut v, "ops"));
    // A VM made by create keeps the trust it had (no trust annotation means bare logins) and
    // its platform user as the default login.
    assert!(v["metadata"]["annotations"].get(TRUST_ANNOTATION).is_none());
    assert!(
        v["metadata"]["annotations"]
            .get(crate::names::DEFAULT_LOGIN_ANNOTATION)
            .is_none()
    );
    assert_eq!(v["metadata"]["annotations"][LOGINS_ANNOTATION], "ops");
    assert!(remove_entry(&mut v, "ops"));
    assert_eq!(
        v["spec"]["template"]["spec"]["accessCredentials"][0]["sshPublicKey"]["source"]["secret"]["secretName"],
        "team"
    );
}
