//! Deckhouse virtualization (`virtualization.deckhouse.io/v1alpha2`) as data.

use super::{ApiResource, Capabilities, SessionArbitration, Support};
use crate::api::{CLUSTER_VIRTUAL_IMAGE, DECKHOUSE_VM, VIRTUAL_DISK, VIRTUAL_IMAGE, VMBDA};
use crate::flavor::Flavor;

/// What Deckhouse virtualization serves and supports.
pub const CAPABILITIES: Capabilities = Capabilities {
    flavor: Flavor::Deckhouse,
    vm: DECKHOUSE_VM,
    // The VirtualMachine carries its running state; there is no instance object to read.
    instance: None,
    disk: VIRTUAL_DISK,
    vm_state_field: "phase",
    sessions: SessionArbitration::ServerProbe,
    streams: ApiResource {
        group: crate::flavor::DECKHOUSE_SUBRESOURCES_GROUP,
        version: crate::flavor::DECKHOUSE_VERSION,
        resource: "virtualmachines",
    },
    // Disks are attached with VirtualMachineBlockDeviceAttachment objects.
    hotplug: None,
    disk_templates: None,
    attachments: Some(VMBDA),
    // The CRD renames the Pod API's podAntiAffinity and podAffinityTerm
    // (crds/virtualmachines.yaml, `spec.affinity`); the VM's own labels reach its pod.
    placement: crate::placement::Fields {
        spec: "/spec",
        pod_labels: "/metadata/labels",
        anti_affinity: "virtualMachineAndPodAntiAffinity",
        affinity_term: "virtualMachineAndPodAffinityTerm",
    },
    // The VM's Running condition while its pod has not started (vmcondition
    // ReasonPodNotStarted), with the pod's scheduling message.
    unschedulable: super::UnschedulableCondition {
        type_: "Running",
        status: "False",
        reason: Some("PodNotStarted"),
    },
    // A pool is N VirtualMachines labelled with the pool's name.
    pool: None,
    // `dataSource.http.checksum` is checked by the platform's importer.
    verifies_every_checksum: true,
    sizing_policies: true,
    vnc_screenshot: Support::No(
        "vnc screenshot needs KubeVirt: Deckhouse virtualization has no screenshot subresource",
    ),
    access_credentials: Support::No(
        "credentials need KubeVirt: Deckhouse virtualization has no accessCredentials; give keys at creation (`kubectl vm create --ssh-key`, `--access-credential` is written into cloud-init there)",
    ),
    guest_power: Support::No(
        "is not supported by Deckhouse virtualization (it has no such VirtualMachineOperation); it works on KubeVirt",
    ),
    guest_power_server_dry_run: Support::Yes,
    disk_bus_choice: Support::No("bus= is KubeVirt-only; Deckhouse picks the bus itself"),
    // virtualization's VirtualMachine CRD: `blockDeviceRefs` holds at most 16 items.
    max_block_devices: Some(16),
    // Deckhouse's own evacuations are Evict operations annotated
    // `virtualization.deckhouse.io/evacuation`; deleting one makes its evacuation controller
    // cancel the evacuation (controller/evacuation/internal/handler/evacuation.go).
    evacuate_cancel: Support::No(
        "evacuate-cancel drives KubeVirt's evacuate/cancel subresource; on Deckhouse virtualization a drain's evacuation is an Evict VirtualMachineOperation, and deleting it cancels the evacuation: `kubectl vm migrate VM --cancel`, or `kubectl vm migrate --cancel --all-on-node NODE`",
    ),
    // The module configures its KubeVirt with `virtualMachineOptions.disableSerialConsoleLog: {}`
    // (deckhouse/virtualization `templates/kubevirt/kubevirt.yaml`); VirtualMachine has no
    // field to turn it on per VM.
    console_log: Support::No(
        "Deckhouse virtualization keeps no serial console history: its module sets disableSerialConsoleLog in the KubeVirt it runs and VirtualMachine has no setting to enable it; capture while attached with `kubectl vm console VM --log FILE`, or read the launcher with `kubectl vm logs VM --launcher`",
    ),
    disk_source_prefixes: &["vd", "vi", "cvi"],
    disk_source_hint: "vd/NAME, vi/NAME or cvi/NAME",
    attachable_disks: &[
        (VIRTUAL_DISK, ""),
        (VIRTUAL_IMAGE, "vi/"),
        (CLUSTER_VIRTUAL_IMAGE, "cvi/"),
    ],
    network_attachment: None,
    new_disk_prefix: "vd",
    disk_device_options: Support::No(
        "--name, --serial and --bus are KubeVirt's: Deckhouse names the device after the disk and always uses SCSI",
    ),
    read_only_disks: Support::No(
        "Deckhouse attaches a VirtualDisk read-write; images (vi/NAME, cvi/NAME) are read-only",
    ),
    cpu_topology: Support::No(
        "--sockets and --threads are KubeVirt-only: Deckhouse lays out the --cpu cores in sockets itself (shown in status.resources.cpu.topology) and has no threads setting",
    ),
    // VirtualMachine has no hostname field: cloud-init sets it.
    hostname_in_spec: false,
    smbios_fields: Support::No(
        "is KubeVirt-only: a Deckhouse VirtualMachine has no SMBIOS fields (the platform sets them)",
    ),
    ephemeral_boot: Support::No(
        "--ephemeral is KubeVirt-only: Deckhouse always copies the image into a VirtualDisk; drop --ephemeral",
    ),
    clone_pvc: Support::No(
        "--clone-pvc is KubeVirt-only; on Deckhouse make a VirtualImage from the disk and use --image vi/NAME",
    ),
    fixed_ip: Support::Yes,
    // The virtualization user guide, "Additional network interfaces": an additional network's
    // "network parameters (IP addresses, gateways, DNS, and so on) ... are configured manually
    // from inside the guest OS (for example, with Cloud-Init), unless IPAM is configured for the
    // network"; "IPAM for additional network interfaces": a static address is an sdn
    // `IPAddress` (network.deckhouse.io/v1alpha1, type Static) named by
    // `spec.networks[].ipAddressName`, which the VirtualMachine CRD says "is applied only for
    // additional networks that have IPAM configured". kubectl vm makes neither.
    secondary_static_ip: Support::No(
        "--ip NAME=ADDRESS/PREFIX is KubeVirt's (cloud-init network data): on Deckhouse an additional network's address comes from the network's IPAM pool (an sdn IPAddress named in spec.networks[].ipAddressName) or is configured inside the guest, and kubectl vm cannot set it there",
    ),
    // The importer also checks Streebog (`checksum.streebog256/512`... and the CDI set).
    cdi_checksums_only: false,
    // Deckhouse's EFIWithSecureBoot builds a KubeVirt EFI bootloader without `persistent`
    // (virtualization-controller kvbuilder `SetBootloader`).
    secure_boot: Support::No(
        "--secure-boot is refused on Deckhouse: it keeps no persistent EFI NVRAM, and without it a Secure Boot guest loses its boot state on reboot",
    ),
    persistent_efi: Support::No(
        "--persistent-efi is KubeVirt-only: a Deckhouse VirtualMachine has no persistent EFI store",
    ),
    subdomain: Support::No(
        "--subdomain is KubeVirt-only: a Deckhouse VirtualMachine has no subdomain field",
    ),
    boot_bus_choice: Support::No("--boot-bus is KubeVirt-only: Deckhouse picks the bus itself"),
    upload_service: "Deckhouse virtualization",
    upload_targets: "vi/NAME, cvi/NAME or vd/NAME",
    // VirtualMachineOperation `Restore`; `--new-vm`: NEW's VirtualDisks, made from the snapshot.
    restore_tracked_by: ("vmop", "vd"),
    restored_new_vm_stopped: false,
    start_paused: Support::No("--paused is not supported by Deckhouse virtualization"),
    stop_grace_period: Support::No(
        "--grace-period is not supported by Deckhouse virtualization; use --force to stop at once",
    ),
    // A Migrate/Evict operation's `force` allows AutoConverge.
    migration_force: Support::Yes,
    enroll: Support::No(
        "enrolling needs KubeVirt: Deckhouse virtualization has no accessCredentials to put the CA trust into the guest; VMs made with `kubectl vm create` trust the CA through cloud-init, others take `kubectl vm ssh -i KEY`",
    ),
    // api/subresources/v1alpha2/register.go lists no memory dump; its KubeVirt is internal.
    memory_dump: Support::No(
        "memory-dump needs KubeVirt: Deckhouse virtualization offers no memory dump (its subresource API has no memorydump, and the KubeVirt beneath it is internal)",
    ),
};
