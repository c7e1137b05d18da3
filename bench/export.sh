#!/usr/bin/env bash
# Benchmarks `kubectl vm export` against curl on the same export URL with the same token, both
# writing to disk, and measures the peak RSS of kubectl-vm exporting a 2 GiB volume.
#   throughput: kubectl-vm (raw, Range-capable, sha256 while streaming) vs `curl -o`   (goal >= 0.9x)
#   memory:     peak RSS of kubectl-vm over the whole 2 GiB run (/usr/bin/time -v)   (goal < 32 MB)
#   also: curl followed by sha256sum over its file, the same verified copy kubectl-vm makes,
#         and curl piped into `dd oflag=direct`, the same write path (kubectl-vm writes whole
#         blocks with O_DIRECT; plain `curl -o` goes through the page cache)
# Usage: [ROUNDS=3] bench/export.sh [SIZE_GIB]   (default 2). Builds release binaries first.
gib=${1:-2}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_kubectl
build
size=$((gib * 1024 * 1024 * 1024))

cat >"$work/fixture.yaml" <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: bench, namespace: default}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: "$size"}}}
status: {phase: Bound, capacity: {storage: "$size"}}
YAML
start_emulator main kubevirt "$work/fixture.yaml"
emulator=$emulator_pid
export KUBECONFIG="$work/main.kubeconfig" HOME="$work"

now() { date +%s%N; }
# Rounds alternate kubectl-vm and curl; `sync` before each transfer so neither inherits the
# other's dirty pages (the kernel throttles writers while earlier data is still being written
# back, which made single runs swing by 30%).
rounds=${ROUNDS:-3}
results=()
for round in $(seq "$rounds"); do
  sync
  start=$(now)
  /usr/bin/time -v "$vm" export pvc/bench -o "$work/vm.img" --keep 2>"$work/vm.log"
  vm_ns=$(( $(now) - start ))
  rss_kb=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$work/vm.log")
  name=$(grep -o 'VirtualMachineExport export-pvc-bench-[a-z0-9]*' "$work/vm.log" | head -1 | cut -d' ' -f2)
  url=$("$kubectl" get vmexport "$name" -o jsonpath='{.status.links.external.volumes[0].formats[?(@.format=="raw")].url}')
  "$kubectl" get vmexport "$name" -o jsonpath='{.status.links.external.cert}' >"$work/ca.pem"
  token=$("$kubectl" get secret "$name-token" -o jsonpath='{.data.token}' | base64 -d)
  rm -f "$work/vm.img" "$work/vm.img.sha256"
  sync
  start=$(now)
  curl -sSf --cacert "$work/ca.pem" -H "x-kubevirt-export-token: $token" -o "$work/curl.img" "$url"
  curl_ns=$(( $(now) - start ))
  # The same work as kubectl-vm (a verified copy): curl's file, then sha256sum over it.
  start=$(now)
  sha256sum "$work/curl.img" >/dev/null
  sum_ns=$(( $(now) - start ))
  rm -f "$work/curl.img"
  sync
  start=$(now)
  curl -sSf --cacert "$work/ca.pem" -H "x-kubevirt-export-token: $token" "$url" |
    dd of="$work/dd.img" bs=1M iflag=fullblock oflag=direct status=none
  dd_ns=$(( $(now) - start ))
  rm -f "$work/dd.img"
  "$kubectl" delete vmexport "$name" >/dev/null
  # curl's time has no export setup; take kubectl-vm's transfer time from its own report too.
  vm_transfer=$(grep -o 'in [0-9.]*s' "$work/vm.log" | head -1 | tr -dc '0-9.')
  results+=("$vm_ns $curl_ns $vm_transfer $rss_kb $sum_ns $dd_ns")
done
python3 - "$size" "${results[@]}" <<'PY'
import sys
size = int(sys.argv[1])
mib = size / 2**20
print(f"volume        {mib:.0f} MiB")
ratios, verified, direct, rss_max = [], [], [], 0
for i, r in enumerate(sys.argv[2:], 1):
    vm_ns, curl_ns, vm_tr, rss, sum_ns, dd_ns = r.split()
    vm_total, curl_s, vm_tr, rss = int(vm_ns) / 1e9, int(curl_ns) / 1e9, float(vm_tr), int(rss)
    sum_s = int(sum_ns) / 1e9
    dd_s = int(dd_ns) / 1e9
    direct.append(dd_s / vm_tr)
    ratios.append(curl_s / vm_tr)
    verified.append((curl_s + sum_s) / vm_tr)
    rss_max = max(rss_max, rss)
    print(f"round {i}: kubectl-vm {mib/vm_tr:7.1f} MiB/s ({vm_tr:.2f} s transfer, {vm_total:.2f} s with setup)"
          f"  curl {mib/curl_s:7.1f} MiB/s ({curl_s:.2f} s, +{sum_s:.2f} s sha256sum)"
          f"  curl|dd {dd_s:.2f} s  ratio {curl_s/vm_tr:.2f}x ({(curl_s + sum_s)/vm_tr:.2f}x with sha256sum,"
          f" {dd_s/vm_tr:.2f}x vs curl|dd)  RSS {rss/1024:.1f} MB")
ratios.sort()
verified.sort()
direct.sort()
print(f"throughput    {ratios[len(ratios)//2]:.2f}x curl, median of {len(ratios)} (goal >= 0.9)")
print(f"verified copy {verified[len(verified)//2]:.2f}x curl followed by sha256sum (the same work as kubectl-vm)")
print(f"same writes   {direct[len(direct)//2]:.2f}x curl piped into dd oflag=direct")
print(f"peak RSS      {rss_max/1024:.1f} MB, the largest of the rounds (goal < 32)")
PY
