//! `kubectl vm image list|get|create|delete`: the catalog of golden images (KubeVirt CDI
//! DataSources and the DataVolumes behind them; Deckhouse VirtualImages and
//! ClusterVirtualImages).

use std::io::{IsTerminal, Write};

use clap::{Args, Subcommand, ValueEnum};
use clap_complete::engine::ArgValueCompleter;
use kubevm::image::{self, CreateRequest, Event, Image, ImageName, Options, Source, Storage};

use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::{ChangeFormat, DryRun, GlobalArgs, WaitArgs};
use crate::render::{self, OutputFormat, Table, age, cell};

/// Arguments of `image`.
#[derive(Debug, Args)]
#[command(
    after_help = "KubeVirt: an image is a CDI DataSource naming the PVC a DataVolume imported; `create` makes\nthe DataVolume (from --url, --registry, --from pvc/NAME, or --file: a local file uploaded\nas `kubectl vm upload` does) and the DataSource, both labelled as made by kubectl vm. VMs boot from it with `kubectl vm create --image ds/NAME`.\n\nDeckhouse: a VirtualImage (kept in DVCR, or on a PVC with --storage pvc) or, with --cluster-wide, a\nClusterVirtualImage (with --file, dataSource Upload with the file's sha256). VMs boot from\nit with `kubectl vm create --image vi/NAME` (or cvi/NAME).\n\n`delete` removes only images kubectl vm made, with their uid as a precondition; it refuses\nwhile a VM's disk is being made from the image, and names the VMs that still use it. A\nscheduled image (--schedule) goes with its DataImportCron and the imports CDI made for it.\n\nExamples:\n  kubectl vm image list -A\n  kubectl vm image create debian --url https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-generic-amd64.qcow2\n  kubectl vm image create fedora --registry quay.io/containerdisks/fedora:41\n  kubectl vm image create golden --file ./golden.qcow2\n  kubectl vm image create fedora --registry quay.io/containerdisks/fedora:41 --schedule '0 3 * * *'\n  kubectl vm image create ubuntu --cluster-wide --url https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img\n  kubectl vm image get debian -o yaml\n  kubectl vm image delete debian"
)]
pub struct ImageArgs {
    #[command(subcommand)]
    pub command: ImageCommand,
}

/// The `image` subcommands.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// List images: name, kind, source, format, size, phase with progress, age
    List(ListArgs),
    /// Show one image (NAME, vi/NAME, cvi/NAME, ds/[NAMESPACE/]NAME)
    Get(GetArgs),
    /// Import an image from a URL, a registry or a local file, or copy one from an image, disk or PVC
    Create(Box<CreateArgs>),
    /// Delete images kubectl vm made (refused while a VM is being created from one)
    Delete(DeleteArgs),
}

/// Arguments of `image list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// List images in all namespaces
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Only images whose labels match this selector (e.g. os=debian)
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// Output format: wide, yaml, json or name instead of the table
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<OutputFormat>,

    /// After listing, watch for changes and print each image that changes
    #[arg(short, long)]
    pub watch: bool,

    /// Do not print the header row
    #[arg(long)]
    pub no_headers: bool,
}

/// Arguments of `image get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// The image: NAME, vi/NAME, cvi/NAME or ds/[NAMESPACE/]NAME
    #[arg(value_name = "IMAGE", add = ArgValueCompleter::new(complete::image_names))]
    pub name: String,

    /// Output format: wide, yaml, json or name instead of the table
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<OutputFormat>,

    /// Do not print the header row
    #[arg(long)]
    pub no_headers: bool,
}

/// Where a Deckhouse VirtualImage keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StorageFlag {
    /// The platform's registry (DVCR)
    Dvcr,
    /// A PersistentVolumeClaim
    Pvc,
}

/// Arguments of `image create`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["url", "registry", "from", "file"])))]
pub struct CreateArgs {
    /// The image's name
    #[arg(value_name = "NAME")]
    pub name: String,

    /// Import from this http:// or https:// URL (qcow2, raw, ISO, VMDK, VDI; gz/xz)
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,

    /// With --url: the checksum the download must have, ALGO:HEX (md5, sha1, sha256, sha512;
    /// streebog256/512 on Deckhouse)
    #[arg(long, value_name = "ALGO:HEX", requires = "url")]
    pub checksum: Option<String>,

    /// Import from a container registry image holding a disk (containerdisk layout)
    #[arg(long, value_name = "IMAGE")]
    pub registry: Option<String>,

    /// Copy another image, disk, snapshot or PVC: vi/NAME, cvi/NAME, vd/NAME, vds/NAME (Deckhouse),
    /// pvc/[NAMESPACE/]NAME, ds/[NAMESPACE/]NAME (KubeVirt)
    #[arg(long, value_name = "KIND/NAME")]
    pub from: Option<String>,

    /// Upload a local disk image (qcow2, raw, ISO, VMDK, VHD, VHDX; gz/xz), as `kubectl vm
    /// upload` sends it: a DataVolume with source upload and its DataSource (KubeVirt), a
    /// VirtualImage or ClusterVirtualImage with dataSource Upload (Deckhouse)
    #[arg(long, value_name = "PATH")]
    pub file: Option<std::path::PathBuf>,

    /// KubeVirt, with --registry: import on this cron schedule (5 fields, e.g. "0 3 * * *") as a
    /// CDI DataImportCron managing the DataSource NAME, instead of once
    #[arg(long, value_name = "CRON")]
    pub schedule: Option<String>,

    /// With --schedule: how many imports CDI keeps (default 3; older ones are deleted)
    #[arg(long, value_name = "N", requires = "schedule")]
    pub imports_to_keep: Option<u32>,

    /// With --file: take a file of no recognised format as a raw disk
    #[arg(long, value_name = "FORMAT", value_parser = ["raw"], requires = "file")]
    pub format: Option<String>,

    /// Deckhouse: make a ClusterVirtualImage, usable from every namespace (kubectl's global
    /// --cluster names a kubeconfig cluster, hence the longer name)
    #[arg(long)]
    pub cluster_wide: bool,

    /// Deckhouse: keep a VirtualImage in DVCR (the default) or on a PVC
    #[arg(long, value_enum, value_name = "STORAGE")]
    pub storage: Option<StorageFlag>,

    /// KubeVirt: the size of the image's PVC (default 10Gi for imports; a clone takes its source's)
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,

    /// The StorageClass of the image's PVC (default: the cluster's)
    #[arg(long, value_name = "CLASS")]
    pub storage_class: Option<String>,

    #[command(flatten)]
    pub wait: WaitArgs,

    /// Only show what would be done: client (send nothing) or server (the server checks it)
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format of the result (default: a sentence)
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ChangeFormat>,
}

/// Arguments of `image delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// Images: NAME, vi/NAME, cvi/NAME or ds/[NAMESPACE/]NAME
    #[arg(value_name = "IMAGE", required = true, add = ArgValueCompleter::new(complete::image_names))]
    pub names: Vec<String>,

    /// Only show what would be done: client or server
    #[arg(long, value_enum, value_name = "STRATEGY", num_args = 0..=1, require_equals = true, default_missing_value = "client")]
    pub dry_run: Option<DryRun>,

    /// Output format: name prints kind.group/name of each deleted object
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<ChangeFormat>,
}

pub async fn cmd_image(global: &GlobalArgs, args: ImageArgs) -> CommandResult {
    match args.command {
        ImageCommand::List(a) => list(global, a).await,
        ImageCommand::Get(a) => get(global, a).await,
        ImageCommand::Create(a) => create(global, *a).await,
        ImageCommand::Delete(a) => delete(global, a).await,
    }
}

fn dry_note(dry_run: kubevm::api::DryRun) -> &'static str {
    match dry_run {
        kubevm::api::DryRun::Client => " (dry run)",
        kubevm::api::DryRun::Server => " (server dry run)",
        kubevm::api::DryRun::None => "",
    }
}

/// Rows of images, printed page by page with aligned columns.
struct Printer {
    all_namespaces: bool,
    wide: bool,
    headers: bool,
    widths: Vec<usize>,
    now: jiff::Timestamp,
}

impl Printer {
    fn new(all_namespaces: bool, wide: bool, headers: bool) -> Self {
        Printer {
            all_namespaces,
            wide,
            headers,
            widths: Vec::new(),
            now: jiff::Timestamp::now(),
        }
    }

    fn write(&mut self, out: &mut dyn Write, images: &[Image]) -> std::io::Result<()> {
        if images.is_empty() {
            return Ok(());
        }
        let mut headers = vec![];
        if self.all_namespaces {
            headers.push("NAMESPACE");
        }
        headers.extend(["NAME", "KIND", "SOURCE", "FORMAT", "SIZE", "PHASE", "AGE"]);
        if self.wide {
            headers.extend(["TARGET", "MANAGED", "MESSAGE"]);
        }
        let mut table = Table::new(&headers);
        for i in images {
            let mut row = vec![];
            if self.all_namespaces {
                row.push(cell(Some(&i.namespace).filter(|n| !n.is_empty())));
            }
            let some = |s: &String| cell(Some(s).filter(|s| !s.is_empty()));
            row.extend([
                i.name.clone(),
                i.kind.short().to_owned(),
                some(&i.source),
                some(&i.format),
                some(&i.size),
                i.phase_cell(),
                age(i.created.parse().ok(), self.now),
            ]);
            if self.wide {
                row.push(some(&i.target));
                row.push(if i.ours {
                    "kubectl-vm".into()
                } else {
                    render::NONE.into()
                });
                row.push(some(&i.message));
            }
            table.push(row);
        }
        table.write_aligned(out, std::mem::take(&mut self.headers), &mut self.widths)
    }
}

fn object_ref(i: &Image) -> String {
    let kind = match i.kind {
        image::ImageKind::Vi => image::deckhouse::VIRTUAL_IMAGE,
        image::ImageKind::Cvi => image::deckhouse::CLUSTER_VIRTUAL_IMAGE,
        _ => image::kubevirt::DATA_SOURCE,
    };
    kind.object_ref(&i.name)
}

fn shown(mut object: serde_json::Value) -> serde_json::Value {
    render::without_managed_fields(&mut object);
    object
}

async fn list(global: &GlobalArgs, args: ListArgs) -> CommandResult {
    if args.all_namespaces && global.namespace.is_some() {
        return Err(CommandError::usage(
            "-A/--all-namespaces and -n/--namespace cannot be used together",
        ));
    }
    if let Some(selector) = &args.selector {
        kubevm::selector::check(selector)?;
    }
    if args.watch && matches!(args.output, Some(OutputFormat::Yaml | OutputFormat::Json)) {
        return Err(CommandError::usage(
            "-w prints table rows; it does not combine with -o yaml|json",
        ));
    }
    let (cluster, platform) = crate::connect::connect(global).await?;
    let ns = (!args.all_namespaces).then(|| cluster.namespace.clone());
    let catalog = image::catalog(platform.flavor);
    let whole = matches!(args.output, Some(OutputFormat::Yaml | OutputFormat::Json));
    let mut kept = Vec::new();
    let mut count = 0usize;
    let mut printer = Printer::new(
        args.all_namespaces,
        args.output == Some(OutputFormat::Wide),
        !args.no_headers,
    );
    // While watching: what each image's row last said, so an update that changes nothing
    // shown (a DataVolume's restart count, a heartbeat) prints nothing.
    let mut shown_rows: std::collections::HashMap<(&'static str, String, String), String> =
        std::collections::HashMap::new();
    let wide = args.output == Some(OutputFormat::Wide);
    {
        let mut on_page = |mut page: Vec<Image>| -> kubevm::Result<()> {
            if args.watch {
                page.retain(|i| {
                    let mut said =
                        format!("{}|{}|{}|{}", i.phase_cell(), i.source, i.format, i.size);
                    if wide {
                        said.push_str(&i.message);
                    }
                    let key = (i.kind.short(), i.namespace.clone(), i.name.clone());
                    shown_rows.insert(key, said.clone()).as_ref() != Some(&said)
                });
            }
            count += page.len();
            if whole {
                kept.extend(page.into_iter().map(|i| shown(i.object)));
                return Ok(());
            }
            let mut out = std::io::stdout().lock();
            let written = match args.output {
                Some(OutputFormat::Name) => page
                    .iter()
                    .try_for_each(|i| writeln!(out, "{}", object_ref(i))),
                _ => printer.write(&mut out, &page),
            };
            written
                .and_then(|()| out.flush())
                .map_err(|e| kubevm::Error::Internal(format!("writing the list: {e}")))
        };
        if args.watch {
            // Every change after the listing is one more row, as `kubectl get -w` prints it.
            catalog
                .watch(
                    &cluster,
                    ns.as_deref(),
                    args.selector.as_deref(),
                    &mut on_page,
                )
                .await?;
        } else {
            catalog
                .list(
                    &cluster,
                    ns.as_deref(),
                    args.selector.as_deref(),
                    &mut on_page,
                )
                .await?;
        }
    }
    if whole {
        let mut out = std::io::stdout().lock();
        render::write_object(&mut out, &render::list_object(kept), args.output.unwrap())?;
        return Ok(());
    }
    if count == 0 {
        match &ns {
            Some(ns) => eprintln!("No images found in namespace {ns:?}."),
            None => eprintln!("No images found."),
        }
    }
    Ok(())
}

async fn get(global: &GlobalArgs, args: GetArgs) -> CommandResult {
    let name = ImageName::parse(&args.name)?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let image = image::catalog(platform.flavor)
        .get(&cluster, &cluster.namespace, &name)
        .await?;
    let mut out = std::io::stdout().lock();
    match args.output {
        Some(f @ (OutputFormat::Yaml | OutputFormat::Json)) => {
            render::write_object(&mut out, &shown(image.object), f)?;
        }
        Some(OutputFormat::Name) => writeln!(out, "{}", object_ref(&image))?,
        other => {
            let mut printer = Printer::new(
                name.namespace.is_some(),
                other == Some(OutputFormat::Wide),
                !args.no_headers,
            );
            printer.write(&mut out, std::slice::from_ref(&image))?;
            if !image.message.is_empty() && other != Some(OutputFormat::Wide) {
                drop(out);
                eprintln!("{}: {}", image.phase, image.message);
            }
        }
    }
    Ok(())
}

/// The create request from the flags, checked locally (a usage error before any request).
fn request(args: &CreateArgs, namespace: &str) -> CommandResult<CreateRequest> {
    let source = match (&args.url, &args.registry, &args.from) {
        (None, None, None) if args.file.is_some() => Source::Upload {
            file: args.file.clone().unwrap_or_default(),
            raw: args.format.as_deref() == Some("raw"),
        },
        (Some(url), None, None) => Source::Url {
            url: url.clone(),
            checksum: args
                .checksum
                .as_deref()
                .map(image::parse_checksum)
                .transpose()?,
        },
        (None, Some(image), None) => Source::Registry(image.clone()),
        (None, None, Some(from)) => Source::From(ImageName::parse(from)?),
        _ => {
            return Err(CommandError::usage(
                "give exactly one of --url, --registry, --from, --file",
            ));
        }
    };
    let request = CreateRequest {
        name: args.name.clone(),
        namespace: namespace.to_owned(),
        cluster: args.cluster_wide,
        source,
        storage: args.storage.map(|s| match s {
            StorageFlag::Dvcr => Storage::Dvcr,
            StorageFlag::Pvc => Storage::Pvc,
        }),
        size: args.size.clone(),
        storage_class: args.storage_class.clone(),
        schedule: args.schedule.clone(),
        imports_to_keep: args.imports_to_keep,
    };
    image::check(&request)?;
    Ok(request)
}

fn render_event(view: &std::sync::Mutex<crate::commands::upload::View>, event: Event) {
    match event {
        Event::Upload(e) => view.lock().unwrap_or_else(|e| e.into_inner()).show(e),
        Event::Created(what) => eprintln!("{what} created"),
        Event::Progress { phase, progress } if progress.is_empty() => eprintln!("  {phase}"),
        Event::Progress { phase, progress } => eprintln!("  {phase} {progress}"),
        Event::Notice(message) => eprintln!("Note: {message}"),
    }
}

async fn create(global: &GlobalArgs, args: CreateArgs) -> CommandResult {
    // Everything but the namespace is checked before connecting.
    request(&args, "default")?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let request = request(&args, &cluster.namespace)?;
    // Ctrl-C during an upload removes what this run made (a second press ends the program).
    let (taken, interrupts) = crate::interrupt::take_over();
    let options = Options {
        dry_run: DryRun::lib(args.dry_run),
        wait: !args.wait.no_wait,
        timeout: args.wait.timeout,
        interrupts: Some(interrupts.clone()),
    };
    let view = std::sync::Mutex::new(crate::commands::upload::View::new(
        std::io::stderr().is_terminal(),
        std::time::Duration::from_secs(5),
    ));
    let result = image::catalog(platform.flavor)
        .create(&cluster, &request, &options, &|e| render_event(&view, e))
        .await;
    drop(taken);
    view.lock().unwrap_or_else(|e| e.into_inner()).finish();
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(e) if *interrupts.borrow() > 0 => {
            eprintln!("Error: {e}");
            return Err(CommandError::Interrupted);
        }
        Err(e) => return Err(e.into()),
    };
    let mut out = std::io::stdout().lock();
    match args.output {
        Some(ChangeFormat::Name) => writeln!(out, "{}", outcome.object_ref)?,
        Some(f) => {
            let f = if f == ChangeFormat::Json {
                OutputFormat::Json
            } else {
                OutputFormat::Yaml
            };
            render::write_object(&mut out, &shown(outcome.image.object.clone()), f)?;
        }
        None => {
            let i = &outcome.image;
            let state = if options.dry_run != kubevm::api::DryRun::None {
                String::new()
            } else if !outcome.waited {
                "; not waited for: see `kubectl vm image list`".into()
            } else {
                let details: Vec<&str> = [i.format.as_str(), i.size.as_str()]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect();
                if details.is_empty() {
                    "; ready".into()
                } else {
                    format!("; ready ({})", details.join(", "))
                }
            };
            writeln!(
                out,
                "image {}/{} created{}{state}",
                i.kind.short(),
                i.name,
                dry_note(options.dry_run)
            )?;
        }
    }
    Ok(())
}

async fn delete(global: &GlobalArgs, args: DeleteArgs) -> CommandResult {
    if args.output.is_some_and(|o| o != ChangeFormat::Name) {
        return Err(CommandError::usage("-o takes only name here"));
    }
    let names = args
        .names
        .iter()
        .map(|n| ImageName::parse(n))
        .collect::<kubevm::Result<Vec<_>>>()?;
    let (cluster, platform) = crate::connect::connect(global).await?;
    let options = Options {
        dry_run: DryRun::lib(args.dry_run),
        wait: false,
        timeout: std::time::Duration::from_secs(60),
        interrupts: None,
    };
    let catalog = image::catalog(platform.flavor);
    for (name, text) in names.iter().zip(&args.names) {
        let deleted = catalog
            .delete(&cluster, &cluster.namespace, name, &options)
            .await?;
        let mut out = std::io::stdout().lock();
        for r in &deleted.object_refs {
            if args.output == Some(ChangeFormat::Name) {
                writeln!(out, "{r}")?;
            } else {
                writeln!(out, "{r} deleted{}", dry_note(options.dry_run))?;
            }
        }
        drop(out);
        if !deleted.referenced_by.is_empty() {
            eprintln!(
                "Note: image {text} is still named by VMs {} (their disks were copied from it and keep working; a VM re-created from its spec needs the image)",
                deleted.referenced_by.join(", ")
            );
        }
    }
    Ok(())
}
