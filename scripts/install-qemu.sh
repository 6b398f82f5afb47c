#!/usr/bin/env bash
# Installs QEMU >= 10.0 (qemu-system-x86 from Debian's bookworm-backports) on
# Debian 12, as root, unless it is there already.
#
# Why not bookworm's 7.2: its TCG runs the nested host (scripts/nested-kvm.sh,
# where the Linux-guest tests run on a host without VMX/SVM) with an emulated
# AMD SVM that stopped for good in three of the last six CI runs on the dev
# host: a vCPU of the nested host stuck inside a nested guest (RCU stall
# reports for ten minutes, or a silent console), or a nested guest starved
# for 30 s. QEMU 10 carries three years of fixes to that emulation. QEMU is
# also the microVM boot benchmark's peer (vmm/benches/boot.rs) and boots the
# guest kernel in tests/guest_kernel.rs; both work the same on 10.
#
# bookworm-backports is added as an apt source of its own
# (/etc/apt/sources.list.d/sandboxd-backports.sources) on the host's Debian
# mirror, unless a source lists it already. Debian marks backports
# NotAutomatic: nothing else is taken from there unless asked for, and the
# QEMU taken from there gets its updates with the host's upgrades.
set -euo pipefail

min_version=1:10.0
backports=bookworm-backports
source_file=/etc/apt/sources.list.d/sandboxd-backports.sources

if ((EUID != 0)); then
  echo "install-qemu.sh must run as root" >&2
  exit 1
fi

installed=$(dpkg-query -W -f='${Status} ${Version}' qemu-system-x86 2>/dev/null |
  awk '$1 == "install" && $3 == "installed" { print $4 }') || true
if [[ -n $installed ]] && dpkg --compare-versions "$installed" ge "$min_version"; then
  echo "qemu: qemu-system-x86 $installed is installed; nothing to do"
  exit 0
fi

# shellcheck source=../rootfs/lib/debian-mirror.sh
. "$(dirname "$0")/../rootfs/lib/debian-mirror.sh"
if [[ -n $(debian_mirror_candidates "$backports" | grep -v '^http://deb.debian.org/debian$' || true) ]]; then
  echo "qemu: $backports is in the host's apt sources"
else
  # The host's own mirror for bookworm, asked for the backports suite.
  mirror=$(debian_mirror "$backports" bookworm) || exit 1
  echo "qemu: adding $backports from $mirror as $source_file"
  cat >"$source_file" <<EOF
# Added by sandboxd's scripts/install-qemu.sh: QEMU >= 10 for the nested host.
Types: deb
URIs: $mirror
Suites: $backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
fi
echo "installing: qemu-system-x86 from $backports (was: ${installed:-not installed})"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  -t "$backports" qemu-system-x86 >/dev/null
installed=$(dpkg-query -W -f='${Version}' qemu-system-x86)
if ! dpkg --compare-versions "$installed" ge "$min_version"; then
  echo "qemu: $backports gave qemu-system-x86 $installed, older than $min_version" >&2
  exit 1
fi
echo "qemu: qemu-system-x86 $installed installed"
