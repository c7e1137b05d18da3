//! Checksums computed while streaming: sha256 (default), sha512, sha1, md5.

use std::fmt;
use std::str::FromStr;

use sha2::Digest;

/// A checksum algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algo {
    /// SHA-256 (the default; `sha256sum`).
    #[default]
    Sha256,
    /// SHA-512 (`sha512sum`).
    Sha512,
    /// SHA-1 (`sha1sum`).
    Sha1,
    /// MD5 (`md5sum`).
    Md5,
}

impl Algo {
    /// The name used on the command line and as the checksum file's extension.
    pub fn as_str(self) -> &'static str {
        match self {
            Algo::Sha256 => "sha256",
            Algo::Sha512 => "sha512",
            Algo::Sha1 => "sha1",
            Algo::Md5 => "md5",
        }
    }

    /// Length of the digest in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Algo::Sha256 => 32,
            Algo::Sha512 => 64,
            Algo::Sha1 => 20,
            Algo::Md5 => 16,
        }
    }

    /// A fresh hasher.
    pub fn hasher(self) -> Hasher {
        match self {
            Algo::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            Algo::Sha512 => Hasher::Sha512(sha2::Sha512::new()),
            Algo::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            Algo::Md5 => Hasher::Md5(md5::Md5::new()),
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sha256" => Ok(Algo::Sha256),
            "sha512" => Ok(Algo::Sha512),
            "sha1" => Ok(Algo::Sha1),
            "md5" => Ok(Algo::Md5),
            other => Err(format!(
                "unknown checksum algorithm {other:?}: use sha256, sha512, sha1 or md5"
            )),
        }
    }
}

/// An expected checksum (`--checksum ALGO:HEX`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The algorithm.
    pub algo: Algo,
    /// The digest, lower-case hex.
    pub hex: String,
}

impl FromStr for Expected {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (algo, hex) = s
            .split_once(':')
            .ok_or_else(|| format!("checksum {s:?} must look like sha256:<hex>"))?;
        let algo: Algo = algo.parse()?;
        let hex = hex.to_ascii_lowercase();
        if hex.len() != algo.digest_len() * 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "checksum {s:?}: a {algo} digest is {} hex digits",
                algo.digest_len() * 2
            ));
        }
        Ok(Expected { algo, hex })
    }
}

/// A running hash.
#[derive(Clone)]
pub enum Hasher {
    /// SHA-256.
    Sha256(sha2::Sha256),
    /// SHA-512.
    Sha512(sha2::Sha512),
    /// SHA-1.
    Sha1(sha1::Sha1),
    /// MD5.
    Md5(md5::Md5),
}

impl Hasher {
    /// Adds bytes.
    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
            Hasher::Sha1(h) => h.update(data),
            Hasher::Md5(h) => h.update(data),
        }
    }

    /// The digest as lower-case hex.
    pub fn finish_hex(self) -> String {
        let bytes: Vec<u8> = match self {
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Sha512(h) => h.finalize().to_vec(),
            Hasher::Sha1(h) => h.finalize().to_vec(),
            Hasher::Md5(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Digests of "abc" from FIPS 180-4 / RFC 1321 test vectors.
    #[test]
    fn known_vectors() {
        let cases = [
            (
                Algo::Sha256,
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            ),
            (Algo::Sha1, "a9993e364706816aba3e25717850c26c9cd0d89d"),
            (Algo::Md5, "900150983cd24fb0d6963f7d28e17f72"),
        ];
        for (algo, want) in cases {
            let mut h = algo.hasher();
            h.update(b"a");
            h.update(b"bc");
            assert_eq!(h.finish_hex(), want, "{algo}");
        }
    }

    #[test]
    fn expected_is_validated() {
        assert!("sha256:abc".parse::<Expected>().is_err());
        assert!("crc:00".parse::<Expected>().is_err());
        assert!("nohex".parse::<Expected>().is_err());
        let e: Expected = "MD5:900150983CD24FB0D6963F7D28E17F72".parse().unwrap();
        assert_eq!(e.algo, Algo::Md5);
        assert_eq!(e.hex, "900150983cd24fb0d6963f7d28e17f72");
    }
}
