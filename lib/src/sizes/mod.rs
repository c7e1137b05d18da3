//! Sizes to create VMs from, as lists: KubeVirt instance types and preferences
//! (`instancetype.kubevirt.io/v1beta1`, cluster-wide and namespaced) and Deckhouse
//! VirtualMachineClasses (their sizing policies, core fractions, and the default class, marked
//! by the annotation `virtualmachineclass.virtualization.deckhouse.io/is-default-class: "true"`,
//! FACTS §11). Each kind exists on one platform only; the other is told where its sizes live.

use serde_json::Value;

use crate::api::{Kind, VIRTUAL_MACHINE_CLASS};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Flavor;
use crate::image::{pages, quantity_text, text};

/// VirtualMachineInstancetype (namespaced).
pub const INSTANCETYPE: Kind = Kind {
    group: "instancetype.kubevirt.io",
    version: "v1beta1",
    kind: "VirtualMachineInstancetype",
    plural: "virtualmachineinstancetypes",
    namespaced: true,
};

/// VirtualMachineClusterInstancetype.
pub const CLUSTER_INSTANCETYPE: Kind = Kind {
    group: "instancetype.kubevirt.io",
    version: "v1beta1",
    kind: "VirtualMachineClusterInstancetype",
    plural: "virtualmachineclusterinstancetypes",
    namespaced: false,
};

/// VirtualMachinePreference (namespaced).
pub const PREFERENCE: Kind = Kind {
    group: "instancetype.kubevirt.io",
    version: "v1beta1",
    kind: "VirtualMachinePreference",
    plural: "virtualmachinepreferences",
    namespaced: true,
};

/// VirtualMachineClusterPreference.
pub const CLUSTER_PREFERENCE: Kind = Kind {
    group: "instancetype.kubevirt.io",
    version: "v1beta1",
    kind: "VirtualMachineClusterPreference",
    plural: "virtualmachineclusterpreferences",
    namespaced: false,
};

/// The annotation marking Deckhouse's default VirtualMachineClass.
pub const DEFAULT_CLASS_ANNOTATION: &str =
    "virtualmachineclass.virtualization.deckhouse.io/is-default-class";

/// One listed size: an instance type, a preference or a class.
#[derive(Debug, Clone, PartialEq)]
pub struct Size {
    /// Its kind (for `-o name` and the KIND column).
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// Its namespace ("" for cluster-wide ones).
    pub namespace: String,
    /// Instance type: guest CPUs; class: its CPU model type.
    pub cpu: String,
    /// Instance type: guest memory.
    pub memory: String,
    /// Preference: what it sets (`devices.preferredDiskBus=virtio`, …); class: its sizing
    /// policies (`cores 1-4: memory 1Gi-8Gi, fractions 5%,10%`).
    pub sets: Vec<String>,
    /// Class: whether it is the default.
    pub default: bool,
    /// Class: its phase.
    pub phase: String,
    /// `metadata.creationTimestamp`.
    pub created: String,
    /// The object (for `-o yaml|json`).
    pub object: Value,
}

fn size(kind: Kind, obj: &Value) -> Size {
    Size {
        kind,
        name: text(obj, "/metadata/name").to_owned(),
        namespace: text(obj, "/metadata/namespace").to_owned(),
        cpu: String::new(),
        memory: String::new(),
        sets: Vec::new(),
        default: false,
        phase: String::new(),
        created: text(obj, "/metadata/creationTimestamp").to_owned(),
        object: obj.clone(),
    }
}

fn kubevirt_only(flavor: Flavor, what: &str) -> Result<()> {
    match flavor {
        Flavor::KubeVirt => Ok(()),
        Flavor::Deckhouse => Err(Error::Platform(format!(
            "{what} are KubeVirt's; Deckhouse sizes VMs with VirtualMachineClasses: `kubectl vm class list`"
        ))),
    }
}

fn deckhouse_only(flavor: Flavor) -> Result<()> {
    match flavor {
        Flavor::Deckhouse => Ok(()),
        Flavor::KubeVirt => Err(Error::Platform(
            "VirtualMachineClasses are Deckhouse's; KubeVirt sizes VMs with instance types and preferences: `kubectl vm instancetype list`, `kubectl vm preference list`".into(),
        )),
    }
}

/// Every object of `kind` in scope, a page at a time.
async fn all(cluster: &Cluster, kind: &Kind, ns: Option<&str>, out: &mut Vec<Value>) -> Result<()> {
    pages(cluster, kind, ns, None, |items| {
        out.extend(items);
        Ok(())
    })
    .await
    .map(|_| ())
}

/// Instance types: the cluster-wide ones, then those of `namespace` (all when `None`).
pub async fn instancetypes(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: Option<&str>,
) -> Result<Vec<Size>> {
    kubevirt_only(flavor, "instance types")?;
    let mut rows = vec![];
    for kind in [CLUSTER_INSTANCETYPE, INSTANCETYPE] {
        let mut objs = vec![];
        all(cluster, &kind, namespace, &mut objs).await?;
        rows.extend(objs.iter().map(|o| {
            let mut s = size(kind, o);
            s.cpu = quantity_text(o.pointer("/spec/cpu/guest"));
            s.memory = quantity_text(o.pointer("/spec/memory/guest"));
            s
        }));
    }
    Ok(rows)
}

/// What a preference's spec sets, as `path=value` leaves.
fn leaves(prefix: &str, v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&path, v, out);
            }
        }
        Value::String(s) => out.push(format!("{prefix}={s}")),
        other => out.push(format!("{prefix}={other}")),
    }
}

/// Preferences: the cluster-wide ones, then those of `namespace` (all when `None`).
pub async fn preferences(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: Option<&str>,
) -> Result<Vec<Size>> {
    kubevirt_only(flavor, "preferences")?;
    let mut rows = vec![];
    for kind in [CLUSTER_PREFERENCE, PREFERENCE] {
        let mut objs = vec![];
        all(cluster, &kind, namespace, &mut objs).await?;
        rows.extend(objs.iter().map(|o| {
            let mut s = size(kind, o);
            if let Some(spec) = o.get("spec") {
                leaves("", spec, &mut s.sets);
            }
            s
        }));
    }
    Ok(rows)
}

/// One sizing policy in a line: `cores 1-4: memory 1Gi-8Gi, fractions 5%,10%`.
fn policy_line(p: &crate::create::sizing::SizingPolicy) -> String {
    let q = |q: &Option<crate::quantity::Quantity>| q.map(|q| q.to_string()).unwrap_or_default();
    let mut line = format!("cores {}-{}", p.cores_min, p.cores_max);
    let m = &p.memory;
    if m.min.is_some() || m.max.is_some() {
        line.push_str(&format!(": memory {}-{}", q(&m.min), q(&m.max)));
    }
    if m.per_core_min.is_some() || m.per_core_max.is_some() {
        line.push_str(&format!(
            ": memory per core {}-{}",
            q(&m.per_core_min),
            q(&m.per_core_max)
        ));
    }
    if !p.core_fractions.is_empty() {
        let f: Vec<String> = p.core_fractions.iter().map(|f| format!("{f}%")).collect();
        line.push_str(&format!(", fractions {}", f.join(",")));
    }
    line
}

/// A VirtualMachineClass as a row.
fn class_row(o: &Value) -> Size {
    let mut s = size(VIRTUAL_MACHINE_CLASS, o);
    s.cpu = text(o, "/spec/cpu/type").to_owned();
    s.default = o
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
        .and_then(Value::as_str)
        == Some("true");
    s.phase = text(o, "/status/phase").to_owned();
    s.sets = match crate::create::sizing::policies(o) {
        Ok(policies) => policies.iter().map(policy_line).collect(),
        Err(e) => vec![e.to_string()],
    };
    s
}

/// Deckhouse VirtualMachineClasses (cluster-wide).
pub async fn classes(cluster: &Cluster, flavor: Flavor) -> Result<Vec<Size>> {
    deckhouse_only(flavor)?;
    let mut objs = vec![];
    all(cluster, &VIRTUAL_MACHINE_CLASS, None, &mut objs).await?;
    Ok(objs.iter().map(class_row).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_class_row_has_its_policies_fractions_and_default() {
        let class = json!({"metadata": {"name": "generic",
                "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            "spec": {"cpu": {"type": "Discovery"}, "sizingPolicies": [
                {"cores": {"min": 1, "max": 4}, "memory": {"min": "1Gi", "max": "8Gi"},
                 "coreFractions": ["5%", "100%"]}]},
            "status": {"phase": "Ready"}});
        let row = class_row(&class);
        assert!(row.default);
        assert_eq!(row.cpu, "Discovery");
        assert_eq!(row.sets, ["cores 1-4: memory 1Gi-8Gi, fractions 5%,100%"]);
    }

    #[test]
    fn a_preference_lists_what_it_sets() {
        let mut sets = vec![];
        leaves(
            "",
            &json!({"devices": {"preferredDiskBus": "virtio"}, "firmware": {"preferredUseEfi": true}}),
            &mut sets,
        );
        assert_eq!(
            sets,
            [
                "devices.preferredDiskBus=virtio",
                "firmware.preferredUseEfi=true"
            ]
        );
    }
}
