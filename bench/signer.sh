#!/usr/bin/env bash
# Benchmarks the SSH signer on one machine against the emulator (which proxies
# ssh.kubevm.io to it as kube-aggregator does), the signer running as its ServiceAccount.
# Prints:
#   issuance:  POST …/virtualmachines/VM/sshcertificate through the API server, curl end to end
#              (a new TLS connection each), p50, p95 and p99 over REQUESTS, the signer's own
#              SubjectAccessReview included                          (goal p50 <= 10 ms, p99 <= 50 ms)
#   ssh:       `kubectl vm ssh VM -- true`, mean wall time, signer mode / direct mode (goal <= 1.15)
#   signer RSS idle, and its peak while answering REQUESTS with 50 at once
# Needs root (the emulator's guest runs a real sshd), curl, ssh-keygen and kubectl >= 1.26
# (fetched by bench/common.sh). Usage: bench/signer.sh [REQUESTS] [RUNS]   (defaults 200, 20;
# PROFILE=debug for no release build)
requests=${1:-200}
runs=${2:-20}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
build
need_kubectl
start_emulator main kubevirt tests/fixtures/kubevirt.yaml
use_emulator main
"$vm" ca init --signer --image bench >/dev/null
# (kubectl's discovery complains about the APIService until the signer runs.)
token=$("$kubectl" create token kubevm-ssh-signer -n kubevm-system 2>/dev/null)
"$kubectl" get secret kubevm-ssh-signer-tls -n kubevm-system -o jsonpath='{.data.tls\.crt}' 2>/dev/null | base64 -d >"$work/tls.crt"
"$kubectl" get secret kubevm-ssh-signer-tls -n kubevm-system -o jsonpath='{.data.tls\.key}' 2>/dev/null | base64 -d >"$work/tls.key"
"$kubectl" config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$work/ca.crt"
server=$("$kubectl" config view --minify -o jsonpath='{.clusters[0].cluster.server}')
admin=$("$kubectl" config view --raw --minify -o jsonpath='{.users[0].user.token}')
sed "s/token: .*/token: $token/" "$KUBECONFIG" >"$work/signer.kubeconfig"
"$vm" --kubeconfig "$work/signer.kubeconfig" signer serve --listen 127.0.0.1:0 \
  --tls-cert-file "$work/tls.crt" --tls-private-key-file "$work/tls.key" >"$work/signer.log" 2>&1 &
signer=$!
bench_pids+=("$signer")
for _ in $(seq 100); do grep -q '"listening"' "$work/signer.log" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/.*"address":"127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$work/signer.log" | head -1)
printf '%s\n' 'apiVersion: v1' 'kind: Endpoints' \
  'metadata: {name: kubevm-ssh-signer, namespace: kubevm-system}' \
  "subsets: [{addresses: [{ip: 127.0.0.1}], ports: [{name: https, port: $port, protocol: TCP}]}]" |
  "$kubectl" apply -f - >/dev/null 2>&1
"$vm" create bench --image quay.io/containerdisks/ubuntu:24.04 --wait --timeout 60s >/dev/null 2>&1
rss() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$signer/status"; }
py() { python3 -c "print($1)"; }

ssh-keygen -q -t ed25519 -N '' -f "$work/key"
printf '{"apiVersion":"ssh.kubevm.io/v1alpha1","kind":"SSHCertificateRequest","spec":{"publicKey":"%s"}}' \
  "$(cut -d' ' -f1,2 "$work/key.pub")" >"$work/request.json"
url="$server/apis/ssh.kubevm.io/v1alpha1/namespaces/default/virtualmachines/bench/sshcertificate"
issue() {
  curl -s -o /dev/null -w '%{http_code} %{time_total}\n' --cacert "$work/ca.crt" \
    -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
    --data-binary "@$work/request.json" "$url"
}
# As a new user each time (impersonated, in group system:masters): the signer's access review
# is never answered from its cache.
issue_as() {
  curl -s -o /dev/null -w '%{http_code} %{time_total}\n' --cacert "$work/ca.crt" \
    -H "Authorization: Bearer $admin" -H "Impersonate-User: bench-$1" -H 'Impersonate-Group: system:masters' \
    -H 'Content-Type: application/json' --data-binary "@$work/request.json" "$url"
}
export -f issue issue_as; export work admin url
idle=$(rss VmRSS)
for _ in $(seq "$requests"); do issue; done >"$work/sequential"
failed=$(grep -vc '^201 ' "$work/sequential" || true)
[ "$failed" = 0 ] || { echo "$failed issuances failed:" >&2; grep -v '^201 ' "$work/sequential" | sort | uniq -c | head >&2; exit 1; }
python3 - "$work/sequential" <<'PY'
import statistics, sys
t = sorted(float(l.split()[1]) * 1000 for l in open(sys.argv[1]))
p = lambda q: t[min(len(t) - 1, int(q * len(t)))]
print(f"issuance   {len(t)} sequential: p50 {p(0.5):.1f} ms  p95 {p(0.95):.1f} ms  p99 {p(0.99):.1f} ms  mean {statistics.mean(t):.1f} ms")
PY
for i in $(seq "$requests"); do issue_as "$i"; done >"$work/uncached"
failed=$(grep -vc '^201 ' "$work/uncached" || true)
[ "$failed" = 0 ] || { echo "$failed issuances as new users failed:" >&2; grep -v '^201 ' "$work/uncached" | sort | uniq -c | head >&2; exit 1; }
python3 - "$work/uncached" <<'PY'
import statistics, sys
t = sorted(float(l.split()[1]) * 1000 for l in open(sys.argv[1]))
p = lambda q: t[min(len(t) - 1, int(q * len(t)))]
print(f"issuance   {len(t)} sequential, a new caller each (review not cached): p50 {p(0.5):.1f} ms  p95 {p(0.95):.1f} ms  p99 {p(0.99):.1f} ms")
PY
seq "$requests" | xargs -P 50 -I{} bash -c issue >"$work/concurrent"
printf 'signer RSS idle %s KiB, peak after %s requests 50 at once %s KiB (%s answered 201)\n' \
  "$idle" "$requests" "$(rss VmHWM)" "$(grep -c '^201 ' "$work/concurrent")"

with_signer=$(mean_us "$vm" ssh bench --strict-host-key-checking yes -- true)
"$kubectl" delete apiservice v1alpha1.ssh.kubevm.io >/dev/null 2>&1
direct=$(mean_us "$vm" ssh bench --strict-host-key-checking yes -- true)
printf 'ssh        signer %8.1f ms   direct %8.1f ms   ratio %s (runs: %s)\n' \
  "$(py "$with_signer/1000")" "$(py "$direct/1000")" "$(py "round($with_signer/$direct, 3)")" "$runs"
