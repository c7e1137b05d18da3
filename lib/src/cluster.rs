//! Cluster access exactly like kubectl: `--kubeconfig`, `KUBECONFIG` (a merged list of files),
//! `--context`, `--cluster`, `--user`, `-n`, impersonation and `--request-timeout`, falling back
//! to the in-cluster service account when no kubeconfig exists.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::error::{Action, Error, Result};

/// The connection choices a user makes on the command line.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// `--kubeconfig`: one file, used instead of `KUBECONFIG` and `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// `--context`: the kubeconfig context to use instead of the current one.
    pub context: Option<String>,
    /// `--cluster`: the kubeconfig cluster to use instead of the context's.
    pub cluster: Option<String>,
    /// `--user`: the kubeconfig user to use instead of the context's.
    pub user: Option<String>,
    /// `-n/--namespace`: overrides the context's namespace.
    pub namespace: Option<String>,
    /// `--as`: user to impersonate.
    pub impersonate: Option<String>,
    /// `--as-group`: groups to impersonate.
    pub impersonate_groups: Vec<String>,
    /// `--request-timeout`: limit for one request; `None` or zero means no limit.
    pub request_timeout: Option<Duration>,
    /// `--insecure-skip-tls-verify`: do not verify the server's certificate.
    pub insecure_skip_tls_verify: bool,
    /// `-v N`: log requests (level 6 and up) through this.
    pub http_log: Option<crate::http_log::HttpLog>,
}

/// A connected cluster: the client plus what the user's choices resolved to.
#[derive(Clone)]
pub struct Cluster {
    /// The API client.
    pub client: Client,
    /// The namespace to work in: `-n`, else the context's, else `default`.
    pub namespace: String,
    /// Whether `namespace` came from `-n` (and so must agree with a target's namespace).
    pub namespace_from_flag: bool,
    /// The API server address.
    pub server: String,
    /// The kubeconfig context in use (`None` in a pod).
    pub context: Option<String>,
    /// The resolved client configuration (credentials and CA), for talking to servers other
    /// than the API server with the same identity (e.g. export servers).
    pub config: Config,
}

impl Cluster {
    /// Connect as the options say. Only reads local files: no request is sent yet.
    pub async fn connect(options: &ConnectOptions) -> Result<Cluster> {
        let (mut config, context) = match load_kubeconfig(options.kubeconfig.as_deref())? {
            Some(kubeconfig) => {
                let context = check_selection(&kubeconfig, options)?;
                let kube_options = KubeConfigOptions {
                    context: options.context.clone(),
                    cluster: options.cluster.clone(),
                    user: options.user.clone(),
                };
                let config = Config::from_custom_kubeconfig(kubeconfig, &kube_options)
                    .await
                    .map_err(config_error)?;
                (config, Some(context))
            }
            None => {
                let config = Config::incluster().map_err(|_| {
                    match std::env::var("KUBECONFIG").ok().filter(|v| !v.is_empty()) {
                        // Every file KUBECONFIG lists is missing: name them.
                        Some(list) => Error::Usage(format!(
                            "no kubeconfig found: KUBECONFIG names {list}, which does not exist; fix KUBECONFIG or pass --kubeconfig"
                        )),
                        None => Error::Config(
                            "no kubeconfig found: pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config"
                                .into(),
                        ),
                    }
                })?;
                (config, None)
            }
        };
        if let Some(user) = &options.impersonate {
            config.auth_info.impersonate = Some(user.clone());
        }
        if !options.impersonate_groups.is_empty() {
            config.auth_info.impersonate_groups = Some(options.impersonate_groups.clone());
        }
        if let Some(timeout) = options.request_timeout.filter(|t| !t.is_zero()) {
            config.read_timeout = Some(timeout);
            config.write_timeout = Some(timeout);
            config.connect_timeout =
                Some(config.connect_timeout.map_or(timeout, |c| c.min(timeout)));
        }
        if options.insecure_skip_tls_verify {
            config.accept_invalid_certs = true;
        }
        let server = config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_owned();
        let (namespace, namespace_from_flag) = match &options.namespace {
            Some(ns) => {
                crate::target::validate_namespace(ns)?;
                (ns.clone(), true)
            }
            None => (config.default_namespace.clone(), false),
        };
        config.headers.push((
            http::header::USER_AGENT,
            http::HeaderValue::from_str(&user_agent()).expect("a plain ASCII user agent"),
        ));
        // kube's default retry repeats a 429/503/504 up to 15 times with a backoff that grows
        // to minutes, and below the request log: an aggregated API that is down (503) hung a
        // command silently. kubectl does not retry those either; the server's answer is shown.
        config.default_retry = false;
        let builder = kube::client::ClientBuilder::try_from(config.clone())
            .map_err(|e| Error::Config(format!("cannot set up the API client: {e}")))?;
        let client: Client = match options.http_log.clone().filter(|log| log.level >= 6) {
            Some(log) => builder
                .with_layer(&crate::http_log::HttpLogLayer::new(log, server.clone()))
                .build(),
            None => builder.build(),
        };
        Ok(Cluster {
            client,
            namespace,
            namespace_from_flag,
            server,
            context,
            config,
        })
    }

    /// Turns an object's NotFound into `namespace "x" not found` when the namespace itself is
    /// missing. A GET of an object in a missing namespace is answered NotFound for the object
    /// (the registry only looks its key up, k8s.io/apiserver/pkg/registry/generic/registry/
    /// store.go `Get`), so ask once more; any other answer (403 for users who may not read
    /// namespaces) leaves `err` as it is.
    pub async fn explain_not_found(&self, err: Error, namespace: &str) -> Error {
        if !err.is_not_found() {
            return err;
        }
        let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(self.client.clone());
        match namespaces.get_opt(namespace).await {
            Ok(None) => Error::NotFound {
                kind: "namespace".into(),
                name: namespace.to_owned(),
                namespace: None,
            },
            _ => err,
        }
    }

    /// Classify a client error, naming this cluster's server when it was unreachable.
    pub fn error(&self, err: kube::Error, action: &Action) -> Error {
        Error::from_kube_at(err, action, &self.server)
    }
}

/// A kubeconfig that names unusable files, worded with the path once (kube's own message
/// quotes it twice: `failed to read file '"/x/ca.crt"'`).
fn config_error(err: kube::config::KubeconfigError) -> Error {
    use kube::config::{KubeconfigError as K, LoadDataError as D};
    let (what, data) = match &err {
        K::LoadCertificateAuthority(d) => ("certificate authority", d),
        K::LoadClientCertificate(d) => ("client certificate", d),
        K::LoadClientKey(d) => ("client key", d),
        _ => return Error::Config(crate::error::one_line(&format!("kubeconfig: {err}"))),
    };
    match data {
        D::ReadFile(io, path) => Error::Config(format!(
            "kubeconfig: cannot read the {what} file {}: {io}",
            path.display()
        )),
        other => Error::Config(crate::error::one_line(&format!(
            "kubeconfig: cannot load the {what}: {other}"
        ))),
    }
}

/// The User-Agent of every request, shaped like kubectl's: `kubectl-vm/VERSION (OS/ARCH)`,
/// with Go's names for the platform (`linux/amd64`, `darwin/arm64`) as the API server's
/// audit log and metrics show them for kubectl.
pub fn user_agent() -> String {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    };
    format!("kubectl-vm/{} ({os}/{arch})", env!("CARGO_PKG_VERSION"))
}

/// Read the kubeconfig the way kubectl does: `--kubeconfig` (must exist), else every existing
/// file listed in `KUBECONFIG` merged (missing ones are skipped), else `~/.kube/config`.
/// `Ok(None)` means there is none at all.
pub fn load_kubeconfig(explicit: Option<&Path>) -> Result<Option<Kubeconfig>> {
    if let Some(path) = explicit {
        if !path.exists() {
            return Err(Error::Usage(format!(
                "kubeconfig file {} does not exist",
                path.display()
            )));
        }
        return read_file(path).map(Some);
    }
    if let Some(list) = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        let mut merged: Option<Kubeconfig> = None;
        for path in std::env::split_paths(&list).filter(|p| p.exists()) {
            let next = read_file(&path)?;
            merged = Some(match merged {
                None => next,
                Some(acc) => acc
                    .merge(next)
                    .map_err(|e| Error::Config(format!("cannot merge KUBECONFIG files: {e}")))?,
            });
        }
        return Ok(merged);
    }
    match std::env::home_dir().map(|home| home.join(".kube").join("config")) {
        Some(path) if path.exists() => read_file(&path).map(Some),
        _ => Ok(None),
    }
}

fn read_file(path: &Path) -> Result<Kubeconfig> {
    Kubeconfig::read_from(path).map_err(|e| {
        let reason = match e {
            kube::config::KubeconfigError::Parse(inner) => {
                format!("not a valid kubeconfig: {inner}")
            }
            kube::config::KubeconfigError::ReadConfig(inner, _) => inner.to_string(),
            other => other.to_string(),
        };
        Error::Config(crate::error::one_line(&format!(
            "cannot read kubeconfig {}: {reason}",
            path.display()
        )))
    })
}

/// Check that the chosen context, cluster and user exist, so the error can list the real
/// choices instead of kube's generic one. Returns the context name in use.
fn check_selection(kubeconfig: &Kubeconfig, options: &ConnectOptions) -> Result<String> {
    let contexts: Vec<&str> = kubeconfig
        .contexts
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let context = match (&options.context, &kubeconfig.current_context) {
        (Some(name), _) => name.clone(),
        (None, Some(name)) if !name.is_empty() => name.clone(),
        _ if options.cluster.is_some() => String::new(),
        _ => {
            return Err(Error::Config(format!(
                "no current context is set in the kubeconfig; pass --context ({})",
                choices(&contexts)
            )));
        }
    };
    if !context.is_empty() && !contexts.contains(&context.as_str()) {
        return Err(Error::Config(format!(
            "context {context:?} not found in the kubeconfig ({})",
            choices(&contexts)
        )));
    }
    if let Some(cluster) = &options.cluster {
        let names: Vec<&str> = kubeconfig
            .clusters
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        if !names.contains(&cluster.as_str()) {
            return Err(Error::Config(format!(
                "cluster {cluster:?} not found in the kubeconfig ({})",
                choices(&names)
            )));
        }
    }
    if let Some(user) = &options.user {
        let names: Vec<&str> = kubeconfig
            .auth_infos
            .iter()
            .map(|u| u.name.as_str())
            .collect();
        if !names.contains(&user.as_str()) {
            return Err(Error::Config(format!(
                "user {user:?} not found in the kubeconfig ({})",
                choices(&names)
            )));
        }
    }
    Ok(context)
}

fn choices(names: &[&str]) -> String {
    if names.is_empty() {
        "it defines none".into()
    } else {
        format!("available: {}", names.join(", "))
    }
}

/// Context names of the kubeconfig the options point at, for completion. Never fails.
pub fn context_names(explicit: Option<&Path>) -> Vec<String> {
    match load_kubeconfig(explicit) {
        Ok(Some(kubeconfig)) => kubeconfig.contexts.into_iter().map(|c| c.name).collect(),
        _ => Vec::new(),
    }
}

/// Parse a kubectl-style duration (`30s`, `2m`, `1h30m`, `500ms`, or a bare number of
/// seconds; `0` means no limit).
pub fn parse_duration(text: &str) -> std::result::Result<Duration, String> {
    let bad =
        || format!("invalid duration {text:?}: use a number with a unit, like 30s, 2m or 1h30m");
    if text.is_empty() {
        return Err(bad());
    }
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if digits == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += Duration::from_secs_f64(value * factor);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_CONTEXTS: &str = r#"
apiVersion: v1
kind: Config
clusters:
- name: one
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: admin
  user: {token: abc}
contexts:
- name: a
  context: {cluster: one, user: admin, namespace: team}
- name: b
  context: {cluster: one, user: admin}
current-context: a
"#;

    fn kubeconfig() -> Kubeconfig {
        Kubeconfig::from_yaml(TWO_CONTEXTS).unwrap()
    }

    #[test]
    fn unknown_context_lists_the_real_ones() {
        let options = ConnectOptions {
            context: Some("prod".into()),
            ..Default::default()
        };
        let err = check_selection(&kubeconfig(), &options).unwrap_err();
        assert_eq!(
            err.to_string(),
            "context \"prod\" not found in the kubeconfig (available: a, b)"
        );
    }

    #[test]
    fn unknown_user_and_cluster_are_refused() {
        let options = ConnectOptions {
            user: Some("root".into()),
            ..Default::default()
        };
        assert!(
            check_selection(&kubeconfig(), &options)
                .unwrap_err()
                .to_string()
                .contains("user \"root\" not found")
        );
        let options = ConnectOptions {
            cluster: Some("two".into()),
            ..Default::default()
        };
        assert!(
            check_selection(&kubeconfig(), &options)
                .unwrap_err()
                .to_string()
                .contains("cluster \"two\" not found")
        );
    }

    #[test]
    fn current_context_is_the_default() {
        assert_eq!(
            check_selection(&kubeconfig(), &ConnectOptions::default()).unwrap(),
            "a"
        );
    }

    #[tokio::test]
    async fn namespace_precedence_is_flag_then_context_then_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, TWO_CONTEXTS).unwrap();
        let mut options = ConnectOptions {
            kubeconfig: Some(path),
            ..Default::default()
        };
        let cluster = Cluster::connect(&options).await.unwrap();
        assert_eq!(
            (cluster.namespace.as_str(), cluster.namespace_from_flag),
            ("team", false)
        );
        options.context = Some("b".into());
        assert_eq!(
            Cluster::connect(&options).await.unwrap().namespace,
            "default"
        );
        options.namespace = Some("prod".into());
        let cluster = Cluster::connect(&options).await.unwrap();
        assert_eq!(
            (cluster.namespace.as_str(), cluster.namespace_from_flag),
            ("prod", true)
        );
    }

    #[test]
    fn missing_explicit_kubeconfig_is_an_error() {
        let err = load_kubeconfig(Some(Path::new("/nonexistent/kubeconfig"))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "kubeconfig file /nonexistent/kubeconfig does not exist"
        );
    }

    #[test]
    fn durations_like_kubectl() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5x").is_err());
    }
}
