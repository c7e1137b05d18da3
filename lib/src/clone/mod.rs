//! `clone`: a new VM with its own copies of a VM's disks, through the platform's own clone
//! ([`kubevirt`]: a `clone.kubevirt.io` VirtualMachineClone; [`deckhouse`]: a
//! VirtualMachineOperation of type `Clone`), followed through its phases.
//!
//! Refused before anything is created: a bad or equal name, a source that does not exist, a
//! target name (or a new disk's name) that is taken. The new VM is labelled as ours
//! ([`crate::names::companion_selector`] finds its disks), so `delete NEW` removes it with
//! them, and the copies no longer carry the source's `kubevm.io/vm` label (`delete SRC` leaves
//! them alone).
//!
//! The new VM never carries the source's SSH identity ([`identity`]): when the source's
//! cloud-init holds kubectl-vm's platform part, the new VM gets it made again for itself in
//! the Secret `NEW-cloudinit`, which it owns. KubeVirt: the Secret is created before the clone
//! and the clone's `spec.patches` points the new VM's cloud-init volume at it (on failure it is
//! deleted with its uid as a precondition, unless the new VM exists). Deckhouse: the operation
//! would copy the source's Secret as `NEW-cloudinit` (a taken name is refused first); kubectl
//! vm makes that Secret itself with the new identity, marked with the operation's uid, as soon
//! as the operation exists (the platform's restorer comes after its snapshot step and takes it
//! as made). Only if the platform was first is its copy rewritten, and only if the operation
//! made it.
//!
//! What stays afterwards is what the platform keeps: KubeVirt deletes a succeeded clone object
//! when its target VM is deleted (`pkg/virt-controller/watch/clone/clone.go`); Deckhouse keeps
//! operations as records of what was done.

pub mod deckhouse;
pub mod identity;
pub mod kubevirt;
pub mod network_data;

use std::time::Duration;

use kube::api::{DynamicObject, PostParams};
use serde_json::{Value, json};

pub use crate::api::DryRun;
use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::{Flavor, Platform};
use crate::lifecycle::VmRef;
use crate::names::{MANAGED_BY, MANAGED_BY_LABEL, VM_LABEL};

/// How often the clone object is read while waiting.
const POLL: Duration = Duration::from_millis(200);

/// What to clone, and how.
#[derive(Debug, Clone)]
pub struct CloneRequest {
    /// The source VM.
    pub source: VmRef,
    /// The new VM's name (same namespace).
    pub target: String,
    /// Start the new VM once it exists.
    pub start: bool,
    /// Wait for the clone (and the start) to finish.
    pub wait: bool,
    /// How long to wait.
    pub timeout: Duration,
    /// Dry run strategy.
    pub dry_run: DryRun,
}

impl CloneRequest {
    /// Everything checkable before the first request (one line, exit 2).
    pub fn validate(&self) -> Result<()> {
        crate::validate::dns_label("VM", &self.target).map_err(|e| Error::Usage(e.to_string()))?;
        if self.target == self.source.name {
            return Err(Error::Usage(format!(
                "the new VM's name {:?} is the source's: choose another",
                self.target
            )));
        }
        if self.start && self.dry_run != DryRun::None {
            return Err(Error::Usage(
                "--start cannot be combined with --dry-run".into(),
            ));
        }
        Ok(())
    }

    fn target_ref(&self) -> VmRef {
        VmRef {
            namespace: self.source.namespace.clone(),
            name: self.target.clone(),
        }
    }
}

/// Progress of a clone.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The platform accepted the clone object (`kind/name`).
    Accepted(String),
    /// The clone is in a new phase (as the platform names it), with a detail if any.
    Phase {
        /// The phase.
        phase: String,
        /// A condition's reason or message.
        detail: Option<String>,
    },
    /// The new VM was labelled as ours (and its disks re-labelled for it).
    Labelled(usize),
    /// The new VM is starting (or already running).
    Starting,
    /// Something worth telling (the new VM's own SSH identity, the direct mode).
    Notice(String),
}

/// What `clone` did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The new VM as `kind.group/name`.
    pub vm_ref: String,
    /// The clone object (VirtualMachineClone or VirtualMachineOperation) as sent or stored.
    pub request_object: Value,
    /// The new VM as read at the end (absent for dry runs and without `--wait`).
    pub vm: Option<Value>,
    /// The names of the new VM's disks (claims on KubeVirt, VirtualDisks on Deckhouse).
    pub disks: Vec<String>,
    /// Whether it waited for the end.
    pub waited: bool,
}

/// The labels that make a VM (and its disks) ours.
pub fn our_labels(vm: &str) -> Value {
    json!({ MANAGED_BY_LABEL: MANAGED_BY, VM_LABEL: vm })
}

/// Clone `request.source` to `request.target`, reporting progress through `on_event`.
pub async fn clone(
    cluster: &Cluster,
    platform: &Platform,
    request: &CloneRequest,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    request.validate()?;
    let flavor = platform.flavor;
    let source = crate::lifecycle::get_vm(cluster, flavor, &request.source).await?;
    let vm_kind = Kind::vm(flavor);
    let ns = request.source.namespace.as_str();
    ensure_free(cluster, &vm_kind, ns, &request.target).await?;
    let mut object = clone_object(cluster, flavor, request, &source).await?;
    // The new VM's own identity (see [`identity`]): what of the source's user data is ours.
    let user_data = identity::read_user_data(cluster, flavor, &source)
        .await?
        .filter(|(_, text)| identity::has_platform_ssh(text));
    let new_secret = identity::secret_name(&request.target);
    // Deckhouse copies the source's Secret under this name (see deckhouse::plan): a taken one
    // fails the operation only after it started.
    let copied = match (&user_data, flavor) {
        (Some((identity::UserDataSource::Secret(secret, _), _)), Flavor::Deckhouse) => Some(
            deckhouse::new_name(&request.source.name, &request.target, secret),
        ),
        _ => None,
    };
    if let Some(copy) = &copied {
        ensure_free(cluster, &crate::api::SECRET, ns, copy).await?;
    }
    // Otherwise the new VM gets a Secret of ours, made before the clone.
    let own_secret = user_data.is_some() && copied.is_none();
    if own_secret {
        ensure_free(cluster, &crate::api::SECRET, ns, &new_secret).await?;
    }
    // KubeVirt: the new VM's cloud-init volume names our Secret; network data that finds its
    // cards by MAC goes there too, rewritten for MACs of the copy's own (see [`network_data`]).
    let mut copy_network = None;
    if let (
        Flavor::KubeVirt,
        Some((
            identity::UserDataSource::Secret(_, Some(i))
            | identity::UserDataSource::Inline(Some(i)),
            _,
        )),
    ) = (flavor, &user_data)
    {
        let volume = source
            .pointer(&format!("/spec/template/spec/volumes/{i}"))
            .cloned()
            .unwrap_or_default();
        // Without network data the platform's clone leaves MACs out (it assigns them).
        copy_network = identity::read_network_data(cluster, ns, &volume)
            .await?
            .and_then(|text| {
                network_data::for_copy(&source, &text, crate::create::networks::random_mac)
            });
        if let Some(n) = &copy_network {
            object["spec"]["newMacAddresses"] = json!(n.new_macs);
        }
        if let Some(patch) =
            identity::kubevirt_volume_patch(&source, *i, &new_secret, copy_network.is_some())
            && let Some(patches) = object["spec"]["patches"].as_array_mut()
        {
            patches.push(Value::String(patch));
        }
    }
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if request.dry_run == DryRun::Client {
        return Ok(Outcome {
            vm_ref: vm_kind.object_ref(&request.target),
            request_object: object,
            vm: None,
            disks: Vec::new(),
            waited: false,
        });
    }
    let new_text = match (&user_data, request.dry_run) {
        (Some((_, text)), DryRun::None) => {
            new_identity(cluster, platform, request, text, on_event).await?
        }
        _ => None,
    };
    let mut made_secret: Option<String> = None;
    if let (true, Some(text)) = (own_secret, &new_text) {
        let mut secret = identity::secret_object(flavor, ns, &request.target, text);
        if let Some(n) = &copy_network {
            use base64::Engine;
            secret["data"][crate::create::kubevirt::NETWORK_DATA_KEY] =
                json!(base64::engine::general_purpose::STANDARD.encode(&n.text));
        }
        made_secret = Some(identity::create_secret(cluster, &secret).await?);
    }
    let result = run_clone(
        cluster,
        platform,
        request,
        object,
        &name,
        new_text.as_deref(),
        copied.as_deref(),
        made_secret.is_some(),
        on_event,
    )
    .await;
    if result.is_err()
        && let Some(uid) = &made_secret
    {
        drop_own_secret(cluster, flavor, request, uid).await;
    }
    result
}

/// The clone object for the platform (KubeVirt's VirtualMachineClone, Deckhouse's Clone
/// operation), refused before anything is made when the disks it would make (Deckhouse) are
/// taken or their names too long.
async fn clone_object(
    cluster: &Cluster,
    flavor: Flavor,
    request: &CloneRequest,
    source: &Value,
) -> Result<Value> {
    match flavor {
        Flavor::KubeVirt => Ok(kubevirt::clone_object(request, source)),
        Flavor::Deckhouse => {
            let plan = deckhouse::plan(request, source);
            deckhouse::check_name_lengths(
                &request.target,
                deckhouse::renames(&plan.operation, "/spec/clone/nameReplacement"),
            )?;
            let ns = request.source.namespace.as_str();
            for disk in &plan.disks {
                ensure_free(cluster, &crate::api::VIRTUAL_DISK, ns, &disk.1).await?;
            }
            Ok(plan.operation)
        }
    }
}

/// The new identity: a fresh host key certified for the new VM, the platform part of the
/// source's user data (`text`) made again for it, so the copy does not answer as the source.
async fn new_identity(
    cluster: &Cluster,
    platform: &Platform,
    request: &CloneRequest,
    text: &str,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Option<String>> {
    let ns = request.source.namespace.as_str();
    let host = crate::create::checks::vm_host_keys(
        cluster,
        platform,
        crate::ca::DEFAULT_NAMESPACE,
        &request.target,
        ns,
        &mut |w| on_event(Event::Notice(w)),
    )
    .await?;
    identity::reissue(
        text,
        &request.source.name,
        &request.target,
        ns,
        host.as_ref(),
    )
    .map_err(Error::Platform)
}

/// After a failed clone, all or nothing: the Secret made for the new VM (uid `uid`) goes,
/// unless the new VM exists (then it is given to it to own). Best effort: the clone's own
/// error is what the user sees.
async fn drop_own_secret(cluster: &Cluster, flavor: Flavor, request: &CloneRequest, uid: &str) {
    let ns = request.source.namespace.as_str();
    let new_secret = identity::secret_name(&request.target);
    let vm_exists = Kind::vm(flavor)
        .api(&cluster.client, Some(ns))
        .get_opt(&request.target)
        .await
        .ok()
        .flatten();
    match vm_exists {
        Some(vm) => {
            let vm = serde_json::to_value(vm).unwrap_or_default();
            let _ = deckhouse::add_owner(
                cluster,
                &crate::api::SECRET,
                ns,
                &new_secret,
                &identity::owner_of(&vm),
            )
            .await;
        }
        None => {
            let _ = identity::delete_secret(cluster, ns, &new_secret, uid).await;
        }
    }
}

/// Create the clone object and follow it (see [`clone`]); `new_text` is the new VM's user
/// data, to be written over the Secret `copied` (Deckhouse's copy of the source's) as soon as
/// it appears, or (`own_secret`) already in the new VM's own Secret, which it then owns.
#[allow(clippy::too_many_arguments)]
async fn run_clone(
    cluster: &Cluster,
    platform: &Platform,
    request: &CloneRequest,
    object: Value,
    name: &str,
    new_text: Option<&str>,
    copied: Option<&str>,
    own_secret: bool,
    on_event: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome> {
    let flavor = platform.flavor;
    let vm_kind = Kind::vm(flavor);
    let kind = match flavor {
        Flavor::KubeVirt => kubevirt::CLONE,
        Flavor::Deckhouse => crate::lifecycle::deckhouse::VMOP,
    };
    let run = CloneRun {
        cluster,
        platform,
        request,
        ns: request.source.namespace.as_str(),
        kind,
        name,
        on_event,
    };
    let created = run.create(object).await?;
    let op_uid = created
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let identity_pending = new_text.is_some();
    if identity_pending && !request.wait {
        on_event(Event::Notice(format!(
            "waiting for the clone anyway: {} gets its own SSH identity once it exists",
            request.target
        )));
    }
    if request.dry_run == DryRun::Server || (!request.wait && !identity_pending) {
        return Ok(Outcome {
            vm_ref: vm_kind.object_ref(&request.target),
            request_object: created,
            vm: None,
            disks: Vec::new(),
            waited: false,
        });
    }
    on_event(Event::Accepted(kind.object_ref(name)));
    let mut copy = copied.zip(new_text).map(|(secret, text)| CopiedSecret {
        secret,
        text,
        op_uid: &op_uid,
    });
    if let (Some(c), DryRun::None) = (&copy, request.dry_run)
        && run.premake_copy(c).await?
    {
        copy = None;
    }
    let record = run.follow(&mut copy).await?;
    let disks = run.adopt(copy.as_ref(), own_secret).await?;
    on_event(Event::Labelled(disks.len()));
    if request.start {
        run.start().await?;
    }
    let vm = crate::lifecycle::get_vm(cluster, flavor, &request.target_ref()).await?;
    Ok(Outcome {
        vm_ref: vm_kind.object_ref(&request.target),
        request_object: record,
        vm: Some(vm),
        disks,
        waited: true,
    })
}

/// Deckhouse's copy of the source's Secret that still has to get the new VM's identity
/// (`text`, its user data), made by the clone operation `op_uid`.
struct CopiedSecret<'a> {
    secret: &'a str,
    text: &'a str,
    op_uid: &'a str,
}

/// One clone object being created and followed: what each step of [`run_clone`] needs.
struct CloneRun<'a> {
    cluster: &'a Cluster,
    platform: &'a Platform,
    request: &'a CloneRequest,
    ns: &'a str,
    /// The clone object's kind: KubeVirt's VirtualMachineClone or Deckhouse's operation.
    kind: Kind,
    /// The clone object's name.
    name: &'a str,
    on_event: &'a (dyn Fn(Event) + Send + Sync),
}

impl CloneRun<'_> {
    /// Creates the clone object (a server dry run when asked) and returns it as stored.
    async fn create(&self, object: Value) -> Result<Value> {
        let params = PostParams {
            dry_run: self.request.dry_run == DryRun::Server,
            ..Default::default()
        };
        let data: DynamicObject = serde_json::from_value(object).map_err(|e| {
            Error::Internal(format!("the {} does not serialise: {e}", self.kind.kind))
        })?;
        let api = self.kind.api(&self.cluster.client, Some(self.ns));
        let created = api.create(&params, &data).await.map_err(|e| {
            self.cluster.error(
                e,
                &self.kind.action("create", Some(self.ns)).named(self.name),
            )
        })?;
        Ok(serde_json::to_value(created).unwrap_or_default())
    }

    /// Makes the Secret the copy will refer to before the platform does; whether it did.
    ///
    /// Deckhouse creates its copy of the source's Secret and then the VM in one pass, with the
    /// source's runPolicy: an AlwaysOn copy starts as soon as its disks are ready, and would
    /// boot with the source's identity if the copy still held it. Closed here: the Secret the
    /// copy will refer to is made now, with the new identity, marked as made by this operation
    /// (`virtualization.deckhouse.io/vmoprestore: <uid>`); the provisioner restorer then takes
    /// it as its own and creates nothing (deckhouse/virtualization `service/restorer/restorers/
    /// provisioner_restorer.go`, ValidateClone/ProcessClone: an existing Secret with the
    /// operation's uid returns early), and its processing comes only after the operation's
    /// snapshot step. Only if the platform was first (409) is its copy rewritten while
    /// following.
    async fn premake_copy(&self, copy: &CopiedSecret<'_>) -> Result<bool> {
        let target = &self.request.target;
        let mut secret = identity::secret_object(self.platform.flavor, self.ns, target, copy.text);
        secret["metadata"]["name"] = json!(copy.secret);
        secret["metadata"]["annotations"] = json!({ identity::MADE_BY_OPERATION: copy.op_uid });
        match identity::create_secret(self.cluster, &secret).await {
            Ok(_) => {
                (self.on_event)(Event::Notice(format!(
                    "secret/{}: made with {target}'s own identity (principals, host key, host certificate) before the platform copies the source's",
                    copy.secret
                )));
                Ok(true)
            }
            Err(Error::Conflict(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Polls the clone object until it ends (or the timeout), reporting each new phase, and
    /// rewrites the platform's copy of the Secret (`copy`, then `None`) as soon as it exists:
    /// the new VM cannot boot before its disks are ready. Returns the object at its end.
    async fn follow(&self, copy: &mut Option<CopiedSecret<'_>>) -> Result<Value> {
        let (ns, name, kind) = (self.ns, self.name, &self.kind);
        let api = kind.api(&self.cluster.client, Some(ns));
        let work = async {
            let mut last: Option<(String, Option<String>)> = None;
            loop {
                if let Some(c) = copy.as_ref()
                    && self.rewrite_copy(c).await?
                {
                    (self.on_event)(Event::Notice(format!(
                        "secret/{}: the platform's part made {}'s own (principals, host key, host certificate)",
                        c.secret, self.request.target
                    )));
                    *copy = None;
                }
                let current = api.get(name).await.map_err(|e| {
                    self.cluster
                        .error(e, &kind.action("get", Some(ns)).named(name))
                })?;
                let current = serde_json::to_value(current).unwrap_or_default();
                let (phase, detail, end) = match self.platform.flavor {
                    Flavor::KubeVirt => kubevirt::progress(&current),
                    Flavor::Deckhouse => deckhouse::progress(&current),
                };
                if last.as_ref() != Some(&(phase.clone(), detail.clone())) && !phase.is_empty() {
                    (self.on_event)(Event::Phase {
                        phase: phase.clone(),
                        detail: detail.clone(),
                    });
                }
                match end {
                    Some(Ok(())) => return Ok(current),
                    Some(Err(message)) => return Err(Error::Platform(message)),
                    None => {}
                }
                last = Some((phase, detail));
                tokio::time::sleep(POLL).await;
            }
        };
        match tokio::time::timeout(self.request.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout(format!(
                "{} {name:?} in namespace {ns:?} to finish cloning VM {:?}",
                kind.kind.to_ascii_lowercase(),
                self.request.source.name
            ))),
        }
    }

    /// Whether the platform's copy of the Secret exists yet and was given the new identity.
    async fn rewrite_copy(&self, copy: &CopiedSecret<'_>) -> Result<bool> {
        Ok(identity::read_secret(self.cluster, self.ns, copy.secret)
            .await?
            .is_some()
            && self.rewrite(copy).await?)
    }

    /// Writes the new identity over the copy, if this operation's (see
    /// [`identity::rewrite_secret`]).
    async fn rewrite(&self, copy: &CopiedSecret<'_>) -> Result<bool> {
        identity::rewrite_secret(
            self.cluster,
            self.ns,
            copy.secret,
            &self.request.target,
            copy.text,
            copy.op_uid,
        )
        .await
    }

    /// Once the clone has ended: the copy of the Secret still not rewritten must be this
    /// operation's (else the new VM boots someone else's identity), the new VM and its disks
    /// are labelled as ours, and our own Secret (`own_secret`) is given to the new VM. Returns
    /// the disks' names.
    async fn adopt(
        &self,
        copy: Option<&CopiedSecret<'_>>,
        own_secret: bool,
    ) -> Result<Vec<String>> {
        let (cluster, ns, request) = (self.cluster, self.ns, self.request);
        if let Some(copy) = copy
            && !self.rewrite(copy).await?
        {
            return Err(Error::NotOurs(format!(
                "secret {:?} in namespace {ns:?} was not made by {} {:?}; the new VM {} refers to it: check it before starting the VM",
                copy.secret,
                self.kind.kind.to_ascii_lowercase(),
                self.name,
                request.target
            )));
        }
        let flavor = self.platform.flavor;
        let disks = match flavor {
            Flavor::KubeVirt => kubevirt::adopt(cluster, request).await?,
            Flavor::Deckhouse => deckhouse::adopt(cluster, request).await?,
        };
        let new_vm = crate::lifecycle::get_vm(cluster, flavor, &request.target_ref()).await?;
        if own_secret {
            let secret = identity::secret_name(&request.target);
            deckhouse::add_owner(
                cluster,
                &crate::api::SECRET,
                ns,
                &secret,
                &identity::owner_of(&new_vm),
            )
            .await?;
            match flavor {
                // The clone's spec already names the new Secret.
                Flavor::KubeVirt => {}
                Flavor::Deckhouse => {
                    deckhouse::point_user_data_at(cluster, ns, &request.target, &secret).await?
                }
            }
        }
        Ok(disks)
    }

    /// `--start`: starts the new VM unless the platform already runs it (a copy of an
    /// AlwaysOn source), and waits for it to run.
    async fn start(&self) -> Result<()> {
        (self.on_event)(Event::Starting);
        let options = crate::lifecycle::Options {
            dry_run: DryRun::None,
            wait: true,
            timeout: self.request.timeout,
            want_object: false,
        };
        let vm = self.request.target_ref();
        let running = crate::lifecycle::get_vm(self.cluster, self.platform.flavor, &vm).await?;
        if running
            .pointer("/status/printableStatus")
            .and_then(Value::as_str)
            != Some("Running")
            && running.pointer("/status/phase").and_then(Value::as_str) != Some("Running")
        {
            crate::lifecycle::run(
                self.cluster,
                self.platform,
                &crate::lifecycle::Action::Start { paused: false },
                &vm,
                &options,
                &|_| {},
            )
            .await?;
        }
        Ok(())
    }
}

/// Refuse when `name` of `kind` exists (nothing was created yet).
async fn ensure_free(cluster: &Cluster, kind: &Kind, ns: &str, name: &str) -> Result<()> {
    let found = kind
        .api(&cluster.client, Some(ns))
        .get_opt(name)
        .await
        .map_err(|e| cluster.error(e, &kind.action("get", Some(ns)).named(name)))?;
    if found.is_some() {
        return Err(Error::NotOurs(format!(
            "{} {name:?} already exists in namespace {ns:?}; nothing was created (choose another name)",
            kind.kind.to_ascii_lowercase()
        )));
    }
    Ok(())
}

/// A JSON merge patch of `labels` onto `name` of `kind`.
pub(crate) async fn label(
    cluster: &Cluster,
    kind: &Kind,
    ns: &str,
    name: &str,
    labels: Value,
) -> Result<()> {
    kind.api(&cluster.client, Some(ns))
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .map_err(|e| cluster.error(e, &kind.action("patch", Some(ns)).named(name)))?;
    Ok(())
}

#[cfg(test)]
mod tests;
