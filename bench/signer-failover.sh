#!/usr/bin/env bash
# The SSH signer under load and failover (issue 37; not in CI, ~75 s). Two `signer serve`
# replicas behind the emulator's aggregation, which routes each request to a ready endpoint
# chosen at random and never retries a dead one (as kube-aggregator does). CLIENTS processes
# (default 50) issue for DURATION seconds (default 60): SSH_CLIENTS of them (default 8) run
# `kubectl vm ssh VM -- true` in a loop, the others `kubectl vm ssh-cert`, each in its own HOME.
# At 1/3 of the run replica A is killed (SIGKILL) and, REMOVE_AFTER seconds later (default 1),
# its endpoint removed as the endpoints controller does once the pod is gone; at 2/3 `ca rotate`
# runs. Prints the issuances (count, failed commands, p50/p99 of the client's wall time, which
# includes its retries), the ssh runs and failures, and checks every certificate issued with
# OpenSSH's `ssh-keygen -L` (which reads a certificate only if its CA's signature verifies):
# its signing CA is one the guest trusts at the moment (the key it booted with: the rotation's
# new key reaches a guest at its next boot, and the signer signs with the key every guest
# trusts until `ca rotate --finish`). The ssh clients' logins are checked by the guest's sshd.
# Needs root (the emulator's guest runs a real sshd), python3, ssh-keygen, kubectl (fetched by
# bench/common.sh). Usage: bench/signer-failover.sh   (CLIENTS=10 DURATION=20 for a short run;
# PROFILE=debug for no release build)
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
build
need_kubectl
start_emulator main kubevirt tests/fixtures/kubevirt.yaml
use_emulator main
"$vm" ca init --signer --image bench >/dev/null
token=$("$kubectl" create token kubevm-ssh-signer -n kubevm-system --duration 1h 2>/dev/null)
"$kubectl" get secret kubevm-ssh-signer-tls -n kubevm-system -o jsonpath='{.data.tls\.crt}' 2>/dev/null | base64 -d >"$work/tls.crt"
"$kubectl" get secret kubevm-ssh-signer-tls -n kubevm-system -o jsonpath='{.data.tls\.key}' 2>/dev/null | base64 -d >"$work/tls.key"
sed "s/token: .*/token: $token/" "$KUBECONFIG" >"$work/signer.kubeconfig"
serve() {
  "$vm" --kubeconfig "$work/signer.kubeconfig" signer serve --listen 127.0.0.1:0 \
    --tls-cert-file "$work/tls.crt" --tls-private-key-file "$work/tls.key" >"$work/signer-$1.log" 2>&1 &
}
port_of() {
  for _ in $(seq 100); do grep -q '"listening"' "$work/signer-$1.log" 2>/dev/null && break; sleep 0.1; done
  sed -n 's/.*"address":"127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$work/signer-$1.log" | head -1
}
serve a; signer_a=$!; bench_pids+=("$signer_a")
serve b; signer_b=$!; bench_pids+=("$signer_b")
port_a=$(port_of a) port_b=$(port_of b)
# The endpoints controller's Endpoints of the Service: one subset per ready replica.
endpoints() {
  local subsets="" p
  for p in "$@"; do
    subsets="$subsets{addresses: [{ip: 127.0.0.1}], ports: [{name: https, port: $p, protocol: TCP}]},"
  done
  printf '%s\n' 'apiVersion: v1' 'kind: Endpoints' \
    'metadata: {name: kubevm-ssh-signer, namespace: kubevm-system}' "subsets: [${subsets%,}]" |
    "$kubectl" apply -f - >/dev/null 2>&1
}
endpoints "$port_a" "$port_b"
"$vm" create bench --image quay.io/containerdisks/ubuntu:24.04 --wait --timeout 60s >/dev/null
"$vm" ca show -o json >"$work/trust-before.json"

VM="$vm" WORK="$work" KUBECTL="$kubectl" SIGNER_A="$signer_a" PORT_B="$port_b" \
  CLIENTS="${CLIENTS:-50}" SSH_CLIENTS="${SSH_CLIENTS:-8}" DURATION="${DURATION:-60}" \
  REMOVE_AFTER="${REMOVE_AFTER:-1}" python3 - <<'PY'
import json, os, signal, subprocess, threading, time

vm, work = os.environ["VM"], os.environ["WORK"]
clients, ssh_clients = int(os.environ["CLIENTS"]), int(os.environ["SSH_CLIENTS"])
duration, remove_after = float(os.environ["DURATION"]), float(os.environ["REMOVE_AFTER"])
results = []  # (kind, start, end, exit code, stderr, certificate text or None)
lock = threading.Lock()
stop = threading.Event()
t0 = time.monotonic()

def client(i, kind):
    home = f"{work}/client-{i}"
    os.makedirs(home)
    env = dict(os.environ, HOME=home)
    args = [vm, "ssh", "bench", "--", "true"] if kind == "ssh" else [vm, "ssh-cert", "bench.default.vm"]
    cert = f"{home}/.kube/kubectl-vm/ssh/certs/kubevm@bench.default.vm-cert.pub"
    while not stop.is_set():
        start = time.monotonic() - t0
        p = subprocess.run(args, env=env, stdin=subprocess.DEVNULL, capture_output=True)
        end = time.monotonic() - t0
        text = open(cert).read() if kind == "ssh-cert" and p.returncode == 0 else None
        with lock:
            results.append((kind, start, end, p.returncode, p.stderr.decode(errors="replace").strip(), text))

threads = [threading.Thread(target=client, args=(i, "ssh" if i < ssh_clients else "ssh-cert"))
           for i in range(clients)]
for t in threads:
    t.start()
events = {}
def at(t):
    time.sleep(max(0, t0 + t - time.monotonic()))
at(duration / 3)
os.kill(int(os.environ["SIGNER_A"]), signal.SIGKILL)
events["kill"] = time.monotonic() - t0
time.sleep(remove_after)
subprocess.run(["bash", "-c", f'''printf '%s\\n' 'apiVersion: v1' 'kind: Endpoints' \
  'metadata: {{name: kubevm-ssh-signer, namespace: kubevm-system}}' \
  'subsets: [{{addresses: [{{ip: 127.0.0.1}}], ports: [{{name: https, port: {os.environ["PORT_B"]}, protocol: TCP}}]}}]' |
  "{os.environ["KUBECTL"]}" apply -f - >/dev/null'''], check=True)
events["endpoint removed"] = time.monotonic() - t0
at(2 * duration / 3)
events["rotate start"] = time.monotonic() - t0
rotated = subprocess.run([vm, "ca", "rotate"], capture_output=True, text=True)
events["rotate end"] = time.monotonic() - t0
at(duration)
stop.set()
for t in threads:
    t.join()
trust_after = json.loads(subprocess.run([vm, "ca", "show", "-o", "json"], capture_output=True,
                                        text=True, check=True).stdout)
trust_before = json.load(open(f"{work}/trust-before.json"))
fp = lambda keys: {k["fingerprint"] for k in keys["keys"]}
guest_trust = fp(trust_before)  # what the guest booted with; it has not rebooted

def check_certificate(path):
    """(signing CA fingerprint, whether OpenSSH read the certificate) by `ssh-keygen -L`, which
    refuses a certificate whose signature does not verify."""
    p = subprocess.run(["ssh-keygen", "-L", "-f", path], capture_output=True, text=True)
    found = [l.split()[3] for l in p.stdout.splitlines() if l.strip().startswith("Signing CA:")]
    return (found[0] if found else p.stderr.strip()), p.returncode == 0 and bool(found)

def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] * 1000 if v else float("nan")

certs = [r for r in results if r[0] == "ssh-cert"]
sshs = [r for r in results if r[0] == "ssh"]
failed_certs = [r for r in certs if r[3] != 0]
failed_ssh = [r for r in sshs if r[3] != 0]
print(f"run: {duration:.0f} s, {clients} clients ({ssh_clients} ssh, {clients - ssh_clients} ssh-cert); "
      + ", ".join(f"{k} at {v:.1f} s" for k, v in events.items()))
print(f"rotate: exit {rotated.returncode}: {rotated.stdout.strip() or rotated.stderr.strip()}")
for name, runs, failed in [("ssh-cert", certs, failed_certs), ("ssh", sshs, failed_ssh)]:
    times = [r[2] - r[1] for r in runs if r[3] == 0]
    window = [r for r in runs if r[1] <= events["endpoint removed"] and r[2] >= events["kill"]]
    print(f"{name:8} {len(runs)} runs, {len(failed)} failed; wall time p50 {pct(times, 0.5):.0f} ms "
          f"p99 {pct(times, 0.99):.0f} ms max {pct(times, 1):.0f} ms; "
          f"{len(window)} overlapped the kill-to-removal window, "
          f"{sum(1 for r in failed if r in window)} of the failures")
for r in (failed_certs + failed_ssh)[:10]:
    print(f"  failed {r[0]} at {r[1]:.1f}-{r[2]:.1f} s (exit {r[3]}): {r[4]}")
bad, signers = [], {}
for r in certs:
    if r[5] is None:
        continue
    with open(f"{work}/check-cert.pub", "w") as f:
        f.write(r[5])
    fingerprint, valid = check_certificate(f"{work}/check-cert.pub")
    signers[fingerprint] = signers.get(fingerprint, 0) + 1
    # Trusted at that moment: the bundle the guest booted with, before and after the rotation.
    if not valid or fingerprint not in guest_trust:
        bad.append((r[1], r[2], fingerprint, valid))
print(f"certificates: {sum(signers.values())} checked, signed by {signers}; guest trusts "
      f"{sorted(guest_trust)}, bundle after rotate {sorted(fp(trust_after))}; "
      f"{len(bad)} not verifying against a key the guest trusts")
for b in bad[:10]:
    print(f"  {b}")
if bad or failed_ssh or failed_certs:
    raise SystemExit(1)
PY
