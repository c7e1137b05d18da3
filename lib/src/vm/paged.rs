//! Listing VMs a page at a time, the way kubectl reads lists: `limit=500` and `continue`
//! tokens, each page handed to the caller as soon as it arrives. For table output only the
//! fields a row needs are deserialized (typed partial structs below), so memory stays small
//! however many VMs there are.

use std::collections::HashMap;

use kube::api::{ListParams, ObjectList};
use kube::core::Request;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Scope, VmSummary, summarize_deckhouse, summarize_kubevirt};
use crate::api::{KUBEVIRT_VMI, Kind};
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::Platform;

/// Items per list request, as kubectl (`--chunk-size` default 500).
pub const PAGE_SIZE: u32 = 500;

/// How much of each VM a listing keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Only what a table row shows; [`VmSummary::object`] holds just those fields.
    Row,
    /// The whole object in [`VmSummary::object`] (for `-o yaml|json`).
    Object,
}

/// Resource versions a listing ended at (where a watch starts).
#[derive(Debug, Clone, Default)]
pub struct Versions {
    /// Resource version of the VM list.
    pub vms: Option<String>,
    /// Resource version of the instance list (KubeVirt only).
    pub instances: Option<String>,
}

// The fields of a row, as typed partial structs: serde skips everything else while parsing.
// Options are left out when absent, so the summaries read them like the full object.

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Meta {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    creation_timestamp: Option<String>,
    #[serde(skip_serializing_if = "Labels::is_empty")]
    labels: Labels,
    #[serde(skip_serializing_if = "Annotations::is_empty")]
    annotations: Annotations,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    owner_references: Vec<OwnerRef>,
}

/// The labels a row reads: the pool a VM was created for, and who made it (the TRUST column).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct Labels {
    #[serde(rename = "kubevm.io/pool", skip_serializing_if = "Option::is_none")]
    pool: Option<String>,
    #[serde(
        rename = "app.kubernetes.io/managed-by",
        skip_serializing_if = "Option::is_none"
    )]
    managed_by: Option<String>,
}

impl Labels {
    fn is_empty(&self) -> bool {
        self.pool.is_none() && self.managed_by.is_none()
    }
}

/// The annotation a row reads: how the guest trusts SSH certificates (the TRUST column).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct Annotations {
    #[serde(
        rename = "ssh.kubevm.io/trust",
        skip_serializing_if = "Option::is_none"
    )]
    trust: Option<String>,
}

impl Annotations {
    fn is_empty(&self) -> bool {
        self.trust.is_none()
    }
}

/// An owner (a pool's replicas name their VirtualMachinePool).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct OwnerRef {
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    controller: Option<bool>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Cpu {
    #[serde(skip_serializing_if = "Option::is_none")]
    cores: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sockets: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    threads: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    core_fraction: Option<Value>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Memory {
    #[serde(skip_serializing_if = "Option::is_none")]
    guest: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<Value>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Requests {
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<Value>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Resources {
    #[serde(skip_serializing_if = "Option::is_none")]
    requests: Option<Requests>,
    // Deckhouse status.resources.
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<Cpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<Memory>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Domain {
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<Cpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<Memory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resources: Option<Resources>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct TemplateSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<Domain>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Template {
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<TemplateSpec>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Spec {
    // KubeVirt VM.
    #[serde(skip_serializing_if = "Option::is_none")]
    run_strategy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    running: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<Template>,
    // KubeVirt VMI.
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<Domain>,
    // Deckhouse VM.
    #[serde(skip_serializing_if = "Option::is_none")]
    run_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<Cpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<Memory>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Condition {
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    type_: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Iface {
    #[serde(skip_serializing_if = "Option::is_none")]
    ip_address: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", default)]
struct Status {
    #[serde(skip_serializing_if = "Option::is_none")]
    printable_status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ip_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resources: Option<Resources>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    interfaces: Vec<Iface>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    conditions: Vec<Condition>,
}

/// The fields of a VM or instance that a row needs.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(default)]
struct RowObject {
    metadata: Meta,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<Spec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status>,
}

impl RowObject {
    fn key(&self) -> (String, String) {
        (
            self.metadata.namespace.clone().unwrap_or_default(),
            self.metadata.name.clone().unwrap_or_default(),
        )
    }

    fn into_value(self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// A listed object: its row fields (compact, typed) or the whole object.
enum Obj {
    Row(Box<RowObject>),
    Whole(Value),
}

impl Obj {
    /// The JSON the summaries read (built when a row is made, then dropped).
    fn value(&self) -> Value {
        match self {
            Obj::Row(row) => serde_json::to_value(&**row).unwrap_or(Value::Null),
            Obj::Whole(value) => value.clone(),
        }
    }

    fn into_value(self) -> Value {
        match self {
            Obj::Row(row) => row.into_value(),
            Obj::Whole(value) => value,
        }
    }

    fn key(&self) -> (String, String) {
        match self {
            Obj::Row(row) => row.key(),
            Obj::Whole(value) => super::key(value),
        }
    }
}

#[derive(Debug, Deserialize)]
struct ListMeta {
    #[serde(rename = "resourceVersion", default)]
    resource_version: Option<String>,
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RowList {
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<RowObject>,
}

fn params(selector: Option<&str>, token: Option<&str>) -> ListParams {
    let mut params = ListParams::default().limit(PAGE_SIZE);
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    if let Some(token) = token {
        params = params.continue_token(token);
    }
    params
}

/// One page of partial objects.
async fn row_page(
    cluster: &Cluster,
    kind: &Kind,
    ns: Option<&str>,
    selector: Option<&str>,
    token: Option<&str>,
) -> Result<RowList> {
    let api = kind.api(&cluster.client, ns);
    let request = Request::new(api.resource_url())
        .list(&params(selector, token))
        .map_err(|e| cluster.error(kube::Error::BuildRequest(e), &kind.action("list", ns)))?;
    cluster
        .client
        .request::<RowList>(request)
        .await
        .map_err(|e| cluster.error(e, &kind.action("list", ns)))
}

/// One page of whole objects.
async fn object_page(
    cluster: &Cluster,
    kind: &Kind,
    ns: Option<&str>,
    selector: Option<&str>,
    token: Option<&str>,
) -> Result<ObjectList<kube::api::DynamicObject>> {
    kind.api(&cluster.client, ns)
        .list(&params(selector, token))
        .await
        .map_err(|e| cluster.error(e, &kind.action("list", ns)))
}

/// Every KubeVirt instance in scope, reduced to what rows need, by (namespace, name).
async fn instances(
    cluster: &Cluster,
    ns: Option<&str>,
    detail: Detail,
) -> Result<(HashMap<(String, String), Obj>, Option<String>)> {
    let mut all = HashMap::new();
    let mut token: Option<String> = None;
    loop {
        // Instances carry the template's labels, not the VM's, so they are listed whole.
        let (version, next) = match detail {
            Detail::Row => {
                let page = row_page(cluster, &KUBEVIRT_VMI, ns, None, token.as_deref()).await?;
                for vmi in page.items {
                    all.insert(vmi.key(), Obj::Row(Box::new(vmi)));
                }
                (page.metadata.resource_version, page.metadata.continue_)
            }
            Detail::Object => {
                let page = object_page(cluster, &KUBEVIRT_VMI, ns, None, token.as_deref()).await?;
                for vmi in page.items {
                    let v = serde_json::to_value(vmi).unwrap_or(Value::Null);
                    all.insert(super::key(&v), Obj::Whole(v));
                }
                (page.metadata.resource_version, page.metadata.continue_)
            }
        };
        match next.filter(|t| !t.is_empty()) {
            Some(t) => token = Some(t),
            None => return Ok((all, version)),
        }
    }
}

/// List the VMs in scope a page at a time (500 per request, like kubectl), in the server's
/// order, calling `on_page` with each page's summaries as it arrives. Returns where a watch
/// should start.
pub async fn list_pages<E: From<Error>>(
    cluster: &Cluster,
    platform: &Platform,
    scope: &Scope,
    selector: Option<&str>,
    detail: Detail,
    mut on_page: impl FnMut(Vec<VmSummary>) -> std::result::Result<(), E>,
) -> std::result::Result<Versions, E> {
    let vm_kind = Kind::vm(platform.flavor);
    let ns = scope.namespace();
    let kubevirt = crate::platform::of(platform.flavor).instance.is_some();
    let fetch = |token: Option<String>| async move {
        match detail {
            Detail::Row => row_page(cluster, &vm_kind, ns, selector, token.as_deref())
                .await
                .map(either_rows),
            Detail::Object => object_page(cluster, &vm_kind, ns, selector, token.as_deref())
                .await
                .map(either_objects),
        }
    };
    let next_token = |page: &Page| page.2.clone().filter(|t| !t.is_empty());
    if !kubevirt {
        // Deckhouse VMs carry everything a row shows: print each page as it arrives.
        let mut page = fetch(None).await?;
        loop {
            let token = next_token(&page);
            let (items, version, _) = page;
            on_page(
                items
                    .into_iter()
                    .map(|vm| summarize_deckhouse(&vm.into_value()))
                    .collect(),
            )?;
            match token {
                None => {
                    return Ok(Versions {
                        vms: version,
                        instances: None,
                    });
                }
                Some(token) => page = fetch(Some(token)).await?,
            }
        }
    }
    // KubeVirt: the instances' pages and the VMs' pages are read side by side (each list is
    // a chain of continue tokens); VM pages wait, in their small row form, for the instances.
    let vm_pages = async {
        let mut pages = Vec::new();
        let mut token = None;
        loop {
            let page = fetch(token).await?;
            token = next_token(&page);
            pages.push(page);
            if token.is_none() {
                return Ok::<_, Error>(pages);
            }
        }
    };
    let (pages, instances) = tokio::join!(vm_pages, instances(cluster, ns, detail));
    let (pages, (instances, instance_version)) = (pages?, instances?);
    let mut version = None;
    for (items, page_version, _) in pages {
        version = page_version;
        on_page(
            items
                .into_iter()
                .map(|vm| {
                    let vmi = instances.get(&vm.key()).map(Obj::value);
                    summarize_kubevirt(&vm.into_value(), vmi.as_ref())
                })
                .collect(),
        )?;
    }
    Ok(Versions {
        vms: version,
        instances: instance_version,
    })
}

type Page = (Vec<Obj>, Option<String>, Option<String>);

fn either_rows(list: RowList) -> Page {
    (
        list.items
            .into_iter()
            .map(|row| Obj::Row(Box::new(row)))
            .collect(),
        list.metadata.resource_version,
        list.metadata.continue_,
    )
}

fn either_objects(list: ObjectList<kube::api::DynamicObject>) -> Page {
    (
        list.items
            .into_iter()
            .map(|o| Obj::Whole(serde_json::to_value(o).unwrap_or(Value::Null)))
            .collect(),
        list.metadata.resource_version,
        list.metadata.continue_,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn row_objects_keep_what_summaries_read() {
        let vm = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "namespace": "prod", "creationTimestamp": "2026-11-01T10:00:00Z",
                "labels": {"a": "b"}, "managedFields": [{"manager": "x"}]},
            "spec": {"runStrategy": "Always", "template": {"spec": {
                "domain": {"cpu": {"cores": 2, "sockets": 2}, "memory": {"guest": "4Gi"}, "devices": {"disks": []}},
                "volumes": [{"name": "root", "dataVolume": {"name": "web-root"}}]}}},
            "status": {"printableStatus": "Running"}
        });
        let vmi = json!({
            "metadata": {"name": "web", "namespace": "prod"},
            "spec": {"domain": {"cpu": {"cores": 2, "sockets": 2}, "memory": {"guest": "4Gi"}}},
            "status": {"phase": "Running", "nodeName": "node-1",
                "interfaces": [{"name": "default", "ipAddress": "10.244.0.7", "mac": "52:54:00:00:00:01"}],
                "conditions": [{"type": "AgentConnected", "status": "True", "message": "ok"}]}
        });
        let lean = |v: &Value| {
            serde_json::from_value::<RowObject>(v.clone())
                .unwrap()
                .into_value()
        };
        let mut full = summarize_kubevirt(&vm, Some(&vmi));
        let mut partial = summarize_kubevirt(&lean(&vm), Some(&lean(&vmi)));
        full.object = Value::Null;
        partial.object = Value::Null;
        assert_eq!(partial, full);
        // Nothing a row does not need is kept.
        assert!(lean(&vm).pointer("/metadata/labels").is_none());
        // The pool, from the controlling VirtualMachinePool or the pool label.
        let mut replica = vm.clone();
        replica["metadata"]["ownerReferences"] = json!([{"apiVersion": "pool.kubevirt.io/v1beta1",
            "kind": "VirtualMachinePool", "name": "webs", "uid": "u", "controller": true}]);
        assert_eq!(
            summarize_kubevirt(&lean(&replica), None).pool.as_deref(),
            Some("webs")
        );
        assert_eq!(summarize_kubevirt(&vm, None).pool, None);
        replica["metadata"]["labels"]["kubevm.io/pool"] = json!("webs");
        replica["metadata"]["ownerReferences"] = json!([]);
        let lean_replica = lean(&replica);
        assert_eq!(
            lean_replica["metadata"]["labels"],
            json!({"kubevm.io/pool": "webs"})
        );
        assert_eq!(
            summarize_deckhouse(&lean_replica).pool.as_deref(),
            Some("webs")
        );
        assert!(lean(&vm).pointer("/spec/template/spec/volumes").is_none());

        let dvm = json!({"metadata": {"name": "d", "namespace": "dev"},
            "spec": {"runPolicy": "AlwaysOn", "cpu": {"cores": 2, "coreFraction": "50%"}, "memory": {"size": "2Gi"}},
            "status": {"phase": "Running", "nodeName": "n", "ipAddress": "10.0.0.1",
                "resources": {"cpu": {"cores": 2}, "memory": {"size": "2Gi"}},
                "conditions": [{"type": "AgentReady", "status": "True"}]}});
        let mut full = summarize_deckhouse(&dvm);
        let mut partial = summarize_deckhouse(&lean(&dvm));
        full.object = Value::Null;
        partial.object = Value::Null;
        assert_eq!(partial, full);
    }
}
