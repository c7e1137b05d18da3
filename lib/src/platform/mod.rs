//! The data half of the platform seam: what each platform serves, supports and calls things,
//! as one table per platform ([`kubevirt::CAPABILITIES`], [`deckhouse::CAPABILITIES`]).
//!
//! Code asks the table a question ("does this platform have a separate instance object?",
//! "does it take credentials through the guest agent?") instead of comparing flavors, so a
//! new platform answers every question in its own file and no `else` branch adopts it by
//! accident. Behaviour that differs as code, not data, lives in each command's
//! `kubevirt.rs`/`deckhouse.rs` behind the command's own dispatch.

pub mod deckhouse;
pub mod kubevirt;
#[cfg(test)]
mod seam_scan;

use crate::api::Kind;
use crate::error::{Error, Result};
use crate::flavor::Flavor;

/// Whether a platform offers a feature, and if not, why (said to the user as is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// The platform offers it.
    Yes,
    /// It does not: the reason and what to do instead, one line.
    No(&'static str),
}

impl Support {
    /// `Ok` when supported, else the platform's reason as [`Error::Platform`].
    pub fn check(self) -> Result<()> {
        match self {
            Support::Yes => Ok(()),
            Support::No(why) => Err(Error::Platform(why.to_owned())),
        }
    }

    /// Whether the platform offers it.
    pub fn is_yes(self) -> bool {
        self == Support::Yes
    }

    /// Why the platform does not offer it (`None` when it does).
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Support::Yes => None,
            Support::No(why) => Some(why),
        }
    }
}

/// How a console or VNC session is kept to one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionArbitration {
    /// The server lets a new connection replace the old one silently, so kubectl-vm holds a
    /// Lease per VM and stream to say who is connected (KubeVirt).
    Lease,
    /// The server refuses a second connection and reports the holder; kubectl-vm probes
    /// it (Deckhouse).
    ServerProbe,
}

/// A resource of an API group, as discovery lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiResource {
    /// API group.
    pub group: &'static str,
    /// Version.
    pub version: &'static str,
    /// Plural resource name.
    pub resource: &'static str,
}

/// A condition type, status and (optionally) reason that say a VM's pod was not scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnschedulableCondition {
    /// Condition type.
    pub type_: &'static str,
    /// Its status then.
    pub status: &'static str,
    /// Its reason then, where the type alone does not tell.
    pub reason: Option<&'static str>,
}

impl UnschedulableCondition {
    /// Whether a condition says so.
    pub fn matches(&self, type_: &str, status: &str, reason: Option<&str>) -> bool {
        type_ == self.type_
            && status == self.status
            && self.reason.is_none_or(|r| reason == Some(r))
    }
}

/// Everything kubectl-vm needs to know about one platform as data.
#[derive(Debug, Clone, Copy)]
pub struct Capabilities {
    /// The platform these answers are for.
    pub flavor: Flavor,
    /// The VirtualMachine kind.
    pub vm: Kind,
    /// The kind of a running VM's instance, when the platform has one apart from the VM
    /// (KubeVirt's VirtualMachineInstance); `None` when the VM object is all there is.
    pub instance: Option<Kind>,
    /// The kind of the disks `create` provisions (and `create --wait` follows).
    pub disk: Kind,
    /// The VM status field (under `.status`) that holds its one-word state.
    pub vm_state_field: &'static str,
    /// How console and VNC sessions are kept to one client.
    pub sessions: SessionArbitration,
    /// The aggregated API whose subresources carry console, VNC and port-forward streams.
    pub streams: ApiResource,
    /// Where a VM declares disks the platform creates with it and gives to it (KubeVirt
    /// `spec.dataVolumeTemplates`), as a JSON pointer; `None` when disks are objects the VM
    /// only names.
    pub disk_templates: Option<&'static str>,
    /// The kind of a disk attachment, when attachments are objects of their own (Deckhouse
    /// VirtualMachineBlockDeviceAttachment); `None` when they live in the VM.
    pub attachments: Option<Kind>,
    /// Where the VM's placement (node selector, tolerations, affinity, priority class) is.
    pub placement: crate::placement::Fields,
    /// The VM condition that carries the scheduler's message when its pod finds no node.
    pub unschedulable: UnschedulableCondition,
    /// The API of a pool object holding a VM's replicas (KubeVirt VirtualMachinePool); `None`
    /// where `create --replicas` makes each replica a VM of its own.
    pub pool: Option<ApiResource>,
    /// The platform itself checks every image checksum it is given; otherwise it depends on
    /// the importer's version (CDI checks them from v1.65).
    pub verifies_every_checksum: bool,
    /// VM classes carry sizing policies a VM must fit (Deckhouse VirtualMachineClass).
    pub sizing_policies: bool,
    /// The aggregated API that hotplugs disks, when the platform hotplugs through one
    /// (KubeVirt `addvolume`); `None` when attachments are objects of their own.
    pub hotplug: Option<ApiResource>,
    /// A screenshot of the VNC display served by the platform.
    pub vnc_screenshot: Support,
    /// Guest users' keys and passwords changed through the guest agent (`credentials`).
    pub access_credentials: Support,
    /// CA trust put into a guest not made by kubectl-vm (`enroll`).
    pub enroll: Support,
    /// Pause, unpause, soft reboot and reset of a running guest (the reason follows the verb).
    pub guest_power: Support,
    /// Those guest actions with a server-side dry run (the reason follows
    /// "PLATFORM's ACTION").
    pub guest_power_server_dry_run: Support,
    /// Starting a VM with its guest paused (`start --paused`).
    pub start_paused: Support,
    /// A grace period for stopping (`stop --grace-period`).
    pub stop_grace_period: Support,
    /// Forcing a migration to converge (`migrate --force`, `evict --force`).
    pub migration_force: Support,
    /// Choosing a disk's bus (`--data-disk …,bus=`); the reason follows "--data-disk NAME: ".
    pub disk_bus_choice: Support,
    /// The most block devices a VM takes, the boot disk included, where the platform caps it.
    pub max_block_devices: Option<usize>,
    /// `evacuate-cancel`: KubeVirt's `evacuate/cancel` subresource (the reason is the whole
    /// message).
    pub evacuate_cancel: Support,
    /// `memory-dump`: KubeVirt's `memorydump`/`removememorydump` subresources (the reason is the
    /// whole message).
    pub memory_dump: Support,
    /// Whether the platform can keep the guest's serial console history (`kubectl vm logs`).
    pub console_log: Support,
    /// The short kind prefixes of the disks `disk attach` takes (`pvc`, `dv`, ...), as
    /// `parse_source` reads them.
    pub disk_source_prefixes: &'static [&'static str],
    /// How to name an attachable disk, for the usage error of a kind the platform lacks.
    pub disk_source_hint: &'static str,
    /// The kinds of disk `disk attach` takes, each with the prefix its names are written with
    /// (`""`: a bare name), as shell completion offers them.
    pub attachable_disks: &'static [(Kind, &'static str)],
    /// The kind a secondary interface names to join a network (KubeVirt's
    /// NetworkAttachmentDefinition), as shell completion lists it; `None` where networks are
    /// not named through such objects.
    pub network_attachment: Option<Kind>,
    /// The short prefix of the kind `disk attach --size` creates.
    pub new_disk_prefix: &'static str,
    /// Choosing an attached disk's device name, serial and bus (`--name`, `--serial`, `--bus`).
    pub disk_device_options: Support,
    /// Attaching a writable disk read-only (images are read-only everywhere).
    pub read_only_disks: Support,
    /// `create --sockets/--threads`: a CPU topology chosen by the user.
    pub cpu_topology: Support,
    /// The VM spec has a hostname field (KubeVirt `spec.hostname`); otherwise cloud-init sets it.
    pub hostname_in_spec: bool,
    /// SMBIOS fields of the VM (`create --uuid`, `--serial`; the reason follows the flag).
    pub smbios_fields: Support,
    /// A container image booted without copying it into a disk (`create --ephemeral`).
    pub ephemeral_boot: Support,
    /// A boot disk cloned from a PVC (`create --clone-pvc`).
    pub clone_pvc: Support,
    /// A fixed address for the VM's main network, kept apart from the VM (`create --ip`,
    /// Deckhouse's VirtualMachineIPAddress).
    pub fixed_ip: Support,
    /// A static address on a secondary network, written by kubectl-vm into the guest's
    /// cloud-init network data (`create --ip NAME=ADDRESS/PREFIX`).
    pub secondary_static_ip: Support,
    /// The importer checks only CDI's checksum algorithms (md5, sha1, sha256, sha512).
    pub cdi_checksums_only: bool,
    /// Secure Boot with persistent EFI NVRAM (`create --secure-boot`).
    pub secure_boot: Support,
    /// A persistent EFI store (`create --persistent-efi`).
    pub persistent_efi: Support,
    /// A VM's DNS subdomain (`create --subdomain`).
    pub subdomain: Support,
    /// Choosing the boot disk's bus (`create --boot-bus`).
    pub boot_bus_choice: Support,
    /// What serves `kubectl vm upload` here, as the refusal of another platform's target names it
    /// ("upload to vd/NAME needs Deckhouse virtualization").
    pub upload_service: &'static str,
    /// The upload targets this platform takes, as that refusal suggests them.
    pub upload_targets: &'static str,
    /// The `kubectl get` name of what a snapshot restore is tracked by (in place, into a new VM).
    pub restore_tracked_by: (&'static str, &'static str),
    /// A VM restored from a snapshot as a new VM is left stopped.
    pub restored_new_vm_stopped: bool,
}

impl Capabilities {
    /// JSON pointer of the VM's one-word state.
    pub fn vm_state_pointer(&self) -> String {
        format!("/status/{}", self.vm_state_field)
    }
}

/// Every platform kubectl-vm drives, in the order checks made before discovery try them.
pub const ALL: [Flavor; 2] = [Flavor::KubeVirt, Flavor::Deckhouse];

/// The platform local checks assume before discovery has said which one the cluster runs: the
/// one `--flavor` names, else the first of [`ALL`].
pub fn provisional(choice: crate::flavor::FlavorChoice) -> Flavor {
    match choice {
        crate::flavor::FlavorChoice::Fixed(flavor) => flavor,
        crate::flavor::FlavorChoice::Auto => ALL[0],
    }
}

/// The table of `flavor`.
pub fn of(flavor: Flavor) -> &'static Capabilities {
    match flavor {
        Flavor::KubeVirt => &kubevirt::CAPABILITIES,
        Flavor::Deckhouse => &deckhouse::CAPABILITIES,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each table answers for its own flavor with that flavor's kinds.
    #[test]
    fn tables_describe_their_own_platform() {
        for flavor in [Flavor::KubeVirt, Flavor::Deckhouse] {
            let caps = of(flavor);
            assert_eq!(caps.flavor, flavor);
            assert_eq!(caps.vm, Kind::vm(flavor));
            assert_eq!(caps.vm.api_version(), flavor.vm_api_version());
        }
        assert_eq!(of(Flavor::KubeVirt).disk.kind, "DataVolume");
        assert_eq!(of(Flavor::Deckhouse).disk.kind, "VirtualDisk");
        assert_eq!(
            of(Flavor::KubeVirt).instance.map(|k| k.kind),
            Some("VirtualMachineInstance")
        );
        assert_eq!(of(Flavor::Deckhouse).instance, None);
        assert_eq!(
            of(Flavor::KubeVirt).streams.group,
            "subresources.kubevirt.io"
        );
        assert_eq!(
            of(Flavor::Deckhouse).streams.group,
            "subresources.virtualization.deckhouse.io"
        );
        assert_eq!(of(Flavor::Deckhouse).hotplug, None);
        assert_eq!(
            of(Flavor::KubeVirt).vm_state_pointer(),
            "/status/printableStatus"
        );
        assert_eq!(of(Flavor::Deckhouse).vm_state_pointer(), "/status/phase");
    }

    /// The lists and words cmd takes from the tables, as cmd had them (completion's disk kinds
    /// with their prefixes, the networks it lists, upload's refusal, snapshot's pointer).
    #[test]
    fn what_cmd_asks_the_tables() {
        let kinds = |f| -> Vec<(&str, &str)> {
            of(f)
                .attachable_disks
                .iter()
                .map(|(k, p)| (k.kind, *p))
                .collect()
        };
        assert_eq!(
            kinds(Flavor::KubeVirt),
            [("DataVolume", ""), ("PersistentVolumeClaim", "")]
        );
        assert_eq!(
            kinds(Flavor::Deckhouse),
            [
                ("VirtualDisk", ""),
                ("VirtualImage", "vi/"),
                ("ClusterVirtualImage", "cvi/")
            ]
        );
        assert_eq!(
            of(Flavor::KubeVirt).network_attachment.map(|k| k.kind),
            Some("NetworkAttachmentDefinition")
        );
        assert_eq!(of(Flavor::Deckhouse).network_attachment, None);
        assert_eq!(
            provisional(crate::flavor::FlavorChoice::Auto),
            Flavor::KubeVirt
        );
        assert_eq!(
            provisional(crate::flavor::FlavorChoice::Fixed(Flavor::Deckhouse)),
            Flavor::Deckhouse
        );
    }

    /// What a platform lacks is refused with its reason, as a platform error.
    #[test]
    fn unsupported_features_say_why() {
        let err = of(Flavor::Deckhouse).enroll.check().unwrap_err();
        assert!(
            matches!(err, Error::Platform(ref m) if m.contains("Deckhouse")),
            "{err}"
        );
        assert!(of(Flavor::KubeVirt).enroll.check().is_ok());
    }
}
