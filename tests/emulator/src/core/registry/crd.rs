//! A `CustomResourceDefinition` read as the kind it defines.

use super::{Column, ResourceDef, SchemaRef, compare_versions};
use serde_json::Value;
use std::sync::Arc;

/// Builds a [`ResourceDef`] from a `CustomResourceDefinition` (apiextensions.k8s.io/v1).
pub fn crd_to_def(crd: &Value) -> Result<ResourceDef, String> {
    let spec = crd.get("spec").ok_or("no spec")?;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let strings = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let names = spec.get("names").ok_or("no names")?;
    let mut versions: Vec<&Value> = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or("no versions")?
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(false))
        .collect();
    versions.sort_by(|a, b| compare_versions(&s(a, "name"), &s(b, "name")));
    let storage = versions
        .iter()
        .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .or(versions.first())
        .ok_or("no served version")?;
    // Printer columns come from the storage version (they are identical across versions here).
    let columns = storage
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .map(|cols| {
            cols.iter()
                .map(|c| Column {
                    name: s(c, "name"),
                    type_: s(c, "type"),
                    format: s(c, "format"),
                    description: s(c, "description"),
                    priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    json_path: s(c, "jsonPath"),
                })
                .collect()
        })
        .unwrap_or_default();
    let served: Vec<String> = versions.iter().map(|v| s(v, "name")).collect();
    let schemas = version_schemas(crd)
        .into_iter()
        .filter(|(v, _)| served.contains(v))
        .collect();
    Ok(ResourceDef {
        group: s(spec, "group"),
        versions: versions.iter().map(|v| s(v, "name")).collect(),
        plural: s(names, "plural"),
        singular: s(names, "singular"),
        kind: s(names, "kind"),
        short_names: strings(names.get("shortNames")),
        categories: strings(names.get("categories")),
        namespaced: s(spec, "scope") == "Namespaced",
        has_status: storage
            .get("subresources")
            .and_then(|r| r.get("status"))
            .is_some(),
        stored: true,
        extra_subresources: vec![],
        columns,
        schema: SchemaRef::Crd(schemas),
    })
}

/// `(version, openAPIV3Schema)` of every version a CRD defines.
pub(super) fn version_schemas(crd: &Value) -> Vec<(String, Arc<Value>)> {
    crd.pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let name = v.get("name")?.as_str()?.to_string();
            let schema = v.get("schema")?.get("openAPIV3Schema")?.clone();
            Some((name, Arc::new(schema)))
        })
        .collect()
}
