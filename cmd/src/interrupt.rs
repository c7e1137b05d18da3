//! Ctrl-C: by default it ends the program (exit 130). A command that must clean up first
//! (`create` rolling back what it made) takes the presses over for a while and counts them.

use std::sync::Mutex;

use tokio::sync::watch;

static TAKEN: Mutex<Option<watch::Sender<usize>>> = Mutex::new(None);

/// Completes when Ctrl-C should end the program: on a press while no command has taken
/// Ctrl-C over. Presses while taken over are counted for that command instead.
pub async fn ends_program() {
    loop {
        if tokio::signal::ctrl_c().await.is_err() {
            return std::future::pending().await;
        }
        let taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        match taken.as_ref() {
            Some(tx) => tx.send_modify(|n| *n += 1),
            None => return,
        }
    }
}

/// While the guard lives, Ctrl-C presses are counted in the receiver instead of ending the
/// program.
pub struct TakenOver;

impl Drop for TakenOver {
    fn drop(&mut self) {
        *TAKEN.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Take Ctrl-C over; the receiver counts the presses from now on.
pub fn take_over() -> (TakenOver, watch::Receiver<usize>) {
    let (tx, rx) = watch::channel(0);
    *TAKEN.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    (TakenOver, rx)
}
