//! `kubectl vm upload FILE dv/NAME|pvc/NAME|vi/NAME|cvi/NAME|vd/NAME`: a local disk image into
//! a DataVolume through CDI's upload proxy (KubeVirt), or into a VirtualImage,
//! ClusterVirtualImage or VirtualDisk through its uploader (Deckhouse). The library does the
//! work; this module checks flags and renders events (progress bar on a terminal, a plain
//! line every 5 s otherwise).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};
use kubevm::upload::format::ImageFormat;
use kubevm::upload::{self, Event, Target, UploadOptions};

use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;

/// Arguments of `upload`.
#[derive(Debug, Args)]
#[command(
    after_help = "Reads the image first (qcow2, raw, ISO, VMDK, VHD, VHDX, gzip and xz are recognised by their\nmagic bytes; the virtual size comes from the header), creates a DataVolume with source.upload\n(labelled as made by kubectl vm, with CDI's immediate-binding annotation so WaitForFirstConsumer\nstorage does not wait for a VM), asks CDI for an upload token and streams the file to the upload\nproxy (CDIConfig's uploadProxyURL, --uploadproxy-url, or when that cannot be reached, a\nport-forward to the proxy pod through the API server). The sha256 of the bytes sent is printed.\nCDI converts the image to a raw disk.\n\nOn Deckhouse (vi/, cvi/, vd/) the file is read once first to compute its sha256, which goes\ninto the new object's dataSource.upload.checksum so the platform checks what it receives; the\nfile is sent to status.imageUploadURLs.external (TLS checked against the system's CAs, as\ncurl does) or, when that cannot be reached, to the in-cluster URL through a port-forward to\nthe uploader pod. A platform failure (a checksum mismatch) is shown in its words.\n\nA network error restarts the upload from the beginning (neither server can resume). On failure\nor Ctrl-C the object this run created is deleted (unless --keep).\n\nExamples:\n  kubectl vm upload fedora.qcow2 dv/fedora-root\n  kubectl vm upload fedora.qcow2 vd/fedora-root --size 20Gi\n  kubectl vm upload ubuntu.img vi/ubuntu\n  kubectl vm upload debian.qcow2 cvi/debian-12\n  kubectl vm upload win.iso dv/win-installer --size 8Gi --storage-class fast\n  kubectl vm upload disk.raw.xz dv/golden --uploadproxy-url cdi-uploadproxy.example.com\n  kubectl vm upload disk.img dv/existing --no-create\n  kubectl vm upload blob.bin dv/blob --format raw -o name"
)]
pub struct UploadArgs {
    /// The local image file
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Where it goes: dv/NAME (a new DataVolume, or an existing one with --no-create) or
    /// pvc/NAME (the PVC of a DataVolume of that name) on KubeVirt; vi/NAME, cvi/NAME or
    /// vd/NAME on Deckhouse. A bare NAME is dv/NAME
    #[arg(value_name = "TARGET")]
    pub target: String,

    /// Volume size (a quantity: 10Gi); default the image's virtual size (on Deckhouse, vd/ only;
    /// default the platform's choice). Smaller than the virtual size is refused
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,

    /// Take a file of no recognised format as a raw disk
    #[arg(long, value_name = "FORMAT", value_parser = ["raw"])]
    pub format: Option<String>,

    /// Storage class of the new volume (dv/, pvc/, vd/)
    #[arg(long, value_name = "CLASS")]
    pub storage_class: Option<String>,

    /// Access mode of the new volume (ReadWriteOnce, ReadWriteMany, ReadOnlyMany, ReadWriteOncePod)
    #[arg(long, value_name = "MODE")]
    pub access_mode: Option<String>,

    /// Volume mode of the new volume (Filesystem or Block)
    #[arg(long, value_name = "MODE")]
    pub volume_mode: Option<String>,

    /// Upload into an existing DataVolume (or Deckhouse object) waiting for an upload instead of
    /// creating one
    #[arg(long)]
    pub no_create: bool,

    /// Keep what this run created when the upload fails or is interrupted
    #[arg(long)]
    pub keep: bool,

    /// The upload proxy's address (default: CDIConfig status.uploadProxyURL)
    #[arg(long, value_name = "URL")]
    pub uploadproxy_url: Option<String>,

    /// Do not verify the upload proxy's (or Deckhouse ingress's) TLS certificate (the upload
    /// token or secret URL is still sent)
    #[arg(long)]
    pub insecure: bool,

    /// How long to wait for the volume to be ready for the upload, and then ready
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = kubevm::cluster::parse_duration)]
    pub timeout: Duration,

    /// Retries (each from the beginning) after network errors
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub retries: u32,

    /// First retry delay (doubles up to 8s)
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = kubevm::cluster::parse_duration, hide = true)]
    pub retry_delay: Duration,

    /// How often a plain progress line is printed when stderr is not a terminal
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = kubevm::cluster::parse_duration, hide = true)]
    pub progress_every: Duration,

    /// Output: `name` prints the object (datavolume.cdi.kubevirt.io/NAME,
    /// virtualdisk.virtualization.deckhouse.io/NAME, ...) on stdout when done
    #[arg(short = 'o', long, value_name = "FORMAT", value_parser = ["name"])]
    pub output: Option<String>,
}

/// Checks the flags and the file before any request; exit 2 on bad input.
fn plan(args: &UploadArgs, namespace: String) -> CommandResult<upload::Plan> {
    let target = Target::parse(&args.target)?;
    let size = args
        .size
        .as_deref()
        .map(|s| {
            kubevm::quantity::Quantity::parse(s)
                .map(|q| q.bytes())
                .map_err(|e| CommandError::usage(format!("--size {s:?}: {e}")))
        })
        .transpose()?;
    if size == Some(0) {
        return Err(CommandError::usage("--size must be more than 0"));
    }
    let options = UploadOptions {
        file: args.file.clone(),
        target,
        namespace,
        size,
        force_raw: args.format.as_deref() == Some("raw"),
        storage_class: args.storage_class.clone(),
        image_on_pvc: false,
        access_mode: args.access_mode.clone(),
        volume_mode: args.volume_mode.clone(),
        no_create: args.no_create,
        keep: args.keep,
        uploadproxy_url: args.uploadproxy_url.clone(),
        insecure: args.insecure,
        wait_timeout: if args.timeout.is_zero() {
            Duration::from_secs(365 * 24 * 3600)
        } else {
            args.timeout
        },
        max_retries: args.retries,
        retry_delay: args.retry_delay,
    };
    Ok(upload::plan(options)?)
}

pub async fn cmd_upload(global: &GlobalArgs, args: UploadArgs) -> CommandResult {
    // The file and flags first: a bad input never reaches the cluster.
    let mut plan = plan(&args, String::new())?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    upload::check_platform(&plan, &platform)?;
    plan.options.namespace = cluster.namespace.clone();
    let mut view = View::new(std::io::stderr().is_terminal(), args.progress_every);
    view.show(Event::Inspected {
        format: plan.info.format,
        virtual_size: plan.info.virtual_size,
        size: plan.size,
    });
    // Ctrl-C now removes what this run created (a second press ends the program).
    let (taken, interrupts) = crate::interrupt::take_over();
    let mut show = |e| view.show(e);
    let result = upload::run(&cluster, &plan, Some(interrupts.clone()), &mut show).await;
    drop(taken);
    view.finish();
    match result {
        Ok(()) => {}
        Err(e) if *interrupts.borrow() > 0 => {
            eprintln!("Error: {e}");
            return Err(CommandError::Interrupted);
        }
        Err(e) => return Err(e.into()),
    }
    if args.output.as_deref() == Some("name") {
        let name = upload::resource_name(&plan.options.target);
        let mut out = std::io::stdout().lock();
        writeln!(out, "{name}")?;
        out.flush()?;
    }
    Ok(())
}

/// Renders events on stderr (also `image create --file`'s upload).
pub(crate) struct View {
    terminal: bool,
    bar: Option<ProgressBar>,
    spinner: Option<ProgressBar>,
    last_line: Instant,
    line_every: Duration,
}

impl View {
    /// `line_every`: a plain progress line at most this often.
    pub(crate) fn new(terminal: bool, line_every: Duration) -> Self {
        View {
            terminal,
            bar: None,
            spinner: None,
            last_line: Instant::now(),
            line_every,
        }
    }

    fn say(&self, line: String) {
        match (&self.bar, &self.spinner) {
            (Some(bar), _) => bar.println(line),
            (None, Some(spinner)) => spinner.println(line),
            _ => eprintln!("{line}"),
        }
    }

    fn clear_spinner(&mut self) {
        if let Some(s) = self.spinner.take() {
            s.finish_and_clear();
        }
    }

    /// Moves the bar on a terminal; elsewhere prints "VERB DONE of TOTAL (P%)" at most once
    /// per `line_every`.
    fn advance(&mut self, verb: &str, done: u64, total: u64) {
        match &self.bar {
            Some(bar) => bar.set_position(done),
            None => {
                if self.last_line.elapsed() >= self.line_every {
                    self.last_line = Instant::now();
                    eprintln!(
                        "{verb} {} of {} ({:.0}%)",
                        HumanBytes(done),
                        HumanBytes(total),
                        done as f64 * 100.0 / total.max(1) as f64
                    );
                }
            }
        }
    }

    pub(crate) fn show(&mut self, event: Event) {
        match event {
            Event::Inspected {
                format,
                virtual_size,
                size,
            } => self.say(image_line(format, virtual_size, size)),
            Event::Hashing { total } => self.hashing(total),
            Event::Hashed { done, total } => self.advance("hashed", done, total),
            Event::Checksum { sha256 } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                eprintln!("sha256 (checked by the platform): {sha256}");
            }
            Event::Created { kind, name } => self.say(format!("created {kind} {name}")),
            Event::Waiting { message } => self.waiting(message),
            Event::Route { description } => {
                self.clear_spinner();
                self.say(description);
            }
            Event::Started { total } => self.started(total),
            Event::Progress { sent, total } => self.advance("uploaded", sent, total),
            Event::Retrying {
                attempt,
                max,
                error,
                delay,
            } => self.say(format!(
                "{error}; retry {attempt}/{max} from the beginning (the server cannot resume an upload) in {:.1}s",
                delay.as_secs_f64()
            )),
            Event::Sent {
                bytes,
                sha256,
                secs,
            } => self.sent(bytes, &sha256, secs),
            Event::Ready { target } => {
                self.clear_spinner();
                self.say(format!("{target} is ready"));
            }
            Event::Deleted { kind, name } => self.say(format!("deleted {kind} {name}")),
            Event::Kept { kind, name } => self.say(format!("kept {kind} {name} (--keep)")),
        }
    }

    /// The sha256 is computed before the upload: a bar on a terminal, else a line.
    fn hashing(&mut self, total: u64) {
        self.last_line = Instant::now();
        if self.terminal {
            self.bar = Some(byte_bar(
                total,
                "sha256 [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
            ));
        } else {
            eprintln!(
                "computing the sha256 of {} first (the platform checks it)",
                HumanBytes(total)
            );
        }
    }

    /// Waiting for the platform: a spinner on a terminal, else a line.
    fn waiting(&mut self, message: String) {
        crate::progress::waiting(self.terminal, &mut self.spinner, &message);
    }

    /// The upload starts (again, after a retry): a fresh bar on a terminal, else a line.
    fn started(&mut self, total: u64) {
        self.clear_spinner();
        self.last_line = Instant::now();
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        if self.terminal {
            self.bar = Some(byte_bar(
                total,
                "upload [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            ));
        } else {
            eprintln!("uploading {}", HumanBytes(total));
        }
    }

    /// The bytes are sent: how many, how fast, and their sha256.
    fn sent(&mut self, bytes: u64, sha256: &str, secs: f64) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let rate = HumanBytes((bytes as f64 / secs.max(0.001)) as u64);
        eprintln!("uploaded {} in {secs:.1}s ({rate}/s)", HumanBytes(bytes));
        eprintln!("sha256:{sha256}");
    }

    pub(crate) fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
        self.clear_spinner();
    }
}

/// What the file is and the volume it goes to.
fn image_line(format: ImageFormat, virtual_size: Option<u64>, size: Option<u64>) -> String {
    let virtual_size = virtual_size
        .map(|v| format!(", virtual size {}", HumanBytes(v)))
        .unwrap_or_default();
    let size = match size {
        Some(size) => format!("volume size {} ({size} bytes)", HumanBytes(size)),
        None => "volume size chosen by the platform".into(),
    };
    format!("image: {}{virtual_size}; {size}", format.name())
}

/// A byte progress bar on stderr with `template`.
fn byte_bar(total: u64, template: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}
