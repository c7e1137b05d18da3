//! The single dispatch from the parsed command line to the commands, and the exit code.

use std::process::ExitCode;

use clap::FromArgMatches;

use crate::cli::{Cli, Command};
use crate::commands::*;
use crate::error::{CommandError, CommandResult};

/// Parse the command line, run the command, and turn the outcome into an exit code.
pub fn run() -> ExitCode {
    let matches = crate::cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return CommandError::Failed(format!("cannot start the runtime: {e}")).report(),
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            // Polled first so Ctrl-C is caught from the very start.
            biased;
            _ = crate::interrupt::ends_program() => Err(CommandError::Interrupted),
            outcome = dispatch(cli) => outcome,
        }
    });
    // Do not wait for blocking work still running (a confirmation prompt interrupted by
    // Ctrl-C is still reading stdin).
    runtime.shutdown_background();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => e.report(),
    }
}

async fn dispatch(cli: Cli) -> CommandResult {
    let global = cli.global;
    match cli.command {
        Command::List(args) => list::cmd_list(&global, args).await,
        Command::Get(args) => get::cmd_get(&global, args).await,
        Command::Create(args) => create::cmd_create(&global, *args).await,
        Command::Delete(args) => delete::cmd_delete(&global, args).await,
        Command::Enroll(args) => enroll::cmd_enroll(&global, args).await,
        Command::Credentials(args) => credentials::cmd_credentials(&global, args).await,
        Command::Disk(args) => disk::cmd_disk(&global, args).await,
        Command::Snapshot(args) => snapshot::cmd_snapshot(&global, args).await,
        Command::Image(args) => image::cmd_image(&global, args).await,
        Command::Instancetype(args) => sizes::cmd_instancetype(&global, args).await,
        Command::Preference(args) => sizes::cmd_preference(&global, args).await,
        Command::Class(args) => sizes::cmd_class(&global, args).await,
        Command::Expose(args) => expose::cmd_expose(&global, *args).await,
        Command::Clone(args) => clone::cmd_clone(&global, *args).await,
        Command::Set(args) => set::cmd_set(&global, args).await,
        Command::Network(args) => network::cmd_network(&global, args).await,
        Command::Logs(args) => logs::cmd_logs(&global, args).await,
        Command::Deps(args) => deps::cmd_deps(&global, args).await,
        Command::Guestosinfo(args) => {
            guest_info::cmd_guest_info(&global, kubevm::guest_info::Fact::OsInfo, args).await
        }
        Command::Userlist(args) => {
            guest_info::cmd_guest_info(&global, kubevm::guest_info::Fact::Users, args).await
        }
        Command::Fslist(args) => {
            guest_info::cmd_guest_info(&global, kubevm::guest_info::Fact::Filesystems, args).await
        }
        Command::Export(args) => export::cmd_export(&global, *args).await,
        Command::Upload(args) => upload::cmd_upload(&global, *args).await,
        Command::Ca(args) => ca::cmd_ca(&global, args).await,
        Command::Console(args) => console::cmd_console(&global, args).await,
        Command::Ssh(args) => ssh::cmd_ssh(&global, args).await,
        Command::AnsibleInventory(args) => {
            ansible_inventory::cmd_ansible_inventory(&global, args).await
        }
        Command::SshConfig(args) => ssh_config::cmd_ssh_config(&global, args).await,
        Command::SshCert(args) => ssh_config::cmd_ssh_cert(&global, args).await,
        Command::SshKnownHosts(args) => ssh_config::cmd_ssh_known_hosts(&global, args).await,
        Command::Scp(args) => scp::cmd_scp(&global, args).await,
        Command::PortForward(args) => port_forward::cmd_port_forward(&global, args).await,
        Command::Version(args) => version::cmd_version(&global, args).await,
        Command::CollectDebugInfo(args) => {
            collect_debug_info::cmd_collect_debug_info(&global, args).await
        }
        Command::Vnc(args) => vnc::cmd_vnc(&global, args).await,
        Command::Signer(args) => signer::cmd_signer(&global, args).await,
        Command::Completion(args) => completion::cmd_completion(args),
        Command::GenerateDocs(args) => generate_docs::cmd_generate_docs(args, crate::cli::command),
        Command::Start(args) => lifecycle::cmd_power(&global, lifecycle::Power::Start(args)).await,
        Command::Stop(args) => lifecycle::cmd_power(&global, lifecycle::Power::Stop(args)).await,
        Command::Restart(args) => {
            lifecycle::cmd_power(&global, lifecycle::Power::Restart(args)).await
        }
        Command::Pause(args) => lifecycle::cmd_power(&global, lifecycle::Power::Pause(args)).await,
        Command::Unpause(args) => {
            lifecycle::cmd_power(&global, lifecycle::Power::Unpause(args)).await
        }
        Command::SoftReboot(args) => {
            lifecycle::cmd_power(&global, lifecycle::Power::SoftReboot(args)).await
        }
        Command::Reset(args) => lifecycle::cmd_power(&global, lifecycle::Power::Reset(args)).await,
        Command::Evict(args) => lifecycle::cmd_power(&global, lifecycle::Power::Evict(args)).await,
        Command::Migrate(args) => lifecycle::cmd_migrate(&global, args).await,
        Command::EvacuateCancel(args) => migrations::cmd_evacuate_cancel(&global, args).await,
        Command::MemoryDump(args) => memory_dump::cmd_memory_dump(&global, args).await,
    }
}
