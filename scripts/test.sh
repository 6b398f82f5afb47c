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
# libtest reports a test that returned early as ok: every skip also lands
# in a fresh skip log (sandboxd_test_support), and the summary below counts
# it as skipped, not passed. The log of the run is kept beside it.
logs=$(mktemp -d /var/tmp/sandboxd-test.XXXXXX)
export SANDBOXD_TEST_SKIP_LOG=$logs/skips
: >"$SANDBOXD_TEST_SKIP_LOG"
cargo_status=0
cargo test --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee "$logs/cargo-test.log" ||
	cargo_status=$?
echo "test logs: $logs"
scripts/test-summary.sh "$logs/cargo-test.log" "$SANDBOXD_TEST_SKIP_LOG"
if ((cargo_status != 0)); then
	echo "test.sh: cargo test exited $cargo_status; its messages are above" >&2
	exit "$cargo_status"
fi
