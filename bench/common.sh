# Sourced by the scripts in bench/: one way to build, to start the emulator and to time commands,
# so that every ratio is measured the same way. Stand-alone (needs cargo, python3, curl for
# kubectl); nothing here is used by the test suite.
#
# After `. "$(dirname "${BASH_SOURCE[0]}")/common.sh"`:
#   $root     the repository (also the current directory)
#   $profile  release (default) or debug (PROFILE=debug: the debug build, no release build;
#             binaries are slower, so a ratio measured so is an upper bound)
#   $work     a scratch directory, removed on exit with every process in bench_pids
# and the functions below. Scripts set `runs` before calling mean_us/measure (default 10).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
profile=${PROFILE:-release}
work=$(mktemp -d)
bench_pids=()

bench_cleanup() {
  local pid
  for pid in "${bench_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${bench_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap bench_cleanup EXIT

# need_kubectl: kubectl v1.36 (the reference) in $kubectl.
need_kubectl() {
  bash tests/tools/get-kubectl.sh "$root/.tools/bin" >/dev/null
  kubectl="$root/.tools/bin/kubectl"
}

# need_gnu_time: GNU time, for peak RSS (the shell keyword does not report it).
need_gnu_time() {
  [ -x /usr/bin/time ] && return
  sudo apt-get install -y time >/dev/null 2>&1 || apt-get install -y time >/dev/null
}

# build: kubectl-vm and the emulator of $profile; sets $vm and $emulator_bin.
build() {
  if [ "$profile" = release ]; then
    cargo build --quiet --release --locked -p kubectl-vm -p kubevm-emulator
  else
    cargo build --quiet --locked -p kubectl-vm -p kubevm-emulator
  fi
  vm="$root/target/$profile/kubectl-vm"
  emulator_bin="$root/target/$profile/kubevm-emulator"
}

# start_emulator NAME FLAVOR FIXTURE...: an emulator serving the fixtures, its kubeconfig at
# $work/NAME.kubeconfig, its log at $work/NAME.log; waits until it serves. Its pid is in
# $emulator_pid (and bench_pids).
start_emulator() {
  local name=$1 flavor=$2 fixture
  shift 2
  local args=()
  for fixture in "$@"; do args+=(--fixture "$fixture"); done
  rm -f "$work/$name.kubeconfig"
  "$emulator_bin" "${args[@]}" --flavor "$flavor" --kubeconfig "$work/$name.kubeconfig" \
    >"$work/$name.log" 2>&1 &
  emulator_pid=$!
  bench_pids+=("$emulator_pid")
  local _
  for _ in $(seq 300); do [ -s "$work/$name.kubeconfig" ] && return; sleep 0.1; done
  echo "emulator $name did not start: $(tail -3 "$work/$name.log")" >&2
  exit 1
}

# stop_emulator PID: stops one emulator started by start_emulator.
stop_emulator() {
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# use_emulator NAME: point KUBECONFIG at it, with a HOME of its own (kubectl keeps a warm
# discovery cache there, as a real user's has).
use_emulator() {
  export KUBECONFIG="$work/$1.kubeconfig" HOME="$work/home-$1"
  mkdir -p "$HOME"
}

# mean_us CMD...: mean wall time in microseconds of $runs runs, after one warm-up run.
mean_us() {
  "$@" >/dev/null 2>&1 || { echo "benchmark command failed: $*" >&2; exit 1; }
  local start end _
  start=$(date +%s%N)
  for _ in $(seq "${runs:-10}"); do "$@" >/dev/null 2>&1; done
  end=$(date +%s%N)
  echo $(((end - start) / ${runs:-10} / 1000))
}

# measure CMD...: "<mean wall ms> <max peak RSS KiB>" over $runs runs, after one warm-up run.
measure() {
  "$@" >/dev/null 2>&1 || { echo "benchmark command failed: $*" >&2; exit 1; }
  local total=0 peak=0 start end rss _
  for _ in $(seq "${runs:-10}"); do
    start=$(date +%s%N)
    /usr/bin/time -f '%M' -o "$work/time.out" "$@" >/dev/null 2>&1
    end=$(date +%s%N)
    total=$((total + end - start))
    rss=$(tail -1 "$work/time.out")
    [ "$rss" -gt "$peak" ] && peak=$rss
  done
  echo "$(python3 -c "print(round($total / ${runs:-10} / 1e6, 1))") $peak"
}

# timed_rss CMD...: "<wall us> <peak RSS KiB>" of one run.
timed_rss() {
  local start end
  start=$(date +%s%N)
  /usr/bin/time -f '%M' -o "$work/time.out" "$@" >/dev/null 2>&1
  end=$(date +%s%N)
  echo "$(((end - start) / 1000)) $(tail -1 "$work/time.out")"
}

# seconds CMD...: wall seconds (3 decimals) of one run.
seconds() {
  local start end
  start=$(date +%s%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s%N)
  python3 -c "print(f'{($end - $start) / 1e9:.3f}')"
}

# rss_kib CMD...: peak RSS in KiB of one run.
rss_kib() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; }

# ratio A B: A / B to 3 decimals.
ratio() { python3 -c "print(f'{$1 / $2:.3f}')"; }
