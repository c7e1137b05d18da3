//! The Kubernetes kinds kubectl-vm reads and writes, described once: group, version, plural,
//! and how failures on them are worded.

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};

use crate::error::Action;
use crate::flavor::Flavor;

/// `--dry-run`, as kubectl names the strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DryRun {
    /// Really act.
    None,
    /// Send nothing that changes anything.
    Client,
    /// Send the request marked dry run: checked by the server, not persisted.
    Server,
}

/// One API kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Kind name.
    pub kind: &'static str,
    /// Plural resource name.
    pub plural: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
}

/// Deckhouse's VirtualMachineBlockDeviceAttachment.
pub const VMBDA: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualMachineBlockDeviceAttachment",
    plural: "virtualmachineblockdeviceattachments",
    namespaced: true,
};

/// KubeVirt's VirtualMachine.
pub const KUBEVIRT_VM: Kind = Kind {
    group: "kubevirt.io",
    version: "v1",
    kind: "VirtualMachine",
    plural: "virtualmachines",
    namespaced: true,
};

/// KubeVirt's VirtualMachineInstance.
pub const KUBEVIRT_VMI: Kind = Kind {
    group: "kubevirt.io",
    version: "v1",
    kind: "VirtualMachineInstance",
    plural: "virtualmachineinstances",
    namespaced: true,
};

/// Deckhouse's VirtualMachine.
pub const DECKHOUSE_VM: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualMachine",
    plural: "virtualmachines",
    namespaced: true,
};

/// Core Event.
pub const EVENT: Kind = Kind {
    group: "",
    version: "v1",
    kind: "Event",
    plural: "events",
    namespaced: true,
};

/// CDI's DataVolume.
pub const DATA_VOLUME: Kind = Kind {
    group: "cdi.kubevirt.io",
    version: "v1beta1",
    kind: "DataVolume",
    plural: "datavolumes",
    namespaced: true,
};

/// CDI's cluster-wide configuration object, whose status reports the CDI version.
pub const CDI: Kind = Kind {
    group: "cdi.kubevirt.io",
    version: "v1beta1",
    kind: "CDI",
    plural: "cdis",
    namespaced: false,
};

/// Deckhouse's VirtualDisk.
pub const VIRTUAL_DISK: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualDisk",
    plural: "virtualdisks",
    namespaced: true,
};

/// Multus's NetworkAttachmentDefinition: a KubeVirt VM's secondary network.
pub const NETWORK_ATTACHMENT_DEFINITION: Kind = Kind {
    group: "k8s.cni.cncf.io",
    version: "v1",
    kind: "NetworkAttachmentDefinition",
    plural: "network-attachment-definitions",
    namespaced: true,
};

/// Deckhouse's Network (the `sdn` module): a project's additional network.
pub const DECKHOUSE_NETWORK: Kind = Kind {
    group: "network.deckhouse.io",
    version: "v1alpha1",
    kind: "Network",
    plural: "networks",
    namespaced: true,
};

/// Deckhouse's ClusterNetwork (the `sdn` module): an additional network of every project.
pub const DECKHOUSE_CLUSTER_NETWORK: Kind = Kind {
    group: "network.deckhouse.io",
    version: "v1alpha1",
    kind: "ClusterNetwork",
    plural: "clusternetworks",
    namespaced: false,
};

/// Deckhouse's VirtualMachineIPAddress: a VM's address in the main cluster network.
pub const VIRTUAL_MACHINE_IP_ADDRESS: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualMachineIPAddress",
    plural: "virtualmachineipaddresses",
    namespaced: true,
};

/// Deckhouse's VirtualMachineClass (cluster-scoped; also served as v1alpha3).
pub const VIRTUAL_MACHINE_CLASS: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualMachineClass",
    plural: "virtualmachineclasses",
    namespaced: false,
};

/// Core Secret.
pub const SECRET: Kind = Kind {
    group: "",
    version: "v1",
    kind: "Secret",
    plural: "secrets",
    namespaced: true,
};

/// Core PersistentVolumeClaim.
pub const PVC: Kind = Kind {
    group: "",
    version: "v1",
    kind: "PersistentVolumeClaim",
    plural: "persistentvolumeclaims",
    namespaced: true,
};

/// Deckhouse's VirtualImage.
pub const VIRTUAL_IMAGE: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "VirtualImage",
    plural: "virtualimages",
    namespaced: true,
};

/// Deckhouse's ClusterVirtualImage (cluster-scoped).
pub const CLUSTER_VIRTUAL_IMAGE: Kind = Kind {
    group: "virtualization.deckhouse.io",
    version: "v1alpha2",
    kind: "ClusterVirtualImage",
    plural: "clustervirtualimages",
    namespaced: false,
};

/// KubeVirt's VirtualMachinePool.
pub const KUBEVIRT_POOL: Kind = Kind {
    group: "pool.kubevirt.io",
    version: "v1beta1",
    kind: "VirtualMachinePool",
    plural: "virtualmachinepools",
    namespaced: true,
};

/// Every kind kubectl-vm writes, for finding the kind of a generated object.
const KNOWN: [Kind; 10] = [
    KUBEVIRT_VM,
    KUBEVIRT_POOL,
    KUBEVIRT_VMI,
    DECKHOUSE_VM,
    DATA_VOLUME,
    VIRTUAL_DISK,
    VIRTUAL_MACHINE_CLASS,
    SECRET,
    PVC,
    VIRTUAL_MACHINE_IP_ADDRESS,
];

impl Kind {
    /// The kind of an object from its `apiVersion` and `kind` fields.
    pub fn of(object: &serde_json::Value) -> Option<Kind> {
        let api_version = object.get("apiVersion")?.as_str()?;
        let kind = object.get("kind")?.as_str()?;
        KNOWN
            .into_iter()
            .find(|k| k.kind == kind && k.api_version() == api_version)
    }

    /// The VirtualMachine kind of a platform.
    pub fn vm(flavor: Flavor) -> Kind {
        match flavor {
            Flavor::KubeVirt => KUBEVIRT_VM,
            Flavor::Deckhouse => DECKHOUSE_VM,
        }
    }

    /// `group/version`, or just `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// kube's description of the kind, for dynamic APIs.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.to_owned(),
            version: self.version.to_owned(),
            api_version: self.api_version(),
            kind: self.kind.to_owned(),
            plural: self.plural.to_owned(),
        }
    }

    /// The resource as RBAC and kubectl name it: `virtualmachines.kubevirt.io`, `events`.
    pub fn resource_name(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `kind.group/name`, as `kubectl -o name` prints objects.
    pub fn object_ref(&self, name: &str) -> String {
        let kind = self.kind.to_ascii_lowercase();
        if self.group.is_empty() {
            format!("{kind}/{name}")
        } else {
            format!("{kind}.{}/{name}", self.group)
        }
    }

    /// An [`Action`] on this kind, for error messages.
    pub fn action(&self, verb: &'static str, namespace: Option<&str>) -> Action {
        Action::new(verb, self.resource_name(), self.kind.to_ascii_lowercase())
            .in_namespace(namespace)
    }

    /// A dynamic API handle, in one namespace or across all (`None`).
    pub fn api(&self, client: &Client, namespace: Option<&str>) -> Api<DynamicObject> {
        let resource = self.api_resource();
        match namespace {
            Some(ns) if self.namespaced => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_like_kubectl() {
        assert_eq!(KUBEVIRT_VM.resource_name(), "virtualmachines.kubevirt.io");
        assert_eq!(
            KUBEVIRT_VM.object_ref("web"),
            "virtualmachine.kubevirt.io/web"
        );
        assert_eq!(EVENT.resource_name(), "events");
        assert_eq!(EVENT.object_ref("x"), "event/x");
        assert_eq!(
            DECKHOUSE_VM.api_version(),
            "virtualization.deckhouse.io/v1alpha2"
        );
    }
}
