//! Volume export: KubeVirt's VirtualMachineExport and Deckhouse storage-foundation's DataExport.
//!
//! Reconcilers turn an export into `Ready` with links to the emulator's export server
//! (`export_server.rs`, HTTPS with its own CA), which serves each exported volume's bytes. Disk
//! content is generated from a key (see [`fill`]), so a test can compute a volume's checksum
//! from the same generator without storing gigabytes.
//!
//! Upstream behaviour followed (FACTS kubevirt §5, deckhouse §13):
//! - KubeVirt `pkg/storage/export/export/{export,links}.go`: service `virt-export-<name>`,
//!   internal links `https://virt-export-<name>.<ns>.svc/volumes/<vol>/disk.img[.gz]`, external
//!   links `https://<host>/api/export.kubevirt.io/v1/namespaces/<ns>/virtualmachineexports/<name>/volumes/<vol>/disk.img`;
//!   volume names are the PVC names; a running VM or a PVC used by a running pod keeps the
//!   export Pending; `ttlDuration` (default 2h) deletes the export when it expires.
//! - Deckhouse `dataexports.yaml`: `status.url` is the exporter pod (`https://IP:8085`),
//!   `status.publicURL` `https://api.<domain>/<ns>/<pvc|vd|snap>/<name>/` when `publish`, `ca`
//!   base64 PEM; `spec.ttl` is an idle TTL after the last request (phase Expired,
//!   serverState IdleExpired, condition Ready=False reason Expired).

use crate::core::app::App;
use crate::core::store::{Key, Propagation};
use crate::core::util::{format_rfc3339, meta_str, now_rfc3339, now_unix, parse_rfc3339};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// KubeVirt's export group.
pub const KV_EXPORT_GROUP: &str = "export.kubevirt.io";
/// Deckhouse storage-foundation's group.
pub const SF_GROUP: &str = "storage-foundation.deckhouse.io";

/// Fault switches of the export server, set by tests.
#[derive(Debug, Default, Clone)]
pub struct ExportFaults {
    /// Absolute byte offsets at which a response is cut (each used once, smallest first).
    pub cut_at: Vec<u64>,
    /// Answer this many requests with 503 before serving again.
    pub fail_5xx: u32,
    /// Serve at most this many bytes per second per response.
    pub bytes_per_sec: Option<u64>,
    /// Serve no external link (KubeVirt) / no publicURL (Deckhouse).
    pub no_external: bool,
    /// Publish a CA in the internal link that did not sign the exporter pod's certificate.
    pub wrong_internal_ca: bool,
    /// Name every volume of a KubeVirt export's links this instead of its PVC, as a hostile or
    /// broken server could (`../x`, `/x`, `a/b`); the URLs stay those of the PVCs.
    pub volume_name: Option<String>,
    /// Publish Deckhouse public URLs on this host instead of the export server's address
    /// (`localhost` reaches the same server under another name than the API server's).
    pub public_host: Option<String>,
    /// Answer every download request with this status and no body (a broken server or proxy:
    /// `204`, `416`).
    pub answer_status: Option<u16>,
}

/// State of the export server shared with the reconcilers.
#[derive(Default)]
pub struct ExportState {
    /// `https://127.0.0.1:PORT` of the export server, once listening.
    pub base_url: Mutex<String>,
    /// PEM of the export server's own CA.
    pub ca_pem: Mutex<String>,
    /// Fault switches.
    pub faults: Mutex<ExportFaults>,
    /// Content generation per `ns/pvc` (bumped to "change the content between runs").
    pub generations: Mutex<HashMap<String, u64>>,
    /// Body bytes sent by the export server, all responses together.
    pub bytes_served: Arc<AtomicU64>,
    /// Requests to the export server that carried an `Authorization` header.
    pub authorization_seen: AtomicU64,
    /// The `Host` header (host part) of each request that carried an `Authorization` header:
    /// which names the credentials were sent to.
    pub authorized_hosts: Mutex<Vec<String>>,
    /// Requests to the export server, all together.
    pub requests_seen: AtomicU64,
    /// Last request per export uid (Deckhouse idle TTL).
    pub last_access: Mutex<HashMap<String, Instant>>,
    /// The export CA that signs the exporter pods' certificates (`export_pods.rs`).
    pub internal_ca: crate::kubevirt::export_pods::InternalCa,
}

impl ExportState {
    /// What a reconcile pass reads of the export server: its URL, its CA and the fault switches.
    pub fn server(&self) -> (String, String, ExportFaults) {
        let read = |m: &Mutex<String>| m.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let faults = self
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        (read(&self.base_url), read(&self.ca_pem), faults)
    }

    /// The content key of volume `ns/pvc` at its current generation.
    pub fn key(&self, ns: &str, pvc: &str) -> u64 {
        let id = format!("{ns}/{pvc}");
        let generation = *self
            .generations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .unwrap_or(&0);
        content_key(&id, generation)
    }
}

/// The key of a volume's generated content: FNV-1a of `ns/pvc` mixed with its generation.
pub fn content_key(id: &str, generation: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ generation.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Fills `buf` with the volume content of `key` starting at byte `offset`: byte `p` is byte
/// `p % 8` (little-endian) of `splitmix64(key ^ (p / 8))`. Whole words are written directly
/// (the export benchmark shares two cores with this generator, so it must stay cheap).
pub fn fill(key: u64, offset: u64, buf: &mut [u8]) {
    let head = (offset.wrapping_neg() % 8) as usize;
    let (partial, words) = buf.split_at_mut(head.min(buf.len()));
    fill_bytes(key, offset, partial);
    let mut word = offset.div_ceil(8);
    let mut chunks = words.chunks_exact_mut(8);
    for chunk in &mut chunks {
        chunk.copy_from_slice(&splitmix64(key ^ word).to_le_bytes());
        word += 1;
    }
    fill_bytes(key, word * 8, chunks.into_remainder());
}

/// Writes the first `size` bytes of the volume content of `key` to `out`, 1 MiB at a time
/// (tests pipe it into `sha256sum` for an independent checksum of what the server sends).
pub fn write_content(key: u64, size: u64, out: &mut impl std::io::Write) -> std::io::Result<()> {
    const STEP: u64 = 1 << 20;
    let mut buf = vec![0u8; STEP as usize];
    let mut pos = 0;
    while pos < size {
        let n = (size - pos).min(STEP) as usize;
        fill(key, pos, &mut buf[..n]);
        out.write_all(&buf[..n])?;
        pos += n as u64;
    }
    Ok(())
}

/// `fill` a byte at a time: the definition, used for the unaligned ends.
fn fill_bytes(key: u64, offset: u64, buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate() {
        let pos = offset + i as u64;
        *b = splitmix64(key ^ (pos / 8)).to_le_bytes()[(pos % 8) as usize];
    }
}

/// Parses a Kubernetes quantity of bytes (`1Gi`, `512Mi`, `10G`, `1048576`).
pub fn parse_bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let units: &[(&str, u64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (suffix, mult) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().ok().map(|n| n * mult);
        }
    }
    q.parse().ok()
}

/// The size of a PVC: `status.capacity.storage`, else its request.
pub fn pvc_size(app: &App, ns: &str, pvc: &str) -> Option<u64> {
    let obj = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, pvc))?;
    let q = obj
        .pointer("/status/capacity/storage")
        .or_else(|| obj.pointer("/spec/resources/requests/storage"))
        .and_then(Value::as_str)?;
    parse_bytes(q)
}

fn ready_condition(status: &mut Value, ready: bool, reason: &str, message: &str) {
    let state = if ready { "True" } else { "False" };
    let since = match status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
    {
        Some(c) if c["status"] == state => c["lastTransitionTime"].clone(),
        _ => json!(now_rfc3339()),
    };
    status["conditions"] = json!([{"type": "Ready", "status": state, "reason": reason,
        "message": message, "lastTransitionTime": since}]);
}

/// Whether a running pod mounts PVC `ns/pvc` (KubeVirt and Deckhouse both refuse to export it).
fn pvc_in_use(app: &App, ns: &str, pvc: &str) -> Option<String> {
    let (pods, _) = app.store.list("", "pods", Some(ns));
    pods.iter()
        .find(|p| {
            p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
                && p.pointer("/spec/volumes")
                    .and_then(Value::as_array)
                    .is_some_and(|vols| {
                        vols.iter().any(|v| {
                            v.pointer("/persistentVolumeClaim/claimName")
                                .and_then(Value::as_str)
                                == Some(pvc)
                        })
                    })
        })
        .map(|p| meta_str(p, "name").to_string())
}

/// The PVCs of a KubeVirt VM's template volumes (DataVolumes own a PVC of their name).
fn vm_pvcs(vm: &Value) -> Vec<String> {
    vm.pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .map(|vols| {
            vols.iter()
                .filter_map(|v| {
                    v.pointer("/persistentVolumeClaim/claimName")
                        .or_else(|| v.pointer("/dataVolume/name"))
                        .and_then(Value::as_str)
                        .map(String::from)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Reconciles a VirtualMachineExport.
pub fn kubevirt_export(app: &App, vme: &Value, _tick: bool) {
    let ns = meta_str(vme, "namespace").to_string();
    let name = meta_str(vme, "name").to_string();
    let key = Key::of(KV_EXPORT_GROUP, "virtualmachineexports", vme);
    // ttlDuration: KubeVirt deletes the export when it expires.
    if let Some(expiry) = vme
        .pointer("/status/ttlExpirationTime")
        .and_then(Value::as_str)
        .and_then(parse_rfc3339)
        && now_unix() >= expiry
    {
        app.store.delete(&key, Propagation::Cascade);
        return;
    }
    let kind = vme
        .pointer("/spec/source/kind")
        .and_then(Value::as_str)
        .unwrap_or("");
    let source = vme
        .pointer("/spec/source/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let (pvcs, blocked): (Vec<String>, Option<(&str, String)>) = match kind {
        "VirtualMachine" => {
            match app
                .store
                .get(&Key::new("kubevirt.io", "virtualmachines", &ns, source))
            {
                None => (
                    vec![],
                    Some((
                        "VMNotFound",
                        format!("VirtualMachine {source} does not exist"),
                    )),
                ),
                Some(vm) => {
                    let running = app
                        .store
                        .get(&Key::new(
                            "kubevirt.io",
                            "virtualmachineinstances",
                            &ns,
                            source,
                        ))
                        .is_some();
                    let pvcs = vm_pvcs(&vm);
                    if running {
                        (
                            pvcs,
                            Some(("VMRunning", format!("VirtualMachine {source} is running"))),
                        )
                    } else {
                        (pvcs, None)
                    }
                }
            }
        }
        "PersistentVolumeClaim" => {
            let blocked = if pvc_size(app, &ns, source).is_none() {
                Some(("PVCNotFound", format!("pvc {ns}/{source} not found")))
            } else {
                pvc_in_use(app, &ns, source)
                    .map(|pod| ("InUse", format!("pvc {ns}/{source} is in use by pod {pod}")))
            };
            (vec![source.to_string()], blocked)
        }
        "VirtualMachineSnapshot" => {
            match crate::kubevirt::export_snapshot::restore_pvcs(app, vme, source) {
                Ok(pvcs) => (pvcs, None),
                Err((reason, message)) => (vec![], Some((reason, message))),
            }
        }
        other => (
            vec![],
            Some((
                "SourceNotSupported",
                format!("the emulator does not export {other} sources"),
            )),
        ),
    };
    // A source without volumes ends the export `Skipped` (final): a VM gets a false Ready
    // condition `VMNoVolumes` with the source's availability message, which is empty unless
    // it is running (vm-source.go `updateVMExportVMStatus`); a snapshot gets a false
    // `VolumesCreated` condition `VMSnapshotNoVolumes` while Ready stays `Initializing`
    // (vmsnapshot-source.go).
    let skipped: Option<(&str, &str, String)> = match (kind, &blocked) {
        ("VirtualMachine", Some((reason, _))) if *reason == "VMNotFound" => None,
        ("VirtualMachine", _) if pvcs.is_empty() => Some((
            "Ready",
            "VMNoVolumes",
            blocked.as_ref().map(|(_, m)| m.clone()).unwrap_or_default(),
        )),
        ("VirtualMachineSnapshot", Some((reason, message))) if *reason == "VMSnapshotNoVolumes" => {
            Some(("VolumesCreated", "VMSnapshotNoVolumes", message.clone()))
        }
        _ => None,
    };
    // A snapshot's volumes are restore PVCs `<export>-<volume>` (vmsnapshot-source.go).
    let restore_prefix = if kind == "VirtualMachineSnapshot" {
        format!("{name}-")
    } else {
        String::new()
    };
    let missing = pvcs
        .iter()
        .find(|p| pvc_size(app, &ns, &format!("{restore_prefix}{p}")).is_none());
    let blocked =
        blocked.or_else(|| missing.map(|p| ("PVCNotFound", format!("pvc {ns}/{p} not found"))));
    let token_ref = vme
        .pointer("/spec/tokenSecretRef")
        .and_then(Value::as_str)
        .map(String::from);
    let (base, ca, faults) = app.exports.server();
    let no_external = faults.no_external;
    // The internal link's cert is the export CA that signed the exporter pod's certificate.
    let internal_ca = if faults.wrong_internal_ca {
        ca.clone()
    } else {
        app.exports.internal_ca.pem()
    };
    let snapshot_vm = (kind == "VirtualMachineSnapshot")
        .then(|| crate::kubevirt::export_snapshot::snapshot_vm_name(app, &ns, source))
        .flatten();
    if blocked.is_none() && skipped.is_none() {
        crate::kubevirt::export_pods::ensure_kubevirt(app, vme);
    }
    let ttl = vme
        .pointer("/spec/ttlDuration")
        .and_then(Value::as_str)
        .and_then(parse_go_duration)
        .unwrap_or(Duration::from_secs(7200));
    let created = parse_rfc3339(meta_str(vme, "creationTimestamp")).unwrap_or_else(now_unix);
    app.store.modify(&key, |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        st["ttlExpirationTime"] = json!(format_rfc3339(created + ttl.as_secs() as i64));
        st["serviceName"] = json!(crate::kubevirt::export_pods::kubevirt_object_name(&name));
        if let Some(t) = &token_ref {
            st["tokenSecretRef"] = json!(t);
        }
        if kind == "VirtualMachine" {
            st["virtualMachineName"] = json!(source);
        }
        if let Some(vm) = &snapshot_vm {
            st["virtualMachineName"] = json!(vm);
        }
        if let Some((condition, reason, message)) = &skipped {
            st["phase"] = json!("Skipped");
            st.as_object_mut().map(|m| m.remove("links"));
            if *condition == "Ready" {
                ready_condition(&mut st, false, reason, message);
            } else {
                let since = st["conditions"]
                    .as_array()
                    .and_then(|c| c.iter().find(|c| c["type"] == *condition))
                    .map(|c| c["lastTransitionTime"].clone())
                    .unwrap_or_else(|| json!(now_rfc3339()));
                ready_condition(&mut st, false, "Initializing", "");
                if let Some(conds) = st["conditions"].as_array_mut() {
                    conds.push(json!({"type": condition, "status": "False", "reason": reason,
                        "message": message, "lastTransitionTime": since}));
                }
            }
            o["status"] = st;
            return;
        }
        match &blocked {
            Some((reason, message)) => {
                st["phase"] = json!("Pending");
                st.as_object_mut().map(|m| m.remove("links"));
                ready_condition(&mut st, false, reason, message);
            }
            None => {
                let vols = |prefix: &str| -> Value {
                    pvcs.iter()
                        .map(|p| {
                            let shown = faults.volume_name.as_deref().unwrap_or(p.as_str());
                            // A filesystem claim is served as its directory and a tar.gz
                            // (upstream `addVolumeEnvironmentVariables`: a claim not of
                            // KubeVirt content type). Upstream decides by the CDI content-type
                            // annotation; the emulator's CDI sets none, so here a claim holding
                            // files (a memory dump, `crate::kubevirt::memory_core`) is the filesystem one.
                            if app.claim_files.get(&ns, p).is_some() {
                                return json!({"name": shown, "formats": [
                                    {"format": "dir", "url": format!("{prefix}/volumes/{p}/dir/")},
                                    {"format": "tar.gz", "url": format!("{prefix}/volumes/{p}/disk.tar.gz")},
                                ]});
                            }
                            json!({"name": shown, "formats": [
                                {"format": "raw", "url": format!("{prefix}/volumes/{p}/disk.img")},
                                {"format": "gzip", "url": format!("{prefix}/volumes/{p}/disk.img.gz")},
                            ]})
                        })
                        .collect()
                };
                let internal = format!(
                    "https://{}.{ns}.svc",
                    crate::kubevirt::export_pods::kubevirt_object_name(&name)
                );
                let mut links = json!({"internal": {"cert": internal_ca, "volumes": vols(&internal),
                    "manifests": [{"type": "all", "url": format!("{internal}/internal/manifests/all")}]}});
                if !no_external {
                    let external = format!(
                        "{base}/api/export.kubevirt.io/v1/namespaces/{ns}/virtualmachineexports/{name}"
                    );
                    links["external"] = json!({"cert": ca, "volumes": vols(&external),
                        "manifests": [{"type": "all", "url": format!("{external}/external/manifests/all")}]});
                }
                if kind != "VirtualMachine" {
                    for side in ["internal", "external"] {
                        if let Some(l) = links.get_mut(side).and_then(Value::as_object_mut) {
                            l.remove("manifests");
                        }
                    }
                }
                st["links"] = links;
                st["phase"] = json!("Ready");
                ready_condition(&mut st, true, "PodReady", "");
            }
        }
        o["status"] = st;
    });
}

/// Parses Go/Deckhouse durations such as `2h`, `1h30m`, `90s`, `1.5h`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut num = String::new();
    let mut any = false;
    for c in s.chars() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let n: f64 = num.parse().ok()?;
        num.clear();
        total += n * match c {
            'h' => 3600.0,
            'm' => 60.0,
            's' => 1.0,
            'd' => 86400.0,
            _ => return None,
        };
        any = true;
    }
    (any && num.is_empty()).then(|| Duration::from_secs_f64(total))
}

/// What a DataExport's target resolves to: `(short kind for the public URL, PVC name)`.
pub fn data_export_target(app: &App, de: &Value) -> Result<(&'static str, String), String> {
    let ns = meta_str(de, "namespace");
    let kind = de
        .pointer("/spec/targetRef/kind")
        .and_then(Value::as_str)
        .unwrap_or("");
    let name = de
        .pointer("/spec/targetRef/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    match kind {
        "PersistentVolumeClaim" => Ok(("pvc", name.to_string())),
        "VirtualDisk" => {
            let vd = app
                .store
                .get(&Key::new(
                    "virtualization.deckhouse.io",
                    "virtualdisks",
                    ns,
                    name,
                ))
                .ok_or_else(|| format!("VirtualDisk {name} not found"))?;
            vd.pointer("/status/target/persistentVolumeClaimName")
                .and_then(Value::as_str)
                .map(|p| ("vd", p.to_string()))
                .ok_or_else(|| format!("VirtualDisk {name} has no PVC yet"))
        }
        "VirtualDiskSnapshot" => {
            crate::kubevirt::export_snapshot::vds_pvc(app, ns, name).map(|p| ("vds", p))
        }
        other => Err(format!("the emulator does not export {other} targets")),
    }
}

/// Reconciles a DataExport.
pub fn data_export(app: &App, de: &Value, tick: bool) {
    let ns = meta_str(de, "namespace").to_string();
    let uid = meta_str(de, "uid").to_string();
    let key = Key::of(SF_GROUP, "dataexports", de);
    let phase = de
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    if phase == "Expired" {
        return;
    }
    let generation = de["metadata"]["generation"].clone();
    let set = |st: &mut Value, ready: bool, reason: &str, message: &str| {
        ready_condition(st, ready, reason, message);
        st["conditions"][0]["observedGeneration"] = generation.clone();
    };
    if phase == "Ready" && tick {
        // Idle TTL: measured from the last request (or from becoming ready).
        let ttl = de
            .pointer("/spec/ttl")
            .and_then(Value::as_str)
            .and_then(parse_go_duration)
            .unwrap_or(Duration::from_secs(3600));
        let last = {
            let mut map = app
                .exports
                .last_access
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            *map.entry(uid.clone()).or_insert_with(Instant::now)
        };
        if last.elapsed() >= ttl {
            app.store.modify(&key, |o| {
                let st = &mut o["status"];
                st["phase"] = json!("Expired");
                st["serverState"] = json!("IdleExpired");
                st["completionTimestamp"] = json!(now_rfc3339());
                set(st, false, "Expired", "the idle TTL elapsed");
            });
        }
        return;
    }
    let target = data_export_target(app, de).and_then(|(short, pvc)| {
        if pvc_size(app, &ns, &pvc).is_none() {
            return Err(format!("PersistentVolumeClaim {pvc} not found"));
        }
        // A snapshot is exported from its own volume, whoever uses the disk.
        if let Some(pod) = pvc_in_use(app, &ns, &pvc).filter(|_| short != "vds") {
            return Err(format!(
                "PersistentVolumeClaim {pvc} is used by the running pod {pod}"
            ));
        }
        Ok(short)
    });
    let (base, ca, faults) = app.exports.server();
    let no_external = faults.no_external;
    let wrong_internal_ca = faults.wrong_internal_ca;
    let base = match &faults.public_host {
        Some(host) => base.replacen("127.0.0.1", host, 1),
        None => base,
    };
    let ip = crate::kubevirt::export_pods::pod_ip(&uid);
    if target.is_ok() {
        crate::kubevirt::export_pods::ensure_deckhouse(app, de, &ip);
    }
    let publish = de.pointer("/spec/publish") == Some(&json!(true));
    let target_name = de
        .pointer("/spec/targetRef/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    app.store.modify(&key, |o| {
        let mut st = o.get("status").cloned().unwrap_or(json!({}));
        match &target {
            Err(message) => {
                st["phase"] = json!("Pending");
                set(&mut st, false, "TargetNotReady", message);
            }
            Ok(short) => {
                use base64::Engine;
                // The exporter pod's address: unreachable from outside the cluster except
                // through pods/portforward (export_pods.rs).
                st["url"] = json!(format!(
                    "https://{ip}:{}",
                    crate::kubevirt::export_pods::DE_POD_PORT
                ));
                // One bundle for both ends: the public endpoint's CA and the export CA that
                // signed the exporter pod's certificate.
                let bundle = if wrong_internal_ca {
                    ca.clone()
                } else {
                    format!("{ca}{}", app.exports.internal_ca.pem())
                };
                st["ca"] = json!(base64::engine::general_purpose::STANDARD.encode(&bundle));
                if publish && !no_external {
                    st["publicURL"] = json!(format!("{base}/{ns}/{short}/{target_name}/"));
                }
                st["volumeMode"] = json!("Block");
                st["phase"] = json!("Ready");
                st["serverState"] = json!("Ready");
                set(&mut st, true, "ServerReady", "");
            }
        }
        o["status"] = st;
    });
}

impl crate::Handle {
    /// `https://127.0.0.1:PORT` of the export server.
    pub fn export_server_url(&self) -> String {
        self.app
            .exports
            .base_url
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// PEM of the export server's own CA (published in the exports' status).
    pub fn export_ca_pem(&self) -> String {
        self.app
            .exports
            .ca_pem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the export server's fault switches.
    pub fn set_export_faults(&self, faults: ExportFaults) {
        *self
            .app
            .exports
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = faults;
    }

    /// Requests to the export server so far.
    pub fn export_requests(&self) -> u64 {
        self.app
            .exports
            .requests_seen
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Requests to the export server so far that carried an `Authorization` header.
    pub fn export_requests_with_authorization(&self) -> u64 {
        self.app
            .exports
            .authorization_seen
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The hosts (from `Host`, without port) that requests carrying credentials named.
    pub fn export_authorized_hosts(&self) -> Vec<String> {
        self.app
            .exports
            .authorized_hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Body bytes the export server has sent so far.
    pub fn export_bytes_served(&self) -> u64 {
        self.app
            .exports
            .bytes_served
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The content key of PVC `ns/pvc` (see [`fill`]): the bytes a test expects.
    pub fn export_content_key(&self, ns: &str, pvc: &str) -> u64 {
        self.app.exports.key(ns, pvc)
    }

    /// Changes the content of PVC `ns/pvc` (a new generation: new bytes, new ETag).
    pub fn change_export_content(&self, ns: &str, pvc: &str) {
        *self
            .app
            .exports
            .generations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(format!("{ns}/{pvc}"))
            .or_insert(0) += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_is_position_independent() {
        let mut whole = vec![0u8; 100];
        fill(42, 0, &mut whole);
        let mut part = vec![0u8; 37];
        fill(42, 13, &mut part);
        assert_eq!(&whole[13..50], &part[..]);
        assert_ne!(whole[..8], [0u8; 8]);
    }

    #[test]
    fn fill_matches_its_definition_at_every_alignment() {
        for offset in 0..20u64 {
            for len in [0usize, 1, 3, 7, 8, 9, 16, 23, 64] {
                let mut fast = vec![0u8; len];
                fill(7, offset, &mut fast);
                let mut slow = vec![0u8; len];
                fill_bytes(7, offset, &mut slow);
                assert_eq!(fast, slow, "offset {offset}, len {len}");
            }
        }
    }

    #[test]
    fn durations_and_quantities() {
        assert_eq!(parse_go_duration("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_go_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("2x"), None);
        assert_eq!(parse_bytes("1Gi"), Some(1 << 30));
        assert_eq!(parse_bytes("1048576"), Some(1 << 20));
    }
}
