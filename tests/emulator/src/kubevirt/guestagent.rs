//! KubeVirt's guest-agent subresources on `virtualmachineinstances`: `guestosinfo`, `userlist`
//! and `filesystemlist` (`pkg/virt-api/rest/subresource.go`; shapes from the swagger:
//! `v1.VirtualMachineInstanceGuestAgentInfo`, `v1.VirtualMachineInstanceGuestOSUserList`,
//! `v1.VirtualMachineInstanceFileSystemList`).
//!
//! virt-api answers 409 Conflict `VMI is not running` unless the VMI is Running, and
//! `VMI does not have guest agent connected` without the `AgentConnected` condition.
//! The data: the OS from `status.guestOSInfo`; users and filesystems from the fixture
//! annotations `emulator.kubevm.io/guest-users` and `emulator.kubevm.io/guest-filesystems`
//! (JSON arrays in the swagger shapes); none when absent.

use crate::core::app::App;
use crate::core::status::ApiError;
use crate::core::store::Key;
use serde_json::{Value, json};

/// The answer to `sub` on VMI `ns/name`, or `None` when `sub` is not a guest-agent subresource.
pub fn answer(
    app: &App,
    plural: &str,
    ns: &str,
    name: &str,
    sub: &str,
) -> Option<Result<Value, ApiError>> {
    if plural != "virtualmachineinstances"
        || !matches!(sub, "guestosinfo" | "userlist" | "filesystemlist")
    {
        return None;
    }
    let vmi = app.store.get(&Key::new(
        "kubevirt.io",
        "virtualmachineinstances",
        ns,
        name,
    ))?;
    Some(answer_for(&vmi, sub))
}

fn conflict(name: &str, why: &str) -> ApiError {
    ApiError::new(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on virtualmachineinstance.kubevirt.io \"{name}\": {why}"
        ),
    )
}

fn annotation_list(vmi: &Value, key: &str) -> Vec<Value> {
    vmi["metadata"]["annotations"][key]
        .as_str()
        .and_then(|t| serde_json::from_str::<Vec<Value>>(t).ok())
        .unwrap_or_default()
}

/// What one guest-agent subresource of `vmi` returns.
pub fn answer_for(vmi: &Value, sub: &str) -> Result<Value, ApiError> {
    let name = vmi["metadata"]["name"].as_str().unwrap_or_default();
    if vmi["status"]["phase"] != "Running" {
        return Err(conflict(name, "VMI is not running"));
    }
    let connected = vmi["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "AgentConnected" && c["status"] == "True");
    if !connected {
        return Err(conflict(name, "VMI does not have guest agent connected"));
    }
    let users = annotation_list(vmi, "emulator.kubevm.io/guest-users");
    let filesystems = annotation_list(vmi, "emulator.kubevm.io/guest-filesystems");
    Ok(match sub {
        "guestosinfo" => json!({
            "guestAgentVersion": "9.2.0",
            "hostname": name,
            "os": vmi["status"]["guestOSInfo"].clone(),
            "timezone": "UTC, 0",
            "userList": users,
            "fsInfo": {"disks": filesystems},
            "fsFreezeStatus": "thawed",
            "supportedCommands": [
                {"name": "guest-get-osinfo", "enabled": true},
                {"name": "guest-get-users", "enabled": true},
                {"name": "guest-get-fsinfo", "enabled": true}
            ]
        }),
        "userlist" => json!({"metadata": {}, "items": users}),
        _ => json!({"metadata": {}, "items": filesystems}),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_running_and_agent() {
        let mut vmi = json!({"metadata": {"name": "web", "annotations": {
            "emulator.kubevm.io/guest-users": "[{\"userName\":\"fedora\",\"loginTime\":1767000000.5}]"}},
            "status": {"phase": "Scheduled"}});
        assert!(
            answer_for(&vmi, "userlist")
                .unwrap_err()
                .message
                .ends_with("VMI is not running")
        );
        vmi["status"]["phase"] = json!("Running");
        assert!(
            answer_for(&vmi, "userlist")
                .unwrap_err()
                .message
                .ends_with("VMI does not have guest agent connected")
        );
        vmi["status"]["conditions"] = json!([{"type": "AgentConnected", "status": "True"}]);
        assert_eq!(
            answer_for(&vmi, "userlist").unwrap()["items"][0]["userName"],
            "fedora"
        );
        assert_eq!(
            answer_for(&vmi, "filesystemlist").unwrap()["items"],
            json!([])
        );
        assert_eq!(answer_for(&vmi, "guestosinfo").unwrap()["hostname"], "web");
    }
}
