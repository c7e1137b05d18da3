#!/usr/bin/env bash
# Benchmarks kubectl-vm against kubectl in one run, on the same machine and emulator, and
# prints ratios (kubectl-vm time / kubectl time; lower is better):
#   startup: `kubectl-vm version --client` vs `kubectl version --client`   (goal <= 0.1)
#   list:    `kubectl-vm list -A` vs `kubectl get vm -A` against the local emulator
# Usage: bench/run.sh [RUNS]   (default 30). Builds release binaries first.
runs=${1:-30}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_kubectl
build
start_emulator main kubevirt tests/fixtures/kubevirt.yaml
use_emulator main

report() {
  printf '%-8s kubectl-vm %8.2f ms   kubectl %8.2f ms   ratio %s\n' "$1" \
    "$(python3 -c "print($2/1000)")" "$(python3 -c "print($3/1000)")" "$(ratio "$2" "$3")"
}

echo "runs per command: $runs"
ours=$(mean_us "$vm" version --client); theirs=$(mean_us "$kubectl" version --client)
report startup "$ours" "$theirs"
ours=$(mean_us "$vm" list -A); theirs=$(mean_us "$kubectl" get vm -A)
report list "$ours" "$theirs"
