//! Guest facts on Deckhouse: the VM's `status.guestOSInfo`, reported while the agent is ready.

use serde_json::{Value, json};

use super::Fact;
use crate::api::DECKHOUSE_VM;
use crate::cluster::Cluster;
use crate::error::{Error, Result};

pub(super) async fn read(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    fact: Fact,
) -> Result<Value> {
    if fact != Fact::OsInfo {
        return Err(Error::Platform(format!(
            "Deckhouse virtualization publishes only the guest OS (status.guestOSInfo, see `kubectl vm guestosinfo {name}`); logged-in users and filesystems need KubeVirt"
        )));
    }
    let vm = DECKHOUSE_VM
        .api(&cluster.client, Some(namespace))
        .get(name)
        .await
        .map_err(|e| cluster.error(e, &DECKHOUSE_VM.action("get", Some(namespace)).named(name)))?;
    let vm = serde_json::to_value(vm).map_err(|e| Error::Internal(e.to_string()))?;
    let ready = vm["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "AgentReady");
    let os = &vm["status"]["guestOSInfo"];
    let connected = ready.is_some_and(|c| c["status"] == "True");
    if !connected || os.as_object().is_none_or(|o| o.is_empty()) {
        let why = ready
            .map(|c| {
                format!(
                    "condition AgentReady {}: {} {}",
                    c["status"].as_str().unwrap_or_default(),
                    c["reason"].as_str().unwrap_or_default(),
                    c["message"].as_str().unwrap_or_default()
                )
                .trim_end()
                .to_owned()
            })
            .unwrap_or_else(|| "no AgentReady condition".into());
        return Err(Error::Platform(format!(
            "the guest agent of {name}.{namespace} is not connected ({why})"
        )));
    }
    Ok(json!({"os": os}))
}
