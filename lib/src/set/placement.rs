//! `set placement`: where a VM may run: its node selector, tolerations and priority class
//! (KubeVirt: in `spec.template.spec`; Deckhouse: in `spec`). A running VM whose placement
//! changed is moved by a live migration on both platforms (KubeVirt under the LiveUpdate
//! rollout strategy: `pkg/virt-controller/watch/vm/vm.go`, `handleAffinityChangeRequest` and
//! `handleTolerationsChangeRequest` copy them to the VMI, whose `NodePlacementNotMatched`
//! condition the workload updater migrates; Deckhouse: "Live VM migration on a placement
//! parameter change" in its virtualization user guide). The priority class is not live on
//! either: KubeVirt sets `RestartRequired`.

use serde_json::{Value, json};

use super::policy::MapEdit;
use super::{Change, SetPlatform, object_at};
use crate::error::{Error, Result};

/// The taint effects a toleration names (`k8s.io/api/core/v1`, `TaintEffect`).
pub const EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// One edit of the tolerations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TolerationEdit {
    /// Tolerate taint `key` (with `value`: operator Equal; without: Exists) of `effect`;
    /// replaces a toleration of the same key and effect.
    Add {
        /// Taint key.
        key: String,
        /// Taint value (None: operator Exists).
        value: Option<String>,
        /// Taint effect.
        effect: String,
    },
    /// Remove every toleration of `key`.
    Remove(String),
}

fn bad(text: &str, why: &str) -> Error {
    Error::InvalidTarget(format!("invalid --toleration {text:?}: {why}"))
}

impl TolerationEdit {
    /// Parse `key[=value]:Effect` or `key-`, checked as Kubernetes validates a toleration
    /// (the key a label key, the value a label value, the effect one of [`EFFECTS`]).
    pub fn parse(text: &str) -> Result<TolerationEdit> {
        let label = |key: &str, value: &str| {
            format!("{key}={value}")
                .parse::<crate::validate::Label>()
                .map_err(|e| bad(text, &e.to_string()))
        };
        if let Some(key) = text.strip_suffix('-')
            && !text.contains(['=', ':'])
        {
            label(key, "")?;
            return Ok(TolerationEdit::Remove(key.to_owned()));
        }
        let Some((taint, effect)) = text.rsplit_once(':') else {
            return Err(bad(text, "use key[=value]:Effect to add or key- to remove"));
        };
        if !EFFECTS.contains(&effect) {
            return Err(bad(
                text,
                &format!("the effect must be one of {}", EFFECTS.join(", ")),
            ));
        }
        let (key, value) = match taint.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (taint, None),
        };
        label(key, value.unwrap_or(""))?;
        Ok(TolerationEdit::Add {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
        })
    }

    fn apply(&self, list: &mut Vec<Value>) {
        match self {
            TolerationEdit::Remove(key) => list.retain(|t| t["key"] != json!(key)),
            TolerationEdit::Add { key, value, effect } => {
                list.retain(|t| !(t["key"] == json!(key) && t["effect"] == json!(effect)));
                let mut t = json!({"key": key, "effect": effect});
                match value {
                    Some(v) => {
                        t["operator"] = json!("Equal");
                        t["value"] = json!(v);
                    }
                    None => t["operator"] = json!("Exists"),
                }
                list.push(t);
            }
        }
    }
}

/// What to change; empty / `None` leaves it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// Node selector edits.
    pub node_selector: Vec<MapEdit>,
    /// Toleration edits.
    pub tolerations: Vec<TolerationEdit>,
    /// The priority class.
    pub priority_class: Option<String>,
}

impl Placement {
    /// Parse the flags' texts (before any request).
    pub fn parse(
        node_selector: &[String],
        tolerations: &[String],
        priority_class: Option<String>,
    ) -> Result<Placement> {
        let placement = Placement {
            node_selector: node_selector
                .iter()
                .map(|t| MapEdit::parse_as(t, true, "--node-selector"))
                .collect::<Result<_>>()?,
            tolerations: tolerations
                .iter()
                .map(|t| TolerationEdit::parse(t))
                .collect::<Result<_>>()?,
            priority_class,
        };
        placement.validate()?;
        Ok(placement)
    }

    /// Refuse an empty request and a bad priority class name.
    pub fn validate(&self) -> Result<()> {
        if *self == Placement::default() {
            return Err(Error::InvalidTarget(
                "nothing to change: give --node-selector, --toleration or --priority-class".into(),
            ));
        }
        if let Some(name) = &self.priority_class {
            crate::validate::dns_subdomain("priority class", name)
                .map_err(|e| Error::InvalidTarget(format!("invalid --priority-class: {e}")))?;
        }
        Ok(())
    }

    /// Apply to the pod-spec-like object `spec` (KubeVirt's template spec, Deckhouse's spec).
    pub(crate) fn edit(&self, spec: &mut serde_json::Map<String, Value>) {
        if !self.node_selector.is_empty() {
            let map = spec
                .entry("nodeSelector")
                .or_insert_with(|| Value::Object(Default::default()));
            if !map.is_object() {
                *map = Value::Object(Default::default());
            }
            let map = map.as_object_mut().expect("object");
            for e in &self.node_selector {
                e.apply(map);
            }
            if map.is_empty() {
                spec.remove("nodeSelector");
            }
        }
        if !self.tolerations.is_empty() {
            let mut list = spec
                .get("tolerations")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for e in &self.tolerations {
                e.apply(&mut list);
            }
            if list.is_empty() {
                spec.remove("tolerations");
            } else {
                spec.insert("tolerations".into(), Value::Array(list));
            }
        }
        if let Some(p) = &self.priority_class {
            spec.insert("priorityClassName".into(), json!(p));
        }
    }
}

impl Change for Placement {
    fn check(&self, _platform: &dyn SetPlatform) -> Result<()> {
        self.validate()
    }

    fn apply(&self, platform: &dyn SetPlatform, vm: &mut Value) -> Result<()> {
        self.edit(object_at(vm, platform.placement_pointer()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerations_parse_like_kubectl_taint() {
        assert_eq!(
            TolerationEdit::parse("gpu=true:NoSchedule").unwrap(),
            TolerationEdit::Add {
                key: "gpu".into(),
                value: Some("true".into()),
                effect: "NoSchedule".into()
            }
        );
        assert_eq!(
            TolerationEdit::parse("example.com/dedicated:NoExecute").unwrap(),
            TolerationEdit::Add {
                key: "example.com/dedicated".into(),
                value: None,
                effect: "NoExecute".into()
            }
        );
        assert_eq!(
            TolerationEdit::parse("gpu-").unwrap(),
            TolerationEdit::Remove("gpu".into())
        );
        for bad in [
            "gpu",
            "gpu=true:NoRun",
            "gpu=true",
            "bad key:NoSchedule",
            "gpu=no way:NoSchedule",
            ":NoSchedule",
        ] {
            assert!(TolerationEdit::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn edit_sets_replaces_and_removes() {
        let p = Placement::parse(
            &["disk=ssd".into(), "zone-".into()],
            &[
                "gpu=a:NoSchedule".into(),
                "old-".into(),
                "gpu=b:NoSchedule".into(),
            ],
            Some("high".into()),
        )
        .unwrap();
        let mut spec = json!({"nodeSelector": {"zone": "a"}, "tolerations": [{"key": "old", "operator": "Exists"}]});
        p.edit(spec.as_object_mut().unwrap());
        assert_eq!(
            spec,
            json!({"nodeSelector": {"disk": "ssd"}, "priorityClassName": "high",
                "tolerations": [{"key": "gpu", "operator": "Equal", "value": "b", "effect": "NoSchedule"}]})
        );
        assert!(Placement::parse(&[], &[], None).is_err());
        assert!(Placement::parse(&["a=b c".into()], &[], None).is_err());
        assert!(Placement::parse(&[], &[], Some("Not_Valid".into())).is_err());
    }
}
