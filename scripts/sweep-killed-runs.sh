#!/usr/bin/env bash
# Removes what test runs that were killed outright (SIGKILL of the whole
# run, a machine reset) left behind: their daemons' directories under
# /var/tmp with the overlay roots and namespace files still mounted in
# them, their cgroup parents and the contract test's network namespaces.
# Nothing else cleans them up, and they cost every later run: each create
# reads and copies the host's mount table (ARCHITECTURE.md, "Where a cold
# create's milliseconds go"; 87 such mounts made a create 5 ms slower).
#
# A directory is left alone while any process names it on its command line
# or works in it, and while it is younger than SWEEP_AFTER_MINUTES (180): a
# run that is still going, a concurrent one just started, another user's.
set -euo pipefail
trap 'echo "sweep-killed-runs.sh: \"$BASH_COMMAND\" failed (exit $?, line $LINENO)" >&2' ERR
after=${SWEEP_AFTER_MINUTES:-180}

# What every process names on its command line, and where it works: read
# once. A process may end meanwhile; its files are then gone, no error.
in_use_by=""
for pid in /proc/[0-9]*; do
	cmdline=$(tr '\0' ' ' 2>/dev/null <"$pid/cmdline") || continue
	in_use_by+="$cmdline $(readlink "$pid/cwd" 2>/dev/null || true)/"$'\n'
done

in_use() {
	[[ $in_use_by == *"$1 "* || $in_use_by == *"$1/"* ]]
}

swept=0
while IFS= read -r dir; do
	[[ -n $dir ]] || continue
	if in_use "$dir"; then
		continue
	fi
	# Deepest first, so a mount on top of another goes before it.
	mapfile -t points < <(awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r)
	for point in "${points[@]}"; do
		umount -l "$point" || echo "sweep-killed-runs.sh: could not unmount $point" >&2
	done
	name=$(basename "$dir")
	for group in /sys/fs/cgroup/*/"$name" /sys/fs/cgroup/"$name"; do
		[[ -d $group ]] || continue
		# Children first; a group that still holds a process stays (and says so).
		find "$group" -depth -type d -exec rmdir {} + ||
			echo "sweep-killed-runs.sh: $group still holds processes; left as is" >&2
	done
	rm -rf -- "$dir"
	echo "sweep-killed-runs.sh: removed $dir (${#points[@]} mounts) of a killed run"
	swept=$((swept + 1))
done < <(find /var/tmp -maxdepth 1 -type d \( -name 'sandboxd-test-*' -o -name 'sandboxd-contract.*' \) -mmin +"$after")

# The contract test's namespaces are named after its shell's pid.
for ns in /run/netns/sbd-contract-*; do
	[[ -e $ns ]] || continue
	pid=${ns##*-}
	if [[ $pid =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null && [[ -n $(find "$ns" -mmin +"$after") ]]; then
		ip netns del "$(basename "$ns")"
		echo "sweep-killed-runs.sh: removed network namespace $(basename "$ns") of a killed run"
		swept=$((swept + 1))
	fi
done
echo "sweep-killed-runs.sh: $swept left-overs of killed runs removed"
