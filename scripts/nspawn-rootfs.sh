#!/usr/bin/env bash
# Builds, once per machine, the Debian rootfs with systemd that
# tests/systemd_boot.rs boots with systemd-nspawn (PID 1 here is not systemd).
set -euo pipefail
root=/var/cache/sandboxd-nspawn/root
[[ -x $root/lib/systemd/systemd ]] && exit 0
mirror=$(grep -rhoE 'https?://[^ ]*debian[^ ]*' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | grep -v security | head -n1 || true)
mirror=${mirror:-http://deb.debian.org/debian}
rm -rf "$root.tmp"
mkdir -p "$(dirname "$root")"
debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,util-linux bookworm "$root.tmp" "$mirror" >/dev/null
mv "$root.tmp" "$root"
