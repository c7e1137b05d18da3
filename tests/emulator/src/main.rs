//! `kubevm-emulator`: runs the emulator until SIGINT/SIGTERM.
//!
//! `kubevm-emulator [--fixture FILE]... [--flavor kubevirt|deckhouse|both] [--port N] [--kubeconfig PATH] [--step-ms N] [--unserve GROUP]...
//! [--guest default|qemu] [--guest-dir DIR] [--guest-network open|restricted]`

use clap::{Parser, ValueEnum};
use kubevm_emulator::{Emulator, EmulatorOptions, ServeFlavor};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum GuestKind {
    /// Login process on a pseudo-terminal (plus a real sshd when run as root).
    Default,
    /// A real Linux guest: qemu TCG from the image of tests/guest/build-image.sh.
    Qemu,
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum GuestNetwork {
    /// User-mode networking with a route to the host's network.
    Open,
    /// No route out of the guest (`-netdev user,restrict=on`); port forwards still work.
    Restricted,
}

#[derive(Clone, Copy, ValueEnum)]
enum Flavor {
    Kubevirt,
    Deckhouse,
    Both,
}

/// Emulated Kubernetes API server with KubeVirt, CDI and Deckhouse virtualization APIs.
#[derive(Parser)]
#[command(name = "kubevm-emulator", version)]
struct Args {
    /// Multi-document YAML fixture to load (repeatable).
    #[arg(long)]
    fixture: Vec<PathBuf>,
    /// Platform APIs to serve.
    #[arg(long, value_enum, default_value = "kubevirt")]
    flavor: Flavor,
    /// Port on 127.0.0.1 (0 = random).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Where to write the kubeconfig.
    #[arg(long, default_value = "./kubevm-emulator.kubeconfig")]
    kubeconfig: PathBuf,
    /// Controller step in milliseconds: each import step, VM phase and migration phase takes
    /// one (realistic by default; tests use 200 through the library).
    #[arg(long, default_value_t = 1000)]
    step_ms: u64,
    /// What runs behind the VMs' consoles and ports.
    #[arg(long, value_enum, default_value = "default")]
    guest: GuestKind,
    /// The qemu guest image directory (default: $KUBEVM_GUEST_DIR, else <repo>/.cache/guest).
    #[arg(long, value_name = "DIR")]
    guest_dir: Option<PathBuf>,
    /// The qemu guests' network.
    #[arg(long, value_enum, default_value = "open")]
    guest_network: GuestNetwork,
    /// An API group of the flavor not to serve (repeatable), e.g. `subresources.kubevirt.io`
    /// for a cluster with KubeVirt's CRDs but no virt-api.
    #[arg(long, value_name = "GROUP")]
    unserve: Vec<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let mut fixture_yaml = vec![];
    for f in &args.fixture {
        match std::fs::read_to_string(f) {
            Ok(t) => fixture_yaml.push(t),
            Err(e) => {
                eprintln!("kubevm-emulator: {}: {e}", f.display());
                return ExitCode::FAILURE;
            }
        }
    }
    let flavor = match args.flavor {
        Flavor::Kubevirt => ServeFlavor::KubeVirt,
        Flavor::Deckhouse => ServeFlavor::Deckhouse,
        Flavor::Both => ServeFlavor::Both,
    };
    let qemu = if args.guest == GuestKind::Qemu {
        let dir = args
            .guest_dir
            .clone()
            .unwrap_or_else(kubevm_emulator::core::qemu_guest::QemuConfig::default_dir);
        match kubevm_emulator::core::qemu_guest::QemuConfig::from_dir(&dir) {
            Ok(mut c) => {
                c.restrict_network = args.guest_network == GuestNetwork::Restricted;
                Some(c)
            }
            Err(e) => {
                eprintln!("kubevm-emulator: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let emu = match Emulator::start(EmulatorOptions {
        fixture_yaml,
        flavor,
        port: args.port,
        import_step: std::time::Duration::from_millis(args.step_ms.max(1)),
        unserved_groups: args.unserve.clone(),
    })
    .await
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("kubevm-emulator: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(config) = qemu
        && let Err(e) = emu.use_qemu_guests(config)
    {
        eprintln!("kubevm-emulator: qemu guests: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = emu.write_kubeconfig(&args.kubeconfig) {
        eprintln!("kubevm-emulator: {}: {e}", args.kubeconfig.display());
        return ExitCode::FAILURE;
    }
    println!(
        "kubevm-emulator listening on {} (kubeconfig: {})",
        emu.url(),
        args.kubeconfig.display()
    );
    wait_for_signal().await;
    emu.shutdown().await;
    ExitCode::SUCCESS
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
