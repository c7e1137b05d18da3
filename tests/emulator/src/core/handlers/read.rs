//! GET of one object and list (selectors, paging, tables).

use super::{Ctx, ok, wants_table};
use crate::core::selector::{FieldSelector, LabelSelector};
use crate::core::status::ApiError;
use crate::core::table::{self, IncludeObject};
use axum::response::Response;
use http::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};
use std::sync::Arc;

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
        let schema = self.def.schema.for_version(self.version);
        let page = self.app.store.with_kind(
            &self.def.group,
            &self.def.plural,
            ns,
            |items, rv, compacted| {
                let items = items
                    .into_iter()
                    .filter(|o| ls.matches(o) && fs.matches(o))
                    .collect();
                let page = crate::core::paging::page(items, self.q, rv, compacted)?;
                // Served from the decoded copies, as the watch cache serves lists.
                let items: Vec<Arc<Value>> = page
                    .items
                    .iter()
                    .map(|o| self.present_cached(schema.as_ref(), o))
                    .collect();
                Ok::<_, ApiError>((
                    items,
                    page.resource_version,
                    page.continue_token,
                    page.remaining,
                ))
            },
        )?;
        let (items, rv, continue_token, remaining) = page;
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some(token) = continue_token {
            meta["continue"] = json!(token);
        }
        if let Some(n) = remaining {
            meta["remainingItemCount"] = json!(n);
        }
        if wants_table(self.headers) {
            let include = IncludeObject::parse(self.q.get("includeObject").map(String::as_str));
            let mut t = table::table(self.def, &items, Some(rv), include);
            t["metadata"] = meta;
            return Ok(ok(&t));
        }
        let list = ListBody {
            api_version: self.def.api_version(self.version),
            kind: format!("{}List", self.def.kind),
            metadata: meta,
            items: items.iter().map(|o| o.as_ref()).collect(),
        };
        Ok(super::bytes_response(
            StatusCode::OK,
            serde_json::to_vec(&list).unwrap_or_default(),
        ))
    }
}

/// A list response, serialized straight from the decoded objects (no copy of the items).
#[derive(Serialize)]
struct ListBody<'a> {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: Value,
    items: Vec<&'a Value>,
}
