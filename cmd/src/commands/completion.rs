//! `kubectl vm completion SHELL|install`: shell completion for `kubectl-vm`, and kubectl's
//! plugin completion (`kubectl vm <TAB>`) through the `kubectl_complete-vm` link.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use clap_complete::env::{Bash, Elvish, EnvCompleter, Fish, Powershell, Zsh};

use crate::complete::{COMPLETE_VAR, KUBECTL_COMPLETER, binary_name};
use crate::error::{CommandError, CommandResult};

/// Arguments of `completion`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  source <(kubectl vm completion bash)      # kubectl-vm <TAB> in this bash\n  kubectl vm completion zsh > \"${fpath[1]}/_kubectl-vm\"\n  kubectl vm completion install             # kubectl vm <TAB> (kubectl >= 1.26)"
)]
pub struct CompletionArgs {
    #[command(subcommand)]
    pub action: CompletionAction,
}

/// What `completion` does.
#[derive(Debug, Subcommand)]
pub enum CompletionAction {
    /// Print the bash completion script
    Bash,
    /// Print the zsh completion script
    Zsh,
    /// Print the fish completion script
    Fish,
    /// Print the PowerShell completion script
    Powershell,
    /// Print the elvish completion script
    Elvish,
    /// Link `kubectl_complete-vm` next to this binary so kubectl completes `kubectl vm`
    Install {
        /// Directory for the link (default: the directory of this binary)
        #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        dir: Option<PathBuf>,
    },
}

/// The completion script for one shell.
pub fn script(shell: &dyn EnvCompleter) -> Vec<u8> {
    let mut buf = Vec::new();
    let name = binary_name();
    shell
        .write_registration(COMPLETE_VAR, name, name, name, &mut buf)
        .expect("writing to memory cannot fail");
    buf
}

pub fn cmd_completion(args: CompletionArgs) -> CommandResult {
    let shell: &dyn EnvCompleter = match args.action {
        CompletionAction::Bash => &Bash,
        CompletionAction::Zsh => &Zsh,
        CompletionAction::Fish => &Fish,
        CompletionAction::Powershell => &Powershell,
        CompletionAction::Elvish => &Elvish,
        CompletionAction::Install { dir } => return install(dir.as_deref()),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(&script(shell))?;
    out.flush()?;
    Ok(())
}

fn install(dir: Option<&Path>) -> CommandResult {
    let exe = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .map_err(|e| CommandError::Failed(format!("cannot find this program's path: {e}")))?;
    let dir = match dir {
        Some(dir) => dir.to_owned(),
        None => exe.parent().map(Path::to_owned).unwrap_or_default(),
    };
    if !dir.is_dir() {
        return Err(CommandError::usage(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let link = dir.join(KUBECTL_COMPLETER);
    match std::fs::read_link(&link) {
        Ok(current) if current == exe => {
            println!("{} already points to {}", link.display(), exe.display());
            return Ok(());
        }
        Ok(_) => std::fs::remove_file(&link)?,
        Err(_) if link.exists() => {
            return Err(CommandError::Failed(format!(
                "{} exists and is not a link; remove it first",
                link.display()
            )));
        }
        Err(_) => {}
    }
    symlink(&exe, &link)
        .map_err(|e| CommandError::Failed(format!("cannot create {}: {e}", link.display())))?;
    println!("linked {} -> {}", link.display(), exe.display());
    if !on_path(&dir) {
        println!(
            "note: {} is not on PATH; kubectl only finds completers on PATH",
            dir.display()
        );
    }
    Ok(())
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    // Symlinks need extra rights on Windows; a copy works as well for kubectl.
    std::fs::copy(target, link).map(|_| ())
}

fn on_path(dir: &Path) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p == dir))
        .unwrap_or(false)
}
