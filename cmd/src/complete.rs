//! Dynamic shell completion: VM names, namespaces and contexts, for `kubectl-vm` itself
//! (`COMPLETE=bash kubectl-vm -- …`, registered by `kubectl vm completion bash`) and for
//! kubectl's plugin completion, which runs `kubectl_complete-vm ARGS… WORD`.
//!
//! clap's completers only see the word being completed, so the connection flags already
//! typed (`--context`, `-n`, `--kubeconfig`) are read from the raw words first. Cluster
//! lookups get about a second; on any failure they complete nothing and print nothing.

use std::ffi::{OsStr, OsString};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use clap_complete::CompleteEnv;
use clap_complete::CompletionCandidate;
use kubevm::cluster::{Cluster, ConnectOptions};
use kubevm::flavor::{self, FlavorChoice};
use kubevm::vm::{self, Scope};

/// Environment variable that switches `kubectl-vm` into completion mode.
pub const COMPLETE_VAR: &str = "COMPLETE";
/// The program kubectl runs to complete `kubectl vm …`.
pub const KUBECTL_COMPLETER: &str = "kubectl_complete-vm";
/// How long a completion may wait for the cluster.
const CLUSTER_BUDGET: Duration = Duration::from_millis(1000);

/// The binary's name, which shells register completions for.
pub fn binary_name() -> &'static str {
    "kubectl-vm"
}

/// The words of the command line being completed, program name first, current word last.
static WORDS: OnceLock<Vec<String>> = OnceLock::new();

/// Whether this process was started as `kubectl_complete-vm`.
pub fn invoked_as_kubectl_completer() -> bool {
    std::env::args_os()
        .next()
        .as_deref()
        .and_then(|arg0| {
            std::path::Path::new(arg0)
                .file_stem()
                .map(OsStr::to_os_string)
        })
        .is_some_and(|stem| stem == KUBECTL_COMPLETER)
}

/// Answer kubectl: one candidate per line (`value<TAB>description`), then `:<directive>`.
/// `command` builds the command line definition to complete against.
pub fn run_kubectl_completer(command: fn() -> clap::Command) -> ExitCode {
    let mut words = vec![binary_name().to_owned()];
    words.extend(std::env::args().skip(1));
    if words.len() == 1 {
        words.push(String::new());
    }
    let _ = WORDS.set(words.clone());
    let previous = &words[words.len() - 2];
    if previous == "--kubeconfig" {
        // Directive 0: let the shell complete file names.
        println!(":0");
        return ExitCode::SUCCESS;
    }
    let index = words.len() - 1;
    // Like cobra, offer flags only once the user has typed a dash.
    let offer_flags = words[index].starts_with('-');
    let args: Vec<OsString> = words.into_iter().map(OsString::from).collect();
    let cwd = std::env::current_dir().ok();
    let candidates = clap_complete::engine::complete(&mut command(), args, index, cwd.as_deref())
        .unwrap_or_default();
    let mut out = String::new();
    let visible = candidates
        .iter()
        .filter(|c| !c.is_hide_set())
        .filter(|c| offer_flags || !c.get_value().to_string_lossy().starts_with('-'));
    for candidate in visible {
        out.push_str(&candidate.get_value().to_string_lossy());
        if let Some(help) = candidate.get_help() {
            let help = help.to_string();
            if let Some(first) = help.lines().next() {
                out.push('\t');
                out.push_str(first);
            }
        }
        out.push('\n');
    }
    // Directive 4: no file completion.
    out.push_str(":4\n");
    print!("{out}");
    ExitCode::SUCCESS
}

/// If the shell asked for completions (`COMPLETE=SHELL kubectl-vm -- WORDS…`), answer and
/// exit; otherwise return and let the program run normally. `command` builds the command
/// line definition to complete against.
pub fn handle_shell_request(command: fn() -> clap::Command) {
    if std::env::var_os(COMPLETE_VAR).is_none_or(|v| v.is_empty() || v == "0") {
        return;
    }
    let words: Vec<String> = std::env::args().skip_while(|a| a != "--").skip(1).collect();
    let _ = WORDS.set(words);
    CompleteEnv::with_factory(command)
        .var(COMPLETE_VAR)
        .bin(binary_name())
        .completer(binary_name())
        .complete();
}

/// The connection flags among the words typed so far (the current word excluded).
fn typed_connection() -> (ConnectOptions, FlavorChoice) {
    let words = WORDS.get().map(Vec::as_slice).unwrap_or_default();
    let typed = &words[..words.len().saturating_sub(1)];
    let mut options = ConnectOptions::default();
    let mut flavor = FlavorChoice::Auto;
    let mut i = 1;
    while i < typed.len() {
        let word = typed[i].as_str();
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_owned())),
            _ if word.starts_with("-n") && word.len() > 2 => ("-n", Some(word[2..].to_owned())),
            _ => (word, None),
        };
        let takes_value = matches!(
            flag,
            "--kubeconfig"
                | "--context"
                | "--cluster"
                | "--user"
                | "-n"
                | "--namespace"
                | "--flavor"
        );
        if !takes_value {
            i += 1;
            continue;
        }
        let value = match inline {
            Some(value) => value,
            None => {
                i += 1;
                match typed.get(i) {
                    Some(value) => value.clone(),
                    None => break,
                }
            }
        };
        match flag {
            "--kubeconfig" => options.kubeconfig = Some(value.into()),
            "--context" => options.context = Some(value),
            "--cluster" => options.cluster = Some(value),
            "--user" => options.user = Some(value),
            "-n" | "--namespace" => options.namespace = Some(value),
            _ => flavor = value.parse().unwrap_or_default(),
        }
        i += 1;
    }
    options.request_timeout = Some(CLUSTER_BUDGET);
    (options, flavor)
}

/// Run a cluster lookup within the completion budget; `None` on error or timeout.
fn with_cluster<T>(lookup: impl AsyncFnOnce(Cluster, FlavorChoice) -> Option<T>) -> Option<T> {
    let (options, flavor) = typed_connection();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    runtime.block_on(async {
        tokio::time::timeout(CLUSTER_BUDGET, async {
            let cluster = Cluster::connect(&options).await.ok()?;
            lookup(cluster, flavor).await
        })
        .await
        .ok()
        .flatten()
    })
}

fn matching(
    current: &OsStr,
    items: impl IntoIterator<Item = (String, Option<String>)>,
) -> Vec<CompletionCandidate> {
    let prefix = current.to_string_lossy();
    items
        .into_iter()
        .filter(|(value, _)| value.starts_with(prefix.as_ref()))
        .map(|(value, help)| CompletionCandidate::new(value).help(help.map(Into::into)))
        .collect()
}

/// VM names in the namespace the command line selects.
pub fn vm_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let names = with_cluster(async |cluster, choice| {
        let platform = flavor::discover(&cluster, choice).await.ok()?;
        let scope = Scope::Namespace(cluster.namespace.clone());
        let list = vm::list(&cluster, &platform, &scope, None).await.ok()?;
        Some(
            list.items
                .into_iter()
                .map(|vm| {
                    let help = match &vm.node {
                        Some(node) => format!("{} on {node}", vm.status),
                        None => vm.status.clone(),
                    };
                    (vm.name, Some(help))
                })
                .collect::<Vec<_>>(),
        )
    });
    matching(current, names.unwrap_or_default())
}

/// Disks that can be attached in the namespace the command line selects: KubeVirt
/// DataVolumes and PVCs (bare names), Deckhouse VirtualDisks (bare), `vi/NAME` and `cvi/NAME`.
pub fn disk_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let names = with_cluster(async |cluster, choice| {
        let platform = flavor::discover(&cluster, choice).await.ok()?;
        Some(with_kinds(
            kubevm::disk::attachable_names(&cluster, platform.flavor).await,
        ))
    });
    matching(current, names.unwrap_or_default())
}

/// Secondary networks a VM can attach to in the namespace the command line selects: KubeVirt's
/// NetworkAttachmentDefinitions (none listed on a platform without them).
pub fn network_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let names = with_cluster(async |cluster, choice| {
        let platform = flavor::discover(&cluster, choice).await.ok()?;
        Some(with_kinds(
            kubevm::network::attachment_names(&cluster, platform.flavor).await,
        ))
    });
    matching(current, names.unwrap_or_default())
}

/// Names with their kind as the candidates' help.
fn with_kinds(names: Vec<(String, &'static str)>) -> Vec<(String, Option<String>)> {
    names
        .into_iter()
        .map(|(name, kind)| (name, Some(kind.to_owned())))
        .collect()
}

/// Images in the namespace the command line selects (and cluster-wide ones), as `ds/NAME`,
/// `vi/NAME` or `cvi/NAME`, with their phase.
pub fn image_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let names = with_cluster(async |cluster, choice| {
        let platform = flavor::discover(&cluster, choice).await.ok()?;
        let mut out: Vec<(String, Option<String>)> = Vec::new();
        let mut on_page = |page: Vec<kubevm::image::Image>| -> kubevm::Result<()> {
            for i in page {
                out.push((
                    format!("{}/{}", i.kind.short(), i.name),
                    Some(i.phase_cell()),
                ));
            }
            Ok(())
        };
        kubevm::image::catalog(platform.flavor)
            .list(&cluster, Some(&cluster.namespace), None, &mut on_page)
            .await
            .ok()?;
        Some(out)
    });
    matching(current, names.unwrap_or_default())
}

/// Snapshot names in the namespace the command line selects, with their VM.
pub fn snapshot_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let names = with_cluster(async |cluster, choice| {
        let platform = flavor::discover(&cluster, choice).await.ok()?;
        let rows =
            kubevm::snapshot::list(&cluster, platform.flavor, Some(&cluster.namespace), None)
                .await
                .ok()?;
        Some(
            rows.into_iter()
                .map(|s| (s.name, Some(format!("of {} ({})", s.vm, s.phase))))
                .collect::<Vec<_>>(),
        )
    });
    matching(current, names.unwrap_or_default())
}

/// The cluster's node labels as `KEY=VALUE`, each with the number of nodes carrying it (for
/// `--node-selector` and `--node-affinity`; node metadata only).
pub fn node_labels(current: &OsStr) -> Vec<CompletionCandidate> {
    let labels = with_cluster(async |cluster, _| {
        let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(cluster.client);
        let list = api.list_metadata(&Default::default()).await.ok()?;
        Some(label_counts(
            list.items.into_iter().filter_map(|n| n.metadata.labels),
        ))
    });
    matching(current, labels.unwrap_or_default())
}

/// `KEY=VALUE` of every label of these nodes, sorted, with how many nodes carry it.
fn label_counts(
    nodes: impl Iterator<Item = std::collections::BTreeMap<String, String>>,
) -> Vec<(String, Option<String>)> {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for labels in nodes {
        for (key, value) in labels {
            *counts.entry(format!("{key}={value}")).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .map(|(label, n)| {
            let help = if n == 1 {
                "1 node".to_owned()
            } else {
                format!("{n} nodes")
            };
            (label, Some(help))
        })
        .collect()
}

/// Namespace names.
pub fn namespaces(current: &OsStr) -> Vec<CompletionCandidate> {
    let names = with_cluster(async |cluster, _| {
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(cluster.client.clone());
        let list = api.list_metadata(&Default::default()).await.ok()?;
        Some(
            list.items
                .into_iter()
                .filter_map(|ns| ns.metadata.name)
                .map(|name| (name, None))
                .collect::<Vec<_>>(),
        )
    });
    matching(current, names.unwrap_or_default())
}

/// Secret names in the namespace the command line selects (metadata only: no Secret data is
/// read).
pub fn secret_names(current: &OsStr) -> Vec<CompletionCandidate> {
    let names = with_cluster(async |cluster, _| {
        let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
            kube::Api::namespaced(cluster.client.clone(), &cluster.namespace);
        let list = api.list_metadata(&Default::default()).await.ok()?;
        Some(
            list.items
                .into_iter()
                .filter_map(|s| s.metadata.name)
                .map(|name| (name, None))
                .collect::<Vec<_>>(),
        )
    });
    matching(current, names.unwrap_or_default())
}

/// Context names from the kubeconfig (no network).
pub fn contexts(current: &OsStr) -> Vec<CompletionCandidate> {
    let (options, _) = typed_connection();
    let names = kubevm::cluster::context_names(options.kubeconfig.as_deref());
    matching(current, names.into_iter().map(|n| (n, None)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_flags_are_found_in_every_form() {
        let _ = WORDS.set(
            [
                "kubectl-vm",
                "get",
                "--context=prod",
                "-n",
                "dev",
                "--kubeconfig",
                "/k",
                "--flavor=deckhouse",
                "we",
            ]
            .map(String::from)
            .to_vec(),
        );
        let (options, flavor) = typed_connection();
        assert_eq!(options.context.as_deref(), Some("prod"));
        assert_eq!(options.namespace.as_deref(), Some("dev"));
        assert_eq!(
            options.kubeconfig.as_deref(),
            Some(std::path::Path::new("/k"))
        );
        assert_eq!(flavor, FlavorChoice::Fixed(kubevm::Flavor::Deckhouse));
    }

    #[test]
    fn node_labels_are_counted_per_key_and_value() {
        let node = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let labels = super::label_counts(
            [
                node(&[("kubernetes.io/hostname", "node-1"), ("zone", "a")]),
                node(&[("kubernetes.io/hostname", "node-2"), ("zone", "a")]),
            ]
            .into_iter(),
        );
        let shown: Vec<(&str, &str)> = labels
            .iter()
            .map(|(l, h)| (l.as_str(), h.as_deref().unwrap()))
            .collect();
        assert_eq!(
            shown,
            [
                ("kubernetes.io/hostname=node-1", "1 node"),
                ("kubernetes.io/hostname=node-2", "1 node"),
                ("zone=a", "2 nodes")
            ]
        );
    }
}
