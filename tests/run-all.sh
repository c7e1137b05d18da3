#!/usr/bin/env bash
# Every check, as CI runs it: test tools, formatting, lints, all tests (unit, emulator,
# end-to-end through real kubectl), and the check that committed man pages and completion
# scripts are current.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

bash tests/tools/install-test-deps.sh
export KUBECTL="$root/.tools/bin/kubectl"

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
