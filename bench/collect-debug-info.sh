#!/usr/bin/env bash
# Benchmarks `kubectl vm collect-debug-info` for a VM with 20 pods and long logs against the local
# emulator:
#   wall time vs a sequential kubectl script doing the same fetches (VM, VMI, pod list, events of
#   every object, every pod's log with --tail)                      (goal: ratio <= 0.3)
#   peak RSS (GNU time) at two log sizes: it must not grow with the logs.
# Usage: bench/collect-debug-info.sh [LINES] [LINES2]   (default 10000 and 40000)
#        PROFILE=debug bench/collect-debug-info.sh       (skip the release build)
lines=${1:-10000}
lines2=${2:-40000}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_gnu_time
need_kubectl
build
export HOME="$work"

# A VM with 20 launcher-labelled pods, each with a synthetic log of N lines (emulator annotation).
fixture() {
  local n=$1
  cat <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: bench}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: bench, namespace: bench}
spec:
  runStrategy: Halted
  template:
    spec:
      domain: {devices: {}, memory: {guest: 1Gi}}
status: {printableStatus: Stopped}
YAML
  for i in $(seq -w 1 20); do
    cat <<YAML
---
apiVersion: v1
kind: Pod
metadata:
  name: bench-pod-$i
  namespace: bench
  # launchers are what the bundle takes: pods labelled kubevirt.io=virt-launcher for the VM
  labels: {kubevirt.io: virt-launcher, vm.kubevirt.io/name: bench}
  annotations: {emulator.kubevm.io/log-lines.compute: "$n"}
spec:
  nodeName: node-1
  containers: [{name: compute, image: virt-launcher}]
status: {phase: Succeeded, containerStatuses: [{name: compute, restartCount: 0, ready: false, image: virt-launcher}]}
YAML
  done
}

# start N: a fresh emulator whose fixture has N log lines per container.
start() {
  [ -n "${emulator:-}" ] && stop_emulator "$emulator"
  fixture "$1" >"$work/bench.yaml"
  start_emulator bench kubevirt tests/fixtures/kubevirt.yaml "$work/bench.yaml"
  emulator=$emulator_pid
  export KUBECONFIG="$work/bench.kubeconfig"
}

sequential_kubectl() {
  local out=$work/seq
  rm -rf "$out"; mkdir -p "$out"
  "$kubectl" get vm bench -n bench -o yaml >"$out/vm.yaml"
  "$kubectl" get vmi bench -n bench -o yaml >"$out/vmi.yaml" 2>/dev/null || true
  "$kubectl" get events -n bench --field-selector involvedObject.kind=VirtualMachine,involvedObject.name=bench -o yaml >"$out/ev-vm.yaml"
  "$kubectl" get pods -n bench -l vm.kubevirt.io/name=bench -o yaml >"$out/pods.yaml"
  for p in $("$kubectl" get pods -n bench -l vm.kubevirt.io/name=bench -o name); do
    p=${p#pod/}
    "$kubectl" get events -n bench --field-selector "involvedObject.kind=Pod,involvedObject.name=$p" -o yaml >"$out/ev-$p.yaml"
    "$kubectl" logs -n bench "$p" -c compute --tail "$2" >"$out/$p.log"
  done
  tar czf "$out.tar.gz" -C "$out" .
}


start "$lines"
"$vm" collect-debug-info bench -n bench -o "$work/warm.tgz" 2>/dev/null   # warm-up
t_vm=$(seconds "$vm" collect-debug-info bench -n bench --tail "$lines" -o "$work/a.tgz")
t_kubectl=$(seconds sequential_kubectl x "$lines")
rss1=$(rss_kib "$vm" collect-debug-info bench -n bench --tail -1 -o "$work/b.tgz")
log1=$(tar xzf "$work/b.tgz" -O --wildcards '*/log/bench-pod-01/compute.log' | wc -c)
start "$lines2"
rss2=$(rss_kib "$vm" collect-debug-info bench -n bench --tail -1 -o "$work/c.tgz")
log2=$(tar xzf "$work/c.tgz" -O --wildcards '*/log/bench-pod-01/compute.log' | wc -c)

echo "collect-debug-info, 20 pods x $lines log lines ($profile build):"
echo "  kubectl-vm:            ${t_vm}s"
echo "  sequential kubectl:    ${t_kubectl}s"
echo "  ratio:                 $(ratio "$t_vm" "$t_kubectl")  (goal <= 0.3)"
echo "peak RSS of kubectl-vm (all lines):"
echo "  20 x $lines lines (log $((log1 / 1024)) KiB each): ${rss1} KiB"
echo "  20 x $lines2 lines (log $((log2 / 1024)) KiB each): ${rss2} KiB"
