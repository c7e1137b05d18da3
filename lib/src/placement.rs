//! Where a VM may run: its node selector, tolerations, required node affinity, the spreading
//! of a pool's replicas (pod anti-affinity) and its priority class, as `create` and
//! `set placement` write them into the VM's pod-like spec (KubeVirt `spec.template.spec`,
//! Deckhouse `spec`: [`Fields`], given by `platform::Capabilities::placement`).
//!
//! `--spread-by KEY` is a *preferred* anti-affinity (weight 100) between the pods of one pool
//! (the label [`POOL_LABEL`]): the scheduler puts replicas in different topology domains
//! where it can, and still schedules them when there are fewer domains than replicas (a
//! required one would leave the extra replicas unschedulable).

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};
pub use crate::map_edit::MapEdit;
use crate::names::POOL_LABEL;

/// The taint effects a toleration names (`k8s.io/api/core/v1`, `TaintEffect`).
pub const EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// The short names `--spread-by` takes for the well-known topology labels
/// (`k8s.io/api/core/v1` `LabelHostname`, `LabelTopologyZone`, `LabelTopologyRegion`).
pub const TOPOLOGY_ALIASES: &[(&str, &str)] = &[
    ("hostname", "kubernetes.io/hostname"),
    ("zone", "topology.kubernetes.io/zone"),
    ("region", "topology.kubernetes.io/region"),
];

/// The weight of the preferred anti-affinity `--spread-by` writes (the most a term takes).
pub const SPREAD_WEIGHT: i64 = 100;

/// Where a platform keeps a VM's placement and what it calls pod (anti-)affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields {
    /// JSON pointer of the pod-like spec (`/spec/template/spec`, `/spec`).
    pub spec: &'static str,
    /// JSON pointer of the labels the VM's pod gets (where the pool label is).
    pub pod_labels: &'static str,
    /// The anti-affinity field under `affinity` (`podAntiAffinity`; Deckhouse
    /// `virtualMachineAndPodAntiAffinity`).
    pub anti_affinity: &'static str,
    /// The term field of a weighted term (`podAffinityTerm`; Deckhouse
    /// `virtualMachineAndPodAffinityTerm`).
    pub affinity_term: &'static str,
}

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

/// `--spread-by`: spread a pool's replicas over a topology, or stop spreading them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Spread {
    /// Prefer a different value of this node label (a topology key) for every replica.
    By(String),
    /// Remove the pool's anti-affinity (`--spread-by none`).
    Remove,
}

impl Spread {
    /// Parse a `--spread-by` value: an alias of [`TOPOLOGY_ALIASES`], a node label key, or
    /// `none` (remove).
    pub fn parse(text: &str) -> Result<Spread> {
        if text == "none" {
            return Ok(Spread::Remove);
        }
        if let Some((_, key)) = TOPOLOGY_ALIASES.iter().find(|(a, _)| *a == text) {
            return Ok(Spread::By((*key).to_owned()));
        }
        format!("{text}=")
            .parse::<crate::validate::Label>()
            .map_err(|e| {
                Error::InvalidTarget(format!(
                    "invalid --spread-by {text:?}: {e} (or use hostname, zone, region, none)"
                ))
            })?;
        Ok(Spread::By(text.to_owned()))
    }
}

/// What to change; empty / `None` leaves it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// Node selector edits.
    pub node_selector: Vec<MapEdit>,
    /// Toleration edits.
    pub tolerations: Vec<TolerationEdit>,
    /// Required node affinity edits: `key=value` (operator `In`; values of one key add up),
    /// `key-` removes the key's requirement.
    pub node_affinity: Vec<MapEdit>,
    /// Spreading of the VM's pool.
    pub spread: Option<Spread>,
    /// The priority class.
    pub priority_class: Option<String>,
}

impl Placement {
    /// Parse the flags' texts (before any request); an empty result is allowed.
    pub fn parse_flags(
        node_selector: &[String],
        tolerations: &[String],
        node_affinity: &[String],
        spread_by: Option<&str>,
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
            node_affinity: node_affinity
                .iter()
                .map(|t| MapEdit::parse_as(t, true, "--node-affinity"))
                .collect::<Result<_>>()?,
            spread: spread_by.map(Spread::parse).transpose()?,
            priority_class,
        };
        if let Some(name) = &placement.priority_class {
            crate::validate::dns_subdomain("priority class", name)
                .map_err(|e| Error::InvalidTarget(format!("invalid --priority-class: {e}")))?;
        }
        Ok(placement)
    }

    /// Whether nothing is asked.
    pub fn is_empty(&self) -> bool {
        *self == Placement::default()
    }

    /// Refuse the removing forms (`key-`, `--spread-by none`): a new VM has nothing to remove.
    pub fn refuse_removals(&self) -> Result<()> {
        let removal = self
            .node_selector
            .iter()
            .chain(&self.node_affinity)
            .find_map(|e| match e {
                MapEdit::Remove(k) => Some(format!("{k}-")),
                MapEdit::Set(..) => None,
            })
            .or_else(|| {
                self.tolerations.iter().find_map(|t| match t {
                    TolerationEdit::Remove(k) => Some(format!("{k}-")),
                    TolerationEdit::Add { .. } => None,
                })
            })
            .or_else(|| (self.spread == Some(Spread::Remove)).then(|| "none".to_owned()));
        match removal {
            Some(r) => Err(Error::InvalidTarget(format!(
                "{r:?} removes a placement setting, and a new VM has none: give KEY=VALUE (toleration KEY[=VALUE]:EFFECT, --spread-by KEY)"
            ))),
            None => Ok(()),
        }
    }

    /// Apply to `vm` (a VM object) at the platform's `fields`. The pool whose replicas
    /// `--spread-by` spreads is read from the VM's pod labels.
    pub fn edit(&self, fields: &Fields, vm: &mut Value) -> Result<()> {
        let pool = vm
            .pointer(fields.pod_labels)
            .and_then(|l| l.get(POOL_LABEL))
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let (Some(Spread::By(_)), None) = (&self.spread, &pool) {
            let name = vm
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            return Err(Error::Usage(format!(
                "--spread-by spreads the replicas of a pool, and VM {name:?} is in none (no {POOL_LABEL} label; create a pool with --replicas)"
            )));
        }
        let spec = object_at(vm, fields.spec);
        self.edit_spec(fields, spec, pool.as_deref());
        Ok(())
    }

    fn edit_spec(&self, fields: &Fields, spec: &mut Map<String, Value>, pool: Option<&str>) {
        if !self.node_selector.is_empty() {
            let map = child(spec, "nodeSelector");
            for e in &self.node_selector {
                e.apply(map);
            }
            prune(spec, "nodeSelector");
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
        if !self.node_affinity.is_empty() {
            let affinity = child(spec, "affinity");
            edit_node_affinity(child(affinity, "nodeAffinity"), &self.node_affinity);
            prune(affinity, "nodeAffinity");
            prune(spec, "affinity");
        }
        if let Some(spread) = &self.spread {
            let affinity = child(spec, "affinity");
            let anti = child(affinity, fields.anti_affinity);
            let preferred = "preferredDuringSchedulingIgnoredDuringExecution";
            let mut terms = anti
                .get(preferred)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            // The pool's own term is the one selecting on the pool label.
            terms.retain(|t| {
                t.pointer(&format!(
                    "/{}/labelSelector/matchLabels",
                    fields.affinity_term
                ))
                .and_then(|m| m.get(POOL_LABEL))
                .is_none()
            });
            if let (Spread::By(key), Some(pool)) = (spread, pool) {
                terms.push(json!({
                    "weight": SPREAD_WEIGHT,
                    fields.affinity_term: {
                        "labelSelector": {"matchLabels": {POOL_LABEL: pool}},
                        "topologyKey": key,
                    },
                }));
            }
            if terms.is_empty() {
                anti.remove(preferred);
            } else {
                anti.insert(preferred.into(), Value::Array(terms));
            }
            prune(affinity, fields.anti_affinity);
            prune(spec, "affinity");
        }
        if let Some(p) = &self.priority_class {
            spec.insert("priorityClassName".into(), json!(p));
        }
    }
}

/// The required node affinity's first term: one `In` expression per key.
fn edit_node_affinity(node_affinity: &mut Map<String, Value>, edits: &[MapEdit]) {
    let required = child(
        node_affinity,
        "requiredDuringSchedulingIgnoredDuringExecution",
    );
    let mut terms = required
        .get("nodeSelectorTerms")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if terms.is_empty() {
        terms.push(json!({}));
    }
    let mut exprs = terms[0]
        .get("matchExpressions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // Values given for one key in one command are one requirement (`In` any of them).
    let mut fresh: Vec<String> = Vec::new();
    for e in edits {
        match e {
            MapEdit::Remove(k) => exprs.retain(|x| x["key"] != json!(k)),
            MapEdit::Set(k, v) => {
                if !fresh.contains(k) {
                    exprs.retain(|x| x["key"] != json!(k));
                    exprs.push(json!({"key": k, "operator": "In", "values": []}));
                    fresh.push(k.clone());
                }
                let x = exprs
                    .iter_mut()
                    .find(|x| x["key"] == json!(k))
                    .expect("pushed above");
                if let Some(values) = x["values"].as_array_mut()
                    && !values.contains(&json!(v))
                {
                    values.push(json!(v));
                }
            }
        }
    }
    if exprs.is_empty() {
        if let Some(t) = terms[0].as_object_mut() {
            t.remove("matchExpressions");
        }
    } else {
        terms[0]["matchExpressions"] = Value::Array(exprs);
    }
    terms.retain(|t| t.as_object().is_some_and(|m| !m.is_empty()));
    if terms.is_empty() {
        required.remove("nodeSelectorTerms");
    } else {
        required.insert("nodeSelectorTerms".into(), Value::Array(terms));
    }
    prune(
        node_affinity,
        "requiredDuringSchedulingIgnoredDuringExecution",
    );
}

/// The object under `key` of `map`, made `{}` when absent or not an object.
fn child<'a>(map: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let v = map
        .entry(key.to_owned())
        .or_insert_with(|| Value::Object(Map::new()));
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    v.as_object_mut().expect("object")
}

/// Drop `key` of `map` when it is an empty object.
fn prune(map: &mut Map<String, Value>, key: &str) {
    if map
        .get(key)
        .and_then(Value::as_object)
        .is_some_and(Map::is_empty)
    {
        map.remove(key);
    }
}

/// The object at `pointer` inside `vm`, created (as `{}`) along the way.
pub(crate) fn object_at<'a>(vm: &'a mut Value, pointer: &str) -> &'a mut Map<String, Value> {
    let mut at = vm;
    for part in pointer.split('/').filter(|p| !p.is_empty()) {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        at = at
            .as_object_mut()
            .expect("object")
            .entry(part.to_owned())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    if !at.is_object() {
        *at = Value::Object(Map::new());
    }
    at.as_object_mut().expect("object")
}

/// A VM's placement as `get` shows it: one `(what, value)` line each, from its pod-like spec.
pub fn summary(fields: &Fields, vm: &Value) -> Vec<(&'static str, String)> {
    let Some(spec) = vm.pointer(fields.spec) else {
        return vec![];
    };
    let mut out = Vec::new();
    if let Some(sel) = spec.get("nodeSelector").and_then(Value::as_object)
        && !sel.is_empty()
    {
        let pairs: Vec<String> = sel
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect();
        out.push(("Node selector", pairs.join(",")));
    }
    if let Some(list) = spec.get("tolerations").and_then(Value::as_array)
        && !list.is_empty()
    {
        let shown: Vec<String> = list.iter().map(toleration_text).collect();
        out.push(("Tolerations", shown.join(",")));
    }
    let affinity = spec.get("affinity");
    let required = affinity
        .and_then(|a| {
            a.pointer(
                "/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms",
            )
        })
        .and_then(Value::as_array);
    if let Some(terms) = required
        && !terms.is_empty()
    {
        let shown: Vec<String> = terms
            .iter()
            .map(|t| {
                t["matchExpressions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(expression_text)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();
        out.push(("Node affinity", shown.join(" or ")));
    }
    for (kind, label) in [
        (
            "preferredDuringSchedulingIgnoredDuringExecution",
            "preferred",
        ),
        ("requiredDuringSchedulingIgnoredDuringExecution", "required"),
    ] {
        let terms = affinity
            .and_then(|a| a.get(fields.anti_affinity))
            .and_then(|a| a.get(kind))
            .and_then(Value::as_array);
        for t in terms.into_iter().flatten() {
            let term = t.get(fields.affinity_term).unwrap_or(t);
            let selector = term
                .pointer("/labelSelector/matchLabels")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            out.push((
                "Anti-affinity",
                format!(
                    "{label}: apart from {selector} by {}",
                    term["topologyKey"].as_str().unwrap_or("?")
                ),
            ));
        }
    }
    if let Some(p) = spec.get("priorityClassName").and_then(Value::as_str) {
        out.push(("Priority class", p.to_owned()));
    }
    out
}

fn toleration_text(t: &Value) -> String {
    let s = |k: &str| t[k].as_str().unwrap_or_default();
    let mut text = s("key").to_owned();
    if s("operator") != "Exists" && !s("value").is_empty() {
        text = format!("{text}={}", s("value"));
    }
    if !s("effect").is_empty() {
        text = format!("{text}:{}", s("effect"));
    }
    if text.is_empty() {
        text = "(every taint)".into();
    }
    text
}

fn expression_text(x: &Value) -> String {
    let values: Vec<&str> = x["values"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    match x["operator"].as_str().unwrap_or("") {
        "In" => format!(
            "{} in ({})",
            x["key"].as_str().unwrap_or(""),
            values.join(" ")
        ),
        op => format!(
            "{} {op} ({})",
            x["key"].as_str().unwrap_or(""),
            values.join(" ")
        ),
    }
}

#[cfg(test)]
mod tests;
