//! `key=value` / `key-` edits of a label, annotation or node selector map (the shape of
//! `kubectl label`), shared by `set policy`, `set placement` and `create`'s placement flags.

use serde_json::Value;

use crate::error::{Error, Result};

/// One edit of a label or annotation map: `key=value` sets, `key-` removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapEdit {
    /// Set `key` to `value`.
    Set(String, String),
    /// Remove `key`.
    Remove(String),
}

impl MapEdit {
    /// Parse `key=value` or `key-` as a label (`label: true`: the value must be a label
    /// value) or an annotation (any value). The error is a usage error.
    pub fn parse(text: &str, label: bool) -> Result<MapEdit> {
        Self::parse_as(text, label, if label { "--label" } else { "--annotation" })
    }

    /// [`MapEdit::parse`] for flag `what` (`--node-selector`: a label map too).
    pub fn parse_as(text: &str, label: bool, what: &str) -> Result<MapEdit> {
        if let Some(key) = text.strip_suffix('-')
            && !text.contains('=')
        {
            check_key(what, text, key)?;
            return Ok(MapEdit::Remove(key.to_owned()));
        }
        let Some((key, value)) = text.split_once('=') else {
            return Err(Error::InvalidTarget(format!(
                "invalid {what} {text:?}: use key=value to set or key- to remove"
            )));
        };
        if label {
            text.parse::<crate::validate::Label>()
                .map_err(|e| Error::InvalidTarget(format!("invalid {what}: {e}")))?;
        } else {
            check_key(what, text, key)?;
        }
        Ok(MapEdit::Set(key.to_owned(), value.to_owned()))
    }

    pub(crate) fn apply(&self, map: &mut serde_json::Map<String, Value>) {
        match self {
            MapEdit::Set(k, v) => {
                map.insert(k.clone(), Value::String(v.clone()));
            }
            MapEdit::Remove(k) => {
                map.remove(k);
            }
        }
    }
}

/// A label or annotation key: `[prefix/]name`, checked as Kubernetes does.
fn check_key(what: &str, text: &str, key: &str) -> Result<()> {
    format!("{key}=")
        .parse::<crate::validate::Label>()
        .map(|_| ())
        .map_err(|e| Error::InvalidTarget(format!("invalid {what} {text:?}: {e}")))
}
