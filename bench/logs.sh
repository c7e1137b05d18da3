#!/usr/bin/env bash
# Benchmarks `kubectl vm logs VM --tail N` against `kubectl logs POD -c guest-console-log --tail N`
# (the same container of the same pod, through the same pods/log subresource) on the local
# emulator: a running VM whose launcher's console log has LINES lines.
#   wall time of RUNS runs each                                    (goal: ratio <= 1.1)
#   peak RSS (GNU time) of the whole log at two sizes: it must not grow with the log (streamed).
# Usage: bench/logs.sh [TAIL] [LINES] [RUNS]   (default 10000, 200000 and 10)
#        PROFILE=debug bench/logs.sh            (skip the release build)
set -euo pipefail
tail_lines=${1:-10000}
lines=${2:-200000}
runs=${3:-10}
profile=${PROFILE:-release}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash tests/tools/get-kubectl.sh "$root/.tools/bin" >/dev/null
kubectl="$root/.tools/bin/kubectl"
if [ "$profile" = release ]; then
  cargo build --quiet --release --locked -p kubectl-vm -p kubevm-emulator
else
  cargo build --quiet --locked -p kubectl-vm -p kubevm-emulator
fi
vm="$root/target/$profile/kubectl-vm"

work=$(mktemp -d)
trap 'kill ${emulator:-} 2>/dev/null; wait ${emulator:-} 2>/dev/null; rm -rf "$work"' EXIT
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

start_emulator() {
  fixture "$1" >"$work/bench.yaml"
  rm -f "$work/kubeconfig"
  "$root/target/$profile/kubevm-emulator" --fixture tests/fixtures/kubevirt.yaml --fixture "$work/bench.yaml" \
    --flavor kubevirt --kubeconfig "$work/kubeconfig" >"$work/emulator.log" 2>&1 &
  emulator=$!
  for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
  export KUBECONFIG="$work/kubeconfig"
}

stop_emulator() { kill "$emulator"; wait "$emulator" 2>/dev/null || true; }

repeat() { local i; for i in $(seq "$runs"); do "$@" >/dev/null; done; }
seconds() { local s e; s=$(date +%s%N); "$@" >/dev/null 2>&1; e=$(date +%s%N); echo "scale=3; ($e - $s) / 1000000000" | bc; }
rss_kib() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; }

start_emulator "$lines"
# Same bytes first (the reference is kubectl).
cmp <("$vm" logs bench -n bench --tail "$tail_lines") \
    <("$kubectl" logs -n bench virt-launcher-bench-abcde -c guest-console-log --tail "$tail_lines")
repeat "$vm" logs bench -n bench --tail "$tail_lines"   # warm-up
t_vm=$(seconds repeat "$vm" logs bench -n bench --tail "$tail_lines")
t_kubectl=$(seconds repeat "$kubectl" logs -n bench virt-launcher-bench-abcde -c guest-console-log --tail "$tail_lines")
rss1=$(rss_kib "$vm" logs bench -n bench)
stop_emulator
start_emulator "$((lines * 4))"
rss2=$(rss_kib "$vm" logs bench -n bench)
stop_emulator

echo "logs --tail $tail_lines of a $lines-line console log, $runs runs ($profile build):"
echo "  kubectl-vm logs:  ${t_vm}s"
echo "  kubectl logs:     ${t_kubectl}s"
echo "  ratio:            $(echo "scale=3; $t_vm / $t_kubectl" | bc)  (goal <= 1.1)"
echo "peak RSS of kubectl-vm logs (whole log):"
echo "  $lines lines:  ${rss1} KiB"
echo "  $((lines * 4)) lines: ${rss2} KiB"
