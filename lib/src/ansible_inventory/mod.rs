//! `kubectl vm ansible-inventory`: running VMs as an Ansible inventory (as `d8 v
//! ansible-inventory` makes one), reached through the `ssh-config` settings: each host's
//! `ansible_host` is its `NAME.NAMESPACE.vm` alias and `all.vars.ansible_ssh_common_args`
//! points `ssh -F` at a generated ssh_config (port-forward `--stdio`, `ssh-cert`, CA trust).
//!
//! Groups and host variables come from the VMs' annotations, which anyone allowed to edit
//! a VM can write: values are marked unsafe (never templated by Ansible) and variables that
//! steer the connection (where to connect, with which program and arguments) are refused.

mod render;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::cluster::Cluster;
use crate::error::Result;
use crate::flavor::Platform;
use crate::ssh::config::{Invocation, VmEntry, shell_word};
use crate::vm::{Scope, VmSummary};

pub use render::{host_json, ini, list_json, yaml, yaml_pipe_padding};

/// Comma-separated groups of a VM (ours).
pub const GROUPS_ANNOTATION: &str = "ansible.kubevm.io/groups";
/// Comma-separated groups of a VM, as `d8 v ansible-inventory` reads them.
pub const DECKHOUSE_GROUPS_ANNOTATION: &str = "ansible.deckhouse.io/groups";
/// Prefix of annotations that set a host variable: `vars.ansible.kubevm.io/VAR: VALUE`.
pub const VAR_PREFIX: &str = "vars.ansible.kubevm.io/";
/// The same, as `d8 v ansible-inventory` reads them (ours win when both set a variable).
pub const DECKHOUSE_VAR_PREFIX: &str = "vars.ansible.deckhouse.io/";

/// Connection variables an annotation may set: who to log in as and how to run things on
/// the guest. Every other `ansible_*` variable is refused.
const ALLOWED_ANSIBLE_VARS: &[&str] = &["ansible_user", "ansible_python_interpreter"];

/// Ansible's magic variables: an inventory must not shadow them.
const RESERVED_VARS: &[&str] = &[
    "hostvars",
    "groups",
    "group_names",
    "inventory_hostname",
    "inventory_hostname_short",
    "inventory_dir",
    "inventory_file",
    "omit",
    "playbook_dir",
    "role_path",
    "environment",
    "vars",
];

/// Group names Ansible (or the script format) gives a meaning of its own.
const RESERVED_GROUPS: &[&str] = &["all", "ungrouped", "_meta"];

/// What to build.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Label keys whose values make groups `KEY_VALUE`.
    pub group_by_labels: Vec<String>,
    /// `ansible_ssh_common_args` for every host (see [`ssh_common_args`]).
    pub ssh_common_args: Option<String>,
}

/// A host variable's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostVar {
    /// Set by us (`ansible_host`, the login the tool already trusts).
    Ours(String),
    /// From the cluster: Ansible must never template it.
    Unsafe(String),
}

/// The inventory: hosts with their variables, groups with their hosts, variables of `all`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Host (`NAME.NAMESPACE`) → variables.
    pub hosts: BTreeMap<String, BTreeMap<String, HostVar>>,
    /// Group → hosts.
    pub groups: BTreeMap<String, BTreeSet<String>>,
    /// Variables of `all` (ours).
    pub vars: BTreeMap<String, String>,
    /// The VMs of the hosts, for their ssh_config blocks.
    pub vms: Vec<VmEntry>,
}

/// Something left out while building, for a warning on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A VM that is not running (no host: nothing answers there).
    NotRunning {
        /// `NAME.NAMESPACE`.
        host: String,
        /// Its status.
        status: String,
    },
    /// A VM whose name cannot be a host name (not a Kubernetes name).
    BadName {
        /// `NAME.NAMESPACE` as the server gave it.
        host: String,
    },
    /// A host variable from an annotation that was refused.
    VarRefused {
        /// `NAME.NAMESPACE`.
        host: String,
        /// The variable.
        var: String,
        /// Why.
        reason: String,
    },
    /// A group name that was refused.
    GroupRefused {
        /// `NAME.NAMESPACE`.
        host: String,
        /// The group as written.
        group: String,
    },
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::NotRunning { host, status } => write!(f, "{host}: skipped, it is {status}"),
            Event::BadName { host } => write!(f, "{host:?}: skipped, not a valid host name"),
            Event::VarRefused { host, var, reason } => {
                write!(f, "{host}: variable {var:?} ignored: {reason}")
            }
            Event::GroupRefused { host, group } => {
                write!(f, "{host}: group {group:?} ignored: reserved or empty")
            }
        }
    }
}

/// A group name Ansible accepts: every character outside `[A-Za-z0-9_]` becomes `_`, and a
/// leading digit gets a `_` before it. `None` for an empty or reserved name.
pub fn group_name(raw: &str) -> Option<String> {
    let raw = raw.trim();
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    (!name.is_empty() && !RESERVED_GROUPS.contains(&name.as_str())).then_some(name)
}

/// Whether an annotation may set variable `var`; the reason when not.
pub fn var_refusal(var: &str, value: &str) -> Option<String> {
    let mut chars = var.chars();
    let identifier = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !identifier {
        return Some("not a valid variable name".into());
    }
    if RESERVED_VARS.contains(&var) {
        return Some("an Ansible magic variable".into());
    }
    let allowed = ALLOWED_ANSIBLE_VARS.contains(&var)
        || var == "ansible_become"
        || var.starts_with("ansible_become_");
    if var.starts_with("ansible_") && !allowed {
        return Some("it steers the connection, which only this tool sets".into());
    }
    if var == "ansible_user" && !crate::signer::policy::valid_login(value) {
        return Some(format!("{value:?} is not a valid login"));
    }
    None
}

/// A Kubernetes object name as a host name part: lowercase letters, digits, `-` and `.`.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

fn strings<'a>(object: &'a Value, pointer: &str) -> impl Iterator<Item = (&'a str, &'a str)> {
    object
        .pointer(pointer)
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
}

/// The inventory of `vms` (whole objects, as [`crate::vm::list`] returns them). Only running
/// VMs are hosts; what is left out is reported through `on_event`.
pub fn build(vms: &[VmSummary], options: &Options, on_event: &mut dyn FnMut(Event)) -> Inventory {
    let mut inv = Inventory::default();
    if let Some(args) = &options.ssh_common_args {
        inv.vars
            .insert("ansible_ssh_common_args".into(), args.clone());
    }
    for vm in vms {
        let host = format!("{}.{}", vm.name, vm.namespace);
        if !valid_name(&vm.name) || !valid_name(&vm.namespace) {
            on_event(Event::BadName { host });
            continue;
        }
        if vm.status != "Running" {
            on_event(Event::NotRunning {
                host,
                status: vm.status.clone(),
            });
            continue;
        }
        let annotations: BTreeMap<&str, &str> =
            strings(&vm.object, "/metadata/annotations").collect();
        let mut vars = BTreeMap::new();
        vars.insert(
            "ansible_host".to_string(),
            HostVar::Ours(format!("{host}.vm")),
        );
        // The login `kubectl vm ssh` uses for this VM (an enrolled VM's own user).
        if let Some(login) = annotations
            .get(crate::names::DEFAULT_LOGIN_ANNOTATION)
            .filter(|l| crate::signer::policy::valid_login(l))
        {
            vars.insert("ansible_user".into(), HostVar::Ours((*login).to_owned()));
        }
        // d8's prefix first so ours override it.
        for prefix in [DECKHOUSE_VAR_PREFIX, VAR_PREFIX] {
            for (key, value) in &annotations {
                let Some(var) = key.strip_prefix(prefix) else {
                    continue;
                };
                match var_refusal(var, value) {
                    Some(reason) => on_event(Event::VarRefused {
                        host: host.clone(),
                        var: var.to_owned(),
                        reason,
                    }),
                    None => {
                        vars.insert(var.to_owned(), HostVar::Unsafe((*value).to_owned()));
                    }
                }
            }
        }
        let mut groups = vec![group_name(&vm.namespace)];
        for key in [DECKHOUSE_GROUPS_ANNOTATION, GROUPS_ANNOTATION] {
            for raw in annotations.get(key).into_iter().flat_map(|v| v.split(',')) {
                if raw.trim().is_empty() {
                    continue;
                }
                let name = group_name(raw);
                if name.is_none() {
                    on_event(Event::GroupRefused {
                        host: host.clone(),
                        group: raw.trim().to_owned(),
                    });
                }
                groups.push(name);
            }
        }
        let labels: BTreeMap<&str, &str> = strings(&vm.object, "/metadata/labels").collect();
        for key in &options.group_by_labels {
            if let Some(value) = labels.get(key.as_str()) {
                groups.push(group_name(&format!("{key}_{value}")));
            }
        }
        for group in groups.into_iter().flatten() {
            inv.groups.entry(group).or_default().insert(host.clone());
        }
        inv.hosts.insert(host, vars);
        inv.vms.push(VmEntry {
            name: vm.name.clone(),
            namespace: vm.namespace.clone(),
        });
    }
    inv
}

/// Read the VMs in `scope` (matching `selector`) and build their inventory.
pub async fn collect(
    cluster: &Cluster,
    platform: &Platform,
    scope: &Scope,
    selector: Option<&str>,
    options: &Options,
    on_event: &mut dyn FnMut(Event),
) -> Result<Inventory> {
    let list = crate::vm::list(cluster, platform, scope, selector).await?;
    Ok(build(&list.items, options, on_event))
}

/// Where the ssh_config for Ansible is written: under `home`'s `.kube/kubectl-vm/ansible/`,
/// one file per cluster selection (`key`: the server, context and flags the generated
/// commands carry), so repeated runs replace it rather than add files.
pub fn ssh_config_path(home: &Path, inv: &Invocation, key: &[&str]) -> PathBuf {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    for word in std::iter::once(inv.program.as_str())
        .chain(inv.global_args.iter().map(String::as_str))
        .chain(key.iter().copied())
    {
        hash.update(word.as_bytes());
        hash.update([0]);
    }
    let digest = hash.finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    home.join(".kube/kubectl-vm/ansible")
        .join(format!("ssh_config-{hex}"))
}

/// `ansible_ssh_common_args` that make ssh read `config`: Ansible splits it like a shell,
/// so the path is quoted.
pub fn ssh_common_args(config: &Path) -> String {
    format!("-F {}", shell_word(&config.display().to_string()))
}
