#!/usr/bin/env bash
# Every check, as CI runs it: test tools, formatting, lints, all tests (unit, emulator,
# end-to-end through real kubectl), and the check that committed man pages and completion
# scripts are current.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

bash tests/tools/install-test-deps.sh
export KUBECTL="$root/.tools/bin/kubectl"

# The real guest image (tests/guest/README.md) downloads and builds while the workspace compiles.
export KUBEVM_GUEST_DIR="${KUBEVM_GUEST_DIR:-$root/.cache/guest}"
mkdir -p "$KUBEVM_GUEST_DIR"
image_log="$KUBEVM_GUEST_DIR/build.log"
bash tests/guest/build-image.sh >"$image_log" 2>&1 &
image_build=$!
trap 'kill $image_build 2>/dev/null || true' EXIT

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked --no-fail-fast
echo "== real guests (qemu): the tests marked #[ignore] because they need the guest image"
if ! wait $image_build; then
  echo "building the guest image failed:" >&2
  tail -40 "$image_log" >&2
  exit 1
fi
trap - EXIT
tail -1 "$image_log"
# --nocapture: the scenario prints its timings (boot to ssh, reboot to ssh) into the CI log.
# --tests: the ignored tests are all in test targets; without it the doc tests would be built
# and run a second time.
cargo test --workspace --locked --no-fail-fast --tests -- --ignored --nocapture
