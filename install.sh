#!/usr/bin/env bash
# Builds and installs kubectl-vm from this checkout (cargo build --locked, release profile):
#   PREFIX/bin/kubectl-vm                  the plugin (`kubectl vm ...`)
#   PREFIX/bin/kubectl_complete-vm         link to it: kubectl's plugin completion (kubectl >= 1.26)
#   PREFIX/share/man/man1/kubectl-vm*.1    man pages
#   PREFIX/share/{bash-completion,zsh,fish} completion scripts for the kubectl-vm binary
# Idempotent: running it again replaces what it installed.
#
#   ./install.sh [--prefix DIR] [--with-emulator] [--demo] [--no-build DIR]
#
# --with-emulator also installs kubevm-emulator, the local KubeVirt/Deckhouse API emulator.
# --demo installs the emulator too, then starts it with sample VMs and shows kubectl-vm
#        working against it (no cluster needed), and stops it again.
# --no-build DIR installs the binaries already built in DIR (e.g. target/debug) instead of
#        building release ones (CI runs the demo this way after its test build).
set -euo pipefail

prefix="$HOME/.local"
with_emulator=false
demo=false
built=""
usage() { echo "install.sh: $1" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || usage "--prefix needs a directory"; prefix=$2; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    --with-emulator) with_emulator=true; shift ;;
    --demo) demo=true; with_emulator=true; shift ;;
    --no-build) [ $# -ge 2 ] || usage "--no-build needs the directory of built binaries"; built=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) usage "unknown option $1 (see --help)" ;;
  esac
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ -n "$built" ]; then
  dir=$(cd "$built" 2>/dev/null && pwd) || usage "--no-build: no directory $built"
  built=$dir
  for b in kubectl-vm $($with_emulator && echo kubevm-emulator); do
    [ -x "$built/$b" ] || usage "--no-build: $built has no $b (build it first)"
  done
fi
cd "$root"
[ -n "$built" ] || command -v cargo >/dev/null || { echo "install.sh: cargo not found; install the Rust toolchain (rustup) first" >&2; exit 1; }
mkdir -p "$prefix"
prefix=$(cd "$prefix" && pwd)
bin="$prefix/bin"

if [ -z "$built" ]; then
  packages=(-p kubectl-vm)
  $with_emulator && packages+=(-p kubevm-emulator)
  echo "building ${packages[*]//-p /} (release, --locked; a few minutes the first time)..."
  # One build for both binaries, so shared dependencies compile once.
  cargo build --quiet --release --locked "${packages[@]}"
  built=target/release
fi
install -d "$bin"
install -m 0755 "$built/kubectl-vm" "$bin/kubectl-vm"
ln -sfn kubectl-vm "$bin/kubectl_complete-vm"
$with_emulator && install -m 0755 "$built/kubevm-emulator" "$bin/kubevm-emulator"

install -d "$prefix/share/man/man1" "$prefix/share/bash-completion/completions" \
  "$prefix/share/zsh/site-functions" "$prefix/share/fish/vendor_completions.d"
install -m 0644 man/*.1 "$prefix/share/man/man1/"
install -m 0644 completions/kubectl-vm.bash "$prefix/share/bash-completion/completions/kubectl-vm"
install -m 0644 completions/_kubectl-vm "$prefix/share/zsh/site-functions/_kubectl-vm"
install -m 0644 completions/kubectl-vm.fish "$prefix/share/fish/vendor_completions.d/kubectl-vm.fish"

cat <<MSG
installed:
  $bin/kubectl-vm
  $bin/kubectl_complete-vm -> kubectl-vm
$($with_emulator && echo "  $bin/kubevm-emulator")
  $prefix/share/man/man1/kubectl-vm*.1
  completion scripts under $prefix/share/{bash-completion,zsh,fish}
completion:
  kubectl vm <TAB>   works when $bin is on PATH and kubectl's own completion is enabled
  kubectl-vm <TAB>   bash: source <(kubectl-vm completion bash); zsh/fish: see 'kubectl-vm completion --help'
MSG
case ":$PATH:" in *":$bin:"*) ;; *) echo "note: add $bin to PATH (export PATH=\"$bin:\$PATH\")" ;; esac

if $demo; then
  work=$(mktemp -d)
  "$bin/kubevm-emulator" --fixture tests/fixtures/kubevirt.yaml --flavor kubevirt \
    --kubeconfig "$work/kubeconfig" >"$work/emulator.log" 2>&1 &
  emulator=$!
  signer=""
  trap 'kill $emulator $signer 2>/dev/null; wait $emulator $signer 2>/dev/null; rm -rf "$work"' EXIT
  for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
  [ -s "$work/kubeconfig" ] || { cat "$work/emulator.log" >&2; exit 1; }
  export KUBECONFIG="$work/kubeconfig" PATH="$bin:$PATH"
  run() { echo; echo "\$ $*"; "$@"; }
  # kubectl >= 1.26 (plugin discovery, `kubectl create token`); Debian's is too old.
  kubectl=""
  for k in "$root/.tools/bin/kubectl" "$(command -v kubectl || true)"; do
    if [ -n "$k" ] && [ -x "$k" ] && "$k" version --client 2>/dev/null | grep -Eq 'v1\.(2[6-9]|[3-9][0-9])'; then
      kubectl=$k; break
    fi
  done
  if [ -z "$kubectl" ] && bash tests/tools/get-kubectl.sh "$root/.tools/bin" >/dev/null 2>&1; then
    kubectl="$root/.tools/bin/kubectl"
  fi
  echo; echo "== demo against the local emulator (KubeVirt flavour, sample VMs) =="
  run kubectl-vm version
  run kubectl-vm list -A -o wide
  run kubectl-vm get web

  echo; echo "== certificate-signed SSH: the platform signs; the CA key never leaves the signer =="
  run kubectl-vm ca init --signer --image registry.example/kubectl-vm:0.1.0
  if [ -n "$kubectl" ]; then
    # In a cluster the Deployment runs the signer; here it runs beside the emulator, as the
    # signer's ServiceAccount, with the serving certificate `ca init --signer` made.
    # (kubectl's discovery complains about the APIService until the signer runs: kept in a log.)
    "$kubectl" create token kubevm-ssh-signer -n kubevm-system >"$work/token" 2>>"$work/kubectl.log"
    "$kubectl" get secret kubevm-ssh-signer-tls -n kubevm-system -o jsonpath='{.data.tls\.crt}' 2>>"$work/kubectl.log" | base64 -d >"$work/tls.crt"
    "$kubectl" get secret kubevm-ssh-signer-tls -n kubevm-system -o jsonpath='{.data.tls\.key}' 2>>"$work/kubectl.log" | base64 -d >"$work/tls.key"
    ( umask 077
      "$kubectl" config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$work/ca.crt"
      server=$("$kubectl" config view --minify -o jsonpath='{.clusters[0].cluster.server}')
      export KUBECONFIG="$work/signer.kubeconfig"
      "$kubectl" config set-cluster emulator --server "$server" --certificate-authority "$work/ca.crt" --embed-certs >/dev/null
      "$kubectl" config set-credentials signer --token "$(cat "$work/token")" >/dev/null
      "$kubectl" config set-context signer --cluster emulator --user signer >/dev/null
      "$kubectl" config use-context signer >/dev/null )
    kubectl-vm --kubeconfig "$work/signer.kubeconfig" signer serve --listen 127.0.0.1:0 \
      --tls-cert-file "$work/tls.crt" --tls-private-key-file "$work/tls.key" >"$work/signer.log" 2>&1 &
    signer=$!
    for _ in $(seq 100); do grep -q '"listening"' "$work/signer.log" 2>/dev/null && break; sleep 0.1; done
    port=$(sed -n 's/.*"address":"127\.0\.0\.1:\([0-9]*\)".*/\1/p' "$work/signer.log" | head -1)
    [ -n "$port" ] || { cat "$work/signer.log" >&2; exit 1; }
    printf '%s\n' 'apiVersion: v1' 'kind: Endpoints' \
      'metadata: {name: kubevm-ssh-signer, namespace: kubevm-system}' \
      "subsets: [{addresses: [{ip: 127.0.0.1}], ports: [{name: https, port: $port, protocol: TCP}]}]" |
      "$kubectl" apply -f - >/dev/null 2>>"$work/kubectl.log"
    run kubectl-vm ca show
    run kubectl-vm create demo --image quay.io/containerdisks/ubuntu:24.04 --cpu 2 --memory 2Gi --wait --timeout 1m
    if [ "$(id -u)" -eq 0 ] && [ ! -x /usr/sbin/sshd ] && command -v apt-get >/dev/null; then
      # The emulator's guests run the machine's own OpenSSH sshd (in a namespace of their own).
      echo; echo "(installing openssh-server with apt-get: the emulator's guests run a real sshd)"
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server; } >"$work/apt.log" 2>&1 ||
        { echo "(apt-get could not install openssh-server: $work/apt.log)"; tail -3 "$work/apt.log"; }
    fi
    if [ "$(id -u)" -eq 0 ] && [ -x /usr/sbin/sshd ]; then
      # The emulator's guest runs a real sshd, configured by the VM's own cloud-init.
      run kubectl-vm ssh demo --strict-host-key-checking yes -- uname -a
      echo; echo "# the signer's audit record of that login:"
      grep '"kind":"user"' "$work/signer.log" | tail -1
    else
      # Without root the emulator cannot run a guest's sshd (it needs mount namespaces):
      # show the signer's part instead, a certificate for a fresh key, read back by ssh-keygen.
      echo; echo "(the emulator runs a guest's sshd only as root; here is the signer's part of ssh instead)"
      ssh-keygen -q -t ed25519 -N '' -C demo -f "$work/id_demo"
      printf '{"apiVersion":"ssh.kubevm.io/v1alpha1","kind":"SSHCertificateRequest","spec":{"publicKey":"%s"}}' \
        "$(cat "$work/id_demo.pub")" >"$work/request.json"
      echo; echo "\$ kubectl create --raw /apis/ssh.kubevm.io/v1alpha1/namespaces/default/virtualmachines/demo/sshcertificate -f request.json"
      "$kubectl" create --raw /apis/ssh.kubevm.io/v1alpha1/namespaces/default/virtualmachines/demo/sshcertificate \
        -f "$work/request.json" >"$work/answer.json"
      sed -n 's/.*"certificate":"\([^"]*\)".*/\1/p' "$work/answer.json" >"$work/id_demo-cert.pub"
      run ssh-keygen -L -f "$work/id_demo-cert.pub"
    fi
  else
    echo; echo "(skipping the signer: it needs kubectl >= 1.26, which tests/tools/get-kubectl.sh could not install)"
    run kubectl-vm create demo --image quay.io/containerdisks/ubuntu:24.04 --cpu 2 --memory 2Gi --wait --timeout 1m
  fi
  echo; echo "\$ printf 'cloud\\ncloud\\nuname -n\\n' | kubectl-vm console demo"
  printf 'cloud\ncloud\nuname -n\n' | kubectl-vm console demo --timeout 30s | tail -2
  run kubectl-vm list
  run kubectl-vm delete demo --yes
  if [ -n "$kubectl" ]; then
    echo; echo "\$ kubectl vm list -n prod      # through kubectl's plugin discovery"
    "$kubectl" vm list -n prod
  fi
fi
