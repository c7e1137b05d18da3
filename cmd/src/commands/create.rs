//! `kubectl vm create NAME`: turn flags into a VM plan, check it locally (before any request),
//! have the library check it against the cluster (`checks::prepare`) and create its objects all
//! or nothing (`execute::create_all`), and render what happened.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use clap_complete::engine::ArgValueCompleter;
use kubevm::api::Kind;
use kubevm::ca::store::DEFAULT_CA_NAMESPACE;
use kubevm::cluster::{Cluster, parse_duration};
use kubevm::create::checks::{self, CaSource, PrepareOptions, Prepared};
use kubevm::create::execute::{self, Applied};
use kubevm::create::plan::{
    AccessCredential, CoreFraction, Extras, Firmware, KindRef, OsType, RunStrategy,
};
use kubevm::create::{self, BootFlags, BootSource, Manifests, VmPlan};
use kubevm::flavor::{self, Flavor, FlavorChoice};
use kubevm::quantity::Quantity;
use kubevm::validate::{self, Checksum, DataDisk, DiskBus, EnvVar, Label};
use kubevm::wait::{self, Snapshot};
use serde_json::Value;

use crate::commands::create_interactive;
use crate::complete;
use crate::error::{CommandError, CommandResult};
use crate::flags::GlobalArgs;
use crate::render::{self, OutputFormat};

/// Arguments of `create`.
#[derive(Debug, Args, Default)]
#[command(after_help = "Examples:
  kubectl vm create web --image quay.io/containerdisks/ubuntu:24.04 --cpu 2 --memory 4Gi --ssh-key ~/.ssh/id_ed25519.pub
  kubectl vm create db --url https://example.org/disk.qcow2 --checksum sha256:<hex> --disk-size 40Gi --data-disk data=100Gi
  kubectl vm create web --image cvi/ubuntu-24-04 --class generic --core-fraction 50% --wait
  kubectl vm create web --image quay.io/containerdisks/fedora:42 --replicas 3
  kubectl vm create web --image quay.io/containerdisks/fedora:42 --dry-run=client -o yaml --flavor kubevirt --ca-public-key ca.pub")]
pub struct CreateArgs {
    /// Name of the new VM
    #[arg(value_name = "NAME")]
    pub name: String,

    /// Boot from this container disk image (copied into a new disk unless --ephemeral); on Deckhouse also vi/NAME or cvi/NAME
    #[arg(long, value_name = "IMAGE", help_heading = "Boot disk")]
    pub image: Option<String>,
    /// Boot from the --image itself, losing changes on restart (KubeVirt only)
    #[arg(long, help_heading = "Boot disk")]
    pub ephemeral: bool,
    /// Boot from a disk image downloaded over HTTP(S) (qcow2, raw, vmdk, vhd(x), vdi, iso, gz/xz)
    #[arg(long, value_name = "URL", help_heading = "Boot disk")]
    pub url: Option<String>,
    /// Expected digest of the --url image, ALGO:HEX (md5, sha1, sha256, sha512, streebog256, streebog512; repeatable)
    #[arg(long, value_name = "ALGO:HEX", help_heading = "Boot disk")]
    pub checksum: Vec<String>,
    /// Import without verification where the cluster cannot check the --checksum
    #[arg(long, help_heading = "Boot disk")]
    pub allow_unverified: bool,
    /// Boot from a copy of this PVC ([NAMESPACE/]NAME)
    #[arg(long, value_name = "PVC", help_heading = "Boot disk")]
    pub clone_pvc: Option<String>,
    /// Boot from a new empty disk of this size
    #[arg(long, value_name = "SIZE", help_heading = "Boot disk")]
    pub blank: Option<String>,
    /// Boot from this existing disk (PVC on KubeVirt, VirtualDisk on Deckhouse)
    #[arg(long, value_name = "NAME", help_heading = "Boot disk")]
    pub disk: Option<String>,
    /// Size of the boot disk created from --image/--url (default 10Gi)
    #[arg(long, value_name = "SIZE", help_heading = "Boot disk")]
    pub disk_size: Option<String>,
    /// Storage class of the disks created
    #[arg(long, value_name = "CLASS", help_heading = "Boot disk")]
    pub storage_class: Option<String>,
    /// Bus of the boot disk: virtio, sata or scsi
    #[arg(long, value_name = "BUS", help_heading = "Boot disk")]
    pub boot_bus: Option<String>,
    /// Extra data disk NAME=SIZE[,class=SC][,bus=virtio|sata|scsi]; the guest finds it at /dev/disk/by-id/*NAME* (repeatable)
    #[arg(long, value_name = "SPEC", help_heading = "Boot disk")]
    pub data_disk: Vec<String>,

    /// CPU cores (whole cores, at least 1; default 1)
    #[arg(long, value_name = "N", help_heading = "Machine")]
    pub cpu: Option<String>,
    /// Memory, e.g. 2Gi (default 1Gi)
    #[arg(long, value_name = "SIZE", help_heading = "Machine")]
    pub memory: Option<String>,
    /// Guaranteed share of each core, e.g. 50% (Deckhouse)
    #[arg(long, value_name = "PERCENT", help_heading = "Machine")]
    pub core_fraction: Option<String>,
    /// VirtualMachineClass (Deckhouse; default generic)
    #[arg(long, value_name = "CLASS", help_heading = "Machine")]
    pub class: Option<String>,
    /// Instance type (KubeVirt), [virtualmachineinstancetype/]NAME or cluster one by default
    #[arg(long, value_name = "NAME", help_heading = "Machine")]
    pub instancetype: Option<String>,
    /// Preference (KubeVirt)
    #[arg(long, value_name = "NAME", help_heading = "Machine")]
    pub preference: Option<String>,
    /// Take the instancetype (and preference, unless --preference) from the labels of the
    /// DataSource named by --image ds/NAME (KubeVirt; instancetype.kubevirt.io/default-*)
    #[arg(long, help_heading = "Machine")]
    pub infer_from_image: bool,
    /// Firmware: efi or bios
    #[arg(long, value_name = "FIRMWARE", help_heading = "Machine")]
    pub firmware: Option<String>,
    /// Guest OS family: linux or windows
    #[arg(long, value_name = "OS", help_heading = "Machine")]
    pub os: Option<String>,
    /// Guest time zone, e.g. Europe/Berlin
    #[arg(long, value_name = "ZONE", help_heading = "Machine")]
    pub timezone: Option<String>,
    /// Guest host name (default: the VM name)
    #[arg(long, value_name = "NAME", help_heading = "Machine")]
    pub hostname: Option<String>,
    /// CPU sockets, 1-32 (KubeVirt); the --cpu vCPUs are split into sockets × cores × threads
    #[arg(long, value_name = "N", help_heading = "Machine")]
    pub sockets: Option<String>,
    /// Threads per core, 1-8 (KubeVirt); cores per socket = --cpu / (sockets × threads)
    #[arg(long, value_name = "N", help_heading = "Machine")]
    pub threads: Option<String>,
    /// SMBIOS system UUID, a version 4 UUID (KubeVirt; default: generated)
    #[arg(long, value_name = "UUID", help_heading = "Machine")]
    pub uuid: Option<String>,
    /// SMBIOS system serial number (KubeVirt)
    #[arg(long, value_name = "SERIAL", help_heading = "Machine")]
    pub serial: Option<String>,
    /// UEFI Secure Boot (KubeVirt, with --persistent-efi; refused on Deckhouse, which keeps no EFI NVRAM)
    #[arg(long, help_heading = "Machine")]
    pub secure_boot: bool,
    /// Keep the EFI NVRAM across restarts (KubeVirt; needs the VMPersistentState feature gate)
    #[arg(long, help_heading = "Machine")]
    pub persistent_efi: bool,
    /// Keep the serial console history for `kubectl vm logs`, even where the cluster disables it
    /// (KubeVirt logSerialConsole; refused on Deckhouse, which keeps none)
    #[arg(long, help_heading = "Machine")]
    pub console_log: bool,
    /// Attach a secondary network (repeatable): KubeVirt NAME[=[NAMESPACE/]NAD] (bridge on a
    /// Multus NetworkAttachmentDefinition); Deckhouse [network/|clusternetwork/]NAME
    #[arg(long, value_name = "NAME[=NETWORK]", help_heading = "Machine", add = clap_complete::engine::ArgValueCompleter::new(crate::complete::network_names))]
    pub network: Vec<String>,
    /// A fixed IPv4 address (repeatable): ADDRESS in the main network (Deckhouse: a
    /// VirtualMachineIPAddress; `delete --keep-ip` keeps it), or NAME=ADDRESS/PREFIX on the
    /// secondary network --network NAME (KubeVirt: cloud-init network data, interfaces matched by MAC)
    #[arg(
        long,
        value_name = "ADDRESS|NAME=ADDRESS/PREFIX",
        help_heading = "Machine"
    )]
    pub ip: Vec<String>,
    /// DNS subdomain of the guest, HOSTNAME.SUBDOMAIN.NAMESPACE.svc (KubeVirt)
    #[arg(long, value_name = "NAME", help_heading = "Machine")]
    pub subdomain: Option<String>,
    /// Always, RerunOnFailure, Manual or Halted (Deckhouse run policies AlwaysOn, AlwaysOnUnlessStoppedManually, Manual, AlwaysOff)
    #[arg(long, value_name = "STRATEGY", help_heading = "Machine")]
    pub run_strategy: Option<String>,
    /// Create the VM without starting it
    #[arg(long, help_heading = "Machine")]
    pub stopped: bool,
    /// Create a pool of N VMs (1-32) named NAME-0 … NAME-<N-1>, each with its own disks (KubeVirt VirtualMachinePool; Deckhouse: N VMs labelled kubevm.io/pool=NAME)
    #[arg(long, value_name = "N", help_heading = "Machine")]
    pub replicas: Option<String>,
    /// Label KEY=VALUE for the VM and its disks (repeatable)
    #[arg(
        short = 'l',
        long = "label",
        value_name = "KEY=VALUE",
        help_heading = "Machine"
    )]
    pub labels: Vec<String>,
    #[command(flatten)]
    pub placement: crate::commands::placement_flags::PlacementFlags,

    /// User data for cloud-init (#cloud-config, script or MIME multipart), merged with the platform's
    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath, help_heading = "Guest")]
    pub cloud_init: Option<PathBuf>,
    /// User data from this existing Secret (key userdata or user-data), merged with the platform's like --cloud-init; the Secret is only read
    #[arg(long, value_name = "SECRET", help_heading = "Guest", add = ArgValueCompleter::new(complete::secret_names))]
    pub user_data_secret: Option<String>,
    /// Secret of SSH public keys (every line of every key) for the --guest-user or the image's default user, read at creation (repeatable, at most 8)
    #[arg(long, value_name = "SECRET", help_heading = "Guest", add = ArgValueCompleter::new(complete::secret_names))]
    pub ssh_key_secret: Vec<String>,
    /// SECRET:USER[,USER…][:qemuGuestAgent|configDrive]: the Secret's keys for 1-16 guest users; qemuGuestAgent (default) keeps them in sync while the VM runs (KubeVirt), configDrive writes them at first boot (Deckhouse always does) (repeatable)
    #[arg(long, value_name = "SPEC", help_heading = "Guest", add = ArgValueCompleter::new(complete::secret_names))]
    pub access_credential: Vec<String>,
    /// SSH public key file for the --guest-user (or the image's default user) (repeatable)
    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath, help_heading = "Guest")]
    pub ssh_key: Vec<PathBuf>,
    /// Create this guest user (passwordless sudo) with the --ssh-key keys (the global --user is the kubeconfig user)
    #[arg(
        long = "guest-user",
        visible_alias = "login",
        value_name = "NAME",
        help_heading = "Guest"
    )]
    pub guest_user: Option<String>,
    /// Environment KEY=VALUE for the guest: /etc/kubevm/environment, /etc/environment, /etc/profile.d (repeatable)
    #[arg(long, value_name = "KEY=VALUE", help_heading = "Guest")]
    pub env: Vec<String>,
    /// Do not make the guest trust the platform SSH CA or create the platform user
    #[arg(long, help_heading = "Guest")]
    pub no_platform_ssh: bool,
    /// Do not install or start qemu-guest-agent (by default it is installed at first boot if the image lacks it)
    #[arg(long, help_heading = "Guest")]
    pub no_guest_agent: bool,
    /// Platform SSH CA public key(s) from this file instead of the cluster (for offline manifests)
    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath, help_heading = "Guest")]
    pub ca_public_key: Option<PathBuf>,
    /// Fail instead of warning when no platform SSH CA is found
    #[arg(long, help_heading = "Guest")]
    pub require_ca: bool,
    /// Namespace holding the platform SSH CA
    #[arg(long, value_name = "NAMESPACE", default_value = DEFAULT_CA_NAMESPACE, help_heading = "Guest")]
    pub ca_namespace: String,

    /// Only show the objects (client), or have the server check them (server)
    #[arg(long, value_name = "MODE", num_args = 0..=1, default_missing_value = "client", value_parser = ["none", "client", "server"])]
    pub dry_run: Option<String>,
    /// Output format of the created objects
    #[arg(short, long, value_enum)]
    pub output: Option<OutputFormat>,
    /// Wait until the VM runs (or, if created stopped, until its disks are ready)
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, e.g. 10m (0: forever)
    #[arg(long, value_name = "DURATION", default_value = "10m")]
    pub timeout: String,
    /// Ask for the image, size, CPU, memory and SSH key, then show the objects before creating them
    #[arg(short, long)]
    pub interactive: bool,
}

/// How the objects are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DryRun {
    None,
    Client,
    Server,
}

pub async fn cmd_create(global: &GlobalArgs, args: CreateArgs) -> CommandResult {
    crate::connect::check_ca_namespace(&args.ca_namespace)?;
    let dry_run = match args.dry_run.as_deref() {
        None | Some("none") => DryRun::None,
        Some("client") => DryRun::Client,
        _ => DryRun::Server,
    };
    validate::dns_label("VM", &args.name).map_err(usage)?;
    let timeout = parse_duration(&args.timeout)
        .map_err(|e| CommandError::usage(format!("--timeout: {e}")))?;
    let (args, interactive) = ask_if_interactive(args).await?;
    // Everything that can be checked without the cluster is checked first: files, every
    // flag value, and (when --flavor names the platform) the flag combinations.
    let inputs = read_inputs(&args)?;
    let choice = global.flavor_choice();
    let early = build_plan(
        &args,
        &inputs,
        &args.name,
        "default",
        kubevm::platform::provisional(choice),
    )?;
    create::validate_before_discovery(&early, choice).map_err(usage)?;
    let offline = dry_run == DryRun::Client && matches!(choice, FlavorChoice::Fixed(_));
    let Target {
        cluster,
        platform,
        flavor,
        namespace,
    } = target(global, choice, offline).await?;
    let plan = build_plan(&args, &inputs, &args.name, &namespace, flavor)?;
    let mut early = plan.clone();
    early.platform_ssh.enabled = false;
    early.validate().map_err(usage)?;

    // Checks against the cluster, before anything is written.
    let options = PrepareOptions {
        allow_unverified: args.allow_unverified,
        ca: CaSource {
            public_keys: inputs.ca_public_keys.clone(),
            namespace: args.ca_namespace.clone(),
            require: args.require_ca,
        },
    };
    let connected = cluster.as_ref().zip(platform.as_ref());
    let Prepared {
        plan,
        manifests,
        existing,
    } = checks::prepare(connected, plan, &options, &mut |w| {
        eprintln!("Warning: {w}")
    })
    .await?;

    if interactive && !create_interactive::confirm(&manifests).await? {
        return Err(CommandError::Failed("nothing created".into()));
    }
    let mut out = std::io::stdout().lock();
    if dry_run == DryRun::Client {
        let objects: Vec<Value> = manifests.objects.iter().map(|o| o.object.clone()).collect();
        return print_objects(&mut out, &objects, args.output, " (dry run)");
    }
    let cluster = cluster.expect("connected unless client dry run");
    let applied = apply(&cluster, &manifests, &existing, dry_run == DryRun::Server).await?;
    let suffix = if dry_run == DryRun::Server {
        " (server dry run)"
    } else {
        ""
    };
    print_applied(&mut out, &applied, args.output, suffix)?;
    out.flush()?;
    drop(out);
    if args.wait && dry_run == DryRun::None {
        wait_created(&cluster, flavor, &plan, timeout).await?;
    }
    Ok(())
}

/// Asks for what the flags leave out when asked to (`--interactive`) or when nothing says what
/// to boot and a person is at the terminal; whether it asked (then the objects are shown for
/// confirmation before anything is created).
async fn ask_if_interactive(mut args: CreateArgs) -> CommandResult<(CreateArgs, bool)> {
    let no_boot_source = args.image.is_none()
        && args.url.is_none()
        && args.clone_pvc.is_none()
        && args.blank.is_none()
        && args.disk.is_none();
    let interactive = args.interactive || (no_boot_source && crate::prompt::interactive());
    if args.interactive && !crate::prompt::interactive() {
        return Err(CommandError::usage(
            "--interactive needs a terminal on stdin and stderr",
        ));
    }
    if interactive {
        // Prompts block; on their own thread Ctrl-C is still seen by the runtime.
        args =
            tokio::task::spawn_blocking(move || create_interactive::ask(&mut args).map(|()| args))
                .await
                .map_err(|e| CommandError::Failed(format!("prompt failed: {e}")))??;
    }
    Ok((args, interactive))
}

/// Where the VM goes: the cluster and its platform (none offline), the platform to write for
/// and the namespace.
struct Target {
    cluster: Option<Cluster>,
    platform: Option<flavor::Platform>,
    flavor: Flavor,
    namespace: String,
}

/// Connects and discovers the platform, unless the manifests are only printed for a named
/// platform (`offline`): those never talk to the cluster, and a kubeconfig only lends its
/// namespace.
async fn target(global: &GlobalArgs, choice: FlavorChoice, offline: bool) -> CommandResult<Target> {
    let mut context_namespace = None;
    let (cluster, platform) = if offline {
        context_namespace = Cluster::connect(&global.connect_options())
            .await
            .ok()
            .map(|c| c.namespace);
        (None, None)
    } else {
        let cluster = Cluster::connect(&global.connect_options())
            .await
            .map_err(|e| hint_guest_user(global, e))?;
        let platform = flavor::discover(&cluster, choice).await?;
        crate::connect::note_other_platform(global, &platform);
        (Some(cluster), Some(platform))
    };
    let flavor = match (&platform, choice) {
        (Some(p), _) => p.flavor,
        (None, FlavorChoice::Fixed(f)) => f,
        (None, FlavorChoice::Auto) => unreachable!("offline only with a fixed flavor"),
    };
    let namespace = match (&cluster, &global.namespace) {
        (_, Some(ns)) => ns.clone(),
        (Some(c), None) => c.namespace.clone(),
        (None, None) => context_namespace.unwrap_or_else(|| "default".to_owned()),
    };
    kubevm::target::validate_namespace(&namespace)?;
    Ok(Target {
        cluster,
        platform,
        flavor,
        namespace,
    })
}

/// Creates the objects in order; Ctrl-C meanwhile rolls back what this run created (a second
/// press abandons the rollback) and ends with exit 130.
async fn apply(
    cluster: &Cluster,
    manifests: &Manifests,
    existing: &execute::Existing,
    server_dry_run: bool,
) -> CommandResult<Vec<Applied>> {
    let (taken, interrupts) = crate::interrupt::take_over();
    let created = execute::create_all(
        cluster,
        manifests,
        existing,
        server_dry_run,
        Some(interrupts.clone()),
        |_| {},
    )
    .await;
    drop(taken);
    match created {
        Ok(applied) => Ok(applied),
        Err(e) if *interrupts.borrow() > 0 => {
            eprintln!("Error: {e}");
            Err(CommandError::Interrupted)
        }
        Err(e) => Err(e.into()),
    }
}

/// `--wait`: until the VM runs (or its disks are ready), each replica of a pool in turn (the
/// controller makes them at once).
async fn wait_created(
    cluster: &Cluster,
    flavor: Flavor,
    plan: &VmPlan,
    timeout: Duration,
) -> CommandResult {
    let Some(n) = plan.replicas else {
        return wait_for(cluster, flavor, plan, timeout).await;
    };
    for i in 0..n {
        let replica = create::pool::replica_plan(plan, i);
        let ns = &replica.namespace;
        wait::until_exists(cluster, flavor, &replica.name, ns, timeout)
            .await
            .map_err(|e| match e {
                kubevm::Error::Timeout(what) => {
                    CommandError::Failed(format!("timed out waiting for {what}"))
                }
                e => e.into(),
            })?;
        wait_for(cluster, flavor, &replica, timeout).await?;
    }
    Ok(())
}

/// `create --user NAME` once named the guest user; the global `--user` is kubectl's
/// kubeconfig user, so a name the kubeconfig lacks gets a pointer to `--guest-user`.
fn hint_guest_user(global: &GlobalArgs, err: kubevm::Error) -> CommandError {
    match (&global.user, &err) {
        (Some(user), kubevm::Error::Config(message))
            if message.starts_with(&format!("user {user:?} not found")) =>
        {
            CommandError::Failed(format!(
                "{message}; --user is the kubeconfig user: to create a user in the guest pass --guest-user {user}"
            ))
        }
        _ => err.into(),
    }
}

fn usage(err: impl std::fmt::Display) -> CommandError {
    CommandError::usage(err.to_string())
}

/// Files the flags name, read before any request.
struct Inputs {
    cloud_init: Option<String>,
    ssh_keys: Vec<String>,
    ca_public_keys: Option<Vec<String>>,
}

fn read_file(flag: &str, path: &Path) -> CommandResult<String> {
    std::fs::read_to_string(path)
        .map_err(|e| CommandError::usage(format!("{flag} {}: {e}", path.display())))
}

/// OpenSSH public key lines of a file (comments and blank lines skipped), each checked.
fn public_keys(flag: &str, path: &Path) -> CommandResult<Vec<String>> {
    let text = read_file(flag, path)?;
    let keys: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    if keys.is_empty() {
        return Err(CommandError::usage(format!(
            "{flag} {}: no public key in the file",
            path.display()
        )));
    }
    for key in &keys {
        validate::ssh_public_key(key)
            .map_err(|e| CommandError::usage(format!("{flag} {}: {e}", path.display())))?;
    }
    Ok(keys)
}

fn read_inputs(args: &CreateArgs) -> CommandResult<Inputs> {
    let cloud_init = args
        .cloud_init
        .as_deref()
        .map(|p| read_file("--cloud-init", p))
        .transpose()?;
    let mut ssh_keys = Vec::new();
    for path in &args.ssh_key {
        ssh_keys.extend(public_keys("--ssh-key", path)?);
    }
    let ca_public_keys = args
        .ca_public_key
        .as_deref()
        .map(|p| public_keys("--ca-public-key", p))
        .transpose()?;
    Ok(Inputs {
        cloud_init,
        ssh_keys,
        ca_public_keys,
    })
}

fn parse<T: std::str::FromStr>(flag: &str, value: &Option<String>) -> CommandResult<Option<T>>
where
    T::Err: std::fmt::Display,
{
    value
        .as_deref()
        .map(|v| {
            v.parse::<T>()
                .map_err(|e| CommandError::usage(format!("--{flag}: {e}")))
        })
        .transpose()
}

fn parse_all<T: std::str::FromStr>(flag: &str, values: &[String]) -> CommandResult<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    values
        .iter()
        .map(|v| {
            v.parse::<T>()
                .map_err(|e| CommandError::usage(format!("--{flag}: {e}")))
        })
        .collect()
}

/// The plan the flags describe (not yet checked against the cluster).
fn build_plan(
    args: &CreateArgs,
    inputs: &Inputs,
    name: &str,
    namespace: &str,
    flavor: Flavor,
) -> CommandResult<VmPlan> {
    let boot = BootSource::from_flags(BootFlags {
        image: args.image.clone(),
        ephemeral: args.ephemeral,
        url: args.url.clone(),
        checksums: parse_all::<Checksum>("checksum", &args.checksum)?,
        clone_pvc: args.clone_pvc.clone(),
        blank: parse::<Quantity>("blank", &args.blank)?,
        disk: args.disk.clone(),
    })
    .map_err(usage)?;
    let mut plan = VmPlan::new(name, namespace, flavor, boot);
    plan.disk_size = parse::<Quantity>("disk-size", &args.disk_size)?;
    plan.storage_class = args.storage_class.clone();
    plan.boot_bus = parse::<DiskBus>("boot-bus", &args.boot_bus)?;
    plan.cpu = args
        .cpu
        .as_deref()
        .map(|v| validate::cpu_cores(v).map_err(|e| CommandError::usage(format!("--cpu: {e}"))))
        .transpose()?;
    plan.memory = parse::<Quantity>("memory", &args.memory)?;
    plan.core_fraction = parse::<CoreFraction>("core-fraction", &args.core_fraction)?;
    plan.class = args.class.clone();
    plan.instancetype = args
        .instancetype
        .as_deref()
        .map(|v| {
            KindRef::instancetype(v)
                .map_err(|e| CommandError::usage(format!("--instancetype: {e}")))
        })
        .transpose()?;
    plan.preference = args
        .preference
        .as_deref()
        .map(|v| {
            KindRef::preference(v).map_err(|e| CommandError::usage(format!("--preference: {e}")))
        })
        .transpose()?;
    plan.infer_from_image = args.infer_from_image;
    plan.firmware = parse::<Firmware>("firmware", &args.firmware)?;
    plan.os = parse::<OsType>("os", &args.os)?.unwrap_or_default();
    plan.timezone = args.timezone.clone();
    plan.hostname = args.hostname.clone();
    plan.run_strategy = parse::<RunStrategy>("run-strategy", &args.run_strategy)?;
    plan.stopped = args.stopped;
    plan.replicas = args
        .replicas
        .as_deref()
        .map(|v| {
            v.trim().parse::<u32>().map_err(|_| {
                CommandError::usage(format!(
                    "--replicas {v:?}: give a whole number of VMs, 1 to {}",
                    create::pool::MAX_REPLICAS
                ))
            })
        })
        .transpose()?;
    plan.labels = parse_all::<Label>("label", &args.labels)?;
    plan.data_disks = parse_all::<DataDisk>("data-disk", &args.data_disk)?;
    plan.placement = args.placement.parse()?;
    plan.guest.user_data = inputs.cloud_init.clone();
    plan.guest.ssh_keys = inputs.ssh_keys.clone();
    plan.guest.user = args.guest_user.clone();
    plan.guest.env = parse_all::<EnvVar>("env", &args.env)?;
    plan.platform_ssh.enabled = !args.no_platform_ssh;
    plan.guest.guest_agent = !args.no_guest_agent;
    plan.extras = Extras {
        sockets: parse::<u32>("sockets", &args.sockets)?,
        threads: parse::<u32>("threads", &args.threads)?,
        uuid: args.uuid.clone(),
        serial: args.serial.clone(),
        secure_boot: args.secure_boot,
        persistent_efi: args.persistent_efi,
        subdomain: args.subdomain.clone(),
        user_data_secret: args.user_data_secret.clone(),
        ssh_key_secrets: args.ssh_key_secret.clone(),
        access_credentials: parse_all::<AccessCredential>(
            "access-credential",
            &args.access_credential,
        )?,
        console_log: args.console_log,
        networks: args.network.clone(),
        ip: args.ip.clone(),
    };
    Ok(plan)
}

fn print_objects(
    out: &mut dyn Write,
    objects: &[Value],
    format: Option<OutputFormat>,
    suffix: &str,
) -> CommandResult {
    match format {
        Some(OutputFormat::Yaml) => {
            for (i, object) in objects.iter().enumerate() {
                if i > 0 {
                    writeln!(out, "---")?;
                }
                render::write_object(out, object, OutputFormat::Yaml)?;
            }
        }
        Some(OutputFormat::Json) => render::write_object(
            out,
            &render::list_object(objects.to_vec()),
            OutputFormat::Json,
        )?,
        Some(OutputFormat::Name) => {
            for object in objects {
                writeln!(out, "{}", object_ref(object))?;
            }
        }
        Some(OutputFormat::Wide) | None => {
            for object in objects {
                writeln!(out, "{} created{suffix}", object_ref(object))?;
            }
        }
    }
    Ok(())
}

fn print_applied(
    out: &mut dyn Write,
    applied: &[Applied],
    format: Option<OutputFormat>,
    suffix: &str,
) -> CommandResult {
    if format.is_some_and(|f| f != OutputFormat::Wide) {
        let objects: Vec<Value> = applied.iter().map(|a| a.object.clone()).collect();
        return print_objects(out, &objects, format, suffix);
    }
    for a in applied {
        // A disk kept by `delete --keep-disks` is reused as it is.
        let verb = if a.created { "created" } else { "reused" };
        writeln!(out, "{} {verb}{suffix}", object_ref(&a.object))?;
    }
    Ok(())
}

/// `kind.group/name` of an object.
fn object_ref(object: &Value) -> String {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    match Kind::of(object) {
        Some(kind) => kind.object_ref(name),
        None => format!(
            "{}/{name}",
            object["kind"]
                .as_str()
                .unwrap_or_default()
                .to_ascii_lowercase()
        ),
    }
}

/// Wait for the VM, showing disk imports as progress bars on a terminal and as lines otherwise.
async fn wait_for(
    cluster: &Cluster,
    flavor: Flavor,
    plan: &VmPlan,
    timeout: Duration,
) -> CommandResult {
    let want = if plan.stopped || !plan.run_strategy().starts_at_creation() {
        "Stopped"
    } else {
        "Running"
    };
    let timeout = if timeout.is_zero() {
        Duration::from_secs(u64::MAX / 4)
    } else {
        timeout
    };
    let mut progress = crate::progress::DiskProgress::new(std::io::stderr().is_terminal());
    let result = wait::until_status(
        cluster,
        flavor,
        &plan.name,
        &plan.namespace,
        want,
        timeout,
        |s: &Snapshot| progress.update(&plan.name, s),
    )
    .await;
    progress.finish();
    match result {
        Ok(snapshot) => {
            let pending: Vec<&str> = snapshot
                .disks
                .iter()
                .filter(|d| d.pending_first_consumer)
                .map(|d| d.name.as_str())
                .collect();
            if pending.is_empty() || snapshot.vm_status == want {
                eprintln!("virtualmachine {:?} is {want}", plan.name);
            } else {
                // WaitForFirstConsumer storage binds these only when the VM first starts.
                eprintln!(
                    "virtualmachine {:?} is created stopped; disks pending-first-consumer (their storage binds them when the VM first starts): {}",
                    plan.name,
                    pending.join(", ")
                );
            }
            Ok(())
        }
        Err(kubevm::Error::Timeout(what)) => Err(CommandError::Failed(format!(
            "timed out waiting for {what}"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// The manifests, for the interactive preview.
pub fn preview(manifests: &Manifests) -> String {
    let mut buf = Vec::new();
    let objects: Vec<Value> = manifests.objects.iter().map(|o| o.object.clone()).collect();
    let _ = print_objects(&mut buf, &objects, Some(OutputFormat::Yaml), "");
    String::from_utf8_lossy(&buf).into_owned()
}
