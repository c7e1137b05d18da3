//! The KRL encoder checked by the independent reference: OpenSSH's own `ssh-keygen -Q`
//! (fails, never skips, without ssh-keygen: CI installs openssh-client).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    fn new() -> Keys {
        let keys = Keys {
            dir: tempfile::tempdir().unwrap(),
        };
        keys.keygen("ca");
        keys
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn keygen(&self, name: &str) -> PathBuf {
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(self.path(name))
            .output()
            .expect("ssh-keygen not found: install openssh-client");
        assert!(out.status.success(), "{out:?}");
        self.path(&format!("{name}.pub"))
    }

    /// A certificate signed by ssh-keygen with the CA: `host` or user, key ID, serial and
    /// principals (hostile pairs: dots in the VM name, a namespace called `vm`).
    fn cert(&self, name: &str, host: bool, id: &str, serial: u64, principals: &str) -> PathBuf {
        self.keygen(name);
        let mut cmd = Command::new("ssh-keygen");
        cmd.arg("-q").arg("-s").arg(self.path("ca"));
        if host {
            cmd.arg("-h");
        }
        let out = cmd
            .args(["-I", id, "-z", &serial.to_string(), "-n", principals])
            .arg(self.path(&format!("{name}.pub")))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        self.path(&format!("{name}-cert.pub"))
    }

    /// `ssh-keygen -Q -f KRL FILE`: true when it says REVOKED (exit 1), false for ok (exit 0).
    fn revoked(&self, krl: &[u8], file: &Path) -> bool {
        let path = self.path("krl");
        std::fs::write(&path, krl).unwrap();
        let out = Command::new("ssh-keygen")
            .arg("-Q")
            .arg("-f")
            .arg(&path)
            .arg(file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        match out.status.code() {
            Some(0) => {
                assert!(text.trim_end().ends_with(": ok"), "{text}");
                false
            }
            Some(1) => {
                assert!(text.trim_end().ends_with(": REVOKED"), "{text}");
                true
            }
            _ => panic!(
                "ssh-keygen could not read the KRL: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }

    /// `ssh-keygen -Q -l`: the KRL as OpenSSH reads it, in its spec syntax.
    fn dump(&self, krl: &[u8]) -> String {
        let path = self.path("krl");
        std::fs::write(&path, krl).unwrap();
        let out = Command::new("ssh-keygen")
            .args(["-Q", "-l", "-f"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The key without its comment, as `ca revoke` keeps it.
fn pubkey(path: &Path) -> PublicKey {
    let mut key = PublicKey::from_openssh(&std::fs::read_to_string(path).unwrap()).unwrap();
    key.set_comment("");
    key
}

#[test]
fn an_empty_krl_is_read_by_ssh_keygen_and_revokes_nothing() {
    let keys = Keys::new();
    let cert = keys.cert(
        "u",
        false,
        "kubectl-vm:alice:vm/db.primary.prod",
        7,
        "kubevm@db.primary.prod.vm",
    );
    let krl = empty_krl();
    assert!(!keys.revoked(&krl, &cert));
    let dump = keys.dump(&krl);
    assert!(dump.starts_with("# KRL version 0\n"), "{dump}");
    assert!(!dump.contains("serial:") && !dump.contains("id:"), "{dump}");
}

#[test]
fn serials_key_ids_and_keys_are_revoked_as_ssh_keygen_reads_them() {
    let keys = Keys::new();
    // Hostile pairs: VM `db.primary.prod` in namespace `vm` and VM `db.primary` in `prod`.
    let host_a = keys.cert(
        "ha",
        true,
        "kubevm-host:vm/db.primary.prod",
        41,
        "db.primary.prod.vm.vm",
    );
    let host_b = keys.cert(
        "hb",
        true,
        "kubevm-host:prod/db.primary",
        42,
        "db.primary.prod.vm",
    );
    let user_a = keys.cert(
        "ua",
        false,
        "kubectl-vm:alice:vm/db.primary.prod",
        43,
        "kubevm@db.primary.prod.vm",
    );
    let user_b = keys.cert(
        "ub",
        false,
        "kubectl-vm:alice:prod/db.primary",
        44,
        "kubevm@db.primary.prod",
    );
    let plain = keys.keygen("plain");
    let other = keys.keygen("other");
    let mut r = Revocations::default();
    r.serials.insert(42);
    r.serials.insert(u64::MAX);
    r.key_ids
        .insert("kubectl-vm:alice:vm/db.primary.prod".into());
    r.keys.push(pubkey(&plain));
    let krl = r.to_krl(3, 1_700_000_000);
    // By serial: only 42, not 41 (the other of the pair).
    assert!(keys.revoked(&krl, &host_b));
    assert!(!keys.revoked(&krl, &host_a));
    // By key ID: exactly that ID, not the other pair's.
    assert!(keys.revoked(&krl, &user_a));
    assert!(!keys.revoked(&krl, &user_b));
    // A plain key, and a certificate of that key.
    assert!(keys.revoked(&krl, &plain));
    assert!(!keys.revoked(&krl, &other));
    let dump = keys.dump(&krl);
    assert!(dump.starts_with("# KRL version 3\n"), "{dump}");
    assert!(dump.contains("# Comment: kubectl-vm ca revoke\n"), "{dump}");
    assert!(dump.contains("serial: 42\n"), "{dump}");
    assert!(dump.contains(&format!("serial: {}\n", u64::MAX)), "{dump}");
    assert!(
        dump.contains("id: kubectl-vm:alice:vm/db.primary.prod\n"),
        "{dump}"
    );
    let fp = pubkey(&plain)
        .fingerprint(ssh_key::HashAlg::Sha256)
        .to_string();
    assert!(dump.contains(&format!("hash: {fp}")), "{dump}");
    // Our own check agrees with ssh-keygen on each certificate.
    for (file, expected) in [
        (&host_a, None),
        (&host_b, Some(RevokedBy::Serial(42))),
        (
            &user_a,
            Some(RevokedBy::KeyId(
                "kubectl-vm:alice:vm/db.primary.prod".into(),
            )),
        ),
        (&user_b, None),
    ] {
        let cert = Certificate::from_openssh(&std::fs::read_to_string(file).unwrap()).unwrap();
        assert_eq!(r.certificate_revoked(&cert), expected, "{}", file.display());
    }
}

#[test]
fn a_key_id_with_spaces_and_unicode_round_trips() {
    let keys = Keys::new();
    let id = "Alice Ünal's laptop";
    let cert = keys.cert("u", false, id, 5, "kubevm@web.vm");
    let mut r = Revocations::default();
    r.key_ids.insert(id.into());
    assert!(keys.revoked(&r.to_krl(1, 1), &cert));
    let mut cm = ConfigMap::default();
    r.store(&mut cm, 1, 1);
    assert_eq!(Revocations::from_configmap(&cm), r);
}

#[test]
fn the_configmap_keeps_lists_and_krl_together() {
    let keys = Keys::new();
    let plain = keys.keygen("plain");
    let mut r = Revocations::default();
    r.serials.extend([9, 3]);
    r.key_ids.insert("kubevm-host:vm/db.primary.prod".into());
    r.keys.push(pubkey(&plain));
    let mut cm = ConfigMap::default();
    r.store(&mut cm, 7, 100);
    let data = cm.data.as_ref().unwrap();
    assert_eq!(
        data[REVOKED_CERTS_KEY],
        "serial: 3\nserial: 9\nid: kubevm-host:vm/db.primary.prod\n"
    );
    assert_eq!(data[crate::ca::REVOKED_KEYS_KEY].lines().count(), 1);
    assert_eq!(krl_version(&cm), 7);
    assert_eq!(krl_of(&cm).unwrap(), r.to_krl(7, 100));
    assert_eq!(Revocations::from_configmap(&cm), r);
}

#[test]
fn bad_input_is_refused() {
    assert!(check_serial(0).unwrap_err().contains("OpenSSH ignores it"));
    assert!(check_serial(1).is_ok());
    assert!(check_key_id("").is_err());
    assert!(check_key_id("a\nserial: 1").is_err());
    assert!(check_key_id(&"x".repeat(MAX_KEY_ID_LEN + 1)).is_err());
    assert!(check_key_id("kubevm-host:vm/db.primary.prod").is_ok());
}
