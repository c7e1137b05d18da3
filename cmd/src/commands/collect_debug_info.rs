//! `kubectl vm collect-debug-info VM`: one tar.gz archive explaining a misbehaving VM, to stdout
//! (only when redirected) or to `-o FILE` (0600, written as `FILE.partial` then renamed).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use clap_complete::engine::ArgValueCompleter;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kubevm::debug_info::{self, Options, Progress};
use kubevm::target::{Target, TargetKind};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// Arguments of `collect-debug-info`.
#[derive(Debug, Args)]
#[command(
    after_help = "Gathers the VM and everything related to it (VMI or internal objects, operations and migrations,\nblock devices with their PVCs, PVs and StorageClasses, pods with every container's current and\nprevious log, events of all of them, the domain XML, guest agent data, nodes, versions) into one\ntar.gz with summary.txt (read it first), errors.txt and manifest.json. Secrets are masked\nunless --include-secrets (the user-data Secret the VM references is read only to learn its\n--env values); no Secret object goes in the bundle. Objects you may not read are listed in\nerrors.txt; only the VM itself is required.\n\nExamples:\n  kubectl vm collect-debug-info web > debug-info.tar.gz\n  kubectl vm collect-debug-info web.prod -o web-debug.tar.gz --since 2h\n  kubectl vm collect-debug-info web --tail 500 -o - | tar tzf -"
)]
pub struct CollectDebugInfoArgs {
    /// The VM: NAME, NAME.NAMESPACE or vm/NAME[/NAMESPACE]
    #[arg(value_name = "VM", add = ArgValueCompleter::new(complete::vm_names))]
    pub target: String,

    /// Write the archive to FILE (mode 0600) instead of stdout; `-` is stdout
    #[arg(short, long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub output: Option<PathBuf>,

    /// Only log lines newer than this, e.g. 1h, 30m (0: no limit)
    #[arg(long, value_name = "DURATION", value_parser = kubevm::cluster::parse_duration)]
    pub since: Option<Duration>,

    /// Last lines of each container log (-1: all)
    #[arg(
        long,
        value_name = "LINES",
        default_value_t = 10_000,
        allow_negative_numbers = true
    )]
    pub tail: i64,

    /// Do not mask cloud-init user data, env values, passwords, tokens and keys
    #[arg(long)]
    pub include_secrets: bool,
}

/// Where the archive goes.
enum Destination {
    Stdout,
    File { path: PathBuf, partial: PathBuf },
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    path.with_file_name(name)
}

fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its mode on open: make sure it is private.
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

pub async fn cmd_collect_debug_info(
    global: &GlobalArgs,
    args: CollectDebugInfoArgs,
) -> CommandResult {
    let (target, destination) = check_args(&args)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let namespace = target.namespace_in(&cluster.namespace, cluster.namespace_from_flag)?;
    if args.include_secrets {
        eprintln!(
            "Warning: --include-secrets: nothing is masked; the archive holds user data, env values, passwords and tokens in clear text"
        );
    }
    let options = Options {
        tail_lines: (args.tail >= 0).then_some(args.tail),
        since: args.since.filter(|d| !d.is_zero()),
        include_secrets: args.include_secrets,
        exec_timeout: exec_timeout(),
        ..Options::default()
    };

    let (bar, progress) = progress_reporter(&target.name, &namespace);

    let dest = match destination {
        None => Destination::Stdout,
        Some(path) => Destination::File {
            partial: partial_path(&path),
            path,
        },
    };
    let outcome = match &dest {
        Destination::Stdout => {
            debug_info::collect(
                &cluster,
                &platform,
                &target.name,
                &namespace,
                options,
                std::io::stdout(),
                progress,
            )
            .await
        }
        Destination::File { partial, .. } => {
            let file = open_private(partial).map_err(|e| {
                CommandError::Failed(format!("cannot create {}: {e}", partial.display()))
            })?;
            debug_info::collect(
                &cluster,
                &platform,
                &target.name,
                &namespace,
                options,
                std::io::BufWriter::new(file),
                progress,
            )
            .await
        }
    };
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            if let Destination::File { partial, .. } = &dest {
                let _ = std::fs::remove_file(partial);
            }
            return Err(e.into());
        }
    };
    let where_to = match &dest {
        Destination::Stdout => "stdout".to_owned(),
        Destination::File { path, partial } => {
            std::fs::rename(partial, path).map_err(|e| {
                CommandError::Failed(format!(
                    "cannot rename {} to {}: {e}",
                    partial.display(),
                    path.display()
                ))
            })?;
            path.display().to_string()
        }
    };
    let skipped = if outcome.errors.is_empty() {
        String::new()
    } else {
        format!(
            "; {} item(s) not collected, see errors.txt",
            outcome.errors.len()
        )
    };
    eprintln!(
        "Wrote {} files ({} KiB) for {}/{} to {where_to}{skipped}",
        outcome.files,
        outcome.bytes.div_ceil(1024),
        namespace,
        target.name,
    );
    Ok(())
}

/// The target and the archive's destination (`None`: stdout), checked before any request.
fn check_args(args: &CollectDebugInfoArgs) -> CommandResult<(Target, Option<PathBuf>)> {
    let target = Target::parse(&args.target, false)?;
    if target.kind == TargetKind::Vmi {
        return Err(CommandError::usage(format!(
            "collect-debug-info takes a VM (NAME or vm/NAME), not {}",
            args.target
        )));
    }
    if args.tail < -1 {
        return Err(CommandError::usage(format!(
            "--tail must be -1 (all lines) or more, not {}",
            args.tail
        )));
    }
    let destination = match args.output.as_deref() {
        None => None,
        Some(p) if p == Path::new("-") => None,
        Some(p) => Some(p.to_path_buf()),
    };
    if destination.is_none() && std::io::stdout().is_terminal() {
        return Err(CommandError::usage(format!(
            "refusing to write a binary archive to the terminal; redirect it (kubectl vm collect-debug-info {} > debug-info.tar.gz) or use -o FILE",
            args.target
        )));
    }
    Ok((target, destination))
}

/// A spinner with the count of files collected (on a terminal) and the warnings, as the
/// collection's progress callback.
fn progress_reporter(
    name: &str,
    namespace: &str,
) -> (
    Option<ProgressBar>,
    impl Fn(Progress) + Send + Sync + 'static,
) {
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} collecting {prefix}: {pos} files {wide_msg}")
                .expect("valid template"),
        );
        bar.set_prefix(format!("{name}.{namespace}"));
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    });
    let shared = Arc::new(bar.clone());
    let progress = move |event: Progress| match event {
        Progress::File { path, done } => {
            if let Some(bar) = shared.as_ref() {
                bar.set_position(done as u64);
                bar.set_message(path);
            }
        }
        Progress::Warning(message) => match shared.as_ref() {
            Some(bar) => bar.println(format!("Warning: {message}")),
            None => eprintln!("Warning: {message}"),
        },
    };
    (bar, progress)
}

/// How long the domain-XML exec may take: [`debug_info::EXEC_TIMEOUT`], or
/// `KUBECTL_VM_EXEC_TIMEOUT` (a duration such as `2s`). Test-only: tests cannot wait 30 s to
/// see a hung exec given up.
fn exec_timeout() -> std::time::Duration {
    std::env::var("KUBECTL_VM_EXEC_TIMEOUT")
        .ok()
        .and_then(|v| kubevm::cluster::parse_duration(&v).ok())
        .unwrap_or(debug_info::EXEC_TIMEOUT)
}
