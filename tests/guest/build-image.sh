#!/usr/bin/env bash
# Builds the real Linux guest that the emulator's qemu guests boot (tests/emulator/src/core/qemu_guest/mod.rs),
# once, and caches it. Recipe and measured timings: tests/guest/README.md.
#
#   bash tests/guest/build-image.sh        # as root (apt-get, mmdebstrap, chroot)
#
# Output directory: ${KUBEVM_GUEST_DIR:-<repo>/.cache/guest}, printed on the last stdout line. It holds
# an `env` file of KEY=VALUE lines with absolute paths:
#   QEMU          qemu-system-x86_64 (Debian's, unpacked privately: see below)
#   QEMU_FW       its firmware directory, for `-L`
#   KERNEL        Debian's kernel (vmlinuz)
#   INITRD        a busybox initramfs that loads the virtio, ext4, iso9660, vfat and virtio_console
#                 modules and switch_roots to root=/dev/vda
#   BASE_IMAGE    raw ext4 image (2 GiB sparse): Debian 12 minbase, systemd, openssh-server,
#                 cloud-init (NoCloud), qemu-guest-agent, sudo; root's password is `root` (serial login)
#   CLOUD_LOCALDS cloud-localds, which makes the NoCloud seed (iso9660, volume id cidata)
# A second run with the same recipe (this file's sha256) reuses the cache and takes well under a second.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${KUBEVM_GUEST_DIR:-$root/.cache/guest}
suite=bookworm
mirror=${KUBEVM_GUEST_MIRROR:-http://deb.debian.org/debian}
recipe=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)

log() { printf '[build-image %3ss] %s\n' "$SECONDS" "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  echo "build-image.sh: needs root (apt-get, mmdebstrap, chroot)" >&2
  exit 2
fi
mkdir -p "$dir"
# One builder at a time: tests started in parallel wait for the first one's image.
exec 9>"$dir/.lock"
flock 9
if [ -f "$dir/.complete" ] && [ "$(cat "$dir/.complete")" = "$recipe" ] && [ -f "$dir/env" ]; then
  log "cached: $dir"
  echo "$dir"
  exit 0
fi
rm -f "$dir/.complete"

# Host packages. The qemu-system-x86 of bookworm conflicts with the machine's qemu-utils from
# backports (it would be removed), so qemu is unpacked privately from its .debs and only its
# shared libraries are installed.
host_pkgs=(libaio1 libbpf1 libcapstone4 libfdt1 libfuse3-3 libglib2.0-0 libgmp10 libgnutls30
  libibverbs1 libjpeg62-turbo libnuma1 libpixman-1-0 libpmem1 libpng16-16 librdmacm1 libsasl2-2
  libseccomp2 libslirp0 libudev1 liburing2 libvdeplug2 libzstd1 zlib1g
  busybox-static mmdebstrap cloud-image-utils genisoimage cpio kmod e2fsprogs socat)
missing=()
for p in "${host_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ] || [ ! -f "$dir/debs/.complete" ]; then
  log "apt-get update"
  apt-get update -qq
fi
if [ ${#missing[@]} -gt 0 ]; then
  log "installing host packages: ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The kernel: the ABI that linux-image-amd64 points at now.
abi=$(apt-cache show linux-image-amd64 | sed -n 's/^Depends: linux-image-\([^ ]*\) .*/\1/p' | head -1)
[ -n "$abi" ] || { echo "build-image.sh: cannot find the kernel package of linux-image-amd64" >&2; exit 1; }

work="$dir/work"
rm -rf "$work"
mkdir -p "$work" "$dir/debs"
if [ ! -f "$dir/debs/.complete" ] || [ "$(cat "$dir/debs/.complete")" != "$abi" ]; then
  log "downloading qemu and linux-image-$abi"
  rm -f "$dir"/debs/*.deb
  chown _apt "$dir/debs" 2>/dev/null || true # apt-get download as _apt needs to write here
  (cd "$dir/debs" && apt-get download -qq qemu-system-x86 qemu-system-common qemu-system-data \
    seabios ipxe-qemu "linux-image-$abi" >/dev/null)
  echo "$abi" >"$dir/debs/.complete"
fi

log "unpacking qemu and the kernel"
rm -rf "$dir/qemu" "$dir/fw"
mkdir -p "$dir/qemu" "$dir/fw" "$work/kernel"
for d in "$dir"/debs/qemu-*.deb "$dir"/debs/seabios*.deb "$dir"/debs/ipxe*.deb; do dpkg -x "$d" "$dir/qemu"; done
dpkg -x "$dir"/debs/linux-image-"$abi"_*.deb "$work/kernel"
ln -sf "$dir"/qemu/usr/share/qemu/* "$dir"/qemu/usr/share/seabios/* "$dir"/qemu/usr/lib/ipxe/qemu/* "$dir/fw/"
cp "$work/kernel/boot/vmlinuz-$abi" "$dir/vmlinuz"
"$dir/qemu/usr/bin/qemu-system-x86_64" --version | head -1 >&2

log "mmdebstrap $suite (minbase, systemd, sshd, cloud-init, qemu-guest-agent)"
rootfs="$work/rootfs"
# mmdebstrap, not debootstrap: apt downloads in parallel (90 s against 210 s measured here) and
# resolves virtual packages (debootstrap needs python3-cffi-backend named for cloud-init).
mmdebstrap --variant=minbase \
  --include=systemd-sysv,udev,openssh-server,cloud-init,sudo,ifupdown,isc-dhcp-client,iproute2,netbase,kmod,dbus,qemu-guest-agent \
  "$suite" "$rootfs" "$mirror" >"$work/mmdebstrap.log" 2>&1 ||
  { tail -20 "$work/mmdebstrap.log" >&2; exit 1; }

log "configuring the root file system"
echo '/dev/vda / ext4 defaults,noatime 0 1' >"$rootfs/etc/fstab"
echo kubevm-guest >"$rootfs/etc/hostname"
echo root:root | chroot "$rootfs" chpasswd
printf 'datasource_list: [ NoCloud, None ]\n' >"$rootfs/etc/cloud/cloud.cfg.d/90-datasource.cfg"
# locale: the default en_US.UTF-8 is not generated, and update-locale's failure ends cloud-init
# in `status: error`; manage_etc_hosts: "sudo: unable to resolve host"; ed25519 only: RSA host
# key generation takes about 10 s under TCG.
printf 'locale: C.UTF-8\nmanage_etc_hosts: true\nssh_genkeytypes: [ed25519]\n' \
  >"$rootfs/etc/cloud/cloud.cfg.d/91-test-image.cfg"
for u in e2scrub_reap.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$u"
done
# Hot-added CPUs and memory blocks come online as the kernel announces them (Debian's kernel
# leaves both offline: CONFIG_MEMORY_HOTPLUG_DEFAULT_ONLINE is not set), as the udev rules of
# RHEL and Fedora guests do: KubeVirt's CPU and memory hotplug expect the guest to online them.
cat >"$rootfs/etc/udev/rules.d/80-kubevm-hotplug.rules" <<'EOF'
SUBSYSTEM=="cpu", ACTION=="add", TEST=="online", ATTR{online}=="0", ATTR{online}="1"
SUBSYSTEM=="memory", ACTION=="add", TEST=="state", ATTR{state}=="offline", ATTR{state}="online"
EOF
# An image has no host keys of its own: cloud-init makes them on first boot per instance.
rm -f "$rootfs"/etc/ssh/ssh_host_*
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*

log "kernel modules and initramfs"
# button and evdev: without them the guest ignores the ACPI power button (system_powerdown);
# virtio_scsi, sd_mod, sr_mod: hotplugged SCSI disks and cdroms (qemu_guest/hotplug.rs);
# virtio_mem: memory hot-plugged into a running KubeVirt guest (qemu_guest/sizing.rs).
mods="virtio_pci virtio_blk virtio_net virtio_console virtio_rng virtio_scsi virtio_mem sd_mod sr_mod button evdev ext4 isofs vfat nls_cp437 nls_iso8859_1 nls_ascii"
depmod -b "$work/kernel" "$abi"
for m in $mods; do modprobe -d "$work/kernel" -S "$abi" --show-depends "$m"; done |
  awk '$1 == "insmod" {print $2}' | sort -u >"$work/mods.txt"
initramfs="$work/initramfs"
mkdir -p "$initramfs"/{bin,proc,sys,dev,newroot}
cp /bin/busybox "$initramfs/bin/"
for dst in "$rootfs" "$initramfs"; do
  while read -r f; do
    rel=${f#*/lib/modules/$abi/}
    mkdir -p "$dst/lib/modules/$abi/$(dirname "$rel")"
    cp "$f" "$dst/lib/modules/$abi/$rel"
  done <"$work/mods.txt"
  cp "$work"/kernel/lib/modules/"$abi"/modules.{order,builtin,builtin.modinfo} "$dst/lib/modules/$abi/"
  depmod -b "$dst" "$abi"
done
cat >"$initramfs/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
for m in virtio_pci virtio_blk crc32c_intel crc32c_generic ext4 virtio_net virtio_console virtio_rng \
         isofs vfat nls_cp437 nls_ascii nls_iso8859_1; do modprobe $m 2>/dev/null; done
root=/dev/vda; for x in $(cat /proc/cmdline); do case $x in root=*) root=${x#root=};; esac; done
i=0; while [ ! -b $root ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
mount -t ext4 -o rw $root /newroot || { echo "initramfs: cannot mount $root"; exec setsid cttyhack sh; }
umount /proc /sys; mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
EOF
chmod +x "$initramfs/init"
(cd "$initramfs" && find . | cpio -o -H newc --quiet | gzip -1 >"$dir/initrd.gz")

log "base image"
rm -f "$dir/base.img"
truncate -s 2G "$dir/base.img"
mkfs.ext4 -q -F -L rootfs -d "$rootfs" "$dir/base.img"

cat >"$dir/env" <<EOF
QEMU=$dir/qemu/usr/bin/qemu-system-x86_64
QEMU_FW=$dir/fw
KERNEL=$dir/vmlinuz
INITRD=$dir/initrd.gz
BASE_IMAGE=$dir/base.img
CLOUD_LOCALDS=$(command -v cloud-localds)
EOF
rm -rf "$work"
echo "$recipe" >"$dir/.complete"
log "done: $(du -sh --apparent-size "$dir/base.img" | cut -f1) image ($(du -sh "$dir/base.img" | cut -f1) used), kernel $abi"
echo "$dir"
