//! Seeded faults in the platform's streams (issue 37): the websocket connections of console,
//! VNC and port-forward (and so ssh and scp) and the HTTP connections of the export and upload
//! servers, and KubeVirt's `vnc/screenshot` answer, can be cut, truncated mid-frame, stalled or
//! slowed at a chosen or seeded byte offset.
//! A test switches them on for the connections opened after it (`set`); with none set every
//! connection passes through untouched.
//!
//! The faults are those of a real network between a client and the API server: a dropped link
//! (the peer sees the connection end with no close frame), a proxy that cuts a frame short, a
//! link that stops carrying data for a while and resumes, a slow link.

use std::io;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What happens to one connection. Offsets count the bytes the connection carried in both
/// directions, so a cut can fall in a download (toward the client) or an upload (from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing.
    None,
    /// The connection ends at the first write or read that would carry it past `after` bytes:
    /// a dropped link, at a frame boundary.
    Cut {
        /// Bytes carried before the cut.
        after: u64,
    },
    /// Exactly `after` bytes go through, then the connection ends: a frame cut short.
    Truncate {
        /// Bytes carried before the cut.
        after: u64,
    },
    /// After `after` bytes nothing moves for `pause`; then the connection goes on.
    Stall {
        /// Bytes carried before the stall.
        after: u64,
        /// How long nothing moves.
        pause: Duration,
    },
    /// Every write toward the client waits `each` first.
    Delay {
        /// The wait per write.
        each: Duration,
    },
}

/// Where the faults come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultSource {
    /// Each new connection gets a fault drawn from this seed and its sequence number, so a
    /// run is repeatable.
    Seeded(u64),
    /// Each new connection gets this fault.
    Fixed(Fault),
}

/// The faults of an emulator: what new connections get, and what each got.
#[derive(Default)]
pub struct StreamFaults {
    source: Mutex<Option<FaultSource>>,
    next: AtomicU64,
    applied: Mutex<Vec<(&'static str, Fault)>>,
}

impl StreamFaults {
    /// Faults for the connections opened from now on (`None`: none).
    pub fn set(&self, source: Option<FaultSource>) {
        *self.source.lock().unwrap() = source;
        self.next.store(0, Ordering::SeqCst);
    }

    /// The faults given so far, with the stream each went to (`console`, `vnc`,
    /// `portforward`, `export`, `upload`), in order.
    pub fn applied(&self) -> Vec<(&'static str, Fault)> {
        self.applied.lock().unwrap().clone()
    }

    /// `io` with the fault the next connection of `stream` gets.
    pub fn wrap<T>(&self, stream: &'static str, io: T) -> Faulty<T> {
        Faulty::new(io, self.next(stream))
    }

    /// `data` as a response body with the fault the next response of `stream` gets: a cut or
    /// truncation ends the body with an error after that many bytes (the server aborts the
    /// connection mid-body, as a dropped link does), a stall pauses it there, a delay waits
    /// before each 4 KiB chunk.
    pub fn body(&self, stream: &'static str, data: Vec<u8>) -> axum::body::Body {
        let fault = self.next(stream);
        if fault == Fault::None {
            return axum::body::Body::from(data);
        }
        // State: the data, the offset sent so far, whether the body ended, whether it stalled.
        let start = (data, 0usize, false, false);
        let chunks = futures::stream::unfold(start, move |(data, at, done, stalled)| async move {
            if done || at >= data.len() {
                return None;
            }
            let mut end = (at + 4096).min(data.len());
            let mut stalled_now = stalled;
            match fault {
                Fault::Cut { after } | Fault::Truncate { after } => {
                    let after = after as usize;
                    if at >= after {
                        return Some((Err(ended()), (data, at, true, stalled)));
                    }
                    end = end.min(after);
                }
                Fault::Stall { after, pause } if !stalled => {
                    let after = after as usize;
                    if at >= after {
                        tokio::time::sleep(pause).await;
                        stalled_now = true;
                    } else {
                        end = end.min(after);
                    }
                }
                Fault::Delay { each } => tokio::time::sleep(each).await,
                _ => {}
            }
            let chunk = bytes::Bytes::copy_from_slice(&data[at..end]);
            Some((Ok(chunk), (data, end, false, stalled_now)))
        });
        axum::body::Body::from_stream(chunks)
    }

    /// The fault the next connection (or response) of `stream` gets, recorded if any.
    fn next(&self, stream: &'static str) -> Fault {
        let fault = match *self.source.lock().unwrap() {
            None => Fault::None,
            Some(FaultSource::Fixed(f)) => f,
            Some(FaultSource::Seeded(seed)) => {
                let n = self.next.fetch_add(1, Ordering::SeqCst);
                draw(seed, n)
            }
        };
        if fault != Fault::None {
            self.applied.lock().unwrap().push((stream, fault));
        }
        fault
    }
}

/// SplitMix64: a fixed, well-mixed sequence from a seed (no dependency, same on every machine).
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The fault of connection `n` of a seeded run: offsets up to 256 KiB (inside handshakes,
/// first frames and bulk data alike), stalls of 0.2 to 3 s, delays of 1 to 4 ms per write.
pub fn draw(seed: u64, n: u64) -> Fault {
    let r = splitmix(seed ^ splitmix(n));
    let after = splitmix(r) % (256 * 1024);
    match r % 4 {
        0 => Fault::Cut { after },
        1 => Fault::Truncate { after },
        2 => Fault::Stall {
            after,
            pause: Duration::from_millis(200 + splitmix(r ^ 1) % 2800),
        },
        _ => Fault::Delay {
            each: Duration::from_millis(1 + splitmix(r ^ 2) % 4),
        },
    }
}

/// A connection with a fault.
pub struct Faulty<T> {
    inner: T,
    fault: Fault,
    carried: u64,
    /// The connection was ended by the fault.
    ended: bool,
    /// A pending stall.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The pending delay of the next write.
    delay: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The next write's delay is over.
    delay_passed: bool,
    /// The stall happened (it happens once).
    stalled: bool,
}

impl<T> Faulty<T> {
    fn new(inner: T, fault: Fault) -> Self {
        Faulty {
            inner,
            fault,
            carried: 0,
            ended: false,
            sleep: None,
            delay: None,
            delay_passed: false,
            stalled: false,
        }
    }

    /// How many of `len` bytes may move now; `None` once the connection is to end. A read
    /// does not know how many bytes will come, so a cut falls on a read at its exact offset.
    fn allowance(&mut self, len: usize, reading: bool) -> Option<usize> {
        if self.ended {
            return None;
        }
        let len = len as u64;
        let limit = match self.fault {
            Fault::Cut { after } if !reading && self.carried + len > after => {
                self.ended = true;
                return None;
            }
            Fault::Cut { after } | Fault::Truncate { after } => {
                let left = after.saturating_sub(self.carried);
                if left == 0 {
                    self.ended = true;
                    return None;
                }
                left
            }
            Fault::Stall { after, .. } if !self.stalled && self.carried < after => {
                after - self.carried
            }
            _ => u64::MAX,
        };
        Some(len.min(limit) as usize)
    }

    /// Waits out a stall (at its offset, in both directions) or, before a write, a delay;
    /// `Ready` once the bytes may move. A delay is its own timer: a read must not consume the
    /// wait of a write, or a connection that reads between writes would never write.
    fn poll_wait(&mut self, cx: &mut Context<'_>, writing: bool) -> Poll<()> {
        if let Fault::Stall { after, pause } = self.fault
            && !self.stalled
            && self.carried >= after
        {
            self.stalled = true;
            self.sleep = Some(Box::pin(tokio::time::sleep(pause)));
        }
        if let Some(sleep) = self.sleep.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.sleep = None;
        }
        if let (Fault::Delay { each }, true) = (self.fault, writing) {
            if self.delay.is_none() && !self.delay_passed {
                self.delay = Some(Box::pin(tokio::time::sleep(each)));
            }
            if let Some(delay) = self.delay.as_mut() {
                if delay.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.delay = None;
                self.delay_passed = true;
            }
        }
        Poll::Ready(())
    }
}

fn ended() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the link was cut (emulator fault)",
    )
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Faulty<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.poll_wait(cx, false).is_pending() {
            return Poll::Pending;
        }
        let Some(allowed) = this.allowance(buf.remaining(), true) else {
            // A cut link reads as the end of the stream.
            return Poll::Ready(Ok(()));
        };
        let mut scratch = vec![0u8; allowed.min(64 * 1024)];
        let mut limited = ReadBuf::new(&mut scratch);
        match Pin::new(&mut this.inner).poll_read(cx, &mut limited) {
            Poll::Ready(Ok(())) => {
                let n = limited.filled().len();
                buf.put_slice(limited.filled());
                this.carried += n as u64;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Faulty<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.poll_wait(cx, true).is_pending() {
            return Poll::Pending;
        }
        let Some(allowed) = this.allowance(data.len(), false) else {
            let _ = Pin::new(&mut this.inner).poll_shutdown(cx);
            return Poll::Ready(Err(ended()));
        };
        match Pin::new(&mut this.inner).poll_write(cx, &data[..allowed]) {
            Poll::Ready(Ok(n)) => {
                this.carried += n as u64;
                this.delay_passed = false;
                Poll::Ready(Ok(n))
            }
            other => other,
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.ended {
            return Poll::Ready(Err(ended()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn carry(fault: Fault, data: &[u8]) -> (Vec<u8>, bool) {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let mut faulty = Faulty::new(near, fault);
        let mut failed = false;
        for chunk in data.chunks(100) {
            if faulty.write_all(chunk).await.is_err() {
                failed = true;
                break;
            }
        }
        drop(faulty);
        let mut got = Vec::new();
        far.read_to_end(&mut got).await.unwrap();
        (got, failed)
    }

    #[tokio::test]
    async fn cuts_and_truncations_end_at_their_offset() {
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        assert_eq!(carry(Fault::None, &data).await, (data.clone(), false));
        // A cut ends at the write boundary before the offset.
        let (got, failed) = carry(Fault::Cut { after: 250 }, &data).await;
        assert_eq!((got.as_slice(), failed), (&data[..200], true));
        // A truncation carries exactly the offset's bytes.
        let (got, failed) = carry(Fault::Truncate { after: 250 }, &data).await;
        assert_eq!((got.as_slice(), failed), (&data[..250], true));
    }

    #[tokio::test]
    async fn a_stall_pauses_then_goes_on() {
        let data = vec![7u8; 1000];
        let start = tokio::time::Instant::now();
        let fault = Fault::Stall {
            after: 300,
            pause: Duration::from_millis(300),
        };
        let (got, failed) = carry(fault, &data).await;
        assert_eq!((got, failed), (data, false));
        // The elapsed time is the thing measured here: the stall must have held the bytes.
        assert!(start.elapsed() >= Duration::from_millis(300));
    }

    /// A connection that reads between its writes still writes under a delay (the read once
    /// consumed the write's timer and the write never went out).
    #[tokio::test]
    async fn delayed_writes_go_out_while_the_peer_is_read() {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let faulty = Faulty::new(
            near,
            Fault::Delay {
                each: Duration::from_millis(2),
            },
        );
        let (mut rd, mut wr) = tokio::io::split(faulty);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let _ = rd.read(&mut buf).await;
        });
        for _ in 0..50 {
            wr.write_all(b"0123456789").await.unwrap();
        }
        drop(wr);
        let mut got = vec![0u8; 500];
        tokio::time::timeout(Duration::from_secs(5), far.read_exact(&mut got))
            .await
            .expect("the writes went out")
            .unwrap();
        far.write_all(b"x").await.unwrap();
        reader.await.unwrap();
    }

    #[test]
    fn seeded_runs_repeat() {
        let a: Vec<Fault> = (0..20).map(|n| draw(42, n)).collect();
        let b: Vec<Fault> = (0..20).map(|n| draw(42, n)).collect();
        assert_eq!(a, b);
        assert_ne!(a, (0..20).map(|n| draw(43, n)).collect::<Vec<_>>());
        // Every kind of fault comes up.
        let kinds: std::collections::BTreeSet<u8> = (0..200)
            .map(|n| match draw(7, n) {
                Fault::Cut { .. } => 0,
                Fault::Truncate { .. } => 1,
                Fault::Stall { .. } => 2,
                Fault::Delay { .. } => 3,
                Fault::None => 4,
            })
            .collect();
        assert_eq!(kinds.len(), 4);
    }
}
