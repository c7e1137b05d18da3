#!/usr/bin/env bash
# Benchmarks `kubectl vm export` against curl on the same export URL with the same token, both
# writing to disk, and measures the peak RSS of kubectl-vm exporting a 2 GiB volume.
#   throughput: kubectl-vm (raw, Range-capable, sha256 while streaming) vs `curl -o`   (goal >= 0.9x)
#   memory:     peak RSS of kubectl-vm over the whole 2 GiB run (/usr/bin/time -v)   (goal < 32 MB)
# Usage: bench/export.sh [SIZE_GIB]   (default 2). Builds release binaries first.
set -euo pipefail
gib=${1:-2}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash tests/tools/get-kubectl.sh "$root/.tools/bin" >/dev/null
kubectl="$root/.tools/bin/kubectl"
cargo build --quiet --release --locked -p kubectl-vm -p kubevm-emulator
vm="$root/target/release/kubectl-vm"
size=$((gib * 1024 * 1024 * 1024))

work=$(mktemp -d)
cat >"$work/fixture.yaml" <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: bench, namespace: default}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: "$size"}}}
status: {phase: Bound, capacity: {storage: "$size"}}
YAML
"$root/target/release/kubevm-emulator" --fixture "$work/fixture.yaml" --flavor kubevirt \
  --kubeconfig "$work/kubeconfig" >"$work/emulator.log" 2>&1 &
emulator=$!
trap 'kill $emulator 2>/dev/null; wait $emulator 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
export KUBECONFIG="$work/kubeconfig" HOME="$work"

now() { date +%s%N; }
start=$(now)
/usr/bin/time -v "$vm" export pvc/bench -o "$work/vm.img" --keep 2>"$work/vm.log"
vm_ns=$(( $(now) - start ))
rss_kb=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$work/vm.log")
name=$("$kubectl" get vmexport -o jsonpath='{.items[0].metadata.name}')
url=$("$kubectl" get vmexport "$name" -o jsonpath='{.status.links.external.volumes[0].formats[?(@.format=="raw")].url}')
"$kubectl" get vmexport "$name" -o jsonpath='{.status.links.external.cert}' >"$work/ca.pem"
token=$("$kubectl" get secret "$name-token" -o jsonpath='{.data.token}' | base64 -d)
rm -f "$work/vm.img"
start=$(now)
curl -sSf --cacert "$work/ca.pem" -H "x-kubevirt-export-token: $token" -o "$work/curl.img" "$url"
curl_ns=$(( $(now) - start ))
"$kubectl" delete vmexport "$name" >/dev/null

# curl's time has no export setup; take kubectl-vm's transfer time from its own report too.
vm_transfer=$(grep -o 'in [0-9.]*s' "$work/vm.log" | head -1 | tr -dc '0-9.')
python3 - "$size" "$vm_ns" "$curl_ns" "$vm_transfer" "$rss_kb" <<'PY'
import sys
size, vm_ns, curl_ns, vm_tr, rss = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
mib = size / 2**20
vm_total, curl_s = vm_ns / 1e9, curl_ns / 1e9
print(f"volume        {mib:.0f} MiB")
print(f"kubectl-vm    {mib/vm_tr:8.1f} MiB/s transfer ({vm_tr:.2f} s), {vm_total:.2f} s with export setup and cleanup")
print(f"curl          {mib/curl_s:8.1f} MiB/s ({curl_s:.2f} s)")
print(f"throughput    {curl_s/vm_tr:.2f}x curl (goal >= 0.9)")
print(f"peak RSS      {rss/1024:.1f} MB (goal < 32)")
PY
