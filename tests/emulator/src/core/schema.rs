//! Validation of objects against their schema, like the API server's structural-schema
//! validation of custom resources (KubeVirt, CDI and Deckhouse kinds are all CRDs on a real
//! cluster, so the messages follow apiextensions-apiserver).
//!
//! Checked: `type` (also `x-kubernetes-int-or-string`, `format: int-or-string`, quantities),
//! unknown fields (what `structural::prune` drops; reported, or pruned with Warn/Ignore),
//! `required`, `enum`, `pattern`, `minimum`/`maximum`, `minItems`/`maxItems`,
//! `minLength`/`maxLength`, and `metadata` (names, labels) the way Kubernetes checks it.
//! CEL rules (`x-kubernetes-validations`) are evaluated (`cel.rs` has the subset the shipped
//! CRDs use) after the structural checks, like apiextensions-apiserver's
//! `pkg/apiserver/schema/cel/validation.go`: skipped when a type error was found (its
//! `hasBlockingErr`), transition rules (those naming `oldSelf`) only on an update where the old
//! object has a value at the same place (fields are correlated by name; list items are not:
//! the shipped CRDs have no transition rules under lists).
//!
//! Deliberate difference: an absent `fieldValidation` parameter is treated as `Strict` (a real
//! server's default is `Warn`, but kubectl always sends `Strict`), so tests notice typos.

use crate::core::registry::ResourceDef;
use crate::core::status::{ApiError, Cause};
use regex::Regex;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

/// The `fieldValidation` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Unknown fields are an error (also the emulator's default).
    Strict,
    /// Unknown fields are pruned and reported in a `Warning` header.
    Warn,
    /// Unknown fields are pruned silently.
    Ignore,
}

impl FieldValidation {
    /// Parses the query value; absent means `Strict` (see the module comment).
    pub fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        match v {
            None | Some("") | Some("Strict") => Ok(Self::Strict),
            Some("Warn") => Ok(Self::Warn),
            Some("Ignore") => Ok(Self::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other}. Valid values: Ignore, Warn, Strict"
            ))),
        }
    }
}

/// Validates `obj` (a full object of kind `def`, served at `version`) in place: unknown fields
/// are pruned unless `mode` is Strict. Returns the warnings to send, or a 422 `Invalid`.
pub fn validate(
    def: &ResourceDef,
    version: &str,
    obj: &mut Value,
    old: Option<&Value>,
    mode: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    let mut v = Validator {
        causes: vec![],
        unknown: vec![],
        prune: mode != FieldValidation::Strict,
    };
    validate_metadata(def, obj, &mut v);
    if let Some(schema) = def.schema.for_version(version) {
        // Unknown fields are what pruning would drop (structural.rs).
        let unknown = crate::core::structural::prune(&schema, obj, v.prune);
        v.unknown.extend(unknown);
        v.walk_root(&schema, obj);
        if !v.causes.iter().any(|c| c.reason == "FieldValueTypeInvalid") {
            validate_cel(&schema, obj, old, "", &mut v.causes);
        }
    }
    let mut causes = v.causes;
    let mut warnings = vec![];
    for (path, field, value) in v.unknown {
        match mode {
            FieldValidation::Strict => causes.push(unknown_cause(path, &field, &value)),
            FieldValidation::Warn => warnings.push(unknown_warning(&path)),
            FieldValidation::Ignore => {}
        }
    }
    if causes.is_empty() {
        Ok(warnings)
    } else {
        let name = crate::core::util::meta_str(obj, "name").to_string();
        Err(ApiError::invalid(&def.group, &def.kind, &name, causes))
    }
}

static RULES: LazyLock<Mutex<HashMap<String, Result<crate::core::cel::Expr, String>>>> =
    LazyLock::new(Default::default);

fn names_old_self(e: &crate::core::cel::Expr) -> bool {
    use crate::core::cel::Expr;
    match e {
        Expr::Ident(i) => i == "oldSelf",
        Expr::Lit(_) => false,
        Expr::List(l) => l.iter().any(names_old_self),
        Expr::Select(t, _) | Expr::Not(t) | Expr::Neg(t) => names_old_self(t),
        Expr::Index(a, b) | Expr::Bin(_, a, b) => names_old_self(a) || names_old_self(b),
        Expr::Cond(a, b, c) => names_old_self(a) || names_old_self(b) || names_old_self(c),
        Expr::Call { target, args, .. } => {
            target.as_deref().is_some_and(names_old_self) || args.iter().any(names_old_self)
        }
    }
}

/// Evaluates the `x-kubernetes-validations` rules of `schema` and below on `value`. A failed
/// rule is `field.Invalid(fldPath, <schema type>, message)` (apiextensions-apiserver
/// `fieldErrorForReason` with `ruleMessageOrDefault`): `spec.x: Invalid value: "object": msg`;
/// an evaluation error is `<error> evaluating rule: <message or rule>`.
fn validate_cel(
    schema: &Value,
    value: &Value,
    old: Option<&Value>,
    path: &str,
    causes: &mut Vec<Cause>,
) {
    if value.is_null() {
        return;
    }
    if let Some(rules) = schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
    {
        let this = crate::core::cel::Val::from_json(value);
        let old_val = old
            .filter(|o| !o.is_null())
            .map(crate::core::cel::Val::from_json);
        let ty = schema.get("type").and_then(Value::as_str).unwrap_or("");
        for rule in rules {
            let src = rule.get("rule").and_then(Value::as_str).unwrap_or("");
            let parsed = RULES
                .lock()
                .expect("rule cache")
                .entry(src.to_string())
                .or_insert_with(|| crate::core::cel::parse(src))
                .clone();
            let message = rule
                .get("message")
                .and_then(Value::as_str)
                .map(|m| m.trim().to_string());
            let field = match rule.get("fieldPath").and_then(Value::as_str) {
                Some(fp) => format!("{path}{fp}"),
                None => path.to_string(),
            };
            let detail = match parsed {
                Err(e) => Some(format!("compilation failed: {e}")),
                Ok(expr) => {
                    let transition = names_old_self(&expr);
                    if transition && old_val.is_none() {
                        continue;
                    }
                    match crate::core::cel::eval(&expr, &this, old_val.as_ref()) {
                        Ok(crate::core::cel::Val::Bool(true)) => None,
                        Ok(crate::core::cel::Val::Bool(false)) => Some(
                            message
                                .clone()
                                .unwrap_or_else(|| format!("failed rule: {}", src.trim())),
                        ),
                        Ok(_) => Some(format!("rule did not evaluate to a bool: {}", src.trim())),
                        Err(e) => Some(format!(
                            "{} evaluating rule: {}",
                            e.0,
                            message.clone().unwrap_or_else(|| src.trim().to_string())
                        )),
                    }
                }
            };
            if let Some(detail) = detail {
                let reason = rule.get("reason").and_then(Value::as_str);
                let (reason, message) = match reason {
                    Some("FieldValueForbidden") => {
                        ("FieldValueForbidden", format!("Forbidden: {detail}"))
                    }
                    Some("FieldValueRequired") => {
                        ("FieldValueRequired", format!("Required value: {detail}"))
                    }
                    _ => (
                        "FieldValueInvalid",
                        format!("Invalid value: {}: {detail}", render(&Value::from(ty))),
                    ),
                };
                causes.push(Cause {
                    reason,
                    field,
                    message,
                });
            }
        }
    }
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, child) in map {
                if path.is_empty() && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let Some(s) = props.and_then(|p| p.get(key)).or(additional) else {
                    continue;
                };
                let old_child = old.and_then(|o| o.get(key));
                validate_cel(s, child, old_child, &join(path, key), causes);
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate_cel(s, item, None, &format!("{path}[{i}]"), causes);
                }
            }
        }
        _ => {}
    }
}

/// The cause reported for an unknown field under `fieldValidation=Strict` (the emulator keeps
/// its 422 form, see the module comment).
fn unknown_cause(path: String, field: &str, value: &Value) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: path,
        message: format!(
            "Invalid value: {}: unknown field \"{field}\"",
            render(value)
        ),
    }
}

/// The 422 for unknown fields of object `name` under `fieldValidation=Strict`.
pub fn unknown_fields_error(
    def: &ResourceDef,
    name: &str,
    unknown: Vec<crate::core::structural::Unknown>,
) -> ApiError {
    let causes = unknown
        .into_iter()
        .map(|(path, field, value)| unknown_cause(path, &field, &value))
        .collect();
    ApiError::invalid(&def.group, &def.kind, name, causes)
}

/// The warning sent for an unknown field under `fieldValidation=Warn`.
pub fn unknown_warning(path: &str) -> String {
    format!("unknown field \"{path}\"")
}

/// Renders a value the way `field.Invalid` prints it: strings quoted, scalars bare, composite
/// values as (truncated) JSON.
pub fn render(v: &Value) -> String {
    let s = match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    if s.chars().count() > 80 {
        format!("{}...", s.chars().take(77).collect::<String>())
    } else {
        s
    }
}

struct Validator {
    causes: Vec<Cause>,
    /// (path, field name, value) of unknown fields.
    unknown: Vec<(String, String, Value)>,
    prune: bool,
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

static PATTERNS: LazyLock<Mutex<HashMap<String, Option<Regex>>>> = LazyLock::new(Default::default);

fn pattern_matches(pattern: &str, s: &str) -> bool {
    let mut cache = PATTERNS.lock().expect("pattern cache");
    let re = cache
        .entry(pattern.to_string())
        .or_insert_with(|| Regex::new(pattern).ok());
    // A pattern the regex crate can't compile (RE2 and Rust syntax differ slightly) is skipped.
    re.as_ref().is_none_or(|re| re.is_match(s))
}

impl Validator {
    fn invalid(&mut self, path: &str, value: &Value, detail: String) {
        self.causes.push(Cause {
            reason: "FieldValueInvalid",
            field: path.to_string(),
            message: format!("Invalid value: {}: {detail}", render(value)),
        });
    }

    fn walk_root(&mut self, schema: &Value, obj: &mut Value) {
        // apiVersion, kind and metadata are the server's business (see validate_metadata).
        let Some(map) = obj.as_object_mut() else {
            self.invalid("", &Value::Null, "must be an object".into());
            return;
        };
        let props = schema.get("properties").and_then(Value::as_object);
        let keys: Vec<String> = map.keys().cloned().collect();
        for key in keys {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            // Undeclared fields were reported by pruning already.
            if let Some(s) = props.and_then(|p| p.get(&key)) {
                let val = map.get_mut(&key).expect("key");
                self.walk(s, val, &key);
            }
        }
        self.check_required(schema, map, "", &["metadata", "apiVersion", "kind"]);
    }

    fn unknown_field(&mut self, map: &mut Map<String, Value>, key: &str, path: &str) {
        let value = if self.prune {
            map.remove(key)
        } else {
            map.get(key).cloned()
        };
        self.unknown.push((
            join(path, key),
            key.to_string(),
            value.unwrap_or(Value::Null),
        ));
    }

    fn check_required(
        &mut self,
        schema: &Value,
        map: &Map<String, Value>,
        path: &str,
        skip: &[&str],
    ) {
        for req in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(req) = req.as_str() else { continue };
            if skip.contains(&req) {
                continue;
            }
            if map.get(req).is_none_or(Value::is_null) {
                self.causes.push(Cause {
                    reason: "FieldValueRequired",
                    field: join(path, req),
                    message: "Required value".into(),
                });
            }
        }
    }

    fn walk(&mut self, schema: &Value, value: &mut Value, path: &str) {
        if value.is_null() {
            // null means "unset" for Kubernetes' decoders.
            return;
        }
        let int_or_string = schema
            .get("x-kubernetes-int-or-string")
            .and_then(Value::as_bool)
            == Some(true)
            || schema.get("format").and_then(Value::as_str) == Some("int-or-string");
        if int_or_string {
            if !(value.is_string() || json_type(value) == "integer") {
                let t = json_type(value);
                self.invalid(
                    path,
                    &Value::String(t.into()),
                    format!("{path} in body must be of type integer,string: \"{t}\""),
                );
                return;
            }
            self.check_string_number(schema, value, path);
            return;
        }
        let actual = json_type(value);
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        if !types.is_empty()
            && !types
                .iter()
                .any(|t| *t == actual || (*t == "number" && actual == "integer"))
        {
            let want = types
                .iter()
                .filter(|t| **t != "null")
                .cloned()
                .collect::<Vec<_>>()
                .join(",");
            self.causes.push(Cause {
                reason: "FieldValueTypeInvalid",
                field: path.to_string(),
                message: format!("Invalid value: \"{actual}\": {path} in body must be of type {want}: \"{actual}\""),
            });
            return;
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
            && !allowed.contains(value)
        {
            let list: Vec<String> = allowed.iter().map(render).collect();
            self.causes.push(Cause {
                reason: "FieldValueNotSupported",
                field: path.to_string(),
                message: format!(
                    "Unsupported value: {}: supported values: {}",
                    render(value),
                    list.join(", ")
                ),
            });
            return;
        }
        match value {
            Value::Object(map) => self.walk_object(schema, map, path),
            Value::Array(items) => {
                let n = items.len() as u64;
                if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                    && n > max
                {
                    self.causes.push(Cause {
                        reason: "FieldValueTooMany",
                        field: path.to_string(),
                        message: format!("Too many: {n}: must have at most {max} items"),
                    });
                }
                if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                    && n < min
                {
                    self.invalid(
                        path,
                        &Value::from(n),
                        format!("{path} in body should have at least {min} items"),
                    );
                }
                if let Some(item_schema) = schema.get("items") {
                    for (i, item) in items.iter_mut().enumerate() {
                        self.walk(item_schema, item, &format!("{path}[{i}]"));
                    }
                }
            }
            _ => self.check_string_number(schema, value, path),
        }
    }

    fn check_string_number(&mut self, schema: &Value, value: &Value, path: &str) {
        match value {
            Value::String(s) => {
                let len = s.chars().count() as u64;
                if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                    && len > max
                {
                    self.causes.push(Cause {
                        reason: "FieldValueTooLong",
                        field: path.to_string(),
                        message: format!("Too long: may not be more than {max} bytes"),
                    });
                }
                if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                    && len < min
                {
                    self.invalid(
                        path,
                        value,
                        format!("{path} in body should be at least {min} chars long"),
                    );
                }
                if let Some(p) = schema.get("pattern").and_then(Value::as_str)
                    && !pattern_matches(p, s)
                {
                    self.invalid(path, value, format!("{path} in body should match '{p}'"));
                }
            }
            Value::Number(n) => {
                let x = n.as_f64().unwrap_or(0.0);
                let excl_min =
                    schema.get("exclusiveMinimum").and_then(Value::as_bool) == Some(true);
                let excl_max =
                    schema.get("exclusiveMaximum").and_then(Value::as_bool) == Some(true);
                if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
                    && (x < min || (excl_min && x == min))
                {
                    let op = if excl_min {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    self.invalid(
                        path,
                        value,
                        format!(
                            "{path} in body should be {op} {}",
                            Value::from(min).to_string().trim_end_matches(".0")
                        ),
                    );
                }
                if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
                    && (x > max || (excl_max && x == max))
                {
                    let op = if excl_max {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    self.invalid(
                        path,
                        value,
                        format!(
                            "{path} in body should be {op} {}",
                            Value::from(max).to_string().trim_end_matches(".0")
                        ),
                    );
                }
            }
            _ => {}
        }
    }

    fn walk_object(&mut self, schema: &Value, map: &mut Map<String, Value>, path: &str) {
        let props = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties");
        let keys: Vec<String> = map.keys().cloned().collect();
        for key in keys {
            let child = join(path, &key);
            if let Some(s) = props.and_then(|p| p.get(&key)) {
                self.walk(s, map.get_mut(&key).expect("key"), &child);
            } else if let Some(add) = additional.filter(|a| a.is_object()) {
                self.walk(add, map.get_mut(&key).expect("key"), &child);
            }
            // Anything else is free-form (preserved) or was reported by pruning.
        }
        self.check_required(schema, map, path, &[]);
    }
}

const DNS1123_SUBDOMAIN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
const DNS1123_LABEL: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
const LABEL_VALUE: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

fn check_subdomain(s: &str) -> Option<String> {
    if s.len() > 253 {
        return Some("must be no more than 253 characters".into());
    }
    (!pattern_matches(DNS1123_SUBDOMAIN, s)).then(|| {
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".into()
    })
}

/// k8s.io/apimachinery/pkg/api/validation/path IsValidPathSegmentName's messages.
fn check_path_segment(s: &str) -> Option<String> {
    if s == "." || s == ".." {
        return Some(format!("may not be '{s}'"));
    }
    ["/", "%"]
        .iter()
        .find(|c| s.contains(*c))
        .map(|c| format!("may not contain '{c}'"))
}

fn check_label(s: &str) -> Option<String> {
    if s.len() > 63 {
        return Some("must be no more than 63 characters".into());
    }
    (!pattern_matches(DNS1123_LABEL, s)).then(|| {
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".into()
    })
}

fn check_qualified_name(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty() || check_subdomain(p).is_some())
    {
        return Some("prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character".into());
    }
    if name.is_empty()
        || name.len() > 63
        || !pattern_matches(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$", name)
    {
        return Some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".into());
    }
    None
}

const META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Checks `metadata` like ObjectMeta validation does (name format, labels, annotations).
fn validate_metadata(def: &ResourceDef, obj: &mut Value, v: &mut Validator) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        v.causes.push(Cause {
            reason: "FieldValueRequired",
            field: "metadata".into(),
            message: "Required value".into(),
        });
        return;
    };
    let keys: Vec<String> = meta.keys().cloned().collect();
    for k in keys {
        if !META_FIELDS.contains(&k.as_str()) {
            v.unknown_field(meta, &k, "metadata");
        }
    }
    let name = meta.get("name").and_then(Value::as_str).unwrap_or("");
    let problem = match def.kind.as_str() {
        "Namespace" => check_label(name),
        // RBAC names are path segments (pkg/apis/rbac/validation ValidateRBACName =
        // path.IsValidPathSegmentName): `system:auth-delegator` is a valid ClusterRole name.
        "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding" => check_path_segment(name),
        _ => check_subdomain(name),
    };
    if let Some(p) = problem.filter(|_| !name.is_empty()) {
        v.invalid("metadata.name", &Value::String(name.into()), p);
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (k, val) in labels {
            if let Some(p) = check_qualified_name(k) {
                v.invalid("metadata.labels", &Value::String(k.clone()), p);
            }
            match val.as_str() {
                Some(s) if s.len() > 63 => v.invalid("metadata.labels", val, "must be no more than 63 characters".into()),
                Some(s) if !pattern_matches(LABEL_VALUE, s) => v.invalid(
                    "metadata.labels",
                    val,
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".into(),
                ),
                Some(_) => {}
                None => v.invalid("metadata.labels", val, "metadata.labels in body must be of type string".into()),
            }
        }
    }
    if let Some(ann) = meta.get("annotations").and_then(Value::as_object) {
        let mut total = 0;
        for (k, val) in ann {
            total += k.len() + val.as_str().map(str::len).unwrap_or(0);
            if let Some(p) = check_qualified_name(k) {
                v.invalid("metadata.annotations", &Value::String(k.clone()), p);
            }
        }
        if total > 256 * 1024 {
            v.causes.push(Cause {
                reason: "FieldValueTooLong",
                field: "metadata.annotations".into(),
                message: "Too long: may not be more than 262144 bytes".into(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServeFlavor;
    use crate::core::registry::Registry;
    use serde_json::json;

    fn vm() -> Value {
        json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"runStrategy": "Always", "template": {"spec": {
                "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                           "resources": {"requests": {"memory": "1Gi", "cpu": 1}}},
                "volumes": [{"name": "root", "containerDisk": {"image": "quay.io/containerdisks/fedora"}}]}}}
        })
    }

    #[test]
    fn valid_vm_passes() {
        let r = Registry::new(ServeFlavor::KubeVirt);
        let def = r.find("kubevirt.io", "v1", "virtualmachines").unwrap();
        let mut obj = vm();
        assert_eq!(
            validate(&def, "v1", &mut obj, None, FieldValidation::Strict).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn rbac_names_are_path_segments() {
        let r = Registry::new(ServeFlavor::KubeVirt);
        let def = r
            .find("rbac.authorization.k8s.io", "v1", "clusterroles")
            .unwrap();
        let role = |name: &str| {
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": name}, "rules": []})
        };
        // Names the bootstrap policy itself uses.
        for name in ["system:auth-delegator", "kubevm:ssh", "Mixed_Case"] {
            assert!(
                validate(&def, "v1", &mut role(name), None, FieldValidation::Strict).is_ok(),
                "{name}"
            );
        }
        let err =
            validate(&def, "v1", &mut role("a/b"), None, FieldValidation::Strict).unwrap_err();
        assert!(
            err.message.contains("may not contain '/'"),
            "{}",
            err.message
        );
        assert!(validate(&def, "v1", &mut role(".."), None, FieldValidation::Strict).is_err());
    }

    #[test]
    fn unknown_field_is_refused_or_pruned() {
        let r = Registry::new(ServeFlavor::KubeVirt);
        let def = r.find("kubevirt.io", "v1", "virtualmachines").unwrap();
        let mut obj = vm();
        obj["spec"]["template"]["spec"]["domain"]["foo"] = json!("bar");
        let err =
            validate(&def, "v1", &mut obj.clone(), None, FieldValidation::Strict).unwrap_err();
        assert_eq!(err.code, 422);
        assert_eq!(
            err.message,
            "VirtualMachine.kubevirt.io \"web\" is invalid: spec.template.spec.domain.foo: Invalid value: \"bar\": unknown field \"foo\""
        );
        assert_eq!(
            err.details.unwrap()["causes"][0]["field"],
            "spec.template.spec.domain.foo"
        );
        let warnings = validate(&def, "v1", &mut obj, None, FieldValidation::Warn).unwrap();
        assert_eq!(
            warnings,
            ["unknown field \"spec.template.spec.domain.foo\""]
        );
        assert!(
            obj["spec"]["template"]["spec"]["domain"]
                .get("foo")
                .is_none()
        );
    }

    #[test]
    fn types_required_and_enums() {
        let r = Registry::new(ServeFlavor::Both);
        let def = r.find("kubevirt.io", "v1", "virtualmachines").unwrap();
        let mut obj = vm();
        obj["spec"]["template"]["spec"]["domain"]["devices"]["disks"][0]["name"] = json!(5);
        obj["spec"]["template"]["spec"]["volumes"][0]["containerDisk"] = json!({});
        let err = validate(&def, "v1", &mut obj, None, FieldValidation::Strict).unwrap_err();
        let causes = err.details.unwrap()["causes"].clone();
        let fields: Vec<&str> = causes
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["field"].as_str().unwrap())
            .collect();
        assert!(
            fields.contains(&"spec.template.spec.domain.devices.disks[0].name"),
            "{fields:?}"
        );
        assert!(
            fields.contains(&"spec.template.spec.volumes[0].containerDisk.image"),
            "{fields:?}"
        );

        let dvm = r
            .find("virtualization.deckhouse.io", "v1alpha2", "virtualmachines")
            .unwrap();
        let mut obj = json!({"apiVersion": "virtualization.deckhouse.io/v1alpha2", "kind": "VirtualMachine",
            "metadata": {"name": "x", "namespace": "default"},
            "spec": {"virtualMachineClassName": "generic", "runPolicy": "Sometimes",
                     "cpu": {"cores": 0}, "memory": {"size": "1Gi"}, "blockDeviceRefs": []}});
        let err = validate(&dvm, "v1alpha2", &mut obj, None, FieldValidation::Strict).unwrap_err();
        assert!(
            err.message
                .contains("spec.runPolicy: Unsupported value: \"Sometimes\""),
            "{}",
            err.message
        );
        assert!(err.message.contains("spec.cpu.cores: Invalid value: 0: spec.cpu.cores in body should be greater than or equal to 1"), "{}", err.message);
    }

    #[test]
    fn metadata_names_and_labels() {
        let r = Registry::new(ServeFlavor::KubeVirt);
        let def = r.find("kubevirt.io", "v1", "virtualmachines").unwrap();
        let mut obj = vm();
        obj["metadata"]["name"] = json!("db.primary");
        assert!(validate(&def, "v1", &mut obj, None, FieldValidation::Strict).is_ok());
        obj["metadata"]["name"] = json!("Web_1");
        obj["metadata"]["labels"] = json!({"bad key!": "x"});
        let err = validate(&def, "v1", &mut obj, None, FieldValidation::Strict).unwrap_err();
        assert!(
            err.message
                .contains("metadata.name: Invalid value: \"Web_1\""),
            "{}",
            err.message
        );
        assert!(err.message.contains("metadata.labels"), "{}", err.message);
    }
}
