//! Fixture loading: multi-document YAML of any served objects (status included), stored as
//! written without validation or auth; `kind: List` documents are flattened; documents of
//! `apiVersion: emulator.kubevm.io/v1, kind: FailureRule` become failure-injection rules.

use crate::FailureRule;
use crate::core::app::App;
use serde::Deserialize;
use serde_json::Value;

/// API version of the emulator's own configuration documents.
pub const EMULATOR_API_VERSION: &str = "emulator.kubevm.io/v1";

/// Splits a multi-document YAML text into JSON documents (empty documents skipped).
pub fn documents(yaml: &str) -> Result<Vec<Value>, String> {
    let mut out = vec![];
    for (i, doc) in yaml_serde::Deserializer::from_str(yaml).enumerate() {
        let y =
            yaml_serde::Value::deserialize(doc).map_err(|e| format!("document {}: {e}", i + 1))?;
        if y.is_null() {
            continue;
        }
        let v = serde_json::to_value(y).map_err(|e| format!("document {}: {e}", i + 1))?;
        match v.get("kind").and_then(Value::as_str) {
            Some("List") => out.extend(
                v.get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            ),
            _ => out.push(v),
        }
    }
    Ok(out)
}

/// Parses a `FailureRule` document's `spec`.
pub fn failure_rule(doc: &Value) -> Result<FailureRule, String> {
    let spec = doc.get("spec").ok_or("FailureRule without spec")?;
    let s = |k: &str| spec.get(k).and_then(Value::as_str).map(String::from);
    Ok(FailureRule {
        verb: s("verb").ok_or("FailureRule.spec.verb is required")?,
        plural: s("plural").ok_or("FailureRule.spec.plural is required")?,
        name: s("name"),
        code: spec
            .get("code")
            .and_then(Value::as_u64)
            .ok_or("FailureRule.spec.code is required")? as u16,
        message: s("message").unwrap_or_else(|| "injected failure".into()),
        times: spec.get("times").and_then(Value::as_u64).map(|t| t as u32),
    })
}

/// Loads one fixture text into the store (namespaces first, so objects find theirs).
pub fn load(app: &App, yaml: &str) -> Result<(), String> {
    let mut docs = documents(yaml)?;
    docs.sort_by_key(|d| d.get("kind").and_then(Value::as_str) != Some("Namespace"));
    for doc in docs {
        if doc.get("apiVersion").and_then(Value::as_str) == Some(EMULATOR_API_VERSION) {
            match doc.get("kind").and_then(Value::as_str) {
                Some("FailureRule") => app
                    .failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(failure_rule(&doc)?),
                other => return Err(format!("unknown emulator document kind {other:?}")),
            }
            continue;
        }
        app.put(doc)?;
    }
    Ok(())
}
