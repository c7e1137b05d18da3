//! The guest agent of sshd guests, for access credentials only: what virt-launcher does
//! through qemu-guest-agent (`guest-ssh-add-authorized-keys` with `reset: true`, i.e. the
//! user's whole `authorized_keys` replaced by the keys of every accessCredentials entry for that
//! user; `pkg/virt-launcher/virtwrap/access-credentials/access_credentials.go`) done inside the
//! guest's mount namespace with `nsenter`, with qemu-guest-agent's file handling
//! (`qga/commands-posix-ssh.c`: the user must exist, `~/.ssh` 0700 and `authorized_keys` 0600
//! owned by the user, keys that are empty or start with `#` refused). The VMI condition
//! `AccessCredentialsSynchronized` tells how it went, as virt-handler reports it. Passwords
//! (`userPassword`) are set like qemu-guest-agent's `guest-set-user-password`, with `chpasswd`.

use std::process::{Command, Stdio};

use crate::core::app::App;
use crate::core::guest::GuestSpec;

pub use crate::core::qemu_guest::credentials::Synced;
use crate::core::qemu_guest::credentials::{self, GuestWrite};

/// Shell run in the guest: `$1` the user, the rest the keys.
const WRITE_KEYS: &str = r#"u="$1"; shift
for k; do case "$k" in ''|'#'*) echo "invalid OpenSSH public key: $k" >&2; exit 1;; esac; done
h=$(getent passwd "$u" | cut -d: -f6)
[ -n "$h" ] || { echo "failed to get user '$u': no such user" >&2; exit 1; }
# Only /etc and /home are the guest's own (overlays); anything else is the machine running us.
case "$h" in /home/*) ;; *) echo "home directory $h of '$u' is outside /home, which is all an sshd guest owns" >&2; exit 1;; esac
g=$(id -g "$u")
mkdir -p "$h/.ssh" && chown "$u:$g" "$h/.ssh" && chmod 700 "$h/.ssh"
f="$h/.ssh/authorized_keys"
: > "$f.kubevm-new"
for k; do printf '%s\n' "$k" >> "$f.kubevm-new"; done
chown "$u:$g" "$f.kubevm-new" && chmod 600 "$f.kubevm-new" && mv -f "$f.kubevm-new" "$f"
"#;

/// Replace `user`'s authorized keys in the guest whose sshd has `pid`.
pub fn write_keys(pid: u32, user: &str, keys: &[String]) -> Result<(), String> {
    let out = Command::new("nsenter")
        .arg("--mount")
        .arg(format!("--target={pid}"))
        .args(["--", "/bin/sh", "-c", WRITE_KEYS, "sh", user])
        .args(keys)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("nsenter: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// Set `user`'s password in the guest whose sshd has `pid`, as qemu-guest-agent's
/// `guest-set-user-password` does on Linux (`chpasswd`, the clear text on its stdin).
pub fn set_password(pid: u32, user: &str, password: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("nsenter")
        .arg("--mount")
        .arg(format!("--target={pid}"))
        .args(["--", "chpasswd"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nsenter: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped");
    stdin
        .write_all(format!("{user}:{password}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "child process has failed to set user password: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// One round: when the current VMI's credentials differ from what was last written, write
/// them and set `AccessCredentialsSynchronized`.
pub fn sync(app: &App, spec: &GuestSpec, pid: u32, synced: &mut Synced) {
    credentials::sync(app, spec, synced, |write| match write {
        GuestWrite::Keys(user, keys) => write_keys(pid, user, keys),
        GuestWrite::Password(user, password) => set_password(pid, user, password),
    });
}
