//! KubeVirt (`kubevirt.io/v1`, CDI) as data.

use super::{ApiResource, Capabilities, SessionArbitration, Support};
use crate::api::{DATA_VOLUME, KUBEVIRT_VM, KUBEVIRT_VMI, NETWORK_ATTACHMENT_DEFINITION, PVC};
use crate::flavor::Flavor;

/// What KubeVirt serves and supports.
pub const CAPABILITIES: Capabilities = Capabilities {
    flavor: Flavor::KubeVirt,
    vm: KUBEVIRT_VM,
    instance: Some(KUBEVIRT_VMI),
    disk: DATA_VOLUME,
    // `printableStatus` is what `kubectl get vm` shows (Running, Stopped, Provisioning…).
    vm_state_field: "printableStatus",
    // virt-api hands the console and VNC to the newest connection without telling the old one.
    sessions: SessionArbitration::Lease,
    // virt-api: console, vnc and portforward are subresources of the instance.
    streams: ApiResource {
        group: crate::flavor::KUBEVIRT_SUBRESOURCES_GROUP,
        version: "v1",
        resource: "virtualmachineinstances",
    },
    disk_templates: Some("/spec/dataVolumeTemplates"),
    attachments: None,
    placement: crate::placement::Fields {
        spec: "/spec/template/spec",
        pod_labels: "/spec/template/metadata/labels",
        anti_affinity: "podAntiAffinity",
        affinity_term: "podAffinityTerm",
    },
    // The launcher pod's PodScheduled condition, which virt-controller copies to the VMI and
    // the VM (pkg/virt-controller/watch/vm/vm.go, syncConditions).
    unschedulable: super::UnschedulableCondition {
        type_: "PodScheduled",
        status: "False",
        reason: None,
    },
    pool: Some(ApiResource {
        group: "pool.kubevirt.io",
        version: "v1beta1",
        resource: "virtualmachinepools",
    }),
    verifies_every_checksum: false,
    sizing_policies: false,
    hotplug: Some(ApiResource {
        group: crate::flavor::KUBEVIRT_SUBRESOURCES_GROUP,
        version: "v1",
        resource: "virtualmachines",
    }),
    vnc_screenshot: Support::Yes,
    access_credentials: Support::Yes,
    enroll: Support::Yes,
    guest_power: Support::Yes,
    // softreboot and reset take no body, so no `dryRun` option either.
    guest_power_server_dry_run: Support::No(
        "takes no options, so it has no server-side dry run; use --dry-run=client",
    ),
    disk_bus_choice: Support::Yes,
    max_block_devices: None,
    // pkg/virt-api/api.go: `evacuate/cancel` on VMs and VMIs (since v1.8.0).
    evacuate_cancel: Support::Yes,
    // pkg/virt-api/api.go: `memorydump`/`removememorydump` on VMs.
    memory_dump: Support::Yes,
    // The `guest-console-log` sidecar (kubevirt `serialconsolelog.go`), per VM or cluster-wide.
    console_log: Support::Yes,
    start_paused: Support::Yes,
    disk_source_prefixes: &["pvc", "dv"],
    disk_source_hint: "pvc/NAME or dv/NAME",
    attachable_disks: &[(DATA_VOLUME, ""), (PVC, "")],
    network_attachment: Some(NETWORK_ATTACHMENT_DEFINITION),
    new_disk_prefix: "dv",
    disk_device_options: Support::Yes,
    read_only_disks: Support::Yes,
    cpu_topology: Support::Yes,
    hostname_in_spec: true,
    smbios_fields: Support::Yes,
    ephemeral_boot: Support::Yes,
    clone_pvc: Support::Yes,
    fixed_ip: Support::No(
        "--ip is Deckhouse's: on KubeVirt the pod network's address comes from the pod's CNI, and a secondary network's from its own IPAM or the guest's configuration",
    ),
    // The VM's cloudInitNoCloud volume carries network data beside the user data
    // (`networkDataSecretRef`; pkg/cloud-init/cloud-init.go `resolveNoCloudSecrets`).
    secondary_static_ip: Support::Yes,
    cdi_checksums_only: true,
    secure_boot: Support::Yes,
    persistent_efi: Support::Yes,
    subdomain: Support::Yes,
    boot_bus_choice: Support::Yes,
    upload_service: "KubeVirt's CDI",
    upload_targets: "dv/NAME or pvc/NAME",
    restore_tracked_by: ("vmrestore", "vmrestore"),
    // The restore controller creates the VM with `runStrategy: Halted`.
    restored_new_vm_stopped: true,
    stop_grace_period: Support::Yes,
    migration_force: Support::No(
        "--force (AutoConverge) applies to Deckhouse virtualization only; KubeVirt takes it from the migration policy",
    ),
};
