//! Admission checks that real clusters run in webhooks or CEL rules and that clients actually
//! hit. Each check is a small function; add new ones to [`admit`].

use crate::core::registry::ResourceDef;
use crate::core::status::{ApiError, Cause};
use base64::Engine;
use serde_json::Value;

/// KubeVirt's `cloudInitUserMaxLen` (Deckhouse's CEL limit on `provisioning.userData`, the same
/// number, is evaluated from its CRD by `schema.rs`).
pub const USER_DATA_MAX: usize = 2048;

/// Runs the admission checks for an object about to be created or updated.
pub fn admit(def: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
    crate::kubevirt::webhooks::admit(def, obj)?;
    match (def.group.as_str(), def.plural.as_str()) {
        ("kubevirt.io", "virtualmachines") => {
            let volumes = obj.pointer("/spec/template/spec/volumes");
            kubevirt_user_data(
                volumes,
                "spec.template.spec.volumes",
                "virtualmachine-validator.kubevirt.io",
            )
        }
        ("kubevirt.io", "virtualmachineinstances") => kubevirt_user_data(
            obj.pointer("/spec/volumes"),
            "spec.volumes",
            "virtualmachineinstances-create-validator.kubevirt.io",
        ),
        _ => Ok(()),
    }
}

/// Inline cloud-init user data over 2048 bytes is refused by virt-api's validating webhook
/// (`vmi-create-admitter.go`); the decoded size counts for `userDataBase64`.
fn kubevirt_user_data(volumes: Option<&Value>, base: &str, webhook: &str) -> Result<(), ApiError> {
    let mut causes = vec![];
    for (i, vol) in volumes
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        for source in ["cloudInitNoCloud", "cloudInitConfigDrive"] {
            let Some(ci) = vol.get(source) else { continue };
            let field = format!("{base}[{i}].{source}");
            let len = if let Some(s) = ci.get("userData").and_then(Value::as_str) {
                s.len()
            } else if let Some(s) = ci.get("userDataBase64").and_then(Value::as_str) {
                base64::engine::general_purpose::STANDARD
                    .decode(s.trim())
                    .map(|b| b.len())
                    .unwrap_or(s.len())
            } else {
                0
            };
            if len > USER_DATA_MAX {
                causes.push(Cause {
                    reason: "FieldValueInvalid",
                    field: format!("{field}.userData"),
                    message: format!(
                        "{field}.userData userdata exceeds {USER_DATA_MAX} byte limit. Should use UserDataSecretRef for larger data."
                    ),
                });
            }
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    // A webhook denial: the API server prefixes the webhook's message.
    let joined: Vec<String> = causes.iter().map(|c| c.message.clone()).collect();
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!(
            "admission webhook \"{webhook}\" denied the request: {}",
            joined.join(", ")
        ),
    );
    e.details = Some(serde_json::json!({
        "causes": causes.iter().map(|c| serde_json::json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>()
    }));
    Err(e)
}
