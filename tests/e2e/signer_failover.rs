//! The signer with two replicas behind the emulator's aggregation, which picks a random ready
//! endpoint for each request and does not retry a dead one (as kube-aggregator does): one
//! replica killed while ten clients run `kubectl vm ssh`, its endpoint then dropped as the
//! endpoints controller would. Every ssh succeeds: an issuance that met the dead replica is
//! retried once by the client. The long version with figures is `bench/signer-failover.sh`.

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
        if !wait_for(deadline, || issuance_statuses(&env).contains(&503)) {
            break 'run "a request routed to the dead replica";
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
    // Every 503 was followed by the client's own retry, which succeeded: one issuance answer
    // per ssh run besides them.
    let issued = statuses.iter().filter(|s| **s == 201).count();
    assert_eq!(issued, done.load(Ordering::SeqCst), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| matches!(s, 201 | 503)),
        "{statuses:?}"
    );
    drop(second);
}
