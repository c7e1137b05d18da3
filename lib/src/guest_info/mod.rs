//! What the guest agent reports about a running guest, as virtctl's `guestosinfo`,
//! `userlist` and `fslist` show it: KubeVirt's VMI subresources (virt-api asks the agent
//! through virt-handler; `pkg/virt-api/rest/subresource.go`), Deckhouse's `status.guestOSInfo`
//! of the VM (the only guest-agent fact it publishes). The rows of the tables are decided here.

mod deckhouse;
mod kubevirt;

use serde_json::Value;

use crate::cluster::Cluster;
use crate::error::Result;
use crate::flavor::Flavor;

/// One kind of guest fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact {
    /// OS, kernel, hostname, time zone, agent version.
    OsInfo,
    /// Logged-in users.
    Users,
    /// Mounted filesystems with their usage.
    Filesystems,
}

impl Fact {
    /// The KubeVirt subresource.
    pub fn subresource(self) -> &'static str {
        match self {
            Fact::OsInfo => "guestosinfo",
            Fact::Users => "userlist",
            Fact::Filesystems => "filesystemlist",
        }
    }
}

/// The fact as the platform answers it (the subresource's JSON; on Deckhouse an object made of
/// `status.guestOSInfo` in KubeVirt's shape: `{"os": …}`).
pub async fn read(
    cluster: &Cluster,
    flavor: Flavor,
    namespace: &str,
    name: &str,
    fact: Fact,
) -> Result<Value> {
    match flavor {
        Flavor::KubeVirt => kubevirt::read(cluster, namespace, name, fact).await,
        Flavor::Deckhouse => deckhouse::read(cluster, namespace, name, fact).await,
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

/// Headers of the table of `fact`.
pub fn headers(fact: Fact) -> &'static [&'static str] {
    match fact {
        Fact::OsInfo => &[
            "HOSTNAME", "OS", "VERSION", "KERNEL", "ARCH", "TIMEZONE", "AGENT",
        ],
        Fact::Users => &["USER", "DOMAIN", "LOGIN-TIME"],
        Fact::Filesystems => &["MOUNTPOINT", "TYPE", "DISK", "USED", "TOTAL", "USE%"],
    }
}

/// The table rows of `fact` from the platform's answer (empty cells for what it lacks).
pub fn rows(fact: Fact, value: &Value) -> Vec<Vec<String>> {
    match fact {
        Fact::OsInfo => {
            let os = &value["os"];
            vec![vec![
                text(&value["hostname"]),
                text(&os["prettyName"]),
                text(or(&os["versionId"], &os["version"])),
                // Deckhouse writes `kernel.release`, KubeVirt `kernelRelease`.
                text(or(&os["kernelRelease"], &os["kernel"]["release"])),
                text(&os["machine"]),
                text(&value["timezone"]),
                text(&value["guestAgentVersion"]),
            ]]
        }
        Fact::Users => items(value)
            .map(|u| {
                vec![
                    text(&u["userName"]),
                    text(&u["domain"]),
                    u["loginTime"]
                        .as_f64()
                        .and_then(|t| jiff::Timestamp::from_second(t as i64).ok())
                        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                        .unwrap_or_default(),
                ]
            })
            .collect(),
        Fact::Filesystems => items(value)
            .map(|f| {
                let used = f["usedBytes"].as_u64();
                let total = f["totalBytes"].as_u64();
                vec![
                    text(&f["mountPoint"]),
                    text(&f["fileSystemType"]),
                    text(&f["diskName"]),
                    used.map(bytes).unwrap_or_default(),
                    total.map(bytes).unwrap_or_default(),
                    match (used, total) {
                        (Some(u), Some(t)) if t > 0 => format!("{}%", (u * 100).div_ceil(t)),
                        _ => String::new(),
                    },
                ]
            })
            .collect(),
    }
}

fn or<'a>(a: &'a Value, b: &'a Value) -> &'a Value {
    if a.is_null() { b } else { a }
}

fn items(value: &Value) -> impl Iterator<Item = &Value> {
    value["items"].as_array().into_iter().flatten()
}

/// Bytes in binary units with one decimal (`1.5Gi`), as `df -h` rounds up.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["", "Ki", "Mi", "Gi", "Ti", "Pi"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}")
    } else {
        format!("{:.1}{}", (value * 10.0).ceil() / 10.0, UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_from_kubevirt_shapes() {
        let os = json!({"hostname": "web", "guestAgentVersion": "7.2.0", "timezone": "UTC, 0",
            "os": {"prettyName": "Debian GNU/Linux 12 (bookworm)", "versionId": "12",
                   "kernelRelease": "6.1.0-28-amd64", "machine": "x86_64"}});
        assert_eq!(
            rows(Fact::OsInfo, &os),
            [[
                "web",
                "Debian GNU/Linux 12 (bookworm)",
                "12",
                "6.1.0-28-amd64",
                "x86_64",
                "UTC, 0",
                "7.2.0"
            ]]
        );
        let users = json!({"items": [{"userName": "debian", "loginTime": 1767225600.25}]});
        assert_eq!(
            rows(Fact::Users, &users),
            [["debian", "", "2026-01-01T00:00:00Z"]]
        );
        let fs = json!({"items": [{"mountPoint": "/", "fileSystemType": "ext4", "diskName": "vda1",
            "usedBytes": 1610612736u64, "totalBytes": 4294967296u64}]});
        assert_eq!(
            rows(Fact::Filesystems, &fs),
            [["/", "ext4", "vda1", "1.5Gi", "4.0Gi", "38%"]]
        );
        assert_eq!(bytes(512), "512");
        assert_eq!(bytes(1025), "1.1Ki");
    }
}
