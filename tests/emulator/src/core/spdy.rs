//! Port-forward over SPDY/3.1 tunnelled in a WebSocket, as kubectl ≥ 1.31 speaks it
//! (`PortForwardWebsockets`: subprotocol `SPDY/3.1+portforward.k8s.io`, the SPDY byte stream
//! carried in binary WebSocket messages; the API server's `StreamTranslator`/tunneling proxy,
//! `k8s.io/apimachinery/pkg/util/httpstream/wsstream` and `.../portforward/tunneling_connection.go`).
//!
//! The SPDY side follows `github.com/moby/spdystream` (the implementation client-go and the
//! kubelet use) and the kubelet's `pkg/kubelet/cri/streaming/portforward/httpstream.go`:
//! - frames: control `0x8003 type flags len24` (SYN_STREAM 1, SYN_REPLY 2, RST_STREAM 3,
//!   SETTINGS 4, PING 6, GOAWAY 7, HEADERS 8, WINDOW_UPDATE 9) and data `streamid31 flags len24`
//!   (FIN = 1); header blocks are zlib streams with the SPDY/3 dictionary, one compression
//!   context per direction for the whole connection;
//! - the client opens two streams per connection with headers `streamtype` (`error`, then
//!   `data`), `port` and `requestid`; the server answers each SYN_STREAM with an empty
//!   SYN_REPLY; when both streams of a request id exist the port is dialled: bytes are copied
//!   both ways on the data stream; a failure is written as text on the error stream; both
//!   streams are closed (FIN) when the connection ends;
//! - PING is echoed; WINDOW_UPDATE and SETTINGS are accepted and ignored (spdystream does not
//!   enforce flow control).

use crate::core::app::App;
use axum::extract::ws::{Message, WebSocket};
use flate2::{Decompress, FlushDecompress};
use futures::{SinkExt, StreamExt};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, WriteHalf};

/// The WebSocket subprotocol of tunnelled SPDY port-forwarding.
pub const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const FIN: u8 = 1;
/// Largest DATA payload sent (the kubelet copies with 32 KiB buffers).
const DATA_MAX: usize = 32 * 1024;

/// The SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy-00 §2.6.10.1): the
/// length-prefixed header names and values, then a run of status lines, dates and types.
pub fn dictionary() -> &'static [u8] {
    static DICT: OnceLock<Vec<u8>> = OnceLock::new();
    DICT.get_or_init(|| {
        let prefixed = [
            "options", "head", "post", "put", "delete", "trace", "accept", "accept-charset",
            "accept-encoding", "accept-language", "accept-ranges", "age", "allow",
            "authorization", "cache-control", "connection", "content-base", "content-encoding",
            "content-language", "content-length", "content-location", "content-md5",
            "content-range", "content-type", "date", "etag", "expect", "expires", "from", "host",
            "if-match", "if-modified-since", "if-none-match", "if-range", "if-unmodified-since",
            "last-modified", "location", "max-forwards", "pragma", "proxy-authenticate",
            "proxy-authorization", "range", "referer", "retry-after", "server", "te", "trailer",
            "transfer-encoding", "upgrade", "user-agent", "vary", "via", "warning",
            "www-authenticate", "method", "get", "status", "200 OK", "version", "HTTP/1.1",
            "url", "public", "set-cookie", "keep-alive", "origin",
        ];
        let mut d = Vec::with_capacity(1423);
        for p in prefixed {
            d.extend_from_slice(&(p.len() as u32).to_be_bytes());
            d.extend_from_slice(p.as_bytes());
        }
        d.extend_from_slice(
            b"100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505\
203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request\
401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented\
503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 \
Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,\
application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=\
gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
        );
        d
    })
}

/// Encodes a control frame.
fn control(kind: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&[0x80, 0x03]);
    f.extend_from_slice(&kind.to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// Encodes a data frame.
pub fn data_frame(stream: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(8 + payload.len());
    f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    f.push(flags);
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    f.extend_from_slice(payload);
    f
}

/// The header-block encoder of one connection: a zlib stream of stored (uncompressed) deflate
/// blocks without a preset dictionary, which any zlib reader given the dictionary accepts.
#[derive(Default)]
pub struct HeaderEncoder {
    started: bool,
}

impl HeaderEncoder {
    /// One header block (name/value pairs, names lower-case).
    pub fn encode(&mut self, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut raw = Vec::new();
        raw.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (k, v) in headers {
            for s in [k, v] {
                raw.extend_from_slice(&(s.len() as u32).to_be_bytes());
                raw.extend_from_slice(s.as_bytes());
            }
        }
        let mut out = Vec::new();
        if !self.started {
            // CMF deflate/32K window, FLG without FDICT; (0x78 << 8 | 0x01) % 31 == 0.
            out.extend_from_slice(&[0x78, 0x01]);
            self.started = true;
        }
        for chunk in raw.chunks(0xffff) {
            let len = chunk.len() as u16;
            out.push(0x00); // BFINAL 0, BTYPE 00 (stored), padded to the byte
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(chunk);
        }
        // An empty stored block (a zlib sync flush, as Go's `Flush` writes): Go's inflater
        // hands out a block's data only when the next block starts, and must not have to
        // read past this frame for it.
        out.extend_from_slice(&[0x00, 0x00, 0x00, 0xff, 0xff]);
        out
    }
}

/// The header-block decoder of one connection (zlib with the SPDY/3 dictionary).
pub struct HeaderDecoder {
    inflate: Decompress,
}

impl Default for HeaderDecoder {
    fn default() -> Self {
        HeaderDecoder {
            inflate: Decompress::new(true),
        }
    }
}

impl HeaderDecoder {
    /// Decodes one compressed header block into (name, value) pairs.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<(String, String)>, String> {
        let mut out = Vec::with_capacity(4096);
        let mut input = block;
        loop {
            let before_in = self.inflate.total_in();
            if out.capacity() - out.len() < 1024 {
                out.reserve(4096);
            }
            let result = self
                .inflate
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let used = (self.inflate.total_in() - before_in) as usize;
            input = &input[used..];
            match result {
                Ok(_) if input.is_empty() => break,
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(dictionary())
                        .map_err(|e| format!("SPDY header dictionary: {e}"))?;
                }
                Err(e) => return Err(format!("SPDY header block: {e}")),
            }
        }
        parse_block(&out)
    }
}

fn parse_block(raw: &[u8]) -> Result<Vec<(String, String)>, String> {
    let bad = || "malformed SPDY header block".to_string();
    let mut pos = 0usize;
    let u32_at = |pos: &mut usize| -> Result<usize, String> {
        let b = raw.get(*pos..*pos + 4).ok_or_else(bad)?;
        *pos += 4;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let n = u32_at(&mut pos)?;
    let mut pairs = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let text = |pos: &mut usize| -> Result<String, String> {
            let len = u32_at(pos)?;
            let s = raw.get(*pos..*pos + len).ok_or_else(bad)?;
            *pos += len;
            Ok(String::from_utf8_lossy(s).into_owned())
        };
        let k = text(&mut pos)?;
        let v = text(&mut pos)?;
        pairs.push((k.to_ascii_lowercase(), v));
    }
    Ok(pairs)
}

/// One SPDY stream the client opened.
struct Stream {
    kind: String,
    request: String,
    port: u16,
    /// The forwarded connection's write side (data streams, once dialled).
    writer: Option<WriteHalf<DuplexStream>>,
}

/// Serves one tunnelled SPDY port-forward connection to `pod`.
pub async fn serve_tunnel(app: Arc<App>, socket: WebSocket, pod: Value) {
    let (mut sink, mut source) = socket.split();
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(32);
    let writer = tokio::spawn(async move {
        while let Some(frame) = out_rx.recv().await {
            if sink.send(Message::Binary(frame.into())).await.is_err() {
                return;
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    });
    let mut buf: Vec<u8> = Vec::new();
    let mut encoder = HeaderEncoder::default();
    let mut decoder = HeaderDecoder::default();
    let mut streams: HashMap<u32, Stream> = HashMap::new();
    'conn: while let Some(msg) = source.next().await {
        match msg {
            Ok(Message::Binary(b)) => buf.extend_from_slice(&b),
            Ok(Message::Close(_)) | Err(_) => break,
            Ok(_) => continue,
        }
        // Every complete frame in the buffer.
        while buf.len() >= 8 {
            let len = u32::from_be_bytes([0, buf[5], buf[6], buf[7]]) as usize;
            if buf.len() < 8 + len {
                break;
            }
            let frame: Vec<u8> = buf.drain(..8 + len).collect();
            let flags = frame[4];
            let payload = &frame[8..];
            if frame[0] & 0x80 == 0 {
                let id = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
                if let Some(s) = streams.get_mut(&id)
                    && let Some(w) = s.writer.as_mut()
                {
                    if !payload.is_empty() && w.write_all(payload).await.is_err() {
                        s.writer = None;
                    } else if flags & FIN != 0 {
                        let _ = w.shutdown().await;
                        s.writer = None;
                    }
                }
                continue;
            }
            let kind = u16::from_be_bytes([frame[2], frame[3]]);
            let id = payload
                .get(..4)
                .map(|b| u32::from_be_bytes([b[0] & 0x7f, b[1], b[2], b[3]]))
                .unwrap_or(0);
            match kind {
                SYN_STREAM if payload.len() >= 10 => {
                    let Ok(headers) = decoder.decode(&payload[10..]) else {
                        break 'conn;
                    };
                    let get = |k: &str| {
                        headers
                            .iter()
                            .find(|(n, _)| n == k)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    };
                    let mut reply = id.to_be_bytes().to_vec();
                    reply.extend_from_slice(&encoder.encode(&[]));
                    if out_tx.send(control(SYN_REPLY, 0, &reply)).await.is_err() {
                        break 'conn;
                    }
                    let stream = Stream {
                        kind: get("streamtype"),
                        request: get("requestid"),
                        port: get("port").parse().unwrap_or(0),
                        writer: None,
                    };
                    streams.insert(id, stream);
                    start_if_paired(&app, &pod, &mut streams, id, &out_tx).await;
                }
                RST_STREAM => {
                    streams.remove(&id);
                }
                PING if out_tx.send(control(PING, 0, payload)).await.is_err() => break 'conn,
                GOAWAY => break 'conn,
                // SETTINGS, HEADERS, WINDOW_UPDATE: nothing to do.
                _ => {}
            }
        }
    }
    drop(streams);
    drop(out_tx);
    let _ = writer.await;
}

/// Dials the port once both streams of a request exist.
async fn start_if_paired(
    app: &Arc<App>,
    pod: &Value,
    streams: &mut HashMap<u32, Stream>,
    new: u32,
    out: &tokio::sync::mpsc::Sender<Vec<u8>>,
) {
    let request = streams[&new].request.clone();
    let find = |kind: &str| {
        streams
            .iter()
            .find(|(_, s)| s.request == request && s.kind == kind)
            .map(|(id, _)| *id)
    };
    let (Some(error_id), Some(data_id)) = (find("error"), find("data")) else {
        return;
    };
    let port = streams[&data_id].port;
    match crate::core::pod_portforward::dial(app, pod, port) {
        Err(message) => {
            let _ = out
                .send(data_frame(error_id, FIN, message.as_bytes()))
                .await;
            let _ = out.send(data_frame(data_id, FIN, &[])).await;
        }
        Ok(conn) => {
            let (mut r, w) = tokio::io::split(conn);
            if let Some(s) = streams.get_mut(&data_id) {
                s.writer = Some(w);
            }
            let out = out.clone();
            tokio::spawn(async move {
                let mut chunk = vec![0u8; DATA_MAX];
                loop {
                    match r.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if out.send(data_frame(data_id, 0, &chunk[..n])).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = out.send(data_frame(data_id, FIN, &[])).await;
                let _ = out.send(data_frame(error_id, FIN, &[])).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_is_spdy3s() {
        // 1423 bytes; zlib names a preset dictionary by its Adler-32.
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b",enq=0."));
    }

    #[test]
    fn header_blocks_round_trip_through_zlib_with_the_dictionary() {
        // A block compressed the way spdystream does it (zlib, preset dictionary, sync flush).
        let mut raw = Vec::new();
        let pairs = [("streamtype", "data"), ("port", "8443"), ("requestid", "0")];
        raw.extend_from_slice(&3u32.to_be_bytes());
        for (k, v) in pairs {
            for s in [k, v] {
                raw.extend_from_slice(&(s.len() as u32).to_be_bytes());
                raw.extend_from_slice(s.as_bytes());
            }
        }
        let mut c = flate2::Compress::new(flate2::Compression::best(), true);
        c.set_dictionary(dictionary()).unwrap();
        let mut block = Vec::with_capacity(1024);
        c.compress_vec(&raw, &mut block, flate2::FlushCompress::Sync)
            .unwrap();
        let mut d = HeaderDecoder::default();
        let got = d.decode(&block).unwrap();
        assert_eq!(got[1], ("port".to_string(), "8443".to_string()));
        // Our own (stored) blocks decode with a plain zlib reader.
        let mut e = HeaderEncoder::default();
        let ours = [e.encode(&[("a", "b")]), e.encode(&[])].concat();
        let mut plain = Decompress::new(true);
        let mut out = Vec::with_capacity(256);
        plain
            .decompress_vec(&ours, &mut out, FlushDecompress::Sync)
            .unwrap();
        assert_eq!(parse_block(&out).unwrap(), [("a".into(), "b".into())]);
    }
}
