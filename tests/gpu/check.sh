#!/usr/bin/env bash
# GPU sandboxes on a real NVIDIA machine: the check that tests/gpu.rs (fake
# device nodes) cannot do.
#
#   tests/gpu/check.sh pack BUNDLE.tar.gz    on a build machine (cargo, this repo)
#   check.sh run BUNDLE.tar.gz|BUNDLE_DIR    on the GPU machine, as root
#   check.sh preflight                       only: can this machine run sandboxes?
#
# GPU machines here have no package registry, no cargo and no debootstrap,
# little room for files, little time, maybe gVisor or Firecracker underneath,
# and a driver in a read-only folder the linker cache may not list. So `pack`
# makes a small bundle (stripped release sandboxd, sandboxctl and agent, a
# static busybox, libseccomp) and `run`:
#   1. checks that namespaces, cgroups, overlayfs and the btrfs disk pool work
#      here, and says plainly which do not (exit 2);
#   2. finds the driver (libnvidia-ml.so.1, nvidia-smi) even outside the
#      linker cache (set NVIDIA_DRIVER_DIR to help it), exit 3 if none;
#   3. builds a CUDA device query with nvcc on the spot (set NVCC), and an
#      image of busybox + the host's C/C++ runtime + that query;
#   4. starts sandboxd with real NVML discovery, creates a sandbox with one
#      GPU, runs nvidia-smi and the query in it, and checks that a sandbox
#      without a GPU sees no device;
#   5. cleans up. Exit 0 when every check passed, 1 otherwise.
# Environment: NVIDIA_DRIVER_DIR, NVCC, SANDBOXD_FLAGS (extra daemon flags),
# KEEP_WORKDIR=1 (keep the work folder under /var/tmp for a look afterwards).
set -euo pipefail

die() { echo "check.sh: $*" >&2; exit 1; }

# --------------------------------------------------------------------------
# pack: on the build machine
# --------------------------------------------------------------------------
pack() {
	local out=${1:?usage: check.sh pack BUNDLE.tar.gz}
	local repo target stage seccomp
	repo=$(cd "$(dirname "$0")/../.." && pwd)
	target=${CARGO_TARGET_DIR:-$repo/target}
	(cd "$repo" && cargo build --quiet --release --bins && scripts/build-agent.sh >/dev/null)
	stage=$(mktemp -d)
	mkdir -p "$stage/lib"
	install -m 0755 "$target/release/sandboxd" "$target/release/sandboxctl" "$stage/"
	install -m 0755 "$target/x86_64-unknown-linux-gnu/release/sandbox-agent" "$stage/"
	strip "$stage/sandboxd" "$stage/sandboxctl" "$stage/sandbox-agent"
	[[ -x /bin/busybox ]] || die "/bin/busybox is missing: apt-get install busybox-static"
	if ldd /bin/busybox >/dev/null 2>&1; then
		die "/bin/busybox is dynamically linked: apt-get install busybox-static"
	fi
	install -m 0755 /bin/busybox "$stage/busybox"
	# The GPU machine may lack libseccomp; run installs this copy if so.
	seccomp=$(ldd "$stage/sandboxd" | awk '/libseccomp\.so/ { print $3; exit }')
	if [[ -n $seccomp ]]; then
		cp -L "$seccomp" "$stage/lib/"
	fi
	# Every sandbox loads nftables rules (nft) and lives on a btrfs pool
	# (mkfs.btrfs, btrfs); a bare GPU machine may have neither. Their
	# libraries (not the C library's) ride along; run installs wrappers.
	mkdir -p "$stage/tools"
	local tool path lib
	for tool in nft mkfs.btrfs btrfs; do
		path=$(command -v "$tool") || die "$tool is missing here: scripts/install-deps.sh"
		install -m 0755 "$path" "$stage/tools/$tool"
		while read -r lib; do
			case $(basename "$lib") in
			libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) ;;
			*) cp -Ln "$lib" "$stage/lib/" ;;
			esac
		done < <(ldd "$path" | awk '/=> \// { print $3 }')
	done
	install -m 0755 "$0" "$stage/check.sh"
	tar -C "$stage" -czf "$out" .
	rm -rf "$stage"
	echo "bundle: $out ($(du -h "$out" | cut -f1))"
}

# --------------------------------------------------------------------------
# preflight: can this machine run container sandboxes at all?
# --------------------------------------------------------------------------
problems=()
warnings=()

have_fs() {
	grep -qw "$1" /proc/filesystems || { modprobe "$1" 2>/dev/null && grep -qw "$1" /proc/filesystems; }
}

preflight() {
	echo "== preflight: $(uname -srm)"
	[[ $EUID -eq 0 ]] || problems+=("not running as root: sandboxd needs root")
	local cmd
	for cmd in mount umount unshare mkfs.btrfs btrfs ldconfig ldd tar; do
		command -v "$cmd" >/dev/null 2>&1 || problems+=("command '$cmd' is missing")
	done
	command -v nft >/dev/null 2>&1 || warnings+=("nft is missing: sandbox network policy will not work (not needed for this check)")
	if [[ $(uname -r) == 4.4.0* ]]; then
		warnings+=("kernel reports 4.4.0: this looks like gVisor, whose device and cgroup support is partial")
	fi
	have_fs overlay || problems+=("the kernel has no overlayfs: sandbox root filesystems cannot be made")
	have_fs btrfs || problems+=("the kernel has no btrfs: the per-sandbox disk pool cannot be made")
	[[ -e /dev/loop-control ]] || problems+=("no /dev/loop-control: the disk pool image cannot be loop-mounted")

	local err
	if ! err=$(unshare --user --map-root-user --pid --mount --ipc --uts --net --fork true 2>&1); then
		problems+=("cannot make user+pid+mount+ipc+uts+net namespaces: ${err:-unshare failed}")
	fi

	local fstype probe
	fstype=$(stat -fc %T /sys/fs/cgroup 2>/dev/null || echo none)
	if [[ $fstype == cgroup2fs ]]; then
		echo "   cgroup v2 (device rules become an eBPF filter)"
		local c
		for c in cpu memory pids; do
			grep -qw "$c" /sys/fs/cgroup/cgroup.controllers 2>/dev/null ||
				problems+=("cgroup v2 controller '$c' is not available")
		done
		probe=/sys/fs/cgroup/sandboxd-preflight.$$
		if mkdir "$probe" 2>/dev/null; then
			rmdir "$probe"
		else
			problems+=("cannot create a cgroup under /sys/fs/cgroup (read-only or delegated elsewhere)")
		fi
	elif [[ $fstype == tmpfs ]]; then
		echo "   cgroup v1"
		local c
		for c in cpu memory pids devices freezer; do
			[[ -d /sys/fs/cgroup/$c ]] || problems+=("cgroup v1 controller '$c' is not mounted")
		done
		probe=/sys/fs/cgroup/devices/sandboxd-preflight.$$
		if mkdir "$probe" 2>/dev/null; then
			rmdir "$probe"
		else
			problems+=("cannot create a device cgroup: GPU access could not be limited")
		fi
	else
		problems+=("no cgroup filesystem at /sys/fs/cgroup (found '$fstype')")
	fi

	local w p
	for w in "${warnings[@]}"; do echo "   warning: $w"; done
	if ((${#problems[@]})); then
		echo "THIS MACHINE CANNOT RUN CONTAINER SANDBOXES:"
		for p in "${problems[@]}"; do echo "   - $p"; done
		return 1
	fi
	echo "   namespaces, cgroups, overlayfs and btrfs: ok"
}

# --------------------------------------------------------------------------
# run: on the GPU machine
# --------------------------------------------------------------------------
failures=0
passes=0
ok() { passes=$((passes + 1)); echo "ok   - $*"; }
fail() { failures=$((failures + 1)); echo "FAIL - $*"; }
indent() { sed 's/^/   /'; }

W=""
B=""
daemon_pid=""

cleanup() {
	set +e
	if [[ -n $daemon_pid ]] && kill -0 "$daemon_pid" 2>/dev/null; then
		local id
		for id in $("$B/sandboxctl" --socket "$W/api.sock" ls 2>/dev/null | awk 'NR > 1 { print $1 }'); do
			"$B/sandboxctl" --socket "$W/api.sock" rm "$id" >/dev/null 2>&1
		done
		kill -TERM "$daemon_pid"
		wait "$daemon_pid" 2>/dev/null
	fi
	if [[ -n $W ]]; then
		umount -l "$W/state/disk" 2>/dev/null
		[[ -n ${KEEP_WORKDIR:-} ]] && { echo "work folder kept: $W"; return; }
		rm -rf "$W"
	fi
}

# First file named $1 in the folders that follow.
find_in() {
	local name=$1 dir
	shift
	for dir in "$@"; do
		[[ -n $dir && -e $dir/$name ]] && { echo "$dir/$name"; return 0; }
	done
	return 1
}

find_driver() {
	local extra=${NVIDIA_DRIVER_DIR:-}
	smi=$(command -v nvidia-smi 2>/dev/null ||
		find_in nvidia-smi "$extra" "$extra/bin" /usr/local/nvidia/bin /opt/nvidia/bin /run/nvidia/driver/usr/bin ||
		true)
	nvml=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 .*x86-64/ { print $NF; exit }' || true)
	if [[ -z $nvml ]]; then
		nvml=$(find_in libnvidia-ml.so.1 "$extra" "$extra/lib64" "$extra/lib" \
			"${smi:+$(dirname "$smi")/../lib64}" "${smi:+$(dirname "$smi")/../lib}" \
			/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
			/run/nvidia/driver/usr/lib/x86_64-linux-gnu || true)
	fi
	if [[ -z $nvml ]]; then
		nvml=$(find /usr /opt /run -xdev -maxdepth 7 -name libnvidia-ml.so.1 2>/dev/null | head -n1 || true)
	fi
	if [[ -z $nvml ]]; then
		echo "NO NVIDIA DRIVER FOUND: no libnvidia-ml.so.1 (set NVIDIA_DRIVER_DIR to its folder)"
		exit 3
	fi
	nvml=$(readlink -f "$nvml")
	echo "== driver: NVML $nvml; nvidia-smi ${smi:-not found}"
	if [[ -n $smi ]]; then
		echo "-- host nvidia-smi -L:"
		LD_LIBRARY_PATH=$(dirname "$nvml") "$smi" -L || echo "   (host nvidia-smi failed)"
	fi
	if [[ ! -e /dev/nvidia-uvm ]]; then
		# CUDA needs nvidia-uvm; it is loaded on first use, which a sandbox cannot do.
		if command -v nvidia-modprobe >/dev/null 2>&1; then
			nvidia-modprobe -u -c=0 || true
		fi
		[[ -e /dev/nvidia-uvm ]] || echo "   warning: /dev/nvidia-uvm is absent: CUDA in a sandbox will fail until the module is loaded"
	fi
}

write_query() {
	cat >"$1" <<'CUDA'
// Lists the CUDA devices this process can use and runs a kernel on each.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void add_one(int *v, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) v[i] += 1;
}

int main() {
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		printf("DEVICES 0\nERROR %s: %s\n", cudaGetErrorName(e), cudaGetErrorString(e));
		return 2;
	}
	printf("DEVICES %d\n", n);
	int bad = 0;
	for (int d = 0; d < n; d++) {
		cudaDeviceProp p;
		if (cudaGetDeviceProperties(&p, d) != cudaSuccess) { bad = 1; continue; }
		printf("DEVICE %d: %s, %zu MiB, compute %d.%d, pci %04x:%02x:%02x.0, UUID GPU-", d,
		       p.name, p.totalGlobalMem >> 20, p.major, p.minor, p.pciDomainID, p.pciBusID,
		       p.pciDeviceID);
		const unsigned char *u = (const unsigned char *)p.uuid.bytes;
		for (int i = 0; i < 16; i++) {
			printf("%02x", u[i]);
			if (i == 3 || i == 5 || i == 7 || i == 9) printf("-");
		}
		printf("\n");
		cudaSetDevice(d);
		const int N = 1 << 20;
		int *v = nullptr, h[4] = {0, 0, 0, 0};
		e = cudaMalloc(&v, N * sizeof(int));
		if (e == cudaSuccess) e = cudaMemset(v, 0, N * sizeof(int));
		if (e == cudaSuccess) {
			add_one<<<(N + 255) / 256, 256>>>(v, N);
			e = cudaDeviceSynchronize();
		}
		if (e == cudaSuccess) e = cudaMemcpy(h, v + N - 4, sizeof h, cudaMemcpyDeviceToHost);
		if (e == cudaSuccess && h[3] == 1) {
			printf("KERNEL %d: ok\n", d);
		} else {
			printf("KERNEL %d: failed: %s\n", d, cudaGetErrorString(e));
			bad = 1;
		}
		cudaFree(v);
	}
	return bad;
}
CUDA
}

build_query() {
	local out=$1 src nvcc=${NVCC:-}
	if [[ -z $nvcc ]]; then
		nvcc=$(command -v nvcc 2>/dev/null || true)
	fi
	if [[ -z $nvcc ]]; then
		local c
		for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc /opt/cuda/bin/nvcc; do
			[[ -x $c ]] && { nvcc=$c; break; }
		done
	fi
	if [[ -z $nvcc ]]; then
		echo "   no nvcc (set NVCC): the CUDA device query is NOT checked"
		return 1
	fi
	src=$W/devicequery.cu
	write_query "$src"
	echo "== building the device query with $nvcc"
	if ! "$nvcc" -O2 -o "$out" "$src" 2>"$W/nvcc.log"; then
		echo "   nvcc failed (the CUDA device query is NOT checked):"
		tail -n 20 "$W/nvcc.log" | indent
		return 1
	fi
}

# Host libraries (not the driver's: the daemon binds those) that $@ need.
runtime_libs() {
	ldd "$@" 2>/dev/null |
		awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(0x/ { print $1 }' |
		grep -Ev '/lib(cuda|nvidia)[^/]*$' | sort -u || true
}

# The image's files: busybox, the C/C++ runtime the tools need, the query.
stage_rootfs() {
	local root=$1 query=$2 applet lib
	mkdir -p "$root"/{bin,etc,root,proc,sys,dev,tmp,usr/bin,usr/sbin,sbin,var/tmp,lib64,lib/x86_64-linux-gnu,opt/gpucheck}
	chmod 0700 "$root/root"
	chmod 1777 "$root/tmp" "$root/var/tmp"
	install -m 0755 "$B/busybox" "$root/bin/busybox"
	for applet in $("$B/busybox" --list); do
		[[ $applet == busybox ]] || ln -sfn busybox "$root/bin/$applet"
	done
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
	local needs=("$nvml")
	[[ -n $smi ]] && needs+=("$smi")
	[[ -n $query ]] && needs+=("$query")
	local cuda
	cuda=$(find_in libcuda.so.1 "$(dirname "$nvml")" || true)
	[[ -n $cuda ]] && needs+=("$cuda")
	for lib in $(runtime_libs "${needs[@]}"); do
		if [[ $lib == */ld-linux* ]]; then
			cp -L "$lib" "$root/lib64/$(basename "$lib")"
		fi
		cp -L "$lib" "$root/lib/x86_64-linux-gnu/$(basename "$lib")"
	done
	[[ -n $query ]] && install -m 0755 "$query" "$root/opt/gpucheck/devicequery"
	printf '/lib/x86_64-linux-gnu\n/usr/local/nvidia/lib64\n' >"$root/etc/ld.so.conf"
	ldconfig -r "$root" 2>/dev/null || echo "   warning: ldconfig -r failed; the image relies on LD_LIBRARY_PATH"
	echo "   image: $(du -sh "$root" | cut -f1), $(find "$root/lib/x86_64-linux-gnu" -type f | wc -l) runtime libraries"
}

ctl() { "$B/sandboxctl" --socket "$W/api.sock" "$@"; }

start_daemon() {
	local args=(
		--state-dir "$W/state" --run-dir "$W/run" --socket "$W/api.sock"
		--images-dir "$W/images" --image-recipe-dirs "$W/recipes"
		--agent-path "$B/sandbox-agent" --disk-pool-gib 4 --default-disk-mib 1024
		--default-image gpucheck
		--gpu-nvml-library "$nvml"
	)
	[[ -n $smi ]] && args+=(--gpu-driver-dirs "$(dirname "$(readlink -f "$smi")")")
	# Extra daemon flags, split on spaces (debugging, or a dry run of this
	# script with --gpu-fake on a machine without a GPU).
	local extra=()
	read -r -a extra <<<"${SANDBOXD_FLAGS:-}"
	args+=("${extra[@]}")
	echo "== building the image"
	if ! "$B/sandboxd" "${args[@]}" image build gpucheck >"$W/image.log" 2>&1; then
		tail -n 20 "$W/image.log" | indent
		die "the image could not be built"
	fi
	echo "== starting sandboxd"
	RUST_LOG=${RUST_LOG:-info} "$B/sandboxd" "${args[@]}" >"$W/daemon.log" 2>&1 &
	daemon_pid=$!
	for _ in $(seq 1 150); do
		ctl health >/dev/null 2>&1 && return 0
		kill -0 "$daemon_pid" 2>/dev/null || break
		sleep 0.2
	done
	echo "   sandboxd did not come up; its log:"
	tail -n 30 "$W/daemon.log" | indent
	daemon_pid=""
	exit 1
}

# The sandbox's first GPU UUID from `inspect --json`.
gpu_of() {
	ctl --json inspect "$1" | tr -d ' \n' | sed -n 's/.*"gpus":\["\([^"]*\)".*/\1/p'
}

# Puts the bundled nft / mkfs.btrfs / btrfs where sandboxd looks (its
# supervisors search /usr/sbin) when this machine lacks them.
install_missing_tools() {
	local tool
	for tool in nft mkfs.btrfs btrfs; do
		command -v "$tool" >/dev/null 2>&1 && continue
		[[ -x $B/tools/$tool ]] || continue
		echo "   installing the bundled $tool into /usr/sbin"
		printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/tools/%s "$@"\n' "$B" "$B" "$tool" >"/usr/sbin/$tool"
		chmod 0755 "/usr/sbin/$tool"
	done
}

run() {
	local src=${1:?usage: check.sh run BUNDLE.tar.gz|BUNDLE_DIR}
	W=$(mktemp -d /var/tmp/sandboxd-gpucheck.XXXXXX)
	chmod 0755 "$W"
	trap cleanup EXIT
	if [[ -d $src ]]; then
		B=$(cd "$src" && pwd)
	else
		B=$W/bundle
		mkdir -p "$B"
		tar -C "$B" -xzf "$src"
	fi
	chmod 0755 "$B"
	for f in sandboxd sandboxctl sandbox-agent busybox; do
		[[ -x $B/$f ]] || die "the bundle has no $f; make it with: tests/gpu/check.sh pack BUNDLE.tar.gz"
	done

	install_missing_tools
	preflight || exit 2

	if ! ldd "$B/sandboxd" >/dev/null 2>&1 || ldd "$B/sandboxd" | grep -q 'not found'; then
		if [[ -e $B/lib/libseccomp.so.2 ]] && [[ -w /usr/local/lib ]]; then
			echo "   installing the bundled libseccomp into /usr/local/lib"
			cp "$B/lib/libseccomp.so.2" /usr/local/lib/ && ldconfig
		fi
		if ldd "$B/sandboxd" | grep -q 'not found'; then
			ldd "$B/sandboxd" | grep 'not found' | indent
			die "sandboxd cannot run here: libraries missing"
		fi
	fi

	find_driver
	local query=""
	if build_query "$W/devicequery"; then
		query=$W/devicequery
	fi
	echo "== staging the image"
	mkdir -p "$W/recipes"
	stage_rootfs "$W/rootfs" "$query"
	# shellcheck disable=SC2016 # $1 is the recipe's own argument
	printf '#!/usr/bin/env bash\nset -euo pipefail\ncp -a %q/. "$1"/\n' "$W/rootfs" >"$W/recipes/gpucheck.sh"

	start_daemon

	echo "== sandboxctl gpus"
	local gpus ngpus
	gpus=$(ctl gpus)
	indent <<<"$gpus"
	ngpus=$(($(wc -l <<<"$gpus") - 1))
	if ((ngpus < 1)); then
		fail "sandboxd found no GPU"
		grep -i -E 'gpu|nvml' "$W/daemon.log" | tail -n 10 | indent
		exit 1
	fi
	ok "sandboxd found $ngpus GPU(s) through NVML"

	echo "== a sandbox with one GPU"
	local gid uuid out
	if ! gid=$(ctl create --image gpucheck --gpu any --gpu-count 1 --ttl 15m 2>"$W/create.err"); then
		fail "creating a GPU sandbox: $(cat "$W/create.err")"
		tail -n 20 "$W/daemon.log" | indent
		exit 1
	fi
	uuid=$(gpu_of "$gid")
	if [[ $uuid == GPU-* ]]; then
		ok "sandbox $gid holds $uuid"
	else
		fail "sandbox $gid lists no GPU: $(ctl --json inspect "$gid")"
	fi
	if ctl gpus | grep -q "$gid"; then
		ok "gpus shows $gid as the holder"
	else
		fail "gpus does not show $gid as the holder"
	fi

	# shellcheck disable=SC2016 # expanded in the sandbox
	out=$(ctl exec "$gid" -- sh -c 'ls -l /dev/nvidia*; echo "NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ls /usr/local/nvidia/lib64' 2>&1 || true)
	indent <<<"$out"
	local nodes
	nodes=$(grep -cE '/dev/nvidia[0-9]+$' <<<"$out" || true)
	if [[ $nodes == 1 ]]; then
		ok "exactly one /dev/nvidiaN in the GPU sandbox"
	else
		fail "$nodes /dev/nvidiaN nodes in the GPU sandbox (want 1)"
	fi
	if grep -q "NVIDIA_VISIBLE_DEVICES=$uuid " <<<"$out"; then
		ok "NVIDIA_VISIBLE_DEVICES is the sandbox's GPU"
	else
		fail "NVIDIA_VISIBLE_DEVICES is not $uuid"
	fi

	if [[ -n $smi ]]; then
		out=$(ctl exec "$gid" -- nvidia-smi -L 2>&1 || true)
		indent <<<"$out"
		if [[ $(grep -c '^GPU ' <<<"$out") == 1 ]] && grep -qi "$uuid" <<<"$out"; then
			ok "nvidia-smi in the sandbox sees exactly its GPU"
		else
			fail "nvidia-smi -L in the sandbox"
		fi
		out=$(ctl exec "$gid" -- nvidia-smi 2>&1 || true)
		indent <<<"$out"
	else
		echo "   no nvidia-smi on this host: NOT checked"
	fi

	if [[ -n $query ]]; then
		out=$(ctl exec "$gid" -- /opt/gpucheck/devicequery 2>&1 || true)
		indent <<<"$out"
		if grep -q '^DEVICES 1$' <<<"$out" && grep -qi "UUID $uuid" <<<"$out" && grep -q '^KERNEL 0: ok$' <<<"$out"; then
			ok "CUDA in the sandbox sees exactly its GPU and runs a kernel on it"
		else
			fail "CUDA device query in the GPU sandbox"
		fi
	fi

	echo "== a sandbox without a GPU"
	local cid
	if ! cid=$(ctl create --image gpucheck --ttl 15m 2>"$W/create.err"); then
		fail "creating a sandbox without a GPU: $(cat "$W/create.err")"
	else
		# shellcheck disable=SC2016 # expanded in the sandbox
		out=$(ctl exec "$cid" -- sh -c 'ls /dev/nvidia* 2>/dev/null | wc -l; command -v nvidia-smi || echo no-smi; for d in /proc/driver/nvidia/gpus/*; do [ -e "$d" ] && echo "$d: $(ls -A "$d" | wc -l) entries"; done; true' 2>&1 || true)
		indent <<<"$out"
		if [[ $(head -n1 <<<"$out") == 0 ]]; then
			ok "no /dev/nvidia* node without a GPU"
		else
			fail "device nodes visible without a GPU"
		fi
		if grep -q '^no-smi$' <<<"$out"; then
			ok "no nvidia-smi without a GPU"
		else
			fail "nvidia-smi visible without a GPU"
		fi
		if ! grep -qE '^/proc/driver/nvidia/gpus/.*: [1-9]' <<<"$out"; then
			ok "every GPU's /proc/driver/nvidia entry is hidden without a GPU"
		else
			fail "a GPU's /proc/driver/nvidia entry is readable without a GPU"
		fi
		if [[ -n $query ]]; then
			out=$(ctl exec "$cid" -- /opt/gpucheck/devicequery 2>&1 || true)
			indent <<<"$out"
			if ! grep -q '^DEVICE ' <<<"$out"; then
				ok "CUDA sees no device without a GPU"
			else
				fail "CUDA sees a device in a sandbox without a GPU"
			fi
		fi
	fi

	echo "== release"
	ctl rm "$gid" >/dev/null
	if ! ctl gpus | grep -q "$gid"; then
		ok "the GPU is free after delete"
	else
		fail "the GPU is still held after delete"
	fi

	echo "== $passes passed, $failures failed"
	((failures == 0))
}

case ${1:-} in
pack) shift; pack "$@" ;;
run) shift; run "$@" ;;
preflight) preflight ;;
*) sed -n '2,24p' "$0" >&2; exit 64 ;;
esac
