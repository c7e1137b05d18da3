//! Chunked lists (`limit` / `continue`), as k8s.io/apiserver's etcd3 store serves them
//! (staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go `GetList`, continue tokens from
//! pkg/storage/continue.go): items in key order (`namespace/name`), at most `limit` of them
//! after selectors are applied, `metadata.continue` to resume after the last one and
//! `metadata.remainingItemCount`. The token is base64url (no padding) of
//! `{"v":"meta.k8s.io/v1","rv":RV,"start":"KEY\u0000"}`; the rest of a chunked list is
//! served at the first chunk's resourceVersion, and a token whose resourceVersion was
//! compacted is answered with 410 Expired.
//!
//! Difference: pages after the first show the store as it is now (the real server reads etcd
//! at the token's revision); objects changed in between appear in their new state.

use crate::core::status::ApiError;
use crate::core::util::meta_str;
use base64::Engine;
use serde_json::{Value, json};

/// The message of the real server's 410 for a compacted continue token.
pub const EXPIRED_CONTINUE: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// One chunk of a list.
#[derive(Debug)]
pub struct Page<'a> {
    /// The items of this chunk (still in the store: the caller copies what it serves).
    pub items: Vec<&'a Value>,
    /// The list's resourceVersion (the first chunk's).
    pub resource_version: u64,
    /// Token for the next chunk, if any.
    pub continue_token: Option<String>,
    /// How many items follow this chunk.
    pub remaining: Option<u64>,
}

fn key(obj: &Value) -> String {
    let ns = meta_str(obj, "namespace");
    let name = meta_str(obj, "name");
    if ns.is_empty() {
        name.to_string()
    } else {
        format!("{ns}/{name}")
    }
}

fn encode(rv: u64, start: &str) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{start}\u{0}")});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

/// Decodes a continue token into (resourceVersion, start key).
fn decode(token: &str) -> Result<(u64, String), ApiError> {
    let invalid = |why: &str| ApiError::bad_request(format!("continue key is not valid: {why}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| invalid("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
    let v: Value = serde_json::from_slice(&raw).map_err(|e| invalid(&e.to_string()))?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(invalid("server does not recognize this encoded key"));
    }
    let rv = v["rv"]
        .as_u64()
        .ok_or_else(|| invalid("incorrect encoded start resourceVersion"))?;
    let start = v["start"]
        .as_str()
        .unwrap_or_default()
        .trim_end_matches('\0')
        .to_string();
    Ok((rv, start))
}

/// Cuts one chunk from `items` (already filtered, in key order) as the request's
/// `limit`/`continue` ask. `current_rv` is the store's resourceVersion, `compacted` the oldest
/// one it can still serve.
pub fn page<'a>(
    items: Vec<&'a Value>,
    q: &crate::core::handlers::Query,
    current_rv: u64,
    compacted: u64,
) -> Result<Page<'a>, ApiError> {
    let limit = match q.get("limit").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        ),
    };
    // etcd's order: the key string `namespace/name` ("a-b/x" before "a/x").
    let mut items = items;
    items.sort_by_cached_key(|o| key(o));
    let (rv, items) = match q
        .get("continue")
        .map(String::as_str)
        .filter(|c| !c.is_empty())
    {
        None => (current_rv, items),
        Some(token) => {
            let (rv, start) = decode(token)?;
            if rv < compacted {
                return Err(ApiError::gone(EXPIRED_CONTINUE));
            }
            // Keys sort like etcd's: namespace, then name.
            let rest = items
                .into_iter()
                .filter(|o| key(o).as_str() > start.as_str())
                .collect();
            (rv, rest)
        }
    };
    let Some(limit) = limit.filter(|l| *l < items.len()) else {
        return Ok(Page {
            items,
            resource_version: rv,
            continue_token: None,
            remaining: None,
        });
    };
    let remaining = (items.len() - limit) as u64;
    let mut items = items;
    items.truncate(limit);
    let last = items.last().map(|o| key(o)).unwrap_or_default();
    Ok(Page {
        items,
        resource_version: rv,
        continue_token: Some(encode(rv, &last)),
        remaining: Some(remaining),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objs(n: usize) -> Vec<Value> {
        (0..n)
            .map(|i| json!({"metadata": {"namespace": "ns", "name": format!("vm-{i:02}")}}))
            .collect()
    }

    fn q(pairs: &[(&str, &str)]) -> crate::core::handlers::Query {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn chunks_follow_each_other() {
        let five = objs(5);
        let first = page(five.iter().collect(), &q(&[("limit", "2")]), 1500, 1000).unwrap();
        assert_eq!(first.items.len(), 2);
        assert_eq!(first.remaining, Some(3));
        let token = first.continue_token.unwrap();
        // The token is the real server's encoding of {"v","rv","start"}.
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&token)
            .unwrap();
        assert_eq!(
            String::from_utf8(raw).unwrap(),
            r#"{"rv":1500,"start":"ns/vm-01\u0000","v":"meta.k8s.io/v1"}"#
        );
        let second = page(
            five.iter().collect(),
            &q(&[("limit", "2"), ("continue", &token)]),
            1600,
            1000,
        )
        .unwrap();
        assert_eq!(second.resource_version, 1500);
        assert_eq!(second.items[0]["metadata"]["name"], "vm-02");
        let third = page(
            five.iter().collect(),
            &q(&[
                ("limit", "2"),
                ("continue", &second.continue_token.unwrap()),
            ]),
            1600,
            1000,
        )
        .unwrap();
        assert_eq!(third.items.len(), 1);
        assert_eq!((third.continue_token, third.remaining), (None, None));
    }

    #[test]
    fn keys_sort_like_etcd_so_no_page_loses_items() {
        let items: Vec<Value> = ["a", "a-b"]
            .iter()
            .map(|ns| json!({"metadata": {"namespace": ns, "name": "x"}}))
            .collect();
        let first = page(items.iter().collect(), &q(&[("limit", "1")]), 10, 1).unwrap();
        assert_eq!(first.items[0]["metadata"]["namespace"], "a-b");
        let token = first.continue_token.unwrap();
        let second = page(
            items.iter().collect(),
            &q(&[("limit", "1"), ("continue", &token)]),
            10,
            1,
        )
        .unwrap();
        assert_eq!(second.items[0]["metadata"]["namespace"], "a");
    }

    #[test]
    fn compacted_token_is_gone() {
        let (five, one) = (objs(5), objs(1));
        let first = page(five.iter().collect(), &q(&[("limit", "2")]), 1500, 1000).unwrap();
        let e = page(
            five.iter().collect(),
            &q(&[("continue", &first.continue_token.unwrap())]),
            1700,
            1600,
        )
        .unwrap_err();
        assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
        assert!(page(one.iter().collect(), &q(&[("continue", "!!")]), 1, 1).is_err());
    }
}
