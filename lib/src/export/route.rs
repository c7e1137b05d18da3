//! Finding the export server's pod when only the in-cluster address is published: KubeVirt's
//! exporter pod carries the label `kubevirt.io.virt-export-service=<export>` (the selector of
//! Service `virt-export-<export>`, which virtctl's `--port-forward` follows), Deckhouse's
//! exporter is the pod whose IP `status.url` names. The transfer then runs through
//! `pods/portforward` with TLS still verified for the URL's host name.

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;

use super::http::Route;
use crate::cluster::Cluster;
use crate::error::{Error, Result};

/// KubeVirt's label on the exporter pod (`exportServiceLabel`).
pub const KUBEVIRT_SERVICE_LABEL: &str = "kubevirt.io.virt-export-service";

/// How to recognize the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodSelector {
    /// A label selector (`key=value`).
    Label(String),
    /// The pod's IP (`status.podIP`).
    Ip(String),
}

/// A running pod matching `selector` in `namespace`, as a port-forward route to `port`.
pub async fn port_forward(
    cluster: &Cluster,
    namespace: &str,
    selector: &PodSelector,
    port: u16,
) -> Result<(Route, String)> {
    let pods: kube::Api<Pod> = kube::Api::namespaced(cluster.client.clone(), namespace);
    let params = match selector {
        PodSelector::Label(l) => ListParams::default().labels(l),
        PodSelector::Ip(ip) => ListParams::default().fields(&format!("status.podIP={ip}")),
    };
    let list = pods.list(&params).await.map_err(|e| {
        Error::from_kube(
            e,
            &crate::error::Action::new("list", "pods", "pod").in_namespace(Some(namespace)),
        )
    })?;
    let describe = || match selector {
        PodSelector::Label(l) => format!("labelled {l}"),
        PodSelector::Ip(ip) => format!("with IP {ip}"),
    };
    let pod = list
        .items
        .iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .and_then(|p| p.metadata.name.clone())
        .ok_or_else(|| {
            Error::Transfer(format!(
                "no running export server pod {} in namespace {namespace}",
                describe()
            ))
        })?;
    Ok((
        Route::PortForward {
            pods,
            pod: pod.clone(),
            port,
        },
        pod,
    ))
}
