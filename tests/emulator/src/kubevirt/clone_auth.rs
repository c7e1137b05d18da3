//! Cross-namespace clone authorization, as CDI and KubeVirt check it before a clone is made:
//! a DataVolume (or a VM's `dataVolumeTemplates` entry) whose `spec.source.pvc` or
//! `spec.sourceRef` (a DataSource) lies in another namespace needs the requesting user to be
//! allowed `create` on `datavolumes/source` (group `cdi.kubevirt.io`) in the source namespace
//! (CDI `staging/src/kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1/
//! authorize.go`, the explicit SubjectAccessReview). Otherwise:
//! - `datavolume-validate.cdi.kubevirt.io` denies the DataVolume (CDI
//!   `pkg/apiserver/webhooks/datavolume-validate.go`): "User U has insufficient permissions in
//!   clone source namespace NS";
//! - `virtualmachine-validator.kubevirt.io` denies the VM (KubeVirt
//!   `pkg/virt-api/webhooks/validating-webhook/admitters/vms-admitter.go`
//!   `authorizeVirtualMachineSpec`): "Authorization failed, message is: User U has …".
//!
//! A DataSource's own namespace is the default of `sourceRef.namespace`; what the DataSource
//! points at is resolved to its PVC's namespace.

use crate::core::app::App;
use crate::core::auth::{Attributes, User, authorize};
use crate::core::registry::ResourceDef;
use crate::core::status::ApiError;
use crate::core::store::Key;
use serde_json::{Value, json};

/// The namespace a DataVolume spec clones from, when it clones.
fn clone_source_namespace(app: &App, spec: &Value, ns: &str) -> Option<String> {
    if let Some(pvc) = spec.pointer("/source/pvc") {
        return Some(pvc["namespace"].as_str().unwrap_or(ns).to_owned());
    }
    let r = spec.get("sourceRef")?;
    if r["kind"] != "DataSource" {
        return None;
    }
    let ds_ns = r["namespace"].as_str().unwrap_or(ns);
    let ds = app.store.get(&Key::new(
        "cdi.kubevirt.io",
        "datasources",
        ds_ns,
        r["name"].as_str().unwrap_or(""),
    ));
    let target = ds
        .as_ref()
        .and_then(|d| d.pointer("/spec/source/pvc/namespace"))
        .and_then(Value::as_str)
        .unwrap_or(ds_ns);
    Some(target.to_owned())
}

fn denial(webhook: &str, message: String) -> ApiError {
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!("admission webhook \"{webhook}\" denied the request: {message}"),
    );
    e.details = Some(json!({"causes": []}));
    e
}

/// Checks the clone permission of `user` creating `obj` in namespace `ns`.
pub fn check(
    app: &App,
    user: &User,
    def: &ResourceDef,
    obj: &Value,
    ns: &str,
) -> Result<(), ApiError> {
    let (specs, vm): (Vec<&Value>, bool) = match (def.group.as_str(), def.plural.as_str()) {
        ("cdi.kubevirt.io", "datavolumes") => (obj.get("spec").into_iter().collect(), false),
        ("kubevirt.io", "virtualmachines") => (
            obj.pointer("/spec/dataVolumeTemplates")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|t| t.get("spec"))
                .collect(),
            true,
        ),
        _ => return Ok(()),
    };
    for spec in specs {
        let Some(source_ns) = clone_source_namespace(app, spec, ns) else {
            continue;
        };
        if source_ns == ns {
            continue;
        }
        let attrs = Attributes {
            verb: "create".into(),
            group: "cdi.kubevirt.io".into(),
            resource: "datavolumes".into(),
            subresource: "source".into(),
            namespace: source_ns.clone(),
            name: String::new(),
        };
        if authorize(&app.store, user, &attrs).is_err() {
            let message = format!(
                "User {} has insufficient permissions in clone source namespace {source_ns}",
                user.name
            );
            return Err(if vm {
                denial(
                    "virtualmachine-validator.kubevirt.io",
                    format!("Authorization failed, message is: {message}"),
                )
            } else {
                // CDI prefixes each cause with a space (see webhooks.rs).
                denial("datavolume-validate.cdi.kubevirt.io", format!(" {message}"))
            });
        }
    }
    Ok(())
}
