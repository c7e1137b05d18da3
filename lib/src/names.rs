//! The product's shared names: the labels, annotations and field manager it writes, the
//! platform user, the CA's and the signer's API names, and the guest paths its cloud-init
//! writes. The ground floor of the crate: it imports nothing of it, so any module may name
//! these without reaching into a feature folder.

/// Label on everything kubectl-vm creates.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub const MANAGED_BY: &str = "kubectl-vm";
/// Label naming the VM an object was created for (disks, Secrets); `kubectl vm delete` finds
/// a VM's companions with [`companion_selector`].
pub const VM_LABEL: &str = "kubevm.io/vm";
/// Label naming the pool a VM (and its disks and Secrets) was created for.
pub const POOL_LABEL: &str = "kubevm.io/pool";

/// Label selector matching the objects created together with VM `name`.
pub fn companion_selector(name: &str) -> String {
    format!("{VM_LABEL}={name},{MANAGED_BY_LABEL}={MANAGED_BY}")
}

/// Field manager of every write kubectl-vm makes.
pub const FIELD_MANAGER: &str = "kubectl-vm";

/// The platform user that kubectl-vm logs in as with CA-signed certificates.
pub const DEFAULT_PLATFORM_USER: &str = "kubevm";

/// Namespace that holds the CA unless configured otherwise.
pub const CA_NAMESPACE: &str = "kubevm-system";

/// API group the signer serves.
pub const SSH_API_GROUP: &str = "ssh.kubevm.io";

/// Annotation `create` writes on VMs whose guests accept only VM-scoped principals
/// (an `AuthorizedPrincipalsFile` per login); `none` on VMs it made without platform SSH. VMs
/// of kubectl-vm without it were created before and trust every certificate of the CA whose
/// principal is the login name; the signer issues none such, and `kubectl vm ca migrate`
/// gives them the scoped form.
pub const TRUST_ANNOTATION: &str = "ssh.kubevm.io/trust";
/// Value of [`TRUST_ANNOTATION`] for VM-scoped trust.
pub const TRUST_VM_SCOPED: &str = "vm-scoped";
/// Value of [`TRUST_ANNOTATION`] on a VM of ours whose cloud-init has no platform SSH trust
/// (made with `--no-platform-ssh`, or a Windows guest): nothing to migrate.
pub const TRUST_NONE: &str = "none";
/// Annotation listing logins besides the platform user that may get certificates for the VM
/// (comma-separated; `create --guest-user` writes it).
pub const LOGINS_ANNOTATION: &str = "ssh.kubevm.io/logins";
/// Annotation naming the login `ssh`/`scp` use on the VM when none is given (written by
/// `enroll` on VMs that have no platform user).
pub const DEFAULT_LOGIN_ANNOTATION: &str = "ssh.kubevm.io/default-login";
/// Annotation that allows agent forwarding in certificates for the VM (`"true"`).
pub const AGENT_FORWARDING_ANNOTATION: &str = "ssh.kubevm.io/allow-agent-forwarding";
/// Annotation that allows X11 forwarding in certificates for the VM (`"true"`).
pub const X11_FORWARDING_ANNOTATION: &str = "ssh.kubevm.io/allow-x11-forwarding";

/// Trusted user CA keys file in the guest.
pub const CA_KEYS_PATH: &str = "/etc/ssh/kubevm_trusted_user_ca_keys";
/// sshd drop-in written by kubectl-vm.
pub const SSHD_DROP_IN_PATH: &str = "/etc/ssh/sshd_config.d/50-kubevm.conf";
/// Directory of the per-login principal files (`AuthorizedPrincipalsFile …/%u`).
pub const PRINCIPALS_DIR: &str = "/etc/ssh/kubevm_principals";
/// The CA's KRL in the guest (sshd `RevokedKeys`), decoded at every boot from
/// [`REVOKED_KRL_B64_PATH`].
pub const REVOKED_KRL_PATH: &str = "/etc/ssh/kubevm_revoked_keys.krl";
/// The KRL in base64, as the boot script's heredoc writes it.
pub const REVOKED_KRL_B64_PATH: &str = "/etc/ssh/kubevm_revoked_keys.krl.b64";
/// Host certificate file. Not named `ssh_host_*key*`: cloud-init deletes those on first boot.
pub const HOST_CERT_PATH: &str = "/etc/ssh/kubevm_ssh_host_ed25519_key-cert.pub";
/// Environment file for systemd units (`EnvironmentFile=`).
pub const ENV_FILE_PATH: &str = "/etc/kubevm/environment";
/// Login-shell environment script.
pub const PROFILE_PATH: &str = "/etc/profile.d/kubevm-env.sh";
