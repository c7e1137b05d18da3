#!/usr/bin/env bash
# Benchmarks `kubectl vm set resources` on a running VM against `kubectl patch` of the same
# change, on the same machine and emulator (KubeVirt fixture VM web, guest memory toggled
# between 3Gi and 4Gi: both hot-plugged live), and prints ratios (lower is better):
#   no-wait: `kubectl-vm set resources web --memory X --no-wait` (one GET and one PUT of the VM,
#            with its resourceVersion) vs `kubectl patch vm web --type merge -p ...` (one PATCH)
#   verdict: `kubectl-vm set resources web --memory X` (also watches until the controller
#            observed the change and reads RestartRequired) vs the same kubectl patch
# It also prints the requests one `set resources --no-wait` sends (`-v 6`).
# Usage: bench/set.sh [RUNS]   (default 30). Builds release binaries first.
runs=${1:-30}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_kubectl
build
start_emulator main kubevirt tests/fixtures/kubevirt.yaml
use_emulator main

patch() { "$kubectl" patch vm web --type merge -p "{\"spec\":{\"template\":{\"spec\":{\"domain\":{\"memory\":{\"guest\":\"$1\"}}}}}}"; }
set_nowait() { "$vm" set resources web --memory "$1" --no-wait; }
set_wait() { "$vm" set resources web --memory "$1"; }

# mean wall time in microseconds of RUNS runs of `$1 SIZE`, SIZE alternating 3Gi/4Gi so that
# every run changes the VM (after one warm-up pair)
mean_alternating_us() {
  "$1" 3Gi >/dev/null 2>&1 && "$1" 4Gi >/dev/null 2>&1 || { echo "benchmark command failed: $1" >&2; exit 1; }
  local start end i
  start=$(date +%s%N)
  for i in $(seq "$runs"); do
    if (( i % 2 )); then "$1" 3Gi >/dev/null 2>&1; else "$1" 4Gi >/dev/null 2>&1; fi
  done
  end=$(date +%s%N)
  echo $(( (end - start) / runs / 1000 ))
}
report() {
  local name=$1 ours=$2 theirs=$3
  printf '%-8s kubectl-vm %8.2f ms   kubectl patch %8.2f ms   ratio %s\n' "$name" \
    "$(python3 -c "print($ours/1000)")" "$(python3 -c "print($theirs/1000)")" "$(ratio "$ours" "$theirs")"
}

echo "requests of one set resources --no-wait on the VM (-v 6):"
"$vm" -v 6 set resources web --memory 3Gi --no-wait 2>&1 >/dev/null | grep 'virtualmachines' | sed 's/^/  /'
echo "runs per command: $runs"
theirs=$(mean_alternating_us patch)
ours=$(mean_alternating_us set_nowait)
report no-wait "$ours" "$theirs"
ours=$(mean_alternating_us set_wait)
report verdict "$ours" "$theirs"
