#!/usr/bin/env bash
# Builds the libvirt box `tfdeploy/bookworm` from Debian packages and adds it to Vagrant: no box
# is downloaded (Vagrant Cloud is not needed). Run as root (debootstrap); built once per machine
# and reused until this script or the baked-in venv changes.
#
#   sudo vagrant/build-box.sh            # then: cd vagrant && vagrant up --provider=libvirt
#
# What is in it: a Debian bookworm root file system (debootstrap) with the kernel, systemd,
# sshd (host keys made at first boot, so no two VMs share them), sudo, ifupdown and python3;
# the `vagrant` user with Vagrant's public insecure key (Vagrant swaps it for a fresh key on the
# first `vagrant up`). The disk has no partition table and no boot loader: libvirt boots the
# box's kernel and initrd directly (/var/lib/libvirt/boot, where libvirt can read them).
#
# TensorFlow: the host's venv (TFDEPLOY_VENV, default /opt/tfdeploy/venv) is copied into the
# image when it exists, at the same path, so no VM downloads a wheel and every VM runs the
# TensorFlow the test suite runs. The host and the box both run Debian bookworm's python3, which
# the venv points at. Without it, vagrant/provision.sh installs TensorFlow with pip per VM.
set -euo pipefail

BOX=tfdeploy/bookworm
MIRROR=${TFDEPLOY_MIRROR:-http://deb.debian.org/debian}
VENV=${TFDEPLOY_VENV:-/opt/tfdeploy/venv}
CACHE=${TFDEPLOY_BOX_CACHE:-/var/cache/tfdeploy-box}
BOOT_DIR=/var/lib/libvirt/boot
SIZE=${TFDEPLOY_BOX_SIZE:-8G}
PACKAGES=linux-image-amd64,systemd-sysv,udev,kmod,openssh-server,sudo,ifupdown,isc-dhcp-client
PACKAGES=$PACKAGES,iproute2,netbase,procps,python3,python3-venv,rsync,ca-certificates
PACKAGES=$PACKAGES,libstdc++6,libgomp1
HERE=$(cd "$(dirname "$0")" && pwd)

say() { printf 'build-box: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap and the libvirt boot directory need it)"
for tool in debootstrap mkfs.ext4 qemu-img vagrant tar sha256sum; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install debootstrap e2fsprogs qemu-utils vagrant)"
done
INSECURE_KEY=$(find /usr/share /opt/vagrant /usr/lib -path '*vagrant*/keys/vagrant.pub' 2>/dev/null | head -n 1 || true)
[ -n "$INSECURE_KEY" ] || die "Vagrant's keys/vagrant.pub was not found: is vagrant installed?"

# The cache key: this script, and the venv's installed packages when it is baked in.
venv_id=none
if [ -x "$VENV/bin/python" ]; then
  venv_id=$(ls "$VENV"/lib/python3*/site-packages | sha256sum | cut -c1-16)
fi
key=$( (cat "$0"; echo "$venv_id $MIRROR") | sha256sum | cut -c1-16)
box_file=$CACHE/bookworm-$key.box
added=$CACHE/added  # the key of the build last added to Vagrant
boxes=$(vagrant box list 2>/dev/null || true)
if [ -f "$box_file" ] && [ "$(cat "$added" 2>/dev/null)" = "$key" ] &&
  [ -f "$BOOT_DIR/tfdeploy-bookworm-$key.vmlinuz" ] && [[ $boxes == *"$BOX "*libvirt* ]]; then
  say "$BOX is up to date ($box_file)"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tfdeploy-box.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$CACHE" "$BOOT_DIR"

say "debootstrap bookworm from $MIRROR (a few minutes)"
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
  || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed (log above)"; }

say "configuring the image"
echo tfdeploy-box >"$root/etc/hostname"
echo "/dev/vda / ext4 defaults,errors=remount-ro 0 1" >"$root/etc/fstab"
cat >"$root/etc/network/interfaces" <<'EOF'
auto lo
iface lo inet loopback

# The management network: libvirt's DHCP, which Vagrant reads to find the VM.
auto eth0
iface eth0 inet dhcp

source /etc/network/interfaces.d/*
EOF
chroot "$root" useradd --create-home --shell /bin/bash vagrant
echo "vagrant ALL=(ALL) NOPASSWD: ALL" >"$root/etc/sudoers.d/vagrant"
chmod 440 "$root/etc/sudoers.d/vagrant"
install -d -m 700 -o 1000 -g 1000 "$root/home/vagrant/.ssh"
install -m 600 -o 1000 -g 1000 "$INSECURE_KEY" "$root/home/vagrant/.ssh/authorized_keys"
# debootstrap made host keys; every VM made from the box must have its own.
rm -f "$root"/etc/ssh/ssh_host_*
cat >"$root/etc/systemd/system/ssh-host-keys.service" <<'EOF'
[Unit]
Description=SSH host keys of this VM, made at its first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
EOF
chroot "$root" systemctl enable ssh-host-keys.service >/dev/null 2>&1
echo "UseDNS no" >"$root/etc/ssh/sshd_config.d/box.conf"
rm -f "$root/etc/machine-id" && touch "$root/etc/machine-id"  # systemd makes one per VM
chroot "$root" apt-get clean

if [ "$venv_id" != none ]; then
  say "copying $VENV into the image"
  mkdir -p "$root$(dirname "$VENV")"
  cp -a "$VENV" "$root$VENV"
fi

say "making the disk"
vmlinuz=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -n 1)
initrd=$(ls "$root"/boot/initrd.img-* | sort -V | tail -n 1)
install -m 644 "$vmlinuz" "$BOOT_DIR/tfdeploy-bookworm-$key.vmlinuz"
install -m 644 "$initrd" "$BOOT_DIR/tfdeploy-bookworm-$key.initrd"
truncate -s "$SIZE" "$work/disk.raw"
mkfs.ext4 -q -L root -d "$root" "$work/disk.raw"
mkdir "$work/box"
qemu-img convert -O qcow2 "$work/disk.raw" "$work/box/box.img"
rm -f "$work/disk.raw"
size_gb=$(($(qemu-img info --output=json "$work/box/box.img" | sed -n 's/.*"virtual-size": \([0-9]*\).*/\1/p') / 1073741824))
printf '{"provider": "libvirt", "format": "qcow2", "virtual_size": %s}\n' "$size_gb" >"$work/box/metadata.json"
cat >"$work/box/Vagrantfile" <<EOF
# Embedded in the box: boot its kernel directly (the disk has no boot loader).
Vagrant.configure("2") do |config|
  config.vm.provider :libvirt do |libvirt|
    libvirt.kernel = "$BOOT_DIR/tfdeploy-bookworm-$key.vmlinuz"
    libvirt.initrd = "$BOOT_DIR/tfdeploy-bookworm-$key.initrd"
    libvirt.cmd_line = "root=/dev/vda rw console=ttyS0 net.ifnames=0 biosdevname=0"
  end
end
EOF
tar -C "$work/box" -cf "$box_file.part" metadata.json Vagrantfile box.img
mv "$box_file.part" "$box_file"
find "$CACHE" -name 'bookworm-*.box' ! -name "$(basename "$box_file")" -delete
find "$BOOT_DIR" -name 'tfdeploy-bookworm-*' ! -name "tfdeploy-bookworm-$key.*" -delete

say "adding $BOX to Vagrant"
# vagrant-libvirt puts the VMs' disks in libvirt's `default` storage pool, which a fresh
# libvirt install may not have (virt-manager makes it on first use).
if command -v virsh >/dev/null && ! virsh -q pool-info default >/dev/null 2>&1; then
  say "defining libvirt's default storage pool (/var/lib/libvirt/images)"
  mkdir -p /var/lib/libvirt/images
  virsh -q pool-define-as default dir --target /var/lib/libvirt/images >/dev/null
  virsh -q pool-autostart default >/dev/null
fi
if command -v virsh >/dev/null && [ "$(virsh -q pool-info default | sed -n 's/^State: *//p')" = inactive ]; then
  virsh -q pool-start default >/dev/null
fi
# vagrant-libvirt keeps the box's disk as a volume of the default pool and reuses it by name: an
# older build's volume must go (VMs made from it must have been destroyed first).
if command -v virsh >/dev/null && virsh -q pool-info default >/dev/null 2>&1; then
  virsh -q vol-list default | awk '$1 ~ /^tfdeploy-VAGRANTSLASH-bookworm/ {print $1}' |
    while read -r vol; do virsh -q vol-delete --pool default "$vol" >/dev/null; done
fi
vagrant box add --force --name "$BOX" --provider libvirt "$box_file" >&2
echo "$key" >"$added"
say "done: $BOX ($(du -h "$box_file" | cut -f1)); cd $HERE && vagrant up --provider=libvirt"
