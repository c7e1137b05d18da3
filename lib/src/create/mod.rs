//! `kubectl vm create` without the cluster: a [`VmPlan`] becomes the Kubernetes objects to
//! apply, in order, for KubeVirt ([`kubevirt`]) or Deckhouse ([`deckhouse`]).
//!
//! The command validates and builds with [`build`] (no cluster), checks the plan against the
//! cluster and builds its manifests with [`checks::prepare`], then creates
//! [`Manifests::objects`] in order with [`execute::create_all`]: before creating an object
//! whose [`PlannedObject::owner`] is [`Owner::Vm`] it calls [`PlannedObject::set_owner`] with
//! the VM it has just created, so Kubernetes deletes that object with the VM.

pub use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL, companion_selector};

pub mod checks;
pub mod cloudinit;
pub mod deckhouse;
pub mod execute;
pub mod extras;
pub mod kubevirt;
pub mod limits;
pub mod networks;
pub mod options;
pub mod plan;
pub mod pool;
pub mod secrets;
pub mod sizing;

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod schema_check;

use std::collections::BTreeMap;

use serde_json::{Value, json};
use thiserror::Error;

pub use cloudinit::{CloudInitError, UserData};
pub use plan::{BootFlags, BootSource, PlanError, VmPlan};

use crate::flavor::Flavor;

/// Volume names kubectl-vm uses itself, so data disks cannot take them.
pub(crate) const RESERVED_VOLUME_NAMES: [&str; 2] = ["rootdisk", "cloudinitdisk"];

/// A plan that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CreateError {
    /// Bad or conflicting inputs.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Unusable `--cloud-init` data.
    #[error(transparent)]
    CloudInit(#[from] CloudInitError),
}

/// Checks a plan before the cluster is asked anything: its values and flag combinations, and
/// its cloud-init. The plan is built for [`crate::platform::provisional`]; without `--flavor`
/// (`choice` is `Auto`) only what no platform accepts is refused (in the provisional
/// platform's words), since discovery may yet pick one that does. The platform SSH user is
/// left out: the CA keys that enable it may come from the cluster later.
pub fn validate_before_discovery(
    plan: &VmPlan,
    choice: crate::flavor::FlavorChoice,
) -> Result<(), CreateError> {
    let mut early = plan.clone();
    early.platform_ssh.enabled = false;
    if let Err(e) = early.validate() {
        let fixed = matches!(choice, crate::flavor::FlavorChoice::Fixed(_));
        let another_accepts = crate::platform::ALL
            .into_iter()
            .filter(|&flavor| flavor != early.flavor)
            .any(|flavor| {
                let mut other = early.clone();
                other.flavor = flavor;
                other.validate().is_ok()
            });
        if fixed || !another_accepts {
            return Err(e.into());
        }
    }
    cloudinit::build(&early)?;
    Ok(())
}

/// Whether an object must be owned by the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Created as is.
    None,
    /// Gets an ownerReference to the VM (created earlier in the same order) before it is
    /// created, so it is garbage-collected with the VM.
    Vm,
}

/// One object to create.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedObject {
    /// The object (`apiVersion`, `kind`, `metadata`, …).
    pub object: Value,
    /// Whether it needs the VM's ownerReference first.
    pub owner: Owner,
}

/// The VM an object is owned by, taken from the created VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmOwner {
    /// `apiVersion` of the VM.
    pub api_version: String,
    /// `kind` of the VM.
    pub kind: String,
    /// VM name.
    pub name: String,
    /// VM uid, known once the server created it.
    pub uid: String,
}

impl VmOwner {
    /// Read the owner fields from the VM object the API server returned.
    pub fn from_object(vm: &Value) -> Option<VmOwner> {
        let text = |v: &Value| v.as_str().map(str::to_string);
        Some(VmOwner {
            api_version: text(&vm["apiVersion"])?,
            kind: text(&vm["kind"])?,
            name: text(&vm["metadata"]["name"])?,
            uid: text(&vm["metadata"]["uid"])?,
        })
    }
}

impl PlannedObject {
    fn new(object: Value) -> Self {
        PlannedObject {
            object,
            owner: Owner::None,
        }
    }

    /// `apiVersion` of the object.
    pub fn api_version(&self) -> &str {
        self.object["apiVersion"].as_str().unwrap_or_default()
    }

    /// `kind` of the object.
    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }

    /// Whether this is a VM or a VirtualMachinePool: objects after it with [`Owner::Vm`] are
    /// owned by it.
    pub fn is_main(&self) -> bool {
        matches!(self.kind(), "VirtualMachine" | "VirtualMachinePool")
    }

    /// `metadata.name` of the object.
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// Make the object owned by `vm` (controller reference, blocking the VM's deletion in
    /// foreground deletes until it is gone).
    pub fn set_owner(&mut self, vm: &VmOwner) {
        self.object["metadata"]["ownerReferences"] = json!([{
            "apiVersion": vm.api_version,
            "kind": vm.kind,
            "name": vm.name,
            "uid": vm.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }]);
    }
}

/// Everything to create for one VM, in apply order.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifests {
    /// Objects in the order to create them (disks, the VM, then objects owned by the VM).
    pub objects: Vec<PlannedObject>,
    /// The user data, if any (also inside the VM or a Secret among `objects`).
    pub user_data: Option<UserData>,
}

impl Manifests {
    /// The VirtualMachine object (the first one, for a Deckhouse pool), or the
    /// VirtualMachinePool of a KubeVirt pool.
    pub fn vm(&self) -> &Value {
        &self
            .objects
            .iter()
            .find(|o| o.is_main())
            .expect("manifests always hold the VM")
            .object
    }
}

/// Validate `plan` and build its objects for its flavor. A pool plan (`replicas`) is built by
/// [`pool::build`], which needs each replica's plan.
pub fn build(plan: &VmPlan) -> Result<Manifests, CreateError> {
    if plan.replicas.is_some() {
        plan.validate()?;
        let n = plan.replicas.unwrap_or(1);
        let replicas: Vec<VmPlan> = (0..n).map(|i| pool::replica_plan(plan, i)).collect();
        return pool::build(plan, &replicas);
    }
    plan.validate()?;
    let user_data = cloudinit::build(plan)?;
    let objects = match plan.flavor {
        Flavor::KubeVirt => kubevirt::objects(plan, user_data.as_ref()),
        Flavor::Deckhouse => deckhouse::objects(plan, user_data.as_ref()),
    };
    Ok(Manifests { objects, user_data })
}

/// Labels for objects created for the VM: the user's labels plus kubectl-vm's own.
fn labels(plan: &VmPlan) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = plan
        .labels
        .iter()
        .map(|l| (l.key.clone(), l.value.clone()))
        .collect();
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    labels.insert(VM_LABEL.into(), plan.name.clone());
    if let Some(pool) = &plan.pool {
        labels.insert(pool::POOL_LABEL.into(), pool.clone());
    }
    labels
}

/// `metadata` for an object created for the VM.
fn metadata(plan: &VmPlan, name: &str) -> Value {
    json!({ "name": name, "namespace": plan.namespace, "labels": labels(plan) })
}

/// `metadata` of the VM itself: the common labels, and when it trusts the platform CA the
/// annotations the SSH signer reads (VM-scoped trust, the logins besides the platform user);
/// otherwise trust `none`, so it is not taken for a VM made before VM-scoped trust.
fn vm_metadata(plan: &VmPlan) -> Value {
    let mut meta = metadata(plan, &plan.name);
    if !plan.platform_ssh.enabled || plan.os == plan::OsType::Windows {
        meta["annotations"] = json!({
            crate::names::TRUST_ANNOTATION: crate::names::TRUST_NONE,
        });
    } else {
        let mut annotations = serde_json::Map::new();
        annotations.insert(
            crate::names::TRUST_ANNOTATION.into(),
            json!(crate::names::TRUST_VM_SCOPED),
        );
        if let Some(user) = &plan.guest.user {
            annotations.insert(crate::names::LOGINS_ANNOTATION.into(), json!(user));
        }
        meta["annotations"] = Value::Object(annotations);
    }
    meta
}

/// Write the plan's placement into the VM at the platform's fields (validated by the plan:
/// additions only, a spread only in a pool, whose label the VM's pod carries).
fn place(plan: &VmPlan, vm: &mut Value) {
    if plan.placement.is_empty() {
        return;
    }
    let fields = crate::platform::of(plan.flavor).placement;
    if let Err(e) = plan.placement.edit(&fields, vm) {
        unreachable!("a validated plan's placement applies: {e}");
    }
}

/// The Secret carrying user data, owned by the VM.
fn user_data_secret(plan: &VmPlan, type_: &str, key: &str, data: &UserData) -> PlannedObject {
    PlannedObject {
        object: json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata(plan, &plan.cloudinit_secret_name()),
            "type": type_,
            "stringData": { key: data.text },
        }),
        owner: Owner::Vm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `--flavor` a flag only one platform takes passes the early check (discovery
    /// decides); with it, the named platform's refusal stands; what neither takes is refused in
    /// the provisional platform's words.
    #[test]
    fn before_discovery_only_what_no_platform_takes_is_refused() {
        use crate::flavor::FlavorChoice;
        let auto = FlavorChoice::Auto;
        let provisional = crate::platform::provisional(auto);
        let mut deckhouse_only = fixtures::plan(provisional, fixtures::image());
        deckhouse_only.extras.ip = vec!["10.66.10.20".into()];
        validate_before_discovery(&deckhouse_only, auto).unwrap();
        let fixed = FlavorChoice::Fixed(Flavor::KubeVirt);
        let err = validate_before_discovery(&deckhouse_only, fixed).unwrap_err();
        assert!(err.to_string().starts_with("--ip is Deckhouse's"), "{err}");

        let mut neither = fixtures::plan(provisional, fixtures::image());
        neither.extras.ip = vec!["not-an-ip".into()];
        neither.extras.subdomain = Some("web".into());
        let err = validate_before_discovery(&neither, auto).unwrap_err();
        assert!(err.to_string().starts_with("--ip is Deckhouse's"), "{err}");
    }

    #[test]
    fn owner_reference_is_filled_from_the_created_vm() {
        let plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
        let mut manifests = build(&plan).unwrap();
        let created = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "web", "uid": "1234"}});
        let owner = VmOwner::from_object(&created).unwrap();
        let secret = manifests
            .objects
            .iter_mut()
            .find(|o| o.owner == Owner::Vm)
            .unwrap();
        secret.set_owner(&owner);
        assert_eq!(
            secret.object["metadata"]["ownerReferences"][0]["uid"],
            "1234"
        );
        assert_eq!(
            secret.object["metadata"]["ownerReferences"][0]["kind"],
            "VirtualMachine"
        );
        assert!(VmOwner::from_object(&json!({"kind": "x"})).is_none());
    }

    #[test]
    fn owned_objects_come_after_the_vm() {
        for flavor in [Flavor::KubeVirt, Flavor::Deckhouse] {
            let plan = fixtures::plan(flavor, fixtures::image());
            let manifests = build(&plan).unwrap();
            let vm_at = manifests
                .objects
                .iter()
                .position(|o| o.kind() == "VirtualMachine")
                .unwrap();
            for (i, o) in manifests.objects.iter().enumerate() {
                assert_eq!(o.owner == Owner::Vm, i > vm_at, "{flavor}: {}", o.kind());
                assert_eq!(o.object["metadata"]["labels"][VM_LABEL], "web");
            }
        }
        assert_eq!(
            companion_selector("web"),
            "kubevm.io/vm=web,app.kubernetes.io/managed-by=kubectl-vm"
        );
    }

    #[test]
    fn build_reports_plan_and_cloud_init_errors() {
        let mut plan = fixtures::plan(Flavor::KubeVirt, fixtures::image());
        plan.guest.user_data = Some("hello".into());
        assert!(matches!(build(&plan), Err(CreateError::CloudInit(_))));
        plan.name = "Bad".into();
        assert!(matches!(build(&plan), Err(CreateError::Plan(_))));
    }
}
