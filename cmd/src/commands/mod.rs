//! One module per command and the single dispatch over them.

pub mod ca;
pub mod completion;
pub mod create;
pub mod create_interactive;
pub mod delete;
pub mod export;
pub mod generate_docs;
pub mod get;
pub mod list;
pub mod version;

use std::process::ExitCode;

use clap::Parser;
use kubevm::cluster::Cluster;
use kubevm::flavor::{self, Platform};

use crate::cli::{Cli, Command, GlobalArgs};
use crate::error::{CommandError, CommandResult};

/// Parse the command line, run the command, and turn the outcome into an exit code.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
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
            _ = tokio::signal::ctrl_c() => Err(CommandError::Interrupted),
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
        Command::Export(args) => export::cmd_export(&global, *args).await,
        Command::Ca(args) => ca::cmd_ca(&global, args).await,
        Command::Version(args) => version::cmd_version(&global, args).await,
        Command::Completion(args) => completion::cmd_completion(args),
        Command::GenerateDocs(args) => generate_docs::cmd_generate_docs(args),
    }
}

/// Connect to the cluster the global flags select and find out its platform.
pub async fn connect(global: &GlobalArgs) -> CommandResult<(Cluster, Platform)> {
    let cluster = Cluster::connect(&global.connect_options()).await?;
    let platform = flavor::discover(&cluster, global.flavor_choice()).await?;
    Ok((cluster, platform))
}
