//! What the API server's conversion and registry strategies do to built-in kinds before they are
//! stored: a Secret's write-only `stringData` is merged into base64 `data`, its `type` defaults
//! to `Opaque`, and its size is limited to 1 MiB; Secrets and ConfigMaps carry no
//! `metadata.generation` (their strategies never set one), nor do Namespaces.

use crate::core::registry::ResourceDef;
use crate::core::status::{ApiError, Cause};
use crate::core::util::meta_str;
use base64::Engine;
use serde_json::{Value, json};

/// `corev1.MaxSecretSize` (k8s.io/api/core/v1/types.go): 1 MiB of decoded data.
pub const MAX_SECRET_SIZE: usize = 1024 * 1024;

/// Whether the registry strategy of a kind maintains `metadata.generation`. Custom resources
/// always do (apiextensions-apiserver's customresource strategy); the core `secrets` and
/// `configmaps` strategies (pkg/registry/core/secret/strategy.go, .../configmap/strategy.go)
/// never set it, nor does pkg/registry/core/namespace/strategy.go.
pub fn tracks_generation(group: &str, plural: &str) -> bool {
    !(group.is_empty() && matches!(plural, "secrets" | "configmaps" | "namespaces"))
}

/// Applies conversion, defaulting and validation of built-in kinds to an object about to be
/// written (create, update, patch, apply).
pub fn prepare(def: &ResourceDef, obj: &mut Value) -> Result<(), ApiError> {
    if !def.group.is_empty() {
        return Ok(());
    }
    if !tracks_generation(&def.group, &def.plural)
        && let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.remove("generation");
    }
    if def.plural == "secrets" {
        secret(obj)?;
    }
    if def.plural == "services" {
        crate::core::services::prepare(obj)?;
    }
    Ok(())
}

fn secret(obj: &mut Value) -> Result<(), ApiError> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let map = obj.as_object_mut().expect("an object");
    // pkg/apis/core/v1/conversion.go Convert_v1_Secret_To_core_Secret: "StringData overwrites
    // Data"; stringData is write-only and never stored or returned.
    if let Some(string_data) = map.remove("stringData")
        && let Some(string_data) = string_data.as_object()
    {
        let data = map.entry("data").or_insert_with(|| json!({}));
        if data.is_null() {
            *data = json!({});
        }
        if let Some(data) = data.as_object_mut() {
            for (k, v) in string_data {
                // The typed decoder refuses anything but strings (encoding/json's message).
                let text = v.as_str().ok_or_else(|| {
                    let got = match v {
                        Value::Bool(_) => "bool",
                        Value::Number(_) => "number",
                        Value::Array(_) => "array",
                        Value::Object(_) => "object",
                        _ => "null",
                    };
                    ApiError::bad_request(format!(
                        "Secret in version \"v1\" cannot be handled as a Secret: json: cannot unmarshal {got} into Go struct field Secret.stringData of type string"
                    ))
                })?;
                data.insert(k.clone(), json!(b64.encode(text)));
            }
        }
    }
    // pkg/apis/core/v1/defaults.go SetDefaults_Secret.
    if map
        .get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        map.insert("type".into(), json!("Opaque"));
    }
    // pkg/apis/core/validation/validation.go ValidateSecret: the decoded size of all values.
    let total: usize = map
        .get("data")
        .and_then(Value::as_object)
        .map(|d| {
            d.values()
                .map(|v| {
                    let s = v.as_str().unwrap_or_default();
                    b64.decode(s).map(|b| b.len()).unwrap_or(s.len() * 3 / 4)
                })
                .sum()
        })
        .unwrap_or(0);
    if total > MAX_SECRET_SIZE {
        let name = meta_str(obj, "name").to_string();
        return Err(ApiError::invalid(
            "",
            "Secret",
            &name,
            vec![Cause {
                reason: "FieldValueTooLong",
                field: "data".into(),
                message: format!("Too long: may not be more than {MAX_SECRET_SIZE} bytes"),
            }],
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets_def() -> std::sync::Arc<ResourceDef> {
        crate::core::registry::Registry::new(crate::ServeFlavor::KubeVirt)
            .find("", "v1", "secrets")
            .expect("secrets served")
    }

    #[test]
    fn string_data_is_merged_into_data_and_dropped() {
        let mut s = json!({"metadata": {"name": "s", "generation": 3},
            "data": {"a": "eA==", "b": "eQ=="}, "stringData": {"b": "new", "c": "y"}});
        prepare(&secrets_def(), &mut s).unwrap();
        // Expected values: `printf new | base64` = bmV3, `printf y | base64` = eQ==.
        assert_eq!(s["data"], json!({"a": "eA==", "b": "bmV3", "c": "eQ=="}));
        assert!(s.get("stringData").is_none());
        assert_eq!(s["type"], "Opaque");
        assert!(s["metadata"].get("generation").is_none());
    }

    #[test]
    fn secret_over_one_mebibyte_is_invalid() {
        let mut s = json!({"metadata": {"name": "big"},
            "stringData": {"k": "x".repeat(MAX_SECRET_SIZE + 1)}});
        let e = prepare(&secrets_def(), &mut s).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Secret \"big\" is invalid: data: Too long: may not be more than 1048576 bytes"
        );
        let mut s = json!({"metadata": {"name": "ok"},
            "stringData": {"k": "x".repeat(MAX_SECRET_SIZE)}});
        prepare(&secrets_def(), &mut s).unwrap();
    }
}
