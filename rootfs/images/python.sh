#!/usr/bin/env bash
# Image "python": Debian bookworm (minbase) with python3, pip, venv, curl and
# the CA roots, so a sandbox allowed pypi.org and *.pythonhosted.org can
# `pip install`.
#
# Usage: python.sh DEST_DIR   (DEST_DIR must be empty; run as root, with network)
# sandboxd runs this once per recipe digest; sandboxes themselves never have network.
set -euo pipefail

dest=${1:?usage: python.sh DEST_DIR}
suite=bookworm

# To make a richer image, copy this file to an extra recipe dir under a new name
# (e.g. data.sh) and extend these lists; any change to the text gives a new digest.
#   debs="python3,python3-pip,python3-venv,ca-certificates,git"
#   pips="numpy pandas"            # needs python3-pip in debs
debs="python3,python3-pip,python3-venv,curl,ca-certificates"
pips=""

# The Debian mirror finder shared with the install scripts: sandboxd writes it
# beside the recipe it runs; in a checkout it is rootfs/lib/.
here=$(dirname "${BASH_SOURCE[0]}")
for lib in "$here/debian-mirror.sh" "$here/../lib/debian-mirror.sh"; do
	[[ -r $lib ]] && break
done
# shellcheck source=../lib/debian-mirror.sh
. "$lib"

command -v debootstrap >/dev/null ||
	{ echo "debootstrap is not installed: apt-get install debootstrap" >&2; exit 1; }

mirror=$(debian_mirror "$suite")
echo "building $suite minbase from $mirror with: $debs"
debootstrap --variant=minbase --include="$debs" "$suite" "$dest" "$mirror"

if [[ -n $pips ]]; then
	# pip needs DNS and /proc inside the chroot, and must trust the CAs the build host
	# trusts (the host may sit behind a TLS-inspecting proxy); all undone below.
	cp /etc/resolv.conf "$dest/etc/resolv.conf"
	cert=()
	if [[ -r /etc/ssl/certs/ca-certificates.crt ]]; then
		cp /etc/ssl/certs/ca-certificates.crt "$dest/tmp/.build-ca.crt"
		cert=(--cert /tmp/.build-ca.crt)
	fi
	mount -t proc proc "$dest/proc"
	trap 'umount "$dest/proc" 2>/dev/null || true' EXIT
	# shellcheck disable=SC2086 # $pips is a word list on purpose
	chroot "$dest" python3 -m pip install --no-cache-dir --break-system-packages \
		--root-user-action=ignore "${cert[@]}" $pips
	umount "$dest/proc"
	trap - EXIT
	rm -f "$dest/tmp/.build-ca.crt"
fi

# The image is the sandbox's own, not a shared system: pip may install into
# it without --break-system-packages (PEP 668's guard), as root, quietly.
cat >"$dest/etc/pip.conf" <<'PIP'
[global]
break-system-packages = true
root-user-action = ignore
disable-pip-version-check = true
PIP

# Caches and docs are dead weight in a read-only image shared by every sandbox.
rm -rf "$dest"/var/lib/apt/lists/* "$dest"/var/cache/apt/*.bin \
	"$dest"/var/cache/apt/archives/*.deb "$dest"/var/cache/apt/archives/partial/* \
	"$dest"/var/cache/debconf/*-old "$dest"/var/lib/dpkg/*-old \
	"$dest"/usr/share/doc/* "$dest"/usr/share/man/* "$dest"/usr/share/info/* \
	"$dest"/var/log/*.log "$dest"/var/log/apt/*
mkdir -p "$dest/tmp" && chmod 1777 "$dest/tmp"
# debootstrap copies the build host's resolver and name; a sandbox must not see them.
: >"$dest/etc/resolv.conf"
echo sandbox >"$dest/etc/hostname"
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost\n' >"$dest/etc/hosts"
echo "done"
