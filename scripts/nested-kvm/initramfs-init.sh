#!/bin/busybox sh
# /init of the nested host's initramfs (scripts/nested-kvm.sh): loads what a
# 9p root needs, mounts the host's / read-only under a writable tmpfs
# overlay, and hands over to scripts/nested-kvm/l1-init.sh on that root.
# Everything else (kvm, the rw shares, the command) is that script's job, so
# this file changes rarely and the initramfs is rebuilt only with the kernel.
/bin/busybox mkdir -p /proc /sys /dev /lower /upper /newroot
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs devtmpfs /dev
fail() {
	echo "nested-kvm initramfs: $*" >/dev/ttyS0
	/bin/busybox poweroff -f
}
# modules.order of what a virtio 9p root needs, dependencies first
for m in $(cat /modules.list); do
	/bin/busybox insmod "/modules/$m.ko" || fail "insmod $m failed"
done
# tags and paths come on the command line: nested_repo=PATH
for arg in $(cat /proc/cmdline); do
	case $arg in nested_repo=*) repo=${arg#nested_repo=} ;; esac
done
[ -n "$repo" ] || fail "no nested_repo= on the kernel command line"
# cache=loose: the host's files do not change under a run; the writable
# shares the command uses are mounted by l1-init.sh without a cache.
/bin/busybox mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /lower ||
	fail "cannot mount the host's root (9p tag hostroot)"
/bin/busybox mount -t tmpfs -o mode=0755 tmpfs /upper || fail "tmpfs for the overlay"
/bin/busybox mkdir -p /upper/upper /upper/work
/bin/busybox mount -t overlay -o lowerdir=/lower,upperdir=/upper/upper,workdir=/upper/work overlay /newroot ||
	fail "overlay of the host's root"
/bin/busybox umount /proc
/bin/busybox umount /dev
exec /bin/busybox switch_root /newroot /bin/bash "$repo/scripts/nested-kvm/l1-init.sh"
