//! `kubevm-emulator`: a small, faithful emulator of the Kubernetes API server plus the KubeVirt,
//! CDI and Deckhouse virtualization APIs, for kubectl-vm's end-to-end tests and demos.
//!
//! It serves HTTPS on 127.0.0.1 with a freshly generated CA, authenticates two bearer-token
//! users (`admin`, `alice`), serves discovery, OpenAPI v3 (as much as kubectl needs), CRUD,
//! patches, watches, tables and schema validation, and runs minimal controllers so VMs,
//! DataVolumes and VirtualDisks move through their phases.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kubevm_emulator::EmulatorError> {
//! use kubevm_emulator::{Emulator, EmulatorOptions};
//! let emu = Emulator::start(EmulatorOptions::default()).await?;
//! println!("{}", emu.kubeconfig_yaml());
//! emu.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Modules by platform: [`core`](crate::core) (the API server: `tls`, `auth`, `store`, `registry`, `schema`,
//! `admission`, `discovery`, `openapi`, `handlers`, `patch`, `selector`, `table`, `watch`,
//! `subresources`, `controllers`, `lifecycle`, guests, `fixtures`), [`kubevirt`](crate::kubevirt) (KubeVirt and
//! CDI behaviour: snapshots, clones, exports, uploads, hotplug, ...) and [`deckhouse`](crate::deckhouse)
//! (Deckhouse-only behaviour); `tests/emulator/README.md` maps every module.

pub mod core;
pub mod deckhouse;
pub mod kubevirt;

use crate::core::app::App;
use base64::Engine;
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Which platform API groups are registered and served (core kinds always are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServeFlavor {
    /// KubeVirt and CDI.
    #[default]
    KubeVirt,
    /// Deckhouse virtualization (and storage-foundation's DataExport).
    Deckhouse,
    /// Both.
    Both,
}

/// How to start an emulator.
#[derive(Debug, Clone)]
pub struct EmulatorOptions {
    /// Fixture texts (multi-document YAML) loaded at start.
    pub fixture_yaml: Vec<String>,
    /// Which platform groups to serve.
    pub flavor: ServeFlavor,
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// Controller step: each DataVolume/VirtualDisk import advances 10% per step.
    pub import_step: Duration,
    /// API groups left unserved although the flavor has them (`subresources.kubevirt.io`: a
    /// cluster with KubeVirt's CRDs but no virt-api; `upload.cdi.kubevirt.io`: CDI without its
    /// apiserver). Their paths get the API server's end-of-chain 404 and discovery omits them.
    pub unserved_groups: Vec<String>,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        EmulatorOptions {
            fixture_yaml: vec![],
            flavor: ServeFlavor::KubeVirt,
            port: 0,
            import_step: Duration::from_millis(200),
            unserved_groups: vec![],
        }
    }
}

/// A request-failure rule: matching requests fail with a `Status` of `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureRule {
    /// `create`, `delete`, `patch`, `update`, `get`, `list` (or a subresource such as `start`).
    pub verb: String,
    /// Plural resource, e.g. `virtualmachines`.
    pub plural: String,
    /// Only this object, if set.
    pub name: Option<String>,
    /// HTTP code (the reason is derived: 500 InternalError, 422 Invalid, 409 Conflict, …).
    pub code: u16,
    /// Status message.
    pub message: String,
    /// How many times; None = always.
    pub times: Option<u32>,
}

/// Errors starting the emulator.
#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    /// Binding or serving failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Certificate generation failed.
    #[error("tls: {0}")]
    Tls(String),
    /// A fixture could not be loaded.
    #[error("fixture: {0}")]
    Fixture(String),
}

/// The synchronous accessors of a running emulator; [`Emulator`] and [`BlockingEmulator`]
/// both dereference to it.
pub struct Handle {
    app: Arc<App>,
    url: String,
    ca_pem: String,
}

impl Handle {
    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// PEM of the CA that signed the serving certificate (SANs 127.0.0.1 and localhost).
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// A kubeconfig with cluster `emulator`, users `admin`/`alice` and contexts `emulator`
    /// (admin, namespace default; current) and `emulator-restricted` (alice, namespace dev).
    pub fn kubeconfig_yaml(&self) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: admin\n  user:\n    token: {admin}\n- name: alice\n  user:\n    token: {alice}\ncontexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: admin\n    namespace: default\n- name: emulator-restricted\n  context:\n    cluster: emulator\n    user: alice\n    namespace: dev\ncurrent-context: emulator\npreferences: {{}}\n",
            url = self.url,
            admin = self.app.tokens.admin,
            alice = self.app.tokens.alice,
        )
    }

    /// A kubeconfig like [`Self::kubeconfig_yaml`] (same server and CA) with one user `user`
    /// presenting bearer `token` (e.g. from [`Self::service_account_token`]) and one context
    /// `emulator` (current, namespace default).
    pub fn kubeconfig_yaml_with_token(&self, user: &str, token: &str) -> String {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem.as_bytes());
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: {user:?}\n  user:\n    token: {token:?}\ncontexts:\n- name: emulator\n  context:\n    cluster: emulator\n    user: {user:?}\n    namespace: default\ncurrent-context: emulator\npreferences: {{}}\n",
            url = self.url,
        )
    }

    /// Mints a token for ServiceAccount `namespace/name` as TokenRequest does (audience the API
    /// server's, valid for `expiration_seconds`); None when the ServiceAccount does not exist.
    pub fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        expiration_seconds: i64,
    ) -> Option<String> {
        let sa = self.app.store.get(&crate::core::store::Key::new(
            "",
            "serviceaccounts",
            namespace,
            name,
        ))?;
        let audiences = [crate::core::sa_tokens::API_AUDIENCE.to_string()];
        Some(
            self.app
                .sa_tokens
                .issue(&sa, &audiences, expiration_seconds)
                .0,
        )
    }

    /// The front-proxy identity the aggregator presents to aggregated API servers (its CA is
    /// `requestheader-client-ca-file` of ConfigMap `kube-system/extension-apiserver-authentication`).
    pub fn front_proxy(&self) -> crate::core::tls::FrontProxy {
        self.app.front_proxy.get().cloned().expect("set at start")
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path` with mode 0600.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        #[cfg(unix)]
        use std::os::unix::fs::OpenOptionsExt;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        opts.mode(0o600);
        let mut f = opts.open(path)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // An existing file keeps its mode on open; force 0600.
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        f.write_all(self.kubeconfig_yaml().as_bytes())
    }

    /// Reads the store directly (no auth): objects of `group`/`plural`, optionally in one
    /// namespace.
    pub fn objects(&self, group: &str, plural: &str, namespace: Option<&str>) -> Vec<Value> {
        self.app.store.list(group, plural, namespace).0
    }

    /// Writes an object directly (no validation or auth): bumps resourceVersion, emits watch
    /// events, creates its namespace if needed; controllers leave its state alone until its
    /// generation changes. Panics if its kind is not served.
    pub fn put_object(&self, obj: Value) {
        if let Err(e) = self.app.put(obj) {
            panic!("put_object: {e}");
        }
    }

    /// Every request received so far, in order (see [`crate::core::requests::RecordedRequest`]).
    pub fn requests(&self) -> Vec<crate::core::requests::RecordedRequest> {
        self.app.requests.all()
    }

    /// Holds requests with `verb` on `plural` until [`Handle::release_held`] (see [`hold`](crate::core::hold)).
    pub fn hold(&self, verb: &str, plural: &str) {
        self.app.holds.add(verb, plural)
    }

    /// How many requests are being held right now.
    pub fn held(&self) -> usize {
        self.app.holds.waiting()
    }

    /// Lets every held request go on and stops holding.
    pub fn release_held(&self) {
        self.app.holds.release_all()
    }

    /// Forgets the requests received so far (to assert on what one command sends).
    pub fn clear_requests(&self) {
        self.app.requests.clear()
    }

    /// Ends every console/VNC stream of VM `namespace/name` without a close frame, as a
    /// network failure or a live migration does; the guest keeps running.
    pub fn drop_streams(&self, namespace: &str, name: &str) {
        self.app.sessions.drop_streams(namespace, name)
    }

    /// Test switch: the guest of VM `namespace/name` gets a new host key (and no host
    /// certificate) from its next boot on; a running guest is stopped, so the next
    /// connection boots it again.
    pub fn change_guest_host_key(&self, namespace: &str, name: &str) {
        self.app.ssh_switches.change_host_key(namespace, name);
        self.app.guests.sync(&self.app);
        self.app.guests.stop_one(namespace, name);
    }

    /// Test switch: from now on every pod exec is accepted and opens its streams, then says
    /// nothing and holds the connection open until the client goes, as an exec whose command
    /// hangs (a virsh stuck on a wedged libvirtd) does on a real kubelet.
    /// Faults for the console, VNC, port-forward, export and upload connections opened from
    /// now on (`None`: none); [`crate::core::faults::StreamFaults::applied`] says which each got.
    pub fn set_stream_faults(&self, source: Option<crate::core::faults::FaultSource>) {
        self.app.stream_faults.set(source);
    }

    /// The faults given so far, with the stream each went to.
    pub fn stream_faults_applied(&self) -> Vec<(&'static str, crate::core::faults::Fault)> {
        self.app.stream_faults.applied()
    }

    pub fn set_exec_hangs(&self, hang: bool) {
        self.app
            .exec_hangs
            .store(hang, std::sync::atomic::Ordering::SeqCst);
    }

    /// Test hook standing in for a guest that writes its disk: PVC `namespace/pvc` now holds
    /// `data` (exports and snapshots read it).
    pub fn write_volume(&self, namespace: &str, pvc: &str, data: &[u8]) -> std::io::Result<()> {
        crate::kubevirt::vm_snapshot::write_volume(&self.app, namespace, pvc, data)
    }

    /// Test switch: pause or unpause VM `namespace/name` (its portforward answers 409).
    pub fn set_guest_paused(&self, namespace: &str, name: &str, paused: bool) {
        self.app.ssh_switches.set_paused(namespace, name, paused);
    }

    /// Replaces what boots the guests of running VMs from now on (see [`guest`](crate::core::guest)).
    pub fn set_guest_factory(&self, factory: Arc<dyn crate::core::guest::GuestFactory>) {
        self.app.guests.set_factory(factory)
    }

    /// The guest of running VM `namespace/name` (booted if it has none yet); `None` when the
    /// VM does not run.
    pub fn guest(
        &self,
        namespace: &str,
        name: &str,
    ) -> std::io::Result<Option<Arc<dyn crate::core::guest::Guest>>> {
        self.app.guests.get_or_boot(&self.app, namespace, name)
    }

    /// Real Linux guests from now on: each running VM boots a qemu guest (see [`qemu_guest`](crate::core::qemu_guest)).
    /// The returned factory tells the qemu pids and serial logs.
    pub fn use_qemu_guests(
        &self,
        config: crate::core::qemu_guest::QemuConfig,
    ) -> std::io::Result<Arc<crate::core::qemu_guest::QemuGuests>> {
        let factory = Arc::new(crate::core::qemu_guest::QemuGuests::new(
            Arc::downgrade(&self.app),
            config,
        )?);
        self.app.guests.set_factory(factory.clone());
        Ok(factory)
    }

    /// Expires every resourceVersion issued so far, as an etcd compaction does: watches from an
    /// older resourceVersion and continue tokens get 410 Expired, and open watches end (as
    /// when the API server's watch cache is re-initialised) so clients re-watch and see it.
    pub fn expire_resource_versions(&self) {
        self.app.store.compact();
    }

    /// Makes an admission webhook named `webhook` deny `verb` (`create`, `update`, `patch`,
    /// `delete`) of `plural` with `message`, `times` times (None: always), as a
    /// controller-runtime webhook does (`admission.Denied`: 403 Forbidden); the API server
    /// words it `admission webhook "NAME" denied the request: MESSAGE`
    /// (k8s.io/apiserver/pkg/admission/plugin/webhook/errors/statuserror.go `ToStatusErr`).
    pub fn deny_admission(
        &self,
        webhook: &str,
        verb: &str,
        plural: &str,
        message: &str,
        times: Option<u32>,
    ) {
        self.inject_failure(FailureRule {
            verb: verb.into(),
            plural: plural.into(),
            name: None,
            code: 403,
            message: format!("admission webhook \"{webhook}\" denied the request: {message}"),
            times,
        });
    }

    /// Adds a failure-injection rule.
    pub fn inject_failure(&self, rule: FailureRule) {
        self.app
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(rule);
    }
}

/// A running emulator (async API).
pub struct Emulator {
    shared: Handle,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Emulator {
    /// Starts serving HTTPS on 127.0.0.1 (`opts.port`, 0 = random) with the fixtures loaded.
    pub async fn start(opts: EmulatorOptions) -> Result<Emulator, EmulatorError> {
        let certs = crate::core::tls::generate().map_err(EmulatorError::Tls)?;
        let app = Arc::new(App::new(
            crate::core::registry::Registry::new(opts.flavor).without_groups(&opts.unserved_groups),
            opts.import_step,
        ));
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            app.ensure_namespace(ns);
        }
        let front_proxy = crate::core::tls::generate_front_proxy().map_err(EmulatorError::Tls)?;
        crate::core::bootstrap::seed(&app, &certs.ca_pem, &front_proxy)
            .map_err(EmulatorError::Fixture)?;
        let _ = app.front_proxy.set(front_proxy);
        // Guests run a real sshd configured by their cloud-init where that is possible (root).
        if crate::core::sshd_guest::available() {
            app.guests
                .set_factory(Arc::new(crate::core::sshd_guest::SshdGuests::new(
                    Arc::downgrade(&app),
                )));
        }
        for text in &opts.fixture_yaml {
            crate::core::fixtures::load(&app, text).map_err(EmulatorError::Fixture)?;
        }
        let listener = TcpListener::bind(("127.0.0.1", opts.port)).await?;
        let port = listener.local_addr()?.port();
        *app.port.lock().unwrap_or_else(|e| e.into_inner()) = port;
        let (shutdown, shutdown_rx) = tokio::sync::watch::channel(false);
        let mut tasks = JoinSet::new();
        crate::kubevirt::export_server::start(app.clone(), shutdown_rx.clone(), &mut tasks).await?;
        crate::kubevirt::upload_server::start(app.clone(), shutdown_rx.clone(), &mut tasks).await?;
        crate::deckhouse::upload::start(app.clone(), shutdown_rx.clone(), &mut tasks).await?;
        tasks.spawn(crate::core::controllers::run(
            app.clone(),
            shutdown_rx.clone(),
        ));
        tasks.spawn(crate::core::aggregator::available::run(
            app.clone(),
            shutdown_rx.clone(),
        ));
        tasks.spawn(crate::core::guest::run(app.clone(), shutdown_rx.clone()));
        tasks.spawn(serve(
            listener,
            certs.server_config,
            app.clone(),
            shutdown_rx,
        ));
        Ok(Emulator {
            shared: Handle {
                app,
                url: format!("https://127.0.0.1:{port}"),
                ca_pem: certs.ca_pem,
            },
            shutdown,
            tasks,
        })
    }

    /// Starts an emulator on its own runtime thread, for tests that are not async.
    pub fn start_blocking(opts: EmulatorOptions) -> Result<BlockingEmulator, EmulatorError> {
        BlockingEmulator::start(opts)
    }

    /// Stops serving and the controllers.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Accepts TLS connections and serves the router until shutdown.
async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Arc<App>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let router = axum::Router::new()
        .fallback(crate::core::handlers::dispatch)
        .with_state(app);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                // As Go's net package does for every TCP connection kube-apiserver accepts.
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let router = router.clone();
                conns.spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else { return };
                    let service = hyper_util::service::TowerToHyperService::new(router);
                    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    // Errors here are client disconnects; nothing to report.
                    let _ = builder.serve_connection_with_upgrades(TokioIo::new(stream), service).await;
                });
            }
            // Reap finished connections so the set does not grow forever.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// An emulator running on its own multi-thread tokio runtime (in a background thread); the
/// same accessors as [`Emulator`], and it stops when dropped.
pub struct BlockingEmulator {
    shared: Handle,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BlockingEmulator {
    /// Starts the emulator; returns once it is listening.
    pub fn start(opts: EmulatorOptions) -> Result<BlockingEmulator, EmulatorError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kubevm-emulator".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(EmulatorError::Io(e)));
                        return;
                    }
                };
                rt.block_on(async move {
                    match Emulator::start(opts).await {
                        Ok(emu) => {
                            let shared = Handle {
                                app: emu.shared.app.clone(),
                                url: emu.url(),
                                ca_pem: emu.ca_pem(),
                            };
                            let _ = ready_tx.send(Ok(shared));
                            // Wait for Drop without blocking a runtime worker.
                            let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
                            emu.shutdown().await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
            })?;
        let shared = ready_rx
            .recv()
            .map_err(|_| EmulatorError::Tls("emulator thread died during start".into()))??;
        Ok(BlockingEmulator {
            shared,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }
}

impl std::ops::Deref for Emulator {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.shared
    }
}

impl std::ops::Deref for BlockingEmulator {
    type Target = Handle;
    fn deref(&self) -> &Handle {
        &self.shared
    }
}

impl Drop for BlockingEmulator {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
