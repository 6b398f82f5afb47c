#!/usr/bin/env bash
# The whole test suite, as root: installs what is needed, builds the static
# agent and the images, then runs every unit and integration test (real
# daemon, real sandboxes).
set -euo pipefail
cd "$(dirname "$0")/.."
# No step fails silently: say which one, so its own messages above make sense.
trap 'echo "test.sh: \"$BASH_COMMAND\" failed (exit $?, line $LINENO); its messages are above" >&2' ERR
scripts/install-deps.sh
scripts/build-agent.sh >/dev/null
# The microVM guest kernel, for the QEMU TCG check of the guest side
# (tests/guest_kernel.rs): 9-12 minutes the first time on 2 cores, cached
# by source version and config after that.
scripts/build-guest-kernel.sh >/dev/null
scripts/nspawn-rootfs.sh
cargo build --quiet --bins
target=${CARGO_TARGET_DIR:-target}
"$target/debug/sandboxd" --state-dir /var/lib/sandboxd image build busybox python >/dev/null
cargo test --workspace --no-fail-fast -- --test-threads=2
