//! `kubectl vm export TARGET -o FILE`: disks, snapshots and PVCs out of the cluster, verified
//! and resumable. The library does the work; this module checks flags and renders events
//! (progress bar on a terminal, a plain line every few seconds otherwise).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use kubevm::export::{self, Algo, Event, Expected, ExportOptions, Format, Output, Source};
use kubevm::flavor::FlavorChoice;

use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// Arguments of `export`.
#[derive(Debug, Args)]
#[command(
    after_help = "Creates the export object (KubeVirt: a VirtualMachineExport with its token Secret; Deckhouse: a\nDataExport), waits until it is ready, downloads raw data with HTTP Range (retrying and resuming\nby itself), verifies it, and deletes what it created only after success. The file is FILE.partial\nuntil complete and verified; FILE.sha256 is written next to it in the sha256sum format. On failure\nthe export is kept and the message says how to resume (--reuse NAME --resume).\n\nExamples:\n  kubectl vm export vm/web -o web-disks/              # every volume of a stopped VM\n  kubectl vm export pvc/data -o data.img --checksum sha256:<hex>\n  kubectl vm export vd/linux-disk -o linux.img        # Deckhouse\n  kubectl vm export vm/web --volume rootdisk -o - | qemu-img convert -O qcow2 /dev/stdin web.qcow2\n  kubectl vm export vm/web --manifest > web.yaml\n  kubectl vm export pvc/data -o data.img --reuse export-pvc-data-x7k2p --resume"
)]
pub struct ExportArgs {
    /// What to export: vm/NAME, vmsnapshot/NAME, pvc/NAME (KubeVirt); vd/NAME, vds/NAME,
    /// pvc/NAME (Deckhouse). A bare NAME is vm/NAME on KubeVirt and vd/NAME on Deckhouse
    #[arg(value_name = "TARGET")]
    pub target: String,

    /// Output file (a directory for several volumes); `-` writes to stdout (not a terminal)
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<String>,

    /// Print the VM's manifest from the export instead of downloading disks (KubeVirt)
    #[arg(long, conflicts_with_all = ["volume", "checksum", "resume", "decompress"])]
    pub manifest: bool,

    /// Only this volume of the VM
    #[arg(long, value_name = "NAME")]
    pub volume: Option<String>,

    /// Wire format: raw (resumable) or gzip (the server compresses on the fly; no resume)
    #[arg(long, value_name = "FORMAT", default_value = "raw", value_parser = ["raw", "gzip"])]
    pub format: String,

    /// Fetch gzip and unpack it while writing (for servers that only offer gzip)
    #[arg(long, conflicts_with = "format")]
    pub decompress: bool,

    /// Verify the data: ALGO:HEX (sha256, sha512, sha1, md5); a mismatch fails
    #[arg(long, value_name = "ALGO:HEX")]
    pub checksum: Option<String>,

    /// Checksum computed while streaming, printed and written to FILE.<algo>
    #[arg(long, value_name = "ALGO", default_value = "sha256", value_parser = ["sha256", "sha512", "sha1", "md5"])]
    pub checksum_algo: String,

    /// Keep the export object after a successful download
    #[arg(long, conflicts_with = "reuse")]
    pub keep: bool,

    /// Use an existing export object (e.g. one kept by a failed run) instead of creating one
    #[arg(long, value_name = "NAME")]
    pub reuse: Option<String>,

    /// Continue FILE.partial left by an earlier run (validated against the server's ETag and size)
    #[arg(long)]
    pub resume: bool,

    /// Lifetime of the export object (KubeVirt ttlDuration; Deckhouse idle TTL)
    #[arg(long, value_name = "DURATION", default_value = "2h", value_parser = kubevm::cluster::parse_duration)]
    pub ttl: Duration,

    /// Do not verify the export server's TLS certificate (insecure; refused on Deckhouse, whose exporter takes your cluster credentials)
    #[arg(long)]
    pub insecure: bool,

    /// How long to wait for the export to become ready
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = kubevm::cluster::parse_duration)]
    pub timeout: Duration,

    /// Retries per volume after errors worth retrying (network, 5xx)
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub retries: u32,

    /// First retry delay (doubles up to 8s)
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = kubevm::cluster::parse_duration, hide = true)]
    pub retry_delay: Duration,
}

/// Checks the flags before any request; exit 2 on bad input.
fn options(args: &ExportArgs) -> CommandResult<(Option<&'static str>, String, ExportOptions)> {
    let (prefix, name) = Source::parse(&args.target)?;
    let output = match (&args.output, args.manifest) {
        (_, true) => Output::Manifest,
        (Some(o), false) if o == "-" => Output::Stdout,
        (Some(o), false) => Output::Path(PathBuf::from(o)),
        (None, false) => {
            return Err(CommandError::usage(
                "export needs -o FILE (or -o - for stdout, or --manifest)",
            ));
        }
    };
    if args.manifest && args.output.as_deref().is_some_and(|o| o != "-") {
        return Err(CommandError::usage(
            "--manifest prints to stdout: redirect it instead of -o",
        ));
    }
    if output == Output::Stdout {
        if std::io::stdout().is_terminal() {
            return Err(CommandError::usage(
                "refusing to write disk data to a terminal: redirect stdout or use -o FILE",
            ));
        }
        if args.resume {
            return Err(CommandError::usage("--resume needs -o FILE, not -o -"));
        }
    }
    let algo: Algo = args.checksum_algo.parse().map_err(CommandError::Usage)?;
    let expected = args
        .checksum
        .as_deref()
        .map(str::parse::<Expected>)
        .transpose()
        .map_err(CommandError::Usage)?;
    if let Some(e) = &expected
        && args.checksum_algo != "sha256"
        && e.algo != algo
    {
        return Err(CommandError::usage(format!(
            "--checksum is {} but --checksum-algo is {algo}",
            e.algo
        )));
    }
    if let Some(reuse) = &args.reuse {
        kubevm::target::validate_name(reuse)
            .map_err(|why| CommandError::usage(format!("--reuse {reuse:?}: {why}")))?;
    }
    if let Some(volume) = &args.volume {
        kubevm::target::validate_name(volume)
            .map_err(|why| CommandError::usage(format!("--volume {volume:?}: {why}")))?;
    }
    let options = ExportOptions {
        // Replaced once the platform is known.
        source: Source::Pvc(name.clone()),
        namespace: String::new(),
        output,
        volume: args.volume.clone(),
        format: if args.format == "gzip" {
            Format::Gzip
        } else {
            Format::Raw
        },
        decompress: args.decompress,
        algo,
        expected,
        keep: args.keep,
        reuse: args.reuse.clone(),
        resume: args.resume,
        ttl: args.ttl,
        insecure: args.insecure,
        wait_timeout: if args.timeout.is_zero() {
            Duration::from_secs(365 * 24 * 3600)
        } else {
            args.timeout
        },
        max_retries: args.retries,
        retry_delay: args.retry_delay,
        dir_file: None,
        compress: false,
        resume_command: None,
    };
    Ok((prefix, name, options))
}

pub async fn cmd_export(global: &GlobalArgs, args: ExportArgs) -> CommandResult {
    let (prefix, name, mut options) = options(&args)?;
    if let FlavorChoice::Fixed(flavor) = global.flavor_choice() {
        Source::for_flavor(prefix, &name, flavor)?;
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    options.source = Source::for_flavor(prefix, &name, platform.flavor)?;
    options.namespace = cluster.namespace.clone();
    if options.output == Output::Manifest && !matches!(options.source, Source::Vm(_)) {
        return Err(CommandError::usage(
            "--manifest needs a VM target (vm/NAME on KubeVirt)",
        ));
    }
    let mut view = View::new(std::io::stderr().is_terminal());
    let mut manifest = None;
    let result = export::run(&cluster, &platform, &options, &mut |event| {
        if let Event::Manifest { text } = &event {
            manifest = Some(text.clone());
        }
        view.show(event);
    })
    .await;
    view.finish();
    result?;
    if let Some(text) = manifest {
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        out.flush()?;
    }
    Ok(())
}

/// Renders events on stderr.
pub(crate) struct View {
    terminal: bool,
    bar: Option<ProgressBar>,
    spinner: Option<ProgressBar>,
    last_line: Instant,
    started: Instant,
}

/// A plain progress line at most this often.
const LINE_EVERY: Duration = Duration::from_secs(5);

impl View {
    pub(crate) fn new(terminal: bool) -> Self {
        View {
            terminal,
            bar: None,
            spinner: None,
            last_line: Instant::now(),
            started: Instant::now(),
        }
    }

    fn say(&self, line: String) {
        match (&self.bar, &self.spinner) {
            (Some(bar), _) => bar.println(line),
            (None, Some(spinner)) => spinner.println(line),
            _ => eprintln!("{line}"),
        }
    }

    pub(crate) fn show(&mut self, event: Event) {
        match event {
            Event::Created { kind, name } => self.say(format!("created {kind} {name}")),
            Event::Reusing { name } => self.say(format!("reusing export {name}")),
            Event::Waiting { message } => self.waiting(message),
            Event::Ready { name } => {
                if let Some(s) = self.spinner.take() {
                    s.finish_and_clear();
                }
                self.say(format!("export {name} is ready"));
            }
            Event::Route { description } => self.say(description),
            Event::Notice { message } => self.say(message),
            Event::VolumeStarted {
                volume,
                path,
                total,
                offset,
            } => self.volume_started(volume, path, total, offset),
            Event::Progress {
                done,
                total,
                volume,
            } => self.progress(&volume, done, total),
            Event::Retrying {
                attempt,
                max,
                error,
                offset,
                delay,
            } => self.say(format!(
                "{error}; retry {attempt}/{max} from byte {offset} in {:.1}s",
                delay.as_secs_f64()
            )),
            Event::VolumeFinished {
                volume,
                path,
                bytes,
                algo,
                hex,
                checksum_file,
                fetched,
            } => self.volume_finished(
                &volume,
                path,
                bytes,
                fetched,
                checksum_line(algo, &hex, checksum_file),
            ),
            Event::Manifest { .. } => {}
            Event::Deleted { kind, name } => self.say(format!("deleted {kind} {name}")),
            Event::Kept { kind, name, why } => self.say(format!("kept {kind} {name} ({why})")),
        }
    }

    /// Waiting for the export: a spinner on a terminal, else a line.
    fn waiting(&mut self, message: String) {
        crate::progress::waiting(self.terminal, &mut self.spinner, &message);
    }

    /// A volume's download starts: where it goes, and on a terminal a progress bar from
    /// `offset` (a resumed download).
    fn volume_started(
        &mut self,
        volume: String,
        path: Option<PathBuf>,
        total: Option<u64>,
        offset: u64,
    ) {
        let to = path
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "stdout".into());
        self.say(format!("downloading volume {volume} to {to}"));
        self.started = Instant::now();
        self.last_line = Instant::now();
        if self.terminal {
            let bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar.set_prefix(volume);
            bar.set_position(offset);
            bar.reset_eta();
            self.bar = Some(bar);
        }
    }

    /// Bytes arrived: the bar moves, or without one a line at most every [`LINE_EVERY`].
    fn progress(&mut self, volume: &str, done: u64, total: Option<u64>) {
        match &self.bar {
            Some(bar) => {
                if let Some(t) = total {
                    bar.set_length(t);
                }
                bar.set_position(done);
            }
            None => {
                if self.last_line.elapsed() >= LINE_EVERY {
                    self.last_line = Instant::now();
                    let of = total
                        .map(|t| {
                            format!(
                                " of {} ({:.0}%)",
                                HumanBytes(t),
                                done as f64 * 100.0 / t.max(1) as f64
                            )
                        })
                        .unwrap_or_default();
                    eprintln!("volume {volume}: {}{of}", HumanBytes(done));
                }
            }
        }
    }

    /// A volume is complete: its size, where it went, how fast, then its checksum line.
    fn volume_finished(
        &mut self,
        volume: &str,
        path: Option<PathBuf>,
        bytes: u64,
        fetched: u64,
        checksum: String,
    ) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let secs = self.started.elapsed().as_secs_f64().max(0.001);
        let rate = HumanBytes((fetched as f64 / secs) as u64);
        let target = path
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "stdout".into());
        eprintln!(
            "volume {volume}: {} to {target} in {secs:.1}s ({rate}/s)",
            HumanBytes(bytes)
        );
        eprintln!("{checksum}");
    }

    pub(crate) fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
        if let Some(s) = self.spinner.take() {
            s.finish_and_clear();
        }
    }
}

/// A finished volume's checksum, and where it was written (`FILE.sha256`) if it was.
fn checksum_line(algo: Algo, hex: &str, checksum_file: Option<PathBuf>) -> String {
    let sum = checksum_file
        .map(|f| format!(" (written to {})", f.display()))
        .unwrap_or_default();
    format!("{algo}:{hex}{sum}")
}
