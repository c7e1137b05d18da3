//! Shared state of one emulator instance, used by the HTTP handlers, watches and controllers.

use crate::FailureRule;
use crate::core::auth::Tokens;
use crate::core::registry::{Registry, ResourceDef};
use crate::core::store::{Key, Store};
use crate::core::util::meta_str;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Everything a request handler needs.
pub struct App {
    /// The objects.
    pub store: Arc<Store>,
    /// The kinds served.
    pub registry: Registry,
    /// Bearer tokens.
    pub tokens: Tokens,
    /// Active failure-injection rules.
    pub failures: Mutex<Vec<FailureRule>>,
    /// Objects whose state a test or fixture owns, by uid → generation (controllers leave them
    /// alone until their generation changes).
    pub settled: Mutex<HashMap<String, i64>>,
    /// Controller step (DataVolume/VirtualDisk progress interval).
    pub import_step: Duration,
    /// The port served (for discovery's `serverAddressByClientCIDRs`).
    pub port: Mutex<u16>,
    /// Every request received, for tests.
    pub requests: crate::core::requests::RequestLog,
    /// Requests held back until a test releases them.
    pub holds: crate::core::hold::Holds,
    /// The guests of running VMs.
    pub guests: crate::core::guest::Guests,
    /// Test switches of the sshd guests (host key changes, paused VMs).
    pub ssh_switches: crate::core::sshd_guest::Switches,
    /// Faults given to the stream and transfer connections opened from now on.
    pub stream_faults: crate::core::faults::StreamFaults,
    /// Open console/VNC streams.
    pub sessions: crate::core::streams::Sessions,
    /// Export server state (VirtualMachineExport / DataExport).
    pub exports: crate::kubevirt::export::ExportState,
    /// Memory dump files written into claims.
    pub claim_files: crate::kubevirt::memory_dump::ClaimFiles,
    /// CDI upload proxy state (UploadTokenRequest tokens, uploaded volumes).
    pub uploads: crate::kubevirt::upload::UploadState,
    /// The importers' real downloads (URLs on this machine).
    pub imports: crate::core::http_import::Imports,
    /// ServiceAccount tokens issued through TokenRequest.
    pub sa_tokens: crate::core::sa_tokens::ServiceAccountTokens,
    /// The aggregator's front-proxy identity (set at start).
    pub front_proxy: std::sync::OnceLock<crate::core::tls::FrontProxy>,
    /// Test switch: pod execs open their streams and then hang (see `Handle::set_exec_hangs`).
    pub exec_hangs: std::sync::atomic::AtomicBool,
    /// Objects as decoded from storage (the watch cache's copies), for lists.
    pub decoded: crate::core::decoded::DecodedCache,
    /// The specs running machines started from (what changes wait for a restart).
    pub started: crate::kubevirt::live_update::Started,
}

impl App {
    /// Creates the state.
    pub fn new(registry: Registry, import_step: Duration) -> Self {
        App {
            store: Arc::new(Store::new()),
            registry,
            tokens: Tokens::generate(),
            failures: Mutex::new(vec![]),
            settled: Mutex::new(HashMap::new()),
            import_step,
            port: Mutex::new(0),
            requests: Default::default(),
            holds: Default::default(),
            guests: Default::default(),
            ssh_switches: Default::default(),
            stream_faults: Default::default(),
            sessions: Default::default(),
            exports: Default::default(),
            claim_files: Default::default(),
            uploads: Default::default(),
            imports: Default::default(),
            sa_tokens: Default::default(),
            front_proxy: Default::default(),
            exec_hangs: Default::default(),
            decoded: Default::default(),
            started: Default::default(),
        }
    }

    /// Stores an object as-is (fixtures, `put_object`): resolves its kind, creates its namespace
    /// if needed and marks it settled so controllers don't rewrite a state a test chose.
    pub fn put(&self, obj: Value) -> Result<Value, String> {
        let api_version = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let def = self.registry.find_kind(api_version, kind).ok_or_else(|| {
            format!("kind {kind} ({api_version}) is not served by this emulator flavor")
        })?;
        if meta_str(&obj, "name").is_empty() {
            return Err(format!("{kind} without metadata.name"));
        }
        let mut obj = obj;
        crate::core::strategy::prepare(&def, &mut obj).map_err(|e| e.message)?;
        if def.namespaced {
            if meta_str(&obj, "namespace").is_empty() {
                crate::core::util::meta_mut(&mut obj).insert("namespace".into(), json!("default"));
            }
            self.ensure_namespace(meta_str(&obj, "namespace"));
        } else {
            crate::core::util::meta_mut(&mut obj).remove("namespace");
        }
        let stored = self.store.upsert(&def.group, &def.plural, obj);
        self.settle(&stored);
        Ok(stored)
    }

    /// Creates namespace `ns` (phase Active) if it does not exist.
    pub fn ensure_namespace(&self, ns: &str) {
        if ns.is_empty()
            || self
                .store
                .get(&Key::new("", "namespaces", "", ns))
                .is_some()
        {
            return;
        }
        let obj = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}});
        // Racing creators are fine: the loser gets AlreadyExists.
        let _ = self.store.create("", "namespaces", obj);
    }

    /// Marks an object's current generation as owned by the test/fixture.
    pub fn settle(&self, obj: &Value) {
        let generation = obj
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let uid = meta_str(obj, "uid").to_string();
        self.settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid, generation);
    }

    /// Whether controllers should leave this object alone.
    pub fn is_settled(&self, obj: &Value) -> bool {
        let generation = obj
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        self.settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(meta_str(obj, "uid"))
            == Some(&generation)
    }

    /// The first failure rule matching a request, consuming one use of it.
    pub fn take_failure(&self, verb: &str, plural: &str, name: &str) -> Option<FailureRule> {
        let mut rules = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let idx = rules.iter().position(|r| {
            r.verb == verb && r.plural == plural && r.name.as_deref().is_none_or(|n| n == name)
        })?;
        let rule = rules[idx].clone();
        if let Some(t) = rules[idx].times.as_mut() {
            *t = t.saturating_sub(1);
            if *t == 0 {
                rules.remove(idx);
            }
        }
        Some(rule)
    }

    /// The served definition for a stored object.
    pub fn def_of(&self, obj: &Value) -> Option<Arc<ResourceDef>> {
        let api_version = obj.get("apiVersion").and_then(Value::as_str)?;
        let kind = obj.get("kind").and_then(Value::as_str)?;
        self.registry.find_kind(api_version, kind)
    }
}
