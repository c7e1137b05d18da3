#!/usr/bin/env bash
# Benchmarks `kubectl vm memory-dump download` against curl fetching the same dump file from the
# same VirtualMachineExport (its `dir` link, the same token), both writing to disk.
#   throughput: kubectl-vm (raw, Range-capable, sha256 while streaming) vs `curl -o`
#               (issue 36: "memory dump download at export's throughput"; export's goal >= 0.9x)
#   also: curl followed by sha256sum over its file, the same verified copy kubectl-vm makes; the
#         two digests must agree or the run fails.
# The emulator's dump of the fixture VM `web` (2 GiB of RAM) carries SIZE_MIB of it
# (KUBEVM_EMULATOR_DUMP_RAM_CAP).
# Usage: [ROUNDS=3] [PROFILE=debug] bench/memory-dump.sh [SIZE_MIB]   (default 1024, at most 2048)
mib=${1:-1024}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_kubectl
build
export KUBEVM_EMULATOR_DUMP_RAM_CAP=$((mib * 1024 * 1024))
start_emulator main kubevirt "$root/tests/fixtures/kubevirt.yaml"
use_emulator main

"$vm" memory-dump get web --claim-name bench-dump --create-claim >/dev/null 2>"$work/get.log" ||
  { cat "$work/get.log" >&2; exit 1; }
file=$("$kubectl" get vm web -o jsonpath='{.status.memoryDumpRequest.fileName}')

now() { date +%s%N; }
# Rounds alternate kubectl-vm and curl; `sync` before each transfer so neither inherits the
# other's dirty pages.
rounds=${ROUNDS:-3}
results=()
for round in $(seq "$rounds"); do
  sync
  start=$(now)
  "$vm" memory-dump download web -o "$work/vm.core" --keep >/dev/null 2>"$work/vm.log" ||
    { cat "$work/vm.log" >&2; exit 1; }
  vm_ns=$(( $(now) - start ))
  size=$(stat -c %s "$work/vm.core")
  vm_sum=$(cut -d' ' -f1 "$work/vm.core.sha256")
  name=$("$kubectl" get vmexport -o jsonpath='{.items[0].metadata.name}')
  dir=$("$kubectl" get vmexport "$name" -o jsonpath='{.status.links.external.volumes[0].formats[?(@.format=="dir")].url}')
  "$kubectl" get vmexport "$name" -o jsonpath='{.status.links.external.cert}' >"$work/ca.pem"
  secret=$("$kubectl" get vmexport "$name" -o jsonpath='{.spec.tokenSecretRef}')
  token=$("$kubectl" get secret "$secret" -o jsonpath='{.data.token}' | base64 -d)
  rm -f "$work/vm.core" "$work/vm.core.sha256"
  sync
  start=$(now)
  curl -sSf --cacert "$work/ca.pem" -H "x-kubevirt-export-token: $token" -o "$work/curl.core" "$dir$file"
  curl_ns=$(( $(now) - start ))
  start=$(now)
  curl_sum=$(sha256sum "$work/curl.core" | cut -d' ' -f1)
  sum_ns=$(( $(now) - start ))
  if [ "$curl_sum" != "$vm_sum" ]; then
    echo "round $round: kubectl-vm's sha256 $vm_sum differs from curl's $curl_sum" >&2
    exit 1
  fi
  rm -f "$work/curl.core"
  "$kubectl" delete vmexport "$name" >/dev/null
  # curl's time has no export setup; take kubectl-vm's transfer time from its own report too.
  vm_transfer=$(grep -o ' in [0-9.]*s (' "$work/vm.log" | head -1 | tr -dc '0-9.')
  results+=("$size $vm_ns $curl_ns $vm_transfer $sum_ns")
done
python3 - "$profile" "${results[@]}" <<'PY'
import sys
profile = sys.argv[1]
ratios, verified = [], []
for i, r in enumerate(sys.argv[2:], 1):
    size, vm_ns, curl_ns, vm_tr, sum_ns = r.split()
    mib = int(size) / 2**20
    vm_total, curl_s, vm_tr, sum_s = int(vm_ns) / 1e9, int(curl_ns) / 1e9, float(vm_tr), int(sum_ns) / 1e9
    # Reported to 0.1 s: a tiny dump's transfer may show as 0.0 s; then the whole run counts.
    vm_tr = vm_tr if vm_tr > 0 else vm_total
    ratios.append(curl_s / vm_tr)
    verified.append((curl_s + sum_s) / vm_tr)
    print(f"round {i}: dump {mib:.1f} MiB  kubectl-vm {mib/vm_tr:7.1f} MiB/s ({vm_tr:.2f} s transfer,"
          f" {vm_total:.2f} s with setup)  curl {mib/curl_s:7.1f} MiB/s ({curl_s:.2f} s, +{sum_s:.2f} s sha256sum)"
          f"  ratio {curl_s/vm_tr:.2f}x ({(curl_s + sum_s)/vm_tr:.2f}x with sha256sum)")
ratios.sort()
verified.sort()
print(f"throughput    {ratios[len(ratios)//2]:.2f}x curl, median of {len(ratios)} ({profile} build; goal >= 0.9 as export)")
print(f"verified copy {verified[len(verified)//2]:.2f}x curl followed by sha256sum (the same work as kubectl-vm)")
PY
