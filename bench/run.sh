#!/usr/bin/env bash
# Benchmarks kubectl-vm against kubectl in one run, on the same machine and emulator, and
# prints ratios (kubectl-vm time / kubectl time; lower is better):
#   startup: `kubectl-vm version --client` vs `kubectl version --client`   (goal <= 0.1)
#   list:    `kubectl-vm list -A` vs `kubectl get vm -A` against the local emulator
# Usage: bench/run.sh [RUNS]   (default 30). Builds release binaries first.
set -euo pipefail
runs=${1:-30}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash tests/tools/get-kubectl.sh "$root/.tools/bin" >/dev/null
kubectl="$root/.tools/bin/kubectl"
cargo build --quiet --release --locked -p kubectl-vm -p kubevm-emulator
vm="$root/target/release/kubectl-vm"

work=$(mktemp -d)
"$root/target/release/kubevm-emulator" --fixture tests/fixtures/kubevirt.yaml --flavor kubevirt \
  --kubeconfig "$work/kubeconfig" >"$work/emulator.log" 2>&1 &
emulator=$!
trap 'kill $emulator 2>/dev/null; wait $emulator 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
export KUBECONFIG="$work/kubeconfig"
# kubectl caches discovery under ~/.kube/cache; give it its own warm cache like a real user has.
export HOME="$work"

# mean wall time in microseconds of RUNS runs of a command (after one warm-up run)
mean_us() {
  "$@" >/dev/null 2>&1 || { echo "benchmark command failed: $*" >&2; exit 1; }
  local start end
  start=$(date +%s%N)
  for _ in $(seq "$runs"); do "$@" >/dev/null 2>&1; done
  end=$(date +%s%N)
  echo $(( (end - start) / runs / 1000 ))
}
ratio() { python3 -c "print(f'{$1/$2:.3f}')"; }
report() {
  local name=$1 ours=$2 theirs=$3
  printf '%-8s kubectl-vm %8.2f ms   kubectl %8.2f ms   ratio %s\n' "$name" \
    "$(python3 -c "print($ours/1000)")" "$(python3 -c "print($theirs/1000)")" "$(ratio "$ours" "$theirs")"
}

echo "runs per command: $runs"
ours=$(mean_us "$vm" version --client); theirs=$(mean_us "$kubectl" version --client)
report startup "$ours" "$theirs"
ours=$(mean_us "$vm" list -A); theirs=$(mean_us "$kubectl" get vm -A)
report list "$ours" "$theirs"
