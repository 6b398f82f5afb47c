#!/usr/bin/env bash
# Builds the microVM guest kernel from Debian's kernel source package and the
# config fragment in rootfs/kernel/, once per (source version, fragment):
#
#   /var/cache/sandboxd-build/kernel/src/<version>/     unpacked source (shared)
#   /var/cache/sandboxd-build/kernel/<key>/vmlinux      PVH-bootable ELF (our VMM, QEMU)
#   /var/cache/sandboxd-build/kernel/<key>/bzImage      for loaders that want one
#   /var/cache/sandboxd-build/kernel/<key>/config       the final .config
#   /var/cache/sandboxd-build/kernel/current -> <key>
#
# <key> is the sha256 of the source package version, the fragment and
# RECIPE_VERSION below, so a security update of the source or an edited
# fragment builds a new kernel and an unchanged pair is a cache hit that does
# nothing. Run as root (apt-get, /var/cache). Prints the kernel path last.
#
# Environment: SANDBOXD_BUILD_CACHE (default /var/cache/sandboxd-build),
# KERNEL_JOBS (default: number of CPUs), KERNEL_NICE (default 19: other
# builds share this host's cores).
set -euo pipefail

# Bump when this script changes what it builds (make targets, flags).
RECIPE_VERSION=1
PACKAGE=linux-source-6.1

repo=$(cd "$(dirname "$0")/.." && pwd)
fragment="$repo/rootfs/kernel/config.fragment"
cache="${SANDBOXD_BUILD_CACHE:-/var/cache/sandboxd-build}/kernel"
jobs="${KERNEL_JOBS:-$(nproc)}"
nice_level="${KERNEL_NICE:-19}"
started=$(date +%s)

die() {
  echo "build-guest-kernel: $*" >&2
  exit 1
}

elapsed() {
  local s=$(($(date +%s) - started))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}

[[ -r "$fragment" ]] || die "missing $fragment: run this from a sandboxd checkout"

# Empty when the package is absent: dpkg-query exits 1 for an unknown package,
# which must not end the script before it installs it.
installed_version() {
  { dpkg-query -W -f='${Status} ${Version}\n' "$PACKAGE" 2>/dev/null || true; } |
    awk '$3 == "installed" { print $4 }'
}

version=$(installed_version)
if [[ -z "$version" ]]; then
  echo "installing $PACKAGE and the kernel's build tools" >&2
  apt-get update -qq || die "apt-get update failed (above); fix apt's sources"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "$PACKAGE" build-essential bc bison flex libelf-dev libssl-dev xz-utils >/dev/null ||
    die "installing $PACKAGE and the build tools failed (apt's errors are above)"
  version=$(installed_version)
  [[ -n "$version" ]] || die "$PACKAGE did not install; check apt's sources"
fi
tarball="/usr/src/$PACKAGE.tar.xz"
[[ -r "$tarball" ]] || die "$PACKAGE $version is installed but $tarball is missing; reinstall it (apt-get install --reinstall $PACKAGE)"
for tool in gcc make bc bison flex; do
  command -v "$tool" >/dev/null || die "$tool is missing: apt-get install build-essential bc bison flex libelf-dev libssl-dev"
done

key=$( (
  echo "package=$PACKAGE version=$version recipe=$RECIPE_VERSION"
  cat "$fragment"
) | sha256sum | cut -c1-64)
out="$cache/$key"

mkdir -p "$cache"
# One build at a time per cache; a second caller waits and then finds the
# result. The lock is on a file that is never replaced.
exec 9>"$cache/lock"
flock 9

# With the lock held no build is running: any *.tmp / *.final left here is
# from one that failed or was killed (kept until now for its logs).
rm -rf "$cache"/*.tmp "$cache"/*.final "$cache"/src/*.tmp

point_current() {
  ln -sfn "$key" "$cache/current.tmp"
  mv -T "$cache/current.tmp" "$cache/current"
}

if [[ -f "$out/vmlinux" ]]; then
  point_current
  echo "guest kernel cached ($PACKAGE $version, key ${key:0:12}); nothing to do" >&2
  echo "$out/vmlinux"
  exit 0
fi

src="$cache/src/$version"
if [[ ! -f "$src/Makefile" ]]; then
  echo "unpacking $tarball into $src" >&2
  rm -rf "$src.tmp"
  mkdir -p "$src.tmp"
  tar -xJf "$tarball" -C "$src.tmp" --strip-components=1
  rm -rf "$src"
  mv "$src.tmp" "$src"
fi

# Out-of-tree build: the unpacked source stays clean and shared between
# fragments; a half-finished build is thrown away on the next run.
build="$out.tmp"
rm -rf "$build"
mkdir -p "$build"
kmake() {
  nice -n "$nice_level" make -C "$src" O="$build" ARCH=x86_64 -j"$jobs" "$@"
}

echo "configuring ($PACKAGE $version, key ${key:0:12})" >&2
kmake -s tinyconfig >"$build/config.log" 2>&1 || die "make tinyconfig failed; see $build/config.log"
# -m: merge only; olddefconfig then resolves dependencies once over the whole.
(cd "$build" && "$src/scripts/kconfig/merge_config.sh" -m -O "$build" .config "$fragment") \
  >>"$build/config.log" 2>&1 || die "merging $fragment failed; see $build/config.log"
kmake -s olddefconfig >>"$build/config.log" 2>&1 || die "make olddefconfig failed; see $build/config.log"

# Kconfig silently drops an option whose dependencies are not met; a kernel
# missing, say, VIRTIO_VSOCKETS would boot and then never reach the host.
missing=()
while IFS= read -r line; do
  if [[ "$line" =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
    grep -qxF "$line" "$build/.config" || missing+=("${BASH_REMATCH[1]} (wanted ${BASH_REMATCH[2]})")
  elif [[ "$line" =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
    name="${BASH_REMATCH[1]}"
    if grep -q "^$name=" "$build/.config"; then
      missing+=("$name (wanted unset, got $(grep "^$name=" "$build/.config"))")
    fi
  fi
done <"$fragment"
if ((${#missing[@]})); then
  printf 'build-guest-kernel: not set as %s asks:\n' "$fragment" >&2
  printf '  %s\n' "${missing[@]}" >&2
  die "fix the fragment (usually a dependency of these options is missing; see 'make menuconfig' in $build)"
fi

echo "building vmlinux and bzImage with $jobs jobs at nice $nice_level (log: $build/build.log)" >&2
kmake vmlinux bzImage >"$build/build.log" 2>&1 ||
  die "kernel build failed after $(elapsed); last lines of $build/build.log:
$(tail -n 20 "$build/build.log")"

# Keep only what is used: the object tree is ~10x the size of the kernel.
final="$out.final"
rm -rf "$final"
mkdir -p "$final"
cp "$build/vmlinux" "$final/vmlinux"
cp "$build/arch/x86/boot/bzImage" "$final/bzImage"
cp "$build/.config" "$final/config"
cp "$build/build.log" "$final/build.log"
printf 'package=%s\nversion=%s\nrecipe=%s\nbuild_seconds=%s\n' \
  "$PACKAGE" "$version" "$RECIPE_VERSION" $(($(date +%s) - started)) >"$final/meta"
rm -rf "$out"
mv "$final" "$out"
rm -rf "$build"
point_current

echo "guest kernel built in $(elapsed): $(du -h "$out/vmlinux" | cut -f1) vmlinux, $(du -h "$out/bzImage" | cut -f1) bzImage" >&2
echo "$out/vmlinux"
