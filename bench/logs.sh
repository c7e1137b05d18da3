#!/usr/bin/env bash
# Benchmarks `kubectl vm logs VM --tail N` against `kubectl logs POD -c guest-console-log --tail N`
# (the same container of the same pod, through the same pods/log subresource) on the local
# emulator: a running VM whose launcher's console log has LINES lines.
#   wall time of RUNS runs each                                    (goal: ratio <= 1.1)
#   peak RSS (GNU time) of the whole log at two sizes: it must not grow with the log (streamed).
# Usage: bench/logs.sh [TAIL] [LINES] [RUNS]   (default 10000, 200000 and 10)
#        PROFILE=debug bench/logs.sh            (skip the release build)
tail_lines=${1:-10000}
lines=${2:-200000}
runs=${3:-10}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
need_gnu_time
need_kubectl
build
export HOME="$work"

# A running VM, its VMI and launcher pod with the guest-console-log sidecar; the sidecar's log
# is N synthetic lines (emulator annotation).
fixture() {
  cat <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: bench}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: bench, namespace: bench, uid: 0b0b0b0b-0000-4000-8000-000000000001}
spec:
  runStrategy: Always
  template:
    spec:
      domain: {devices: {logSerialConsole: true}, memory: {guest: 1Gi}}
status: {printableStatus: Running, ready: true, created: true}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: bench, namespace: bench, uid: 0b0b0b0b-0000-4000-8000-000000000002}
spec:
  domain: {devices: {logSerialConsole: true}, memory: {guest: 1Gi}}
status: {phase: Running, nodeName: node-1}
---
apiVersion: v1
kind: Pod
metadata:
  name: virt-launcher-bench-abcde
  namespace: bench
  labels: {kubevirt.io: virt-launcher, vm.kubevirt.io/name: bench, kubevirt.io/created-by: 0b0b0b0b-0000-4000-8000-000000000002}
  annotations: {emulator.kubevm.io/log-lines.guest-console-log: "$1"}
spec:
  nodeName: node-1
  initContainers: [{name: guest-console-log, image: virt-launcher, restartPolicy: Always}]
  containers: [{name: compute, image: virt-launcher}]
status:
  phase: Running
  containerStatuses: [{name: compute, restartCount: 0, ready: true, image: virt-launcher}]
  initContainerStatuses: [{name: guest-console-log, restartCount: 0, ready: true, started: true, image: virt-launcher}]
YAML
}

# start N: a fresh emulator whose fixture has N log lines per container.
start() {
  [ -n "${emulator:-}" ] && stop_emulator "$emulator"
  fixture "$1" >"$work/bench.yaml"
  start_emulator bench kubevirt tests/fixtures/kubevirt.yaml "$work/bench.yaml"
  emulator=$emulator_pid
  export KUBECONFIG="$work/bench.kubeconfig"
}

repeat() { local i; for i in $(seq "$runs"); do "$@" >/dev/null; done; }

start "$lines"
# Same bytes first (the reference is kubectl).
cmp <("$vm" logs bench -n bench --tail "$tail_lines") \
    <("$kubectl" logs -n bench virt-launcher-bench-abcde -c guest-console-log --tail "$tail_lines")
repeat "$vm" logs bench -n bench --tail "$tail_lines"   # warm-up
t_vm=$(seconds repeat "$vm" logs bench -n bench --tail "$tail_lines")
t_kubectl=$(seconds repeat "$kubectl" logs -n bench virt-launcher-bench-abcde -c guest-console-log --tail "$tail_lines")
rss1=$(rss_kib "$vm" logs bench -n bench)
start "$((lines * 4))"
rss2=$(rss_kib "$vm" logs bench -n bench)

echo "logs --tail $tail_lines of a $lines-line console log, $runs runs ($profile build):"
echo "  kubectl-vm logs:  ${t_vm}s"
echo "  kubectl logs:     ${t_kubectl}s"
echo "  ratio:            $(ratio "$t_vm" "$t_kubectl")  (goal <= 1.1)"
echo "peak RSS of kubectl-vm logs (whole log):"
echo "  $lines lines:  ${rss1} KiB"
echo "  $((lines * 4)) lines: ${rss2} KiB"
