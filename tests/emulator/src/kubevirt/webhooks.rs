//! Validating webhooks of KubeVirt and CDI that a client can trip, with their messages:
//! - `virtualmachine-validator.kubevirt.io` (pkg/virt-api/webhooks/validating-webhook/admitters/
//!   vms-admitter.go `validateRunStrategy`): `running` together with `runStrategy`;
//! - the same and `virtualmachineinstances-create-validator.kubevirt.io` (vmi-create-admitter.go
//!   `validateDisks`/`nameOfTypeNotFoundMessagePattern`): a disk without a volume of its name;
//! - `datavolume-validate.cdi.kubevirt.io` (CDI pkg/apiserver/webhooks/datavolume-validate.go
//!   `validateDataVolumeResourceSize`): a storage request of 0.
//!
//! KubeVirt joins the causes' messages with ", " (webhookutils.ToAdmissionResponse); CDI
//! prefixes each with a space (`fmt.Sprintf("%s %s", globalMessage, cause.Message)`), hence
//! its double space after "denied the request:". Both answer 422 Invalid with the causes.

use crate::core::registry::ResourceDef;
use crate::core::status::{ApiError, Cause};
use serde_json::{Value, json};

fn denial(webhook: &str, message: String, causes: &[Cause]) -> ApiError {
    // k8s.io/apiserver/pkg/admission/plugin/webhook/errors/statuserror.go ToStatusErr.
    let mut e = ApiError::new(
        422,
        "Invalid",
        format!("admission webhook \"{webhook}\" denied the request: {message}"),
    );
    e.details = Some(json!({
        "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>()
    }));
    e
}

fn kubevirt(webhook: &str, causes: Vec<Cause>) -> Result<(), ApiError> {
    if causes.is_empty() {
        return Ok(());
    }
    let joined: Vec<&str> = causes.iter().map(|c| c.message.as_str()).collect();
    Err(denial(webhook, joined.join(", "), &causes))
}

/// Disks whose name no volume has (CD-ROMs may be empty only with declarative hotplug, which
/// is off by default, so they count too).
fn disks_without_volume(spec: &Value, base: &str) -> Vec<Cause> {
    let volumes: Vec<&str> = spec
        .pointer("/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .collect();
    spec.pointer("/domain/devices/disks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, disk)| {
            let name = disk.get("name").and_then(Value::as_str).unwrap_or("");
            (!volumes.contains(&name)).then(|| Cause {
                reason: "FieldValueInvalid",
                field: format!("{base}.domain.devices.disks[{i}].name"),
                message: format!("{base}.domain.devices.disks[{i}].Name '{name}' not found."),
            })
        })
        .collect()
}

/// Whether a quantity is zero or negative (`0`, `0Gi`, `-1`, `0.0`).
fn not_positive(quantity: &Value) -> bool {
    let text = match quantity {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return false,
    };
    let number: String = text
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+'))
        .collect();
    number.parse::<f64>().is_ok_and(|n| n <= 0.0)
}

/// Runs the webhooks that concern `def` on an object about to be written.
pub fn admit(def: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
    match (def.group.as_str(), def.plural.as_str()) {
        ("kubevirt.io", "virtualmachines") => {
            let mut causes = Vec::new();
            let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
            if spec.get("running").is_some_and(|r| !r.is_null())
                && spec.get("runStrategy").is_some_and(|r| !r.is_null())
            {
                causes.push(Cause {
                    reason: "FieldValueInvalid",
                    field: "spec.running".into(),
                    message: "Running and RunStrategy are mutually exclusive. Note that Running is deprecated, please use RunStrategy instead".into(),
                });
            }
            if let Some(template) = spec.pointer("/template/spec") {
                causes.extend(disks_without_volume(template, "spec.template.spec"));
            }
            kubevirt("virtualmachine-validator.kubevirt.io", causes)
        }
        ("kubevirt.io", "virtualmachineinstances") => kubevirt(
            "virtualmachineinstances-create-validator.kubevirt.io",
            obj.get("spec")
                .map(|s| disks_without_volume(s, "spec"))
                .unwrap_or_default(),
        ),
        ("cdi.kubevirt.io", "datavolumes") => {
            for name in ["pvc", "storage"] {
                let Some(size) = obj.pointer(&format!("/spec/{name}/resources/requests/storage"))
                else {
                    continue;
                };
                if not_positive(size) {
                    let label = if name == "pvc" { "PVC" } else { "Storage" };
                    let cause = Cause {
                        reason: "FieldValueInvalid",
                        field: format!("spec.{label}.resources.requests.size"),
                        message: format!("{label} size can't be equal or less than zero"),
                    };
                    return Err(denial(
                        "datavolume-validate.cdi.kubevirt.io",
                        format!(" {}", cause.message),
                        &[cause],
                    ));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(group: &str, plural: &str) -> std::sync::Arc<ResourceDef> {
        let version = if group == "cdi.kubevirt.io" {
            "v1beta1"
        } else {
            "v1"
        };
        crate::core::registry::Registry::new(crate::ServeFlavor::KubeVirt)
            .find(group, version, plural)
            .expect("served")
    }

    #[test]
    fn running_with_run_strategy_and_a_disk_without_volume() {
        let vm = json!({"metadata": {"name": "w"}, "spec": {"running": true, "runStrategy": "Always",
            "template": {"spec": {"domain": {"devices": {"disks": [{"name": "root"}, {"name": "data"}]}},
                "volumes": [{"name": "root", "containerDisk": {"image": "x"}}]}}}});
        let e = admit(&def("kubevirt.io", "virtualmachines"), &vm).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "admission webhook \"virtualmachine-validator.kubevirt.io\" denied the request: Running and RunStrategy are mutually exclusive. Note that Running is deprecated, please use RunStrategy instead, spec.template.spec.domain.devices.disks[1].Name 'data' not found."
        );
        assert_eq!(
            e.details.unwrap()["causes"][1]["field"],
            "spec.template.spec.domain.devices.disks[1].name"
        );
    }

    #[test]
    fn zero_storage_is_denied_by_cdi() {
        let dv = json!({"spec": {"storage": {"resources": {"requests": {"storage": "0Gi"}}}}});
        let e = admit(&def("cdi.kubevirt.io", "datavolumes"), &dv).unwrap_err();
        assert_eq!(
            e.message,
            "admission webhook \"datavolume-validate.cdi.kubevirt.io\" denied the request:  Storage size can't be equal or less than zero"
        );
        let ok = json!({"spec": {"storage": {"resources": {"requests": {"storage": "10Gi"}}}}});
        admit(&def("cdi.kubevirt.io", "datavolumes"), &ok).unwrap();
    }
}
