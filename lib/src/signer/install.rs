//! The signer's manifests (`kubectl vm ca init --signer --image IMAGE`) and applying them.
//!
//! Least privilege: the signer's ServiceAccount may read the CA Secret by name and nothing else
//! in its namespace, get VMs, create Events, and review access (`system:auth-delegator`, as
//! every aggregated server needs); it reads the API server's front-proxy settings through
//! `extension-apiserver-authentication-reader`. Users are granted SSH with the ClusterRoles
//! [`USER_ROLE`] and [`HOST_ROLE`], bound per namespace, or per VM with a Role that lists
//! `resourceNames`.

use base64::Engine;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use serde_json::{Value, json};

use super::{APISERVICE_NAME, GROUP, HOST_CERTIFICATE, USER_CERTIFICATE, VERSION};
use crate::cluster::Cluster;
use crate::error::{Action, Error, Result};

/// Name of the signer's Deployment, Service, ServiceAccount and Role.
pub const NAME: &str = "kubevm-ssh-signer";
/// Secret with the signer's serving certificate.
pub const TLS_SECRET: &str = "kubevm-ssh-signer-tls";
/// ClusterRole that grants user certificates (ssh, scp, ssh-config).
pub const USER_ROLE: &str = "kubevm:ssh";
/// ClusterRole that grants host certificates (what `create` needs for each new VM).
pub const HOST_ROLE: &str = "kubevm:ssh-host-certificates";
/// ClusterRole of the signer itself.
const SIGNER_ROLE: &str = "kubevm:ssh-signer";
/// Port the signer listens on in its pod.
pub const CONTAINER_PORT: u16 = 8443;

fn labels() -> Value {
    json!({"app.kubernetes.io/name": NAME, "app.kubernetes.io/managed-by": "kubectl-vm"})
}

fn meta(name: &str, namespace: Option<&str>) -> Value {
    let mut m = json!({"name": name, "labels": labels()});
    if let Some(ns) = namespace {
        m["namespace"] = json!(ns);
    }
    m
}

/// The serving certificate of the signer: a CA of its own (the APIService's caBundle) and a
/// certificate for the Service's DNS names.
#[derive(Clone, PartialEq, Eq)]
pub struct ServingCert {
    /// PEM of the CA (caBundle).
    pub ca_pem: String,
    /// PEM of the serving certificate.
    pub cert_pem: String,
    /// PEM of its private key.
    pub key_pem: String,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert").finish_non_exhaustive()
    }
}

/// The DNS names the API server reaches the Service by.
pub fn service_dns_names(namespace: &str) -> Vec<String> {
    vec![
        format!("{NAME}.{namespace}.svc"),
        format!("{NAME}.{namespace}.svc.cluster.local"),
    ]
}

impl ServingCert {
    /// Generate a CA and a serving certificate for the Service in `namespace`.
    pub fn generate(namespace: &str) -> Result<ServingCert> {
        let err =
            |e: rcgen::Error| Error::Internal(format!("generating the serving certificate: {e}"));
        let ca_key = KeyPair::generate().map_err(err)?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.distinguished_name.push(
            DnType::CommonName,
            format!("{NAME}-ca@{}", jiff::Timestamp::now().as_second()),
        );
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        ca_params.not_after = rcgen::date_time_ymd(2036, 1, 1);
        let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
        let issuer = Issuer::from_params(&ca_params, &ca_key);
        let mut params = CertificateParams::new(service_dns_names(namespace)).map_err(err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{NAME}.{namespace}.svc"));
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.not_after = rcgen::date_time_ymd(2036, 1, 1);
        let key = KeyPair::generate().map_err(err)?;
        let cert = params.signed_by(&key, &issuer).map_err(err)?;
        Ok(ServingCert {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Read it back from the TLS Secret's data (base64 values).
    pub fn from_secret(secret: &Value) -> Option<ServingCert> {
        let field = |k: &str| -> Option<String> {
            let b64 = secret["data"][k].as_str()?;
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
            String::from_utf8(bytes).ok()
        };
        Some(ServingCert {
            ca_pem: field("ca.crt")?,
            cert_pem: field("tls.crt")?,
            key_pem: field("tls.key")?,
        })
    }
}

/// What to install.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// Namespace of the CA and the signer.
    pub namespace: String,
    /// Container image with `kubectl-vm` as its entrypoint.
    pub image: String,
    /// Replicas of the Deployment.
    pub replicas: u32,
    /// Longest certificate lifetime the signer issues.
    pub max_ttl_seconds: u64,
}

/// Every object of the signer, in apply order.
pub fn manifests(options: &InstallOptions, tls: &ServingCert) -> Vec<Value> {
    let ns = options.namespace.as_str();
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let sa_subject = json!([{"kind": "ServiceAccount", "name": NAME, "namespace": ns}]);
    let rbac = "rbac.authorization.k8s.io";
    let vm_groups = json!(["kubevirt.io", "virtualization.deckhouse.io"]);
    let tls_dir = "/etc/kubevm-ssh-signer/tls";
    let security = json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
        "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}});
    let probe = json!({"httpGet": {"path": "/healthz", "port": CONTAINER_PORT, "scheme": "HTTPS"},
        "periodSeconds": 10});
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(NAME, Some(ns)),
            "automountServiceAccountToken": true}),
        json!({"apiVersion": format!("{rbac}/v1"), "kind": "Role", "metadata": meta(NAME, Some(ns)),
            "rules": [{"apiGroups": [""], "resources": ["secrets"],
                "resourceNames": [crate::ca::SECRET_NAME], "verbs": ["get"]}]}),
        json!({"apiVersion": format!("{rbac}/v1"), "kind": "RoleBinding", "metadata": meta(NAME, Some(ns)),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": NAME}, "subjects": sa_subject}),
        json!({"apiVersion": format!("{rbac}/v1"), "kind": "ClusterRole", "metadata": meta(SIGNER_ROLE, None),
            "rules": [
                {"apiGroups": vm_groups, "resources": ["virtualmachines"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]}),
        json!({"apiVersion": format!("{rbac}/v1"), "kind": "ClusterRoleBinding", "metadata": meta(SIGNER_ROLE, None),
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": SIGNER_ROLE}, "subjects": sa_subject}),
        json!({"apiVersion": format!("{rbac}/v1"), "kind": "ClusterRoleBinding",
            "metadata": meta(&format!("{SIGNER_ROLE}:auth-delegator"), None),
            "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "system:auth-delegator"},
            "subjects": sa_subject}),
        json!({"apiVersion": format!("{rbac}/v1"), "kind": "RoleBinding",
            "metadata": meta(&format!("{SIGNER_ROLE}:authentication-reader"), Some("kube-system")),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "extension-apiserver-authentication-reader"},
            "subjects": sa_subject}),
        json!({"apiVersion": format!("{rbac}/v1"), "kind": "ClusterRole", "metadata": meta(USER_ROLE, None),
            "rules": [{"apiGroups": [GROUP], "resources": [format!("virtualmachines/{USER_CERTIFICATE}")],
                "verbs": ["create"]}]}),
        json!({"apiVersion": format!("{rbac}/v1"), "kind": "ClusterRole", "metadata": meta(HOST_ROLE, None),
            "rules": [{"apiGroups": [GROUP], "resources": [format!("virtualmachines/{HOST_CERTIFICATE}")],
                "verbs": ["create"]}]}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta(TLS_SECRET, Some(ns)),
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": b64(&tls.cert_pem), "tls.key": b64(&tls.key_pem), "ca.crt": b64(&tls.ca_pem)}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": meta(NAME, Some(ns)),
            "spec": {"selector": {"app.kubernetes.io/name": NAME},
                "ports": [{"name": "https", "port": 443, "targetPort": CONTAINER_PORT, "protocol": "TCP"}]}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(NAME, Some(ns)),
            "spec": {"replicas": options.replicas,
                "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                "template": {"metadata": {"labels": labels()},
                    "spec": {"serviceAccountName": NAME,
                        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": NAME}}}}]}},
                        "containers": [{"name": "signer", "image": options.image,
                            "args": ["signer", "serve", "--listen", format!("0.0.0.0:{CONTAINER_PORT}"),
                                "--tls-cert-file", format!("{tls_dir}/tls.crt"),
                                "--tls-private-key-file", format!("{tls_dir}/tls.key"),
                                "--ca-namespace", ns,
                                "--max-ttl", format!("{}s", options.max_ttl_seconds)],
                            "ports": [{"name": "https", "containerPort": CONTAINER_PORT}],
                            "securityContext": security,
                            "readinessProbe": probe, "livenessProbe": probe,
                            "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                "limits": {"memory": "128Mi"}},
                            "volumeMounts": [{"name": "tls", "mountPath": tls_dir, "readOnly": true}]}],
                        "volumes": [{"name": "tls", "secret": {"secretName": TLS_SECRET}}]}}}}),
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(NAME, Some(ns)),
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}}}}),
        // Priority 100, under the 1000 of CRD groups: the discovery lists `virtualmachines`
        // (for kubectl create role), and kubectl's RESTMapper resolves a bare
        // `kubectl get virtualmachines` to the first group in discovery order (priority, then
        // name), which must stay kubevirt.io or virtualization.deckhouse.io.
        json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": meta(APISERVICE_NAME, None),
            "spec": {"group": GROUP, "version": VERSION, "groupPriorityMinimum": 100, "versionPriority": 15,
                "service": {"namespace": ns, "name": NAME, "port": 443},
                "caBundle": b64(&tls.ca_pem)}}),
    ]
}

fn api_resource(object: &Value) -> Result<(ApiResource, bool)> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let plural = match kind {
        "PodDisruptionBudget" => "poddisruptionbudgets".to_owned(),
        other => format!("{}s", other.to_ascii_lowercase()),
    };
    let namespaced = !matches!(kind, "ClusterRole" | "ClusterRoleBinding" | "APIService");
    Ok((ApiResource::from_gvk_with_plural(&gvk, &plural), namespaced))
}

fn describe(object: &Value) -> String {
    let kind = object["kind"]
        .as_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind}/{name} (namespace {ns})"),
        None => format!("{kind}/{name}"),
    }
}

/// The TLS Secret already in the cluster, to keep its certificate across re-runs.
pub async fn existing_serving_cert(
    cluster: &Cluster,
    namespace: &str,
) -> Result<Option<ServingCert>> {
    let api: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(cluster.client.clone(), namespace);
    let action = Action::new("get", "secrets", "secret")
        .named(TLS_SECRET)
        .in_namespace(Some(namespace));
    let secret = api
        .get_opt(TLS_SECRET)
        .await
        .map_err(|e| cluster.error(e, &action))?;
    Ok(secret
        .and_then(|s| serde_json::to_value(s).ok())
        .and_then(|v| ServingCert::from_secret(&v)))
}

/// The APIService's `Available` condition: whether it is true, and its reason and message.
/// `None` when it cannot be read (no permission to read APIServices, or none yet).
pub async fn apiservice_available(cluster: &Cluster) -> Option<(bool, String)> {
    let gvk = GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "apiservices");
    let api: Api<DynamicObject> = Api::all_with(cluster.client.clone(), &resource);
    let object = api.get_opt(APISERVICE_NAME).await.ok()??;
    let conditions = object.data["status"]["conditions"].as_array()?.clone();
    let available = conditions.iter().find(|c| c["type"] == "Available")?;
    let why = format!(
        "{}: {}",
        available["reason"].as_str().unwrap_or_default(),
        available["message"].as_str().unwrap_or_default()
    );
    Some((available["status"] == "True", why))
}

/// What applying one object did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// `kind/name (namespace ns)`.
    pub object: String,
    /// Whether it was new.
    pub created: bool,
}

fn api_for(cluster: &Cluster, object: &Value) -> Result<(Api<DynamicObject>, Action)> {
    let (resource, namespaced) = api_resource(object)?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = object["metadata"]["namespace"].as_str();
    let api: Api<DynamicObject> = match (namespaced, namespace) {
        (true, Some(ns)) => Api::namespaced_with(cluster.client.clone(), ns, &resource),
        _ => Api::all_with(cluster.client.clone(), &resource),
    };
    let kind = object["kind"]
        .as_str()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let action = Action::new("patch", resource.plural.clone(), kind)
        .named(name)
        .in_namespace(namespace);
    Ok((api, action))
}

/// Which of `objects` exist already, refusing (before anything is written) when one of them
/// exists and was not created by kubectl-vm.
pub async fn check_ours(cluster: &Cluster, objects: &[Value]) -> Result<Vec<bool>> {
    let mut existing = Vec::new();
    for object in objects {
        let (api, action) = api_for(cluster, object)?;
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let found = api
            .get_opt(name)
            .await
            .map_err(|e| cluster.error(e, &action))?;
        if let Some(found) = &found {
            let ours = found
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/managed-by"))
                .is_some_and(|v| v == "kubectl-vm");
            if !ours {
                return Err(Error::Refused(format!(
                    "{} exists and was not created by kubectl vm; remove or rename it first",
                    describe(object)
                )));
            }
        }
        existing.push(found.is_some());
    }
    Ok(existing)
}

/// Server-side apply every object (field manager `kubectl-vm`) after [`check_ours`] found
/// none of them foreign. `dry_run` asks the server to check without storing.
pub async fn apply(cluster: &Cluster, objects: &[Value], dry_run: bool) -> Result<Vec<Applied>> {
    let existing = check_ours(cluster, objects).await?;
    let mut done = Vec::new();
    for (object, existed) in objects.iter().zip(existing) {
        let (api, action) = api_for(cluster, object)?;
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let mut params = PatchParams::apply("kubectl-vm").force();
        if dry_run {
            params = params.dry_run();
        }
        api.patch(name, &params, &Patch::Apply(object))
            .await
            .map_err(|e| cluster.error(e, &action))?;
        done.push(Applied {
            object: describe(object),
            created: !existed,
        });
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> InstallOptions {
        InstallOptions {
            namespace: "kubevm-system".into(),
            image: "registry.example/kubectl-vm:0.1.0".into(),
            replicas: 2,
            max_ttl_seconds: 3600,
        }
    }

    #[test]
    fn the_signer_reads_only_the_ca_secret_and_runs_locked_down() {
        let tls = ServingCert::generate("kubevm-system").unwrap();
        let objects = manifests(&options(), &tls);
        let find = |kind: &str, name: &str| {
            objects
                .iter()
                .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("{kind}/{name}"))
        };
        let role = find("Role", NAME);
        assert_eq!(role["rules"][0]["resourceNames"], json!(["kubevm-ssh-ca"]));
        assert_eq!(role["rules"][0]["verbs"], json!(["get"]));
        let deploy = find("Deployment", NAME);
        assert_eq!(deploy["spec"]["replicas"], 2);
        let container = &deploy["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(container["securityContext"]["runAsNonRoot"], true);
        assert_eq!(find("PodDisruptionBudget", NAME)["spec"]["minAvailable"], 1);
        let apiservice = find("APIService", APISERVICE_NAME);
        let bundle = base64::engine::general_purpose::STANDARD
            .decode(apiservice["spec"]["caBundle"].as_str().unwrap())
            .unwrap();
        assert_eq!(String::from_utf8(bundle).unwrap(), tls.ca_pem);
        assert_eq!(
            find("ClusterRole", USER_ROLE)["rules"][0]["resources"],
            json!(["virtualmachines/sshcertificate"])
        );
        // Every object is labelled as ours, so re-runs may update it and nothing else.
        assert!(
            objects
                .iter()
                .all(|o| o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kubectl-vm")
        );
    }

    #[test]
    fn openssl_accepts_the_serving_certificate_for_the_service_name() {
        let tls = ServingCert::generate("team-a").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), &tls.ca_pem).unwrap();
        std::fs::write(dir.path().join("cert.pem"), &tls.cert_pem).unwrap();
        let out = std::process::Command::new("openssl")
            .args([
                "verify",
                "-CAfile",
                "ca.pem",
                "-verify_hostname",
                "kubevm-ssh-signer.team-a.svc",
                "cert.pem",
            ])
            .current_dir(dir.path())
            .output()
            .expect("openssl is installed");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let wrong = std::process::Command::new("openssl")
            .args([
                "verify",
                "-CAfile",
                "ca.pem",
                "-verify_hostname",
                "kubevm-ssh-signer.other.svc",
                "cert.pem",
            ])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!wrong.status.success());
    }
}
