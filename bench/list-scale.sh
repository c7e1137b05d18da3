#!/usr/bin/env bash
# `kubectl vm list -A` against `kubectl get vm,vmi -A` in one run, on the same machine and
# emulator: mean wall time and peak RSS (GNU time's "Maximum resident set size"), as ratios
# kubectl-vm / kubectl (lower is better; goal <= 0.5 for both at 1000 VMs), at 1000 VMs with
# 1000 VMIs across 10 namespaces (bench/gen-fixture.py) and at the 5 VMs of
# tests/fixtures/kubevirt.yaml.
# Usage: bench/list-scale.sh [RUNS] [VMS]   (default 10 runs, 1000 VMs). Builds release binaries.
runs=${1:-10}
count=${2:-1000}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_gnu_time
need_kubectl
build
python3 bench/gen-fixture.py "$count" 10 >"$work/scale.yaml"

compare() {
  use_emulator "$1"
  read -r ours_ms ours_kb < <(measure "$vm" list -A)
  read -r theirs_ms theirs_kb < <(measure "$kubectl" get vm,vmi -A)
  printf '%-9s kubectl-vm list -A: %8.1f ms %7d KiB | kubectl get vm,vmi -A: %8.1f ms %7d KiB | wall ratio %s  RSS ratio %s\n' \
    "$2" "$ours_ms" "$ours_kb" "$theirs_ms" "$theirs_kb" \
    "$(ratio "$ours_ms" "$theirs_ms")" "$(ratio "$ours_kb" "$theirs_kb")"
}

start_emulator scale kubevirt "$work/scale.yaml"
start_emulator small kubevirt tests/fixtures/kubevirt.yaml
echo "runs per command: $runs"
compare scale "$count-VMs"
compare small "5-VMs"
