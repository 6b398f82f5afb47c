#!/usr/bin/env bash
# Sums a `cargo test` log into one plain line, `N passed, N failed, N skipped`
# (and `N ignored` on the next when libtest ignored any), then lists the skips grouped
# by reason. Usage: scripts/test-summary.sh CARGO-TEST-LOG SKIP-LOG
#
# libtest counts a test that returned early as passed; the skip log (one
# `SANDBOXD-SKIP <test> <reason>: <message>` line per skipped test, written
# by sandboxd_test_support) says which did, so passed = libtest's passed
# minus the skips. NESTED-LOG, when given, is scripts/nested-tests.sh's: the
# #[ignore]d Linux-guest tests it ran count as run, not as ignored. Exits 1
# when any test failed or cargo reported an error (a test binary that
# crashed, a build error), else 0.
set -euo pipefail
usage="usage: test-summary.sh CARGO-TEST-LOG SKIP-LOG [NESTED-LOG]"
log=${1:?$usage}
skips=${2:?$usage}
nested=${3:-}
[[ -f $skips ]] || : >"$skips"

# `test result: ok. 5 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; ...`
# A nested stage that booted its host twice (the first hung) counts the
# second boot's results only; tests scripts/nested-suite.sh retried after a
# stalled CPU or a nested guest's triple fault count by their retry's
# result, not as the first run's failures.
results_of() {
	awk '
	/^nested-tests: the nested host hung/ { p = 0; f = 0; g = 0; n = 0 }
	/^nested-suite: retried [0-9]+ failed/ { pending = $3; next }
	/^test result: / {
		n++
		# A retry that printed its result replaces the first run'"'"'s
		# failures; one that never did (crashed, hung) leaves them.
		f -= pending; pending = 0
		for (i = 1; i <= NF; i++) {
			w = $(i + 1); sub(/[;,]$/, "", w)
			if (w == "passed") p += $i
			if (w == "failed") f += $i
			if (w == "ignored") g += $i
		}
	}
	END { printf "%d %d %d %d\n", p, f, g, n }' "$1"
}
read -r passed failed ignored results < <(results_of "$log")
nested_run=0
if [[ -n $nested ]]; then
	read -r nested_passed nested_failed _ nested_results < <(results_of "$nested")
	nested_run=$((nested_passed + nested_failed))
	passed=$((passed + nested_passed))
	failed=$((failed + nested_failed))
	if ((nested_results == 0)); then
		echo "test-summary: no \`test result:\` line in $nested (the nested stage did not run its tests)" >&2
		failed=$((failed + 1))
	fi
	ignored=$((ignored > nested_run ? ignored - nested_run : 0))
fi
skipped=$(grep -c '^SANDBOXD-SKIP ' "$skips" || true)
# A binary that died before its summary line, or a build error, leaves no
# `test result:` of its own: cargo's own `error:` lines say so.
cargo_errors=$(grep -cE '^error(\[E[0-9]+\])?: ' "$log" || true)

# The plain closing line alone, as CI reads it; libtest's ignored tests
# (opt-in runs) on a line of their own.
echo "$((passed - skipped)) passed, $failed failed, $skipped skipped"
if ((ignored > 0)); then
	echo "$ignored ignored (opt-in, not run)"
fi
if ((nested_run > 0)); then
	echo "of those, $nested_run needed a hardware-style KVM and ran in scripts/nested-tests.sh"
fi
if ((skipped > 0)); then
	echo "skipped, by reason:"
	# `SANDBOXD-SKIP test reason: message` -> `reason<TAB>test<TAB>message`
	grouped=$(sed -E 's/^SANDBOXD-SKIP ([^ ]+) ([^:]+): (.*)$/\2\t\1\t\3/' "$skips" | sort)
	while read -r reason; do
		rows=$(awk -F'\t' -v r="$reason" '$1 == r' <<<"$grouped")
		echo "  $reason ($(wc -l <<<"$rows"))"
		awk -F'\t' '{ printf "    %s: %s\n", $2, $3 }' <<<"$rows"
	done < <(cut -f1 <<<"$grouped" | uniq)
fi
if ((results == 0)); then
	echo "test-summary: no \`test result:\` line in $log" >&2
	exit 1
fi
if ((cargo_errors > 0)); then
	echo "test-summary: cargo reported errors (failed or crashed test binaries, or a build error); see $log" >&2
fi
((failed == 0 && cargo_errors == 0))
