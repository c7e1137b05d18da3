#!/usr/bin/env bash
# `kubectl vm list -A` against `kubectl get vm,vmi -A` in one run, on the same machine and
# emulator: mean wall time and peak RSS (GNU time's "Maximum resident set size"), as ratios
# kubectl-vm / kubectl (lower is better; goal <= 0.5 for both at 1000 VMs), at 1000 VMs with
# 1000 VMIs across 10 namespaces (bench/gen-fixture.py) and at the 5 VMs of
# tests/fixtures/kubevirt.yaml.
# Usage: bench/list-scale.sh [RUNS] [VMS]   (default 10 runs, 1000 VMs). Builds release binaries.
set -euo pipefail
runs=${1:-10}
count=${2:-1000}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ ! -x /usr/bin/time ]; then
  # GNU time measures peak RSS; the shell keyword does not.
  sudo apt-get install -y time >/dev/null 2>&1 || apt-get install -y time >/dev/null
fi
bash tests/tools/get-kubectl.sh "$root/.tools/bin" >/dev/null
kubectl="$root/.tools/bin/kubectl"
cargo build --quiet --release --locked -p kubectl-vm -p kubevm-emulator
vm="$root/target/release/kubectl-vm"

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
python3 bench/gen-fixture.py "$count" 10 >"$work/scale.yaml"

# start_emulator NAME FIXTURE: serves FIXTURE, kubeconfig in $work/NAME.kubeconfig
start_emulator() {
  "$root/target/release/kubevm-emulator" --fixture "$2" --flavor kubevirt \
    --kubeconfig "$work/$1.kubeconfig" >"$work/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 300); do [ -s "$work/$1.kubeconfig" ] && return; sleep 0.1; done
  echo "emulator $1 did not start" >&2; exit 1
}

# measure: prints "<mean wall ms> <max peak RSS KiB>" over RUNS runs (after one warm-up run);
# wall time from the clock (ns), peak RSS from GNU time.
measure() {
  "$@" >/dev/null 2>&1 || { echo "benchmark command failed: $*" >&2; exit 1; }
  local total=0 peak=0 start end rss
  for _ in $(seq "$runs"); do
    start=$(date +%s%N)
    /usr/bin/time -f '%M' -o "$work/time.out" "$@" >/dev/null 2>&1
    end=$(date +%s%N)
    total=$((total + end - start))
    rss=$(tail -1 "$work/time.out")
    [ "$rss" -gt "$peak" ] && peak=$rss
  done
  echo "$(python3 -c "print(round($total / $runs / 1e6, 1))") $peak"
}

compare() {
  local label=$1 kubeconfig=$2
  export KUBECONFIG=$kubeconfig
  # kubectl caches discovery under ~/.kube/cache; give it a warm cache like a real user has.
  export HOME="$work/home-$label"; mkdir -p "$HOME"
  read -r ours_ms ours_kb < <(measure "$vm" list -A)
  read -r theirs_ms theirs_kb < <(measure "$kubectl" get vm,vmi -A)
  printf '%-9s kubectl-vm list -A: %8.1f ms %7d KiB | kubectl get vm,vmi -A: %8.1f ms %7d KiB | wall ratio %s  RSS ratio %s\n' \
    "$label" "$ours_ms" "$ours_kb" "$theirs_ms" "$theirs_kb" \
    "$(python3 -c "print(f'{$ours_ms/$theirs_ms:.3f}')")" "$(python3 -c "print(f'{$ours_kb/$theirs_kb:.3f}')")"
}

start_emulator scale "$work/scale.yaml"
start_emulator small tests/fixtures/kubevirt.yaml
echo "runs per command: $runs"
compare "$count-VMs" "$work/scale.kubeconfig"
compare "5-VMs" "$work/small.kubeconfig"
