//! `collect-debug-info`: one tar.gz archive that explains a misbehaving VM.
//!
//! Gathers the VM and what belongs to it (per platform: [`kubevirt`], [`deckhouse`]), the pods
//! with their logs, events matched by kind and name, the domain XML, guest agent data, nodes
//! and versions, then writes `summary.txt`, `errors.txt` and `manifest.json`. Requests run
//! concurrently up to [`Options::concurrency`]; logs are streamed to temporary files and
//! masked line by line ([`redact`]), so memory does not grow with log size. Anything but the VM
//! itself is best effort: failures land in `errors.txt` and are reported as warnings.

pub mod archive;
pub mod deckhouse;
pub mod kubevirt;
mod logs;
pub mod redact;
pub mod summary;

pub use logs::EXEC_TIMEOUT;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, ListParams};
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::api::Kind;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::flavor::{Flavor, Platform};
use archive::{Content, Entry, Sink};
use redact::Redactor;

/// How to collect.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--tail`: last lines of each log (`None`: all).
    pub tail_lines: Option<i64>,
    /// `--since`: only log lines newer than this.
    pub since: Option<Duration>,
    /// `--include-secrets`: do not mask anything.
    pub include_secrets: bool,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// How long the domain-XML exec may take ([`EXEC_TIMEOUT`]).
    pub exec_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tail_lines: Some(10_000),
            since: None,
            include_secrets: false,
            concurrency: 16,
            exec_timeout: EXEC_TIMEOUT,
        }
    }
}

/// What the collection reports while it runs.
#[derive(Debug, Clone)]
pub enum Progress {
    /// A file went into the archive (`done` files so far).
    File {
        /// Its path in the archive.
        path: String,
        /// Files written so far.
        done: usize,
    },
    /// Something could not be collected (also listed in `errors.txt`).
    Warning(String),
}

/// The result of a collection.
#[derive(Debug)]
pub struct Outcome {
    /// Files in the archive, `manifest.json` excluded.
    pub files: usize,
    /// Compressed size.
    pub bytes: u64,
    /// What could not be collected.
    pub errors: Vec<String>,
    /// The archive's top folder.
    pub top: String,
}

type ProgressFn = Arc<dyn Fn(Progress) + Send + Sync>;

/// Shared state of one collection.
pub(crate) struct Collector {
    pub cluster: Cluster,
    pub ns: String,
    pub options: Options,
    pub redactor: Redactor,
    sink: Sink,
    errors: Mutex<Vec<String>>,
    written: Mutex<usize>,
    progress: ProgressFn,
    limit: Semaphore,
    pub facts: Mutex<summary::Facts>,
}

/// A kind this command reads (beyond [`crate::api`]'s).
pub(crate) const fn kind(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
) -> Kind {
    Kind {
        group,
        version,
        kind,
        plural,
        namespaced,
    }
}

pub(crate) const POD: Kind = kind("", "v1", "Pod", "pods", true);
pub(crate) const PVC: Kind = kind(
    "",
    "v1",
    "PersistentVolumeClaim",
    "persistentvolumeclaims",
    true,
);
pub(crate) const PV: Kind = kind("", "v1", "PersistentVolume", "persistentvolumes", false);
pub(crate) const NODE: Kind = kind("", "v1", "Node", "nodes", false);
pub(crate) const STORAGE_CLASS: Kind = kind(
    "storage.k8s.io",
    "v1",
    "StorageClass",
    "storageclasses",
    false,
);

fn folder(kind: &Kind) -> String {
    kind.kind.to_ascii_lowercase()
}

impl Collector {
    /// Record a failure: `errors.txt` and one warning.
    pub fn error(&self, what: String) {
        (self.progress)(Progress::Warning(what.clone()));
        self.errors.lock().expect("errors lock").push(what);
    }

    /// Put a file into the archive.
    pub async fn put(&self, path: String, description: String, content: Content) {
        let shown = path.clone();
        if self
            .sink
            .put(Entry {
                path,
                description,
                content,
            })
            .await
        {
            let done = {
                let mut n = self.written.lock().expect("count lock");
                *n += 1;
                *n
            };
            (self.progress)(Progress::File { path: shown, done });
        }
    }

    /// An object as masked YAML into `<kind>/<name>.yaml`.
    pub async fn put_object(&self, kind: &Kind, object: &Value) {
        let mut object = object.clone();
        if object.get("kind").is_none() {
            object["kind"] = Value::from(kind.kind);
            object["apiVersion"] = Value::from(kind.api_version());
        }
        self.redactor.object(&mut object);
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or("unnamed")
            .to_owned();
        let yaml = yaml_serde::to_string(&object).unwrap_or_default();
        let text = self.redactor.text(&yaml);
        self.put(
            format!("{}/{name}.yaml", folder(kind)),
            format!("{} {name}", kind.kind),
            Content::Bytes(text.into_bytes()),
        )
        .await;
    }

    fn describe_error(&self, kind: &Kind, name: Option<&str>, err: kube::Error) -> String {
        let verb = if name.is_some() { "get" } else { "list" };
        let mut action = kind.action(verb, kind.namespaced.then_some(self.ns.as_str()));
        if let Some(name) = name {
            action = action.named(name);
        }
        let what = match name {
            Some(n) => format!("{}/{n}", kind.kind.to_ascii_lowercase()),
            None => kind.resource_name(),
        };
        format!("{what}: {}", self.cluster.error(err, &action))
    }

    /// GET one object and archive it; failures are recorded, `None` returned.
    pub async fn get(&self, kind: &Kind, name: &str) -> Option<Value> {
        let _permit = self.limit.acquire().await.ok()?;
        let api = kind.api(&self.cluster.client, Some(&self.ns));
        match api.get(name).await {
            Ok(object) => {
                let value = serde_json::to_value(object).ok()?;
                self.put_object(kind, &value).await;
                Some(value)
            }
            Err(e) => {
                self.error(self.describe_error(kind, Some(name), e));
                None
            }
        }
    }

    /// GET one object in namespace `ns` (not necessarily the VM's) and archive it.
    pub async fn get_in(&self, kind: &Kind, ns: &str, name: &str) -> Option<Value> {
        let _permit = self.limit.acquire().await.ok()?;
        let api = kind.api(&self.cluster.client, Some(ns));
        match api.get(name).await {
            Ok(object) => {
                let value = serde_json::to_value(object).ok()?;
                self.put_object(kind, &value).await;
                Some(value)
            }
            Err(e) => {
                let action = kind.action("get", Some(ns));
                self.error(format!(
                    "{}/{name}: {}",
                    kind.kind.to_ascii_lowercase(),
                    self.cluster.error(e, &action)
                ));
                None
            }
        }
    }

    /// GET one object in namespace `ns` that may well not exist (a pod that runs only for a
    /// while): archived when found; absent is not an error, other failures are recorded.
    pub async fn find_in(&self, kind: &Kind, ns: &str, name: &str) -> Option<Value> {
        let _permit = self.limit.acquire().await.ok()?;
        let api = kind.api(&self.cluster.client, Some(ns));
        match api.get_opt(name).await {
            Ok(Some(object)) => {
                let value = serde_json::to_value(object).ok()?;
                self.put_object(kind, &value).await;
                Some(value)
            }
            Ok(None) => None,
            Err(e) => {
                let action = kind.action("get", Some(ns)).named(name);
                self.error(format!(
                    "{}/{name}: {}",
                    kind.kind.to_ascii_lowercase(),
                    self.cluster.error(e, &action)
                ));
                None
            }
        }
    }

    /// LIST objects in the namespace (labels/fields selectors), keep those `keep` accepts,
    /// archive them.
    pub async fn list(
        &self,
        kind: &Kind,
        labels: Option<&str>,
        keep: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let items: Vec<Value> = self
            .list_raw(kind, labels)
            .await
            .into_iter()
            .filter(|v| keep(v))
            .collect();
        for item in &items {
            self.put_object(kind, item).await;
        }
        items
    }

    /// LIST objects in the namespace without archiving them; failures are recorded.
    pub async fn list_raw(&self, kind: &Kind, labels: Option<&str>) -> Vec<Value> {
        let Ok(_permit) = self.limit.acquire().await else {
            return vec![];
        };
        let api = kind.api(&self.cluster.client, Some(&self.ns));
        let mut params = ListParams::default();
        if let Some(l) = labels {
            params = params.labels(l);
        }
        match api.list(&params).await {
            Ok(list) => list
                .items
                .into_iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect(),
            Err(e) => {
                self.error(self.describe_error(kind, None, e));
                vec![]
            }
        }
    }

    /// Events of one object, matched by kind and name, into `event/<kind>-<name>.yaml`.
    pub async fn events(&self, kind: &str, name: &str) {
        self.events_in(&self.ns, kind, name).await;
    }

    /// Events of one object in namespace `ns` (not necessarily the VM's).
    pub async fn events_in(&self, ns: &str, kind: &str, name: &str) {
        let Ok(_permit) = self.limit.acquire().await else {
            return;
        };
        let api = crate::api::EVENT.api(&self.cluster.client, Some(ns));
        let params = ListParams::default().fields(&format!(
            "involvedObject.kind={kind},involvedObject.name={name}"
        ));
        let items: Vec<Value> = match api.list(&params).await {
            Ok(list) => list
                .items
                .into_iter()
                .filter_map(|o| serde_json::to_value(o).ok())
                .collect(),
            Err(e) => {
                self.error(format!(
                    "events of {}/{name}: {}",
                    kind.to_ascii_lowercase(),
                    self.cluster
                        .error(e, &crate::api::EVENT.action("list", Some(ns)))
                ));
                return;
            }
        };
        drop(_permit);
        if items.is_empty() {
            return;
        }
        self.facts
            .lock()
            .expect("facts lock")
            .events
            .extend(items.iter().cloned());
        let mut list = serde_json::json!({"apiVersion": "v1", "kind": "EventList", "items": items});
        if let Some(items) = list["items"].as_array_mut() {
            for item in items {
                self.redactor.object(item);
            }
        }
        let yaml = self
            .redactor
            .text(&yaml_serde::to_string(&list).unwrap_or_default());
        self.put(
            format!("event/{}-{name}.yaml", kind.to_ascii_lowercase()),
            format!("events of {kind} {name}"),
            Content::Bytes(yaml.into_bytes()),
        )
        .await;
    }

    /// GET a raw JSON path (guest agent subresources) into `file`.
    pub async fn raw_json(&self, path: &str, file: &str, description: &str) -> Option<Value> {
        let _permit = self.limit.acquire().await.ok()?;
        let request = http::Request::get(path).body(Vec::new()).ok()?;
        match self.cluster.client.request::<Value>(request).await {
            Ok(value) => {
                let mut masked = value.clone();
                self.redactor.object(&mut masked);
                let text = self
                    .redactor
                    .text(&serde_json::to_string_pretty(&masked).unwrap_or_default());
                self.put(
                    file.to_owned(),
                    description.to_owned(),
                    Content::Bytes(text.into_bytes()),
                )
                .await;
                Some(value)
            }
            Err(e) => {
                let action =
                    crate::error::Action::new("get", path.to_owned(), description.to_owned());
                self.error(format!("{description}: {}", self.cluster.error(e, &action)));
                None
            }
        }
    }

    /// PVCs by name, then their PVs, StorageClasses, and pods using them (importers).
    pub async fn storage(&self, pvc_names: Vec<String>) {
        let mut names = pvc_names;
        names.sort();
        names.dedup();
        let pvcs: Vec<Value> = futures::future::join_all(names.iter().map(|n| async move {
            let pvc = self.get(&PVC, n).await;
            self.events("PersistentVolumeClaim", n).await;
            pvc
        }))
        .await
        .into_iter()
        .flatten()
        .collect();
        let mut pvs: Vec<String> = pvcs
            .iter()
            .filter_map(|p| p["spec"]["volumeName"].as_str().map(str::to_owned))
            .filter(|n| !n.is_empty())
            .collect();
        pvs.sort();
        pvs.dedup();
        let mut classes: Vec<String> = pvcs
            .iter()
            .filter_map(|p| p["spec"]["storageClassName"].as_str().map(str::to_owned))
            .collect();
        classes.sort();
        classes.dedup();
        futures::future::join(
            futures::future::join_all(pvs.iter().map(|n| self.get(&PV, n))),
            futures::future::join_all(classes.iter().map(|n| self.get(&STORAGE_CLASS, n))),
        )
        .await;
        self.facts.lock().expect("facts lock").pvcs.extend(pvcs);
    }

    /// Pods, their events and logs; pods owned by them (hotplug) are found by the caller.
    pub async fn pods(&self, pods: &[Value]) {
        futures::future::join_all(pods.iter().map(|pod| async move {
            let name = pod["metadata"]["name"].as_str().unwrap_or_default();
            let ns = pod["metadata"]["namespace"].as_str().unwrap_or(&self.ns);
            futures::future::join(self.events_in(ns, "Pod", name), self.pod_logs(pod)).await;
        }))
        .await;
        self.facts
            .lock()
            .expect("facts lock")
            .pods
            .extend(pods.iter().cloned());
    }

    /// A short summary of each node the VM's pods run on.
    pub async fn nodes(&self, names: Vec<String>) {
        let mut names = names;
        names.sort();
        names.dedup();
        futures::future::join_all(names.iter().map(|name| async move {
            let _permit = self.limit.acquire().await.ok()?;
            let api = NODE.api(&self.cluster.client, None);
            match api.get(name).await {
                Ok(node) => {
                    let node = serde_json::to_value(node).ok()?;
                    let summary = serde_json::json!({
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {"name": node["metadata"]["name"], "labels": node["metadata"]["labels"]},
                        "spec": {"taints": node["spec"]["taints"], "unschedulable": node["spec"]["unschedulable"]},
                        "status": {
                            "conditions": node["status"]["conditions"],
                            "capacity": node["status"]["capacity"],
                            "allocatable": node["status"]["allocatable"],
                            "nodeInfo": node["status"]["nodeInfo"],
                        }
                    });
                    self.put_object(&NODE, &summary).await;
                    Some(())
                }
                Err(e) => {
                    self.error(self.describe_error(&NODE, Some(name), e));
                    None
                }
            }
        }))
        .await;
    }

    /// Kubernetes and platform versions into `platform/version.yaml`.
    pub async fn versions(&self, platform: &Platform) {
        match crate::version::server_versions(&self.cluster, platform).await {
            Ok(v) => {
                let text = format!(
                    "kubernetes: {}\nplatform: {}\nplatformVersion: {}\nclient: kubectl-vm {}\n",
                    v.kubernetes,
                    platform.flavor.display_name(),
                    v.platform.as_deref().unwrap_or("unknown"),
                    env!("CARGO_PKG_VERSION")
                );
                self.put(
                    "platform/version.yaml".into(),
                    "Kubernetes and virtualization platform versions".into(),
                    Content::Bytes(text.into_bytes()),
                )
                .await;
            }
            Err(e) => self.error(format!("versions: {e}")),
        }
    }
}

/// Names of the nodes pods run on.
pub(crate) fn node_names(pods: &[Value]) -> Vec<String> {
    pods.iter()
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Pods in `all` owned by one of `owners` (hotplug volume pods are owned by the launcher pod).
pub(crate) fn owned_pods(all: &[Value], owners: &[Value]) -> Vec<Value> {
    let uids: Vec<&str> = owners
        .iter()
        .filter_map(|o| o["metadata"]["uid"].as_str())
        .collect();
    all.iter()
        .filter(|p| {
            p["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["uid"].as_str().is_some_and(|u| uids.contains(&u)))
        })
        .cloned()
        .collect()
}

/// The user data texts in Secret `name` (keys `userData`/`userdata`, as KubeVirt and
/// Deckhouse read them).
async fn user_data_from_secret(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
) -> std::result::Result<Vec<String>, String> {
    use k8s_openapi::api::core::v1::Secret;
    let api: Api<Secret> = Api::namespaced(cluster.client.clone(), namespace);
    let secret = api.get(name).await.map_err(|e| {
        cluster
            .error(
                e,
                &crate::error::Action::new("get", "secrets", "secret")
                    .in_namespace(Some(namespace))
                    .named(name),
            )
            .to_string()
    })?;
    let is_user_data = |k: &str| k.eq_ignore_ascii_case("userdata");
    let mut texts: Vec<String> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| is_user_data(k))
        .map(|(_, v)| String::from_utf8_lossy(&v.0).into_owned())
        .collect();
    texts.extend(
        secret
            .string_data
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| is_user_data(k))
            .map(|(_, v)| v),
    );
    Ok(texts)
}

/// What to mask in everything collected: the VM's user data (and, unless secrets are
/// included, the user data Secrets it references, read only to learn the values to mask;
/// neither the Secret nor its values go in the archive). Also the errors of reading them.
async fn redactor_for(
    cluster: &Cluster,
    vm: &Value,
    namespace: &str,
    options: &Options,
) -> (Redactor, Vec<String>) {
    let mut redactor = Redactor::new(!options.include_secrets);
    for text in redact::user_data_texts(vm) {
        redactor.learn_user_data(&text);
    }
    // `create` puts user data (with the --env values) into a Secret the VM references.
    let mut secret_errors = Vec::new();
    if redactor.enabled() {
        for secret in redact::user_data_secret_names(vm) {
            match user_data_from_secret(cluster, namespace, &secret).await {
                Ok(texts) => texts.iter().for_each(|t| redactor.learn_user_data(t)),
                Err(e) => secret_errors.push(format!(
                    "secret {secret:?} (the VM's user data, read only to learn the values to mask): {e}; \
                     values it sets (--env) may appear unmasked in logs"
                )),
            }
        }
    }
    (redactor, secret_errors)
}

/// The archive's two reading aids, written last: `summary.txt` (what looks wrong, from the
/// facts gathered) and `errors.txt` (what could not be collected, sorted). Returns the errors.
async fn write_summary(collector: &Collector, flavor: Flavor) -> Vec<String> {
    let errors = collector.errors.lock().expect("errors lock").clone();
    let facts = std::mem::take(&mut *collector.facts.lock().expect("facts lock"));
    let summary_text = collector.redactor.text(&summary::render(
        &facts,
        flavor,
        &errors,
        jiff::Timestamp::now(),
    ));
    collector
        .put(
            "summary.txt".into(),
            "read first: phase, conditions, warnings and what looks wrong".into(),
            Content::Bytes(summary_text.into_bytes()),
        )
        .await;
    let mut errors_text = String::new();
    let mut sorted = errors.clone();
    sorted.sort();
    for e in &sorted {
        errors_text.push_str(e);
        errors_text.push('\n');
    }
    collector
        .put(
            "errors.txt".into(),
            "what could not be collected (forbidden, missing, failed)".into(),
            Content::Bytes(errors_text.into_bytes()),
        )
        .await;
    errors
}

/// Collect everything about VM `name` in `namespace` into a tar.gz written to `out`.
/// Fails only when the VM itself cannot be read, or the archive cannot be written.
pub async fn collect<W: Write + Send + 'static>(
    cluster: &Cluster,
    platform: &Platform,
    name: &str,
    namespace: &str,
    options: Options,
    out: W,
    progress: impl Fn(Progress) + Send + Sync + 'static,
) -> Result<Outcome> {
    let vm_kind = Kind::vm(platform.flavor);
    let vm = vm_kind
        .api(&cluster.client, Some(namespace))
        .get(name)
        .await
        .map_err(|e| cluster.error(e, &vm_kind.action("get", Some(namespace)).named(name)))?;
    let vm = serde_json::to_value(vm).map_err(|e| Error::Internal(e.to_string()))?;

    let (redactor, secret_errors) = redactor_for(cluster, &vm, namespace, &options).await;
    let top = format!("debug-info-{name}.{namespace}");
    let (sink, writer) = archive::start(out, top.clone());
    let collector = Collector {
        cluster: cluster.clone(),
        ns: namespace.to_owned(),
        limit: Semaphore::new(options.concurrency.max(1)),
        options,
        redactor,
        sink,
        errors: Mutex::new(Vec::new()),
        written: Mutex::new(0),
        progress: Arc::new(progress),
        facts: Mutex::new(summary::Facts::default()),
    };
    for e in secret_errors {
        collector.error(e);
    }
    collector.facts.lock().expect("facts lock").vm = vm.clone();
    collector.put_object(&vm_kind, &vm).await;
    futures::future::join(
        async {
            match platform.flavor {
                Flavor::KubeVirt => kubevirt::collect(&collector, &vm).await,
                Flavor::Deckhouse => deckhouse::collect(&collector, &vm).await,
            }
        },
        collector.versions(platform),
    )
    .await;

    let errors = write_summary(&collector, platform.flavor).await;
    let Collector { sink, .. } = collector;
    drop(sink);
    let written = tokio::task::spawn_blocking(move || writer.finish())
        .await
        .map_err(|e| Error::Internal(format!("archive writer: {e}")))?
        .map_err(|e| Error::Internal(format!("writing the archive: {e}")))?;
    Ok(Outcome {
        files: written.files.len(),
        bytes: written.bytes,
        errors,
        top,
    })
}
