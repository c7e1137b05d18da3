//! Checks and parsers for the values users type on `kubectl vm create`: names, CPU counts,
//! checksums, environment variables, labels and data-disk specs.
//!
//! Every error is a [`ValidationError`] whose message is one line that says what is wrong and
//! how to fix it.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::quantity::{Quantity, QuantityError};

/// A value given on the command line that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ValidationError {
    /// A VM, disk or other object name that Kubernetes would reject.
    #[error("invalid {kind} name {name:?}: {reason}")]
    Name {
        /// What the name is for ("VM", "disk", …).
        kind: &'static str,
        /// The name as given.
        name: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A size that is not a usable quantity.
    #[error(transparent)]
    Quantity(#[from] QuantityError),
    /// A CPU count that is not a whole number of cores.
    #[error("invalid CPU count {value:?}: use a whole number of cores, at least 1 (e.g. 2)")]
    Cpu {
        /// The value as given.
        value: String,
    },
    /// A checksum not of the form `ALGO:HEX`.
    #[error("invalid checksum {value:?}: {reason}")]
    Checksum {
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// An environment variable not of the form `KEY=VALUE`.
    #[error("invalid environment variable {value:?}: {reason}")]
    Env {
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A label not of the form `key=value` with Kubernetes label syntax.
    #[error("invalid label {value:?}: {reason}")]
    Label {
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A data-disk spec not of the form `NAME=SIZE[,class=SC][,bus=BUS]`.
    #[error("invalid data disk {value:?}: {reason}")]
    DataDisk {
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A line that is not an OpenSSH public key.
    #[error(
        "not an OpenSSH public key ({reason}); give a line like `ssh-ed25519 AAAA... comment` from a .pub file"
    )]
    PublicKey {
        /// What the parser said.
        reason: String,
    },
    /// A value outside a fixed set of choices.
    #[error("invalid {what} {value:?}: use one of {choices}")]
    Choice {
        /// What the value is for.
        what: &'static str,
        /// The value as given.
        value: String,
        /// The accepted values, comma-separated.
        choices: &'static str,
    },
}

/// Check one OpenSSH public key line (`ssh-ed25519 AAAA… comment`).
pub fn ssh_public_key(line: &str) -> Result<(), ValidationError> {
    if line.contains("PRIVATE KEY") {
        return Err(ValidationError::PublicKey {
            reason: "this is a private key".into(),
        });
    }
    ssh_key::PublicKey::from_openssh(line)
        .map(|_| ())
        .map_err(|e| ValidationError::PublicKey {
            reason: e.to_string(),
        })
}

/// Longest name Kubernetes accepts for a DNS-label name (VMs, disks, volumes).
pub const MAX_NAME_LEN: usize = 63;

/// Check an RFC 1123 label: lowercase letters, digits and `-`, starting and ending with a
/// letter or digit, at most 63 characters. `kind` names the object in the error ("VM", "disk").
pub fn dns_label(kind: &'static str, name: &str) -> Result<(), ValidationError> {
    let fail = |reason: String| ValidationError::Name {
        kind,
        name: name.to_string(),
        reason,
    };
    if name.is_empty() {
        return Err(fail("the name is empty".into()));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(fail(format!(
            "it is {} characters long; use at most {MAX_NAME_LEN}",
            name.len()
        )));
    }
    let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let bad_start_or_end = name.starts_with('-') || name.ends_with('-');
    if name.chars().all(valid_char) && !bad_start_or_end {
        return Ok(());
    }
    let what = if name.chars().any(|c| c.is_ascii_uppercase()) {
        "uppercase letters are not allowed"
    } else if !name.chars().all(valid_char) {
        "only lowercase letters, digits and '-' are allowed"
    } else {
        "it must start and end with a letter or digit"
    };
    let suggestion = suggest_label(name);
    Err(fail(if suggestion.is_empty() {
        format!("{what}; use lowercase letters, digits and '-'")
    } else {
        format!("{what}; try {suggestion:?}")
    }))
}

/// A DNS-label version of `name`: lowercased, other characters turned into `-`, trimmed.
fn suggest_label(name: &str) -> String {
    let mapped: String = name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect();
    let trimmed = mapped.trim_matches('-');
    trimmed[..trimmed.len().min(MAX_NAME_LEN)]
        .trim_end_matches('-')
        .to_string()
}

/// Check a DNS subdomain (RFC 1123, at most 253 characters), as used by storage class names
/// and label prefixes.
pub fn dns_subdomain(kind: &'static str, name: &str) -> Result<(), ValidationError> {
    let fail = |reason: &str| ValidationError::Name {
        kind,
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() || name.len() > 253 {
        return Err(fail("use 1 to 253 characters"));
    }
    for part in name.split('.') {
        dns_label(kind, part).map_err(|_| {
            fail("use dot-separated parts of lowercase letters, digits and '-' (e.g. fast-ssd)")
        })?;
    }
    Ok(())
}

/// Parse a CPU count: a whole number of cores, at least 1.
pub fn cpu_cores(value: &str) -> Result<u32, ValidationError> {
    match value.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(ValidationError::Cpu {
            value: value.to_string(),
        }),
    }
}

/// A hash algorithm accepted for `--checksum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChecksumAlgo {
    /// MD5 (32 hex characters).
    Md5,
    /// SHA-1 (40 hex characters).
    Sha1,
    /// SHA-256 (64 hex characters).
    Sha256,
    /// SHA-512 (128 hex characters).
    Sha512,
    /// GOST R 34.11-2012, 256 bits (64 hex characters); Deckhouse only.
    Streebog256,
    /// GOST R 34.11-2012, 512 bits (128 hex characters); Deckhouse only.
    Streebog512,
}

impl ChecksumAlgo {
    /// Every algorithm, in the order of preference when only one can be used.
    pub const ALL: [ChecksumAlgo; 6] = [
        ChecksumAlgo::Sha512,
        ChecksumAlgo::Sha256,
        ChecksumAlgo::Streebog512,
        ChecksumAlgo::Streebog256,
        ChecksumAlgo::Sha1,
        ChecksumAlgo::Md5,
    ];

    /// The name used on the command line and in the APIs (`sha256`, `streebog512`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ChecksumAlgo::Md5 => "md5",
            ChecksumAlgo::Sha1 => "sha1",
            ChecksumAlgo::Sha256 => "sha256",
            ChecksumAlgo::Sha512 => "sha512",
            ChecksumAlgo::Streebog256 => "streebog256",
            ChecksumAlgo::Streebog512 => "streebog512",
        }
    }

    /// Length of the digest in hex characters.
    pub fn hex_len(self) -> usize {
        match self {
            ChecksumAlgo::Md5 => 32,
            ChecksumAlgo::Sha1 => 40,
            ChecksumAlgo::Sha256 | ChecksumAlgo::Streebog256 => 64,
            ChecksumAlgo::Sha512 | ChecksumAlgo::Streebog512 => 128,
        }
    }

    /// Whether KubeVirt's CDI importer can verify it (it knows md5, sha1, sha256, sha512).
    pub fn supported_by_cdi(self) -> bool {
        !matches!(self, ChecksumAlgo::Streebog256 | ChecksumAlgo::Streebog512)
    }
}

/// An expected image digest, `ALGO:HEX`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Checksum {
    /// The hash algorithm.
    pub algo: ChecksumAlgo,
    /// The digest, lowercase hex.
    pub hex: String,
}

impl FromStr for Checksum {
    type Err = ValidationError;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let fail = |reason: String| ValidationError::Checksum {
            value: value.to_string(),
            reason,
        };
        let names = "md5, sha1, sha256, sha512, streebog256, streebog512";
        let (algo, hex) = value.split_once(':').ok_or_else(|| {
            fail(format!(
                "use ALGO:HEX, e.g. sha256:<64 hex digits>; ALGO is one of {names}"
            ))
        })?;
        let algo = ChecksumAlgo::ALL
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(algo))
            .ok_or_else(|| fail(format!("unknown algorithm {algo:?}; use one of {names}")))?;
        if hex.len() != algo.hex_len() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(fail(format!(
                "a {} digest is {} hex digits (0-9, a-f); got {} characters",
                algo.as_str(),
                algo.hex_len(),
                hex.len()
            )));
        }
        Ok(Checksum {
            algo,
            hex: hex.to_ascii_lowercase(),
        })
    }
}

impl fmt::Display for Checksum {
    /// `algo:hex`, the form CDI's `checksum` field takes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algo.as_str(), self.hex)
    }
}

/// An environment variable for the guest, `KEY=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EnvVar {
    /// A shell variable name: a letter or `_`, then letters, digits or `_`.
    pub name: String,
    /// The value, one line.
    pub value: String,
}

/// Whether `name` is a valid shell variable name.
pub fn is_shell_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl FromStr for EnvVar {
    type Err = ValidationError;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let fail = |reason: &str| ValidationError::Env {
            value: value.to_string(),
            reason: reason.to_string(),
        };
        let (name, val) = value.split_once('=').ok_or_else(|| fail("use KEY=VALUE"))?;
        if !is_shell_name(name) {
            return Err(fail(
                "KEY must start with a letter or '_' and contain only letters, digits and '_'",
            ));
        }
        if val.contains(['\n', '\r', '\0']) {
            return Err(fail("the value must be a single line"));
        }
        Ok(EnvVar {
            name: name.to_string(),
            value: val.to_string(),
        })
    }
}

/// A Kubernetes label, `key=value`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Label {
    /// `[prefix/]name`.
    pub key: String,
    /// Possibly empty value.
    pub value: String,
}

/// Whether `s` is a label name or value segment: alphanumerics, `-`, `_`, `.`, starting and
/// ending alphanumeric, at most 63 characters.
fn is_label_segment(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.len() <= 63
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}

impl FromStr for Label {
    type Err = ValidationError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |reason: &str| ValidationError::Label {
            value: text.to_string(),
            reason: reason.to_string(),
        };
        let (key, value) = text.split_once('=').ok_or_else(|| fail("use key=value"))?;
        let name = match key.rsplit_once('/') {
            Some((prefix, name)) => {
                dns_subdomain("label prefix", prefix).map_err(|_| {
                    fail("the key prefix must be a DNS subdomain such as example.com")
                })?;
                name
            }
            None => key,
        };
        if !is_label_segment(name) {
            return Err(fail(
                "the key name must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            ));
        }
        if !value.is_empty() && !is_label_segment(value) {
            return Err(fail(
                "the value must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            ));
        }
        Ok(Label {
            key: key.to_string(),
            value: value.to_string(),
        })
    }
}

/// The bus a disk is attached with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DiskBus {
    /// Paravirtual, fastest; needs virtio drivers in the guest.
    #[default]
    Virtio,
    /// SATA, for guests without virtio drivers.
    Sata,
    /// SCSI.
    Scsi,
}

impl DiskBus {
    /// The name used on the command line and in KubeVirt (`virtio`, `sata`, `scsi`).
    pub fn as_str(self) -> &'static str {
        match self {
            DiskBus::Virtio => "virtio",
            DiskBus::Sata => "sata",
            DiskBus::Scsi => "scsi",
        }
    }
}

impl FromStr for DiskBus {
    type Err = ValidationError;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "virtio" => Ok(DiskBus::Virtio),
            "sata" => Ok(DiskBus::Sata),
            "scsi" => Ok(DiskBus::Scsi),
            _ => Err(ValidationError::Choice {
                what: "disk bus",
                value: value.to_string(),
                choices: "virtio, sata, scsi",
            }),
        }
    }
}

/// An empty data disk to create with the VM: `NAME=SIZE[,class=SC][,bus=BUS]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDisk {
    /// Disk name (DNS label); also the serial the guest sees it under.
    pub name: String,
    /// Capacity.
    pub size: Quantity,
    /// Storage class; the cluster default when absent.
    pub storage_class: Option<String>,
    /// Bus; KubeVirt only. `None` means the default (virtio).
    pub bus: Option<DiskBus>,
}

impl FromStr for DataDisk {
    type Err = ValidationError;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |reason: String| ValidationError::DataDisk {
            value: text.to_string(),
            reason,
        };
        let mut parts = text.split(',');
        let head = parts.next().unwrap_or_default();
        let (name, size) = head.split_once('=').ok_or_else(|| {
            fail("use NAME=SIZE[,class=STORAGECLASS][,bus=virtio|sata|scsi]".into())
        })?;
        dns_label("disk", name).map_err(|e| fail(e.to_string()))?;
        let size = Quantity::parse(size).map_err(|e| fail(e.to_string()))?;
        if size.bytes() == 0 {
            return Err(fail("the size must be greater than zero".into()));
        }
        let mut disk = DataDisk {
            name: name.to_string(),
            size,
            storage_class: None,
            bus: None,
        };
        for option in parts {
            match option.split_once('=') {
                Some(("class", class)) if disk.storage_class.is_none() => {
                    dns_subdomain("storage class", class).map_err(|e| fail(e.to_string()))?;
                    disk.storage_class = Some(class.to_string());
                }
                Some(("bus", bus)) if disk.bus.is_none() => {
                    disk.bus = Some(
                        bus.parse()
                            .map_err(|e: ValidationError| fail(e.to_string()))?,
                    );
                }
                Some(("class" | "bus", _)) => {
                    return Err(fail(format!("{option:?} is given twice")));
                }
                _ => {
                    return Err(fail(format!(
                        "unknown option {option:?}; use class=STORAGECLASS or bus=virtio|sata|scsi"
                    )));
                }
            }
        }
        Ok(disk)
    }
}

/// Whether `name`, a file name a peer sent (an entry of a guest's SFTP listing, an export's
/// volume name), is one normal path component: not empty, `.`, `..`, absolute or containing
/// `/` (OpenSSH's scp refuses such names since CVE-2019-6111). Only such a name may be joined
/// to a local directory.
pub fn is_single_file_name(name: &str) -> bool {
    use std::path::{Component, Path};
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(Component::Normal(n)), None) if n == name
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn ssh_public_keys_are_checked() {
        let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ alice@example";
        assert!(super::ssh_public_key(key).is_ok());
        assert!(super::ssh_public_key("ssh-ed25519 nonsense").is_err());
        let private = super::ssh_public_key("-----BEGIN OPENSSH PRIVATE KEY-----").unwrap_err();
        assert!(private.to_string().contains("private key"), "{private}");
    }

    use super::*;

    fn one_line(e: ValidationError) -> String {
        let s = e.to_string();
        assert!(!s.contains('\n'), "{s}");
        s
    }

    #[test]
    fn names() {
        assert!(dns_label("VM", "web-1").is_ok());
        assert!(dns_label("VM", &"a".repeat(63)).is_ok());
        let e = one_line(dns_label("VM", "My_VM").unwrap_err());
        assert!(e.contains("uppercase") && e.contains("\"my-vm\""), "{e}");
        let e = one_line(dns_label("VM", &"a".repeat(64)).unwrap_err());
        assert!(e.contains("64 characters"), "{e}");
        assert!(one_line(dns_label("VM", "-a").unwrap_err()).contains("start and end"));
        assert!(one_line(dns_label("disk", "").unwrap_err()).contains("empty"));
        assert!(one_line(dns_label("VM", "a.b").unwrap_err()).contains("\"a-b\""));
        assert!(dns_subdomain("storage class", "fast.ssd-1").is_ok());
        assert!(dns_subdomain("storage class", "Fast").is_err());
    }

    #[test]
    fn cpu() {
        assert_eq!(cpu_cores("4"), Ok(4));
        for bad in ["0", "1.5", "500m", "-1", ""] {
            assert!(one_line(cpu_cores(bad).unwrap_err()).contains("whole number"));
        }
    }

    #[test]
    fn checksums() {
        let c: Checksum = format!("SHA256:{}", "AB".repeat(32)).parse().unwrap();
        assert_eq!(c.algo, ChecksumAlgo::Sha256);
        assert_eq!(c.to_string(), format!("sha256:{}", "ab".repeat(32)));
        for (algo, len) in [
            ("md5", 32),
            ("sha1", 40),
            ("sha512", 128),
            ("streebog256", 64),
            ("streebog512", 128),
        ] {
            assert!(
                format!("{algo}:{}", "0".repeat(len))
                    .parse::<Checksum>()
                    .is_ok()
            );
            let e = format!("{algo}:{}", "0".repeat(len - 1))
                .parse::<Checksum>()
                .unwrap_err();
            assert!(one_line(e).contains(&format!("{len} hex digits")));
        }
        assert!(
            one_line("crc32:00".parse::<Checksum>().unwrap_err()).contains("unknown algorithm")
        );
        assert!(one_line("abc".parse::<Checksum>().unwrap_err()).contains("ALGO:HEX"));
        let e = format!("md5:{}", "g".repeat(32))
            .parse::<Checksum>()
            .unwrap_err();
        assert!(one_line(e).contains("hex"));
        assert!(!ChecksumAlgo::Streebog256.supported_by_cdi());
    }

    #[test]
    fn env() {
        let e: EnvVar = "DB_URL=postgres://x?a=b".parse().unwrap();
        assert_eq!(
            (e.name.as_str(), e.value.as_str()),
            ("DB_URL", "postgres://x?a=b")
        );
        assert_eq!("_X=".parse::<EnvVar>().unwrap().value, "");
        assert!(one_line("1X=a".parse::<EnvVar>().unwrap_err()).contains("KEY must"));
        assert!(one_line("A-B=a".parse::<EnvVar>().unwrap_err()).contains("KEY must"));
        assert!(one_line("NOEQ".parse::<EnvVar>().unwrap_err()).contains("KEY=VALUE"));
        assert!(one_line("A=x\ny".parse::<EnvVar>().unwrap_err()).contains("single line"));
    }

    #[test]
    fn labels() {
        assert!("app=web".parse::<Label>().is_ok());
        assert!("example.com/tier=".parse::<Label>().is_ok());
        assert!("a.b_c-d=V.1".parse::<Label>().is_ok());
        assert!(one_line("app".parse::<Label>().unwrap_err()).contains("key=value"));
        assert!(one_line("Bad_/x=y".parse::<Label>().unwrap_err()).contains("prefix"));
        assert!(one_line("-a=b".parse::<Label>().unwrap_err()).contains("key name"));
        assert!(one_line("a=b c".parse::<Label>().unwrap_err()).contains("value"));
        assert!(format!("a={}", "v".repeat(64)).parse::<Label>().is_err());
    }

    #[test]
    fn data_disks() {
        let d: DataDisk = "data=10Gi,class=fast,bus=scsi".parse().unwrap();
        assert_eq!(d.name, "data");
        assert_eq!(d.size, Quantity::parse("10Gi").unwrap());
        assert_eq!(d.storage_class.as_deref(), Some("fast"));
        assert_eq!(d.bus, Some(DiskBus::Scsi));
        let d: DataDisk = "logs=1Gi".parse().unwrap();
        assert_eq!((d.storage_class, d.bus), (None, None));
        for (bad, needle) in [
            ("data", "NAME=SIZE"),
            ("Data=1Gi", "uppercase"),
            ("data=1XB", "invalid size"),
            ("data=0", "greater than zero"),
            ("data=1Gi,bus=ide", "virtio, sata, scsi"),
            ("data=1Gi,speed=fast", "unknown option"),
            ("data=1Gi,class=a,class=b", "twice"),
        ] {
            let e = one_line(bad.parse::<DataDisk>().unwrap_err());
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }
}

/// Properties of the checks on names peers send (issue 37): `PROPTEST_CASES=100000 cargo test
/// -p kubevm --lib validate::properties` for a long run.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use std::path::Path;

    proptest! {
        /// A name a peer sends is accepted only if, joined to the directory it is written
        /// into, it stays directly inside it and is the whole file name.
        #[test]
        fn accepted_names_stay_in_the_directory(name in "[a-z./\\\\-]{0,8}|\\.\\.?|/?[a-z.]{0,4}/?|\\PC{0,10}") {
            let dir = Path::new("/out");
            if is_single_file_name(&name) {
                let joined = dir.join(&name);
                prop_assert_eq!(joined.parent(), Some(dir), "{:?}", name);
                prop_assert_eq!(joined.file_name().map(|n| n.to_string_lossy().into_owned()), Some(name.clone()));
                prop_assert!(!name.contains('/') && name != "." && name != ".." && !name.is_empty());
            } else {
                // Refused names are exactly those: empty, `.`, `..`, or holding a `/` (a
                // trailing `/` or `/.` would be dropped by the path and change the name).
                prop_assert!(name.is_empty() || name == "." || name == ".." || name.contains('/'), "{:?} refused", name);
            }
        }
    }
}
