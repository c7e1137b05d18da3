//! Test-only structural validation of generated objects against the real API schemas
//! (KubeVirt and CDI swagger, Deckhouse CRDs) shared with the emulator in `schemas/` at the repository root.
//!
//! Supported keywords: `$ref` (`#/definitions/…`), `type` (also lists, and
//! `x-kubernetes-int-or-string`), `properties` with unknown-field detection,
//! `additionalProperties`, `x-kubernetes-preserve-unknown-fields`, `required`, `enum`,
//! `pattern`, `minimum`/`maximum`, `minLength`/`maxLength`, `minItems`/`maxItems`, `items`,
//! `allOf`/`anyOf`/`oneOf`/`not`. CEL rules (`x-kubernetes-validations`) are not evaluated.

use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

struct Schemas {
    kubevirt: Value,
    cdi: Value,
    deckhouse_vm: Value,
    deckhouse_vd: Value,
}

fn crd_schema(yaml: &str, version: &str) -> Value {
    let crd: Value = yaml_serde::from_str(yaml).expect("CRD parses");
    crd["spec"]["versions"]
        .as_array()
        .expect("CRD has versions")
        .iter()
        .find(|v| v["name"] == version)
        .expect("CRD serves the version")["schema"]["openAPIV3Schema"]
        .clone()
}

fn schemas() -> &'static Schemas {
    static SCHEMAS: OnceLock<Schemas> = OnceLock::new();
    SCHEMAS.get_or_init(|| Schemas {
        kubevirt: serde_json::from_str(include_str!("../../../schemas/kubevirt-swagger.json"))
            .unwrap(),
        cdi: serde_json::from_str(include_str!("../../../schemas/cdi-swagger.json")).unwrap(),
        deckhouse_vm: crd_schema(
            include_str!("../../../schemas/deckhouse/virtualmachines.yaml"),
            "v1alpha2",
        ),
        deckhouse_vd: crd_schema(
            include_str!("../../../schemas/deckhouse/virtualdisks.yaml"),
            "v1alpha2",
        ),
    })
}

struct Checker<'a> {
    definitions: Option<&'a Value>,
    errors: Vec<String>,
}

impl Checker<'_> {
    fn check(&mut self, schema: &Value, value: &Value, path: &str, structural: bool) {
        let schema = match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let name = reference.trim_start_matches("#/definitions/");
                match self.definitions.and_then(|d| d.get(name)) {
                    Some(def) => def.clone(),
                    None => {
                        self.errors
                            .push(format!("{path}: unresolved $ref {reference}"));
                        return;
                    }
                }
            }
            None => schema.clone(),
        };
        if !self.type_ok(&schema, value) {
            self.errors.push(format!(
                "{path}: {value} does not have type {}",
                schema["type"]
            ));
            return;
        }
        if let Some(options) = schema.get("enum").and_then(Value::as_array)
            && !options.contains(value)
        {
            self.errors
                .push(format!("{path}: {value} is not one of {options:?}"));
        }
        self.check_scalar(&schema, value, path);
        match value {
            Value::Object(map) => {
                if let Some(required) = schema.get("required").and_then(Value::as_array) {
                    for key in required.iter().filter_map(Value::as_str) {
                        if !map.contains_key(key) {
                            self.errors
                                .push(format!("{path}: missing required field {key}"));
                        }
                    }
                }
                let properties = schema.get("properties").and_then(Value::as_object);
                let additional = schema.get("additionalProperties");
                let preserve = schema
                    .get("x-kubernetes-preserve-unknown-fields")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                for (key, item) in map {
                    let child = format!("{path}.{key}");
                    match (properties.and_then(|p| p.get(key)), additional) {
                        (Some(sub), _) => self.check(sub, item, &child, structural),
                        (None, Some(sub)) if sub.is_object() => {
                            self.check(sub, item, &child, structural)
                        }
                        (None, Some(Value::Bool(true))) => {}
                        (None, _) if preserve || !structural || properties.is_none() => {}
                        (None, _) => self.errors.push(format!("{child}: unknown field")),
                    }
                }
            }
            Value::Array(items) => {
                if let Some(sub) = schema.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.check(sub, item, &format!("{path}[{i}]"), structural);
                    }
                }
            }
            _ => {}
        }
        self.check_combinators(&schema, value, path);
    }

    fn type_ok(&self, schema: &Value, value: &Value) -> bool {
        if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
            return value.is_string() || value.is_i64() || value.is_u64();
        }
        let matches = |t: &str| match t {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "boolean" => value.is_boolean(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            _ => true,
        };
        match schema.get("type") {
            Some(Value::String(t)) => matches(t),
            Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).any(matches),
            _ => true,
        }
    }

    fn check_scalar(&mut self, schema: &Value, value: &Value, path: &str) {
        let num = |k: &str| schema.get(k).and_then(Value::as_f64);
        if let Some(s) = value.as_str() {
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
                let re = Regex::new(pattern).unwrap_or_else(|e| panic!("{path}: bad pattern: {e}"));
                if !re.is_match(s) {
                    self.errors
                        .push(format!("{path}: {s:?} does not match {pattern}"));
                }
            }
            let len = s.chars().count() as f64;
            if num("maxLength").is_some_and(|m| len > m)
                || num("minLength").is_some_and(|m| len < m)
            {
                self.errors
                    .push(format!("{path}: length {len} out of bounds"));
            }
        }
        if let Some(n) = value.as_f64()
            && (num("minimum").is_some_and(|m| n < m) || num("maximum").is_some_and(|m| n > m))
        {
            self.errors.push(format!("{path}: {n} out of bounds"));
        }
        if let Some(items) = value.as_array() {
            let len = items.len() as f64;
            if num("maxItems").is_some_and(|m| len > m) || num("minItems").is_some_and(|m| len < m)
            {
                self.errors
                    .push(format!("{path}: {len} items out of bounds"));
            }
        }
    }

    /// Errors a branch would report, without the unknown-field rule (branches are value
    /// constraints on top of the structural schema).
    fn branch_errors(&self, schema: &Value, value: &Value, path: &str) -> Vec<String> {
        let mut sub = Checker {
            definitions: self.definitions,
            errors: Vec::new(),
        };
        sub.check(schema, value, path, false);
        sub.errors
    }

    fn check_combinators(&mut self, schema: &Value, value: &Value, path: &str) {
        let list = |k: &str| {
            schema
                .get(k)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        for branch in list("allOf") {
            let errors = self.branch_errors(&branch, value, path);
            self.errors.extend(errors);
        }
        let any = list("anyOf");
        if !any.is_empty()
            && any
                .iter()
                .all(|b| !self.branch_errors(b, value, path).is_empty())
        {
            self.errors.push(format!("{path}: matches no anyOf branch"));
        }
        let one = list("oneOf");
        if !one.is_empty() {
            let passing = one
                .iter()
                .filter(|b| self.branch_errors(b, value, path).is_empty())
                .count();
            if passing != 1 {
                self.errors
                    .push(format!("{path}: matches {passing} oneOf branches, not 1"));
            }
        }
        if let Some(not) = schema.get("not")
            && self.branch_errors(not, value, path).is_empty()
        {
            self.errors.push(format!("{path}: matches a `not` schema"));
        }
    }
}

fn run(definitions: Option<&Value>, schema: &Value, value: &Value) -> Vec<String> {
    let mut checker = Checker {
        definitions,
        errors: Vec::new(),
    };
    checker.check(schema, value, "", true);
    checker.errors
}

/// Schema errors of a generated object (empty when it is valid); dispatches on kind.
pub fn errors(object: &Value) -> Vec<String> {
    let s = schemas();
    let swagger =
        |doc: &Value, root: &str| run(Some(&doc["definitions"]), &doc["definitions"][root], object);
    match (object["apiVersion"].as_str(), object["kind"].as_str()) {
        (Some("kubevirt.io/v1"), Some("VirtualMachine")) => {
            swagger(&s.kubevirt, "v1.VirtualMachine")
        }
        (Some("cdi.kubevirt.io/v1beta1"), Some("DataVolume")) => {
            swagger(&s.cdi, "v1beta1.DataVolume")
        }
        (Some("virtualization.deckhouse.io/v1alpha2"), Some("VirtualMachine")) => {
            run(None, &s.deckhouse_vm, object)
        }
        (Some("virtualization.deckhouse.io/v1alpha2"), Some("VirtualDisk")) => {
            run(None, &s.deckhouse_vd, object)
        }
        (Some("v1"), Some("Secret")) => {
            // k8s-openapi drops unknown fields, so a lossless round trip means a valid shape.
            match serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(object.clone()) {
                Ok(secret) if serde_json::to_value(&secret).unwrap() == *object => Vec::new(),
                Ok(_) => vec!["Secret has fields k8s-openapi does not know".into()],
                Err(e) => vec![format!("not a Secret: {e}")],
            }
        }
        other => vec![format!("no schema for {other:?}")],
    }
}

/// Panic with every schema error of `object`.
pub fn assert_valid(object: &Value) {
    let errors = errors(object);
    assert!(
        errors.is_empty(),
        "{} {} is invalid:\n{}\n{}",
        object["kind"],
        object["metadata"]["name"],
        errors.join("\n"),
        serde_json::to_string_pretty(object).unwrap()
    );
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn catches_unknown_fields_types_enums_and_required() {
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "x"},
            "spec": {"runStrategy": "Always", "bogus": 1,
                "template": {"spec": {"domain": {"devices": {"disks": [{"disk": {"bus": 3}}]}}}}}});
        let found = errors(&vm);
        assert!(
            found
                .iter()
                .any(|e| e.contains(".spec.bogus: unknown field")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|e| e.contains("missing required field name")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|e| e.contains(".bus: 3 does not have type")),
            "{found:?}"
        );

        let dvm = json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
            "metadata": {"name": "x"},
            "spec": {"virtualMachineClassName": "generic", "cpu": {"cores": 0, "coreFraction": "7"},
                "memory": {"size": "1Gi"}, "blockDeviceRefs": [], "runPolicy": "Sometimes",
                "provisioning": {"type": "UserData"}}});
        let found = errors(&dvm);
        for needle in [
            "cores: 0 out of bounds",
            "coreFraction: \"7\" does not match",
            "runPolicy: \"Sometimes\" is not one of",
            "provisioning: matches 0 oneOf",
        ] {
            assert!(
                found.iter().any(|e| e.contains(needle)),
                "{needle}: {found:?}"
            );
        }
        assert!(!errors(&json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "bogus": 1})).is_empty());
    }
}
