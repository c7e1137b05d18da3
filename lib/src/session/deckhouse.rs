//! Deckhouse's session probe: `GET …/virtualmachines/<vm>/{console,vnc}?probe=true` without
//! upgrade answers `VirtualMachineSession {holder, startTime, client}` (V
//! `api/subresources/v1alpha2/types.go`; Deckhouse FACTS §2.1).

use serde::Deserialize;

use super::Holder;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::stream::StreamTarget;

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct VirtualMachineSession {
    #[serde(default)]
    holder: String,
    #[serde(default)]
    start_time: Option<String>,
    #[serde(default)]
    client: String,
}

/// The holder the probe reports, `None` when nobody holds the stream.
pub async fn probe(cluster: &Cluster, target: &StreamTarget) -> Result<Option<Holder>> {
    let request = http::Request::get(format!("{}?probe=true", target.path()))
        .header(http::header::USER_AGENT, crate::stream::USER_AGENT)
        .body(Vec::new())
        .map_err(|e| Error::Internal(e.to_string()))?;
    let session: VirtualMachineSession = cluster
        .client
        .request(request)
        .await
        .map_err(|e| cluster.error(e, &target.action()))?;
    Ok(parse(session))
}

fn parse(session: VirtualMachineSession) -> Option<Holder> {
    if session.holder.is_empty() {
        return None;
    }
    let since = session
        .start_time
        .as_deref()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    Some(Holder {
        session: session.start_time.clone().unwrap_or_default(),
        user: session.holder,
        since,
        client: session.client,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_holder_means_free() {
        let s: VirtualMachineSession =
            serde_json::from_str(r#"{"kind":"VirtualMachineSession"}"#).unwrap();
        assert_eq!(parse(s), None);
        let s: VirtualMachineSession = serde_json::from_str(
            r#"{"holder":"system:serviceaccount:default:alice","startTime":"2026-11-30T14:32:00.000000Z","client":"d8"}"#,
        )
        .unwrap();
        let h = parse(s).unwrap();
        assert_eq!(h.user, "system:serviceaccount:default:alice");
        assert_eq!(h.since.unwrap().as_second(), 1796049120);
        assert_eq!(h.client, "d8");
    }
}
