//! Raw mode for interactive streams (`console`, `ssh`), restored on every way out: the guard's drop,
//! and a panic hook (release builds abort on panic, so drops would not run).

use std::io::{BufRead, IsTerminal, Write};
use std::sync::Mutex;

use rustix::termios::{self, OptionalActions, Termios};

/// The terminal modes to restore, while raw mode is on.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);

/// Raw mode on stdin until dropped.
pub struct RawMode(());

impl RawMode {
    /// Switch stdin to raw mode. `None` when stdin is not a terminal.
    pub fn enable() -> std::io::Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(None);
        }
        let saved = termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved);
        install_panic_hook();
        termios::tcsetattr(&stdin, OptionalActions::Now, &raw)?;
        Ok(Some(RawMode(())))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}

/// Put the saved modes back, if raw mode is on.
pub fn restore() {
    if let Some(saved) = SAVED.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &saved);
    }
}

/// Stop the process as Ctrl-Z would outside raw mode (ssh's `~^Z`): the saved modes back,
/// SIGTSTP to ourselves, and once continued (`fg`), raw mode again from the modes the
/// terminal has then, as OpenSSH's `client_suspend_self` does.
pub fn suspend() -> std::io::Result<()> {
    let saved = SAVED.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(saved) = &saved {
        termios::tcsetattr(std::io::stdin(), OptionalActions::Now, saved)?;
    }
    rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::TSTP)?;
    // Continued.
    if saved.is_some() {
        let stdin = std::io::stdin();
        let now = termios::tcgetattr(&stdin)?;
        let mut raw = now.clone();
        raw.make_raw();
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
        termios::tcsetattr(&stdin, OptionalActions::Now, &raw)?;
    }
    Ok(())
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

/// The terminal size of stdout (else stdin) as (columns, rows); 80x24 when unknown.
pub fn size() -> (u32, u32) {
    let ws = termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| termios::tcgetwinsize(std::io::stdin()));
    match ws {
        Ok(ws) if ws.ws_col > 0 && ws.ws_row > 0 => (u32::from(ws.ws_col), u32::from(ws.ws_row)),
        _ => (80, 24),
    }
}

/// Undo what an interrupted prompt may have left on the terminal: a hidden cursor (menus
/// hide it) and an unfinished line. Raw mode needs no undo here: prompts only hold it while
/// reading a key, and in raw mode Ctrl-C arrives as a key, not as a signal.
pub fn restore_after_prompt() {
    // A hidden read interrupted by Ctrl-C: echo back on.
    if let Some(saved) = HIDDEN_READ.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &saved,
        );
    }
    let mut err = std::io::stderr();
    if err.is_terminal() {
        let _ = err.write_all(b"\x1b[?25h\n");
        let _ = err.flush();
    }
}

/// The terminal settings to restore while a hidden read runs.
static HIDDEN_READ: std::sync::Mutex<Option<rustix::termios::Termios>> =
    std::sync::Mutex::new(None);

/// Read a line with echo off (a password), restoring the terminal after.
pub fn read_hidden(question: &str) -> std::io::Result<String> {
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
    let stdin = std::io::stdin();
    let saved = tcgetattr(&stdin)?;
    let mut quiet = saved.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    quiet.local_modes.insert(LocalModes::ECHONL);
    eprint!("{question}");
    std::io::stderr().flush()?;
    *HIDDEN_READ.lock().unwrap_or_else(|e| e.into_inner()) = Some(saved.clone());
    tcsetattr(&stdin, OptionalActions::Flush, &quiet)?;
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    HIDDEN_READ.lock().unwrap_or_else(|e| e.into_inner()).take();
    tcsetattr(&stdin, OptionalActions::Now, &saved)?;
    read?;
    Ok(line.trim_end_matches(['\n', '\r']).to_owned())
}
