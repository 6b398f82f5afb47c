#!/usr/bin/env bash
# Creates (cold, or pool claims) and deletes through throwaway daemons of
# two builds, alternating, for changes too small for one `create_latency`
# run to show (its ratios move by 0.15 between runs here). Each round
# starts a daemon of each build with its own state, run directory and
# cgroup parent, makes one create to warm up, then RUNS creates of BODY
# (each deleted, GAP_MS apart), timed at the client with curl over the API
# socket, and prints the medians and the daemon's mean create phases.
#
#     benches/ab-creates.sh OLD_SANDBOXD NEW_SANDBOXD    # as root
#
# ROUNDS (3), RUNS (20), GAP_MS (100); SANDBOXD_AGENT is the static agent
# (default: the release one of CARGO_TARGET_DIR or target). BODY is the
# create request (default {"image":"python"}). With POOL=N each daemon
# keeps a warm pool of N, each create waits for it to be full first, and
# a create that was not a pool claim fails the run. Where BODY names the
# secret BENCH_KEY, each daemon stores it (bound to api.example.com).
# With RUNNING=N each daemon first starts N small busybox sandboxes
# (0.1 CPU, 64 MiB) that keep running while it is measured, as on a busy
# worker.
# Needs the images of scripts/test.sh; run scripts/sweep-killed-runs.sh
# first.
set -Eeuo pipefail
trap 'echo "ab-creates.sh: \"$BASH_COMMAND\" failed (exit $?, line $LINENO)" >&2' ERR
(($# == 2)) || {
	echo "usage: $0 OLD_SANDBOXD NEW_SANDBOXD" >&2
	exit 2
}
target=$(realpath "${CARGO_TARGET_DIR:-$(dirname "$0")/../target}")
agent=${SANDBOXD_AGENT:-$target/x86_64-unknown-linux-gnu/release/sandbox-agent}
rounds=${ROUNDS:-3} runs=${RUNS:-20} gap_ms=${GAP_MS:-100} pool=${POOL:-0}
running=${RUNNING:-0}
body=${BODY:-'{"image":"python"}'}

median_ms() {
	sort -n | awk '{a[NR] = $1} END {printf "%.2f ms (n=%d)", a[int((NR + 1) / 2)] * 1000, NR}'
}

daemon_pid='' daemon_dir=''
# Stops the running daemon and removes what it made, also when the script
# stops early.
stop_daemon() {
	[[ -n $daemon_pid ]] || return 0
	kill -TERM "$daemon_pid" 2>/dev/null || true
	wait "$daemon_pid" || true
	if mountpoint -q "$daemon_dir/state/disk"; then
		umount -l "$daemon_dir/state/disk"
	fi
	# The daemon leaves its (empty) cgroup parent.
	local group name
	name=$(basename "$daemon_dir")
	for group in /sys/fs/cgroup/*/"$name" /sys/fs/cgroup/"$name"; do
		[[ -d $group ]] || continue
		if [[ -d $group/supervisors ]]; then
			rmdir "$group/supervisors"
		fi
		rmdir "$group" || echo "ab-creates.sh: $group is not empty" >&2
	done
	rm -rf "$daemon_dir"
	daemon_pid='' daemon_dir=''
}
trap stop_daemon EXIT

# One daemon of build $1 for label $2.
measure() {
	local bin=$1 label=$2 dir id i hits
	dir=$(mktemp -d /var/tmp/sandboxd-ab.XXXXXX)
	daemon_dir=$dir
	# The sandboxes' shifted ids must search the run directory's parents.
	chmod 0711 "$dir"
	"$bin" --state-dir "$dir/state" --run-dir "$dir/run" --socket "$dir/api.sock" \
		--images-dir /var/lib/sandboxd/images --agent-path "$agent" \
		--cgroup-parent "/$(basename "$dir")" --stop-sandboxes-on-exit true \
		--pool-size "$pool" \
		>"$dir/daemon.log" 2>&1 &
	daemon_pid=$!
	for i in $(seq 600); do
		curl -sf --unix-socket "$dir/api.sock" http://sandboxd/v1/health >/dev/null 2>&1 && break
		sleep 0.05
	done
	if [[ $body == *BENCH_KEY* ]]; then
		curl -sf --unix-socket "$dir/api.sock" -X POST >/dev/null \
			-d '{"name":"BENCH_KEY","value":"bench-value","hosts":["api.example.com"]}' \
			http://sandboxd/v1/secrets
	fi
	pool_full() {
		((pool > 0)) || return 0
		for i in $(seq 3000); do
			curl -sf --unix-socket "$dir/api.sock" http://sandboxd/v1/health |
				grep -q "\"pooled\":$pool[,}]" && return 0
			sleep 0.01
		done
		echo "ab-creates.sh: the warm pool did not refill within 30 s" >&2
		return 1
	}
	create() {
		curl -sf --unix-socket "$dir/api.sock" -X POST -d "$body" \
			-w '\n%{time_total}\n' http://sandboxd/v1/sandboxes >"$dir/reply"
		tail -n 1 "$dir/reply" >>"$dir/create_s"
		head -n 1 "$dir/reply" | grep -o '"id":"[^"]*"' | cut -d'"' -f4
	}
	delete() {
		curl -sf --unix-socket "$dir/api.sock" -X DELETE -w '%{time_total}\n' \
			"http://sandboxd/v1/sandboxes/$1" >>"$dir/delete_s"
	}
	pool_full
	id=$(create)
	delete "$id"
	for i in $(seq "$running"); do
		curl -sf --unix-socket "$dir/api.sock" -X POST -d '{"image":"busybox","cpu":0.1,"memory_mib":64,"disk_mib":64}' \
			http://sandboxd/v1/sandboxes >/dev/null
	done
	# The phases below are the measured creates' alone.
	curl -sf --unix-socket "$dir/api.sock" http://sandboxd/metrics >"$dir/metrics-before"
	: >"$dir/create_s"
	: >"$dir/delete_s"
	for i in $(seq "$runs"); do
		pool_full
		sleep "$(awk -v ms="$gap_ms" 'BEGIN {print ms / 1000}')"
		id=$(create)
		delete "$id"
	done
	curl -sf --unix-socket "$dir/api.sock" http://sandboxd/metrics >"$dir/metrics"
	if ((pool > 0)); then
		# Every create, the warm-up's too, must have been a claim.
		hits=$(awk '/^sandboxd_pool_claims_total\{.*result="hit"/ {n += $NF} END {print n + 0}' "$dir/metrics")
		if ((hits != runs + 1)); then
			echo "ab-creates.sh: $label: $hits of $((runs + 1)) creates were pool claims; does BODY fit the pool?" >&2
			exit 1
		fi
	fi
	echo "$label: create -> ready $(median_ms <"$dir/create_s"), delete $(median_ms <"$dir/delete_s")"
	# With a pool these are its refills' cold creates, not the claims.
	awk -F'[{}",= ]+' '/^sandboxd_create_phase_seconds_(sum|count)\{/ {
		# The first file counts against the second.
		sign = (FILENAME ~ /-before$/) ? -1 : 1
		kind = ($1 ~ /_sum$/) ? "sum" : "count"; v[$3, kind] += sign * $NF; seen[$3] = 1
	} END {
		line = "  cold create phases (means, ms):"
		for (p in seen) if (v[p, "count"] > 0) line = line sprintf(" %s %.2f", p, v[p, "sum"] / v[p, "count"] * 1000)
		print line
	}' "$dir/metrics-before" "$dir/metrics"
	stop_daemon
}

for round in $(seq "$rounds"); do
	measure "$1" "round $round, old"
	measure "$2" "round $round, new"
done
