//! The signer with two replicas behind the emulator's aggregation, which picks a random ready
//! endpoint for each request and does not retry a dead one (as kube-aggregator does): one
//! replica killed while ten clients run `kubectl vm ssh`, its endpoint then dropped as the
//! endpoints controller would, after a dozen requests have met it dead. Every ssh succeeds:
//! an issuance that met the dead replica is tried again by the client (up to four times over
//! about 4 s). The long version with figures is `bench/signer-failover.sh`.

use std::io::BufRead;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{Env, stderr};
use crate::signer::{create_vm, ssh_as, start_signer, start_signer_process};

const CA_NS: &str = "kubevm-system";
const CLIENTS: usize = 10;

/// Endpoints of the signer's Service: one subset per replica port, all on 127.0.0.1.
fn endpoints(env: &Env, ports: &[u16]) {
    let subsets: Vec<_> = ports
        .iter()
        .map(|p| {
            json!({"addresses": [{"ip": "127.0.0.1"}],
            "ports": [{"name": "https", "port": p, "protocol": "TCP"}]})
        })
        .collect();
    env.emulator.put_object(json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubevm-ssh-signer", "namespace": CA_NS},
        "subsets": subsets
    }));
}

fn port_of(address: &str) -> u16 {
    address.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// The statuses the API server answered for certificate requests so far.
fn issuance_statuses(env: &Env) -> Vec<u16> {
    env.emulator
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/sshcertificate"))
        .map(|r| r.status)
        .collect()
}

/// Polls `done` until it holds (true) or `deadline` passes (false).
fn wait_for(deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// A child process killed when dropped (also when the test fails).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_replica_killed_under_load_fails_no_ssh() {
    let env = Env::kubevirt();
    let mut first = start_signer(&env, &[]);
    create_vm(&env, "busy", "default");
    // The client's key exists before the clients start (they share one HOME).
    let out = ssh_as(&env, &[], &["busy", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut second = KillOnDrop(start_signer_process(&env, &[]));
    let mut lines = std::io::BufReader::new(second.0.stdout.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    // Its audit lines and log are read on (a full pipe would stop it).
    std::thread::spawn(move || lines.for_each(drop));
    let mut log = second.0.stderr.take().unwrap();
    std::thread::spawn(move || std::io::copy(&mut log, &mut std::io::sink()));
    let listening: serde_json::Value = serde_json::from_str(&line).unwrap();
    let (a, b) = (
        port_of(&first.address),
        port_of(listening["address"].as_str().unwrap()),
    );
    endpoints(&env, &[a, b]);
    env.emulator.clear_requests();

    let env = Arc::new(env);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (env, stop, done) = (env.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut failures = vec![];
                while !stop.load(Ordering::SeqCst) {
                    let out = ssh_as(&env, &[], &["busy", "--", "true"]);
                    if out.status.code() != Some(0) {
                        failures.push(stderr(&out));
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                }
                failures
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Both replicas issue under load; then the first dies. Its endpoint stays until a request
    // has met it dead (a 503 from the aggregator), then goes, as the endpoints controller drops
    // a pod that is gone; then 10 more runs.
    let statuses_before;
    let mut after = 0;
    let reached = 'run: {
        if !wait_for(deadline, || done.load(Ordering::SeqCst) >= 10) {
            break 'run "10 ssh runs";
        }
        statuses_before = issuance_statuses(&env);
        first.stop();
        // The endpoints controller drops a killed replica only once its pod is seen not
        // ready: its endpoint stays while a dozen requests meet it dead (each try has an even
        // chance), so some client meets it on a retry too.
        if !wait_for(deadline, || {
            issuance_statuses(&env)
                .iter()
                .filter(|s| **s == 503)
                .count()
                >= 12
        }) {
            break 'run "12 requests routed to the dead replica";
        }
        endpoints(&env, &[b]);
        after = done.load(Ordering::SeqCst);
        if !wait_for(deadline, || done.load(Ordering::SeqCst) >= after + 10) {
            break 'run "10 more ssh runs";
        }
        // (0: still being answered when looked at.)
        assert!(
            statuses_before.iter().all(|s| matches!(s, 0 | 201)),
            "{statuses_before:?}"
        );
        ""
    };
    stop.store(true, Ordering::SeqCst);
    let failures: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(
        reached.is_empty(),
        "timed out waiting for {reached} (after {after})"
    );
    let statuses = issuance_statuses(&env);
    let refused = statuses.iter().filter(|s| **s == 503).count();
    assert!(
        failures.is_empty(),
        "{} of {} ssh failed ({refused} issuances met the dead replica): {failures:?}",
        failures.len(),
        done.load(Ordering::SeqCst)
    );
    // Every 503 was followed by the client's own retries, the last of which succeeded: one
    // issuance answer per ssh run besides them.
    let issued = statuses.iter().filter(|s| **s == 201).count();
    assert_eq!(issued, done.load(Ordering::SeqCst), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| matches!(s, 201 | 503)),
        "{statuses:?}"
    );
    drop(second);
}

/// One client's issuance and what OpenSSH made of its certificate.
struct Issued {
    start: Instant,
    end: Instant,
    /// `ssh-cert`'s stderr when it failed.
    failed: Option<String>,
    /// `ssh-keygen -L`'s "Signing CA" fingerprint (it parses the certificate only if the CA's
    /// signature over it verifies), or its stderr.
    signing_ca: Result<String, String>,
    /// Real OpenSSH logged in to the guest's real sshd with the certificate: its exit code
    /// and stderr.
    login: (Option<i32>, String),
}

/// `ssh-cert busy.default.vm` in `home`, then `ssh-keygen -L` of the certificate and a login
/// of real OpenSSH with it.
fn issue_and_check(env: &Env, home: &std::path::Path) -> Issued {
    let start = Instant::now();
    let out = env
        .command(crate::common::BIN)
        .env("HOME", home)
        .args(["ssh-cert", "busy.default.vm"])
        .output()
        .unwrap();
    let end = Instant::now();
    let dir = home.join(".kube/kubectl-vm/ssh");
    let cert = dir.join("certs/kubevm@busy.default.vm-cert.pub");
    if !out.status.success() {
        return Issued {
            start,
            end,
            failed: Some(stderr(&out)),
            signing_ca: Err(String::new()),
            login: (None, String::new()),
        };
    }
    let listed = std::process::Command::new("ssh-keygen")
        .arg("-L")
        .arg("-f")
        .arg(&cert)
        .output()
        .unwrap();
    let text = crate::common::stdout(&listed);
    let signing_ca = text
        .split("Signing CA: ED25519 ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .filter(|_| listed.status.success())
        .map(str::to_owned)
        .ok_or_else(|| format!("{text}{}", stderr(&listed)));
    let login =
        crate::common::openssh_via_vm(env, "", "busy.default", &dir.join("id_ed25519"), &cert)
            .args(["kubevm@busy.default", "true"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
    Issued {
        start,
        end,
        failed: None,
        signing_ca,
        login: (login.status.code(), stderr(&login)),
    }
}

/// The CA keys' fingerprints as `ca show -o json` lists them: (trusted or signing, fingerprint).
fn ca_keys(env: &Env) -> Vec<(String, String)> {
    let json: serde_json::Value =
        serde_json::from_str(&crate::common::ok(env.vm(&["ca", "show", "-o", "json"]))).unwrap();
    json["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["role"].as_str().unwrap().to_owned(),
                k["fingerprint"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Runs `step` while `CLIENTS / 2` clients issue certificates (each in its own HOME) and check
/// each one: 8 issuances before the step, then 8 after it ended. Returns every issuance and
/// when the step ran.
fn under_load(
    env: &Arc<Env>,
    homes: &[std::path::PathBuf],
    step: impl FnOnce(),
) -> (Vec<Issued>, Instant, Instant) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = homes
        .iter()
        .map(|home| {
            let (env, stop, done, home) = (env.clone(), stop.clone(), done.clone(), home.clone());
            std::thread::spawn(move || {
                let mut issued = vec![];
                while !stop.load(Ordering::SeqCst) {
                    issued.push(issue_and_check(&env, &home));
                    done.fetch_add(1, Ordering::SeqCst);
                }
                issued
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let before = wait_for(deadline, || done.load(Ordering::SeqCst) >= 8);
    let step_start = Instant::now();
    step();
    let step_end = Instant::now();
    let after = done.load(Ordering::SeqCst);
    let after_ok = wait_for(deadline, || done.load(Ordering::SeqCst) >= after + 8);
    stop.store(true, Ordering::SeqCst);
    let issued: Vec<Issued> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(before && after_ok, "timed out ({} issuances)", issued.len());
    (issued, step_start, step_end)
}

/// Checks every issuance: none failed, OpenSSH verified the certificate's signature and its CA
/// is in `trusted` (the keys the guest booted with), and the guest's sshd let it in. Returns
/// the signing CAs of the issuances that ended before `start` and began after `end`.
fn all_verify(
    issued: &[Issued],
    trusted: &[&str],
    start: Instant,
    end: Instant,
) -> [Vec<String>; 2] {
    let mut sides = [vec![], vec![]];
    for (i, r) in issued.iter().enumerate() {
        assert_eq!(r.failed, None, "issuance {i} of {}", issued.len());
        let ca = r
            .signing_ca
            .as_ref()
            .unwrap_or_else(|e| panic!("ssh-keygen -L: {e}"));
        assert!(trusted.contains(&ca.as_str()), "{ca} not in {trusted:?}");
        assert_eq!(r.login.0, Some(0), "OpenSSH login: {}", r.login.1);
        if r.end < start {
            sides[0].push(ca.clone());
        } else if r.start > end {
            sides[1].push(ca.clone());
        }
    }
    sides
}

/// `ca rotate` and `ca rotate --finish` while clients issue certificates: no issuance fails,
/// and every certificate verifies (real `ssh-keygen -L`) against a key the guest trusts at
/// that moment, which its real sshd confirms by letting real OpenSSH in with it.
#[test]
fn ca_rotation_under_load_fails_no_issuance() {
    let env = Env::kubevirt();
    let _signer = start_signer(&env, &[]);
    create_vm(&env, "busy", "default");
    let keys = ca_keys(&env);
    let [(_, old)] = &keys[..] else {
        panic!("{keys:?}")
    };
    let homes: Vec<_> = (0..CLIENTS / 2)
        .map(|i| env.dir.path().join(format!("client-{i}")))
        .collect();
    env.emulator.clear_requests();
    let env = Arc::new(env);

    // The guest booted trusting the old key only; `ca rotate` adds a new one: the signer keeps
    // signing with the old key, the one every running guest trusts.
    let (issued, start, end) = under_load(&env, &homes, || {
        crate::common::ok(env.vm(&["ca", "rotate"]));
    });
    let [before, after] = all_verify(&issued, &[old], start, end);
    assert!(
        !before.is_empty() && after.iter().all(|ca| ca == old),
        "{after:?}"
    );
    let keys = ca_keys(&env);
    let [(role_old, kept), (role_new, new)] = &keys[..] else {
        panic!("{keys:?}")
    };
    assert_eq!((role_old.as_str(), kept), ("trusted", old));
    assert_eq!(role_new, "signing");

    // Rebooted, the guest trusts both; `--finish` under load: the new key signs from then on.
    crate::common::ok(env.vm(&["restart", "busy", "--wait", "--timeout", "60s"]));
    let (issued, start, end) = under_load(&env, &homes, || {
        crate::common::ok(env.vm(&["ca", "rotate", "--finish"]));
    });
    let [before, after] = all_verify(&issued, &[old, new], start, end);
    assert!(before.iter().all(|ca| ca == old), "{before:?}");
    assert!(
        !after.is_empty() && after.iter().all(|ca| ca == new),
        "{after:?}"
    );
    let statuses = issuance_statuses(&env);
    assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");
}
