//! The export servers' pods: what a client reaches through `pods/portforward` when an export
//! has no external link (KubeVirt) or no public URL (Deckhouse).
//!
//! Upstream KubeVirt (`pkg/storage/export/export/export.go`, FACTS kubevirt §5):
//! - exporter pod `virt-export-<export>` (`naming.GetName(exportPrefix, name, 63)`), label
//!   `kubevirt.io.virt-export-service: <export>`, owned by the export (controller reference),
//!   serving HTTPS on 8443;
//! - Service `virt-export-<export>`, label `kubevirt.io: virt-exporter`, selector
//!   `kubevirt.io.virt-export-service: <export>`, port 443 → 8443, owned by the export;
//! - the pod's serving certificate is made by `triple.NewServerKeyPair` from the export CA
//!   (`kubevirt-export-ca`, the internal link's `cert`) for `<svc>.<ns>.svc` and the other
//!   service names; virtctl's `--port-forward` finds the pod through the service's selector.
//!
//! Deckhouse storage-foundation (FACTS deckhouse §13): `status.url` is the exporter pod's
//! `https://IP:8085`. The pod's name is not documented; the emulator calls it
//! `<dataexport>-exporter`, labels it `storage-foundation.deckhouse.io/dataexport: <name>` and
//! gives it the IP of `status.url` (a client finds it by `status.podIP`, not by name).

use crate::core::app::App;
use crate::core::controllers::{NODE, owner_ref};
use crate::core::store::Key;
use crate::core::util::meta_str;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Port of KubeVirt's export server in its pod.
pub const KV_POD_PORT: u16 = 8443;
/// Port of Deckhouse's exporter in its pod.
pub const DE_POD_PORT: u16 = 8085;
/// KubeVirt's exporter pod label (`exportServiceLabel`).
pub const KV_SERVICE_LABEL: &str = "kubevirt.io.virt-export-service";
/// The emulator's label on Deckhouse exporter pods.
pub const DE_LABEL: &str = "storage-foundation.deckhouse.io/dataexport";

/// What a pod serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodTarget {
    /// KubeVirt's export server for VirtualMachineExport `ns/export`.
    KubeVirt {
        /// Namespace.
        ns: String,
        /// The export's name.
        export: String,
    },
    /// Deckhouse's exporter for DataExport `ns/export`.
    Deckhouse {
        /// Namespace.
        ns: String,
        /// The DataExport's name.
        export: String,
    },
}

struct CaMaterial {
    pem: String,
    params: CertificateParams,
    key: KeyPair,
}

/// The export CA (KubeVirt's `kubevirt-export-ca`), made on first use, and the serving
/// configurations it signed, per set of names.
#[derive(Default)]
pub struct InternalCa {
    ca: OnceLock<Result<CaMaterial, String>>,
    configs: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl InternalCa {
    fn material(&self) -> Result<&CaMaterial, String> {
        self.ca
            .get_or_init(|| {
                let err = |e: rcgen::Error| e.to_string();
                let key = KeyPair::generate().map_err(err)?;
                let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
                params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
                params
                    .distinguished_name
                    .push(DnType::CommonName, "export.kubevirt.io@emulator");
                params.key_usages = vec![
                    KeyUsagePurpose::KeyCertSign,
                    KeyUsagePurpose::CrlSign,
                    KeyUsagePurpose::DigitalSignature,
                ];
                let cert = params.self_signed(&key).map_err(err)?;
                Ok(CaMaterial {
                    pem: cert.pem(),
                    params,
                    key,
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// PEM of the export CA.
    pub fn pem(&self) -> String {
        self.material().map(|m| m.pem.clone()).unwrap_or_default()
    }

    /// A TLS server configuration with a certificate for `names` (DNS names or IPs) signed by
    /// the export CA; HTTP/1.1 like the export server.
    pub fn server_config(&self, names: &[String]) -> Result<Arc<rustls::ServerConfig>, String> {
        let id = names.join(",");
        let mut configs = self.configs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = configs.get(&id) {
            return Ok(c.clone());
        }
        let ca = self.material()?;
        let err = |e: rcgen::Error| e.to_string();
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        for n in names {
            params.subject_alt_names.push(match n.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(n.clone().try_into().map_err(err)?),
            });
        }
        let key = KeyPair::generate().map_err(err)?;
        let issuer = Issuer::from_params(&ca.params, &ca.key);
        let cert = params.signed_by(&key, &issuer).map_err(err)?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|e| e.to_string())?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        configs.insert(id, config.clone());
        Ok(config)
    }
}

/// `naming.GetName(prefix, name, 63)`: `prefix-name`, or when too long a truncated name
/// ending in a hash (the emulator's hash is FNV, not upstream's).
pub fn kubevirt_object_name(export: &str) -> String {
    let full = format!("virt-export-{export}");
    if full.len() <= 63 {
        return full;
    }
    let hash = crate::kubevirt::export::content_key(&full, 0) as u32;
    format!("{}-{hash:08x}", &full[..54])
}

/// The names on a KubeVirt exporter pod's certificate (`NewServerKeyPair`: the service, its
/// namespace-qualified forms and the cluster-local one).
pub fn kubevirt_cert_names(ns: &str, export: &str) -> Vec<String> {
    let svc = kubevirt_object_name(export);
    vec![
        format!("{svc}.{ns}.svc"),
        svc.clone(),
        format!("{svc}.{ns}"),
        format!("{svc}.{ns}.svc.cluster.local"),
    ]
}

/// A pod IP for an exporter, stable per object uid (10.244.0.0/16).
pub fn pod_ip(uid: &str) -> String {
    let h = crate::kubevirt::export::content_key(uid, 0);
    format!("10.244.{}.{}", 1 + (h % 250), 2 + ((h >> 8) % 250))
}

/// Creates `obj` (a Pod or Service owned by `owner`, stored under `owner_key`) unless it exists
/// or its owner is gone.
fn ensure(app: &App, owner_key: &Key, owner: &Value, obj: Value) {
    let plural = if obj["kind"] == "Pod" {
        "pods"
    } else {
        "services"
    };
    if app.store.get(&Key::of("", plural, &obj)).is_none() {
        crate::core::gc::create_dependent(app, owner_key, owner, "", plural, obj);
    }
}

/// Creates the Service and exporter pod of a ready VirtualMachineExport (once).
pub fn ensure_kubevirt(app: &App, vme: &Value) {
    let ns = meta_str(vme, "namespace");
    let export = meta_str(vme, "name");
    let name = kubevirt_object_name(export);
    let owner = owner_ref(vme);
    let owner_key = Key::of(
        crate::kubevirt::export::KV_EXPORT_GROUP,
        "virtualmachineexports",
        vme,
    );
    ensure(
        app,
        &owner_key,
        vme,
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "labels": {"kubevirt.io": "virt-exporter"},
                "ownerReferences": [owner]},
            "spec": {"type": "ClusterIP", "selector": {KV_SERVICE_LABEL: export},
                "ports": [{"protocol": "TCP", "port": 443, "targetPort": KV_POD_PORT}]}}),
    );
    ensure(
        app,
        &owner_key,
        vme,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {KV_SERVICE_LABEL: export},
                "ownerReferences": [owner]},
            "spec": {"nodeName": NODE, "containers": [{"name": "exporter",
                "image": "quay.io/kubevirt/virt-exportserver:v1.9.0",
                "ports": [{"name": "exporter", "containerPort": KV_POD_PORT, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": pod_ip(meta_str(vme, "uid")), "hostIP": "192.168.0.11",
                "containerStatuses": [{"name": "exporter", "ready": true, "restartCount": 0}]}}),
    );
}

/// Creates the exporter pod of a ready DataExport (once), with IP `ip`.
pub fn ensure_deckhouse(app: &App, de: &Value, ip: &str) {
    let ns = meta_str(de, "namespace");
    let name = meta_str(de, "name");
    let owner_key = Key::of(crate::kubevirt::export::SF_GROUP, "dataexports", de);
    ensure(
        app,
        &owner_key,
        de,
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{name}-exporter"), "namespace": ns,
                "labels": {DE_LABEL: name}, "ownerReferences": [owner_ref(de)]},
            "spec": {"nodeName": NODE, "containers": [{"name": "exporter",
                "ports": [{"containerPort": DE_POD_PORT, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": ip, "hostIP": "192.168.0.11",
                "containerStatuses": [{"name": "exporter", "ready": true, "restartCount": 0}]}}),
    );
}

/// What `pod` serves on `port`, if it is an exporter listening there.
pub fn target_of(pod: &Value, port: u16) -> Option<PodTarget> {
    let ns = meta_str(pod, "namespace").to_string();
    let labels = pod.pointer("/metadata/labels");
    let label = |k: &str| {
        labels
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
            .map(String::from)
    };
    if let Some(export) = label(KV_SERVICE_LABEL)
        && port == KV_POD_PORT
    {
        return Some(PodTarget::KubeVirt { ns, export });
    }
    if let Some(export) = label(DE_LABEL)
        && port == DE_POD_PORT
    {
        return Some(PodTarget::Deckhouse { ns, export });
    }
    None
}

/// The names on the certificate a target serves with.
pub fn cert_names(app: &App, target: &PodTarget) -> Vec<String> {
    match target {
        PodTarget::KubeVirt { ns, export } => kubevirt_cert_names(ns, export),
        PodTarget::Deckhouse { ns, export } => {
            let de = app.store.get(&Key::new(
                crate::kubevirt::export::SF_GROUP,
                "dataexports",
                ns,
                export,
            ));
            let ip = de
                .as_ref()
                .map(|d| pod_ip(meta_str(d, "uid")))
                .unwrap_or_default();
            vec![ip]
        }
    }
}

#[cfg(test)]
mod gc_tests {
    use super::*;
    use crate::ServeFlavor;
    use crate::core::registry::Registry;
    use crate::core::store::Propagation;
    use std::time::Duration;

    /// The race a CI run hit: the reconciler read an export, the client deleted it (its
    /// dependents went with it), then the reconciler created the exporter pod. The pod must not
    /// outlive its owner.
    #[test]
    fn an_exporter_made_after_its_export_went_is_collected() {
        let app = App::new(Registry::new(ServeFlavor::KubeVirt), Duration::from_secs(1));
        let vme = app
            .store
            .create(
                crate::kubevirt::export::KV_EXPORT_GROUP,
                "virtualmachineexports",
                json!({"apiVersion": "export.kubevirt.io/v1beta1", "kind": "VirtualMachineExport",
                    "metadata": {"name": "ex", "namespace": "default"},
                    "spec": {"source": {"apiGroup": "", "kind": "PersistentVolumeClaim", "name": "disk"}}}),
            )
            .unwrap();
        let key = Key::of(
            crate::kubevirt::export::KV_EXPORT_GROUP,
            "virtualmachineexports",
            &vme,
        );
        ensure_kubevirt(&app, &vme);
        let pod = Key::new("", "pods", "default", "virt-export-ex");
        assert!(
            app.store.get(&pod).is_some(),
            "made while the export exists"
        );
        app.store.delete(&key, Propagation::Cascade);
        assert!(app.store.get(&pod).is_none(), "deleted with its owner");
        // The stale read acts now.
        ensure_kubevirt(&app, &vme);
        assert!(app.store.get(&pod).is_none());
        let service = Key::new("", "services", "default", "virt-export-ex");
        assert!(app.store.get(&service).is_none());
    }
}
