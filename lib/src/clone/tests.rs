use serde_json::json;

use super::*;

fn request(target: &str) -> CloneRequest {
    CloneRequest {
        source: VmRef {
            namespace: "default".into(),
            name: "web".into(),
        },
        target: target.into(),
        start: false,
        wait: true,
        timeout: Duration::from_secs(60),
        dry_run: DryRun::None,
    }
}

#[test]
fn bad_names_are_refused_locally() {
    assert!(matches!(request("Web_2").validate(), Err(Error::Usage(_))));
    assert!(matches!(request("web").validate(), Err(Error::Usage(_))));
    assert!(matches!(
        request(&"a".repeat(64)).validate(),
        Err(Error::Usage(_))
    ));
    let mut r = request("web2");
    r.start = true;
    r.dry_run = DryRun::Client;
    assert!(matches!(r.validate(), Err(Error::Usage(_))));
    assert!(request("web2").validate().is_ok());
}

#[test]
fn kubevirt_patches_relabel_where_the_source_is_labelled() {
    let source = json!({"metadata": {"labels": {"kubevm.io/vm": "web", "team": "a"}},
        "spec": {"template": {"metadata": {"labels": {"kubevm.io/vm": "web"}}},
            "dataVolumeTemplates": [{"metadata": {"name": "web-root", "labels": {"kubevm.io/vm": "web"}}},
                {"metadata": {"name": "other"}}]}});
    let patches: Vec<serde_json::Value> = kubevirt::label_patches(&source, "web2")
        .iter()
        .map(|p| serde_json::from_str(p).unwrap())
        .collect();
    assert_eq!(
        patches,
        vec![
            json!({"op": "add", "path": "/metadata/labels/kubevm.io~1vm", "value": "web2"}),
            json!({"op": "add", "path": "/metadata/labels/app.kubernetes.io~1managed-by", "value": "kubectl-vm"}),
            json!({"op": "replace", "path": "/spec/template/metadata/labels/kubevm.io~1vm", "value": "web2"}),
            json!({"op": "replace", "path": "/spec/dataVolumeTemplates/0/metadata/labels/kubevm.io~1vm", "value": "web2"}),
        ]
    );
    // A source without labels gets the whole map.
    let bare = kubevirt::label_patches(&json!({"metadata": {}, "spec": {}}), "web2");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&bare[0]).unwrap(),
        json!({"op": "add", "path": "/metadata/labels", "value": {"app.kubernetes.io/managed-by": "kubectl-vm", "kubevm.io/vm": "web2"}})
    );
    let object = kubevirt::clone_object(&request("web2"), &source);
    assert_eq!(object["metadata"]["name"], "clone-web2");
    assert_eq!(
        object["spec"]["source"],
        json!({"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "web"})
    );
    assert_eq!(object["spec"]["target"]["name"], "web2");
}

#[test]
fn deckhouse_renames_disks_and_secret() {
    let source = json!({"spec": {"blockDeviceRefs": [
            {"kind": "VirtualDisk", "name": "web-root"}, {"kind": "VirtualDisk", "name": "data"},
            {"kind": "ClusterVirtualImage", "name": "ubuntu"}],
        "provisioning": {"type": "UserDataRef", "userDataRef": {"kind": "Secret", "name": "web-cloudinit"}}}});
    let plan = deckhouse::plan(&request("web2"), &source);
    assert_eq!(
        plan.disks,
        vec![
            ("web-root".to_owned(), "web2-root".to_owned()),
            ("data".to_owned(), "web2-data".to_owned())
        ]
    );
    let op = &plan.operation;
    assert_eq!(op["metadata"]["name"], "clone-web2");
    assert_eq!(op["spec"]["type"], "Clone");
    assert_eq!(op["spec"]["virtualMachineName"], "web");
    assert_eq!(
        op["spec"]["clone"]["nameReplacement"],
        json!([
            {"from": {"kind": "VirtualMachine", "name": "web"}, "to": "web2"},
            {"from": {"kind": "VirtualDisk", "name": "web-root"}, "to": "web2-root"},
            {"from": {"kind": "VirtualDisk", "name": "data"}, "to": "web2-data"},
            {"from": {"kind": "Secret", "name": "web-cloudinit"}, "to": "web2-cloudinit"}
        ])
    );
}

#[test]
fn progress_reads_phases_and_failures() {
    let pending = json!({"metadata": {"name": "clone-b"}, "status": {"conditions": [
        {"type": "Progressing", "status": "False", "reason": "Pending"},
        {"type": "Ready", "status": "False", "reason": "Source doesnt exist: VirtualMachine default/a"}]}});
    assert_eq!(
        kubevirt::progress(&pending),
        (
            "Pending".into(),
            Some("Source doesnt exist: VirtualMachine default/a".into()),
            None
        )
    );
    let done = json!({"metadata": {"name": "clone-b"}, "status": {"phase": "Succeeded"}});
    assert_eq!(kubevirt::progress(&done).2, Some(Ok(())));
    let failed = json!({"metadata": {"name": "clone-b"}, "status": {"phase": "Failed",
        "conditions": [{"type": "Completed", "status": "False", "reason": "OperationFailed",
            "message": "Clone is failed: fail to validate the resources: check the status"}],
        "resources": [{"kind": "VirtualDisk", "name": "b-root", "status": "Failed",
            "message": "VirtualDisk with name b-root already exists"}]}});
    assert_eq!(
        deckhouse::progress(&failed).2,
        Some(Err("virtualmachineoperation \"clone-b\" failed: Clone is failed: fail to validate the resources: check the status (VirtualDisk with name b-root already exists)".into()))
    );
}

/// Deckhouse's CEL rule allows a `nameReplacement[].to` of 59 characters, not 60.
#[test]
fn deckhouse_name_replacements_over_59_are_refused() {
    use super::deckhouse::check_name_lengths;
    let vm59 = "v".repeat(59);
    assert!(check_name_lengths(&vm59, [("src", vm59.as_str())]).is_ok());
    let disk60 = format!("{}-root", "v".repeat(55));
    let err = check_name_lengths("x", [("src", "x"), ("src-root", disk60.as_str())])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("\"src-root\" into \"{disk60}\" (60 characters)"))
            && err.contains("at most 59"),
        "{err}"
    );
    let vm60 = "v".repeat(60);
    assert!(check_name_lengths(&vm60, [("src", vm60.as_str())]).is_err());
}
