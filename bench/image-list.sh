#!/usr/bin/env bash
# `kubectl vm image list -A` against the equivalent `kubectl get` in one run, on the same
# machine and emulator: mean wall time and peak RSS (GNU time), as ratios kubectl-vm / kubectl
# (lower is better; goal <= 0.5 wall at 500 images). KubeVirt: 500 DataSources and their
# DataVolumes (`kubectl get datasources,datavolumes -A`, the two kinds a row joins); Deckhouse:
# 500 VirtualImages (`kubectl get virtualimages,clustervirtualimages -A`); 10 namespaces
# (bench/gen-image-fixture.py).
# Usage: bench/image-list.sh [RUNS] [IMAGES]   (default 10 runs, 500 images). Builds release
# binaries; PROFILE=debug uses the debug build (slower binaries: the ratio is an upper bound).
runs=${1:-10}
count=${2:-500}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_gnu_time
need_kubectl
build

# start FLAVOR: serves the flavor's base fixture plus COUNT images.
start() {
  python3 bench/gen-image-fixture.py "$1" "$count" 10 >"$work/$1-images.yaml"
  start_emulator "$1" "$1" "tests/fixtures/$1.yaml" "$work/$1-images.yaml"
}

# compare FLAVOR KUBECTL-RESOURCES
compare() {
  use_emulator "$1"
  [ "$("$vm" image list -A --no-headers | wc -l)" -ge "$count" ] || { echo "$1: fewer than $count images listed" >&2; exit 1; }
  read -r ours_ms ours_kb < <(measure "$vm" image list -A)
  read -r theirs_ms theirs_kb < <(measure "$kubectl" get "$2" -A)
  printf '%-9s kubectl-vm image list -A: %8.1f ms %7d KiB | kubectl get %s -A: %8.1f ms %7d KiB | wall ratio %s  RSS ratio %s\n' \
    "$1" "$ours_ms" "$ours_kb" "$2" "$theirs_ms" "$theirs_kb" \
    "$(ratio "$ours_ms" "$theirs_ms")" "$(ratio "$ours_kb" "$theirs_kb")"
}

start kubevirt
start deckhouse
echo "runs per command: $runs, images: $count"
compare kubevirt datasources,datavolumes
compare deckhouse virtualimages,clustervirtualimages
