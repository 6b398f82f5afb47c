#!/usr/bin/env bash
# The whole test suite, as root: installs what is needed, builds the static
# agent and the images, then runs every unit and integration test (real
# daemon, real sandboxes), the Python and TypeScript SDKs' tests and the
# OpenAPI contract check against a live daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
# No step fails silently: say which one, so its own messages above make sense.
trap 'echo "test.sh: \"$BASH_COMMAND\" failed (exit $?, line $LINENO); its messages are above" >&2' ERR
scripts/install-deps.sh
# Mounts and directories of runs killed outright slow every create after them.
scripts/sweep-killed-runs.sh
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
# The 20 runs before this one keep their logs; older ones go, so a
# long-lived CI machine does not gather them without end.
ls -dt /var/tmp/sandboxd-test.* | tail -n +22 | xargs -r rm -rf --
export SANDBOXD_TEST_SKIP_LOG=$logs/skips
# The Python SDK's junit report, with the rest of the run's logs.
export SANDBOXD_SDK_TEST_LOGS=$logs/python-sdk
: >"$SANDBOXD_TEST_SKIP_LOG"
cargo_status=0
cargo test --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee "$logs/cargo-test.log" ||
	cargo_status=$?
# The tests that boot real Linux guests on KVM (#[ignore]d above): on this
# host's KVM where it has VMX/SVM, else in one boot of the nested host.
nested_status=0
scripts/nested-tests.sh "$logs" 2>&1 | tee "$logs/nested.log" || nested_status=$?
# The SDKs against this build's daemon, then the OpenAPI contract against
# a live one (scripts/contract-test.sh).
export SANDBOXD_BIN=$(realpath "$target")/debug/sandboxd
export SANDBOXD_AGENT=$(realpath "$target")/x86_64-unknown-linux-gnu/release/sandbox-agent
declare -A extra_status
for suite in python typescript contract; do
	case $suite in
	python) run=(sdk/python/run-tests.sh) ;;
	typescript) run=(sdk/typescript/run-tests.sh) ;;
	contract) run=(scripts/contract-test.sh) ;;
	esac
	extra_status[$suite]=0
	"${run[@]}" >"$logs/$suite.log" 2>&1 || extra_status[$suite]=$?
	tail -n 25 "$logs/$suite.log"
done
echo "test logs: $logs"
scripts/test-summary.sh "$logs/cargo-test.log" "$SANDBOXD_TEST_SKIP_LOG" "$logs/nested.log"
failed=0
if ((nested_status != 0)); then
	echo "test.sh: the nested-host tests failed (exit $nested_status); $logs/nested.log has their output" >&2
	failed=1
fi
for suite in python typescript contract; do
	if ((extra_status[$suite] != 0)); then
		echo "test.sh: the $suite suite failed (exit ${extra_status[$suite]}); $logs/$suite.log has its output" >&2
		failed=1
	else
		echo "$suite suite: passed"
	fi
done
if ((cargo_status != 0)); then
	echo "test.sh: cargo test exited $cargo_status; its messages are above" >&2
	exit "$cargo_status"
fi
exit "$failed"
