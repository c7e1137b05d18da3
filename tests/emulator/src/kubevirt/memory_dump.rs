//! KubeVirt's memory dump request: the `memorydump` / `removememorydump` subresources of
//! VirtualMachines and the phases `status.memoryDumpRequest` goes through.
//!
//! - `PUT …/virtualmachines/NAME/memorydump` with a `VirtualMachineMemoryDumpRequest{claimName}`
//!   (`pkg/virt-api/rest/memorydump.go` `MemoryDumpVMRequestHandler`): 400 `Enable
//!   DeclarativeHotplugVolumes or HotplugVolumes feature gate to use this API.` without the
//!   gate (`volumes.go`); 400 `Memory dump requires claim name to be set` with no claim and no
//!   earlier request; 409 when another claim is still associated; the VMI must run (409 `VMI
//!   is not running`); the claim must exist (404), not be a block volume, not be read-only and
//!   hold `CalcExpectedMemoryDumpSize` (the VMI's memory request + 100 MiB,
//!   `pkg/util/util.go`) plus the filesystem overhead (CDIConfig
//!   `status.filesystemOverhead.global`, else 5.5%, aligned up to 1 MiB,
//!   `pkg/storage/types/cdi.go`), else 409 `pvc size [X] should be bigger then [Y]`. Then the
//!   VM's `status.memoryDumpRequest` is `{claimName, phase: Associating}`; 202.
//! - `PUT …/removememorydump`: `{claimName, phase: Dissociating, remove: true}`; 409 `can't
//!   remove memory dump association for vm NAME, no association found` without one.
//! - The VM controller (`pkg/storage/memorydump/memorydump.go` `UpdateRequest`), one phase per
//!   tick: Associating → InProgress (`startTimestamp`) → Unmounting (`endTimestamp`,
//!   `fileName` as virt-handler names it, `<vmi>-<claim>-YYYYMMDD-HHMMSS.memory.dump`,
//!   `pkg/virt-handler/vm.go`) → Completed; Dissociating → the request is removed.
//!
//! - The dump file: virt-launcher writes it into the claim, removing earlier ones
//!   (`pkg/virt-launcher/virtwrap/storage/memoryDump.go`); here an ELF core of the guest
//!   ([`crate::kubevirt::memory_core::Core`]) kept in [`ClaimFiles`], which the export server serves as a
//!   filesystem claim's `dir` and `tar.gz`.
//!
//! Not emulated: the memory dump volume added to the VM and VMI specs while the claim is
//! mounted.

use crate::core::app::App;
use crate::core::handlers::{Query, ResourcePath};
use crate::core::status::ApiError;
use crate::core::store::Key;
use crate::core::util::{meta_str, now_rfc3339};
use crate::kubevirt::memory_core::Core;
use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

const KV: &str = "kubevirt.io";
const MIB: f64 = 1024.0 * 1024.0;

/// A file a memory dump wrote into a claim.
#[derive(Debug, Clone)]
pub struct DumpFile {
    /// Its name in the claim (`status.memoryDumpRequest.fileName`).
    pub name: String,
    /// Its bytes.
    pub core: Arc<Core>,
    /// When it was written (Unix seconds).
    pub modified: u64,
}

/// The memory dump files in claims, by namespace and claim (one per claim: a new dump
/// replaces the old, `removePreviousMemoryDump`).
#[derive(Debug, Default)]
pub struct ClaimFiles(Mutex<HashMap<(String, String), DumpFile>>);

impl ClaimFiles {
    /// The dump in claim `ns/claim`.
    pub fn get(&self, ns: &str, claim: &str) -> Option<DumpFile> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(ns.to_owned(), claim.to_owned()))
            .cloned()
    }

    fn put(&self, ns: &str, claim: &str, file: DumpFile) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((ns.to_owned(), claim.to_owned()), file);
    }
}

/// The guest's RAM in its dump: `spec.domain.memory.guest`, else its memory request, else
/// [`crate::kubevirt::memory_core::DEFAULT_RAM`], capped ([`crate::kubevirt::memory_core::dumped_ram`]).
fn guest_ram(vmi: &Value) -> u64 {
    crate::kubevirt::memory_core::dumped_ram(
        vmi.pointer("/spec/domain/memory/guest")
            .or_else(|| vmi.pointer("/spec/domain/resources/requests/memory"))
            .and_then(Value::as_str)
            .and_then(crate::kubevirt::export::parse_bytes)
            .unwrap_or(crate::kubevirt::memory_core::DEFAULT_RAM),
    )
}

/// Writes the dump of `ns/name`'s guest into `claim` as `file_name`.
fn write_dump(app: &App, ns: &str, name: &str, claim: &str, file_name: &str) {
    let vmi = app
        .store
        .get(&Key::new(KV, "virtualmachineinstances", ns, name))
        .unwrap_or(Value::Null);
    let uid = meta_str(&vmi, "uid");
    // The guest of a running VMI (booted when first needed).
    let _ = app.guests.get_or_boot(app, ns, name);
    // What the guest printed since boot, without the log's timestamps.
    let transcript = app
        .guests
        .transcript(uid)
        .map(|t| {
            let (lines, _) = t.lines_from(0);
            let mut text = String::new();
            for line in lines {
                text.push_str(line.split_once(' ').map_or("", |(_, l)| l));
                text.push('\n');
            }
            text.into_bytes()
        })
        .unwrap_or_default();
    let vcpus = vmi
        .pointer("/spec/domain/cpu/cores")
        .and_then(Value::as_u64)
        .unwrap_or(1) as u32;
    let key = crate::kubevirt::export::content_key(&format!("{ns}/{name}/{uid}/memory"), 0);
    let core = Core::new(key, guest_ram(&vmi), vcpus, &transcript);
    app.claim_files.put(
        ns,
        claim,
        DumpFile {
            name: file_name.to_owned(),
            core: Arc::new(core),
            modified: crate::core::util::now_unix().max(0) as u64,
        },
    );
}

/// `PUT virtualmachines/NAME/{memorydump,removememorydump}`; `None` for anything else.
pub fn action(
    app: &App,
    rp: &ResourcePath,
    sub: &str,
    q: &Query,
    body: &Bytes,
) -> Option<Result<Response, ApiError>> {
    if rp.group != "subresources.kubevirt.io" || rp.plural != "virtualmachines" {
        return None;
    }
    let ns = rp.namespace.as_deref().unwrap_or("");
    let name = rp.name.as_deref().unwrap_or("");
    let _ = q;
    match sub {
        "memorydump" => Some(request(app, ns, name, body)),
        "removememorydump" => Some(remove(app, ns, name)),
        _ => None,
    }
}

fn conflict(resource: &str, name: &str, why: &str) -> ApiError {
    ApiError::new(
        409,
        "Conflict",
        format!("Operation cannot be fulfilled on {resource}.kubevirt.io \"{name}\": {why}"),
    )
}

fn request(app: &App, ns: &str, name: &str, body: &Bytes) -> Result<Response, ApiError> {
    if !crate::kubevirt::hotplug::hotplug_enabled(app) {
        return Err(ApiError::bad_request(
            "Enable DeclarativeHotplugVolumes or HotplugVolumes feature gate to use this API.",
        ));
    }
    let opts: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "Can not unmarshal Request body to struct, error: {e}"
            ))
        })?
    };
    let vm_key = Key::new(KV, "virtualmachines", ns, name);
    let vm = app.store.get(&vm_key).expect("checked by the caller");
    let current = vm.pointer("/status/memoryDumpRequest").cloned();
    let mut claim = opts["claimName"].as_str().unwrap_or("").to_string();
    let associated = current
        .as_ref()
        .and_then(|c| c["claimName"].as_str())
        .map(str::to_string);
    match (&associated, claim.is_empty()) {
        (None, true) => {
            return Err(ApiError::bad_request(
                "Memory dump requires claim name to be set",
            ));
        }
        (Some(old), false) if *old != claim => {
            return Err(conflict(
                "virtualmachine",
                name,
                &format!(
                    "can't request memory dump for pvc [{claim}] while pvc [{old}] is still associated as the memory dump pvc"
                ),
            ));
        }
        (Some(old), true) => claim = old.clone(),
        _ => {}
    }
    let vmi = app
        .store
        .get(&Key::new(KV, "virtualmachineinstances", ns, name))
        .ok_or_else(|| ApiError::not_found(KV, "virtualmachineinstances", name))?;
    if vmi.pointer("/status/phase").and_then(Value::as_str) != Some("Running") {
        return Err(conflict(
            "virtualmachineinstance",
            name,
            "VMI is not running",
        ));
    }
    check_claim(app, &vmi, ns, &claim)?;
    // addMemoryDumpRequest: a request that is not Completed or Dissociating is refused.
    if let Some(c) = &current {
        match c["phase"].as_str().unwrap_or("") {
            "Completed" | "Failed" => {}
            "Dissociating" => {
                return Err(conflict(
                    "virtualmachine",
                    name,
                    &format!(
                        "can't dump memory for pvc [{claim}] a remove memory dump request is in progress"
                    ),
                ));
            }
            _ => {
                return Err(conflict(
                    "virtualmachine",
                    name,
                    &format!("memory dump request for pvc [{claim}] already in progress"),
                ));
            }
        }
    }
    app.store
        .modify(&Key::new(KV, "virtualmachines", ns, name), |o| {
            o["status"]["memoryDumpRequest"] = json!({"claimName": claim, "phase": "Associating"});
        });
    Ok((StatusCode::ACCEPTED, "").into_response())
}

/// The VMI's memory request in bytes (0 without one, as `Requests.Memory()` is then zero).
fn memory_request(vmi: &Value) -> u64 {
    vmi.pointer("/spec/domain/resources/requests/memory")
        .and_then(Value::as_str)
        .and_then(crate::kubevirt::export::parse_bytes)
        .unwrap_or(0)
}

/// The smallest claim that holds the VMI's dump: `CalcExpectedMemoryDumpSize` with the
/// filesystem overhead, aligned up to 1 MiB.
pub fn needed_claim_bytes(app: &App, vmi: &Value) -> u64 {
    let expected = memory_request(vmi) + 100 * 1024 * 1024;
    let (configs, _) = app.store.list("cdi.kubevirt.io", "cdiconfigs", None);
    let overhead = configs
        .first()
        .and_then(|c| c.pointer("/status/filesystemOverhead/global"))
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(0.055);
    let total = (1.0 + overhead) * expected as f64;
    ((total / MIB).ceil() * MIB) as u64
}

fn check_claim(app: &App, vmi: &Value, ns: &str, claim: &str) -> Result<(), ApiError> {
    let pvc = app
        .store
        .get(&Key::new("", "persistentvolumeclaims", ns, claim))
        .ok_or_else(|| ApiError::not_found("", "persistentvolumeclaims", claim))?;
    let fail = |why: &str| {
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on persistentvolumeclaim \"{claim}\": {why}"),
        )
    };
    if pvc.pointer("/spec/volumeMode").and_then(Value::as_str) == Some("Block") {
        return Err(fail("pvc should be filesystem pvc"));
    }
    let modes: Vec<&str> = pvc
        .pointer("/spec/accessModes")
        .and_then(Value::as_array)
        .map(|m| m.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if modes.contains(&"ReadOnlyMany") {
        return Err(fail("pvc access mode can't be read only"));
    }
    let size = pvc
        .pointer("/spec/resources/requests/storage")
        .and_then(Value::as_str)
        .and_then(crate::kubevirt::export::parse_bytes)
        .unwrap_or(0);
    let needed = needed_claim_bytes(app, vmi);
    if size < needed {
        return Err(fail(&format!(
            "pvc size [{size}] should be bigger then [{needed}]"
        )));
    }
    Ok(())
}

fn remove(app: &App, ns: &str, name: &str) -> Result<Response, ApiError> {
    let key = Key::new(KV, "virtualmachines", ns, name);
    let vm = app.store.get(&key).expect("checked by the caller");
    let Some(current) = vm.pointer("/status/memoryDumpRequest").cloned() else {
        return Err(conflict(
            "virtualmachine",
            name,
            &format!("can't remove memory dump association for vm {name}, no association found"),
        ));
    };
    let claim = current["claimName"].as_str().unwrap_or("").to_string();
    if current["remove"] == json!(true) {
        return Err(conflict(
            "virtualmachine",
            name,
            &format!("memory dump remove request for pvc [{claim}] already exists"),
        ));
    }
    app.store.modify(&key, |o| {
        o["status"]["memoryDumpRequest"] =
            json!({"claimName": claim, "phase": "Dissociating", "remove": true});
    });
    Ok((StatusCode::ACCEPTED, "").into_response())
}

/// One step of every VM's memory dump request (on the progress timer).
pub fn controller(app: &App, tick: bool) {
    if !tick {
        return;
    }
    let (vms, _) = app.store.list(KV, "virtualmachines", None);
    for vm in vms {
        let Some(req) = vm.pointer("/status/memoryDumpRequest").cloned() else {
            continue;
        };
        let key = Key::of(KV, "virtualmachines", &vm);
        let name = meta_str(&vm, "name").to_string();
        let claim = req["claimName"].as_str().unwrap_or("").to_string();
        let now = now_rfc3339();
        let next = match req["phase"].as_str().unwrap_or("") {
            "Associating" => {
                let mut r = req.clone();
                r["phase"] = json!("InProgress");
                r["startTimestamp"] = json!(now);
                Some(r)
            }
            "InProgress" => {
                let mut r = req.clone();
                r["phase"] = json!("Unmounting");
                r["endTimestamp"] = json!(now);
                let stamp: String = now.chars().filter(char::is_ascii_digit).take(14).collect();
                let file = format!("{name}-{claim}-{}-{}.memory.dump", &stamp[..8], &stamp[8..]);
                write_dump(app, meta_str(&vm, "namespace"), &name, &claim, &file);
                r["fileName"] = json!(file);
                Some(r)
            }
            "Unmounting" => {
                let mut r = req.clone();
                r["phase"] = json!("Completed");
                Some(r)
            }
            "Dissociating" => None,
            _ => continue,
        };
        app.store.modify(&key, |o| match next {
            Some(r) => o["status"]["memoryDumpRequest"] = r,
            None => {
                if let Some(st) = o["status"].as_object_mut() {
                    st.remove("memoryDumpRequest");
                }
            }
        });
    }
}
