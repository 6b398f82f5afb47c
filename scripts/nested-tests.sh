#!/usr/bin/env bash
# Runs the tests that need a hardware-style KVM, one that boots real Linux
# guests: directly where this host's /dev/kvm has VMX or SVM, else in one
# boot of the nested host (scripts/nested-kvm.sh: QEMU TCG with AMD SVM).
# Those tests are #[ignore]d in a plain `cargo test`; here they run with
# --ignored, each binary with its libtest output, so scripts/test-summary.sh
# counts them. The nested host's cgroups are v2 only, so a test of a
# v2-only path is #[ignore]d the same way and listed here too (the pod
# test of sandboxd:host_rootfs, the huge page test of sandboxd:limits).
# Usage: scripts/nested-tests.sh [LOG-DIR]
#
# LOG-DIR (default: a new /var/tmp/sandboxd-nested.XXXXXX) is shared
# writable with the nested host: the skip log (SANDBOXD_TEST_SKIP_LOG) may
# point into it. Exits with the tests' status.
#
# The nested host is also this project's cgroup v2 host (its cgroups are v2
# only), so the container suites run there too, by hand:
#   NESTED_SUITES="sandboxd:limits sandboxd:leaks sandboxd:snapshots" \
#   NESTED_TEST_ARGS= NESTED_ALWAYS=1 NESTED_MEM=12G NESTED_TESTS_TIMEOUT_S=3600 \
#   scripts/nested-tests.sh
# NESTED_SUITES replaces the suite list, NESTED_TEST_ARGS the `--ignored`
# given to each binary, and NESTED_ALWAYS=1 boots the nested host even
# where this host has VMX/SVM. The nested host keeps its writes (the test
# daemons' state under /var/tmp) in RAM: the CRIU suite needs
# NESTED_MEM=12G (scripts/nested-kvm.sh's default is 6G).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
logs=${1:-$(mktemp -d /var/tmp/sandboxd-nested.XXXXXX)}
mkdir -p "$logs"

# package:test-target of every suite that needs a Linux guest on KVM
# (sandboxd:host_rootfs: its pod test on the nested host's cgroup v2;
# sandboxd:limits: its huge page test there, with a hugetlb controller)
read -ra suites <<<"${NESTED_SUITES:-vmm:linux sandboxd:microvm_linux sandboxd:containerd_shim sandboxd:containerd_cri sandboxd:host_rootfs sandboxd:limits}"
test_args=${NESTED_TEST_ARGS---ignored}

# The whole workspace's test build, as scripts/test.sh made it: asking for
# one package (-p) would unify features differently and rebuild its
# dependencies.
artifacts=$(cargo test --quiet --workspace --no-run --message-format=json)
binaries=()
for suite in "${suites[@]}"; do
	exe=$(python3 -c '
import json, sys
package, target = sys.argv[1].split(":")
def name_of(package_id):
    # path+file:///dir#name@1.0, or path+file:///name#1.0 when they agree
    url, _, fragment = package_id.partition("#")
    return fragment.split("@")[0] if "@" in fragment else url.rstrip("/").split("/")[-1]
for line in sys.stdin:
    m = json.loads(line)
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and m["target"]["name"] == target and "test" in m["target"]["kind"]
            and name_of(m["package_id"]) == package):
        print(m["executable"])
' "$suite" <<<"$artifacts")
	[[ -n $exe && $(wc -l <<<"$exe") == 1 ]] || {
		echo "nested-tests: expected one test binary for $suite, cargo gave: ${exe:-none}" >&2
		exit 1
	}
	binaries+=("$exe")
done

runner=$logs/run-nested-tests.sh
{
	# Host trees handed to sandboxes as roots are idmapped, which the
	# nested host's /var/tmp (an overlay on tmpfs) cannot be on its 6.1
	# kernel: there they go on a btrfs in its RAM (sparse; a few MiB used).
	cat <<'PROLOGUE'
case $(stat -f -c %T /var/tmp) in
ext2/ext3 | xfs | btrfs) ;;
*)
	trees=/var/tmp/sandboxd-test-trees
	if mkdir -p "$trees" && truncate -s 2G /dev/shm/sandboxd-test-trees.img &&
		mkfs.btrfs -q /dev/shm/sandboxd-test-trees.img &&
		mount -o loop /dev/shm/sandboxd-test-trees.img "$trees"; then
		export SANDBOXD_TEST_HOST_TREES=$trees
	else
		echo "nested-tests: no btrfs for host trees; the tests that idmap them will fail" >&2
	fi
	;;
esac
PROLOGUE
	echo "status=0"
	for exe in "${binaries[@]}"; do
		printf 'scripts/nested-suite.sh %q %q %s --test-threads=1 || status=1\n' "$logs" "$exe" "$test_args"
	done
	echo 'exit $status'
} >"$runner"

has_hardware_virt() {
	[[ -e /dev/kvm && ! -e /sys/module/kvm_pvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo
}
started=$(date +%s)
status=0
if [[ ${NESTED_ALWAYS:-0} != 1 ]] && has_hardware_virt; then
	echo "nested-tests: /dev/kvm has VMX/SVM; running on this host's KVM"
	bash "$runner" || status=$?
else
	echo "nested-tests: no VMX/SVM here; running in the nested host (QEMU TCG, AMD SVM)"
	# The image cache is shared writable, not seen through the nested
	# host's overlay: the daemon refuses an image tree whose files report
	# another device than its directories (an overlay's do), and the VM
	# disks it exports there are the same cache this host would fill.
	images=${SANDBOXD_TEST_IMAGES_DIR:-/var/lib/sandboxd/images}
	# A nested host that hangs (seen once in five runs: both of its CPUs
	# stuck in a nested guest's vCPUs, soft lockups, nothing running) is
	# QEMU's emulation failing, not a test: it is stopped at the timeout
	# (its kernel log named) and booted once more. A test that fails is not
	# retried. The three suites take 450-550 s on the 2-core dev host, and a
	# first run on a fresh machine also exports the python image's VM disk
	# in there (under TCG): 600 s cut such a run short, a healthy one
	# included, and cost its whole retry. A hang with a silent console (no
	# soft lockup reported, seen once: 17 minutes without a line) ends
	# after 600 s of silence. A healthy run writes a line per test; its
	# longest quiet stretch, a fresh machine's export of the python disk,
	# has not been timed alone, hence the wide margin. Its kernel has also
	# panicked once under the emulation ("corrupted stack end detected
	# inside scheduler", in no test's code): booted once more as well.
	# Another hang printed RCU stall reports for 20 minutes while no test
	# wrote a line: the silence counts the tests' output alone.
	# Those were QEMU 7.2's (Debian 12's), which hung or starved the nested
	# host in three of six CI runs by 2026-12-06; scripts/install-qemu.sh
	# now installs 10.0 from bookworm-backports.
	for attempt in 1 2; do
		status=0
		# SANDBOXD_IN_NESTED_HOST: scripts/nested-suite.sh retries a guest's
		# triple fault there alone.
		SANDBOXD_IN_NESTED_HOST=1 VMM_TEST_LINUX_TIMEOUT_S=${VMM_TEST_LINUX_TIMEOUT_S:-300} \
			scripts/nested-kvm.sh --timeout "${NESTED_TESTS_TIMEOUT_S:-1200}" \
			--silence "${NESTED_TESTS_SILENCE_S:-600}" \
			--rw "$logs" --rw "$images" -- bash "$runner" || status=$?
		((attempt == 1)) && ((status == 124 || status == 125)) || break
		echo "nested-tests: the nested host hung, ran out of time or panicked; booting it once more"
	done
fi
echo "nested-tests: $((${#binaries[@]})) binaries in $(($(date +%s) - started)) s, exit $status"
exit "$status"
