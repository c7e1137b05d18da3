//! Holding requests: a test makes matching requests (verb + plural) wait until it releases
//! them, to act while a client is in the middle of a multi-step operation (e.g. press Ctrl-C
//! while `create` waits for the server).

use std::sync::Mutex;

use tokio::sync::watch;

/// The requests being held back, shared by every connection.
#[derive(Debug)]
pub struct Holds {
    rules: Mutex<Vec<(String, String)>>,
    waiting: Mutex<usize>,
    released: watch::Sender<u64>,
}

impl Default for Holds {
    fn default() -> Self {
        Holds {
            rules: Mutex::new(Vec::new()),
            waiting: Mutex::new(0),
            released: watch::channel(0).0,
        }
    }
}

impl Holds {
    /// Hold requests with `verb` (`create`, `delete`, …) on `plural` from now on.
    pub fn add(&self, verb: &str, plural: &str) {
        self.rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((verb.to_owned(), plural.to_owned()));
    }

    /// Drop every rule and let the held requests go on.
    pub fn release_all(&self) {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.released.send_modify(|n| *n += 1);
    }

    /// How many requests are being held right now.
    pub fn waiting(&self) -> usize {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait here while a rule matches the request.
    pub async fn pass(&self, verb: &str, plural: &str) {
        let matches =
            |rules: &Vec<(String, String)>| rules.iter().any(|(v, p)| v == verb && p == plural);
        if !matches(&self.rules.lock().unwrap_or_else(|e| e.into_inner())) {
            return;
        }
        let mut rx = self.released.subscribe();
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let _ = rx.changed().await;
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
    }
}
