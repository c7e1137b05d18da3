//! Yes/no confirmation on a terminal: the question goes to stderr, the answer comes from
//! stdin. Only asked when both are terminals, so scripts and pipes are never blocked.

use std::io::{BufRead, IsTerminal, Write};

use crate::error::{CommandError, CommandResult};

/// Whether a person can answer: stdin and stderr are both terminals.
pub fn interactive() -> bool {
    std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// Whether an answer means yes (`y` or `yes`, any case); anything else, an empty line
/// included, means no.
pub fn is_yes(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// Ask `question` followed by ` [y/N] ` and wait for a line. End of input is a no. The read
/// runs on a blocking thread, so Ctrl-C still interrupts the command.
pub async fn confirm(question: &str) -> CommandResult<bool> {
    let question = format!("{question} [y/N] ");
    tokio::task::spawn_blocking(move || ask(&question))
        .await
        .map_err(|e| CommandError::Failed(format!("cannot read the answer: {e}")))?
        .map_err(CommandError::from)
}

fn ask(question: &str) -> std::io::Result<bool> {
    let mut err = std::io::stderr().lock();
    err.write_all(question.as_bytes())?;
    err.flush()?;
    drop(err);
    let mut answer = String::new();
    if std::io::stdin().lock().read_line(&mut answer)? == 0 {
        // End of input (Ctrl-D): end the prompt's line so the next message starts cleanly.
        eprintln!();
        return Ok(false);
    }
    Ok(is_yes(&answer))
}

/// Read a line from the terminal with echo off, after `question` on stderr; the echo comes
/// back however the read ends. Only call when [`interactive`].
pub async fn secret(question: &str) -> CommandResult<String> {
    let question = question.to_owned();
    tokio::task::spawn_blocking(move || crate::terminal::read_hidden(&question))
        .await
        .map_err(|e| CommandError::Failed(format!("cannot read the answer: {e}")))?
        .map_err(CommandError::from)
}

#[cfg(test)]
mod tests {
    use super::is_yes;

    #[test]
    fn only_y_and_yes_confirm() {
        for yes in ["y", "Y", "yes", "YES\n", " yes "] {
            assert!(is_yes(yes), "{yes:?}");
        }
        for no in ["", "\n", "n", "no", "yep", "ja", "y es"] {
            assert!(!is_yes(no), "{no:?}");
        }
    }
}
