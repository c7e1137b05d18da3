//! Raw mode for interactive streams, restored on every way out: the guard's drop (normal end,
//! errors, a cancelled future on Ctrl-C), a panic (the hook runs even when panics abort), and
//! explicit [`restore`] calls from signal handling.

use std::io::IsTerminal;
use std::sync::{Mutex, Once};

use nix::sys::termios::{self, SetArg, Termios};

/// The terminal modes to go back to, while raw mode is on.
static SAVED: Mutex<Option<Termios>> = Mutex::new(None);
static HOOK: Once = Once::new();

/// Raw mode on stdin while alive.
pub struct RawMode(());

impl RawMode {
    /// Switches stdin to raw mode (no echo, no line editing, no signals from keys: Ctrl+C is
    /// a byte for the guest). `None` when stdin is not a terminal.
    pub fn enable() -> std::io::Result<Option<RawMode>> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Ok(None);
        }
        let original = termios::tcgetattr(&stdin)?;
        let mut raw = original.clone();
        termios::cfmakeraw(&mut raw);
        *SAVED.lock().unwrap_or_else(|e| e.into_inner()) = Some(original);
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &raw)?;
        Ok(Some(RawMode(())))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        restore();
    }
}

/// Puts back the modes saved by [`RawMode::enable`], if raw mode is on.
pub fn restore() {
    let saved = SAVED.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(original) = saved {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &original);
    }
}
