#!/usr/bin/env bash
# Installs what the test suite needs beyond the Rust toolchain, idempotently:
#   - Debian packages: cloud-init (its schema checker validates generated user data),
#     openssh-client (ssh-keygen checks certificates; ssh/scp for the ssh-config tests),
#     openssh-server (a real sshd: the client's tests and the emulator's guests),
#     util-linux-extra (fincore: the export test checks what stays in the page cache),
#     ansible-core (ansible-inventory and ansible read the generated inventory);
#   - kubectl v1.36 into <repo>/.tools/bin (Debian's kubectl is too old for plugin completion).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

need=()
command -v cloud-init >/dev/null 2>&1 || need+=(cloud-init)
command -v ssh-keygen >/dev/null 2>&1 || need+=(openssh-client)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v python3 >/dev/null 2>&1 || need+=(python3 python3-pip)
command -v fincore >/dev/null 2>&1 || need+=(util-linux-extra)
# ansible-core: the ansible-inventory tests run Debian's ansible-inventory and ansible.
command -v ansible-inventory >/dev/null 2>&1 || need+=(ansible-core)
# curl: the signer test calls the signer directly with forged headers; openssl checks certificates.
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing Debian packages: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

bash "$root/tests/tools/get-kubectl.sh" "$root/.tools/bin"
