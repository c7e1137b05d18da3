//! How a command fails: one `Error: …` line on stderr and an exit code.
//!
//! 0 ok, 1 failed, 2 usage (bad flags, targets, names), 130 interrupted. A closed stdout
//! (`kubectl vm list | head -1`) ends the program quietly.

use std::fmt;
use std::process::ExitCode;

/// Why a command stopped.
#[derive(Debug)]
pub enum CommandError {
    /// Bad input: exit 2.
    Usage(String),
    /// Anything else that failed: exit 1.
    Failed(String),
    /// Ctrl-C: exit 130.
    Interrupted,
    /// The reader of stdout went away: exit quietly.
    BrokenPipe,
    /// A remote command's exit status, passed on as ours (`ssh`).
    Exit(u8),
    /// An SSH connection or authentication failure: the message, exit 255 like OpenSSH.
    Connection(String),
}

impl CommandError {
    /// A usage error.
    pub fn usage(message: impl Into<String>) -> Self {
        CommandError::Usage(message.into())
    }

    /// Print the error (if it has anything to say) and turn it into an exit code.
    pub fn report(self) -> ExitCode {
        match self {
            CommandError::Usage(message) => {
                eprintln!("Error: {message}");
                ExitCode::from(2)
            }
            CommandError::Failed(message) => {
                eprintln!("Error: {message}");
                ExitCode::from(1)
            }
            CommandError::Interrupted => {
                crate::terminal::restore_after_prompt();
                ExitCode::from(130)
            }
            CommandError::BrokenPipe => ExitCode::SUCCESS,
            CommandError::Exit(code) => ExitCode::from(code),
            CommandError::Connection(message) => {
                eprintln!("Error: {message}");
                ExitCode::from(255)
            }
        }
    }
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandError::Usage(m) | CommandError::Failed(m) | CommandError::Connection(m) => {
                f.write_str(m)
            }
            CommandError::Exit(code) => write!(f, "exit status {code}"),
            CommandError::Interrupted => f.write_str("interrupted"),
            CommandError::BrokenPipe => f.write_str("broken pipe"),
        }
    }
}

impl From<kubevm::Error> for CommandError {
    fn from(err: kubevm::Error) -> Self {
        match err {
            kubevm::Error::InvalidTarget(_) | kubevm::Error::Usage(_) => {
                CommandError::Usage(err.to_string())
            }
            other => CommandError::Failed(other.to_string()),
        }
    }
}

impl From<std::io::Error> for CommandError {
    fn from(err: std::io::Error) -> Self {
        if err.kind() == std::io::ErrorKind::BrokenPipe {
            CommandError::BrokenPipe
        } else {
            CommandError::Failed(err.to_string())
        }
    }
}

/// Result of a command.
pub type CommandResult<T = ()> = Result<T, CommandError>;
