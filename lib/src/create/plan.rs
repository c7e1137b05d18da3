//! `VmPlan`: every input of `kubectl vm create`, checked for conflicts before any object is
//! built. The command fills a plan from its flags; [`VmPlan::validate`] says, in one line, which
//! flags cannot go together on the target platform.

pub use crate::names::DEFAULT_PLATFORM_USER;

use thiserror::Error;

use crate::ca::HostKeys;
use crate::flavor::Flavor;
use crate::quantity::Quantity;
use crate::validate::{self, Checksum, DataDisk, DiskBus, EnvVar, Label, ValidationError};

pub use super::extras::{AccessCredential, DeliveryMethod, Extras, Topology};
pub use super::options::{CoreFraction, Firmware, ImageRef, KindRef, OsType, RunStrategy};

/// A plan that cannot be turned into objects.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    /// A value is malformed.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// Flags that cannot be used together (or not on this platform); the text says which.
    #[error("{0}")]
    Conflict(String),
}

fn conflict(text: impl Into<String>) -> PlanError {
    PlanError::Conflict(text.into())
}

/// Where the boot disk comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootSource {
    /// `--image IMAGE`: a container disk image (KubeVirt), or on Deckhouse also a
    /// `vi/NAME` / `cvi/NAME` image (see [`ImageRef`]). With `ephemeral` (KubeVirt only) the VM
    /// boots from the image directly and loses its changes on restart; otherwise it is copied
    /// into a new persistent disk.
    ContainerDisk {
        /// Image reference.
        image: String,
        /// Boot from the image itself instead of a copy.
        ephemeral: bool,
    },
    /// `--url URL [--checksum ALGO:HEX]...`: a disk image downloaded over HTTP(S).
    Url {
        /// `http://` or `https://` URL of a qcow2/raw/… image.
        url: String,
        /// Expected digests.
        checksums: Vec<Checksum>,
    },
    /// `--clone-pvc [NAMESPACE/]NAME` (KubeVirt): a copy of an existing PVC.
    ClonePvc {
        /// `[namespace/]name` of the source PVC.
        name: String,
    },
    /// `--blank SIZE`: an empty disk (e.g. to install from an ISO later).
    Blank {
        /// Capacity.
        size: Quantity,
    },
    /// `--disk NAME`: an existing PVC (KubeVirt) or VirtualDisk (Deckhouse), used as is.
    ExistingDisk {
        /// Name of the PVC or VirtualDisk.
        name: String,
    },
}

/// The boot-source flags as given, before they are reduced to one [`BootSource`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootFlags {
    /// `--image`.
    pub image: Option<String>,
    /// `--ephemeral`.
    pub ephemeral: bool,
    /// `--url`.
    pub url: Option<String>,
    /// `--checksum` (repeatable).
    pub checksums: Vec<Checksum>,
    /// `--clone-pvc`.
    pub clone_pvc: Option<String>,
    /// `--blank`.
    pub blank: Option<Quantity>,
    /// `--disk`.
    pub disk: Option<String>,
}

impl BootSource {
    /// Reduce the boot flags to exactly one source, or say which flags conflict.
    pub fn from_flags(flags: BootFlags) -> Result<BootSource, PlanError> {
        if flags.ephemeral && flags.image.is_none() {
            return Err(conflict(
                "--ephemeral needs --image: only a container disk image can be booted without copying it",
            ));
        }
        if !flags.checksums.is_empty() && flags.url.is_none() {
            return Err(conflict(
                "--checksum needs --url: it verifies the downloaded image",
            ));
        }
        let given: Vec<&str> = [
            (flags.image.is_some(), "--image"),
            (flags.url.is_some(), "--url"),
            (flags.clone_pvc.is_some(), "--clone-pvc"),
            (flags.blank.is_some(), "--blank"),
            (flags.disk.is_some(), "--disk"),
        ]
        .into_iter()
        .filter_map(|(set, flag)| set.then_some(flag))
        .collect();
        if given.len() > 1 {
            return Err(conflict(format!(
                "{} cannot be used together: give one boot source",
                given.join(" and ")
            )));
        }
        if let Some(image) = flags.image {
            Ok(BootSource::ContainerDisk {
                image,
                ephemeral: flags.ephemeral,
            })
        } else if let Some(url) = flags.url {
            Ok(BootSource::Url {
                url,
                checksums: flags.checksums,
            })
        } else if let Some(name) = flags.clone_pvc {
            Ok(BootSource::ClonePvc { name })
        } else if let Some(size) = flags.blank {
            Ok(BootSource::Blank { size })
        } else if let Some(name) = flags.disk {
            Ok(BootSource::ExistingDisk { name })
        } else {
            Err(conflict(
                "no boot source: give one of --image, --url, --clone-pvc, --blank or --disk",
            ))
        }
    }
}

/// What the guest is configured with through cloud-init.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestConfig {
    /// `--cloud-init FILE`: the user's own user data (`#cloud-config`, a script, a MIME
    /// multipart archive, …), merged with what kubectl-vm injects.
    pub user_data: Option<String>,
    /// `--ssh-key`: public keys (OpenSSH one-line form) for the default user or `--guest-user`.
    pub ssh_keys: Vec<String>,
    /// `--guest-user NAME`: a user to create (passwordless sudo) that gets the `--ssh-key` keys.
    pub user: Option<String>,
    /// `--env KEY=VALUE`: environment for the guest's services and login shells.
    pub env: Vec<EnvVar>,
    /// Install and enable qemu-guest-agent (on by default).
    pub guest_agent: bool,
    /// Whether `user_data` was read from the `--user-data-secret` Secret: then the merged
    /// result is kept in kubectl-vm's own Secret, never inline.
    pub user_data_from_secret: bool,
    /// Keys read from access-credential Secrets at creation, per guest user, for the users
    /// whose keys are delivered at boot (see [`VmPlan::boot_time_credentials`]).
    pub boot_keys: Vec<(String, Vec<String>)>,
}

impl Default for GuestConfig {
    fn default() -> Self {
        GuestConfig {
            user_data: None,
            ssh_keys: Vec::new(),
            user: None,
            env: Vec::new(),
            guest_agent: true,
            user_data_from_secret: false,
            boot_keys: Vec::new(),
        }
    }
}

/// Certificate-based SSH access that kubectl-vm sets up in Linux guests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformSsh {
    /// Inject the CA trust and platform user (`--no-platform-ssh` turns it off).
    pub enabled: bool,
    /// The platform user (default `kubevm`).
    pub user: String,
    /// Public keys of the platform SSH CA (OpenSSH one-line form), all trusted.
    pub ca_public_keys: Vec<String>,
    /// A host key and its CA-signed certificate, so clients can verify the VM.
    pub host: Option<HostKeys>,
    /// The CA's KRL ([`crate::ca::krl`]) for the guest's sshd `RevokedKeys`; empty: a KRL
    /// that revokes nothing.
    pub revoked_krl: Vec<u8>,
}

impl Default for PlatformSsh {
    fn default() -> Self {
        PlatformSsh {
            enabled: true,
            user: DEFAULT_PLATFORM_USER.to_string(),
            ca_public_keys: Vec::new(),
            host: None,
            revoked_krl: Vec::new(),
        }
    }
}

/// The VirtualMachineClass used on Deckhouse when `--class` is not given.
pub const DEFAULT_CLASS: &str = "generic";
/// Cores when `--cpu` is not given.
pub const DEFAULT_CORES: u32 = 1;
/// Memory when `--memory` is not given.
pub const DEFAULT_MEMORY: Quantity = Quantity::from_bytes(1 << 30);
/// Size of an imported boot disk when `--disk-size` is not given.
pub const DEFAULT_DISK_SIZE: Quantity = Quantity::from_bytes(10 << 30);

/// Everything `kubectl vm create` was asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmPlan {
    /// VM name (DNS label).
    pub name: String,
    /// Namespace to create in.
    pub namespace: String,
    /// Target platform.
    pub flavor: Flavor,
    /// The boot disk's source.
    pub boot: BootSource,
    /// `--disk-size`: size of a boot disk that is created (default [`DEFAULT_DISK_SIZE`]).
    pub disk_size: Option<Quantity>,
    /// `--storage-class` of the disks kubectl-vm creates (the boot disk, and data disks
    /// without `class=`); the cluster default when absent.
    pub storage_class: Option<String>,
    /// `--boot-bus` (KubeVirt): virtio unless `--os windows` (sata).
    pub boot_bus: Option<DiskBus>,
    /// `--cpu` cores (default [`DEFAULT_CORES`]).
    pub cpu: Option<u32>,
    /// `--memory` (default [`DEFAULT_MEMORY`]).
    pub memory: Option<Quantity>,
    /// `--core-fraction` (Deckhouse); the class default when absent.
    pub core_fraction: Option<CoreFraction>,
    /// `--class` (Deckhouse VirtualMachineClass; default [`DEFAULT_CLASS`]).
    pub class: Option<String>,
    /// `--instancetype` (KubeVirt).
    pub instancetype: Option<KindRef>,
    /// `--preference` (KubeVirt).
    pub preference: Option<KindRef>,
    /// `--infer-from-image` (KubeVirt): virt-api takes the instancetype (and, unless
    /// `--preference` is given, the preference) from the labels CDI defines on the DataSource
    /// the VM boots from.
    pub infer_from_image: bool,
    /// `--firmware`; the platform default (BIOS) when absent.
    pub firmware: Option<Firmware>,
    /// `--os`.
    pub os: OsType,
    /// `--timezone` (IANA name such as `Europe/Berlin`).
    pub timezone: Option<String>,
    /// `--hostname`; the VM name when absent.
    pub hostname: Option<String>,
    /// `--run-strategy`; `Always` when absent, or see [`VmPlan::run_strategy`].
    pub run_strategy: Option<RunStrategy>,
    /// `--stopped`: create the VM powered off (but startable).
    pub stopped: bool,
    /// `--label key=value` for the VM.
    pub labels: Vec<Label>,
    /// `--data-disk` empty disks to create and attach.
    pub data_disks: Vec<DataDisk>,
    /// Guest configuration (cloud-init).
    pub guest: GuestConfig,
    /// Platform SSH trust.
    pub platform_ssh: PlatformSsh,
    /// The seed's further settings (topology, SMBIOS, Secure Boot, key Secrets, …).
    pub extras: Extras,
    /// `--replicas N`: a pool of N VMs named after this plan (see [`super::pool`]).
    pub replicas: Option<u32>,
    /// The pool this plan is a replica (or the template) of; adds [`super::pool::POOL_LABEL`].
    pub pool: Option<String>,
    /// `--node-selector`, `--toleration`, `--node-affinity`, `--spread-by`,
    /// `--priority-class`: where the VM may run (additions only).
    pub placement: crate::placement::Placement,
}

impl VmPlan {
    /// A plan with every optional input at its default.
    pub fn new(name: &str, namespace: &str, flavor: Flavor, boot: BootSource) -> VmPlan {
        VmPlan {
            name: name.to_string(),
            namespace: namespace.to_string(),
            flavor,
            boot,
            disk_size: None,
            storage_class: None,
            boot_bus: None,
            cpu: None,
            memory: None,
            core_fraction: None,
            class: None,
            instancetype: None,
            preference: None,
            infer_from_image: false,
            firmware: None,
            os: OsType::Linux,
            timezone: None,
            hostname: None,
            run_strategy: None,
            stopped: false,
            labels: Vec::new(),
            data_disks: Vec::new(),
            guest: GuestConfig::default(),
            platform_ssh: PlatformSsh::default(),
            extras: Extras::default(),
            replicas: None,
            pool: None,
            placement: Default::default(),
        }
    }

    /// Cores the VM gets.
    pub fn cores(&self) -> u32 {
        self.cpu.unwrap_or(DEFAULT_CORES)
    }

    /// Memory the VM gets.
    pub fn memory_size(&self) -> Quantity {
        self.memory.unwrap_or(DEFAULT_MEMORY)
    }

    /// The Deckhouse VirtualMachineClass.
    pub fn class_name(&self) -> &str {
        self.class.as_deref().unwrap_or(DEFAULT_CLASS)
    }

    /// Bus of the boot disk.
    pub fn boot_disk_bus(&self) -> DiskBus {
        self.boot_bus.unwrap_or(match self.os {
            OsType::Linux => DiskBus::Virtio,
            // Stock Windows has no virtio drivers.
            OsType::Windows => DiskBus::Sata,
        })
    }

    /// The effective run strategy: `--stopped` alone means "created off, startable later",
    /// which is `Halted` on KubeVirt (start switches it to Always) and `Manual` on Deckhouse
    /// (where an `AlwaysOff` VM cannot be started by an operation).
    pub fn run_strategy(&self) -> RunStrategy {
        match (self.run_strategy, self.stopped) {
            (Some(strategy), _) => strategy,
            (None, false) => RunStrategy::Always,
            (None, true) => match self.flavor {
                Flavor::KubeVirt => RunStrategy::Halted,
                Flavor::Deckhouse => RunStrategy::Manual,
            },
        }
    }

    /// Name of the boot disk object kubectl-vm creates (DataVolume or VirtualDisk).
    pub fn boot_disk_name(&self) -> String {
        format!("{}-root", self.name)
    }

    /// Name of the object behind a `--data-disk`.
    pub fn data_disk_name(&self, disk: &DataDisk) -> String {
        format!("{}-{}", self.name, disk.name)
    }

    /// Name of the Secret that holds user data too large or too sensitive to inline.
    pub fn cloudinit_secret_name(&self) -> String {
        format!("{}-cloudinit", self.name)
    }

    /// Whether a boot disk is created (and so `--disk-size`/`--storage-class` apply).
    pub fn creates_boot_disk(&self) -> bool {
        match &self.boot {
            BootSource::ContainerDisk { ephemeral, .. } => !ephemeral,
            BootSource::Url { .. } | BootSource::ClonePvc { .. } | BootSource::Blank { .. } => true,
            BootSource::ExistingDisk { .. } => false,
        }
    }

    /// Check the plan for malformed values and flag conflicts; the error is one line.
    pub fn validate(&self) -> Result<(), PlanError> {
        validate::dns_label("VM", &self.name)?;
        validate::dns_label("namespace", &self.namespace)?;
        self.validate_limits()?;
        self.validate_boot()?;
        self.validate_sizing()?;
        self.validate_disks()?;
        self.validate_machine()?;
        self.validate_extras()?;
        self.validate_guest()?;
        self.validate_placement()?;
        super::pool::validate(self)
    }

    /// A new VM's placement only adds, and `--spread-by` spreads the replicas of a pool.
    fn validate_placement(&self) -> Result<(), PlanError> {
        self.placement
            .refuse_removals()
            .map_err(|e| conflict(e.to_string()))?;
        if self.placement.spread.is_some() && self.replicas.is_none() && self.pool.is_none() {
            return Err(conflict(
                "--spread-by spreads the replicas of a pool: give --replicas N",
            ));
        }
        Ok(())
    }

    fn validate_boot(&self) -> Result<(), PlanError> {
        let caps = crate::platform::of(self.flavor);
        match &self.boot {
            BootSource::ContainerDisk { image, ephemeral } => {
                if image.is_empty() {
                    return Err(conflict("--image is empty: give an image reference"));
                }
                match (ImageRef::parse(image), self.flavor) {
                    (ImageRef::Registry(_), _) => {}
                    (ImageRef::DataSource { namespace, name }, Flavor::KubeVirt) => {
                        if let Some(ns) = namespace {
                            validate::dns_label("namespace", ns)?;
                        }
                        validate::dns_subdomain("image", name)?;
                        if *ephemeral {
                            return Err(conflict(
                                "--ephemeral boots a container image; a DataSource is cloned into a disk: drop --ephemeral",
                            ));
                        }
                    }
                    (ImageRef::DataSource { .. }, Flavor::Deckhouse) => {
                        return Err(conflict(format!(
                            "--image {image} names a CDI DataSource, but the cluster runs Deckhouse; use vi/NAME or cvi/NAME (for a Docker Hub image write docker.io/{image})"
                        )));
                    }
                    (_, Flavor::KubeVirt) => {
                        return Err(conflict(format!(
                            "--image {image} names a Deckhouse VirtualImage, but the cluster runs KubeVirt; for a Docker Hub image write docker.io/{image}"
                        )));
                    }
                    (ImageRef::VirtualImage(name) | ImageRef::ClusterVirtualImage(name), _) => {
                        validate::dns_subdomain("image", name)?;
                    }
                }
                if *ephemeral && let Some(why) = caps.ephemeral_boot.reason() {
                    return Err(conflict(why));
                }
            }
            BootSource::Url { url, checksums } => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(conflict(format!(
                        "--url {url:?} must start with http:// or https://"
                    )));
                }
                check_url_authority(url).map_err(conflict)?;
                for (i, c) in checksums.iter().enumerate() {
                    if checksums[..i].iter().any(|o| o.algo == c.algo) {
                        return Err(conflict(format!(
                            "--checksum {} is given twice: give one digest per algorithm",
                            c.algo.as_str()
                        )));
                    }
                }
                if caps.cdi_checksums_only
                    && !checksums.is_empty()
                    && !checksums.iter().any(|c| c.algo.supported_by_cdi())
                {
                    return Err(conflict(
                        "streebog checksums are Deckhouse-only; on KubeVirt give an md5, sha1, sha256 or sha512 --checksum",
                    ));
                }
            }
            BootSource::ClonePvc { name } => {
                if let Some(why) = caps.clone_pvc.reason() {
                    return Err(conflict(why));
                }
                let (namespace, pvc) = name.split_once('/').unwrap_or(("", name));
                if !namespace.is_empty() {
                    validate::dns_label("namespace", namespace)?;
                }
                validate::dns_subdomain("PVC", pvc)?;
            }
            BootSource::Blank { size } => {
                if size.bytes() == 0 {
                    return Err(conflict(
                        "--blank needs a size greater than zero (e.g. 20Gi)",
                    ));
                }
                if self.disk_size.is_some() {
                    return Err(conflict(
                        "--disk-size cannot be used with --blank SIZE, which already sets the disk's size",
                    ));
                }
            }
            BootSource::ExistingDisk { name } => validate::dns_subdomain("disk", name)?,
        }
        if !self.creates_boot_disk() {
            for (set, flag) in [
                (self.disk_size.is_some(), "--disk-size"),
                (
                    self.storage_class.is_some() && self.data_disks.is_empty(),
                    "--storage-class",
                ),
            ] {
                if set {
                    return Err(conflict(format!(
                        "{flag} applies to a boot disk that kubectl vm creates; it cannot be used with --disk or --ephemeral"
                    )));
                }
            }
        }
        if let Some(class) = &self.storage_class {
            validate::dns_subdomain("storage class", class)?;
        }
        if self.creates_boot_disk() {
            validate::dns_label("disk", &self.boot_disk_name())
                .map_err(|_| conflict(format!("the VM name is too long for its boot disk name {}: use a VM name of at most 58 characters", self.boot_disk_name())))?;
        }
        if self.boot_bus.is_some()
            && let Some(why) = caps.boot_bus_choice.reason()
        {
            return Err(conflict(why));
        }
        Ok(())
    }

    fn validate_sizing(&self) -> Result<(), PlanError> {
        match self.flavor {
            Flavor::KubeVirt => {
                let deckhouse_only = [
                    (self.core_fraction.is_some(), "--core-fraction"),
                    (self.class.is_some(), "--class"),
                ];
                for (set, flag) in deckhouse_only {
                    if set {
                        return Err(conflict(format!(
                            "{flag} is Deckhouse-only; on KubeVirt use --cpu/--memory or --instancetype"
                        )));
                    }
                }
                if self.infer_from_image {
                    if self.instancetype.is_some() {
                        return Err(conflict(
                            "--infer-from-image cannot be used with --instancetype: the image names the instancetype",
                        ));
                    }
                    let from_data_source = matches!(&self.boot,
                        BootSource::ContainerDisk { image, .. }
                            if matches!(ImageRef::parse(image), ImageRef::DataSource { .. }));
                    if !from_data_source {
                        return Err(conflict(
                            "--infer-from-image reads the labels of a DataSource: boot from one with --image ds/[NAMESPACE/]NAME",
                        ));
                    }
                }
                if self.instancetype.is_some() || self.infer_from_image {
                    let sizing = if self.infer_from_image {
                        "--infer-from-image"
                    } else {
                        "--instancetype"
                    };
                    for (set, flag) in [
                        (self.cpu.is_some(), "--cpu"),
                        (self.memory.is_some(), "--memory"),
                    ] {
                        if set {
                            return Err(conflict(format!(
                                "{sizing} cannot be used with {flag}: the instancetype sets CPU and memory"
                            )));
                        }
                    }
                }
            }
            Flavor::Deckhouse => {
                for (set, flag) in [
                    (self.instancetype.is_some(), "--instancetype"),
                    (self.preference.is_some(), "--preference"),
                    (self.infer_from_image, "--infer-from-image"),
                ] {
                    if set {
                        return Err(conflict(format!(
                            "{flag} is KubeVirt-only; on Deckhouse use --class with --cpu/--memory"
                        )));
                    }
                }
                if let Some(class) = &self.class {
                    validate::dns_subdomain("VirtualMachineClass", class)?;
                }
            }
        }
        if self.memory.is_some_and(|m| m.bytes() < 1 << 20) {
            return Err(conflict(
                "--memory is too small: give at least 1Mi (e.g. 2Gi)",
            ));
        }
        if self.cpu == Some(0) {
            return Err(ValidationError::Cpu { value: "0".into() }.into());
        }
        Ok(())
    }

    fn validate_disks(&self) -> Result<(), PlanError> {
        let caps = crate::platform::of(self.flavor);
        for (i, disk) in self.data_disks.iter().enumerate() {
            validate::dns_label("disk", &disk.name)?;
            if self.data_disks[..i].iter().any(|d| d.name == disk.name) {
                return Err(conflict(format!(
                    "--data-disk {} is given twice: disk names must be unique",
                    disk.name
                )));
            }
            if crate::create::RESERVED_VOLUME_NAMES.contains(&disk.name.as_str())
                || disk.name == "root"
            {
                return Err(conflict(format!(
                    "--data-disk name {:?} is reserved; choose another name",
                    disk.name
                )));
            }
            validate::dns_label("disk", &self.data_disk_name(disk)).map_err(|_| {
                conflict(format!("the data disk name {} is longer than 63 characters: use shorter VM or disk names", self.data_disk_name(disk)))
            })?;
            if let (Some(why), Some(_)) = (caps.disk_bus_choice.reason(), &disk.bus) {
                return Err(conflict(format!("--data-disk {}: {why}", disk.name)));
            }
        }
        if let Some(max) = caps.max_block_devices
            && self.data_disks.len() + 1 > max
        {
            return Err(conflict(format!(
                "too many --data-disk: a VM on {} takes at most {max} disks including the boot disk",
                self.flavor.display_name()
            )));
        }
        Ok(())
    }

    fn validate_machine(&self) -> Result<(), PlanError> {
        if let Some(hostname) = &self.hostname {
            validate::dns_label("hostname", hostname)?;
        }
        if let Some(tz) = &self.timezone {
            let ok = !tz.is_empty()
                && !tz.starts_with('/')
                && !tz.contains("..")
                && tz
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/_+-".contains(c));
            if !ok {
                return Err(conflict(format!(
                    "--timezone {tz:?} is not a time zone name: use an IANA name such as Europe/Berlin or UTC"
                )));
            }
        }
        if self.stopped
            && let Some(strategy) = self.run_strategy.filter(|s| s.starts_at_creation())
        {
            return Err(conflict(format!(
                "--stopped cannot be used with --run-strategy {}: that strategy starts the VM at once; use Manual or Halted",
                strategy.kubevirt()
            )));
        }
        Ok(())
    }

    fn validate_guest(&self) -> Result<(), PlanError> {
        let guest = &self.guest;
        if self.os == OsType::Windows {
            for (set, flag) in [
                (!guest.env.is_empty(), "--env"),
                (!guest.ssh_keys.is_empty(), "--ssh-key"),
                (guest.user.is_some(), "--guest-user"),
            ] {
                if set {
                    return Err(conflict(format!(
                        "{flag} is applied by cloud-init on Linux guests; for --os windows put it into your --cloud-init data"
                    )));
                }
            }
            return Ok(());
        }
        for key in &guest.ssh_keys {
            let key = key.trim();
            if key.is_empty() || key.contains('\n') || !key.contains(' ') {
                return Err(conflict(format!(
                    "--ssh-key {key:?} is not an OpenSSH public key: give one line such as \"ssh-ed25519 AAAA... comment\""
                )));
            }
        }
        if let Some(user) = &guest.user {
            check_user_name("--guest-user", user)?;
            if self.platform_ssh.enabled && *user == self.platform_ssh.user {
                return Err(conflict(format!(
                    "--guest-user {user} is the platform user: choose another name"
                )));
            }
        }
        if self.platform_ssh.enabled {
            check_user_name("platform user", &self.platform_ssh.user)?;
            if self.platform_ssh.ca_public_keys.is_empty() {
                return Err(conflict(
                    "platform SSH is on but no CA public key is known: run `kubectl vm ca init` first, or pass --no-platform-ssh",
                ));
            }
            for key in &self.platform_ssh.ca_public_keys {
                if key.trim().is_empty() || key.contains('\n') {
                    return Err(conflict(
                        "a platform CA public key must be one OpenSSH line",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Check a Linux user name: lowercase letter or `_`, then lowercase letters, digits, `_` or
/// `-`, at most 32 characters.
pub(crate) fn check_user_name(what: &str, user: &str) -> Result<(), PlanError> {
    let mut chars = user.chars();
    let ok = user.len() <= 32
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(conflict(format!(
            "{what} {user:?} is not a valid user name: use lowercase letters, digits, '_' and '-', starting with a letter, at most 32 characters"
        )))
    }
}

/// The host and port of an `http(s)://` URL: a host, and a port (when given) in 1-65535.
fn check_url_authority(url: &str) -> std::result::Result<(), String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("--url {url:?} is not a valid URL: {e}"))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("--url {url:?} has no host"));
    }
    let authority = uri.authority().map_or("", |a| a.as_str());
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let after_host = host_port.rsplit_once(']').map_or(host_port, |(_, r)| r);
    if let Some((_, port)) = after_host.rsplit_once(':')
        && !port.is_empty()
        && !port.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Err(format!(
            "--url {url:?}: {port} is not a port number (1-65535)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
