#!/usr/bin/env bash
# Boots the guest kernel under QEMU TCG (no KVM needed) the way a sandbox VM
# boots, and checks the guest side: the kernel comes up on the serial
# console, runs the agent as PID 1, the agent builds its overlay root from
# the image disk (vda) and the scratch disk (vdb), and reaches the vsock
# connect step. QEMU here has no vsock device (no /dev/vhost-vsock), so the
# connect fails; the agent says why and resets the VM, and QEMU exits.
#
# Disks, in the order our VMM attaches them:
#   vda  the image: busybox in a read-only ext4 (mkfs.ext4 -d)
#   vdb  the scratch disk: an empty ext4
#   vdc  the agent disk, the kernel's root: /sandbox-agent and mount points
# The guest has 2 vCPUs, which the kernel finds through the MP table (it has
# no ACPI), as it will with our VMM.
#
# Environment: KERNEL (default: the cached build's current/vmlinux), AGENT
# (default: the static release build; built if missing), IMAGE_EXT4 (an
# image export to use as vda instead of the busybox one, e.g. one made by
# ensure_ext4), QEMU_TIMEOUT (seconds, default 300), KEEP=1 keeps the work dir. Run as root or as a
# user who can run qemu; no KVM is used.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache="${SANDBOXD_BUILD_CACHE:-/var/cache/sandboxd-build}/kernel"
kernel="${KERNEL:-$cache/current/vmlinux}"
agent="${AGENT:-$repo/target/x86_64-unknown-linux-gnu/release/sandbox-agent}"
timeout_s="${QEMU_TIMEOUT:-300}"

die() {
  echo "check-guest-kernel: FAIL: $*" >&2
  exit 1
}

[[ -r "$kernel" ]] || die "no kernel at $kernel: run scripts/build-guest-kernel.sh (or set KERNEL)"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing: apt-get install qemu-system-x86"
for tool in mkfs.ext4 debugfs; do
  command -v "$tool" >/dev/null || die "$tool is missing: apt-get install e2fsprogs"
done
busybox=$(command -v busybox || true)
[[ -n "$busybox" ]] || die "busybox is missing: apt-get install busybox-static"
if [[ ! -x "$agent" ]]; then
  echo "building the agent (scripts/build-agent.sh)" >&2
  agent="$repo/$(flock /tmp/sandboxd-cargo.lock "$repo/scripts/build-agent.sh")"
fi
file -L "$busybox" 2>/dev/null | grep -q "statically linked" ||
  echo "warning: $busybox is not static; the image may not run" >&2

work=$(mktemp -d /tmp/check-guest-kernel.XXXXXX)
if [[ "${KEEP:-0}" != 1 ]]; then
  trap 'rm -rf "$work"' EXIT
fi

# The image: what rootfs/images/busybox.sh makes, unshifted (the daemon's
# export, ensure_ext4, unshifts the cached tree the same way). Without
# /proc /sys /dev, so the agent must make those mount points in the upper
# layer, which shows afterwards on the scratch disk.
if [[ -n "${IMAGE_EXT4:-}" ]]; then
  [[ -r "$IMAGE_EXT4" ]] || die "IMAGE_EXT4=$IMAGE_EXT4 is not readable"
  image="$IMAGE_EXT4"
else
  mkdir -p "$work/image/bin" "$work/image/etc" "$work/image/tmp"
  cp "$busybox" "$work/image/bin/busybox"
  ln -s busybox "$work/image/bin/sh"
  echo "check-guest-kernel" >"$work/image/etc/hostname"
  image="$work/image.ext4"
  truncate -s 16M "$image"
  mkfs.ext4 -q -F -O ^has_journal -m 0 -L sandbox-image -d "$work/image" "$image"
fi

# The scratch disk, as make_scratch makes it.
truncate -s 256M "$work/scratch.ext4"
mkfs.ext4 -q -F -m 0 -L sandbox-scratch -E lazy_itable_init=0,lazy_journal_init=1 "$work/scratch.ext4"

# The agent disk: read-only, so every mount point the agent uses exists.
mkdir -p "$work/agent"/{proc,sys,dev,vm/lower,vm/scratch,vm/root}
cp "$agent" "$work/agent/sandbox-agent"
truncate -s 32M "$work/agent.ext4"
mkfs.ext4 -q -F -O ^has_journal -m 0 -L sandbox-agent -d "$work/agent" "$work/agent.ext4"

seed=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
# reboot=t: without ACPI or a keyboard controller the kernel resets by
# triple fault, which QEMU (-no-reboot) and our VMM both turn into an exit.
cmdline="console=ttyS0 root=/dev/vdc ro rootfstype=ext4 init=/sandbox-agent panic=-1 reboot=t"
cmdline+=" SANDBOX_AGENT_VM=1 SANDBOX_RNG_SEED=$seed"

log="$work/console.log"
echo "booting $kernel under QEMU TCG (timeout ${timeout_s}s)" >&2
started=$(date +%s%N)
set +e
# microvm with acpi=off: QEMU puts the virtio-mmio devices on the kernel
# command line (virtio_mmio.device=...), the way our VMM describes them.
timeout "$timeout_s" qemu-system-x86_64 \
  -M microvm,acpi=off,rtc=off -accel tcg -cpu max -m 256 -smp 2 \
  -nodefaults -no-user-config -nographic -no-reboot -serial stdio \
  -kernel "$kernel" -append "$cmdline" \
  -drive id=image,file="$image",format=raw,if=none,readonly=on \
  -drive id=scratch,file="$work/scratch.ext4",format=raw,if=none \
  -drive id=agent,file="$work/agent.ext4",format=raw,if=none,readonly=on \
  -device virtio-blk-device,drive=image \
  -device virtio-blk-device,drive=scratch \
  -device virtio-blk-device,drive=agent \
  </dev/null >"$log" 2>&1
rc=$?
set -e
elapsed_ms=$((($(date +%s%N) - started) / 1000000))

failed=0
expect() {
  if grep -qF -- "$2" "$log"; then
    echo "ok: $1"
  else
    echo "MISSING: $1 (no \"$2\" on the console)"
    failed=1
  fi
}
expect "kernel booted" "Linux version"
expect "both vCPUs up (MP table, no ACPI)" "smp: Brought up 1 node, 2 CPUs"
expect "virtio disks found" "virtio_blk virtio"
expect "agent disk mounted as root" "VFS: Mounted root (ext4 filesystem) readonly"
expect "agent started as PID 1" "Run /sandbox-agent as init process"
expect "overlay root built" "sandbox-agent: root is an overlay of /dev/vda (image) and /dev/vdb (scratch)"
expect "vsock connect reached" "sandbox-agent: connecting to the host on vsock port 1025"
expect "connect failure explained" "sandbox-agent: VM init failed: connecting to the host on vsock"
# The overlay's upper layer must be on the scratch disk: the agent made
# upper/ and work/ there, and the mount points it moved /proc /sys /dev onto
# (missing from this image) were created in upper/.
if [[ -n "${IMAGE_EXT4:-}" ]]; then
  # An image that has the mount points leaves upper/ empty: only its
  # presence (and work/'s) can be checked.
  top=$(debugfs -R "ls /" "$work/scratch.ext4" 2>/dev/null || true)
  if [[ "$top" == *upper* && "$top" == *work* ]]; then
    echo "ok: the overlay's upper and work dirs are on the scratch disk"
  else
    echo "MISSING: /upper and /work on the scratch disk (debugfs ls /: ${top:-nothing})"
    failed=1
  fi
else
  upper=$(debugfs -R "ls /upper" "$work/scratch.ext4" 2>/dev/null || true)
  if [[ "$upper" == *proc* && "$upper" == *sys* && "$upper" == *dev* ]]; then
    echo "ok: the overlay wrote its upper layer to the scratch disk"
  else
    echo "MISSING: /upper/{proc,sys,dev} on the scratch disk (debugfs ls /upper: ${upper:-nothing})"
    failed=1
  fi
fi
if grep -qE "Kernel panic|Attempted to kill init|BUG:|Oops" "$log"; then
  echo "UNEXPECTED: kernel panic or oops"
  failed=1
fi
if ((rc != 0)); then
  echo "UNEXPECTED: qemu exited with $rc (124: timed out after ${timeout_s}s)"
  failed=1
fi
echo "qemu ran ${elapsed_ms} ms (TCG, boot to VM exit)"
if ((failed)); then
  echo "--- console (last 60 lines of $log) ---"
  tail -n 60 "$log"
  die "the guest did not get as far as it should"
fi
echo "check-guest-kernel: PASS"
