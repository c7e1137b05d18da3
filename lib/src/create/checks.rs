//! What `create` checks against the cluster before writing anything: whether CDI verifies
//! the `--checksum`, a Deckhouse VM's class sizing policy, and the platform SSH CA (whose
//! public keys go into the guest, and whose private key signs the VM's host key).

use serde_json::Value;

use crate::api::{CDI, VIRTUAL_MACHINE_CLASS};
use crate::ca::store;
use crate::ca::{DEFAULT_HOST_CERT_VALIDITY, HostKeys};
use crate::cluster::Cluster;
use crate::create::plan::OsType;
use crate::create::{BootSource, VmPlan, sizing};
use crate::error::{Error, Result};
use crate::flavor::Platform;
use crate::signer::{self, client::Mode};
use crate::validate::{Checksum, ChecksumAlgo};

/// First CDI release that verifies `http.checksum`.
pub const CDI_CHECKSUM_SINCE: (u64, u64) = (1, 65);

/// The CDI version the cluster runs, from its CDI object (`status.observedVersion`).
pub async fn cdi_version(cluster: &Cluster) -> Option<(u64, u64)> {
    let list = CDI
        .api(&cluster.client, None)
        .list(&Default::default())
        .await
        .ok()?;
    let object = serde_json::to_value(list.items.first()?).ok()?;
    parse_cdi_version(object.pointer("/status/observedVersion")?.as_str()?)
}

fn parse_cdi_version(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim_start_matches('v').split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Why CDI of version `cdi` would not verify `checksums`, or `None` when it does.
pub fn checksum_gap(cdi: Option<(u64, u64)>, checksums: &[Checksum]) -> Option<String> {
    match cdi {
        Some(v) if v >= CDI_CHECKSUM_SINCE => {
            let cdi_supported = |c: &Checksum| {
                !matches!(
                    c.algo,
                    ChecksumAlgo::Streebog256 | ChecksumAlgo::Streebog512
                )
            };
            if checksums.iter().any(cdi_supported) {
                None
            } else {
                Some("CDI verifies md5, sha1, sha256 and sha512 only, not streebog".to_owned())
            }
        }
        Some((major, minor)) => Some(format!(
            "CDI v{major}.{minor} does not verify checksums (v1.65 and later do)"
        )),
        None => {
            Some("the cluster's CDI version is unknown, so it may not verify checksums".to_owned())
        }
    }
}

/// Keep checksums only where the platform verifies them; otherwise refuse, or with
/// `allow_unverified` drop them and warn.
pub async fn check_checksums(
    cluster: &Cluster,
    platform: &Platform,
    plan: &mut VmPlan,
    allow_unverified: bool,
    warn: &mut dyn FnMut(String),
) -> Result<()> {
    let BootSource::Url { checksums, .. } = &mut plan.boot else {
        return Ok(());
    };
    if checksums.is_empty() || crate::platform::of(platform.flavor).verifies_every_checksum {
        return Ok(());
    }
    let Some(why) = checksum_gap(cdi_version(cluster).await, checksums) else {
        return Ok(());
    };
    if !allow_unverified {
        return Err(Error::Internal(format!(
            "{why}; refusing to import {} unverified (pass --allow-unverified to import it anyway)",
            plan.name
        )));
    }
    warn(format!(
        "{why}; importing the image without verifying its checksum (--allow-unverified)"
    ));
    checksums.clear();
    Ok(())
}

/// Check a Deckhouse VM against its class's sizing policy, reporting every violation.
pub async fn check_sizing(cluster: &Cluster, platform: &Platform, plan: &VmPlan) -> Result<()> {
    let mut kind = VIRTUAL_MACHINE_CLASS;
    if !platform.serves(kind.group, kind.version) {
        kind.version = "v1alpha3";
    }
    let class = kind
        .api(&cluster.client, None)
        .get_opt(plan.class_name())
        .await
        .map_err(|e| cluster.error(e, &kind.action("get", None).named(plan.class_name())))?
        // Cluster state, not bad input: exit 1 like a missing namespace.
        .ok_or_else(|| {
            Error::Platform(format!(
                "virtualmachineclass {:?} not found; pass an existing --class",
                plan.class_name()
            ))
        })?;
    let class = serde_json::to_value(class).unwrap_or(Value::Null);
    sizing::check_plan(plan, &class).map_err(|e| Error::Usage(e.to_string()))
}

/// Where the platform SSH CA comes from.
#[derive(Debug, Clone, Default)]
pub struct CaSource {
    /// Public keys from `--ca-public-key` (then the cluster is not asked).
    pub public_keys: Option<Vec<String>>,
    /// Namespace of the CA in the cluster.
    pub namespace: String,
    /// `--require-ca`: fail instead of warning when there is none.
    pub require: bool,
}

/// Fill in the platform SSH CA keys (file, else cluster) and a host key with a CA-signed
/// certificate: from the SSH signer when the cluster has one (a refusal fails the create: a
/// VM that cannot prove its identity is never made silently), else signed here when the CA's
/// private key is readable (the direct mode, with its notice), else none, with a warning.
/// Without a CA the platform SSH part is switched off with a warning (or an error with
/// `require`). Nothing is looked up when the plan does not use platform SSH
/// (`--no-platform-ssh`, Windows).
pub async fn setup_platform_ssh(
    cluster: Option<(&Cluster, &Platform)>,
    ca: &CaSource,
    plan: &mut VmPlan,
    warn: &mut dyn FnMut(String),
) -> Result<()> {
    if !plan.platform_ssh.enabled || plan.os == OsType::Windows {
        return Ok(());
    }
    let keys = match (&ca.public_keys, cluster) {
        (Some(keys), _) => Some(keys.clone()),
        (None, Some((cluster, _))) => store::read_public_keys(cluster, &ca.namespace).await?,
        (None, None) if ca.require => {
            return Err(Error::Usage(
                "--require-ca without a cluster (--dry-run=client) needs --ca-public-key".into(),
            ));
        }
        // Offline (client dry run) without --ca-public-key: no CA was looked for, so there
        // is nothing to warn about.
        (None, None) => {
            plan.platform_ssh.enabled = false;
            return Ok(());
        }
    };
    match keys {
        Some(keys) => plan.platform_ssh.ca_public_keys = keys,
        None if ca.require => {
            return Err(Error::Internal(format!(
                "no platform SSH CA in namespace {:?}: run `kubectl vm ca init`, or pass --ca-public-key",
                ca.namespace
            )));
        }
        None => {
            warn(format!(
                "no platform SSH CA in namespace {:?} (run `kubectl vm ca init`); the VM will not accept CA-signed SSH certificates",
                ca.namespace
            ));
            plan.platform_ssh.enabled = false;
            return Ok(());
        }
    }
    if let (Some((cluster, platform)), None) = (cluster, &ca.public_keys) {
        plan.platform_ssh.revoked_krl = store::read_krl(cluster, &ca.namespace).await?;
        plan.platform_ssh.host = host_keys(cluster, platform, &ca.namespace, plan, warn).await?;
    }
    Ok(())
}

/// The plans of a pool's replicas, each with the platform SSH CA and its own host key and
/// certificate (VM-scoped: they name the replica). The CA is looked up once, for the first
/// replica; a warning repeated for every replica is shown once.
async fn replica_plans(
    cluster: Option<(&Cluster, &Platform)>,
    ca: &CaSource,
    plan: &mut VmPlan,
    replicas: u32,
    warn: &mut dyn FnMut(String),
) -> Result<Vec<VmPlan>> {
    let mut seen: Vec<String> = Vec::new();
    let mut warn_once = |w: String| {
        if !seen.contains(&w) {
            seen.push(w.clone());
            warn(w);
        }
    };
    let mut out: Vec<VmPlan> = Vec::new();
    for index in 0..replicas {
        let mut replica = crate::create::pool::replica_plan(plan, index);
        match out.first() {
            None => setup_platform_ssh(cluster, ca, &mut replica, &mut warn_once).await?,
            Some(first) => {
                replica.platform_ssh.enabled = first.platform_ssh.enabled;
                replica.platform_ssh.ca_public_keys = first.platform_ssh.ca_public_keys.clone();
                replica.platform_ssh.revoked_krl = first.platform_ssh.revoked_krl.clone();
                if let (true, Some((cluster, platform)), None) =
                    (replica.platform_ssh.enabled, cluster, &ca.public_keys)
                {
                    replica.platform_ssh.host =
                        host_keys(cluster, platform, &ca.namespace, &replica, &mut warn_once)
                            .await?;
                }
            }
        }
        out.push(replica);
    }
    if let Some(first) = out.first() {
        plan.platform_ssh.enabled = first.platform_ssh.enabled;
        plan.platform_ssh.ca_public_keys = first.platform_ssh.ca_public_keys.clone();
    }
    Ok(out)
}

/// The VM's host key and certificate (see [`setup_platform_ssh`]).
async fn host_keys(
    cluster: &Cluster,
    platform: &Platform,
    ca_namespace: &str,
    plan: &VmPlan,
    warn: &mut dyn FnMut(String),
) -> Result<Option<HostKeys>> {
    vm_host_keys(
        cluster,
        platform,
        ca_namespace,
        &plan.name,
        &plan.namespace,
        warn,
    )
    .await
}

/// A fresh host key and its certificate for VM `name` in `namespace`, as `create` gets them:
/// from the SSH signer when the cluster has one (a refusal is an error), else signed here with
/// the CA of `ca_namespace` when it is readable (the direct mode, with its notice), else none,
/// with a warning. `clone` and `snapshot restore --new-vm` use it for the new VM.
pub async fn vm_host_keys(
    cluster: &Cluster,
    platform: &Platform,
    ca_namespace: &str,
    name: &str,
    namespace: &str,
    warn: &mut dyn FnMut(String),
) -> Result<Option<HostKeys>> {
    let signing = |e: ssh_key::Error| Error::Internal(format!("the VM's host key: {e}"));
    match signer::client::mode(cluster, Some(platform)).await? {
        Mode::Signer => {
            let key = HostKeys::generate_key(name, namespace)
                .map_err(|e| Error::Internal(e.to_string()))?;
            let certificate =
                signer::client::host_certificate(cluster, namespace, name, key.public_key())
                    .await
                    .map_err(|e| {
                        Error::Refused(format!(
                            "cannot get the VM's host certificate from the SSH signer: {e}"
                        ))
                    })?;
            let host = HostKeys::with_certificate(&key, &certificate)
                .map_err(|e| Error::Internal(e.to_string()))?;
            Ok(Some(host))
        }
        Mode::Direct => match store::read_bundle(cluster, ca_namespace).await? {
            Some(bundle) => {
                warn(signer::client::DIRECT_MODE_NOTICE.into());
                HostKeys::issue(&bundle, name, namespace, DEFAULT_HOST_CERT_VALIDITY)
                    .map(Some)
                    .map_err(|e| match e {
                        crate::ca::CaError::Key(k) => signing(k),
                        other => Error::Internal(other.to_string()),
                    })
            }
            None => {
                warn(format!(
                    "the VM gets no host certificate: the cluster has no SSH signer and you may not read the CA Secret {ca_namespace}/{}; clients will have to trust its host key on first use",
                    crate::ca::SECRET_NAME
                ));
                Ok(None)
            }
        },
    }
}

/// Options of [`prepare`].
#[derive(Debug, Clone, Default)]
pub struct PrepareOptions {
    /// `--allow-unverified`: import without a checksum the platform cannot verify.
    pub allow_unverified: bool,
    /// Where the platform SSH CA comes from.
    pub ca: CaSource,
}

/// A plan checked against the cluster: the objects to create and what already exists.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The plan as adjusted by the checks (CA keys, host key, dropped checksums).
    pub plan: VmPlan,
    /// The objects to create, in order.
    pub manifests: crate::create::Manifests,
    /// Kept disks that will be reused.
    pub existing: crate::create::execute::Existing,
}

/// The whole pre-write phase of `create`: checksum support and (Deckhouse) sizing against
/// the cluster, the platform SSH CA, the manifests, and the existence check of every object.
/// Without a cluster (client dry run) only the CA from `options.ca` and the manifests.
/// Warnings go to `warn`; nothing is written.
pub async fn prepare(
    cluster: Option<(&Cluster, &Platform)>,
    mut plan: VmPlan,
    options: &PrepareOptions,
    warn: &mut dyn FnMut(String),
) -> Result<Prepared> {
    if let Some((cluster, platform)) = cluster {
        check_checksums(cluster, platform, &mut plan, options.allow_unverified, warn).await?;
        if crate::platform::of(plan.flavor).sizing_policies {
            check_sizing(cluster, platform, &plan).await?;
        }
        crate::create::networks::check(cluster, &plan).await?;
    }
    match cluster {
        Some((cluster, _)) => crate::create::secrets::load(cluster, &mut plan, warn).await?,
        None if crate::create::secrets::names_secrets(&plan) => {
            return Err(Error::Usage(
                "--user-data-secret, --ssh-key-secret and boot-time --access-credential keys are read from the cluster: use --dry-run=server instead of --dry-run=client".into(),
            ));
        }
        None => {}
    }
    let built = match plan.replicas {
        None => {
            setup_platform_ssh(cluster, &options.ca, &mut plan, warn).await?;
            crate::create::build(&plan)
        }
        Some(n) => {
            if let Some((_, platform)) = cluster
                && let Some(pool) = crate::platform::of(plan.flavor).pool
                && !platform.serves(pool.group, pool.version)
            {
                return Err(Error::Platform(
                    "--replicas needs KubeVirt's VirtualMachinePool (pool.kubevirt.io/v1beta1), which this cluster does not serve".into(),
                ));
            }
            let replicas = replica_plans(cluster, &options.ca, &mut plan, n, warn).await?;
            crate::create::pool::build(&plan, &replicas)
        }
    };
    let manifests = built.map_err(|e| match e {
        crate::create::CreateError::CloudInit(e) if plan.guest.user_data_from_secret => {
            Error::Platform(format!(
                "--user-data-secret {}: {}",
                plan.extras.user_data_secret.as_deref().unwrap_or_default(),
                e.to_string().replace("--cloud-init data", "the user data")
            ))
        }
        e => Error::Usage(e.to_string()),
    })?;
    let existing = match cluster {
        Some((cluster, _)) => crate::create::execute::check_existing(cluster, &manifests).await?,
        None => Default::default(),
    };
    Ok(Prepared {
        plan,
        manifests,
        existing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(algo: &str) -> Checksum {
        let hex = match algo {
            "sha256" | "streebog256" => "0".repeat(64),
            _ => "0".repeat(128),
        };
        format!("{algo}:{hex}").parse().unwrap()
    }

    #[test]
    fn checksums_are_verified_from_cdi_1_65() {
        assert_eq!(parse_cdi_version("v1.65.0"), Some((1, 65)));
        assert_eq!(parse_cdi_version("garbage"), None);
        assert_eq!(checksum_gap(Some((1, 65)), &[sum("sha256")]), None);
        assert!(
            checksum_gap(Some((1, 64)), &[sum("sha256")])
                .unwrap()
                .contains("v1.64 does not verify")
        );
        assert!(
            checksum_gap(Some((1, 70)), &[sum("streebog256")])
                .unwrap()
                .contains("not streebog")
        );
        assert!(
            checksum_gap(None, &[sum("sha256")])
                .unwrap()
                .contains("unknown")
        );
    }
}
