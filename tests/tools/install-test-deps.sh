#!/usr/bin/env bash
# Installs everything the test suite runs besides the Rust toolchain, before any test runs;
# idempotent, and only `command -v` checks when all is there. Each command below is one the
# tests or the emulator spawn (grep the tests for `Command::new` and `.command(` to check):
#   cloud-init          its schema checker validates generated user data
#   ssh, ssh-keygen, ssh-agent, ssh-add (openssh-client); sshd (openssh-server): the client's
#                       tests, certificate checks, and the emulator's sshd guests
#   unshare, nsenter, setpriv, setsid (util-linux): the emulator's sshd guests
#   hostname            the emulator's login and sshd guests take the VM's name as host name
#   fincore (util-linux-extra): the export test checks what stays in the page cache
#   ansible-inventory (ansible-core): reads the generated inventory
#   curl, openssl       the signer test calls the signer with forged headers; certificates
#   qemu-img, qemu-io (qemu-utils): upload tests make and check qcow2 images, the emulator's
#                       CDI converts them
#   genisoimage         upload tests make ISO images
#   xz (xz-utils), gzip, tar: compressed uploads, debug bundles
#   file                libmagic judges the VNC screenshot
#   python3             inflates PNG data, computes reference digests
#   pgrep, kill (procps); sha256sum, md5sum, mkfifo, dd (coreutils)
# and kubectl v1.36 into <repo>/.tools/bin (Debian's kubectl is too old for plugin completion).
# The real-guest image builder (tests/guest/build-image.sh) installs qemu-system itself.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# command package
wanted="
cloud-init cloud-init
ssh openssh-client
ssh-keygen openssh-client
ssh-agent openssh-client
ssh-add openssh-client
/usr/sbin/sshd openssh-server
unshare util-linux
nsenter util-linux
setpriv util-linux
setsid util-linux
hostname hostname
fincore util-linux-extra
ansible-inventory ansible-core
curl curl
openssl openssl
qemu-img qemu-utils
qemu-io qemu-utils
genisoimage genisoimage
xz xz-utils
gzip gzip
tar tar
file file
python3 python3
pgrep procps
/bin/kill procps
sha256sum coreutils
md5sum coreutils
mkfifo coreutils
dd coreutils
"
need=()
while read -r cmd pkg; do
  [ -n "$cmd" ] || continue
  command -v "$cmd" >/dev/null 2>&1 && continue
  case " ${need[*]-} " in *" $pkg "*) ;; *) need+=("$pkg") ;; esac
done <<<"$wanted"
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing Debian packages: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

bash "$root/tests/tools/get-kubectl.sh" "$root/.tools/bin"
