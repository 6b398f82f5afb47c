#!/usr/bin/env bash
# Builds one benchmark of benches/ on this host and runs it in the nested
# host (scripts/nested-kvm.sh: Debian's kernel in QEMU's TCG with AMD SVM).
#   benches/nested.sh microvm_linux    # Linux guests: this host's kvm_pvm
#                                      # cannot run them, the nested /dev/kvm can
#   benches/nested.sh create_latency   # containers on cgroup v2 only, as on
#                                      # most production hosts (this one is v1 hybrid)
# Everything there runs 10-20x slower than here: only the ratios to the
# peers of the same run compare. Results land in benches/results/, named
# BENCH-nested.json (BENCH.json for microvm_linux, which runs nowhere else
# on this host). On a host with VMX/SVM and cgroup v2, `cargo bench
# --bench BENCH` runs the same directly.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:?usage: benches/nested.sh BENCH (microvm_linux, create_latency, ...)}

cargo build --release -p vmm --bin vmm
scripts/build-agent.sh >/dev/null
exe=$(cargo bench --bench "$bench" --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if (m.get("reason") == "compiler-artifact" and m.get("executable")
            and m["target"]["name"] == sys.argv[1]):
        print(m["executable"])
' "$bench")
[[ -n $exe ]] || { echo "nested: cargo built no $bench benchmark" >&2; exit 1; }
mkdir -p benches/results
[[ $bench == microvm_linux ]] || export BENCH_RESULTS_TAG=nested
# One vCPU for the nested host: with two, QEMU 7.2's TCG hung it (both CPUs
# stuck, a lost IPI by the look of it) within a dozen guest boots, twice
# in two runs; with one it has not, and it boots the guests no slower.
export NESTED_CPUS=${NESTED_CPUS:-1}
# The benchmarks print a line per run (seconds apart): a nested host that
# hangs (QEMU TCG stalled it once, in QEMU's own guest boot, its clock
# stopped so no wait inside ever timed out) ends after the silence bound,
# not the whole timeout.
exec scripts/nested-kvm.sh --rw /var/lib/sandboxd/images --rw benches/results \
	--timeout "${NESTED_BENCH_TIMEOUT_S:-1800}" \
	--silence "${NESTED_BENCH_SILENCE_S:-300}" -- "$exe" --bench
