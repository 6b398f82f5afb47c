#!/usr/bin/env bash
# Runs a command inside a nested KVM host: Debian's stock kernel booted in
# QEMU's TCG with AMD SVM and nested paging emulated, where kvm_amd gives a
# /dev/kvm that runs real Linux guests (this host's kvm_pvm cannot). Slow,
# about 10-20x real KVM, but hardware-style.
#
#   scripts/nested-kvm.sh [--rw DIR]... [--timeout SECS] [--silence SECS] [--mem SIZE] [--cpus N] -- CMD [ARGS...]
#
# The nested host's root is this host's / seen read-only through 9p, under a
# tmpfs overlay that takes its writes (lost at the end), so CMD, the build
# tree, the caches and the libraries are all at the same paths. Each --rw DIR
# is shared writable at the same path (what the command leaves for the
# caller). CMD runs as root in the current directory, with this environment;
# its output is printed as it comes, and the script exits with its status
# (124 when the timeout, 1800 s by default, ended the nested host first, or
# when it hung: a CPU stuck for 120 s by its kernel's watchdog, or, with
# --silence, the command wrote no line for that long;
# 125 when its kernel panicked).
# The nested host's kernel log is kept in the control directory named on
# failure. cgroups there are v2 only.
#
# Needs root, qemu-system-x86, busybox-static. The kernel is Debian's
# linux-image-amd64 of this host's apt sources, fetched with apt-get
# download and unpacked (never installed) into /var/cache/sandboxd-nested.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${SANDBOXD_NESTED_CACHE:-/var/cache/sandboxd-nested}

rw=()
timeout_s=1800
silence_s=0
mem=${NESTED_MEM:-6G}
cpus=${NESTED_CPUS:-2}
while (($#)); do
	case $1 in
	--rw) rw+=("$(realpath "$2")"); shift 2 ;;
	--timeout) timeout_s=$2; shift 2 ;;
	--silence) silence_s=$2; shift 2 ;;
	--mem) mem=$2; shift 2 ;;
	--cpus) cpus=$2; shift 2 ;;
	--) shift; break ;;
	*) echo "nested-kvm: unknown option $1 (usage: nested-kvm.sh [--rw DIR]... [--timeout S] [--silence S] [--mem SIZE] [--cpus N] -- CMD...)" >&2; exit 2 ;;
	esac
done
(($#)) || { echo "nested-kvm: no command (usage: nested-kvm.sh [options] -- CMD...)" >&2; exit 2; }
die() {
	echo "nested-kvm: $*" >&2
	exit 1
}
((EUID == 0)) || die "run as root (QEMU shares / read-only to the nested host)"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing: run scripts/install-deps.sh"
busybox=/bin/busybox
[[ -x $busybox ]] || die "$busybox is missing: run scripts/install-deps.sh (busybox-static)"

# What the nested host's root and KVM need from the kernel's modules, in
# the order the initramfs loads them (dependencies are added first).
root_modules=(virtio_pci 9pnet_virtio 9p overlay)
# kvm_amd: the SVM QEMU emulates; the rest is what the daemon's sandboxes
# use there (loop and btrfs for its disk pool, networks, vsock for VMs).
# crc32c_generic first: libcrc32c (btrfs, nf_tables) names it only as a
# softdep, which busybox's modprobe does not follow.
l1_modules=(crc32c_generic kvm_amd loop btrfs veth tun nf_tables bridge vhost_vsock vhost_net)

# --- the kernel, once per package version --------------------------------
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
package=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [[ -z $package ]]; then
	# apt's lists may be gone; a kernel unpacked before still serves.
	package=$(ls -1 "$cache" | grep -E '^linux-image-[0-9].*-amd64$' | sort -V | tail -n 1 || true)
	[[ -n $package ]] || die "apt knows no linux-image-amd64 and none is cached: run apt-get update"
fi
kdir=$cache/$package
if [[ ! -f $kdir/ready ]]; then
	echo "nested-kvm: fetching $package (apt-get download, unpacked, not installed)" >&2
	rm -rf "$kdir" "$kdir.tmp"
	mkdir -p "$kdir.tmp"
	chown _apt "$kdir.tmp" 2>/dev/null || true
	(cd "$kdir.tmp" && apt-get download "$package" >&2) ||
		die "apt-get download $package failed (its message is above)"
	dpkg-deb -x "$kdir.tmp"/*.deb "$kdir.tmp/root"
	rm -f "$kdir.tmp"/*.deb
	kver=$(ls -1 "$kdir.tmp/root/lib/modules")
	"$busybox" depmod -b "$kdir.tmp/root" "$kver"
	echo "$kver" >"$kdir.tmp/kver"
	touch "$kdir.tmp/ready"
	mv "$kdir.tmp" "$kdir"
fi
kver=$(cat "$kdir/kver")
moddir=$kdir/root/lib/modules/$kver
vmlinuz=$kdir/root/boot/vmlinuz-$kver

# modules.dep lists a module's dependencies, each before the one needing it
# when read from the end; print MODULE's load order, dependencies first.
load_order() {
	local name=${1//-/_} path deps dep
	path=$(awk -F: -v m="$name" '{ n = $1; sub(/.*\//, "", n); sub(/\.ko$/, "", n); gsub(/-/, "_", n); if (n == m) { print; exit } }' "$moddir/modules.dep")
	[[ -n $path ]] || return 0 # built in
	deps=${path#*:}
	for dep in $(echo "$deps" | tr ' ' '\n' | tac); do
		load_order "$(basename "$dep" .ko)"
	done
	echo "${path%%:*}"
}

initramfs=$kdir/initramfs-$(sha256sum "$repo/scripts/nested-kvm/initramfs-init.sh" | cut -c1-16).cpio
if [[ ! -f $initramfs ]]; then
	build=$(mktemp -d "$kdir/initramfs.XXXXXX")
	mkdir -p "$build/bin" "$build/modules"
	cp "$busybox" "$build/bin/busybox"
	cp "$repo/scripts/nested-kvm/initramfs-init.sh" "$build/init"
	chmod 755 "$build/init"
	for m in "${root_modules[@]}"; do load_order "$m"; done | awk '!seen[$0]++' >"$build/order"
	while read -r ko; do
		cp "$moddir/$ko" "$build/modules/"
		basename "$ko" .ko
	done <"$build/order" >"$build/modules.list"
	rm "$build/order"
	(cd "$build" && find . | "$busybox" cpio -o -H newc >"$initramfs.tmp" 2>/dev/null) ||
		die "cpio of the initramfs failed"
	mv "$initramfs.tmp" "$initramfs"
	rm -rf "$build"
fi
flock -u 9

# --- one run ----------------------------------------------------------------
ctl=$(mktemp -d /var/tmp/nested-kvm.XXXXXX)
echo "$moddir" >"$ctl/modules-dir"
printf '%s\n' "${l1_modules[@]}" >"$ctl/modules-load"
: >"$ctl/shares"
: >"$ctl/output"
# Made before QEMU opens it, so the hang watcher below can follow it.
: >"$ctl/console.log"
virtfs=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
	-virtfs "local,path=$ctl,mount_tag=nestedctl,security_model=passthrough,multidevs=remap")
for i in "${!rw[@]}"; do
	echo "rw$i ${rw[$i]}" >>"$ctl/shares"
	virtfs+=(-virtfs "local,path=${rw[$i]},mount_tag=rw$i,security_model=passthrough,multidevs=remap")
done
{
	echo "set -e"
	export -p | grep -v -E '^declare -x (BASH_|SHLVL=|OLDPWD=|_=)'
	printf 'cd %q\n' "$PWD"
	printf 'exec'
	printf ' %q' "$@"
	echo
} >"$ctl/run.sh"

# quiet: the command's output is what the caller reads; the kernel's goes
# to console.log, where loglevel=6 keeps notices too (a seccomp kill's
# audit line is one). transparent_hugepage=madvise: the VMM's memory
# snapshots need it in the guest they run in.
append="console=ttyS0 quiet loglevel=6 panic=-1 transparent_hugepage=madvise nested_repo=$repo"
status=0
timeout --foreground "$timeout_s" qemu-system-x86_64 \
	-accel tcg -cpu qemu64,+svm,+npt -smp "$cpus" -m "$mem" \
	-nodefaults -no-user-config -display none -no-reboot \
	-kernel "$vmlinuz" -initrd "$initramfs" -append "$append" \
	-serial "file:$ctl/console.log" \
	"${virtfs[@]}" </dev/null >"$ctl/qemu.log" 2>&1 &
qemu=$!
tail -n +1 -f --pid="$qemu" "$ctl/output" &
tailer=$!
# QEMU's TCG sometimes stops a nested host for good (its CPUs stuck in a
# nested guest, seen with one vCPU and with two): the kernel's watchdog
# then reports a soft lockup that only grows. A CPU stuck for 120 s has
# never come back, so that report ends the run at once, as the timeout
# would much later (the caller may boot it again).
stuck='soft lockup - CPU#[0-9]+ stuck for (1[2-9][0-9]|[2-9][0-9][0-9]|[0-9]{4,})s'
(
	# grep's status, not tail's: tail ends with EPIPE once grep has matched.
	set +o pipefail
	if tail -n +1 -f --pid="$qemu" "$ctl/console.log" | grep -m1 -qE "$stuck"; then
		echo "a CPU stuck for 120 s" >"$ctl/hung"
		kill "$qemu" 2>/dev/null || true
	fi
) &
watcher=$!
# It also stops with no lockup report (its console silent, QEMU still
# spinning, or the kernel printing RCU stall reports every few minutes
# while nothing runs): with --silence, nothing written by the command for
# that long ends it too. The kernel's lines do not count: a stalled host's
# keep coming, and a healthy one (booted quiet) writes none while the
# command runs.
# The longest quiet stretch it saw (to 15 s) is printed at the end, so the
# limit can follow what healthy runs need.
(
	longest=0
	while ((silence_s > 0)) && sleep 15; do
		newest=$(stat -c %Y "$ctl/output")
		quiet=$(($(date +%s) - newest))
		if ((quiet > longest)); then
			longest=$quiet
			echo "$longest" >"$ctl/longest-silence"
		fi
		if ((quiet >= silence_s)); then
			echo "silent for ${silence_s} s" >"$ctl/hung"
			kill "$qemu" 2>/dev/null || true
			break
		fi
	done
) &
silence_watcher=$!
wait "$qemu" || status=$?
kill "$silence_watcher" 2>/dev/null || true
wait "$silence_watcher" 2>/dev/null || true
wait "$tailer" || true
wait "$watcher" || true
if [[ -f $ctl/longest-silence ]]; then
	echo "nested-kvm: longest silence $(cat "$ctl/longest-silence") s (limit ${silence_s} s)" >&2
fi
if [[ -f $ctl/status ]]; then
	status=$(cat "$ctl/status")
	if ((status != 0)); then
		# A failed test may have lost a VMM or an agent to the nested
		# host's kernel (an OOM kill, a crash): its console says so.
		if killed=$(grep -E 'Out of memory|Killed process|oom-kill|segfault|general protection|BUG:|type=1326' "$ctl/console.log"); then
			echo "nested-kvm: the nested host's kernel said:" >&2
			tail -n 20 <<<"$killed" >&2
		fi
	fi
	rm -rf "$ctl"
	exit "$status"
fi
if [[ -f $ctl/hung ]]; then
	echo "nested-kvm: the nested host hung ($(cat "$ctl/hung"), stopped then); its kernel log: $ctl/console.log" >&2
	exit 124
fi
if ((status == 124)); then
	echo "nested-kvm: the nested host ran past ${timeout_s}s; its kernel log: $ctl/console.log" >&2
	exit 124
fi
# panic=-1 with -no-reboot: a panicked kernel ends QEMU with status 0.
if panic=$(grep -m1 -E 'Kernel panic' "$ctl/console.log"); then
	echo "nested-kvm: the nested host's kernel panicked ($panic); its kernel log: $ctl/console.log" >&2
	tail -n 40 "$ctl/console.log" >&2
	exit 125
fi
echo "nested-kvm: the nested host ended without the command's status (QEMU exit $status)." >&2
echo "nested-kvm: QEMU said: $(tail -n 5 "$ctl/qemu.log")" >&2
echo "nested-kvm: the last lines of its kernel log ($ctl/console.log):" >&2
tail -n 30 "$ctl/console.log" >&2
exit 1
