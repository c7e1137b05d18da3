//! One request against a stored kind, and what every verb shares: presenting and decoding
//! objects, checking a body's identity against the URL, validation, field ownership, responses.

use super::{Query, json_response, wants_table};
use crate::core::app::App;
use crate::core::auth::User;
use crate::core::registry::ResourceDef;
use crate::core::schema::FieldValidation;
use crate::core::status::ApiError;
use crate::core::store::{Key, StoreError};
use crate::core::table::{self, IncludeObject};
use crate::core::util::{meta_mut, parse_yaml_or_json};
use axum::body::Bytes;
use axum::response::Response;
use http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};
use std::cell::RefCell;
use std::sync::Arc;

/// One request against a stored kind.
pub(super) struct Ctx<'a> {
    pub(super) app: &'a Arc<App>,
    pub(super) def: &'a ResourceDef,
    pub(super) version: &'a str,
    pub(super) ns: &'a str,
    pub(super) name: &'a str,
    pub(super) q: &'a Query,
    pub(super) headers: &'a HeaderMap,
    pub(super) user: &'a User,
    /// Warnings gathered while decoding (unknown fields under `fieldValidation=Warn`), sent
    /// with the response.
    pub(super) warnings: RefCell<Vec<String>>,
}

impl Ctx<'_> {
    pub(super) fn key(&self) -> Key {
        Key::new(&self.def.group, &self.def.plural, self.ns, self.name)
    }

    /// The object as served at the request's version (decoded from storage: pruned and
    /// defaulted like the real server's codec does on every read).
    pub(super) fn present(&self, mut obj: Value) -> Value {
        self.decode_stored(&mut obj);
        if let Some(m) = obj.as_object_mut() {
            m.insert(
                "apiVersion".into(),
                json!(self.def.api_version(self.version)),
            );
            m.insert("kind".into(), json!(self.def.kind));
        }
        obj
    }

    /// [`Ctx::present`] of a stored object, decoded once per resourceVersion and kept (see
    /// `decoded.rs`). `schema` is the kind's schema at the request's version.
    pub(super) fn present_cached(&self, schema: Option<&Arc<Value>>, stored: &Value) -> Arc<Value> {
        let key = Key::of(&self.def.group, &self.def.plural, stored);
        self.app
            .decoded
            .get(&key, self.version, schema, stored, |obj| {
                *obj = self.present(std::mem::take(obj));
            })
    }

    /// What the storage codec does to an object read back: prune, drop nulls, default.
    pub(super) fn decode_stored(&self, obj: &mut Value) {
        if let Some(schema) = self.def.schema.for_version(self.version) {
            crate::core::structural::on_read(&schema, obj);
        }
    }

    /// What the request codec does to a decoded body or a patch result before anything else
    /// sees it (customresource_handler.go's schemaCoercingDecoder and unstructuredDefaulter):
    /// unknown fields are an error under `fieldValidation=Strict` and pruned otherwise (with a
    /// warning under Warn), non-nullable nulls without a default go, defaults are applied. So
    /// field ownership is recorded on the defaulted object: the requester owns the defaults.
    pub(super) fn decode_custom(&self, obj: &mut Value) -> Result<(), ApiError> {
        let Some(schema) = self.def.schema.for_version(self.version) else {
            return Ok(());
        };
        let mode = FieldValidation::parse(self.q.get("fieldValidation").map(String::as_str))?;
        let unknown = crate::core::structural::prune(&schema, obj, mode != FieldValidation::Strict);
        match mode {
            FieldValidation::Strict if !unknown.is_empty() => {
                let name = crate::core::util::meta_str(obj, "name").to_string();
                return Err(crate::core::schema::unknown_fields_error(
                    self.def, &name, unknown,
                ));
            }
            FieldValidation::Warn => self.warnings.borrow_mut().extend(
                unknown
                    .iter()
                    .map(|(p, _, _)| crate::core::schema::unknown_warning(p)),
            ),
            _ => {}
        }
        crate::core::structural::prune_nulls(&schema, obj);
        crate::core::structural::default(&schema, obj);
        Ok(())
    }

    /// Records field ownership of a create/update/non-apply patch (see fieldmanager.rs).
    pub(super) fn own_update(&self, live: Option<&Value>, new: &mut Value) {
        let ua = self
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let manager = crate::core::fieldmanager::manager_or_user_agent(
            self.q.get("fieldManager").map(String::as_str),
            ua,
        );
        let av = self.def.api_version(self.version);
        let w = crate::core::fieldmanager::Writer {
            manager: &manager,
            api_version: &av,
            shape: crate::core::fieldmanager::shape_of(self.def),
        };
        crate::core::fieldmanager::update(&w, live, new);
    }

    /// Server-side apply ownership: conflicts (unless `force=true`), pruning, managedFields.
    pub(super) fn own_apply(
        &self,
        live: Option<&Value>,
        applied: &Value,
        merged: &mut Value,
    ) -> Result<(), ApiError> {
        let manager = self.q.get("fieldManager").cloned().unwrap_or_default();
        let av = self.def.api_version(self.version);
        let w = crate::core::fieldmanager::Writer {
            manager: &manager,
            api_version: &av,
            shape: crate::core::fieldmanager::shape_of(self.def),
        };
        let force = self.q.get("force").is_some_and(|f| f == "true");
        crate::core::fieldmanager::apply(&w, live, applied, merged, force)
    }

    pub(super) fn respond(
        &self,
        code: StatusCode,
        obj: Value,
        warnings: &[String],
    ) -> Result<Response, ApiError> {
        let obj = self.present(obj);
        let mut all = self.warnings.borrow().clone();
        all.extend(warnings.iter().cloned());
        let warnings = &all[..];
        if wants_table(self.headers) {
            let include = IncludeObject::parse(self.q.get("includeObject").map(String::as_str));
            return Ok(json_response(
                code,
                &table::table(self.def, &[obj], None, include),
                warnings,
            ));
        }
        Ok(json_response(code, &obj, warnings))
    }

    pub(super) fn store_err(&self, e: StoreError) -> ApiError {
        match e {
            StoreError::NotFound => {
                ApiError::not_found(&self.def.group, &self.def.plural, self.name)
            }
            StoreError::AlreadyExists => {
                ApiError::already_exists(&self.def.group, &self.def.plural, self.name)
            }
            StoreError::Conflict => {
                ApiError::conflict(&self.def.group, &self.def.plural, self.name)
            }
        }
    }

    /// The stored object, as decoded from storage.
    pub(super) fn current(&self) -> Result<Value, ApiError> {
        let mut obj = self
            .app
            .store
            .get(&self.key())
            .ok_or_else(|| ApiError::not_found(&self.def.group, &self.def.plural, self.name))?;
        self.decode_stored(&mut obj);
        Ok(obj)
    }

    pub(super) fn decode(&self, body: &Bytes) -> Result<Value, ApiError> {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if ct.contains("protobuf") || ct.contains("cbor") {
            // Typed clients (e.g. `kubectl auth whoami`) send protobuf; a review's body carries
            // nothing the answer depends on, anything else must be JSON or YAML here.
            // SubjectAccessReviews and TokenReviews are answered from their body: those
            // need JSON (see README, deliberate differences).
            if !self.def.stored && self.def.plural == "selfsubjectreviews" {
                return Ok(json!({}));
            }
            if ct.contains("protobuf")
                && crate::core::protobuf::supported(&self.def.group, &self.def.plural)
            {
                return crate::core::protobuf::decode(&self.def.kind, body).map_err(|e| {
                    ApiError::bad_request(format!("error decoding request body: {e}"))
                });
            }
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {ct})"
                ),
            ));
        }
        let v = parse_yaml_or_json(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))?;
        if !v.is_object() {
            return Err(ApiError::bad_request("the request body must be an object"));
        }
        Ok(v)
    }

    /// Checks apiVersion/kind/namespace of a body against the URL and fills what is missing.
    pub(super) fn check_identity(&self, obj: &mut Value) -> Result<(), ApiError> {
        let want_av = self.def.api_version(self.version);
        let av = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if (!kind.is_empty() && kind != self.def.kind) || (!av.is_empty() && av != want_av) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want_av})"
            ))
            .with_kind_hint(&kind, &self.def.kind));
        }
        obj["apiVersion"] = json!(want_av);
        obj["kind"] = json!(self.def.kind);
        let meta = meta_mut(obj);
        let body_ns = meta
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if self.def.namespaced {
            if !body_ns.is_empty() && body_ns != self.ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), json!(self.ns));
        } else {
            meta.remove("namespace");
        }
        Ok(())
    }

    /// `old` is the stored object on an update (for CEL transition rules).
    pub(super) fn validate(
        &self,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<Vec<String>, ApiError> {
        let mode = FieldValidation::parse(self.q.get("fieldValidation").map(String::as_str))?;
        crate::core::strategy::prepare(self.def, obj)?;
        // Mutating admission runs before the schema and the validating webhooks.
        if self.def.group == "kubevirt.io" && self.def.plural == "virtualmachines" {
            crate::kubevirt::infer::mutate(self.app, obj, self.ns)?;
        }
        let warnings = crate::core::schema::validate(self.def, self.version, obj, old, mode)?;
        crate::core::admission::admit(self.def, obj)?;
        if old.is_none() {
            crate::kubevirt::clone_auth::check(self.app, self.user, self.def, obj, self.ns)?;
        }
        Ok(warnings)
    }
}

trait KindHint {
    fn with_kind_hint(self, got: &str, want: &str) -> Self;
}

impl KindHint for ApiError {
    /// A kind mismatch reads better than the apiVersion message.
    fn with_kind_hint(mut self, got: &str, want: &str) -> Self {
        if !got.is_empty() && got != want {
            self.message =
                format!("the kind in the data ({got}) does not match the expected kind ({want})");
        }
        self
    }
}
