#!/usr/bin/env bash
# Soak (issue 37; not in CI): holds a console, a VNC, a port-forward and an ssh session of one
# VM open and idle for SOAK_IDLE seconds (default 600), then stalls each reader for 60 s while
# the far side sends, then reads everything and checks it; then runs 100 `kubectl vm ssh` in
# sequence and 20 at once. RSS and open file descriptors of every kubectl-vm session process and
# of the emulator (API server, signer, guests' streams) are sampled every second; the report gives
# each one's first and last value and its least-squares slope per minute (flat: |slope| near 0).
# Runs against the emulator, whose guest is a real sshd configured by the VM's cloud-init (needs
# root, see tests/emulator/src/core/sshd_guest.rs).
# Usage: bench/soak.sh            SOAK_IDLE=60 bench/soak.sh for a short run
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
build

start_emulator main kubevirt tests/fixtures/kubevirt.yaml
emulator=$emulator_pid
export KUBECONFIG="$work/main.kubeconfig" HOME="$work"
"$vm" ca init >/dev/null
"$vm" create soak --image quay.io/containerdisks/ubuntu:24.04 --wait --timeout 60s >/dev/null
"$vm" ssh soak -- true

VM="$vm" EMULATOR_PID="$emulator" IDLE="${SOAK_IDLE:-600}" python3 - <<'PY'
import os, socket, subprocess, sys, threading, time

vm, idle, stall = os.environ["VM"], int(os.environ["IDLE"]), 60
tracked = {"emulator": int(os.environ["EMULATOR_PID"])}
samples = {}  # name -> [(t, rss_kib, fds)]
stop = threading.Event()
t0 = time.monotonic()

def sample():
    while not stop.is_set():
        now = time.monotonic() - t0
        for name, pid in list(tracked.items()):
            try:
                with open(f"/proc/{pid}/status") as f:
                    rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
                fds = len(os.listdir(f"/proc/{pid}/fd"))
            except (FileNotFoundError, ProcessLookupError, StopIteration):
                continue
            samples.setdefault(name, []).append((now, rss, fds))
        stop.wait(1)

def slope(points):
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return 60 * sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else 0.0

def line_of(proc, pattern, timeout=60):
    """The first stdout line of `proc` containing `pattern`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode(errors="replace")
        if pattern in line:
            return line
        if not line and proc.poll() is not None:
            break
    sys.exit(f"no {pattern!r} from {proc.args}: {proc.stderr.read().decode(errors='replace')}")

def read_some(stream, deadline):
    """Up to 1 MiB from a pipe, b"" at its end, None past the deadline."""
    import select
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([stream], [], [], left)[0]:
        return None
    return stream.read1(1 << 20)

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data

threading.Thread(target=sample, daemon=True).start()
failures = []

# The four sessions, each held by a kubectl-vm process.
PIPE = subprocess.PIPE
console = subprocess.Popen([vm, "console", "soak"], stdin=PIPE, stdout=PIPE, stderr=PIPE)
tracked["console"] = console.pid
# The emulator's serial guest asks for a login (tests/emulator/src/core/guest.rs: cloud/cloud).
console.stdin.write(b"\ncloud\ncloud\n")
console.stdin.flush()
vnc_port = free_port()
vnc = subprocess.Popen([vm, "vnc", "soak", "--proxy-only", "--port", str(vnc_port)], stdout=PIPE, stderr=PIPE)
tracked["vnc"] = vnc.pid
line_of(vnc, '"port"')
vnc_sock = socket.create_connection(("127.0.0.1", vnc_port))
vnc_sock.settimeout(120)
assert recv_exact(vnc_sock, 12) == b"RFB 003.008\n"
pf_port = free_port()
pf = subprocess.Popen([vm, "port-forward", "soak", f"{pf_port}:22"], stdout=PIPE, stderr=PIPE)
tracked["port-forward"] = pf.pid
line_of(pf, "Forwarding from")
# Real OpenSSH through the forwarded port (sshd drops a connection that has not logged in after
# LoginGraceTime, so the held session is a logged-in one), with a certificate from ssh-cert.
subprocess.run([vm, "ssh-cert", "soak.default.vm"], check=True, capture_output=True)
home = os.environ["HOME"]
pf_size = 16 << 20
pf_ssh = subprocess.Popen(["ssh", "-p", str(pf_port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-i", f"{home}/.kube/kubectl-vm/ssh/id_ed25519",
    "-o", f"CertificateFile={home}/.kube/kubectl-vm/ssh/certs/kubevm@soak.default.vm-cert.pub",
    "kubevm@127.0.0.1", f"read go; head -c {pf_size} /dev/zero"], stdin=PIPE, stdout=PIPE, stderr=PIPE)
size = 64 << 20
ssh = subprocess.Popen([vm, "ssh", "soak", "--", f"read go; head -c {size} /dev/zero"], stdin=PIPE, stdout=PIPE, stderr=PIPE)
tracked["ssh"] = ssh.pid
print(f"sessions open; idle for {idle} s", flush=True)
time.sleep(idle)
idle_end = time.monotonic() - t0
for name, proc in [("console", console), ("vnc", vnc), ("port-forward", pf), ("ssh", ssh)]:
    if proc.poll() is not None:
        failures.append(f"{name} ended during the idle hold: {proc.stderr.read().decode(errors='replace')}")

# Each far side sends while nobody reads for `stall` seconds; then everything is read.
# The marker is computed by the guest's shell, so the echo of the typed line does not match.
console.stdin.write(b"\nhead -c 2000000 /dev/zero | tr '\\0' x; echo; echo SOAK-$((6*7))\n")
console.stdin.flush()
vnc_sock.sendall(b"RFB 003.008\n")
pf_ssh.stdin.write(b"go\n")
pf_ssh.stdin.flush()
ssh.stdin.write(b"go\n")
ssh.stdin.flush()
print(f"readers stalled for {stall} s", flush=True)
time.sleep(stall)
got, deadline = 0, time.monotonic() + 120
while True:
    chunk = read_some(ssh.stdout, deadline)
    if not chunk:
        break
    got += len(chunk)
if got != size or ssh.wait(timeout=30) != 0:
    failures.append(f"ssh: {got} of {size} bytes, exit {ssh.returncode}: {ssh.stderr.read().decode(errors='replace')}")
tail, console_bytes, deadline = b"", 0, time.monotonic() + 120
while b"SOAK-42" not in tail:
    chunk = read_some(console.stdout, deadline)
    if not chunk:
        failures.append("console: closed or silent before the marker")
        break
    console_bytes += len(chunk)
    tail = (tail + chunk)[-64:]
if console_bytes < 2_000_000:
    failures.append(f"console: only {console_bytes} bytes")
if recv_exact(vnc_sock, 2) != b"\x01\x01":
    failures.append("vnc: security types")
vnc_sock.sendall(b"\x01")
recv_exact(vnc_sock, 4)
vnc_sock.sendall(b"\x01")
head = recv_exact(vnc_sock, 24)
recv_exact(vnc_sock, int.from_bytes(head[20:24], "big"))
vnc_sock.sendall(bytes([3, 0]) + (0).to_bytes(4, "big") + head[0:4])
update = recv_exact(vnc_sock, 4)
if update[0] != 0:
    failures.append(f"vnc: update {update!r}")
pf_got, deadline = 0, time.monotonic() + 120
while True:
    chunk = read_some(pf_ssh.stdout, deadline)
    if not chunk:
        break
    pf_got += len(chunk)
if pf_got != pf_size or pf_ssh.wait() != 0:
    failures.append(f"port-forward (OpenSSH): {pf_got} of {pf_size} bytes, exit {pf_ssh.returncode}: {pf_ssh.stderr.read().decode(errors='replace')}")
for proc in (console, vnc, pf):
    proc.terminate()
    proc.wait()
vnc_sock.close()

errors = []

def run_ssh(results, i):
    r = subprocess.run([vm, "ssh", "soak", "--", "echo ok"], capture_output=True)
    results[i] = r.returncode == 0 and r.stdout.strip() == b"ok"
    if not results[i]:
        errors.append(f"exit {r.returncode}: {r.stderr.decode(errors='replace').strip()}")

start = time.monotonic()
results = [None] * 100
for i in range(100):
    run_ssh(results, i)
sequential = time.monotonic() - start
start = time.monotonic()
together = [None] * 20
threads = [threading.Thread(target=run_ssh, args=(together, i)) for i in range(20)]
for t in threads:
    t.start()
for t in threads:
    t.join()
concurrent = time.monotonic() - start
stop.set()

print(f"\nidle hold {idle} s, stalled readers {stall} s")
print(f"ssh in sequence: {results.count(True)}/100 ok in {sequential:.1f} s; 20 at once: {together.count(True)}/20 ok in {concurrent:.1f} s")
print(f"{'process':<14}{'samples':>8}{'RSS KiB first→last':>22}{'idle KiB/min':>14}{'all KiB/min':>13}{'fds first→last':>16}{'idle fds/min':>14}")
for name, pts in samples.items():
    held = [p for p in pts if p[0] >= 10] or pts  # the first seconds are start-up
    idle_pts = [p for p in held if p[0] <= idle_end] or held
    print(f"{name:<14}{len(pts):>8}{f'{held[0][1]}→{held[-1][1]}':>22}"
          f"{slope([(t, r) for t, r, _ in idle_pts]):>14.2f}{slope([(t, r) for t, r, _ in held]):>13.2f}"
          f"{f'{held[0][2]}→{held[-1][2]}':>16}{slope([(t, f) for t, _, f in idle_pts]):>14.3f}")
for f in failures:
    print("FAILED:", f)
for e in sorted(set(errors)):
    print("ssh failed:", e)
sys.exit(1 if failures or results.count(True) < 100 or together.count(True) < 20 else 0)
PY
