//! The export object's life: create (create semantics), get, wait for readiness, and delete
//! with a uid precondition. Shared by both platforms.

use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::discovery::ApiResource;
use serde_json::Value;

use super::Event;
use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};

/// How often readiness is polled.
const POLL: Duration = Duration::from_millis(500);

/// A kind this module handles.
#[derive(Debug, Clone)]
pub struct ObjKind {
    /// kube's description.
    pub resource: ApiResource,
}

impl ObjKind {
    /// A namespaced kind at `group/version`.
    pub fn new(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        ObjKind {
            resource: ApiResource {
                group: group.into(),
                version: version.into(),
                api_version,
                kind: kind.into(),
                plural: plural.into(),
            },
        }
    }

    fn api(&self, cluster: &Cluster, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(cluster.client.clone(), ns, &self.resource)
    }

    fn action(&self, verb: &'static str, ns: &str, name: &str) -> Action {
        let resource = if self.resource.group.is_empty() {
            self.resource.plural.clone()
        } else {
            format!("{}.{}", self.resource.plural, self.resource.group)
        };
        Action::new(verb, resource, self.resource.kind.to_ascii_lowercase())
            .named(name)
            .in_namespace(Some(ns))
    }

    /// Creates `object` (fails if it exists).
    pub async fn create(&self, cluster: &Cluster, ns: &str, object: Value) -> Result<Value> {
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let obj: DynamicObject = serde_json::from_value(object)
            .map_err(|e| Error::Internal(format!("building {}: {e}", self.resource.kind)))?;
        let created = self
            .api(cluster, ns)
            .create(&PostParams::default(), &obj)
            .await
            .map_err(|e| cluster.error(e, &self.action("create", ns, &name)))?;
        serde_json::to_value(created).map_err(|e| Error::Internal(e.to_string()))
    }

    /// Reads an object.
    pub async fn get(&self, cluster: &Cluster, ns: &str, name: &str) -> Result<Value> {
        let obj = self
            .api(cluster, ns)
            .get(name)
            .await
            .map_err(|e| cluster.error(e, &self.action("get", ns, name)))?;
        serde_json::to_value(obj).map_err(|e| Error::Internal(e.to_string()))
    }

    /// Deletes an object if it still has `uid` (a replaced object of the same name is left
    /// alone). A missing object counts as deleted.
    pub async fn delete(&self, cluster: &Cluster, ns: &str, name: &str, uid: &str) -> Result<()> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::background()
        };
        match self.api(cluster, ns).delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(cluster.error(e, &self.action("delete", ns, name))),
        }
    }

    /// Polls until `ready(object)` gives `Ok(true)`, reporting the object's own explanation
    /// (from `waiting(object)`) whenever it changes.
    #[allow(clippy::too_many_arguments)]
    pub async fn wait(
        &self,
        cluster: &Cluster,
        ns: &str,
        name: &str,
        timeout: Duration,
        ready: impl Fn(&Value) -> Result<bool>,
        waiting: impl Fn(&Value) -> String,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Result<Value> {
        let work = async {
            let mut last = None;
            loop {
                let obj = self.get(cluster, ns, name).await?;
                if ready(&obj)? {
                    return Ok(obj);
                }
                let message = waiting(&obj);
                if last.as_ref() != Some(&message) {
                    on_event(Event::Waiting {
                        message: message.clone(),
                    });
                    last = Some(message);
                }
                tokio::time::sleep(POLL).await;
            }
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(Error::Timeout(format!(
                "{} {name:?} in namespace {ns:?} to be ready",
                self.resource.kind.to_ascii_lowercase()
            ))),
        }
    }
}

/// The `Ready` condition's message (or reason), else the phase.
pub fn ready_message(obj: &Value) -> String {
    let cond = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(String::from);
    cond.and_then(|c| text(&c["message"]).or_else(|| text(&c["reason"])))
        .or_else(|| {
            obj.pointer("/status/phase")
                .and_then(text)
                .map(|p| format!("phase {p}"))
        })
        .unwrap_or_else(|| "the export controller to pick it up".into())
}

/// Why an export ended `Skipped`: the message of a false condition (upstream sets `Ready`
/// with `VMNoVolumes` for a VM, `VolumesCreated` with `VMSnapshotNoVolumes` for a snapshot).
pub fn skipped_message(obj: &Value) -> String {
    let conditions = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let false_ones = || conditions.iter().filter(|c| c["status"] == "False");
    let text = |c: &Value, key: &str| c[key].as_str().filter(|t| !t.is_empty()).map(String::from);
    false_ones()
        .find_map(|c| text(c, "message"))
        .unwrap_or_else(|| {
            let reason = false_ones()
                .filter_map(|c| text(c, "reason"))
                .find(|r| r != "Initializing");
            match reason {
                Some(r) => format!("the source has no volumes to export ({r})"),
                None => "the source has no volumes to export".into(),
            }
        })
}

/// `metadata.name`.
pub fn name(obj: &Value) -> String {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// `metadata.uid`.
pub fn uid(obj: &Value) -> String {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Whether kubectl-vm created the object (its managed-by label).
pub fn ours(obj: &Value) -> bool {
    obj.pointer("/metadata/labels")
        .and_then(|l| l.get(super::MANAGED_BY.0))
        .and_then(Value::as_str)
        == Some(super::MANAGED_BY.1)
}

/// Labels for objects `export` creates.
pub fn labels(export: &str) -> Value {
    serde_json::json!({super::MANAGED_BY.0: super::MANAGED_BY.1, super::EXPORT_LABEL: export})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_message_prefers_a_false_condition_message_then_its_reason() {
        // Shapes from kubevirt's export controller tests: a snapshot without volume snapshots,
        // a VM without volumes (empty message).
        let snapshot = serde_json::json!({"status": {"phase": "Skipped", "conditions": [
            {"type": "Ready", "status": "False", "reason": "Initializing", "message": ""},
            {"type": "VolumesCreated", "status": "False", "reason": "VMSnapshotNoVolumes",
             "message": "VirtualMachineSnapshot ns/s does not contain any volume snapshots"}]}});
        assert_eq!(
            skipped_message(&snapshot),
            "VirtualMachineSnapshot ns/s does not contain any volume snapshots"
        );
        let vm = serde_json::json!({"status": {"phase": "Skipped", "conditions": [
            {"type": "Ready", "status": "False", "reason": "VMNoVolumes", "message": ""}]}});
        assert_eq!(
            skipped_message(&vm),
            "the source has no volumes to export (VMNoVolumes)"
        );
    }
}
