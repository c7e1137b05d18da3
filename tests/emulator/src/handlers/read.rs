//! GET of one object and list (selectors, paging, tables).

use super::{Ctx, ok, wants_table};
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::table::{self, IncludeObject};
use axum::response::Response;
use http::StatusCode;
use serde_json::{Value, json};

impl Ctx<'_> {
    pub(super) fn get(&self) -> Result<Response, ApiError> {
        let obj = self.current()?;
        self.respond(StatusCode::OK, obj, &[])
    }

    pub(super) fn selectors(&self) -> Result<(LabelSelector, FieldSelector), ApiError> {
        let ls = LabelSelector::parse(
            self.q
                .get("labelSelector")
                .map(String::as_str)
                .unwrap_or(""),
        )?;
        let fs = FieldSelector::parse(
            self.q
                .get("fieldSelector")
                .map(String::as_str)
                .unwrap_or(""),
        )?;
        Ok((ls, fs))
    }

    pub(super) fn list(&self) -> Result<Response, ApiError> {
        let (ls, fs) = self.selectors()?;
        let ns = (!self.ns.is_empty()).then_some(self.ns);
        let page = self.app.store.with_kind(
            &self.def.group,
            &self.def.plural,
            ns,
            |items, rv, compacted| {
                let items = items
                    .into_iter()
                    .filter(|o| ls.matches(o) && fs.matches(o))
                    .collect();
                crate::paging::page(items, self.q, rv, compacted)
            },
        )?;
        let (rv, items) = (page.resource_version, page.items);
        let items: Vec<Value> = items.into_iter().map(|o| self.present(o)).collect();
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some(token) = page.continue_token {
            meta["continue"] = json!(token);
        }
        if let Some(n) = page.remaining {
            meta["remainingItemCount"] = json!(n);
        }
        if wants_table(self.headers) {
            let include = IncludeObject::parse(self.q.get("includeObject").map(String::as_str));
            let mut t = table::table(self.def, &items, Some(rv), include);
            t["metadata"] = meta;
            return Ok(ok(&t));
        }
        Ok(ok(&json!({
            "apiVersion": self.def.api_version(self.version),
            "kind": format!("{}List", self.def.kind),
            "metadata": meta,
            "items": items,
        })))
    }
}
