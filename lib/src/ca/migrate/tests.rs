use super::*;
use crate::create::fixtures;

/// What `create` writes now for `plan`, and that text as a `create` from before VM-scoped trust
/// wrote it (commit 23389dc^, `boot_script`): no principals directory, no
/// `AuthorizedPrincipalsFile`.
fn now_and_before(plan: &crate::create::plan::VmPlan) -> (String, String) {
    plan.validate().unwrap();
    let now = crate::create::cloudinit::build(plan).unwrap().unwrap().text;
    let mut before = String::new();
    let mut skipping = false;
    for line in now.split_inclusive('\n') {
        let t = line.trim();
        if t == format!("rm -rf {PRINCIPALS_DIR}") {
            skipping = true;
        }
        if skipping && t.starts_with("cat > /etc/ssh/kubevm_ssh_host")
            || t.starts_with("cat > /etc/ssh/sshd_config.d")
        {
            skipping = false;
        }
        if skipping || t.starts_with("AuthorizedPrincipalsFile ") {
            continue;
        }
        before.push_str(line);
    }
    assert_ne!(before, now);
    assert!(!before.contains(PRINCIPALS_DIR), "{before}");
    (now, before)
}

#[test]
fn a_legacy_cloud_config_becomes_what_create_writes_now() {
    for flavor in [Flavor::KubeVirt, Flavor::Deckhouse] {
        let mut plan = fixtures::plan(flavor, fixtures::image());
        plan.name = "db-primary".into();
        plan.namespace = "prod".into();
        plan.guest.user = Some("ops".into());
        let (now, before) = now_and_before(&plan);
        let logins = logins_of(&before);
        assert_eq!(logins, ["kubevm", "ops"]);
        let migrated = rewrite(&before, "db-primary", "prod", &logins)
            .unwrap()
            .unwrap();
        assert_eq!(migrated, now);
        // cloud-init reads one script that writes one file per login.
        let doc: yaml_serde::Value = yaml_serde::from_str(&migrated).unwrap();
        let script = doc["bootcmd"][0].as_str().unwrap();
        assert!(
            script.contains(&format!(
                "cat > {PRINCIPALS_DIR}/ops <<'KUBEVM_EOF'\nops@db-primary.prod\nKUBEVM_EOF\n"
            )),
            "{script}"
        );
        // Once migrated, nothing more to do.
        assert_eq!(rewrite(&now, "db-primary", "prod", &logins), Ok(None));
    }
}

#[test]
fn without_platform_trust_or_in_another_form_nothing_is_written() {
    assert_eq!(
        rewrite(
            "#cloud-config\nusers: [default]\n",
            "w",
            "d",
            &["kubevm".into()]
        ),
        Err(RewriteError::NoPlatformTrust)
    );
    let plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
    let (_, before) = now_and_before(&plan);
    // The drop-in edited by hand: no TrustedUserCAKeys line to add to.
    let edited = before.replace(&format!("TrustedUserCAKeys {CA_KEYS_PATH}"), "# gone");
    assert!(matches!(
        rewrite(&edited, "w", "d", &["kubevm".into()]),
        Err(RewriteError::Unexpected(_))
    ));
    assert!(matches!(
        rewrite(&before, "w", "d", &[]),
        Err(RewriteError::Unexpected(_))
    ));
}

#[test]
fn secret_references_and_ownership() {
    let kubevirt = json!({"spec": {"template": {"spec": {"volumes": [
        {"name": "root", "dataVolume": {"name": "web-root"}},
        {"name": "cloudinit", "cloudInitNoCloud": {"secretRef": {"name": "web-cloudinit"}}}]}}}});
    assert_eq!(
        user_data_secret(Flavor::KubeVirt, &kubevirt).as_deref(),
        Some("web-cloudinit")
    );
    let deckhouse = json!({"spec": {"provisioning": {"type": "UserDataRef",
        "userDataRef": {"kind": "Secret", "name": "web-cloudinit"}}}});
    assert_eq!(
        user_data_secret(Flavor::Deckhouse, &deckhouse).as_deref(),
        Some("web-cloudinit")
    );
    let other_kind =
        json!({"spec": {"provisioning": {"userDataRef": {"kind": "ConfigMap", "name": "x"}}}});
    assert_eq!(user_data_secret(Flavor::Deckhouse, &other_kind), None);

    let secret = |labelled: bool, uid: &str, controller: bool| -> Secret {
        serde_json::from_value(json!({"metadata": {"name": "web-cloudinit",
            "labels": if labelled { json!({MANAGED_BY_LABEL: MANAGED_BY}) } else { json!({}) },
            "ownerReferences": [{"apiVersion": "v1", "kind": "VirtualMachine", "name": "web",
                "uid": uid, "controller": controller}]}}))
        .unwrap()
    };
    assert!(owned_by(&secret(true, "u1", true), "u1"));
    assert!(!owned_by(&secret(false, "u1", true), "u1"));
    assert!(!owned_by(&secret(true, "u2", true), "u1"));
    assert!(!owned_by(&secret(true, "u1", false), "u1"));
}
