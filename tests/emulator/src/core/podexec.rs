//! `pods/NAME/exec` over WebSocket, as the API server and kubelet serve it.
//!
//! Protocol (kubernetes `staging/src/k8s.io/apimachinery/pkg/util/httpstream/wsstream/conn.go`
//! and `pkg/kubelet/cri/streaming/remotecommand/websocket.go`):
//! - the client offers subprotocols in `Sec-WebSocket-Protocol` (kube-rs and kubectl send
//!   `v5.channel.k8s.io, v4.channel.k8s.io`); the server picks the first of the client's it
//!   supports and echoes it;
//! - every message is binary, its first byte the channel: 0 stdin, 1 stdout, 2 stderr,
//!   3 error/status, 4 resize (v5 adds 255 = close a channel);
//! - on open the server writes one empty message (just the channel byte) per output channel;
//! - at the end the server writes a `Status` JSON on channel 3: `{"status":"Success"}`, or for a
//!   non-zero exit `reason: NonZeroExitCode` with the code in `details.causes[ExitCode]`
//!   (`pkg/kubelet/cri/streaming/remotecommand/httpstream.go` `writeStatus`), then closes.
//!
//! Checks before the upgrade (`pkg/registry/core/pod/strategy.go` `ExecLocation`): `container`
//! must name a container of the pod (or the pod has exactly one); the pod must run on a node.
//! Authorization: since Kubernetes 1.35 (`AuthorizePodWebsocketUpgradeCreatePermission`, on by
//! default) a WebSocket exec needs `create` on `pods/exec` besides the `get` of the upgrade
//! request, so a read-only user is refused.
//!
//! Commands answered (in container `compute` of a virt-launcher pod): KubeVirt's
//! `virsh [-c URI] dumpxml NAMESPACE_NAME` and Deckhouse's `vlctl domain -o xml`, with a domain XML
//! built from the VMI (KubeVirt) or VirtualMachine (Deckhouse). Any other command exits 127.

use crate::core::app::App;
use crate::core::auth::{Attributes, User, authorize};
use crate::core::status::ApiError;
use crate::core::store::Key;
use axum::extract::FromRequestParts;
use axum::extract::ws::{Message, WebSocketUpgrade};
use axum::response::Response;
use serde_json::{Value, json};
use std::sync::Arc;

/// The pod `ns/name` for a streaming subresource (`exec`, `portforward`), once `user` may
/// `create` that subresource (kubelet streaming subresources are authorized as `create`; for
/// WebSocket upgrades too since Kubernetes 1.35).
pub(crate) fn authorized_pod(
    app: &App,
    user: &User,
    ns: &str,
    name: &str,
    subresource: &str,
) -> Result<Value, ApiError> {
    let attrs = Attributes {
        verb: "create".into(),
        group: String::new(),
        resource: "pods".into(),
        subresource: subresource.into(),
        namespace: ns.into(),
        name: name.into(),
    };
    authorize(&app.store, user, &attrs)?;
    app.store
        .get(&Key::new("", "pods", ns, name))
        .ok_or_else(|| ApiError::not_found("", "pods", name))
}

/// Streaming needs the pod's kubelet: a pod not scheduled to a node yet is refused with the
/// API server's 400.
pub(crate) fn require_host(pod: &Value, name: &str) -> Result<(), ApiError> {
    if pod["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    Ok(())
}

/// Serves one exec request on pod `ns/name`.
pub async fn serve(
    app: &Arc<App>,
    parts: &mut http::request::Parts,
    user: &User,
    ns: &str,
    name: &str,
) -> Result<Response, ApiError> {
    let pod = authorized_pod(app, user, ns, name, "exec")?;
    let query = parts.uri.query().unwrap_or_default().to_owned();
    let params: Vec<(String, String)> = url_pairs(&query);
    let command: Vec<String> = params
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    let container = params
        .iter()
        .rev()
        .find(|(k, _)| k == "container")
        .map(|(_, v)| v.clone());
    let containers: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let container = match container.filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c.as_str()) => c,
        Some(c) => {
            return Err(ApiError::bad_request(format!(
                "container {c} is not valid for pod {name}"
            )));
        }
        None if containers.len() == 1 => containers[0].to_owned(),
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                containers.join(" ")
            )));
        }
    };
    if command.is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    require_host(&pod, name)?;
    if pod["status"]["phase"] != "Running" {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade connection: container not found (\"{container}\")"
        )));
    }
    let upgrade = WebSocketUpgrade::from_request_parts(parts, &())
        .await
        .map_err(|_| ApiError::bad_request("Upgrade request required"))?
        .protocols(["v5.channel.k8s.io", "v4.channel.k8s.io"]);
    if upgrade.selected_protocol().is_none() {
        return Err(ApiError::bad_request(
            "unable to upgrade: no supported channel protocol (v4.channel.k8s.io, v5.channel.k8s.io) offered",
        ));
    }
    let hang = app.exec_hangs.load(std::sync::atomic::Ordering::SeqCst);
    let (stdout, stderr, code) = run(app, &pod, &container, &command);
    Ok(upgrade.on_upgrade(move |mut socket| async move {
        for channel in [1u8, 2, 3] {
            if socket
                .send(Message::Binary(vec![channel].into()))
                .await
                .is_err()
            {
                return;
            }
        }
        if hang {
            // A command that never ends: no output, no status, the stream open until the
            // client closes it (the kubelet keeps an exec open as long as its process runs).
            while let Some(Ok(message)) = socket.recv().await {
                if matches!(message, Message::Close(_)) {
                    break;
                }
            }
            return;
        }
        for (channel, data) in [(1u8, stdout), (2u8, stderr)] {
            // The kubelet copies output in chunks; a few KiB per message like it.
            for chunk in data.as_bytes().chunks(8192) {
                let mut frame = Vec::with_capacity(chunk.len() + 1);
                frame.push(channel);
                frame.extend_from_slice(chunk);
                if socket.send(Message::Binary(frame.into())).await.is_err() {
                    return;
                }
            }
        }
        let status = exit_status(code, &command);
        let mut frame = vec![3u8];
        frame.extend_from_slice(status.to_string().as_bytes());
        let _ = socket.send(Message::Binary(frame.into())).await;
        let _ = socket.send(Message::Close(None)).await;
    }))
}

/// The Status written on channel 3 for an exit code.
pub fn exit_status(code: i32, command: &[String]) -> Value {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: error executing command [{}], exit code {code}", command.join(" ")),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
    })
}

/// Runs `command` in `container` of `pod`: (stdout, stderr, exit code).
pub fn run(app: &App, pod: &Value, container: &str, command: &[String]) -> (String, String, i32) {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let labels = &pod["metadata"]["labels"];
    // virt-launcher pods are owned by their VMI, named like the VM; `vm.kubevirt.io/name` holds
    // the guest's host name, which is the VM's name unless the template sets another.
    let owner_vmi = pod["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| o["kind"] == "VirtualMachineInstance")
        .and_then(|o| o["name"].as_str());
    let vm_name = owner_vmi
        .or_else(|| labels["vm.kubevirt.io/name"].as_str())
        .or_else(|| labels["vm.kubevirt.internal.virtualization.deckhouse.io/name"].as_str())
        .unwrap_or_default();
    let not_found = || {
        (
            String::new(),
            format!(
                "OCI runtime exec failed: exec failed: unable to start container process: exec: \"{}\": executable file not found in $PATH: unknown\n",
                command[0]
            ),
            127,
        )
    };
    if container != "compute" || vm_name.is_empty() {
        return not_found();
    }
    let domain = format!("{ns}_{vm_name}");
    match command[0].as_str() {
        "virsh" if command.iter().any(|a| a == "dumpxml") => {
            let wanted = command.last().map(String::as_str).unwrap_or_default();
            let vmi = app.store.get(&Key::new(
                "kubevirt.io",
                "virtualmachineinstances",
                ns,
                vm_name,
            ));
            match vmi {
                Some(vmi) if wanted == domain => {
                    (kubevirt_domain_xml(&domain, &vmi), String::new(), 0)
                }
                _ => (
                    String::new(),
                    format!("error: failed to get domain '{wanted}'\n"),
                    1,
                ),
            }
        }
        "vlctl" if command.get(1).map(String::as_str) == Some("domain") => {
            let vm = app.store.get(&Key::new(
                "virtualization.deckhouse.io",
                "virtualmachines",
                ns,
                vm_name,
            ));
            match vm {
                Some(vm) => (deckhouse_domain_xml(&domain, &vm), String::new(), 0),
                None => (String::new(), "Error: domain not found\n".into(), 1),
            }
        }
        _ => not_found(),
    }
}

fn memory_kib(text: &str) -> u64 {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    let n: u64 = digits.parse().unwrap_or(1);
    match &text[digits.len()..] {
        "Gi" => n * 1024 * 1024,
        "Mi" => n * 1024,
        "Ki" => n,
        _ => n / 1024,
    }
}

struct DomainSpec<'a> {
    name: &'a str,
    uuid: &'a str,
    vcpus: u64,
    memory_kib: u64,
    disks: Vec<(String, String)>,
    mac: &'a str,
}

/// A libvirt domain as virt-launcher defines it (shape of `virsh dumpxml` on a running
/// KubeVirt VM: q35 machine, virtio disks named `ua-<volume>` by alias, masquerade NIC).
fn domain_xml(d: &DomainSpec) -> String {
    let mut disks = String::new();
    for (i, (volume, source)) in d.disks.iter().enumerate() {
        let dev = (b'a' + i as u8) as char;
        disks.push_str(&format!(
            "    <disk type='file' device='disk' model='virtio-non-transitional'>\n      <driver name='qemu' type='raw' cache='none' error_policy='stop' discard='unmap'/>\n      <source file='{source}'/>\n      <target dev='vd{dev}' bus='virtio'/>\n      <alias name='ua-{volume}'/>\n    </disk>\n"
        ));
    }
    format!(
        "<domain type='kvm' id='1'>\n  <name>{name}</name>\n  <uuid>{uuid}</uuid>\n  <metadata>\n    <kubevirt xmlns=\"http://kubevirt.io\">\n      <uid>{uuid}</uid>\n    </kubevirt>\n  </metadata>\n  <memory unit='KiB'>{mem}</memory>\n  <currentMemory unit='KiB'>{mem}</currentMemory>\n  <vcpu placement='static'>{vcpus}</vcpu>\n  <os>\n    <type arch='x86_64' machine='pc-q35-rhel9.4.0'>hvm</type>\n    <boot dev='hd'/>\n  </os>\n  <features>\n    <acpi/>\n  </features>\n  <cpu mode='host-model' check='partial'>\n    <topology sockets='1' dies='1' clusters='1' cores='{vcpus}' threads='1'/>\n  </cpu>\n  <clock offset='utc'/>\n  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n  <devices>\n    <emulator>/usr/libexec/qemu-kvm</emulator>\n{disks}    <interface type='ethernet'>\n      <mac address='{mac}'/>\n      <target dev='tap0' managed='no'/>\n      <model type='virtio-non-transitional'/>\n      <alias name='ua-default'/>\n    </interface>\n    <serial type='unix'>\n      <source mode='bind' path='/var/run/kubevirt-private/{uuid}/virt-serial0'/>\n      <target type='isa-serial' port='0'/>\n    </serial>\n    <channel type='unix'>\n      <target type='virtio' name='org.qemu.guest_agent.0' state='connected'/>\n    </channel>\n  </devices>\n</domain>\n",
        name = d.name,
        uuid = d.uuid,
        mem = d.memory_kib,
        vcpus = d.vcpus,
        mac = d.mac,
    )
}

fn kubevirt_domain_xml(domain: &str, vmi: &Value) -> String {
    let spec = &vmi["spec"]["domain"];
    let vcpus = spec["cpu"]["cores"].as_u64().unwrap_or(1)
        * spec["cpu"]["sockets"].as_u64().unwrap_or(1)
        * spec["cpu"]["threads"].as_u64().unwrap_or(1);
    let memory = spec["memory"]["guest"]
        .as_str()
        .or_else(|| spec["resources"]["requests"]["memory"].as_str())
        .unwrap_or("1Gi");
    let disks = vmi["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let name = v["name"].as_str()?;
            Some((
                name.to_owned(),
                format!("/var/run/kubevirt-private/vmi-disks/{name}/disk.img"),
            ))
        })
        .collect();
    let uid = vmi["metadata"]["uid"].as_str().unwrap_or_default();
    let mac = vmi["status"]["interfaces"][0]["mac"]
        .as_str()
        .unwrap_or("02:00:00:00:00:01");
    domain_xml(&DomainSpec {
        name: domain,
        uuid: uid,
        vcpus,
        memory_kib: memory_kib(memory),
        disks,
        mac,
    })
}

fn deckhouse_domain_xml(domain: &str, vm: &Value) -> String {
    let disks = vm["spec"]["blockDeviceRefs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let name = r["name"].as_str()?;
            let prefix = match r["kind"].as_str()? {
                "VirtualDisk" => "vd",
                "VirtualImage" => "vi",
                _ => "cvi",
            };
            Some((
                format!("{prefix}-{name}"),
                format!("/var/run/kubevirt-private/vmi-disks/{prefix}-{name}/disk.img"),
            ))
        })
        .collect();
    domain_xml(&DomainSpec {
        name: domain,
        uuid: vm["metadata"]["uid"].as_str().unwrap_or_default(),
        vcpus: vm["spec"]["cpu"]["cores"].as_u64().unwrap_or(1),
        memory_kib: memory_kib(vm["spec"]["memory"]["size"].as_str().unwrap_or("1Gi")),
        disks,
        mac: "02:00:00:00:00:01",
    })
}

/// `key=value` pairs of a query string, repeated keys kept (exec repeats `command`).
fn url_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_pairs_keep_repeats() {
        let p = url_pairs(
            "command=virsh&command=dumpxml&command=default_web&container=compute&x=a%2Fb%20c",
        );
        let cmds: Vec<_> = p
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(cmds, ["virsh", "dumpxml", "default_web"]);
        assert_eq!(p.last().unwrap().1, "a/b c");
    }

    #[test]
    fn status_on_failure_carries_the_exit_code() {
        let s = exit_status(127, &["x".into()]);
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "127");
        assert_eq!(exit_status(0, &[])["status"], "Success");
    }
}
