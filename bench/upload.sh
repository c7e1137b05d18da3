#!/usr/bin/env bash
# Benchmarks `kubectl vm upload` against curl sending the same file to the same upload proxy
# with the same kind of token (an UploadTokenRequest for a DataVolume waiting for an upload),
# and measures the peak RSS of kubectl-vm uploading the whole file.
#   throughput: kubectl-vm (streamed, sha256 while sending) vs `curl -T`   (goal >= 0.9x)
#   memory:     peak RSS of kubectl-vm over the whole run (/usr/bin/time -v)   (goal <= 32 MB)
# The file is raw random data (`--format raw`), so the emulator's processing after the
# transfer is a rename and the timings are the transfers'. kubectl-vm's time is the one it
# reports for the transfer ("uploaded N in Xs"); curl's is its wall time.
# FLAVOR=deckhouse does the same for a VirtualDisk: kubectl-vm (`vd/NAME`, checksum pre-pass,
# then the transfer) vs `curl -T` to the external upload URL of a VirtualDisk waiting for an
# upload with the same checksum; both skip verifying the emulator's ingress certificate (`--insecure`, `curl -k`),
# whose CA the emulator binary does not publish. The pre-pass is timed and shown apart.
# Usage: [ROUNDS=1] [FLAVOR=kubevirt|deckhouse] bench/upload.sh [SIZE_GIB]   (default 2).
# Builds release binaries first.
# Measured 2026-12-02 (2 shared cores, release build, 2 GiB, 1 round): kubectl-vm 401.6 MiB/s
# vs curl -T 604.7 MiB/s = 0.66x; sha256 ran on the task that encrypts and sends.
# Measured 2026-12-03 after moving reading + sha256 to a thread of their own (2 cores shared
# with other builds, so noisy; release, 2 GiB, ROUNDS=2): round 1 kubectl-vm 246.7 MiB/s vs
# curl -T 200.9 MiB/s = 1.23x, round 2 262.6 vs 284.3 MiB/s = 0.92x (goal 0.9x met in both);
# peak RSS 20.0 MB (goal 32 MB met; 4 MiB of chunks in flight between reader and sender).
gib=${1:-2}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_kubectl
build
size=$((gib * 1024 * 1024 * 1024))
flavor=${FLAVOR:-kubevirt}
case $flavor in kubevirt | deckhouse) ;; *) echo "FLAVOR is kubevirt or deckhouse" >&2; exit 2 ;; esac

echo "apiVersion: v1
kind: ConfigMap
metadata: {name: bench, namespace: default}" >"$work/fixture.yaml"
start_emulator main "$flavor" "$work/fixture.yaml"
emulator=$emulator_pid
export KUBECONFIG="$work/main.kubeconfig" HOME="$work"
head -c "$size" /dev/urandom >"$work/disk.raw"
# The uploader checks the checksum before it answers: curl's disk carries the same one, so
# both runs make the server do the same work.
[ "$flavor" = deckhouse ] && file_sha256=$(sha256sum "$work/disk.raw" | cut -c1-64)
if [ "$flavor" = kubevirt ]; then
proxy=https://$("$kubectl" get cdiconfig config -o jsonpath='{.status.uploadProxyURL}')
"$kubectl" get configmap -n cdi cdi-uploadproxy-signer-bundle -o jsonpath='{.data.ca-bundle\.crt}' >"$work/ca.pem"
fi

now() { date +%s%N; }
rounds=${ROUNDS:-1}
results=()
hash_secs=()
for round in $(seq "$rounds"); do
  sync
  if [ "$flavor" = deckhouse ]; then
    start=$(now)
    /usr/bin/time -v "$vm" upload "$work/disk.raw" "vd/vm-$round" --format raw --insecure 2>"$work/vm.log"
    total_ns=$(( $(now) - start ))
  else
    /usr/bin/time -v "$vm" upload "$work/disk.raw" "dv/vm-$round" --format raw 2>"$work/vm.log"
  fi
  rss_kb=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$work/vm.log")
  vm_transfer=$(grep -o '^uploaded .* in [0-9.]*s' "$work/vm.log" | grep -o 'in [0-9.]*s$' | tr -dc '0-9.')
  if [ "$flavor" = deckhouse ]; then
    "$kubectl" delete vd "vm-$round" >/dev/null
    hash_secs+=("$(python3 -c "print(f'{$total_ns/1e9:.2f} s in all, transfer $vm_transfer s')")")
    "$kubectl" create -f - >/dev/null <<YAML
apiVersion: virtualization.deckhouse.io/v1alpha2
kind: VirtualDisk
metadata: {name: curl-$round, namespace: default}
spec: {dataSource: {type: Upload, upload: {checksum: {sha256: "$file_sha256"}}}}
YAML
    for _ in $(seq 200); do
      [ "$("$kubectl" get vd "curl-$round" -o jsonpath='{.status.phase}')" = WaitForUserUpload ] && break
      sleep 0.1
    done
    url=$("$kubectl" get vd "curl-$round" -o jsonpath='{.status.imageUploadURLs.external}')
    sync
    start=$(now)
    curl -sSfk -T "$work/disk.raw" "$url" >/dev/null
    curl_ns=$(( $(now) - start ))
    "$kubectl" delete vd "curl-$round" >/dev/null
    results+=("$curl_ns $vm_transfer $rss_kb")
    continue
  fi
  "$kubectl" delete dv "vm-$round" >/dev/null
  "$kubectl" create -f - >/dev/null <<YAML
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: curl-$round, namespace: default, annotations: {cdi.kubevirt.io/storage.bind.immediate.requested: "true"}}
spec: {source: {upload: {}}, storage: {resources: {requests: {storage: "$size"}}}}
YAML
  for _ in $(seq 200); do
    [ "$("$kubectl" get dv "curl-$round" -o jsonpath='{.status.phase}')" = UploadReady ] && break
    sleep 0.1
  done
  token=$("$kubectl" create -o jsonpath='{.status.token}' -f - <<YAML
apiVersion: upload.cdi.kubevirt.io/v1beta1
kind: UploadTokenRequest
metadata: {name: curl-$round, namespace: default}
spec: {pvcName: curl-$round}
YAML
)
  sync
  start=$(now)
  curl -sSf --cacert "$work/ca.pem" -H "Authorization: Bearer $token" -T "$work/disk.raw" \
    -X POST "$proxy/v1beta1/upload" >/dev/null
  curl_ns=$(( $(now) - start ))
  "$kubectl" delete dv "curl-$round" >/dev/null
  results+=("$curl_ns $vm_transfer $rss_kb")
done
for h in "${hash_secs[@]}"; do echo "kubectl-vm with its checksum pre-pass: $h"; done
python3 - "$size" "${results[@]}" <<'PY'
import sys
size = int(sys.argv[1])
mib = size / 2**20
ratios, rss_max = [], 0
for i, r in enumerate(sys.argv[2:], 1):
    curl_ns, vm_tr, rss = r.split()
    curl_s, vm_tr, rss = int(curl_ns) / 1e9, float(vm_tr), int(rss)
    ratios.append(curl_s / vm_tr)
    rss_max = max(rss_max, rss)
    print(f"round {i}: kubectl-vm {mib/vm_tr:7.1f} MiB/s ({vm_tr:.2f} s)  curl -T {mib/curl_s:7.1f} MiB/s"
          f" ({curl_s:.2f} s)  ratio {curl_s/vm_tr:.2f}x  RSS {rss/1024:.1f} MB")
ratios.sort()
print(f"file          {mib:.0f} MiB")
print(f"throughput    {ratios[len(ratios)//2]:.2f}x curl -T, median of {len(ratios)} (goal >= 0.9)")
print(f"peak RSS      {rss_max/1024:.1f} MB (goal <= 32)")
PY
