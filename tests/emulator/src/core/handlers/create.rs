//! POST: create (with `generateName`, create-strategy defaults, quota) and review kinds.

use super::{Ctx, is_dry_run};
use crate::core::registry::ResourceDef;
use crate::core::status::ApiError;
use crate::core::store::{Key, StoreError};
use crate::core::util::{meta_mut, meta_str, random_suffix};
use axum::body::Bytes;
use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

impl Ctx<'_> {
    pub(super) fn create(&self, body: &Bytes) -> Result<Response, ApiError> {
        if self.def.namespaced && self.ns.is_empty() {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
        let mut obj = self.decode(body)?;
        self.check_identity(&mut obj)?;
        if !self.def.stored {
            return self.review(obj);
        }
        self.decode_custom(&mut obj)?;
        self.own_update(None, &mut obj);
        self.create_object(obj)
    }

    pub(super) fn create_object(&self, mut obj: Value) -> Result<Response, ApiError> {
        let meta = meta_mut(&mut obj);
        // Server-owned fields are reset on create.
        for f in [
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "deletionTimestamp",
            "selfLink",
        ] {
            meta.remove(f);
        }
        let name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let gen_name = meta
            .get("generateName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() && !gen_name.is_empty() {
            meta.insert(
                "name".into(),
                json!(format!("{gen_name}{}", random_suffix(5))),
            );
        }
        let name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            return Err(ApiError::invalid(
                &self.def.group,
                &self.def.kind,
                "",
                vec![crate::core::status::Cause {
                    reason: "FieldValueRequired",
                    field: "metadata.name".into(),
                    message: "Required value: name or generateName is required".into(),
                }],
            ));
        }
        if self.def.namespaced
            && self
                .app
                .store
                .get(&Key::new("", "namespaces", "", self.ns))
                .is_none()
        {
            return Err(ApiError::not_found("", "namespaces", self.ns));
        }
        if self.def.has_status {
            obj.as_object_mut().expect("object").remove("status");
        }
        defaults_on_create(self.def, &mut obj);
        let warnings = self.validate(&mut obj, None)?;
        if self.def.group.is_empty() && self.def.plural == "services" {
            crate::core::services::allocate(self.app, &mut obj)?;
        }
        crate::core::quota::check(&self.app.store, self.def, self.ns, &name)?;
        if is_dry_run(self.q)? {
            let obj = self.app.store.prepare_new(obj);
            return self.respond(StatusCode::CREATED, obj, &warnings);
        }
        let stored = self
            .app
            .store
            .create(&self.def.group, &self.def.plural, obj)
            .map_err(|e| match e {
                StoreError::AlreadyExists => {
                    ApiError::already_exists(&self.def.group, &self.def.plural, &name)
                }
                other => self.store_err(other),
            })?;
        self.respond(StatusCode::CREATED, stored, &warnings)
    }

    /// Create-only review kinds (SelfSubjectReview, SubjectAccessReview, TokenReview):
    /// answered, never stored (see `reviews.rs`).
    pub(super) fn review(&self, mut obj: Value) -> Result<Response, ApiError> {
        let obj = match self.def.plural.as_str() {
            "subjectaccessreviews" => crate::core::reviews::subject_access_review(self.app, obj)?,
            "tokenreviews" => crate::core::reviews::token_review(self.app, obj),
            "uploadtokenrequests" => {
                crate::kubevirt::upload::token_request(self.app, self.ns, obj)?
            }
            _ => {
                obj["metadata"] = json!({"creationTimestamp": null});
                obj["status"] = json!({"userInfo": crate::core::reviews::user_info(self.user)});
                obj
            }
        };
        self.respond(StatusCode::CREATED, obj, &[])
    }
}

/// What a real server's create strategy fills in.
fn defaults_on_create(def: &ResourceDef, obj: &mut Value) {
    if def.group.is_empty() && def.plural == "namespaces" {
        let name = meta_str(obj, "name").to_string();
        obj["status"] = json!({"phase": "Active"});
        let labels = meta_mut(obj).entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), json!(name));
        }
    }
}
