//! `labelSelector` and `fieldSelector` query parameters.

use crate::core::status::ApiError;
use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq)]
pub enum LabelReq {
    /// `k=v`, `k==v`.
    Eq(String, String),
    /// `k!=v` (also true when the label is absent).
    NotEq(String, String),
    /// `k in (a,b)`.
    In(String, Vec<String>),
    /// `k notin (a,b)` (also true when absent).
    NotIn(String, Vec<String>),
    /// `k`.
    Exists(String),
    /// `!k`.
    NotExists(String),
}

/// A parsed label selector (all requirements must hold).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(pub Vec<LabelReq>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (vec![], String::new(), 0);
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn set_values(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (f,g),!h`.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let bad = |t: &str| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{t}', expected: identifier"
            ))
        };
        let mut reqs = vec![];
        for term in split_top(s) {
            let req = if let Some(k) = term.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = term.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), set_values(v).ok_or_else(|| bad(&term))?)
            } else if let Some((k, v)) = term.split_once(" in ") {
                LabelReq::In(k.trim().into(), set_values(v).ok_or_else(|| bad(&term))?)
            } else if term.contains(' ') || term.contains('(') {
                return Err(bad(&term));
            } else {
                LabelReq::Exists(term.clone())
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether an object's labels satisfy the selector.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector: `(path, equals?, value)` terms, all must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `metadata.name=web,status.phase!=Running`.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut terms = vec![];
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (path, eq, value) = if let Some((k, v)) = term.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = term.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = term.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                )));
            };
            terms.push((path.trim().to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(terms))
    }

    /// The name this selector pins (`metadata.name=x`), if any.
    pub fn name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(p, eq, _)| p == "metadata.name" && *eq)
            .map(|(_, _, v)| v.as_str())
    }

    /// Whether an object matches; a missing field compares as "".
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let got = match crate::core::util::get_path(obj, path) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (got == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "front"}}});
        let ok = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(ok("app=web"));
        assert!(ok("app==web,tier"));
        assert!(ok("app in (db, web)"));
        assert!(!ok("app notin (web)"));
        assert!(ok("env notin (prod)"));
        assert!(ok("!env"));
        assert!(!ok("!app"));
        assert!(ok("app!=db"));
        assert!(!ok("app=web,tier=back"));
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "web", "namespace": "dev"}, "spec": {"vmiName": "x"}, "status": {"phase": "Running"}});
        let ok = |s: &str| FieldSelector::parse(s).unwrap().matches(&o);
        assert!(ok("metadata.name=web"));
        assert!(ok("metadata.namespace==dev,status.phase!=Failed"));
        assert!(ok("spec.vmiName=x"));
        assert!(!ok("status.phase=Pending"));
        assert!(ok("involvedObject.name="));
        assert_eq!(
            FieldSelector::parse("metadata.name=web").unwrap().name(),
            Some("web")
        );
    }
}
