//! The CA in the cluster: reading, creating and rotating the Secret and ConfigMap of
//! [`super`], with the namespace and the reader Role/RoleBinding around them.
//!
//! Updates carry the `resourceVersion` that was read, so two rotations running at once cannot
//! silently drop each other's key: the second one gets a Conflict and is told to retry.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::objects::{self, READER_NAME};
use super::{CONFIGMAP_NAME, CaBundle, CaError, SECRET_NAME, fingerprint};
use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};

/// Namespace that holds the CA unless `--ca-namespace` says otherwise.
pub const DEFAULT_CA_NAMESPACE: &str = super::DEFAULT_NAMESPACE;

use crate::names::FIELD_MANAGER;

fn secret_action(verb: &'static str, namespace: &str) -> Action {
    Action::new(verb, "secrets", "secret")
        .named(SECRET_NAME)
        .in_namespace(Some(namespace))
}

fn configmap_action(verb: &'static str, namespace: &str) -> Action {
    Action::new(verb, "configmaps", "configmap")
        .named(CONFIGMAP_NAME)
        .in_namespace(Some(namespace))
}

fn ca_error(err: CaError) -> Error {
    Error::Internal(err.to_string())
}

/// The public keys published in the CA ConfigMap, as OpenSSH lines, oldest first; the last
/// one signs. `None` when there is no CA ConfigMap.
pub async fn read_public_keys(
    cluster: &Cluster,
    ca_namespace: &str,
) -> Result<Option<Vec<String>>> {
    let Some(config_map) = read_configmap(cluster, ca_namespace).await? else {
        return Ok(None);
    };
    let keys = super::trusted_keys_from_configmap(&config_map).map_err(ca_error)?;
    keys.iter()
        .map(|k| k.to_openssh().map_err(|e| ca_error(CaError::Key(e))))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The revoked host keys published in the CA ConfigMap ([`super::REVOKED_KEYS_KEY`]); lines
/// that do not parse are skipped. Empty without a CA or a list.
pub fn revoked_keys_from_configmap(config_map: &ConfigMap) -> Vec<russh::keys::PublicKey> {
    config_map
        .data
        .as_ref()
        .and_then(|d| d.get(super::REVOKED_KEYS_KEY))
        .map(|text| {
            text.lines()
                .filter_map(|l| russh::keys::PublicKey::from_openssh(l.trim()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The CA keys and the revoked host keys of the CA ConfigMap, as OpenSSH lines.
pub fn host_trust_lines(config_map: &ConfigMap) -> Result<(Vec<String>, Vec<String>)> {
    let openssh = |keys: Vec<russh::keys::PublicKey>| {
        keys.iter()
            .map(|k| k.to_openssh().map_err(|e| ca_error(CaError::Key(e))))
            .collect::<Result<Vec<_>>>()
    };
    let keys = super::trusted_keys_from_configmap(config_map).map_err(ca_error)?;
    Ok((
        openssh(keys)?,
        openssh(revoked_keys_from_configmap(config_map))?,
    ))
}

/// What `ca revoke` revokes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revoke {
    /// A host key, refused plain or certified (`--key`).
    Key(russh::keys::PublicKey),
    /// Certificates with this serial number, user or host (`--serial`).
    Serial(u64),
    /// Certificates with this key ID, user or host (`--key-id`).
    KeyId(String),
}

/// What [`revoke`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeOutcome {
    /// There is no CA ConfigMap to publish the list in.
    NoCa,
    /// It was added; the KRL published now (to carry into the guests) and how many entries
    /// of its kind are revoked.
    Added {
        /// How many keys, serials or key IDs (whichever was added) are revoked now.
        count: usize,
        /// The KRL as published.
        krl: Vec<u8>,
    },
    /// It was on the list already.
    AlreadyRevoked,
}

/// Add `what` to the revocation lists in the CA ConfigMap and publish the KRL made from them
/// ([`super::krl`]), written with the resourceVersion read (a Conflict says to run it again).
pub async fn revoke(cluster: &Cluster, ca_namespace: &str, what: &Revoke) -> Result<RevokeOutcome> {
    let Some(mut config_map) = read_configmap(cluster, ca_namespace).await? else {
        return Ok(RevokeOutcome::NoCa);
    };
    let mut lists = super::krl::Revocations::from_configmap(&config_map);
    let (added, count) = match what {
        Revoke::Key(key) => {
            if lists.keys.iter().any(|k| k.key_data() == key.key_data()) {
                (false, 0)
            } else {
                let mut key = key.clone();
                key.set_comment("");
                lists.keys.push(key);
                (true, lists.keys.len())
            }
        }
        Revoke::Serial(n) => (lists.serials.insert(*n), lists.serials.len()),
        Revoke::KeyId(id) => (lists.key_ids.insert(id.clone()), lists.key_ids.len()),
    };
    if !added {
        return Ok(RevokeOutcome::AlreadyRevoked);
    }
    let version = super::krl::krl_version(&config_map) + 1;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    config_map.metadata.managed_fields = None;
    lists.store(&mut config_map, version, now);
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), ca_namespace);
    api.replace(CONFIGMAP_NAME, &PostParams::default(), &config_map)
        .await
        .map_err(|e| match cluster.error(e, &configmap_action("update", ca_namespace)) {
            Error::Conflict(_) => Error::Conflict(format!(
                "the SSH CA ConfigMap in namespace {ca_namespace:?} was changed meanwhile; run the command again"
            )),
            other => other,
        })?;
    Ok(RevokeOutcome::Added {
        count,
        krl: lists.to_krl(version, now),
    })
}

/// The KRL published in the CA ConfigMap, or one that revokes nothing when there is none
/// (no CA, no revocation yet, or a user who may not read it).
pub async fn read_krl(cluster: &Cluster, ca_namespace: &str) -> Result<Vec<u8>> {
    match read_configmap(cluster, ca_namespace).await {
        Ok(Some(cm)) => Ok(super::krl::krl_of(&cm).unwrap_or_else(super::krl::empty_krl)),
        Ok(None) | Err(Error::Forbidden { .. }) => Ok(super::krl::empty_krl()),
        Err(e) => Err(e),
    }
}

/// The CA with its private keys, from its Secret. `None` when there is no Secret, or when the
/// user may not read it (such a user simply gets no host certificate).
pub async fn read_bundle(cluster: &Cluster, ca_namespace: &str) -> Result<Option<CaBundle>> {
    match read_secret(cluster, ca_namespace).await {
        Ok(Some(secret)) => CaBundle::from_secret(&secret).map(Some).map_err(ca_error),
        Ok(None) | Err(Error::Forbidden { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The CA ConfigMap, if it exists.
pub async fn read_configmap(cluster: &Cluster, ca_namespace: &str) -> Result<Option<ConfigMap>> {
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), ca_namespace);
    api.get_opt(CONFIGMAP_NAME)
        .await
        .map_err(|e| cluster.error(e, &configmap_action("get", ca_namespace)))
}

async fn read_secret(cluster: &Cluster, ca_namespace: &str) -> Result<Option<Secret>> {
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), ca_namespace);
    api.get_opt(SECRET_NAME)
        .await
        .map_err(|e| cluster.error(e, &secret_action("get", ca_namespace)))
}

/// One published CA key, as `ca show` prints it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedKey {
    /// The OpenSSH public key line.
    pub openssh: String,
    /// `SHA256:…`.
    pub fingerprint: String,
    /// The key's comment (`kubevm-ca@UNIX-TIME`).
    pub comment: String,
    /// Algorithm as `ssh-keygen -l` prints it (`ED25519`).
    pub algorithm: String,
    /// Key size in bits as `ssh-keygen -l` prints it, when known.
    pub bits: Option<u32>,
    /// Whether this key signs new certificates (the newest); the others are only trusted.
    pub signing: bool,
}

/// The published public keys with their fingerprints, oldest first. `None` without a CA.
pub async fn published_keys(
    cluster: &Cluster,
    ca_namespace: &str,
) -> Result<Option<Vec<PublishedKey>>> {
    let Some(config_map) = read_configmap(cluster, ca_namespace).await? else {
        return Ok(None);
    };
    let keys = super::trusted_keys_from_configmap(&config_map).map_err(ca_error)?;
    let last = keys.len() - 1;
    keys.iter()
        .enumerate()
        .map(|(i, key)| {
            let (algorithm, bits) = match key.algorithm() {
                ssh_key::Algorithm::Ed25519 => ("ED25519".to_owned(), Some(256)),
                other => (other.as_str().to_ascii_uppercase(), None),
            };
            Ok(PublishedKey {
                openssh: key.to_openssh().map_err(|e| ca_error(CaError::Key(e)))?,
                fingerprint: fingerprint(key),
                comment: key.comment().as_str_lossy().to_owned(),
                algorithm,
                bits,
                signing: i == last,
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// What `init` did.
#[derive(Debug)]
pub enum InitOutcome {
    /// A new CA was created; `namespace_created` tells whether its namespace was new.
    Created {
        /// The new CA.
        bundle: CaBundle,
        /// Whether the namespace had to be created.
        namespace_created: bool,
        /// Whether the ConfigMap was new (else a leftover was overwritten).
        configmap_created: bool,
        /// Whether the reader Role was new (else an existing one was updated).
        role_created: bool,
        /// Whether the reader RoleBinding was new (else an existing one was updated).
        binding_created: bool,
    },
    /// A CA Secret exists already; nothing was changed.
    Exists,
}

/// Create a new CA: the namespace if missing, the Secret (refusing to overwrite one), the
/// ConfigMap, and the Role/RoleBinding that let every authenticated user read the ConfigMap.
pub async fn init(cluster: &Cluster, ca_namespace: &str) -> Result<InitOutcome> {
    let namespace_created = ensure_namespace(cluster, ca_namespace).await?;
    let bundle = CaBundle::generate().map_err(ca_error)?;
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), ca_namespace);
    let secret = bundle.to_secret(ca_namespace).map_err(ca_error)?;
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => return Ok(InitOutcome::Exists),
        Err(e) => return Err(cluster.error(e, &secret_action("create", ca_namespace))),
    }
    // A ConfigMap left from an earlier, half-finished CA is overwritten: the new Secret rules.
    let config_map = bundle.to_configmap(ca_namespace).map_err(ca_error)?;
    let configmap_created = apply(
        cluster,
        ca_namespace,
        &config_map,
        configmap_action("patch", ca_namespace),
    )
    .await?;
    let role = objects::reader_role(ca_namespace);
    let role_action = Action::new("patch", "roles.rbac.authorization.k8s.io", "role")
        .named(READER_NAME)
        .in_namespace(Some(ca_namespace));
    let role_created = apply(cluster, ca_namespace, &role, role_action).await?;
    let binding = objects::reader_role_binding(ca_namespace);
    let binding_action = Action::new(
        "patch",
        "rolebindings.rbac.authorization.k8s.io",
        "rolebinding",
    )
    .named(READER_NAME)
    .in_namespace(Some(ca_namespace));
    let binding_created = apply(cluster, ca_namespace, &binding, binding_action).await?;
    Ok(InitOutcome::Created {
        bundle,
        namespace_created,
        configmap_created,
        role_created,
        binding_created,
    })
}

/// Server-side apply of one namespaced object that kubectl-vm owns entirely. Returns whether
/// the object was new (looked up first, as `kubectl apply` does to say created/configured).
async fn apply<K>(cluster: &Cluster, namespace: &str, object: &K, action: Action) -> Result<bool>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(cluster.client.clone(), namespace);
    let name = object.meta().name.clone().unwrap_or_default();
    // Server-side apply needs apiVersion and kind in the body.
    let mut body = serde_json::to_value(object)
        .map_err(|e| Error::Internal(format!("cannot encode {name}: {e}")))?;
    body["apiVersion"] = K::api_version(&Default::default()).into_owned().into();
    body["kind"] = K::kind(&Default::default()).into_owned().into();
    let mut get = action.clone();
    get.verb = "get";
    let existed = match api.get_opt(&name).await {
        Ok(found) => found.is_some(),
        // A user who may apply but not read: the apply still says what is wrong.
        Err(e) => match cluster.error(e, &get) {
            Error::Forbidden { .. } => false,
            other => return Err(other),
        },
    };
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| !existed)
    .map_err(|e| cluster.error(e, &action))
}

/// Create the namespace unless it exists. Returns whether it was created. A user who may not
/// read namespaces goes on: the requests in the namespace will say what is wrong.
async fn ensure_namespace(cluster: &Cluster, name: &str) -> Result<bool> {
    let api: Api<Namespace> = Api::all(cluster.client.clone());
    let get = Action::new("get", "namespaces", "namespace").named(name);
    match api.get_opt(name).await {
        Ok(Some(_)) => return Ok(false),
        Ok(None) => {}
        Err(e) => match cluster.error(e, &get) {
            Error::Forbidden { .. } => return Ok(false),
            other => return Err(other),
        },
    }
    match api
        .create(&PostParams::default(), &objects::namespace(name))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(cluster.error(
            e,
            &Action::new("create", "namespaces", "namespace").named(name),
        )),
    }
}

/// What `rotate` did, or why it did nothing.
#[derive(Debug)]
pub enum RotateOutcome {
    /// There is no CA Secret.
    NoCa,
    /// A new signing key was added; the old keys stay trusted.
    Started {
        /// The CA after the rotation started.
        bundle: CaBundle,
    },
    /// A rotation is already in progress (starting another is refused).
    AlreadyRotating {
        /// The CA as it is.
        bundle: CaBundle,
    },
    /// The old keys were dropped; only the signing key is trusted now.
    Finished {
        /// The CA after the rotation.
        bundle: CaBundle,
        /// Fingerprints of the keys no longer trusted.
        dropped: Vec<String>,
    },
    /// `--finish` without a rotation in progress.
    NotRotating {
        /// The CA as it is.
        bundle: CaBundle,
    },
}

/// Start (`finish: false`) or finish a rotation. The ConfigMap is written first, so a public
/// key is published before anything is signed with it; both writes carry the
/// `resourceVersion` read, and a Conflict tells the user to run the command again.
pub async fn rotate(cluster: &Cluster, ca_namespace: &str, finish: bool) -> Result<RotateOutcome> {
    let Some(secret) = read_secret(cluster, ca_namespace).await? else {
        return Ok(RotateOutcome::NoCa);
    };
    let mut bundle = CaBundle::from_secret(&secret).map_err(ca_error)?;
    let old = bundle.fingerprints();
    match (finish, bundle.in_rotation()) {
        (false, true) => return Ok(RotateOutcome::AlreadyRotating { bundle }),
        (true, false) => return Ok(RotateOutcome::NotRotating { bundle }),
        (false, false) => bundle.rotate().map_err(ca_error)?,
        (true, true) => {
            bundle.finish_rotation();
        }
    }
    let conflict = |e: Error| match e {
        Error::Conflict(_) => Error::Conflict(format!(
            "the SSH CA in namespace {ca_namespace:?} was changed by someone else during the rotation; run the command again"
        )),
        other => other,
    };
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), ca_namespace);
    let mut config_map = bundle.to_configmap(ca_namespace).map_err(ca_error)?;
    match read_configmap(cluster, ca_namespace).await? {
        Some(current) => {
            config_map.metadata.resource_version = current.metadata.resource_version;
            // The revocation lists and the KRL outlive a rotation (the KRL names no CA key).
            for key in [super::REVOKED_KEYS_KEY, super::krl::REVOKED_CERTS_KEY] {
                if let Some(revoked) = current.data.as_ref().and_then(|d| d.get(key)) {
                    config_map
                        .data
                        .get_or_insert_with(Default::default)
                        .insert(key.into(), revoked.clone());
                }
            }
            config_map.binary_data = current.binary_data.clone();
            config_maps
                .replace(CONFIGMAP_NAME, &PostParams::default(), &config_map)
                .await
                .map_err(|e| {
                    conflict(cluster.error(e, &configmap_action("update", ca_namespace)))
                })?;
        }
        None => {
            config_maps
                .create(&PostParams::default(), &config_map)
                .await
                .map_err(|e| {
                    conflict(cluster.error(e, &configmap_action("create", ca_namespace)))
                })?;
        }
    }
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), ca_namespace);
    let mut new_secret = bundle.to_secret(ca_namespace).map_err(ca_error)?;
    new_secret.metadata.resource_version = secret.metadata.resource_version;
    secrets
        .replace(SECRET_NAME, &PostParams::default(), &new_secret)
        .await
        .map_err(|e| conflict(cluster.error(e, &secret_action("update", ca_namespace))))?;
    Ok(if finish {
        let kept = bundle.fingerprints();
        let dropped = old.into_iter().filter(|f| !kept.contains(f)).collect();
        RotateOutcome::Finished { bundle, dropped }
    } else {
        RotateOutcome::Started { bundle }
    })
}
