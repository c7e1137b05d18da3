#!/usr/bin/env bash
# `kubectl vm image list -A` against the equivalent `kubectl get` in one run, on the same
# machine and emulator: mean wall time and peak RSS (GNU time), as ratios kubectl-vm / kubectl
# (lower is better; goal <= 0.5 wall at 500 images). KubeVirt: 500 DataSources and their
# DataVolumes (`kubectl get datasources,datavolumes -A`, the two kinds a row joins); Deckhouse:
# 500 VirtualImages (`kubectl get virtualimages,clustervirtualimages -A`); 10 namespaces
# (bench/gen-image-fixture.py).
# Usage: bench/image-list.sh [RUNS] [IMAGES]   (default 10 runs, 500 images). Builds release
# binaries; PROFILE=debug uses the debug build already in target/debug instead (slower binaries:
# a ratio measured so is an upper bound).
set -euo pipefail
runs=${1:-10}
count=${2:-500}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if [ ! -x /usr/bin/time ]; then
  sudo apt-get install -y time >/dev/null 2>&1 || apt-get install -y time >/dev/null
fi
bash tests/tools/get-kubectl.sh "$root/.tools/bin" >/dev/null
kubectl="$root/.tools/bin/kubectl"
profile=${PROFILE:-release}
if [ "$profile" = release ]; then
  cargo build --quiet --release --locked -p kubectl-vm -p kubevm-emulator
fi
vm="$root/target/$profile/kubectl-vm"

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# start_emulator FLAVOR: serves the flavor's base fixture plus COUNT images.
start_emulator() {
  python3 bench/gen-image-fixture.py "$1" "$count" 10 >"$work/$1-images.yaml"
  "$root/target/$profile/kubevm-emulator" --fixture "tests/fixtures/$1.yaml" \
    --fixture "$work/$1-images.yaml" --flavor "$1" \
    --kubeconfig "$work/$1.kubeconfig" >"$work/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 300); do [ -s "$work/$1.kubeconfig" ] && return; sleep 0.1; done
  echo "emulator $1 did not start" >&2; exit 1
}

# measure: prints "<mean wall ms> <max peak RSS KiB>" over RUNS runs (after one warm-up run).
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

# compare FLAVOR KUBECTL-RESOURCES
compare() {
  export KUBECONFIG="$work/$1.kubeconfig"
  export HOME="$work/home-$1"; mkdir -p "$HOME"
  [ "$("$vm" image list -A --no-headers | wc -l)" -ge "$count" ] || { echo "$1: fewer than $count images listed" >&2; exit 1; }
  read -r ours_ms ours_kb < <(measure "$vm" image list -A)
  read -r theirs_ms theirs_kb < <(measure "$kubectl" get "$2" -A)
  printf '%-9s kubectl-vm image list -A: %8.1f ms %7d KiB | kubectl get %s -A: %8.1f ms %7d KiB | wall ratio %s  RSS ratio %s\n' \
    "$1" "$ours_ms" "$ours_kb" "$2" "$theirs_ms" "$theirs_kb" \
    "$(python3 -c "print(f'{$ours_ms/$theirs_ms:.3f}')")" "$(python3 -c "print(f'{$ours_kb/$theirs_kb:.3f}')")"
}

start_emulator kubevirt
start_emulator deckhouse
echo "runs per command: $runs, images: $count"
compare kubevirt datasources,datavolumes
compare deckhouse virtualimages,clustervirtualimages
