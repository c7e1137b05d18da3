//! Guest facts from KubeVirt's VMI subresources.

use serde_json::Value;

use super::Fact;
use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};

pub(super) async fn read(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    fact: Fact,
) -> Result<Value> {
    let sub = fact.subresource();
    let path = format!(
        "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{name}/{sub}"
    );
    let request = http::Request::get(&path)
        .body(Vec::new())
        .map_err(|e| Error::Internal(e.to_string()))?;
    match cluster.client.request::<Value>(request).await {
        Ok(value) => Ok(value),
        // virt-api: 409 "VMI does not have guest agent connected" / "VMI is not running".
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let message = status.message.clone();
            if message.contains("guest agent") {
                Err(Error::Platform(format!(
                    "the guest agent of {name}.{namespace} is not connected (server: {message})"
                )))
            } else {
                Err(Error::NotRunning(format!(
                    "{name}.{namespace} is not running (server: {message})"
                )))
            }
        }
        Err(e) => Err(cluster.error(
            e,
            &Action::new(
                "get",
                format!("virtualmachineinstances/{sub}.subresources.kubevirt.io"),
                "virtualmachineinstance",
            )
            .named(name)
            .in_namespace(Some(namespace)),
        )),
    }
}
