//! `set policy`: how a VM runs and moves (KubeVirt `spec.runStrategy` and the template's
//! `evictionStrategy`; Deckhouse `spec.runPolicy` and `spec.liveMigrationPolicy`), its
//! termination grace period, and labels and annotations on the VM or its template.

use serde_json::Value;

pub use crate::map_edit::MapEdit;

use super::{Change, SetPlatform};
use crate::error::{Error, Result};

/// What to change; `None` / empty leaves it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// KubeVirt run strategy / Deckhouse run policy.
    pub run_strategy: Option<String>,
    /// KubeVirt eviction strategy / Deckhouse live migration policy.
    pub eviction: Option<String>,
    /// Termination grace period, seconds.
    pub grace_period: Option<i64>,
    /// Label edits.
    pub labels: Vec<MapEdit>,
    /// Annotation edits.
    pub annotations: Vec<MapEdit>,
    /// Edit the labels and annotations of the template (what the VM's instance gets) instead
    /// of the VM's own.
    pub template: bool,
}

impl Policy {
    /// Refuse an empty request (before any request).
    pub fn validate(&self) -> Result<()> {
        if self.run_strategy.is_none()
            && self.eviction.is_none()
            && self.grace_period.is_none()
            && self.labels.is_empty()
            && self.annotations.is_empty()
        {
            return Err(Error::InvalidTarget(
                "nothing to change: give --run-strategy, --eviction-strategy, --grace-period, --label or --annotation".into(),
            ));
        }
        if self.grace_period.is_some_and(|g| g < 0) {
            return Err(Error::InvalidTarget(
                "--grace-period must be 0 or more seconds".into(),
            ));
        }
        if self.template && self.labels.is_empty() && self.annotations.is_empty() {
            return Err(Error::InvalidTarget(
                "--template applies to --label and --annotation; give one".into(),
            ));
        }
        Ok(())
    }

    /// Apply the label and annotation edits to the metadata object `meta`.
    pub(crate) fn edit_metadata(&self, meta: &mut serde_json::Map<String, Value>) {
        for (field, edits) in [("labels", &self.labels), ("annotations", &self.annotations)] {
            if edits.is_empty() {
                continue;
            }
            let map = meta
                .entry(field)
                .or_insert_with(|| Value::Object(Default::default()));
            if !map.is_object() {
                *map = Value::Object(Default::default());
            }
            let map = map.as_object_mut().expect("object");
            for e in edits {
                e.apply(map);
            }
            if map.is_empty() {
                meta.remove(field);
            }
        }
    }
}

/// `value` must be one of `allowed`; the error names them.
pub(crate) fn one_of(flag: &str, value: &str, allowed: &[&str], platform: &str) -> Result<()> {
    if allowed.contains(&value) {
        Ok(())
    } else {
        Err(Error::InvalidTarget(format!(
            "invalid {flag} {value:?} on {platform}: use one of {}",
            allowed.join(", ")
        )))
    }
}

impl Change for Policy {
    fn check(&self, platform: &dyn SetPlatform) -> Result<()> {
        self.validate()?;
        platform.check_policy(self)
    }

    fn apply(&self, platform: &dyn SetPlatform, vm: &mut Value) -> Result<()> {
        platform.policy(self, vm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn edits_parse_like_kubectl_label() {
        assert_eq!(
            MapEdit::parse("team=web", true).unwrap(),
            MapEdit::Set("team".into(), "web".into())
        );
        assert_eq!(
            MapEdit::parse("example.com/team-", true).unwrap(),
            MapEdit::Remove("example.com/team".into())
        );
        assert!(MapEdit::parse("team", true).is_err());
        assert!(MapEdit::parse("bad key=x", true).is_err());
        assert!(MapEdit::parse("team=not valid!", true).is_err());
        // Annotation values are free text.
        assert!(MapEdit::parse("note=any text, really", false).is_ok());
    }

    #[test]
    fn metadata_edits_set_and_remove() {
        let p = Policy {
            labels: vec![
                MapEdit::Set("a".into(), "1".into()),
                MapEdit::Remove("b".into()),
            ],
            ..Default::default()
        };
        let mut meta = json!({"labels": {"b": "2"}});
        p.edit_metadata(meta.as_object_mut().unwrap());
        assert_eq!(meta, json!({"labels": {"a": "1"}}));
    }
}
