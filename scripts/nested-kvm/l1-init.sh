#!/bin/bash
# PID 1 of the nested host (scripts/nested-kvm.sh), on the host's root seen
# read-only through 9p under a tmpfs overlay: mounts the kernel filesystems
# (cgroup v2 only: the nested host is the project's unified-hierarchy host),
# loads KVM for AMD SVM, mounts the writable shares at their host paths,
# runs the command the control share holds with its output and exit status
# in that share, and powers off.
set -u
ctl=/run/nested-kvm
log() { echo "nested-kvm l1: $*" >/dev/ttyS0; }
finish() {
	sync
	umount -a -r >/dev/null 2>&1
	echo o >/proc/sysrq-trigger
	sleep infinity
}
trap finish EXIT

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
# what udev or systemd would have made: nft -f /dev/stdin and others use them
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
echo 1 >/proc/sys/kernel/sysrq
hostname nested-kvm
ip link set lo up

mkdir -p "$ctl"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none nestedctl "$ctl" || {
	log "cannot mount the control share"
	exit 1
}
kver=$(uname -r)
# The kernel's modules, from the cache nested-kvm.sh unpacked them into.
modules=$(cat "$ctl/modules-dir")
mkdir -p "/lib/modules/$kver"
mount --bind "$modules" "/lib/modules/$kver"
# The kernel loads what nft rules and sockets need on demand through
# kernel.modprobe; this host may have no kmod, busybox's modprobe serves.
printf '#!/bin/sh\nexec busybox modprobe "$@"\n' >/run/modprobe
chmod 755 /run/modprobe
echo /run/modprobe >/proc/sys/kernel/modprobe
for m in $(cat "$ctl/modules-load"); do
	busybox modprobe "$m" || log "modprobe $m failed"
done
# Writable shares: "TAG PATH" lines, mounted over the read-only view.
while read -r tag path; do
	[[ -n $tag ]] || continue
	mkdir -p "$path"
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none "$tag" "$path" ||
		log "cannot mount $tag at $path"
done <"$ctl/shares"
[[ -c /dev/kvm ]] || log "no /dev/kvm after loading kvm_amd"

status=0
/bin/bash "$ctl/run.sh" >"$ctl/output" 2>&1 </dev/null || status=$?
echo "$status" >"$ctl/status.tmp"
mv "$ctl/status.tmp" "$ctl/status"
