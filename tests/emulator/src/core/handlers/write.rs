//! PUT and PATCH (including server-side apply and the `status` subresource).

use super::{Ctx, is_dry_run};
use crate::core::patch::PatchType;
use crate::core::status::ApiError;
use crate::core::store::StoreError;
use crate::core::util::{meta_mut, meta_str, parse_yaml_or_json};
use axum::body::Bytes;
use axum::response::Response;
use http::{StatusCode, header};
use serde_json::{Value, json};

impl Ctx<'_> {
    /// Shared tail of PUT and PATCH: keeps status or spec as the subresource demands, checks
    /// the precondition, validates and stores.
    pub(super) fn write(
        &self,
        mut new: Value,
        current: Value,
        status_only: bool,
        expected_rv: Option<u64>,
    ) -> Result<Response, ApiError> {
        if status_only {
            let status = new.get("status").cloned();
            new = current.clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    new.as_object_mut().expect("object").remove("status");
                }
            }
        } else if self.def.has_status {
            match current.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    new.as_object_mut().expect("object").remove("status");
                }
            }
        }
        let meta = meta_mut(&mut new);
        meta.insert("name".into(), json!(self.name));
        // Unchanged status is not re-validated on main-resource writes (CRD validation
        // ratcheting, GA since Kubernetes 1.33).
        let kept_status = if !status_only && self.def.has_status {
            new.as_object_mut().and_then(|m| m.remove("status"))
        } else {
            None
        };
        let warnings = self.validate(&mut new, Some(&current))?;
        if !status_only {
            crate::core::expansion::admit_update(&self.app.store, self.def, &current, &new)?;
        }
        if let Some(s) = kept_status {
            new["status"] = s;
        }
        if is_dry_run(self.q)? {
            let cur_rv: u64 = meta_str(&current, "resourceVersion").parse().unwrap_or(0);
            if expected_rv.is_some_and(|rv| rv != cur_rv) {
                return Err(self.store_err(StoreError::Conflict));
            }
            return self.respond(StatusCode::OK, new, &warnings);
        }
        let stored = self
            .app
            .store
            .update(&self.def.group, &self.def.plural, new, expected_rv)
            .map_err(|e| self.store_err(e))?;
        self.respond(StatusCode::OK, stored, &warnings)
    }

    pub(super) fn update(&self, body: &Bytes, status_only: bool) -> Result<Response, ApiError> {
        let mut obj = self.decode(body)?;
        self.check_identity(&mut obj)?;
        let body_name = meta_str(&obj, "name").to_string();
        if body_name != self.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                self.name
            )));
        }
        let current = self.current()?;
        let rv_text = meta_str(&obj, "resourceVersion").to_string();
        let expected = if rv_text.is_empty() {
            // Custom resources refuse unconditional updates; built-in kinds allow them.
            if !self.def.group.is_empty() && !status_only {
                return Err(ApiError::invalid(
                    &self.def.group,
                    &self.def.kind,
                    self.name,
                    vec![crate::core::status::Cause {
                        reason: "FieldValueInvalid",
                        field: "metadata.resourceVersion".into(),
                        message: "Invalid value: 0x0: must be specified for an update".into(),
                    }],
                ));
            }
            None
        } else {
            Some(rv_text.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("invalid resourceVersion {rv_text:?}"))
            })?)
        };
        self.decode_custom(&mut obj)?;
        if !status_only {
            self.own_update(Some(&current), &mut obj);
        }
        self.write(obj, current, status_only, expected)
    }

    pub(super) fn patch(&self, body: &Bytes, status_only: bool) -> Result<Response, ApiError> {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let kind = PatchType::from_content_type(ct)?;
        let patch = parse_yaml_or_json(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
        if kind == PatchType::Apply && self.q.get("fieldManager").is_none_or(|f| f.is_empty()) {
            return Err(ApiError::bad_request(
                "PATCH (apply): fieldManager is required for apply requests",
            ));
        }
        let current = match self.app.store.get(&self.key()) {
            Some(mut c) => {
                self.decode_stored(&mut c);
                c
            }
            None if kind == PatchType::Apply && !status_only => {
                // Server-side apply creates missing objects.
                let mut obj = crate::core::patch::without_directives(&patch);
                self.check_identity(&mut obj)?;
                if meta_str(&obj, "name") != self.name {
                    return Err(ApiError::bad_request(
                        "the name of the object does not match the name on the URL",
                    ));
                }
                let applied = obj.clone();
                self.own_apply(None, &applied, &mut obj)?;
                // Defaults come after the merge and belong to nobody (structuredmerge.go
                // Apply runs the defaulter on the merged object).
                self.decode_custom(&mut obj)?;
                return self.create_object(obj);
            }
            None => {
                return Err(ApiError::not_found(
                    &self.def.group,
                    &self.def.plural,
                    self.name,
                ));
            }
        };
        let mut applied = patch.clone();
        if kind == PatchType::Apply {
            self.check_identity(&mut applied)?;
        }
        let mut new = current.clone();
        crate::core::patch::apply(kind, &mut new, &patch)?;
        if !new.is_object() {
            return Err(ApiError::bad_request("the patch result is not an object"));
        }
        match (status_only, kind) {
            (true, _) => self.decode_custom(&mut new)?,
            (false, PatchType::Apply) => {
                self.own_apply(Some(&current), &applied, &mut new)?;
                self.decode_custom(&mut new)?;
            }
            (false, _) => {
                self.decode_custom(&mut new)?;
                self.own_update(Some(&current), &mut new);
            }
        }
        let cur_rv = meta_str(&current, "resourceVersion").to_string();
        let new_rv = meta_str(&new, "resourceVersion").to_string();
        // A patch that sets metadata.resourceVersion is a precondition.
        let expected = if !new_rv.is_empty() && new_rv != cur_rv {
            new_rv.parse().ok().or(Some(0))
        } else {
            None
        };
        meta_mut(&mut new).insert("namespace".into(), json!(self.ns));
        if !self.def.namespaced {
            meta_mut(&mut new).remove("namespace");
        }
        self.write(new, current, status_only, expected)
    }
}
