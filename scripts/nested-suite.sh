#!/usr/bin/env bash
# Runs one test binary of scripts/nested-tests.sh (where the Linux-guest
# tests run: the nested host, or a host with VMX/SVM) and retries its failed
# tests once when a CPU stalled under them (a guest's or the nested host's
# kernel reported an RCU stall or a soft lockup) or a guest triple-faulted
# mid-boot. Usage:
#   scripts/nested-suite.sh LOG-DIR TEST-BINARY [LIBTEST-ARGS...]
#
# Why a stall earns a retry: under QEMU's TCG the emulated SVM sometimes
# stops delivering interrupts to one nested vCPU for good (seen in CI: the
# guest's CPU 0 stalled mid-boot, not even an NMI got through, the other
# vCPU reporting it for 270 s). Our VMM has no part in that: interrupts and
# timers of its guests are the in-kernel irqchip's.
#
# Why a triple fault does, in the nested host alone (scripts/nested-tests.sh
# sets SANDBOXD_IN_NESTED_HOST there): seen in CI and once in 40 boots of vmm/tests/linux.rs's initramfs
# test in a loop there (2026-12-07), both times while the guest kernel
# unpacked its initramfs, the one stretch of that boot where both vCPUs run
# kernel code at once. That guest has no device but the legacy ports our
# VMM answers, and its memory is a plain mapping nothing else writes; what
# took it down is its own CPU state, which is KVM's and, under it, QEMU's
# emulated SVM. CI met it again in a daemon's microVM (vCPU 1 again, just
# after its agent started). KVM on SVM resets a vCPU that shut down, so its
# registers tell nothing afterwards. QEMU with one TCG thread
# (thread=single) is no way out: there 3 of 8 boots of that initramfs test
# stalled for good. On hardware a triple fault is a failure like any other.
# The boot tests print `exit TripleFault` on their info line, a daemon's
# tests the VM's vmm.log (`vmm: guest crashed: vCPU N triple-faulted`); a
# test that expects one passes and is not retried.
#
# A test that fails without either, or fails again, is a failure. Each
# retry is printed as `nested-suite: retried ...` so the run's log shows
# it, and scripts/test-summary.sh counts the retry's result in place of the
# first run's failures.
set -uo pipefail
logs=${1:?usage: nested-suite.sh LOG-DIR TEST-BINARY [ARGS...]}
exe=${2:?usage: nested-suite.sh LOG-DIR TEST-BINARY [ARGS...]}
shift 2
# The same lines vmm/tests/linux.rs stops a guest at (its STALLED), and
# its report of a guest gone silent (a one-vCPU guest's stalled CPU has no
# other CPU to report it).
stall='detected stall|soft lockup - CPU#|the guest went silent'
if [[ ${SANDBOXD_IN_NESTED_HOST:-0} == 1 ]]; then
	stall+='|serial lines, exit TripleFault|vmm: guest crashed: vCPU [0-9]+ triple-faulted'
fi

out=$logs/$(basename "$exe").out
# The kernel's log from here on: after this marker (a line count would miss
# new lines once the ring buffer is full).
marker="nested-suite: $(basename "$exe") started, $$ $(date +%s%N)"
echo "$marker" >/dev/kmsg || echo "nested-suite: cannot mark the kernel log; its stalls go unseen" >&2
status=0
"$exe" "$@" 2>&1 | tee "$out" || status=$?
((status == 0)) && exit 0

# libtest's closing list: `failures:` then one indented name per line.
mapfile -t failed < <(awk '
	/^failures:$/ { list++; next }
	list == 2 && /^    [^ ]/ { sub(/^ +/, ""); print; next }
	list == 2 && /^$/ { exit }' "$out")
kernel_stall=$(dmesg | awk -v m="$marker" 'index($0, m) { seen = 1; next } seen' | grep -m1 -E "$stall" || true)
guest_stall=$(grep -m1 -E "$stall" "$out" || true)
if ((${#failed[@]} == 0)) || [[ -z $kernel_stall && -z $guest_stall ]]; then
	exit "$status"
fi
echo "nested-suite: retried ${#failed[@]} failed test(s) of $(basename "$exe") once, a CPU stalled or a guest triple-faulted under them (${guest_stall:+the guest: $guest_stall}${kernel_stall:+this host: $kernel_stall}): ${failed[*]}"
"$exe" "$@" --exact "${failed[@]}"
