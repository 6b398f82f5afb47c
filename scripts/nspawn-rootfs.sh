#!/usr/bin/env bash
# Builds the Debian rootfs with systemd that tests/systemd_boot.rs boots with
# systemd-nspawn (PID 1 here is not systemd), once per recipe:
#
#   /var/cache/sandboxd-nspawn/<key>/    the rootfs
#   /var/cache/sandboxd-nspawn/root      -> <key>  (what the test boots)
#
# <key> is the sha256 of the suite, the package list and RECIPE_VERSION, so an
# edited list builds a new rootfs instead of reusing one that lacks a package.
# Run as root. Environment: DEBIAN_MIRROR (see rootfs/lib/debian-mirror.sh).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../rootfs/lib/debian-mirror.sh
. "$repo/rootfs/lib/debian-mirror.sh"

# Bump when this script changes what it builds beyond the list below.
RECIPE_VERSION=2
suite=bookworm
# systemd to boot; what the daemon itself runs at start and on create (the
# btrfs quota of its disk pool, nft and ip for sandbox networks).
packages=systemd,systemd-sysv,dbus,util-linux,btrfs-progs,iproute2,nftables

cache=/var/cache/sandboxd-nspawn
key=$(printf 'suite=%s packages=%s recipe=%s\n' "$suite" "$packages" "$RECIPE_VERSION" | sha256sum | cut -c1-64)
root="$cache/$key"

die() {
  echo "nspawn-rootfs: $*" >&2
  exit 1
}

point_root() {
  ln -sfn "$key" "$cache/root.tmp"
  mv -T "$cache/root.tmp" "$cache/root"
}

mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
if [[ -x $root/lib/systemd/systemd ]]; then
  point_root
  exit 0
fi
# An older layout kept the rootfs itself at $cache/root.
if [[ -d $cache/root && ! -L $cache/root ]]; then
  rm -rf "$cache/root"
fi
command -v debootstrap >/dev/null || die "debootstrap is missing: run scripts/install-deps.sh"
mirror=$(debian_mirror "$suite") || die "no reachable Debian mirror (see above)"
echo "nspawn-rootfs: building $suite minbase with $packages from $mirror" >&2
rm -rf "$root.tmp"
log="$cache/debootstrap.log"
if ! debootstrap --variant=minbase --include="$packages" "$suite" "$root.tmp" "$mirror" >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  [[ -r $root.tmp/debootstrap/debootstrap.log ]] && tail -n 20 "$root.tmp/debootstrap/debootstrap.log" >&2
  die "debootstrap from $mirror failed; the lines above are from $log"
fi
mv "$root.tmp" "$root"
point_root
# Rootfs of other recipes are dead weight once nothing points at them.
for old in "$cache"/*; do
  name=$(basename "$old")
  if [[ $name =~ ^[0-9a-f]{64}$ && $name != "$key" && ! -L $old ]]; then rm -rf "$old"; fi
done
echo "nspawn-rootfs: $root" >&2
