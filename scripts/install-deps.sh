#!/usr/bin/env bash
# Installs what building and running sandboxd needs on Debian 12, as root.
# Idempotent: packages already there are not fetched again.
set -euo pipefail
packages=(
  # build: libcontainer links libseccomp; its eBPF device filter vendors libbpf
  pkg-config libseccomp-dev libelf-dev zlib1g-dev make gcc
  # runtime: image recipes, the btrfs pool of writable layers
  debootstrap busybox-static btrfs-progs util-linux iproute2 nftables
  # tests: the systemd units are verified and booted under a real systemd
  systemd systemd-container
  # benchmarks compare against these runtimes (runc checkpoint locks the
  # container's network with iptables-restore)
  runc crun iptables
  # benches/scale.rs compares an idle sandbox's memory with the shim
  # containerd keeps per container (started on its own socket, not the
  # packaged service); tests/containerd_cri.rs runs pods through its CRI
  # with CNI's bridge and host-local plugins, and its CRI client (k8s-cri)
  # compiles the CRI protos with protoc
  containerd containernetworking-plugins protobuf-compiler
  # registry pulls: tests/registry.rs runs a real registry and fills it
  # with skopeo; benches compare pulls with skopeo + umoci
  docker-registry skopeo umoci
  # image builds: tests/image_builds.rs serves its own apt repository,
  # indexed with apt-ftparchive
  apt-utils
  # the SDKs' tests: a venv for the Python SDK (and schemathesis, the API
  # contract check), openssl for their TLS fixtures, curl for raw answers
  python3-venv openssl curl
)
# The TypeScript SDK needs Node >= 18 with npm; Debian 12's nodejs is 18.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# docker-registry's package starts a registry on :5000; the tests start
# their own on random ports, so the packaged one is stopped and disabled.
if systemctl list-unit-files docker-registry.service >/dev/null 2>&1; then
  systemctl disable --now docker-registry.service 2>&1 | grep -v "^Failed to connect to bus" || true
fi
pkill -x -f "/usr/bin/docker-registry serve /etc/docker/registry/config.yml" || true
# containerd's package starts the system containerd; what uses it here
# starts its own, so the packaged one is stopped and disabled.
if systemctl list-unit-files containerd.service >/dev/null 2>&1; then
  systemctl disable --now containerd.service 2>&1 | grep -v "^Failed to connect to bus" || true
fi
# QEMU: the microVM boot benchmark (vmm/benches/boot.rs) compares against
# its microvm machine, tests/guest_kernel.rs boots the guest kernel under its
# TCG (this host's kvm_pvm cannot run a stock kernel), and its TCG with an
# emulated SVM is the nested host of the Linux-guest tests. 10.0+, from
# bookworm-backports: see the script.
"$(dirname "$0")/install-qemu.sh"
# Memory snapshots need CRIU 4.2+, which Debian 12 does not ship: built once
# from Debian testing's source and cached.
"$(dirname "$0")/install-criu.sh" ||
  echo "warning: CRIU 4.2+ could not be installed; memory snapshots will fail (and their test skips)" >&2
# The microVM guest kernel is a separate step, not run from here: a cold
# build took ~12 minutes on a 2-core host (a cached one ~0.05 s). Run
# scripts/build-guest-kernel.sh once per host and after linux-source-6.1
# updates; it installs its own build tools.
if ! command -v cargo >/dev/null; then
  echo "cargo (Rust 1.85+) is required: install it with rustup, then run this again" >&2
  exit 1
fi
