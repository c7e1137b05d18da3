//! A minimal RFB 3.8 server (RFC 6143): version and security handshake (None), ServerInit,
//! and Raw framebuffer updates of a fixed test picture. Enough for a VNC client to connect
//! and draw one frame; input events are read and ignored.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Framebuffer width.
pub const WIDTH: u16 = 320;
/// Framebuffer height.
pub const HEIGHT: u16 = 200;

/// The server's pixel format: 32 bpp, depth 24, little-endian, true colour, 8 bits per
/// channel at shifts 16/8/0 (RFC 6143 §7.4).
pub const PIXEL_FORMAT: [u8; 16] = [32, 24, 0, 1, 0, 255, 0, 255, 0, 255, 16, 8, 0, 0, 0, 0];

/// Serves one client on `io` until it disconnects. `name` is the desktop name.
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut io: S,
    name: &str,
) -> std::io::Result<()> {
    io.write_all(b"RFB 003.008\n").await?;
    let mut version = [0u8; 12];
    io.read_exact(&mut version).await?;
    if &version[..4] != b"RFB " {
        return Err(std::io::Error::other("not an RFB client"));
    }
    // Security types: one, None (1).
    io.write_all(&[1, 1]).await?;
    let chosen = io.read_u8().await?;
    if chosen != 1 {
        io.write_all(&1u32.to_be_bytes()).await?;
        let reason = b"only security type None is offered";
        io.write_all(&(reason.len() as u32).to_be_bytes()).await?;
        io.write_all(reason).await?;
        return Ok(());
    }
    io.write_all(&0u32.to_be_bytes()).await?; // SecurityResult OK
    let _shared = io.read_u8().await?; // ClientInit
    let mut init = Vec::new();
    init.extend_from_slice(&WIDTH.to_be_bytes());
    init.extend_from_slice(&HEIGHT.to_be_bytes());
    init.extend_from_slice(&PIXEL_FORMAT);
    init.extend_from_slice(&(name.len() as u32).to_be_bytes());
    init.extend_from_slice(name.as_bytes());
    io.write_all(&init).await?;
    loop {
        let message = match io.read_u8().await {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        };
        match message {
            0 => skip(&mut io, 19).await?, // SetPixelFormat: only the server's format is drawn
            2 => {
                let mut head = [0u8; 3];
                io.read_exact(&mut head).await?;
                let count = u16::from_be_bytes([head[1], head[2]]) as usize;
                skip(&mut io, count * 4).await?;
            }
            3 => {
                skip(&mut io, 9).await?;
                io.write_all(&frame()).await?;
            }
            4 => skip(&mut io, 7).await?,
            5 => skip(&mut io, 5).await?,
            6 => {
                skip(&mut io, 3).await?;
                let len = io.read_u32().await? as usize;
                skip(&mut io, len).await?;
            }
            other => {
                return Err(std::io::Error::other(format!(
                    "unknown RFB client message {other}"
                )));
            }
        }
    }
}

async fn skip<S: AsyncRead + Unpin>(io: &mut S, n: usize) -> std::io::Result<()> {
    let mut buf = vec![0u8; n];
    io.read_exact(&mut buf).await.map(|_| ())
}

/// A FramebufferUpdate with one Raw rectangle covering the screen: a gradient.
pub fn frame() -> Vec<u8> {
    let (w, h) = (WIDTH as usize, HEIGHT as usize);
    let mut out = Vec::with_capacity(16 + w * h * 4);
    out.extend_from_slice(&[0, 0, 0, 1]);
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&WIDTH.to_be_bytes());
    out.extend_from_slice(&HEIGHT.to_be_bytes());
    out.extend_from_slice(&0i32.to_be_bytes()); // Raw
    for y in 0..h {
        for x in 0..w {
            // Little-endian 0x00RRGGBB.
            out.extend_from_slice(&[(x * 255 / w) as u8, (y * 255 / h) as u8, 0x80, 0]);
        }
    }
    out
}

/// The framebuffer as a PNG (8-bit RGB, zlib with stored blocks): what KubeVirt's
/// `vnc/screenshot` returns.
pub fn screenshot_png() -> Vec<u8> {
    let (w, h) = (WIDTH as usize, HEIGHT as usize);
    let mut raw = Vec::with_capacity(h * (1 + w * 3));
    for y in 0..h {
        raw.push(0); // filter: none
        for x in 0..w {
            raw.extend_from_slice(&[(x * 255 / w) as u8, (y * 255 / h) as u8, 0x80]);
        }
    }
    let mut zlib = vec![0x78, 0x01];
    let mut chunks = raw.chunks(65535).peekable();
    while let Some(block) = chunks.next() {
        zlib.push(u8::from(chunks.peek().is_none()));
        let len = block.len() as u16;
        zlib.extend_from_slice(&len.to_le_bytes());
        zlib.extend_from_slice(&(!len).to_le_bytes());
        zlib.extend_from_slice(block);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for byte in &raw {
        a = (a + u32::from(*byte)) % 65521;
        b = (b + a) % 65521;
    }
    zlib.extend_from_slice(&((b << 16) | a).to_be_bytes());
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&(w as u32).to_be_bytes());
    ihdr.extend_from_slice(&(h as u32).to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    for (kind, data) in [(b"IHDR", ihdr), (b"IDAT", zlib), (b"IEND", Vec::new())] {
        png.extend_from_slice(&(data.len() as u32).to_be_bytes());
        let start = png.len();
        png.extend_from_slice(kind);
        png.extend_from_slice(&data);
        let crc = crc32(&png[start..]);
        png.extend_from_slice(&crc.to_be_bytes());
    }
    png
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn handshake_and_one_update() {
        let (server, mut client) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move { serve(server, "default/web").await });
        let mut version = [0u8; 12];
        client.read_exact(&mut version).await.unwrap();
        assert_eq!(&version, b"RFB 003.008\n");
        client.write_all(b"RFB 003.008\n").await.unwrap();
        let mut types = [0u8; 2];
        client.read_exact(&mut types).await.unwrap();
        assert_eq!(types, [1, 1]);
        client.write_all(&[1]).await.unwrap();
        assert_eq!(client.read_u32().await.unwrap(), 0);
        client.write_all(&[1]).await.unwrap();
        assert_eq!(client.read_u16().await.unwrap(), WIDTH);
        assert_eq!(client.read_u16().await.unwrap(), HEIGHT);
        let mut pf = [0u8; 16];
        client.read_exact(&mut pf).await.unwrap();
        let len = client.read_u32().await.unwrap() as usize;
        let mut name = vec![0u8; len];
        client.read_exact(&mut name).await.unwrap();
        assert_eq!(name, b"default/web");
        client
            .write_all(&[3, 0, 0, 0, 0, 0, 1, 64, 0, 200])
            .await
            .unwrap();
        let mut head = [0u8; 16];
        client.read_exact(&mut head).await.unwrap();
        assert_eq!(head[0], 0);
        assert_eq!(u16::from_be_bytes([head[2], head[3]]), 1);
        let mut pixels = vec![0u8; WIDTH as usize * HEIGHT as usize * 4];
        client.read_exact(&mut pixels).await.unwrap();
    }
}
