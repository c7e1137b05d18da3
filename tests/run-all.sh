#!/usr/bin/env bash
# Every check, as CI runs it: test tools, formatting, lints, all tests (unit, emulator,
# end-to-end through real kubectl), and the check that committed man pages and completion
# scripts are current. Ends with a table of how long each phase took (also when one fails).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

phases=()
phase_name=""
phase_start=0
# `phase NAME`: the phase that starts now (the previous one ends here).
phase() {
  phase_end
  phase_name=$1
  phase_start=$SECONDS
  echo "== $1"
}
phase_end() {
  [ -n "$phase_name" ] && phases+=("$(printf '%6ss  %s' "$((SECONDS - phase_start))" "$phase_name")")
  phase_name=""
}
report() {
  local status=$?
  phase_end
  [ -n "${image_build:-}" ] && kill "$image_build" 2>/dev/null
  [ -n "${guests:-}" ] && kill "$guests" 2>/dev/null
  echo
  echo "== phase durations (exit $status)"
  printf '%s\n' "${phases[@]}"
  printf '%6ss  total\n' "$SECONDS"
  return $status
}
trap report EXIT

phase "test tools (tests/tools/install-test-deps.sh)"
bash tests/tools/install-test-deps.sh
export KUBECTL="$root/.tools/bin/kubectl"

# The real guest image (tests/guest/README.md) downloads and builds while the workspace compiles.
export KUBEVM_GUEST_DIR="${KUBEVM_GUEST_DIR:-$root/.cache/guest}"
mkdir -p "$KUBEVM_GUEST_DIR"
image_log="$KUBEVM_GUEST_DIR/build.log"
bash tests/guest/build-image.sh >"$image_log" 2>&1 &
image_build=$!

phase "cargo fmt --check"
cargo fmt --all -- --check
phase "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
phase "cargo test (build)"
cargo test --workspace --locked --no-run

# The real-guest tests (qemu under TCG, marked #[ignore] because they need the guest image) are
# the longest phase and leave CPU idle between boots: they run in the background from here, while
# the other tests and the demo run in the foreground. Their output is printed when they end.
if ! wait $image_build; then
  image_build=""
  echo "building the guest image failed:" >&2
  tail -40 "$image_log" >&2
  exit 1
fi
image_build=""
tail -1 "$image_log"
guests_log=$(mktemp)
guests_start=$SECONDS
# --nocapture: the scenarios print their timings (boot to ssh, reboot to ssh) into the CI log.
# --tests: the ignored tests are all in test targets; without it the doc tests would be built
# and run a second time.
cargo test --workspace --locked --no-fail-fast --tests -- --ignored --nocapture >"$guests_log" 2>&1 &
guests=$!

status=0
phase "cargo test"
cargo test --workspace --locked --no-fail-fast || status=1
phase "./install.sh --demo (the test build's binaries)"
demo_prefix=$(mktemp -d)
./install.sh --demo --no-build target/debug --prefix "$demo_prefix" || status=1
rm -rf "$demo_prefix"
phase "real guests (qemu), waiting for the background run"
guests_status=0
wait $guests || guests_status=$?
guests=""
cat "$guests_log"
rm -f "$guests_log"
phases+=("$(printf '%6ss  %s' "$((SECONDS - guests_start))" "(real guests, in the background from the end of the build)")")
[ "$guests_status" -eq 0 ] || status=1
exit $status
