//! The VM settings of the seed's "Settings reference" beyond boot, size and cloud-init: user
//! data and SSH keys from existing Secrets, per-user key delivery (`accessCredentials`), the
//! CPU topology, the SMBIOS identity, Secure Boot and the DNS subdomain. Every limit the seed
//! states is checked here, without the cluster.

use std::str::FromStr;

use super::plan::{Firmware, OsType, PlanError, VmPlan};
use crate::validate::{self, ValidationError};

/// Most `--ssh-key-secret` Secrets (seed: `cloudInit.sshPublicKeySecrets`, "Up to 8").
pub const MAX_SSH_KEY_SECRETS: usize = 8;
/// Most guest users of one `--access-credential` (seed: `accessCredentials[].users`, 1–16).
pub const MAX_CREDENTIAL_USERS: usize = 16;
/// Most CPU sockets (seed: `cpu.sockets`, 1–32).
pub const MAX_SOCKETS: u32 = 32;
/// Most threads per core (seed: `cpu.threads`, 1–8).
pub const MAX_THREADS: u32 = 8;
/// Secret keys that hold user data (seed: `cloudInit.userDataSecret`, "key `userdata` or
/// `user-data`"), in the order they are looked up.
pub const USER_DATA_KEYS: [&str; 2] = ["userdata", "user-data"];

fn conflict(text: impl Into<String>) -> PlanError {
    PlanError::Conflict(text.into())
}

/// How the keys of an `--access-credential` reach the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeliveryMethod {
    /// Written by the qemu guest agent while the VM runs, and again whenever the Secret
    /// changes (KubeVirt `propagationMethod.qemuGuestAgent`).
    #[default]
    QemuGuestAgent,
    /// Written once at boot from the cloud-init data. KubeVirt's own `configDrive` propagation
    /// reaches only the image's default user, so kubectl-vm reads the Secret at creation and
    /// writes its keys for the listed users into the user data it builds.
    ConfigDrive,
}

impl DeliveryMethod {
    /// The seed's name of the method.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryMethod::QemuGuestAgent => "qemuGuestAgent",
            DeliveryMethod::ConfigDrive => "configDrive",
        }
    }
}

impl FromStr for DeliveryMethod {
    type Err = ValidationError;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.to_ascii_lowercase().as_str() {
            "qemuguestagent" => Ok(DeliveryMethod::QemuGuestAgent),
            "configdrive" => Ok(DeliveryMethod::ConfigDrive),
            _ => Err(ValidationError::Choice {
                what: "delivery method",
                value: value.to_string(),
                choices: "qemuGuestAgent, configDrive",
            }),
        }
    }
}

/// `--access-credential SECRET:USER[,USER…][:METHOD]`: the public keys in a Secret, for guest
/// users (seed: `accessCredentials[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessCredential {
    /// The Secret holding the keys (every non-empty line of every key is a public key).
    pub secret: String,
    /// Guest users that get the keys, 1 to [`MAX_CREDENTIAL_USERS`].
    pub users: Vec<String>,
    /// How they are delivered.
    pub method: DeliveryMethod,
}

impl FromStr for AccessCredential {
    type Err = ValidationError;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let bad = || ValidationError::Choice {
            what: "access credential",
            value: value.to_string(),
            choices: "SECRET:USER[,USER…][:qemuGuestAgent|configDrive]",
        };
        let mut parts = value.split(':');
        let secret = parts.next().unwrap_or_default();
        let users = parts.next().ok_or_else(bad)?;
        let method = match parts.next() {
            Some(m) => m.parse()?,
            None => DeliveryMethod::default(),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        if secret.is_empty() {
            return Err(bad());
        }
        Ok(AccessCredential {
            secret: secret.to_string(),
            users: users
                .split(',')
                .filter(|u| !u.is_empty())
                .map(str::to_string)
                .collect(),
            method,
        })
    }
}

/// The settings of this module, as the command fills them from its flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extras {
    /// `--sockets` (1–32).
    pub sockets: Option<u32>,
    /// `--threads` per core (1–8).
    pub threads: Option<u32>,
    /// `--uuid`: the SMBIOS system UUID, a version 4 UUID.
    pub uuid: Option<String>,
    /// `--serial`: the SMBIOS system serial number.
    pub serial: Option<String>,
    /// `--secure-boot`: UEFI Secure Boot.
    pub secure_boot: bool,
    /// `--persistent-efi`: keep the EFI variable store (NVRAM) across restarts.
    pub persistent_efi: bool,
    /// `--subdomain`: with the host name, the guest's DNS name.
    pub subdomain: Option<String>,
    /// `--user-data-secret`: user data from this existing Secret.
    pub user_data_secret: Option<String>,
    /// `--ssh-key-secret`: Secrets of public keys for the default user (or `--guest-user`).
    pub ssh_key_secrets: Vec<String>,
    /// `--access-credential`.
    pub access_credentials: Vec<AccessCredential>,
    /// `--console-log`: the platform keeps the serial console history (KubeVirt
    /// `spec.template.spec.domain.devices.logSerialConsole`; `kubectl vm logs` reads it).
    pub console_log: bool,
    /// `--network`: secondary networks, `NAME[=NETWORK]` as `set network --add` takes them.
    pub networks: Vec<String>,
    /// `--ip`, as given (repeatable): `ADDRESS`, Deckhouse's fixed address in the main network,
    /// or `NAME=ADDRESS/PREFIX`, a static address of secondary network NAME (`networks.rs`).
    pub ip: Vec<String>,
}

/// The CPU layout: `sockets × cores × threads` vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Topology {
    /// Sockets.
    pub sockets: u32,
    /// Cores per socket.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
}

/// Whether `text` is a version 4 (random) UUID in its canonical form
/// `xxxxxxxx-xxxx-4xxx-Nxxx-xxxxxxxxxxxx` with `N` one of `8 9 a b` (RFC 9562, sections 4.1
/// and 5.4). Upper-case hex digits are accepted, as the RFC asks of readers.
pub fn is_uuid_v4(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    let lengths_ok = groups.len() == 5
        && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()));
    lengths_ok
        && groups[2].starts_with('4')
        && groups[3].starts_with(|c: char| "89abAB".contains(c))
}

impl VmPlan {
    /// The CPU layout when `--sockets` or `--threads` is given: the vCPUs (`--cpu`, or
    /// `sockets × threads` without it) split into that many sockets and threads per core,
    /// the cores per socket derived (seed: "Cores derive from container `cpu`").
    pub fn topology(&self) -> Option<Topology> {
        let x = &self.extras;
        if x.sockets.is_none() && x.threads.is_none() {
            return None;
        }
        let sockets = x.sockets.unwrap_or(1).max(1);
        let threads = x.threads.unwrap_or(1).max(1);
        let vcpus = self.cpu.unwrap_or(sockets * threads);
        Some(Topology {
            sockets,
            cores: vcpus / (sockets * threads),
            threads,
        })
    }

    /// The checks of this module's settings (see the module docs); one line each.
    pub(crate) fn validate_extras(&self) -> Result<(), PlanError> {
        self.validate_topology()?;
        self.validate_firmware_identity()?;
        super::networks::validate(self).map_err(conflict)?;
        self.validate_key_sources()
    }

    fn validate_topology(&self) -> Result<(), PlanError> {
        let x = &self.extras;
        if let Some(sockets) = x.sockets
            && !(1..=MAX_SOCKETS).contains(&sockets)
        {
            return Err(conflict(format!(
                "--sockets {sockets} is out of range: give 1 to {MAX_SOCKETS} sockets"
            )));
        }
        if let Some(threads) = x.threads
            && !(1..=MAX_THREADS).contains(&threads)
        {
            return Err(conflict(format!(
                "--threads {threads} is out of range: give 1 to {MAX_THREADS} threads per core"
            )));
        }
        let Some(topology) = self.topology() else {
            return Ok(());
        };
        if let Some(why) = crate::platform::of(self.flavor).cpu_topology.reason() {
            return Err(conflict(why));
        }
        if self.instancetype.is_some() || self.infer_from_image {
            let sizing = if self.infer_from_image {
                "--infer-from-image"
            } else {
                "--instancetype"
            };
            return Err(conflict(format!(
                "{sizing} cannot be used with --sockets or --threads: the instancetype sets the CPU"
            )));
        }
        let per_core = topology.sockets * topology.threads;
        let vcpus = self.cpu.unwrap_or(per_core);
        if !vcpus.is_multiple_of(per_core) {
            return Err(conflict(format!(
                "--cpu {vcpus} cannot be split into {} sockets × {} threads: give a multiple of {per_core}",
                topology.sockets, topology.threads
            )));
        }
        Ok(())
    }

    fn validate_firmware_identity(&self) -> Result<(), PlanError> {
        let x = &self.extras;
        let caps = crate::platform::of(self.flavor);
        let smbios = caps.smbios_fields;
        if let Some(uuid) = &x.uuid
            && !is_uuid_v4(uuid)
        {
            return Err(conflict(format!(
                "--uuid {uuid:?} is not a version 4 UUID: give xxxxxxxx-xxxx-4xxx-[89ab]xxx-xxxxxxxxxxxx (e.g. from uuidgen -r)"
            )));
        }
        if let Some(serial) = &x.serial
            && (serial.is_empty() || !serial.chars().all(|c| c.is_ascii_graphic() || c == ' '))
        {
            return Err(conflict(format!(
                "--serial {serial:?}: give printable ASCII characters"
            )));
        }
        if let Some(why) = smbios.reason() {
            for (set, flag) in [
                (x.uuid.is_some(), "--uuid"),
                (x.serial.is_some(), "--serial"),
            ] {
                if set {
                    return Err(conflict(format!("{flag} {why}")));
                }
            }
        }
        if x.console_log
            && let Some(why) = crate::platform::of(self.flavor).console_log.reason()
        {
            return Err(conflict(format!("--console-log is refused: {why}")));
        }
        if x.secure_boot || x.persistent_efi {
            let flag = if x.secure_boot {
                "--secure-boot"
            } else {
                "--persistent-efi"
            };
            if self.firmware == Some(Firmware::Bios) {
                return Err(conflict(format!(
                    "{flag} needs UEFI: it cannot be used with --firmware bios"
                )));
            }
        }
        if x.secure_boot {
            if let Some(why) = caps.secure_boot.reason() {
                return Err(conflict(why));
            }
            if !x.persistent_efi {
                return Err(conflict(
                    "--secure-boot needs persistent EFI NVRAM (--persistent-efi): without it a Secure Boot guest loses its boot state on reboot",
                ));
            }
        }
        if x.persistent_efi
            && let Some(why) = caps.persistent_efi.reason()
        {
            return Err(conflict(why));
        }
        if let Some(subdomain) = &x.subdomain {
            validate::dns_label("subdomain", subdomain).map_err(|_| {
                conflict(format!(
                    "--subdomain {subdomain:?} is not valid: use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
                ))
            })?;
            if let Some(why) = caps.subdomain.reason() {
                return Err(conflict(why));
            }
        }
        Ok(())
    }

    fn validate_key_sources(&self) -> Result<(), PlanError> {
        let x = &self.extras;
        if let Some(secret) = &x.user_data_secret {
            validate::dns_subdomain("Secret", secret)?;
            if *secret == self.cloudinit_secret_name() {
                return Err(conflict(format!(
                    "--user-data-secret {secret} is the Secret kubectl vm writes the merged user data to: copy it to another name"
                )));
            }
            if self.guest.user_data.is_some() && !self.guest.user_data_from_secret {
                return Err(conflict(
                    "--cloud-init and --user-data-secret cannot be used together: give the user data once",
                ));
            }
        }
        if x.ssh_key_secrets.len() > MAX_SSH_KEY_SECRETS {
            return Err(conflict(format!(
                "--ssh-key-secret is given {} times: at most {MAX_SSH_KEY_SECRETS} Secrets",
                x.ssh_key_secrets.len()
            )));
        }
        for (i, secret) in x.ssh_key_secrets.iter().enumerate() {
            validate::dns_subdomain("Secret", secret)?;
            if x.ssh_key_secrets[..i].contains(secret) {
                return Err(conflict(format!(
                    "--ssh-key-secret {secret} is given twice: give each Secret once"
                )));
            }
        }
        for credential in &x.access_credentials {
            let secret = &credential.secret;
            validate::dns_subdomain("Secret", secret)?;
            let count = credential.users.len();
            if count == 0 || count > MAX_CREDENTIAL_USERS {
                return Err(conflict(format!(
                    "--access-credential {secret}: {count} users; give 1 to {MAX_CREDENTIAL_USERS}"
                )));
            }
            for (i, user) in credential.users.iter().enumerate() {
                super::plan::check_user_name("--access-credential user", user)?;
                if credential.users[..i].contains(user) {
                    return Err(conflict(format!(
                        "--access-credential {secret}: user {user} is given twice"
                    )));
                }
            }
            if credential.method == DeliveryMethod::QemuGuestAgent && !self.guest.guest_agent {
                return Err(conflict(format!(
                    "--access-credential {secret} is delivered by the guest agent, which --no-guest-agent leaves out: add :configDrive or drop --no-guest-agent"
                )));
            }
        }
        if self.os == OsType::Windows {
            for (set, flag) in [
                (!x.ssh_key_secrets.is_empty(), "--ssh-key-secret"),
                (!x.access_credentials.is_empty(), "--access-credential"),
            ] {
                if set {
                    return Err(conflict(format!(
                        "{flag} is applied on Linux guests; for --os windows put the keys into your --cloud-init data"
                    )));
                }
            }
        }
        Ok(())
    }

    /// Credentials whose keys kubectl-vm reads at creation and writes into the user data:
    /// `configDrive` ones, and on Deckhouse (which has no `accessCredentials`) all of them.
    pub fn boot_time_credentials(&self) -> impl Iterator<Item = &AccessCredential> {
        self.extras.access_credentials.iter().filter(|c| {
            !crate::platform::of(self.flavor).access_credentials.is_yes()
                || c.method == DeliveryMethod::ConfigDrive
        })
    }
}

/// The public keys in a Secret's data, as KubeVirt reads an access-credential Secret: every
/// key is a file and every non-empty line of it a key (`#` comments skipped here too).
pub fn keys_in_secret(data: &[(String, Vec<u8>)]) -> Vec<String> {
    data.iter()
        .flat_map(|(_, value)| {
            String::from_utf8_lossy(value)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests;
