//! DELETE of one object (propagation, dry run, uid precondition) and deletecollection.

use super::{Ctx, is_dry_run, ok};
use crate::core::status::ApiError;
use crate::core::store::{Key, Propagation, StoreError};
use crate::core::util::{meta_str, parse_yaml_or_json};
use axum::body::Bytes;
use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

impl Ctx<'_> {
    pub(super) fn propagation(
        &self,
        body: &Bytes,
    ) -> Result<(Propagation, bool, Option<String>), ApiError> {
        let opts = if body.is_empty() {
            json!({})
        } else {
            parse_yaml_or_json(body).unwrap_or(json!({}))
        };
        let policy = self.q.get("propagationPolicy").cloned().or_else(|| {
            opts.get("propagationPolicy")
                .and_then(Value::as_str)
                .map(String::from)
        });
        let propagation = match policy.as_deref() {
            None | Some("Background") => Propagation::Cascade,
            Some("Foreground") => Propagation::Foreground,
            Some("Orphan") => Propagation::Orphan,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "unsupported propagationPolicy {other:?}"
                )));
            }
        };
        let dry = is_dry_run(self.q)?
            || opts
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v == "All"));
        let precondition_uid = opts
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from);
        Ok((propagation, dry, precondition_uid))
    }

    pub(super) fn delete(&self, body: &Bytes) -> Result<Response, ApiError> {
        let (propagation, dry, uid) = self.propagation(body)?;
        let current = self.current()?;
        if let Some(uid) = uid
            && uid != meta_str(&current, "uid")
        {
            return Err(ApiError::uid_precondition(
                &self.def.group,
                &self.def.plural,
                self.name,
                &uid,
                meta_str(&current, "uid"),
            ));
        }
        if dry {
            return self.respond(StatusCode::OK, current, &[]);
        }
        if propagation == Propagation::Foreground {
            let marked = crate::core::gc::delete_foreground(self.app, &self.key())
                .ok_or_else(|| self.store_err(StoreError::NotFound))?;
            return self.respond(StatusCode::OK, marked, &[]);
        }
        let deleted = self
            .app
            .store
            .delete(&self.key(), propagation)
            .ok_or_else(|| self.store_err(StoreError::NotFound))?;
        self.respond(StatusCode::OK, deleted, &[])
    }

    pub(super) fn delete_collection(&self) -> Result<Response, ApiError> {
        let (ls, fs) = self.selectors()?;
        let (propagation, dry, _) = self.propagation(&Bytes::new())?;
        let ns = (!self.ns.is_empty()).then_some(self.ns);
        let (items, rv) = self.app.store.list(&self.def.group, &self.def.plural, ns);
        let mut deleted = vec![];
        for obj in items.into_iter().filter(|o| ls.matches(o) && fs.matches(o)) {
            if dry {
                deleted.push(self.present(obj));
            } else if let Some(d) = self.app.store.delete(
                &Key::of(&self.def.group, &self.def.plural, &obj),
                propagation,
            ) {
                deleted.push(self.present(d));
            }
        }
        Ok(ok(&json!({
            "apiVersion": self.def.api_version(self.version),
            "kind": format!("{}List", self.def.kind),
            "metadata": {"resourceVersion": rv.to_string()},
            "items": deleted,
        })))
    }
}
