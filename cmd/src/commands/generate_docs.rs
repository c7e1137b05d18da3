//! `kubectl-vm generate-docs DIR` (hidden): writes the man pages and completion scripts that
//! are committed under `man/` and `completions/`. A test checks that the committed copies
//! match what this produces.

use std::path::{Path, PathBuf};

use clap::Args;
use clap_complete::env::{Bash, Elvish, EnvCompleter, Fish, Powershell, Zsh};

use crate::error::{CommandError, CommandResult};

/// Arguments of `generate-docs`.
#[derive(Debug, Args)]
pub struct GenerateDocsArgs {
    /// Directory that receives `man/` and `completions/` (the repository root)
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Write the generated files for the command line `command` builds.
pub fn cmd_generate_docs(args: GenerateDocsArgs, command: fn() -> clap::Command) -> CommandResult {
    write_all(&args.dir, command).map_err(|e| CommandError::Failed(format!("writing docs: {e}")))
}

/// Every generated file for the command line `command` builds: path relative to the root,
/// and content.
pub fn files(command: fn() -> clap::Command) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut command = command();
    // Building propagates the version and global flags into every subcommand's page.
    command.build();
    man_pages(&command, "kubectl-vm", "kubectl vm", &mut files);
    let shells: [(&dyn EnvCompleter, &str); 5] = [
        (&Bash, "kubectl-vm.bash"),
        (&Zsh, "_kubectl-vm"),
        (&Fish, "kubectl-vm.fish"),
        (&Powershell, "kubectl-vm.ps1"),
        (&Elvish, "kubectl-vm.elv"),
    ];
    for (shell, file) in shells {
        files.push((
            Path::new("completions").join(file),
            super::completion::script(shell),
        ));
    }
    files
}

/// One page per visible command: file `name.1`, usage shown as `invocation` (`kubectl vm list`).
fn man_pages(
    command: &clap::Command,
    name: &str,
    invocation: &str,
    files: &mut Vec<(PathBuf, Vec<u8>)>,
) {
    let page = command
        .clone()
        .name(name.to_owned())
        .bin_name(invocation.to_owned());
    let mut buf = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut buf)
        .expect("rendering to memory cannot fail");
    files.push((Path::new("man").join(format!("{name}.1")), buf));
    for sub in command
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let sub_name = sub.get_name();
        man_pages(
            sub,
            &format!("{name}-{sub_name}"),
            &format!("{invocation} {sub_name}"),
            files,
        );
    }
}

fn write_all(root: &Path, command: fn() -> clap::Command) -> std::io::Result<()> {
    for (path, content) in files(command) {
        let path = root.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
    }
    Ok(())
}
