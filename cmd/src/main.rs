//! `kubectl-vm`: manage virtual machines on KubeVirt and Deckhouse virtualization.
//!
//! The same binary answers as `kubectl_complete-vm`, the program kubectl runs to complete
//! `kubectl vm <TAB>`.

mod cli;
mod commands;
mod complete;
mod connect;
mod dispatch;
mod error;
mod flags;
mod interrupt;
mod progress;
mod prompt;
mod render;
mod terminal;

use std::process::ExitCode;

fn main() -> ExitCode {
    if complete::invoked_as_kubectl_completer() {
        return complete::run_kubectl_completer(cli::command);
    }
    complete::handle_shell_request(cli::command);
    dispatch::run()
}
