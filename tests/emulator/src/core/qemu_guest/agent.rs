//! The guest agent channel: QGA JSON (`guest-sync`, `guest-get-osinfo`, `guest-get-users`,
//! `guest-get-fsinfo`, `guest-shutdown`) and what it reports into the VM's status.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::credentials::{GuestWrite, Synced};
use super::process::Proc;
use super::{DH, KV};
use crate::core::app::App;
use crate::core::guest::GuestSpec;
use crate::core::store::Key;
use crate::core::util::meta_str;

/// What the guest agent last reported.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentInfo {
    /// `guest-get-osinfo` in KubeVirt's `guestOSInfo` shape.
    pub os: Value,
    /// `guest-get-users` in KubeVirt's `VirtualMachineInstanceGuestOSUser` shape.
    pub users: Vec<Value>,
    /// `guest-get-fsinfo` in KubeVirt's `VirtualMachineInstanceFileSystem` shape.
    pub filesystems: Vec<Value>,
}

static SYNC_ID: AtomicU64 = AtomicU64::new(1);

pub(super) struct Agent {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Agent {
    fn connect(path: &Path) -> io::Result<Agent> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        Ok(Agent {
            writer: stream.try_clone()?,
            reader: BufReader::new(stream),
        })
    }

    /// `guest-sync` with a fresh id; lines that are not its answer (late answers to earlier
    /// requests the agent only read once it started) are skipped.
    fn sync(&mut self) -> io::Result<()> {
        let id = SYNC_ID.fetch_add(1, Ordering::SeqCst) + 1_000_000 * std::process::id() as u64;
        writeln!(
            self.writer,
            "{}",
            json!({"execute": "guest-sync", "arguments": {"id": id}})
        )?;
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            let mut line = String::new();
            match self.reader.read_line(&mut line) {
                Ok(0) => return Err(io::Error::other("agent channel closed")),
                Ok(_) => {
                    let line = line.trim_start_matches('\u{ff}');
                    if serde_json::from_str::<Value>(line).is_ok_and(|v| v["return"] == json!(id)) {
                        return Ok(());
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "guest-sync"))
    }

    fn execute(&mut self, command: &str) -> io::Result<Value> {
        self.request(&json!({"execute": command}))
    }

    /// [`Agent::request`] waiting up to `timeout` for the answer.
    fn request_within(&mut self, request: &Value, timeout: Duration) -> io::Result<Value> {
        self.writer.set_read_timeout(Some(timeout))?;
        let answer = self.request(request);
        self.writer.set_read_timeout(Some(Duration::from_secs(2)))?;
        answer
    }

    fn request(&mut self, request: &Value) -> io::Result<Value> {
        let command = request["execute"].as_str().unwrap_or_default().to_owned();
        writeln!(self.writer, "{request}")?;
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::other("agent channel closed"));
        }
        let v: Value = serde_json::from_str(&line).map_err(io::Error::other)?;
        match v.get("return") {
            Some(r) => Ok(r.clone()),
            None => Err(io::Error::other(format!("{command}: {}", v["error"]))),
        }
    }

    fn info(&mut self) -> io::Result<AgentInfo> {
        self.sync()?;
        let os = self.execute("guest-get-osinfo")?;
        let users = self.execute("guest-get-users").unwrap_or(Value::Null);
        let filesystems = self.execute("guest-get-fsinfo").unwrap_or(Value::Null);
        Ok(AgentInfo::from_qga(&os, &users, &filesystems))
    }
}

impl AgentInfo {
    /// KubeVirt's shapes (`v1.VirtualMachineInstanceGuestOSInfo`, `…GuestOSUser`,
    /// `…FileSystem`) from the agent's answers (qemu `qga/qapi-schema.json`: `GuestOSInfo`,
    /// `GuestUser`, `GuestFilesystemInfo`), as virt-handler converts them.
    pub fn from_qga(os: &Value, users: &Value, filesystems: &Value) -> AgentInfo {
        let field = |k: &str| os.get(k).cloned().unwrap_or(Value::Null);
        let mut os_info = json!({
            "id": field("id"), "name": field("name"), "prettyName": field("pretty-name"),
            "version": field("version"), "versionId": field("version-id"),
            "kernelRelease": field("kernel-release"), "kernelVersion": field("kernel-version"),
            "machine": field("machine"),
        });
        if let Some(m) = os_info.as_object_mut() {
            m.retain(|_, v| !v.is_null());
        }
        let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
        let users = list(users)
            .iter()
            .map(|u| {
                let mut o = json!({"userName": u["user"], "loginTime": u["login-time"]});
                if let Some(d) = u.get("domain") {
                    o["domain"] = d.clone();
                }
                o
            })
            .collect();
        let filesystems = list(filesystems)
            .iter()
            .map(|f| {
                json!({"diskName": f["name"], "mountPoint": f["mountpoint"],
                       "fileSystemType": f["type"], "usedBytes": f["used-bytes"],
                       "totalBytes": f["total-bytes"]})
            })
            .collect();
        AgentInfo {
            os: os_info,
            users,
            filesystems,
        }
    }
}

/// The agent connection of one guest (the channel takes one client), shared by its watcher
/// and the snapshot's freeze ([`freeze_during`]).
pub(super) type SharedAgent = Arc<Mutex<Option<Agent>>>;

/// Runs `work` with the guest's filesystems frozen by its agent (`guest-fsfreeze-freeze`, then
/// `guest-fsfreeze-thaw` whatever `work` returned), as virt-controller has virt-handler do around
/// a volume snapshot (kubevirt `pkg/storage/snapshot/source.go` `Freeze`/`Unfreeze`). Without a
/// connected agent `work` runs unfrozen and `frozen` is false, as upstream snapshots a VM
/// without an agent (the `NoGuestAgent` indication).
pub(super) fn freeze_during<T>(
    agent: &SharedAgent,
    work: impl FnOnce() -> io::Result<T>,
) -> io::Result<(T, bool)> {
    let mut guard = agent.lock().unwrap_or_else(|e| e.into_inner());
    let Some(a) = guard.as_mut() else {
        return work().map(|t| (t, false));
    };
    let freeze = a
        .sync()
        .and_then(|()| a.request_within(&json!({"execute": "guest-fsfreeze-freeze"}), FREEZE));
    if freeze.is_err() {
        // Not answering: thaw in case the freeze went through after all, then copy unfrozen.
        let _ = a.request_within(&json!({"execute": "guest-fsfreeze-thaw"}), FREEZE);
        return work().map(|t| (t, false));
    }
    let result = work();
    let thaw = a.request_within(&json!({"execute": "guest-fsfreeze-thaw"}), FREEZE);
    let t = result?;
    thaw?;
    Ok((t, true))
}

/// How long a freeze or thaw may take (virt-handler's default unfreeze timeout is 5 minutes;
/// a TCG guest freezes its few filesystems in seconds).
const FREEZE: Duration = Duration::from_secs(60);

/// Polls the agent while the guest runs and reports changes to the VM's status; asks the
/// agent to power the guest off once a stop was requested.
pub(super) fn watch_agent(
    app: Weak<App>,
    spec: GuestSpec,
    path: PathBuf,
    proc_: Arc<Proc>,
    shared: SharedAgent,
) {
    let mut last: Option<AgentInfo> = None;
    let mut shutdown_sent = false;
    let mut synced: Synced = None;
    while proc_.running() {
        let mut agent = shared.lock().unwrap_or_else(|e| e.into_inner());
        if proc_.stop_requested.load(Ordering::SeqCst) {
            if let (Some(a), false) = (agent.as_mut(), shutdown_sent) {
                // No answer comes: the agent exits with the guest.
                let _ = writeln!(
                    a.writer,
                    "{}",
                    json!({"execute": "guest-shutdown", "arguments": {"mode": "powerdown"}})
                );
                shutdown_sent = true;
            }
            drop(agent);
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        if agent.is_none() {
            *agent = Agent::connect(&path).ok();
        }
        let info = match agent.as_mut().map(|a| a.info()) {
            Some(Ok(info)) => Some(info),
            // Not answering (yet): requests stay queued for the agent, and guest-sync's id
            // tells later answers apart.
            Some(Err(e))
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            _ => {
                *agent = None;
                None
            }
        };
        if info != last {
            let Some(app) = app.upgrade() else { return };
            report_agent(&app, &spec, info.as_ref());
            last = info;
        }
        if let (Some(_), Some(a), Some(app)) = (&last, agent.as_mut(), app.upgrade()) {
            sync_credentials(&app, &spec, a, &mut synced);
        }
        drop(agent);
        let pause = if last.is_some() { 3000 } else { 300 };
        for _ in 0..pause / 100 {
            if !proc_.running() || proc_.stop_requested.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    if last.is_some()
        && let Some(app) = app.upgrade()
    {
        report_agent(&app, &spec, None);
    }
}

/// Propagates the VMI's guest-agent access credentials (see [`super::credentials`]) when they
/// differ from what was last written, and sets `AccessCredentialsSynchronized`: keys with
/// `guest-ssh-add-authorized-keys`, then passwords with `guest-set-user-password`, as
/// virt-launcher's `reloadCredentialFiles` does.
fn sync_credentials(app: &App, spec: &GuestSpec, agent: &mut Agent, synced: &mut Synced) {
    super::credentials::sync(app, spec, synced, |write| {
        let command = match write {
            GuestWrite::Keys(user, keys) => super::credentials::command(user, keys),
            GuestWrite::Password(user, password) => {
                super::credentials::password_command(user, password)
            }
        };
        agent
            .sync()
            .and_then(|()| agent.request(&command))
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
}

/// Writes what the agent reports into the VM's status, if the boot it came from is current:
/// KubeVirt's VMI condition `AgentConnected` (virt-handler sets it while the agent channel is
/// connected, `pkg/virt-handler/vm.go`), `status.guestOSInfo`, and the users/filesystems the
/// guest-agent subresources answer; Deckhouse's VM condition `AgentReady` and
/// `status.guestOSInfo`.
pub fn report_agent(app: &App, spec: &GuestSpec, info: Option<&AgentInfo>) {
    use crate::core::controllers::set_condition;
    let vmi_key = Key::new(KV, "virtualmachineinstances", &spec.namespace, &spec.name);
    if app
        .registry
        .find_plural(KV, "virtualmachineinstances")
        .is_some()
        && let Some(vmi) = app.store.get(&vmi_key)
    {
        if meta_str(&vmi, "uid") != spec.boot_id {
            return;
        }
        app.store.modify(&vmi_key, |o| {
            let mut st = o["status"].clone();
            match info {
                Some(i) => {
                    set_condition(&mut st, "AgentConnected", true, "", "");
                    st["guestOSInfo"] = i.os.clone();
                    let ann = crate::core::util::meta_mut(o)
                        .entry("annotations")
                        .or_insert_with(|| json!({}));
                    ann["emulator.kubevm.io/guest-users"] =
                        json!(i.users.to_vec()).to_string().into();
                    ann["emulator.kubevm.io/guest-filesystems"] =
                        json!(i.filesystems.to_vec()).to_string().into();
                }
                None => {
                    if let Some(c) = st["conditions"].as_array_mut() {
                        c.retain(|c| c["type"] != "AgentConnected");
                    }
                }
            }
            o["status"] = st;
        });
        return;
    }
    let vm_key = Key::new(DH, "virtualmachines", &spec.namespace, &spec.name);
    if app.registry.find_plural(DH, "virtualmachines").is_some()
        && let Some(vm) = app.store.get(&vm_key)
    {
        if crate::core::guest::boot_id(app, &spec.namespace, &spec.name).as_deref()
            != Some(spec.boot_id.as_str())
        {
            return;
        }
        let _ = vm;
        app.store.modify(&vm_key, |o| {
            let mut st = o["status"].clone();
            match info {
                Some(i) => {
                    set_condition(&mut st, "AgentReady", true, "AgentReady", "");
                    st["guestOSInfo"] = i.os.clone();
                }
                None => {
                    set_condition(&mut st, "AgentReady", false, "AgentNotReady", "");
                }
            }
            o["status"] = st;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::registry::Registry;

    /// Answers as qemu-guest-agent 7.2 in Debian 12 gives them (seen on the test image).
    fn debian() -> AgentInfo {
        AgentInfo::from_qga(
            &json!({"name": "Debian GNU/Linux", "kernel-release": "6.1.0-57-amd64",
                "version": "12 (bookworm)", "pretty-name": "Debian GNU/Linux 12 (bookworm)",
                "version-id": "12", "kernel-version": "#1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)",
                "machine": "x86_64", "id": "debian"}),
            &json!([{"user": "root", "login-time": 1764525000.25}]),
            &json!([{"name": "vda", "mountpoint": "/", "type": "ext4", "used-bytes": 400000000u64,
                "total-bytes": 2000000000u64, "disk": []}]),
        )
    }

    #[test]
    fn converts_agent_answers_to_kubevirt_shapes() {
        let info = debian();
        assert_eq!(
            info.os,
            json!({"id": "debian", "name": "Debian GNU/Linux",
                "prettyName": "Debian GNU/Linux 12 (bookworm)", "version": "12 (bookworm)",
                "versionId": "12", "kernelRelease": "6.1.0-57-amd64",
                "kernelVersion": "#1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)",
                "machine": "x86_64"})
        );
        assert_eq!(
            info.users,
            [json!({"userName": "root", "loginTime": 1764525000.25})]
        );
        assert_eq!(
            info.filesystems,
            [
                json!({"diskName": "vda", "mountPoint": "/", "fileSystemType": "ext4",
                "usedBytes": 400000000u64, "totalBytes": 2000000000u64})
            ]
        );
        // An agent that refuses the optional commands still reports the OS.
        let bare = AgentInfo::from_qga(&json!({"id": "debian"}), &Value::Null, &Value::Null);
        assert_eq!(bare.os, json!({"id": "debian"}));
        assert!(bare.users.is_empty() && bare.filesystems.is_empty());
    }

    fn condition(obj: &Value, t: &str) -> Option<String> {
        obj["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == t)
            .map(|c| c["status"].as_str().unwrap_or_default().to_owned())
    }

    #[test]
    fn reports_into_the_current_vmi_only() {
        let app = App::new(
            Registry::new(crate::ServeFlavor::KubeVirt),
            Duration::from_secs(1),
        );
        let vmi = app
            .store
            .create(
                KV,
                "virtualmachineinstances",
                json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "web", "namespace": "default"},
                "spec": {}, "status": {"phase": "Running"}}),
            )
            .unwrap();
        let key = Key::new(KV, "virtualmachineinstances", "default", "web");
        let spec = |boot: &str| GuestSpec {
            namespace: "default".into(),
            name: "web".into(),
            boot_id: boot.into(),
        };
        // A report from an earlier boot (another VMI uid) changes nothing.
        report_agent(&app, &spec("old-uid"), Some(&debian()));
        assert_eq!(
            condition(&app.store.get(&key).unwrap(), "AgentConnected"),
            None
        );
        let current = spec(meta_str(&vmi, "uid"));
        report_agent(&app, &current, Some(&debian()));
        let now = app.store.get(&key).unwrap();
        assert_eq!(condition(&now, "AgentConnected").as_deref(), Some("True"));
        assert_eq!(now["status"]["guestOSInfo"]["id"], "debian");
        // What the guest-agent subresources serve (guestagent.rs) comes from the agent too.
        let users = crate::kubevirt::guestagent::answer_for(&now, "userlist").unwrap();
        assert_eq!(users["items"][0]["userName"], "root");
        let fs = crate::kubevirt::guestagent::answer_for(&now, "filesystemlist").unwrap();
        assert_eq!(fs["items"][0]["mountPoint"], "/");
        // The agent went away: the condition goes (virt-handler removes it).
        report_agent(&app, &current, None);
        assert_eq!(
            condition(&app.store.get(&key).unwrap(), "AgentConnected"),
            None
        );
    }
}
