#!/usr/bin/env bash
# Builds the Linux-guest microVM benchmark (benches/microvm_linux.rs) on
# this host and runs it in the nested host (scripts/nested-kvm.sh), where
# /dev/kvm has AMD SVM: this host's kvm_pvm cannot run Linux guests. On a
# host with VMX/SVM, `cargo bench --bench microvm_linux` runs it directly.
# The results land in benches/results/microvm_linux.json.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p vmm --bin vmm
exe=$(cargo bench --bench microvm_linux --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and m["target"]["name"] == "microvm_linux"):
        print(m["executable"])
')
[[ -n $exe ]] || { echo "nested-linux-vm: cargo built no microvm_linux benchmark" >&2; exit 1; }
mkdir -p benches/results
# One vCPU for the nested host: with two, QEMU 7.2's TCG hung it (both CPUs
# stuck, a lost IPI by the look of it) within a dozen guest boots, twice
# in two runs; with one it has not, and it boots the guests no slower.
export NESTED_CPUS=${NESTED_CPUS:-1}
# The benchmark prints a line per run (seconds apart): a nested host that
# hangs (QEMU TCG stalled it once, in QEMU's own guest boot, its clock
# stopped so no wait inside ever timed out) ends after the silence bound,
# not the whole timeout.
exec scripts/nested-kvm.sh --rw /var/lib/sandboxd/images --rw benches/results \
	--timeout "${NESTED_BENCH_TIMEOUT_S:-1800}" \
	--silence "${NESTED_BENCH_SILENCE_S:-300}" -- "$exe"
