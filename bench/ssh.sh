#!/usr/bin/env bash
# Benchmarks `kubectl vm ssh` against stock OpenSSH through the same tunnel
# (`kubectl vm port-forward --stdio` as ProxyCommand, the ssh-config setup), on one machine
# against the emulator, whose guest runs a real sshd configured by the VM's cloud-init
# (needs root: see tests/emulator/src/core/sshd_guest.rs). Prints:
#   roundtrip: `ssh VM -- true`, mean wall time, kubectl-vm / OpenSSH      (goal <= 1.2)
#   cat:       `ssh VM -- cat /tmp/bench.bin` throughput of SIZE_MIB, kubectl-vm / OpenSSH (goal >= 0.8)
#   peak RSS of the client process(es) during the cat (kubectl-vm alone vs ssh + its ProxyCommand)
# Usage: bench/ssh.sh [RUNS] [SIZE_MIB]   (defaults 20 and 1024). Builds release binaries first.
runs=${1:-20}
size=${2:-1024}
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
build

start_emulator main kubevirt tests/fixtures/kubevirt.yaml
emulator=$emulator_pid
export KUBECONFIG="$work/main.kubeconfig" HOME="$work"
"$vm" ca init >/dev/null
"$vm" create bench --image quay.io/containerdisks/ubuntu:24.04 --wait --timeout 60s >/dev/null
"$vm" ssh-config --install >/dev/null
cfg="$HOME/.ssh/config"
"$vm" ssh bench -- "head -c ${size}M /dev/zero > /tmp/bench.bin"

py() { python3 -c "print($1)"; }

echo "runs: $runs, cat size: ${size} MiB"
ours=$(mean_us "$vm" ssh bench -- true)
theirs=$(mean_us ssh -F "$cfg" -o BatchMode=yes bench.default.vm true)
printf 'roundtrip  kubectl-vm %8.1f ms   openssh %8.1f ms   ratio %s\n' \
  "$(py "$ours/1000")" "$(py "$theirs/1000")" "$(py "round($ours/$theirs, 3)")"

# The same tunnel without the per-connection certificate hook (a certificate issued once).
"$vm" ssh-cert bench.default.vm
plain=(ssh -F /dev/null -o BatchMode=yes -o "ProxyCommand=$vm port-forward --stdio --ssh-host bench.default.vm 22"
  -o "KnownHostsCommand=$vm ssh-known-hosts" -o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile=/dev/null
  -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -i "$HOME/.kube/kubectl-vm/ssh/id_ed25519"
  -o "CertificateFile=$HOME/.kube/kubectl-vm/ssh/certs/kubevm@bench.default.vm-cert.pub" kubevm@bench.default.vm)
bare=$(mean_us "${plain[@]}" true)
printf 'roundtrip  kubectl-vm %8.1f ms   openssh, cert issued once %8.1f ms   ratio %s\n' \
  "$(py "$ours/1000")" "$(py "$bare/1000")" "$(py "round($ours/$bare, 3)")"

read -r ours_us ours_rss < <(timed_rss "$vm" ssh bench -- cat /tmp/bench.bin)
# /usr/bin/time reports the largest of ssh and its children (the ProxyCommand kubectl-vm).
read -r theirs_us theirs_rss < <(timed_rss ssh -F "$cfg" -o BatchMode=yes bench.default.vm cat /tmp/bench.bin)
ours_mbs=$(py "round($size/($ours_us/1e6), 1)")
theirs_mbs=$(py "round($size/($theirs_us/1e6), 1)")
printf 'cat        kubectl-vm %8s MiB/s  openssh %8s MiB/s  ratio %s\n' \
  "$ours_mbs" "$theirs_mbs" "$(py "round($ours_mbs/$theirs_mbs, 3)")"
printf 'peak RSS   kubectl-vm %8s KiB    openssh+proxy %8s KiB (largest process)\n' "$ours_rss" "$theirs_rss"
