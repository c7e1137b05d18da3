//! Waiting for text in a stream of output chunks, for tests: what was read past a match stays
//! for the next wait. A loaded machine can deliver an echo and the next prompt in one chunk; a
//! helper that dropped the rest would then wait for a prompt it had already consumed.

use bytes::Bytes;
use tokio::sync::broadcast;
use tokio::time::Instant;

/// Output read and not yet matched.
#[derive(Debug, Default)]
pub struct Unmatched {
    buf: Vec<u8>,
}

impl Unmatched {
    /// Appends a chunk as it was read.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Everything up to and including the first `text`, removed from the buffer; what follows
    /// the match stays. `None` (and nothing removed) while `text` has not been read.
    pub fn take_through(&mut self, text: &str) -> Option<String> {
        let needle = text.as_bytes();
        let at = if needle.is_empty() {
            0
        } else {
            self.buf.windows(needle.len()).position(|w| w == needle)?
        };
        let taken: Vec<u8> = self.buf.drain(..at + needle.len()).collect();
        Some(String::from_utf8_lossy(&taken).into_owned())
    }

    /// What is buffered, for messages.
    pub fn pending(&self) -> String {
        String::from_utf8_lossy(&self.buf).into_owned()
    }
}

/// A serial console's output, read by [`SerialReader::expect`].
#[derive(Debug)]
pub struct SerialReader {
    rx: broadcast::Receiver<Bytes>,
    rest: Unmatched,
}

impl SerialReader {
    /// Reads what `rx` receives from now on.
    pub fn new(rx: broadcast::Receiver<Bytes>) -> Self {
        SerialReader {
            rx,
            rest: Unmatched::default(),
        }
    }

    /// Waits until `text` has been read (by `deadline` at most) and returns the output up to
    /// and including it; what followed it is kept for the next call. On timeout or when the
    /// serial port closes: `Err` with the output read and not matched.
    pub async fn expect_by(&mut self, text: &str, deadline: Instant) -> Result<String, String> {
        loop {
            if let Some(seen) = self.rest.take_through(text) {
                return Ok(seen);
            }
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Ok(b)) => self.rest.push(&b),
                Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => {
                    return Err(self.rest.pending());
                }
            }
        }
    }

    /// [`SerialReader::expect_by`] within `limit`, panicking with what was seen.
    pub async fn expect(&mut self, text: &str, limit: std::time::Duration) -> String {
        self.expect_by(text, Instant::now() + limit)
            .await
            .unwrap_or_else(|seen| panic!("waiting for {text:?}; seen {seen:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_through_keeps_the_rest() {
        let mut u = Unmatched::default();
        u.push(b"cloud\r\nPass");
        assert_eq!(u.take_through("Password: "), None);
        u.push(b"word: ");
        assert_eq!(u.take_through("cloud").as_deref(), Some("cloud"));
        assert_eq!(
            u.take_through("Password: ").as_deref(),
            Some("\r\nPassword: ")
        );
        assert_eq!(u.pending(), "");
    }
}
