//! The guest's serial console history, as KubeVirt keeps it in the virt-launcher pod.
//!
//! Upstream (kubevirt `pkg/virt-controller/services/serialconsolelog.go`,
//! `generateSerialConsoleLogContainer`, `isSerialConsoleLogEnabled`; `template.go` puts it among
//! the pod's `initContainers`): when the serial console is logged, the launcher pod gets a
//! native sidecar, an init container named `guest-console-log` with `restartPolicy: Always`,
//! running `/usr/bin/virt-tail --logfile /var/run/kubevirt-private/<VMI uid>/virt-serial0-log`.
//! virt-tail (`cmd/virt-tail/main.go`) follows the file libvirt writes the serial output to and
//! prints complete lines (`CompleteLines: true`) to its stdout: the container log the kubelet
//! keeps, each line stamped when it arrived. It is logged unless
//! `spec.domain.devices.autoattachSerialConsole` is false; then
//! `spec.domain.devices.logSerialConsole` decides when set, else the cluster: on unless the
//! KubeVirt CR has `spec.configuration.virtualMachineOptions.disableSerialConsoleLog`
//! (`pkg/virt-config/virt-config.go` `IsSerialConsoleLogDisabled`: the field's presence).
//!
//! Here every guest records what it writes to its serial port into a [`Transcript`] from its
//! first byte (the libvirt log file); the `guest-console-log` container's log is that
//! transcript, only in pods that have the container.

use std::collections::VecDeque;
use std::sync::Mutex;

use serde_json::{Value, json};
use tokio::sync::watch;

use crate::core::app::App;
use crate::core::store::Key;

/// The container's name (upstream `serialconsolelog.go`).
pub const CONTAINER: &str = "guest-console-log";

/// The most bytes of history kept (the kubelet rotates container logs at 10 MiB by default,
/// `containerLogMaxSize`); older lines are dropped.
const MAX_BYTES: usize = 10 * 1024 * 1024;

/// What one boot of a guest wrote to its serial port, as timestamped complete lines.
#[derive(Debug)]
pub struct Transcript {
    inner: Mutex<Inner>,
    /// The number of lines written so far (followers wait on it).
    grown: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Lines kept: each `RFC3339Nano-timestamp SP text`, as the kubelet stores them.
    lines: VecDeque<String>,
    /// The index of `lines[0]` among all lines written.
    first: u64,
    /// Bytes of an unfinished line.
    partial: Vec<u8>,
    /// Bytes in `lines`.
    bytes: usize,
}

impl Default for Transcript {
    fn default() -> Self {
        Transcript {
            inner: Mutex::new(Inner::default()),
            grown: watch::channel(0).0,
        }
    }
}

/// Now as RFC 3339 with nanoseconds (the kubelet's `RFC3339Nano` log timestamps).
fn now_nano() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = crate::core::util::format_rfc3339(now.as_secs() as i64);
    format!("{}.{:09}Z", secs.trim_end_matches('Z'), now.subsec_nanos())
}

impl Transcript {
    /// Records bytes the guest wrote to the serial port: each completed line is kept (without
    /// its `\r`), an unfinished one waits for its end (virt-tail's `CompleteLines`).
    pub fn write(&self, bytes: &[u8]) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.partial.extend_from_slice(bytes);
        let mut added = false;
        while let Some(end) = inner.partial.iter().position(|b| *b == b'\n') {
            let raw: Vec<u8> = inner.partial.drain(..=end).collect();
            let text = String::from_utf8_lossy(&raw[..end]);
            let line = format!("{} {}", now_nano(), text.trim_end_matches('\r'));
            inner.bytes += line.len() + 1;
            inner.lines.push_back(line);
            added = true;
        }
        while inner.bytes > MAX_BYTES {
            let Some(old) = inner.lines.pop_front() else {
                break;
            };
            inner.bytes -= old.len() + 1;
            inner.first += 1;
        }
        let total = inner.first + inner.lines.len() as u64;
        drop(inner);
        if added {
            self.grown.send_replace(total);
        }
    }

    /// The lines from index `from` on (what was dropped is skipped) and the index after them.
    pub fn lines_from(&self, from: u64) -> (Vec<String>, u64) {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let start = from.max(inner.first);
        let skip = (start - inner.first) as usize;
        let lines: Vec<String> = inner.lines.iter().skip(skip).cloned().collect();
        let next = inner.first + inner.lines.len() as u64;
        (lines, next)
    }

    /// Changes whenever a line is added.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.grown.subscribe()
    }
}

/// Whether the serial console of `vmi` is logged (upstream `isSerialConsoleLogEnabled`).
pub fn enabled(app: &App, vmi: &Value) -> bool {
    let devices = vmi.pointer("/spec/domain/devices");
    if devices.and_then(|d| d.get("autoattachSerialConsole")) == Some(&Value::Bool(false)) {
        return false;
    }
    if let Some(on) = devices
        .and_then(|d| d.get("logSerialConsole"))
        .and_then(Value::as_bool)
    {
        return on;
    }
    !cluster_disabled(app)
}

/// Whether a KubeVirt CR says `virtualMachineOptions.disableSerialConsoleLog` (its presence).
fn cluster_disabled(app: &App) -> bool {
    if app
        .registry
        .find_plural("kubevirt.io", "kubevirts")
        .is_none()
    {
        return false;
    }
    let (items, _) = app.store.list("kubevirt.io", "kubevirts", None);
    items.iter().any(|kv| {
        kv.pointer("/spec/configuration/virtualMachineOptions/disableSerialConsoleLog")
            .is_some_and(|v| !v.is_null())
    })
}

/// The `guest-console-log` init container for the pod of the VMI with `uid` (upstream fields
/// that show in the pod: name, image, command, args, restartPolicy).
pub fn container(uid: &str, image: &str) -> Value {
    json!({
        "name": CONTAINER,
        "image": image,
        "command": ["/usr/bin/virt-tail"],
        "args": ["--logfile", format!("/var/run/kubevirt-private/{uid}/virt-serial0-log")],
        "restartPolicy": "Always",
    })
}

/// The transcript behind the `guest-console-log` container of launcher `pod`, if the pod has
/// that container: the guest of its VMI (`kubevirt.io/created-by`), booted now if it boots on
/// first use and its VMI runs (the container reads from the VM's start on: the answer then
/// waits for the guest's first line, up to a few seconds, as if it had booted with the VM).
pub async fn transcript_of(app: &App, pod: &Value) -> Option<std::sync::Arc<Transcript>> {
    let has = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["name"] == CONTAINER));
    if !has {
        return None;
    }
    let uid = pod
        .pointer("/metadata/labels/kubevirt.io~1created-by")?
        .as_str()?;
    let ns = crate::core::util::meta_str(pod, "namespace");
    let vmi_name = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .and_then(|o| o.iter().find(|r| r["kind"] == "VirtualMachineInstance"))
        .and_then(|r| r["name"].as_str());
    let booted_before = app.guests.transcript(uid).is_some();
    if let Some(name) = vmi_name {
        let key = Key::new("kubevirt.io", "virtualmachineinstances", ns, name);
        if app
            .store
            .get(&key)
            .is_some_and(|v| crate::core::util::meta_str(&v, "uid") == uid)
        {
            let _ = app.guests.get_or_boot(app, ns, name);
        }
    }
    let transcript = app.guests.transcript(uid).unwrap_or_default();
    if !booted_before {
        let mut grown = transcript.subscribe();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            grown.wait_for(|n| *n > 0),
        )
        .await;
    }
    Some(transcript)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_complete_lines_without_carriage_returns() {
        let t = Transcript::default();
        t.write(b"Booting\r\nweb log");
        t.write(b"in: ");
        let (lines, next) = t.lines_from(0);
        assert_eq!(next, 1);
        assert_eq!(lines.len(), 1);
        let (stamp, text) = lines[0].split_once(' ').unwrap();
        assert_eq!(text, "Booting");
        assert!(crate::core::util::parse_rfc3339(stamp).is_some(), "{stamp}");
        t.write(b"\n");
        assert_eq!(
            t.lines_from(1).0[0].split_once(' ').unwrap().1,
            "web login: "
        );
    }
}
